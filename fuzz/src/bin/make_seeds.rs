//! Write a few valid frames into fuzz/seeds/ so the fuzzer starts from
//! well-formed input instead of having to discover the magic and checksum.
//! Run: `cd fuzz && cargo run --bin make_seeds`

use madfs_proto::auth::{Challenge, Hello, Role};
use madfs_proto::message::{
    encode_error_message, ChunkDigest, DirEntry, Entry, FsStats, Hold, InodeLinks, Op, Rebuild,
    RebuildPhase, SetAttrs, TouchToken, TouchWait, WriteVerifier,
};
use madfs_proto::{ErrorCode, FrameHeader, Reply, Request};
use madfs_types::{
    Attr, ChunkIndex, Credentials, FileKind, FileName, InodeId, RequestId, ServerId, TimeSet,
    Timestamp,
};
use std::path::Path;

fn frame(is_response: bool, opcode: u16, status: u16, body: &[u8], data: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        is_response,
        opcode,
        request_id: RequestId(7),
        body_len: body.len() as u32,
        data_len: data.len() as u32,
        status,
        checksum: 0,
    };
    let mut out = header.encode(body).to_vec();
    out.extend_from_slice(body);
    out.extend_from_slice(data);
    // Every seed must itself be a valid frame.
    madfs_proto::frame::decode_frame(&out).expect("seed frame decodes");
    out
}

fn request(op: Op, data: &[u8]) -> Vec<u8> {
    let opcode = op.opcode() as u16;
    let req = Request {
        creds: Credentials {
            uid: 1000,
            gid: 100,
            groups: vec![4, 27],
        },
        // Those that run once carry an id, as clients send them.
        once: op
            .runs_once()
            .then_some(madfs_proto::RunOnce::first(madfs_types::OpId {
                time: 1_800_000_000,
                origin: 0x5eed,
                seq: 1,
            })),
        op,
    };
    frame(false, opcode, 0, &req.encode(), data)
}

