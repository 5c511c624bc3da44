//! Mutual authentication with the cluster key: challenge and HMAC-SHA256.
//!
//! 1. The server sends `Challenge { server_nonce, server_id }` as soon as a
//!    connection opens.
//! 2. The client answers `Hello { role, client_nonce, proof }` where
//!    proof = HMAC(key, "madfs-v1 client" | role | server_nonce | client_nonce).
//!    The Hello also names the replica set the connection is for (`want`):
//!    a server serves its own set, and after a failover those of servers
//!    whose copies it held.
//! 3. The server checks the proof and answers with its own
//!    HMAC(key, "madfs-v1 server" | client_nonce | server_nonce), so the client
//!    knows it reached a server of its cluster and not an impostor.
//!
//! The key never crosses the wire, and fresh nonces on both sides stop a
//! recorded handshake from being replayed.

use crate::codec::{Decoder, Encoder};
use crate::error::ProtoError;
use hmac::{Hmac, Mac};
use madfs_types::ServerId;
use sha2::Sha256;

pub const KEY_BYTES: usize = 32;
pub const NONCE_BYTES: usize = 32;
pub type Nonce = [u8; NONCE_BYTES];
pub type Proof = [u8; 32];

/// The cluster's shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(pub [u8; KEY_BYTES]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)") // never print the secret
    }
}

impl ClusterKey {
    /// Parse the key file's text: 64 hex digits, surrounding space ignored.
    pub fn from_hex(text: &str) -> Option<ClusterKey> {
        let t = text.trim();
        if t.len() != KEY_BYTES * 2 {
            return None;
        }
        let mut k = [0u8; KEY_BYTES];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(ClusterKey(k))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Proof {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    pub fn client_proof(&self, role: Role, server_nonce: &Nonce, client_nonce: &Nonce) -> Proof {
        self.mac(
            b"madfs-v1 client",
            &[&[role as u8], server_nonce, client_nonce],
        )
    }

    pub fn server_proof(&self, server_nonce: &Nonce, client_nonce: &Nonce) -> Proof {
        self.mac(b"madfs-v1 server", &[client_nonce, server_nonce])
    }
}

/// Compare proofs in constant time so timing does not leak the MAC.
pub fn proofs_equal(a: &Proof, b: &Proof) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Who is connecting: a client, or another server (which may send peer ops).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Role {
    Client = 1,
    Peer = 2,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Challenge {
    pub server_id: ServerId,
    pub server_nonce: Nonce,
}

impl Challenge {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u16(self.server_id.0);
        e.raw(&self.server_nonce);
        e.into_bytes()
    }
    pub fn decode(body: &[u8]) -> Result<Challenge, ProtoError> {
        let mut d = Decoder::new(body);
        let c = Challenge {
            server_id: ServerId(d.u16()?),
            server_nonce: d.fixed32()?,
        };
        d.finish()?;
        Ok(c)
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    pub role: Role,
    pub client_nonce: Nonce,
    pub proof: Proof,
    /// The set whose requests this connection carries.
    pub want: ServerId,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u8(self.role as u8);
        e.raw(&self.client_nonce);
        e.raw(&self.proof);
        e.u16(self.want.0);
        e.into_bytes()
    }
    pub fn decode(body: &[u8]) -> Result<Hello, ProtoError> {
        let mut d = Decoder::new(body);
        let role = match d.u8()? {
            1 => Role::Client,
            2 => Role::Peer,
            _ => return Err(ProtoError::BadValue("role")),
        };
        let h = Hello {
            role,
            client_nonce: d.fixed32()?,
            proof: d.fixed32()?,
            want: ServerId(d.u16()?),
        };
        d.finish()?;
        Ok(h)
    }
}

/// The server's answer to a good Hello: its own proof.
pub fn encode_welcome(proof: &Proof) -> Vec<u8> {
    proof.to_vec()
}

pub fn decode_welcome(body: &[u8]) -> Result<Proof, ProtoError> {
    let mut d = Decoder::new(body);
    let p = d.fixed32()?;
    d.finish()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hex_round_trips_and_rejects_junk() {
        let k = ClusterKey([0xab; 32]);
        assert_eq!(ClusterKey::from_hex(&format!(" {}\n", k.to_hex())), Some(k));
        assert_eq!(ClusterKey::from_hex("abc"), None);
        assert_eq!(ClusterKey::from_hex(&"zz".repeat(32)), None);
        assert_eq!(format!("{:?}", ClusterKey([1; 32])), "ClusterKey(..)");
    }

    #[test]
    fn proofs_depend_on_key_role_and_nonces() {
        let k1 = ClusterKey([1; 32]);
        let k2 = ClusterKey([2; 32]);
        let (s, c) = ([3u8; 32], [4u8; 32]);
        let p = k1.client_proof(Role::Client, &s, &c);
        assert!(proofs_equal(&p, &k1.client_proof(Role::Client, &s, &c)));
        assert!(!proofs_equal(&p, &k2.client_proof(Role::Client, &s, &c)));
        assert!(!proofs_equal(&p, &k1.client_proof(Role::Peer, &s, &c)));
        assert!(!proofs_equal(&p, &k1.client_proof(Role::Client, &c, &s)));
        // The server's proof can never be replayed as a client's.
        assert!(!proofs_equal(&p, &k1.server_proof(&s, &c)));
    }

    #[test]
    fn handshake_messages_round_trip() {
        let c = Challenge {
            server_id: ServerId(3),
            server_nonce: [7; 32],
        };
        assert_eq!(Challenge::decode(&c.encode()).unwrap(), c);
        let h = Hello {
            role: Role::Peer,
            client_nonce: [1; 32],
            proof: [2; 32],
            want: ServerId(5),
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert!(Hello::decode(&h.encode()[..40]).is_err());
        assert_eq!(decode_welcome(&encode_welcome(&[9; 32])).unwrap(), [9; 32]);
    }
}
