//! Guards the wire boundary of a server against bad clients: a wrong cluster
//! key is refused (AuthFailed) for the client library and the CLI; garbage,
//! oversized length fields (before and after authentication), truncated
//! frames and peer-only operations from a client connection are each
//! refused or dropped without killing the server, without allocating what a
//! header claims, and without disturbing other clients.

mod common;

use common::{frame, key_of, tail, Raw, TestCluster};
use madfs_client::ErrorCode;
use madfs_proto::auth::ClusterKey;
use madfs_proto::message::{decode_error_message, Op, Request};
use madfs_proto::Opcode;
use madfs_types::{ChunkIndex, Credentials, RequestId};
use std::net::TcpStream;

const SERVERS: usize = 2;

/// A /proc/PID/status field in kB.
fn proc_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Every server is alive and serves a normal client.
#[track_caller]
fn assert_healthy(tc: &mut TestCluster, rt: &tokio::runtime::Runtime, what: &str) {
    for i in 0..SERVERS {
        assert!(
            tc.is_running(i),
            "server {i} died after {what}; log:\n{}",
            tail(&tc.log_path(i), 30)
        );
    }
    let c = tc.client();
    assert_eq!(
        rt.block_on(c.read_file("/probe")).unwrap(),
        b"probe",
        "after {what}"
    );
    for (id, r) in rt.block_on(c.server_stats()) {
        r.unwrap_or_else(|e| panic!("server {id} after {what}: {e}"));
    }
}

#[test]
fn wrong_key_is_refused() {
    let tc = TestCluster::start(SERVERS);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(tc.client().write_file("/probe", b"probe"))
        .unwrap();

    // A copy of the cluster file pointing at another key.
    let other = tc.root().join("other");
    std::fs::create_dir(&other).unwrap();
    madfs_rpc::cluster::write_key_file(
        &other.join("cluster.key"),
        &madfs_rpc::cluster::generate_key(),
    )
    .unwrap();
    let mut cfg = tc.config().clone();
    cfg.key_file = "cluster.key".into();
    let copy = other.join("cluster.toml");
    std::fs::write(&copy, cfg.to_toml()).unwrap();

    let bad = madfs_client::Client::connect(Some(&copy)).unwrap();
    let e = rt.block_on(bad.stat("/")).unwrap_err();
    assert_eq!(e.code, ErrorCode::AuthFailed, "{e}");
    assert_eq!(e.errno(), libc::EACCES);
    let e = rt.block_on(bad.read_file("/probe")).unwrap_err();
    assert_eq!(e.code, ErrorCode::AuthFailed, "{e}");
    for (id, r) in rt.block_on(bad.server_stats()) {
        assert_eq!(
            r.unwrap_err().code,
            ErrorCode::AuthFailed,
            "server {id} accepted a wrong key"
        );
    }

    // The CLI says so and fails.
    let out = std::process::Command::new(common::MADFS)
        .args([
            "--cluster".as_ref(),
            copy.as_os_str(),
            "cat".as_ref(),
            "/probe".as_ref(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "data leaked to a wrong key");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication failed"), "stderr: {err}");

    // Raw: a wrong proof gets an AuthFailed status, then the connection closes.
    let mut raw = Raw::connect(&tc, 0);
    let status = raw.handshake(&ClusterKey([0x55; 32]));
    assert_eq!(status, ErrorCode::AuthFailed as u16);
    raw.expect_closed("wrong key");
    // A request before any handshake is refused too.
    let mut raw = Raw::connect(&tc, 1);
    raw.challenge();
    let body = Request {
        creds: Credentials::root(),
        op: Op::StatFs,
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::StatFs, 1, &body, 0));
    raw.send(&body);
    raw.expect_closed("request without a Hello");

    // The right key still works.
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key_of(&tc)), 0);
    let mut tc = tc;
    assert_healthy(&mut tc, &rt, "wrong keys");
}