fn name(s: &str) -> FileName {
    FileName::new(s.as_bytes()).unwrap()
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    std::fs::create_dir_all(&dir).unwrap();
    let ino = InodeId(42);
    let attr = Attr {
        ino,
        kind: FileKind::File,
        perm: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        size: 3901,
        atime: Timestamp { secs: 1, nanos: 2 },
        mtime: Timestamp { secs: -3, nanos: 4 },
        ctime: Timestamp {
            secs: 5,
            nanos: 999_999_999,
        },
        btime: Timestamp::default(),
        rdev: 0,
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "request-lookup",
            request(
                Op::Lookup {
                    parent: InodeId::ROOT,
                    name: name("a"),
                },
                &[],
            ),
        ),
        (
            "request-open",
            request(
                Op::Open {
                    parent: InodeId::ROOT,
                    name: name("a"),
                    data_max: 65536,
                },
                &[],
            ),
        ),
        (
            "request-setattr",
            request(
                Op::SetAttr {
                    ino,
                    changes: SetAttrs {
                        perm: Some(0o755),
                        size: Some(1 << 40),
                        mtime: TimeSet::At(Timestamp { secs: 9, nanos: 8 }),
                        via_writable_handle: true,
                        ..SetAttrs::default()
                    },
                },
                &[],
            ),
        ),
        (
            "request-mknod",
            request(
                Op::Mknod {
                    parent: InodeId::ROOT,
                    name: name("tty"),
                    kind: FileKind::CharDev,
                    perm: 0o620,
                    rdev: (136 << 8) | 5,
                },
                &[],
            ),
        ),
        (
            "request-remove-hold",
            request(
                Op::Remove {
                    parent: InodeId::ROOT,
                    name: name("tmp"),
                    dir: false,
                    hold: Hold::Inodes(vec![ino, InodeId(43)]),
                },
                &[],
            ),
        ),
        ("request-release", request(Op::Release { ino }, &[])),
        (
            "reply-removed-held",
            frame(
                true,
                14,
                0,
                &Reply::Removed {
                    ino,
                    kind: FileKind::File,
                    held: true,
                    touched: vec![],
                    verifier: WriteVerifier(0x5eed),
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-statfs-failed",
            frame(
                true,
                25,
                0,
                &Reply::FsStats(FsStats {
                    bytes_total: 1 << 30,
                    bytes_free: 1 << 29,
                    bytes_avail: 1 << 28,
                    inodes: 12,
                    data_bytes: 4096,
                    failure: Some("chunk store poisoned since 2026-01-01 00:00:00 UTC".into()),
                    rebuilds: vec![Rebuild {
                        replica: ServerId(2),
                        phase: RebuildPhase::Chunks,
                        keys: 4096,
                        keys_kept: 4000,
                        bytes_done: 1 << 20,
                        bytes_total: 3 << 20,
                        bytes_kept: 1 << 19,
                        failure: "no space left on device".into(),
                    }],
                    disk: 0x5eed,
                    bytes_reserved: 1 << 26,
                    copies: 2,
                })
                .encode(),
                &[],
            ),
        ),
        (
            "reply-attr-device",
            frame(
                true,
                11,
                0,
                &Reply::Attr(Attr {
                    kind: FileKind::BlockDev,
                    rdev: (8 << 8) | 1,
                    ..attr.clone()
                })
                .encode(),
                &[],
            ),
        ),
        (
            "request-replica-apply",
            request(
                Op::ReplicaApply {
                    set: ServerId(2),
                    stream: 0x5eed,
                    first_seq: 41,
                    // A sync record: kind 5, no payload.
                    heads: vec![5, 0, 0, 0, 0],
                },
                &[],
            ),
        ),
        (
            "request-replica-digests",
            request(
                Op::ReplicaDigests {
                    set: ServerId(1),
                    stream: 0x5eed,
                    chunks: vec![(InodeId(1 << 48 | 5), ChunkIndex(0)), (ino, ChunkIndex(9))],
                },
                &[],
            ),
        ),
        (
            "request-replica-key-range",
            request(
                Op::ReplicaKeyRange {
                    set: ServerId(2),
                    stream: 0x5eed,
                    after: Some(b"DENT\x00\x01".to_vec()),
                    upto: None,
                    digest: [9; 16],
                },
                &[],
            ),
        ),
        (
            "request-report-seals",
            request(Op::ReportSeals { dir: ino }, &[]),
        ),
        (
            "request-dir-move-lock",
            request(
                Op::DirMoveLock {
                    holder: ServerId(1),
                    token: 0x5eed,
                    release: false,
                },
                &[],
            ),
        ),
        (
            "request-dir-parent",
            request(
                Op::DirParent {
                    ino,
                    change: Some((InodeId::ROOT, InodeId(1 << 48 | 5))),
                },
                &[],
            ),
        ),
        (
            "request-dir-move-settled",
            request(Op::DirMoveSettled { token: 0x5eed }, &[]),
        ),
        (
            "request-fix-dir-links",
            request(
                Op::FixDirLinks {
                    dir: ino,
                    seen: 3,
                    want: 7,
                },
                &[],
            ),
        ),
        (
            "request-list-inodes",
            request(
                Op::ListInodes {
                    after: Some(ino),
                    max_entries: 4096,
                },
                &[],
            ),
        ),
        (
            "request-fix-file-links",
            request(
                Op::FixFileLinks {
                    ino,
                    seen: 2,
                    want: 0,
                },
                &[],
            ),
        ),
        (
            "request-adopt",
            request(
                Op::Adopt {
                    ino,
                    into: InodeId::ROOT,
                    name: name("#7.1"),
                    seen: 1,
                },
                &[],
            ),
        ),
        (
            "request-drop-name",
            request(
                Op::DropName {
                    parent: InodeId::ROOT,
                    name: name("gone"),
                    ino,
                },
                &[],
            ),
        ),
        (
            "request-remake-dir",
            request(
                Op::RemakeDir {
                    dir: ino,
                    parent: InodeId::ROOT,
                    nlink: 2,
                },
                &[],
            ),
        ),
        (
            "reply-inode-page",
            frame(
                true,
                32,
                0,
                &Reply::InodePage {
                    inodes: vec![InodeLinks {
                        ino,
                        kind: FileKind::File,
                        nlink: 2,
                    }],
                    more: true,
                    pending: 1,
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-chunk-digests",
            frame(
                true,
                50,
                0,
                &Reply::ChunkDigests {
                    digests: vec![
                        Some(ChunkDigest {
                            len: 1 << 20,
                            hash: [0x5a; 16],
                        }),
                        None,
                    ],
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-written",
            frame(
                true,
                12,
                0,
                &Reply::Written {
                    verifier: WriteVerifier(0x0123_4567_89ab_cdef),
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-synced",
            frame(
                true,
                19,
                0,
                &Reply::Synced {
                    verifier: WriteVerifier(7),
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-size-updated",
            frame(
                true,
                18,
                0,
                &Reply::SizeUpdated {
                    attr: attr.clone(),
                    verifier: WriteVerifier(9),
                }
                .encode(),
                &[],
            ),
        ),
        ("request-get-routes", request(Op::GetRoutes, &[])),
        (
            "request-membership",
            request(
                Op::Membership {
                    msg: vec![2, 1, 0, 0, 0, 0, 0, 0, 0],
                },
                &[],
            ),
        ),
        (
            "reply-routes",
            frame(
                true,
                30,
                0,
                &Reply::Routes {
                    epoch: 3,
                    serving: vec![ServerId(0), ServerId(0), ServerId(2)],
                    in_sync: vec![2, 1, 2],
                    addresses: vec![(ServerId(1), "10.0.0.7:7001".parse().unwrap())],
                    voters: vec![ServerId(0), ServerId(1), ServerId(2)],
                    lost: vec![(ServerId(1), 41_000)],
                }
                .encode(),
                &[],
            ),
        ),
        (
            "request-getattr-after-touches",
            request(
                Op::GetAttr {
                    ino,
                    after: vec![
                        TouchWait {
                            sender: ServerId(1),
                            seq: 4097,
                        },
                        TouchWait {
                            sender: ServerId(3),
                            seq: 12,
                        },
                    ],
                },
                &[],
            ),
        ),
        (
            "reply-created-touched",
            frame(
                true,
                13,
                0,
                &Reply::Created {
                    entry: Entry {
                        ino,
                        kind: FileKind::File,
                        attr: Some(attr.clone()),
                    },
                    created: true,
                    touched: vec![TouchToken {
                        dir: InodeId::ROOT,
                        sender: ServerId(2),
                        seq: 4097,
                    }],
                    verifier: WriteVerifier(1),
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-renamed",
            frame(
                true,
                21,
                0,
                &Reply::Renamed {
                    touched: vec![
                        TouchToken {
                            dir: InodeId::ROOT,
                            sender: ServerId(2),
                            seq: 7,
                        },
                        TouchToken {
                            dir: InodeId(43),
                            sender: ServerId(2),
                            seq: 8,
                        },
                    ],
                    verifier: WriteVerifier(u64::MAX),
                }
                .encode(),
                &[],
            ),
        ),
        (
            "request-write",
            request(
                Op::Write {
                    ino,
                    chunk: ChunkIndex(0),
                    offset: 0,
                    file_size: 5,
                },
                b"hello",
            ),
        ),
        (
            "reply-entry",
            frame(
                true,
                10,
                0,
                &Reply::Entry(Entry {
                    ino,
                    kind: FileKind::File,
                    attr: Some(attr),
                })
                .encode(),
                &[],
            ),
        ),
        (
            "reply-dirpage",
            frame(
                true,
                20,
                0,
                &Reply::DirPage {
                    entries: vec![
                        DirEntry {
                            name: name("f"),
                            ino,
                            kind: FileKind::File,
                        },
                        DirEntry {
                            name: name("sub"),
                            ino: InodeId(43),
                            kind: FileKind::Dir,
                        },
                    ],
                    more: true,
                }
                .encode(),
                &[],
            ),
        ),
        (
            "reply-error",
            frame(
                true,
                10,
                ErrorCode::NotFound as u16,
                &encode_error_message("no such name"),
                &[],
            ),
        ),
        (
            "handshake-challenge",
            frame(
                true,
                1,
                0,
                &Challenge {
                    server_id: ServerId(3),
                    server_nonce: [7; 32],
                }
                .encode(),
                &[],
            ),
        ),
        (
            "handshake-hello",
            frame(
                false,
                2,
                0,
                &Hello {
                    role: Role::Client,
                    client_nonce: [1; 32],
                    proof: [2; 32],
                    want: ServerId(0),
                }
                .encode(),
                &[],
            ),
        ),
    ];
    for (file, bytes) in seeds {
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    println!("wrote seeds to {}", dir.display());
}
