//! Feed arbitrary bytes to every decoder of the wire protocol. None of them
//! may panic, and whatever decodes must survive a re-encode unchanged.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run decode_frame seeds`
#![no_main]

use libfuzzer_sys::fuzz_target;
use madfs_proto::auth::{self, Challenge, Hello};
use madfs_proto::frame::decode_frame;
use madfs_proto::message::{decode_error_message, encode_error_message};
use madfs_proto::{ProtoError, Reply, Request};

fuzz_target!(|data: &[u8]| {
    // The whole input as one in-memory frame.
    match decode_frame(data) {
        Ok(_) => check_frame(data),
        // Random mutations almost never keep the CRC right, which would hide
        // the body decoders behind it: repair the checksum and go on.
        Err(ProtoError::BadChecksum { actual, .. }) => {
            let mut fixed = data.to_vec();
            fixed[28..32].copy_from_slice(&actual.to_le_bytes());
            check_frame(&fixed);
        }
        Err(_) => {}
    }

    // The raw input as bare message bodies.
    if data.len() >= 2 {
        request_round_trip(u16::from_le_bytes([data[0], data[1]]), &data[2..]);
    }
    reply_round_trip(data);
    error_message_round_trip(data);
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(h.encode(), data);
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(c.encode(), data);
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
    }
    if let Ok(p) = auth::decode_welcome(data) {
        assert_eq!(auth::encode_welcome(&p), data);
    }
});

/// `data` must be a frame that `decode_frame` accepts.
fn check_frame(data: &[u8]) {
    let (header, body, bulk) = decode_frame(data).expect("frame with a correct checksum decodes");
    // Re-encoding the parsed header reproduces the input byte for byte.
    let mut again = header.encode(body).to_vec();
    again.extend_from_slice(body);
    again.extend_from_slice(bulk);
    assert_eq!(again, data, "frame did not re-encode to its input");
    let (h2, b2, d2) = decode_frame(&again).expect("re-encoded frame must decode");
    assert_eq!((h2, b2, d2), (header, body, bulk));

    if !header.is_response {
        request_round_trip(header.opcode, body);
    } else if header.status != 0 {
        error_message_round_trip(body);
    } else {
        reply_round_trip(body);
    }
}

fn request_round_trip(opcode: u16, body: &[u8]) {
    let Ok(req) = Request::decode(opcode, body) else {
        return;
    };
    assert_eq!(
        req.op.opcode() as u16,
        opcode,
        "decoded op has another opcode"
    );
    // Decoding may normalize (e.g. masking mode bits), so compare values,
    // and require the normalized encoding to be a fixed point.
    let enc = req.encode();
    let back = Request::decode(opcode, &enc).expect("re-encoded request must decode");
    assert_eq!(back, req);
    assert_eq!(back.encode(), enc);
}

fn reply_round_trip(body: &[u8]) {
    let Ok(reply) = Reply::decode(body) else {
        return;
    };
    let enc = reply.encode();
    let back = Reply::decode(&enc).expect("re-encoded reply must decode");
    assert_eq!(back, reply);
    assert_eq!(back.encode(), enc);
}

fn error_message_round_trip(body: &[u8]) {
    let Ok(msg) = decode_error_message(body) else {
        return;
    };
    assert_eq!(encode_error_message(&msg), body);
}