#[test]
fn malformed_frames_close_the_connection_and_spare_the_server() {
    let mut tc = TestCluster::start(SERVERS);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    rt.block_on(c.write_file("/probe", b"probe")).unwrap();
    let key = key_of(&tc);
    let pid = tc.pid(0);

    // Idle connections that never say anything do not block anyone.
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(tc.config().servers[0].address).unwrap())
        .collect();
    assert_healthy(&mut tc, &rt, "50 idle connections");
    drop(idle);

    // Garbage (bad magic) before authenticating.
    let mut raw = Raw::connect(&tc, 0);
    raw.challenge();
    raw.send(&[0xAB; 64]);
    raw.expect_closed("garbage before auth");
    assert_healthy(&mut tc, &rt, "garbage before auth");

    // A header announcing a ~4 GiB body, before and after authenticating.
    let peak_before = proc_kb(pid, "VmPeak:");
    for authed in [false, true] {
        let mut raw = Raw::connect(&tc, 0);
        if authed {
            assert_eq!(raw.handshake(&key), 0);
        } else {
            raw.challenge();
        }
        let mut h = frame(
            if authed {
                Opcode::StatFs
            } else {
                Opcode::Hello
            },
            1,
            &[],
            0,
        );
        h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        raw.send(&h);
        raw.expect_closed("4 GiB body");
        assert_healthy(&mut tc, &rt, "a 4 GiB body header");

        // And a 4 GiB data section.
        let mut raw = Raw::connect(&tc, 0);
        if authed {
            assert_eq!(raw.handshake(&key), 0);
        } else {
            raw.challenge();
        }
        let h = frame(Opcode::Write, 1, &[], u32::MAX);
        raw.send(&h);
        raw.expect_closed("4 GiB data");
        assert_healthy(&mut tc, &rt, "a 4 GiB data header");
    }
    let peak_after = proc_kb(pid, "VmPeak:");
    assert!(
        peak_after < peak_before + 1024 * 1024,
        "server 0 virtual memory peaked at {peak_after} kB (was {peak_before} kB): \
         it allocated what a header claimed"
    );

    // Authenticated garbage after a valid request: the request is answered,
    // the garbage closes the connection.
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key), 0);
    let body = Request {
        creds: Credentials::root(),
        op: Op::StatFs,
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::StatFs, 9, &body, 0));
    raw.send(&body);
    let (h, _, _) = raw.read_frame().unwrap();
    assert_eq!((h.request_id, h.status), (RequestId(9), 0));
    raw.send(b"this is not a frame header at all.");
    raw.expect_closed("garbage after auth");
    assert_healthy(&mut tc, &rt, "garbage after auth");

    // A bad checksum.
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key), 0);
    let mut h = frame(Opcode::StatFs, 2, &body, 0);
    h[28] ^= 0xFF;
    raw.send(&h);
    raw.send(&body);
    raw.expect_closed("bad checksum");
    assert_healthy(&mut tc, &rt, "a bad checksum");

    // A body that does not decode as its opcode's message.
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key), 0);
    let junk = [0xFFu8; 3];
    raw.send(&frame(Opcode::Rename, 3, &junk, 0));
    raw.send(&junk);
    raw.expect_closed("undecodable body");
    assert_healthy(&mut tc, &rt, "an undecodable body");

    // Data on an opcode that carries none.
    let mut raw = Raw::connect(&tc, 0);
    assert_eq!(raw.handshake(&key), 0);
    raw.send(&frame(Opcode::StatFs, 4, &body, 10));
    raw.send(&body);
    raw.send(&[0u8; 10]);
    raw.expect_closed("data on StatFs");
    assert_healthy(&mut tc, &rt, "data on StatFs");
}

#[test]
fn truncated_write_and_peer_ops_from_a_client_are_harmless() {
    let mut tc = TestCluster::start(SERVERS);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = tc.client();
    rt.block_on(c.write_file("/probe", b"probe")).unwrap();
    rt.block_on(c.write_file("/victim", b"original contents"))
        .unwrap();
    let ino = rt.block_on(c.stat("/victim")).unwrap().ino;
    let owner = ino.owner().0 as usize;
    let key = key_of(&tc);

    // A Write announcing 1 MiB of data, of which 10 bytes arrive before the
    // client hangs up.
    let mut raw = Raw::connect(&tc, owner);
    assert_eq!(raw.handshake(&key), 0);
    let body = Request {
        creds: Credentials::root(),
        op: Op::Write {
            ino,
            chunk: ChunkIndex(0),
            offset: 0,
            file_size: 1 << 20,
        },
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::Write, 1, &body, 1 << 20));
    raw.send(&body);
    raw.send(b"XXXXXXXXXX");
    drop(raw);
    assert_healthy(&mut tc, &rt, "a truncated write");
    let a = rt.block_on(c.stat("/victim")).unwrap();
    assert_eq!(a.size, 17, "a truncated write changed the size");
    assert_eq!(
        rt.block_on(c.read_file("/victim")).unwrap(),
        b"original contents",
        "a truncated write was applied"
    );

    // The same, but the connection stays open and stalls: the server must
    // keep serving others meanwhile.
    let mut stalled = Raw::connect(&tc, owner);
    assert_eq!(stalled.handshake(&key), 0);
    stalled.send(&frame(Opcode::Write, 1, &body, 1 << 20));
    stalled.send(&body);
    stalled.send(&[0u8; 1000]);
    assert_healthy(&mut tc, &rt, "a stalled write");
    drop(stalled);

    // Peer-only operations from a client connection are refused.
    let mut raw = Raw::connect(&tc, owner);
    assert_eq!(raw.handshake(&key), 0);
    let body = Request {
        creds: Credentials::root(),
        op: Op::PurgeChunks { ino },
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::PurgeChunks, 5, &body, 0));
    raw.send(&body);
    let (h, msg, _) = raw.read_frame().unwrap();
    assert_eq!(h.request_id, RequestId(5));
    assert_eq!(
        h.status,
        ErrorCode::NotPermitted as u16,
        "peer op from a client: {}",
        decode_error_message(&msg).unwrap_or_default()
    );
    let body = Request {
        creds: Credentials::root(),
        op: Op::AdjustLinks {
            ino,
            delta: -1,
            hold: false,
        },
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::AdjustLinks, 6, &body, 0));
    raw.send(&body);
    let (h, _, _) = raw.read_frame().unwrap();
    assert_eq!(h.status, ErrorCode::NotPermitted as u16);
    // The connection is still good for ordinary requests.
    let body = Request {
        creds: Credentials::root(),
        op: Op::GetAttr { ino, after: vec![] },
        once: None,
    }
    .encode();
    raw.send(&frame(Opcode::GetAttr, 7, &body, 0));
    raw.send(&body);
    let (h, _, _) = raw.read_frame().unwrap();
    assert_eq!((h.request_id, h.status), (RequestId(7), 0));
    drop(raw);
    assert_eq!(
        rt.block_on(c.read_file("/victim")).unwrap(),
        b"original contents"
    );
    assert_eq!(rt.block_on(c.stat("/victim")).unwrap().nlink, 1);
    assert_healthy(&mut tc, &rt, "peer ops from a client");
}
