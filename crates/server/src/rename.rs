//! rename(2), the one namespace operation whose two names may live on two
//! servers. The client sends it to A, the server of the source name; B is
//! the server of the destination name. The inode itself never moves, so a
//! directory's whole subtree follows it for free.
//!
//! When A == B, one atomic RocksDB batch deletes the old name and writes the
//! new one. When A != B, A coordinates a two-phase protocol; what a crash
//! (kill -9, or power loss: these writes are synced) at each step leaves:
//!
//! 1. A checks the source and permissions under its dentry lock.
//!    Crash: nothing written; only the old name exists.
//! 2. A writes intent RNTX(tx) = {source, destination, inode} (synced).
//!    Crash: old name only; A's recovery asks B about tx (step 6).
//! 3. A sends RenameInstall(tx) to B. B writes the new dentry and a marker
//!    RNDN(A, tx) in one synced batch (replacing an existing target as POSIX
//!    says: a file over a file, an empty directory over an empty directory).
//!    Crash of B before its batch: old name only; A's recovery sees "not
//!    installed". Crash after: both names are on disk until step 4 or 6.
//!    The destination directory's times and link count (touch.rs) change
//!    in this batch when B holds it, else by a touch B waits for before it
//!    answers; a retried install (marker found) changes nothing again.
//! 4. A deletes the old dentry and the intent in one synced batch.
//!    Crash before: A's recovery sees "installed" and finishes this step.
//!    After: only the new name exists. Then, with its locks released, A
//!    changes the source directory's times and link count (B may have
//!    touched that directory on A during step 3, so A held no lock of it):
//!    in a batch if A holds it, else by a queued touch whose token A's
//!    reply carries (touch.rs).
//! 5. A tells B to forget the marker (best effort; a stale marker is a few
//!    bytes and harmless).
//! 6. Recovery (rename/recovery.rs; at A's start, after a failed step 3,
//!    and on the copy that takes A's set over): for every intent, ask B
//!    with RenameResolve. "Installed" -> do step 4. "Not installed" -> B first records tx as
//!    aborted (so a late-arriving install of tx is refused) and A drops
//!    the intent. B unreachable -> retry later. An aborted marker outlives
//!    A's "forget" by `ABORTED_KEPT_FOR`: the install may still come, sent
//!    again by a deposed A (the replicated simulation, seed 3843: B
//!    installed it after the forget, and both names stayed).
//!    Until settled, the source name stays held (`Locks::unsettle`): it
//!    may already be the second link of an inode whose new name B has, so
//!    no other request may remove or replace it as a link of its own.
//!
//! So after recovery exactly one of the two names exists. While B is
//! unreachable, step 3 fails with EIO and the outcome is settled by step 6.
//! A directory that changes parents is moved under the cluster's
//! directory-move lock, after a check that it does not go below itself,
//! and its owner learns its new parent (dir_moves.rs).

use crate::errors::{err, kv_err};
use crate::inode::Inode;
use crate::keys;
use crate::link_drops::{LinkDrop, Sent};
use crate::locks::LockKey;
use crate::perm;
use crate::seals::{DirRemoval, Sealed};
use crate::service::Server;
use crate::touch::DirChanges;
use madfs_kv::WriteBatch;
use madfs_proto::codec::{Decoder, Encoder};
use madfs_proto::message::{Hold, Op, Reply, TouchToken, RENAME_EXCHANGE, RENAME_NOREPLACE};
use madfs_proto::{ErrorCode, WireError};
use madfs_types::{
    dentry_server, Credentials, FileKind, FileName, InodeId, SealId, ServerId, Timestamp, TxId,
};
use std::sync::Arc;
use std::time::Duration;

mod recovery;

pub(crate) use recovery::*;

/// How long an install waits for the destination's locks before it answers
/// TryAgain. Short: the coordinator holds the source's locks meanwhile, and
/// two renames that swap names wait on each other until one gives up; the
/// coordinator then retries after a pause (`retry_races`).
const LOCK_WAIT: Duration = Duration::from_millis(250);
const MARK_INSTALLED: u8 = 0;
const MARK_REPLACED: u8 = 1;
const MARK_ABORTED: u8 = 2;
/// How long B keeps an aborted marker after A told it to forget: longer
/// than a deposed coordinator sends its install again (a peer call gives
/// up within a failover's wait, 30 s by default; a connection with
/// unacknowledged data dies within `conn::UNACKNOWLEDGED_MAX`).
pub(crate) const ABORTED_KEPT_FOR: Duration = Duration::from_secs(600);
/// How long A waits for B's answer to an install (step 3) before it takes
/// the outcome as unknown and leaves it to step 6: longer than an install
/// takes at its slowest (its locks, a target's seal, its copies, a touch
/// and a replaced directory's end, each bounded to seconds). An answer
/// lost on the way made the client's call wait for the whole call timeout
/// (the replicated simulation, seed 149 with directory moves raced).
const INSTALL_ANSWER_WITHIN: Duration = Duration::from_secs(45);
/// Markers deleted per batch of a sweep.
const SWEEP_BATCH_MAX: usize = 4096;

struct Intent {
    src_parent: InodeId,
    src_name: FileName,
    dst_parent: InodeId,
    dst_name: FileName,
    ino: InodeId,
    kind: FileKind,
}

impl Intent {
    /// Whether it moves a directory to another parent (dir_moves.rs).
    fn moves_dir(&self) -> bool {
        self.kind == FileKind::Dir && self.src_parent != self.dst_parent
    }

    fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u8(1);
        e.ino(self.src_parent);
        e.name(&self.src_name);
        e.ino(self.dst_parent);
        e.name(&self.dst_name);
        e.ino(self.ino);
        e.kind(self.kind);
        e.into_bytes()
    }

    fn decode(v: &[u8]) -> Option<Intent> {
        let mut d = Decoder::new(v);
        if d.u8().ok()? != 1 {
            return None;
        }
        Some(Intent {
            src_parent: d.ino().ok()?,
            src_name: d.name().ok()?,
            dst_parent: d.ino().ok()?,
            dst_name: d.name().ok()?,
            ino: d.ino().ok()?,
            kind: d.kind().ok()?,
        })
    }
}

/// What installing a name did to an existing entry of that name.
#[derive(Default)]
struct Installed {
    /// The target was already a link to the same inode: nothing changes.
    same: bool,
    replaced: Option<(InodeId, FileKind)>,
    /// The replaced inode was local and lost its last link.
    freed: Option<Inode>,
    /// The replaced inode lost its last link and is held for the client
    /// (`Hold`): locally here, or by its owner (`after_install`).
    held: bool,
    /// The replaced target was an empty directory (its DIR_REMOVAL record
    /// is in the batch).
    removed_dir: Option<DirRemoval>,
    /// The replaced target's inode lives on another server, which drops
    /// a link of it next (the record is in the batch: link_drops.rs).
    link_drop: Option<LinkDrop>,
}

/// Put `(dst_parent, dst_name) -> ino` into `b`, replacing what is there as
/// POSIX allows. `sealed`: the seals the caller took on the target, an
/// empty directory.
#[allow(clippy::too_many_arguments)]
fn install_into(
    srv: &Server,
    b: &mut WriteBatch,
    dst_parent: InodeId,
    dst_name: &FileName,
    ino: InodeId,
    kind: FileKind,
    noreplace: bool,
    sealed: &Option<Sealed>,
    hold: &Hold,
) -> Result<Installed, WireError> {
    let mut out = Installed::default();
    if let Some((dk, dino)) = srv.load_dentry(dst_parent, dst_name)? {
        if dino == ino {
            out.same = true;
            return Ok(out);
        }
        if noreplace {
            return Err(err(ErrorCode::Exists, ""));
        }
        if kind == FileKind::Dir && dk != FileKind::Dir {
            return Err(err(ErrorCode::NotDir, ""));
        }
        if kind != FileKind::Dir && dk == FileKind::Dir {
            return Err(err(ErrorCode::IsDir, ""));
        }
        if dk == FileKind::Dir {
            let Some(sealed) = sealed.as_ref().filter(|s| s.removal.dir == dino) else {
                return Err(err(ErrorCode::TryAgain, "the target directory changed"));
            };
            sealed.check_in_time()?;
            b.put(&keys::dir_removal(dino), &sealed.removal.encode());
            out.removed_dir = Some(sealed.removal.clone());
        }
        if dino.owner() == srv.id {
            if let Some(mut victim) = srv.load_inode(dino)? {
                let (nlink, held) = srv.unlink_inode_holding(b, &mut victim, -1, hold.covers(dino));
                out.held = held;
                if nlink == 0 && !held {
                    out.freed = Some(victim);
                }
            }
        } else if dk != FileKind::Dir {
            let drop = LinkDrop::new(dino, dk == FileKind::File && hold.covers(dino));
            drop.put(b);
            out.link_drop = Some(drop);
        }
        out.replaced = Some((dino, dk));
    }
    Server::put_dentry(b, dst_parent, dst_name, kind, ino);
    Ok(out)
}

/// A directory moved out of `dir` (-1) or into it (+1): its ".." link.
fn dir_links(kind: FileKind) -> i64 {
    i64::from(kind == FileKind::Dir)
}

/// A rename's reply: `held`, the replaced inode if it is held for the
/// client (it must release it), else plain; with the answering store's
/// write verifier.
pub(crate) fn rename_reply(
    srv: &Server,
    held: Option<(InodeId, FileKind)>,
    touched: Vec<TouchToken>,
) -> Reply {
    let verifier = srv.write_verifier();
    match held {
        Some((ino, kind)) => Reply::Removed {
            ino,
            kind,
            held: true,
            touched,
            verifier,
        },
        None => Reply::Renamed { touched, verifier },
    }
}

/// What installing `kind` did to the destination directory's link count.
fn install_changes(dp: InodeId, kind: FileKind, done: &Installed) -> DirChanges {
    let replaced_dir = matches!(done.replaced, Some((_, FileKind::Dir)));
    DirChanges::one(dp, dir_links(kind) - i64::from(replaced_dir))
}

/// Work after a committed install: free, unlink remotely, announce.
/// Returns whether the replaced inode is held for the client (`Hold`).
/// Other servers act on a replaced target only once the install is on
/// this set's copies (else a failover brings the replaced name back
/// without its link): until then the outcome is unknown (TimedOut).
async fn after_install(srv: &Arc<Server>, done: &Installed) -> Result<bool, WireError> {
    let mut held = done.held;
    if let Some(victim) = &done.freed {
        srv.after_free(victim);
    }
    if let Some(r) = &done.removed_dir {
        // A directory has one name: its owner drops it (finish_dir_removal).
        srv.must_be_replicated_dir_removal(r).await?;
        srv.finish_dir_removal_soon(r).await;
    } else if let Some(drop) = &done.link_drop {
        if let Err(e) = srv.must_be_replicated("the rename's install").await {
            // The resender sends the drop once it is.
            srv.wake_link_drop_resender();
            return Err(e);
        }
        // A drop that failed is sent again later (link_drops.rs).
        if let Sent::Done(Reply::Links { nlink: 0 }) = srv.send_link_drop(drop, false).await {
            held = drop.hold;
        }
    }
    Ok(held)
}

/// If the destination is a directory that `kind` may replace, seal it empty.
async fn seal_target(
    srv: &Server,
    dst_parent: InodeId,
    dst_name: &FileName,
    ino: InodeId,
    kind: FileKind,
    noreplace: bool,
) -> Result<(Option<Sealed>, Option<InodeId>), WireError> {
    match srv.load_dentry(dst_parent, dst_name)? {
        Some((FileKind::Dir, dino)) if kind == FileKind::Dir && dino != ino && !noreplace => {
            let removal = DirRemoval {
                dir: dino,
                parent: dst_parent,
                name: dst_name.clone(),
                seal: SealId::fresh(),
            };
            Ok((Some(srv.seal_empty_dir(&removal).await?), Some(dino)))
        }
        Some((_, dino)) => Ok((None, Some(dino))),
        None => Ok((None, None)),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn rename(
    srv: &Arc<Server>,
    c: &Credentials,
    sp: InodeId,
    sn: &FileName,
    dp: InodeId,
    dn: &FileName,
    flags: u32,
    hold: &Hold,
) -> Result<(Vec<TouchToken>, HeldVictim), WireError> {
    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
        || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
    {
        return Err(err(ErrorCode::InvalidArgument, "bad rename flags"));
    }
    let noreplace = flags & RENAME_NOREPLACE != 0;
    let sdir = srv.dir_owner(sp).await?;
    perm::check_dir_write(&sdir, c)?;
    let ddir = srv.dir_owner(dp).await?;
    perm::check_dir_write(&ddir, c)?;
    let (kind, ino) = srv
        .load_dentry(sp, sn)?
        .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
    if sp == dp && sn == dn {
        return Ok((Vec::new(), None));
    }
    if dp == ino {
        return Err(err(
            ErrorCode::InvalidArgument,
            "cannot move a directory into itself",
        ));
    }
    if sdir.perm & 0o1000 != 0
        || ddir.perm & 0o1000 != 0
        || (kind == FileKind::Dir && sp != dp && c.uid != 0)
    {
        let a = srv.attr_of(ino).await?;
        perm::check_sticky(&sdir, a.uid, c)?;
        if kind == FileKind::Dir && sp != dp {
            // Its ".." entry changes: that needs write access to it.
            perm::check(&perm::owner_of(&a), c, perm::WRITE)?;
        }
    }
    if ddir.perm & 0o1000 != 0 {
        if let Some((_, dino)) = srv.load_dentry(dp, dn)? {
            let a = srv.attr_of(dino).await?;
            perm::check_sticky(&ddir, a.uid, c)?;
        }
    }
    // A directory that changes parents: one such move at a time in the
    // cluster, checked not to go below itself (dir_moves.rs steps 1-2).
    let exchanged = if flags & RENAME_EXCHANGE != 0 && sp != dp {
        srv.load_dentry(dp, dn)?
    } else {
        None
    };
    let mut moved_dirs = Vec::new();
    if sp != dp && kind == FileKind::Dir {
        moved_dirs.push((ino, dp));
    }
    if let Some((FileKind::Dir, other)) = exchanged {
        moved_dirs.push((other, sp));
    }
    let mut guard = srv.prepare_dir_moves(&moved_dirs).await?;
    let result = if flags & RENAME_EXCHANGE != 0 {
        exchange(srv, (sp, sn, kind, ino), (dp, dn, exchanged))
            .await
            .map(|t| (t, None))
    } else {
        let mv = Intent {
            src_parent: sp,
            src_name: sn.clone(),
            dst_parent: dp,
            dst_name: dn.clone(),
            ino,
            kind,
        };
        if dentry_server(dp, dn, srv.servers) == srv.id {
            rename_local(srv, &mv, noreplace, hold).await
        } else {
            rename_remote(srv, mv, noreplace, hold, &mut guard).await
        }
    };
    let held = match result {
        Ok(held) => held,
        Err(e) => {
            release(guard).await;
            return Err(e);
        }
    };
    if flags & RENAME_EXCHANGE == 0 {
        touch_moved(srv, ino).await;
    }
    if let Some(g) = guard {
        let dirs = moved_dirs.iter().map(|&(d, _)| d).collect();
        srv.finish_dir_moves(dirs, g).await;
    }
    Ok(held)
}

async fn release(guard: Option<crate::dir_moves::DirMoveGuard>) {
    if let Some(g) = guard {
        g.release().await;
    }
}

/// The moved inode's ctime, as ext4 sets it at rename: on its owner, after
/// the names moved (best effort: the rename happened whatever this does).
async fn touch_moved(srv: &Arc<Server>, ino: InodeId) {
    let r = if ino.owner() == srv.id {
        srv.adjust_links(ino, 0, false).await
    } else {
        srv.call_peer(
            ino.owner(),
            Op::AdjustLinks {
                ino,
                delta: 0,
                hold: false,
            },
        )
        .await
    };
    match r {
        // Removed by another client meanwhile: nothing to stamp.
        Err(e) if e.code == ErrorCode::NotFound => {}
        Err(e) => tracing::warn!("ctime of renamed {ino}: {e}"),
        Ok(_) => {}
    }
}

/// A rename's outcome for its client: the replaced target, if it lost its
/// last link and is held for the client (`Hold`).
pub(crate) type HeldVictim = Option<(InodeId, FileKind)>;

async fn rename_local(
    srv: &Arc<Server>,
    mv: &Intent,
    noreplace: bool,
    hold: &Hold,
) -> Result<(Vec<TouchToken>, HeldVictim), WireError> {
    let (sp, sn, dp, dn) = (mv.src_parent, &mv.src_name, mv.dst_parent, &mv.dst_name);
    let (ino, kind) = (mv.ino, mv.kind);
    let (sealed, target) = seal_target(srv, dp, dn, ino, kind, noreplace).await?;
    let result = async {
        let mut keys = vec![
            LockKey::Dentry(sp, sn),
            LockKey::Dentry(dp, dn),
            LockKey::Inode(ino),
        ];
        if let Some(t) = target {
            keys.push(LockKey::Inode(t));
        }
        let mut parents = DirChanges::one(sp, 0);
        parents.add(dp, 0);
        keys.extend(parents.local_keys(srv.id));
        // Unsealed under the gate: a seal taken between a look and the
        // gate saw the directory empty (the plain simulation, seeds 30462
        // and 30624: a rename onto an empty directory replaced it while a
        // file moved into it).
        let guard = srv.lock_unsealed(dp, &keys).await?;
        if srv.load_dentry(sp, sn)? != Some((kind, ino)) {
            return Err(err(ErrorCode::TryAgain, "the source changed during rename"));
        }
        if srv.load_dentry(dp, dn)?.map(|(_, i)| i) != target {
            return Err(err(ErrorCode::TryAgain, "the target changed during rename"));
        }
        let mut b = WriteBatch::new();
        let done = install_into(srv, &mut b, dp, dn, ino, kind, noreplace, &sealed, hold)?;
        if done.same {
            return Ok((done, Vec::new()));
        }
        b.delete(&keys::dentry(sp, sn));
        let mut changes = install_changes(dp, kind, &done);
        changes.add(sp, -dir_links(kind));
        let time = Timestamp::now();
        let tickets = srv.touch_local(&mut b, &changes, time)?;
        // Other servers act on a replaced target next (its owner drops a
        // link, every server forgets a directory): the rename must outlive
        // a power cut first, or the old name comes back without its link.
        let remote = done
            .replaced
            .is_some_and(|(d, k)| d.owner() != srv.id || k == FileKind::Dir);
        // Whether a remote replaced inode is held is its owner's to say,
        // later: a retry learns only of a local one.
        crate::once::record(
            &mut b,
            &rename_reply(srv, done.replaced.filter(|_| done.held), Vec::new()),
        );
        // A directory's new place, as a new directory's (ops/create.rs):
        // other servers may put entries, or move directories, under it at
        // once, and if a power cut then undid this rename but not theirs,
        // a directory moved below its old child would close a loop no name
        // reaches (the plain simulation, seeds 44946 and 47847).
        let moved_dir = kind == FileKind::Dir && sp != dp;
        if moved_dir {
            srv.note_dir_moved(&mut b, ino, sp, dp)?;
        }
        srv.kv.write(b, remote || moved_dir).map_err(kv_err)?;
        drop(guard);
        Ok((done, tickets))
    }
    .await;
    match result {
        Ok((done, tickets)) => {
            let touched = srv.touch_queued(tickets);
            let held = after_install(srv, &done).await?;
            Ok((touched, done.replaced.filter(|_| held)))
        }
        Err(e) => {
            if let Some(s) = &sealed {
                srv.unseal(&s.removal).await;
            }
            Err(e)
        }
    }
}

pub(crate) fn is_uncertain(e: &WireError) -> bool {
    matches!(
        e.code,
        ErrorCode::Unavailable | ErrorCode::TimedOut | ErrorCode::Protocol
    )
}

async fn rename_remote(
    srv: &Arc<Server>,
    intent: Intent,
    noreplace: bool,
    hold: &Hold,
    dir_move: &mut Option<crate::dir_moves::DirMoveGuard>,
) -> Result<(Vec<TouchToken>, HeldVictim), WireError> {
    // Owned copies: `intent` itself moves into the recovery task if B is silent.
    let (sn, dn) = (&intent.src_name.clone(), &intent.dst_name.clone());
    let (sp, dp, ino, kind) = (
        intent.src_parent,
        intent.dst_parent,
        intent.ino,
        intent.kind,
    );
    let b_server = dentry_server(dp, dn, srv.servers);
    // Step 1. The source name's lock alone: B may touch the source
    // directory (on this server) before it answers step 3, and drop a link
    // of the target it replaced, which may be another rename's source
    // inode here; with the inode's lock held too, two renames onto each
    // other's names each waited for the other's install until the call
    // timeout (the plain simulation, seed 62854). Step 4 changes no inode.
    // A name still held by an unsettled rename fails the request (EIO
    // after `UNSETTLED_WAIT`); going on without the locks let a second
    // rename of the source move it while the first's outcome was unknown,
    // and both new names stayed (the replicated simulation with 4 servers,
    // seed 6024).
    let guard = srv.locks.lock(&[LockKey::Dentry(sp, sn)]).await?;
    if srv.load_dentry(sp, sn)? != Some((kind, ino)) {
        return Err(err(ErrorCode::TryAgain, "the source changed during rename"));
    }
    // Step 2.
    let tx = TxId(srv.tx_counter.next(srv.kv.as_ref()).map_err(kv_err)?);
    let mut b = WriteBatch::new();
    b.put(&keys::rename_intent(tx), &intent.encode());
    srv.kv.write(b, true).map_err(kv_err)?;
    // The intent must be on this set's copies before B acts: a failover
    // to a copy without it would keep the source name with no intent to
    // settle, beside the new name B installed.
    if let Err(e) = srv.must_be_replicated("the rename's intent").await {
        let mut b = WriteBatch::new();
        b.delete(&keys::rename_intent(tx));
        srv.kv.write(b, true).map_err(kv_err)?;
        return Err(e);
    }
    // Step 3.
    let install = Op::RenameInstall {
        tx,
        coordinator: srv.id,
        dst_parent: dp,
        dst_name: dn.clone(),
        ino,
        kind,
        noreplace,
        hold: hold.clone(),
    };
    let answer = tokio::time::timeout(INSTALL_ANSWER_WITHIN, srv.call_peer(b_server, install))
        .await
        .unwrap_or_else(|_| {
            Err(err(
                ErrorCode::TimedOut,
                format!("no answer within {INSTALL_ANSWER_WITHIN:?}"),
            ))
        });
    match answer {
        Err(e) if is_uncertain(&e) => {
            // Until settled, the source name may also be the new name's
            // link: no other request may take it for one of its own.
            srv.locks.unsettle(sp, sn);
            drop(guard);
            let me = srv.clone();
            // A directory's move keeps the lock until it is settled.
            let dir_move = dir_move.take();
            tokio::spawn(async move { settle(&me, tx, intent, dir_move).await });
            Err(err(
                ErrorCode::Io,
                format!(
                    "rename: server {b_server} did not answer ({}); it will be completed or undone",
                    e.message
                ),
            ))
        }
        Err(e) => {
            let mut b = WriteBatch::new();
            b.delete(&keys::rename_intent(tx));
            srv.kv.write(b, true).map_err(kv_err)?;
            Err(e)
        }
        Ok(reply) => {
            let same = matches!(reply, Reply::Installed { replaced: Some((r, _)), .. } if r == ino);
            let held = match reply {
                Reply::Installed {
                    replaced: Some(victim),
                    held: true,
                } if !same => Some(victim),
                _ => None,
            };
            // Step 4 (unless the target already was this inode).
            let mut b = WriteBatch::new();
            let time = Timestamp::now();
            if !same {
                b.delete(&keys::dentry(sp, sn));
                if kind == FileKind::Dir && sp != dp {
                    srv.note_dir_moved(&mut b, ino, sp, dp)?;
                }
            }
            b.delete(&keys::rename_intent(tx));
            crate::once::record(&mut b, &rename_reply(srv, held, Vec::new()));
            srv.kv.write(b, true).map_err(kv_err)?;
            drop(guard);
            let touched = if same {
                Vec::new()
            } else {
                // The source directory, after the locks (see step 1).
                srv.touch_after(&DirChanges::one(sp, -dir_links(kind)), time)
                    .await
            };
            // Step 5.
            let me = srv.clone();
            tokio::spawn(async move {
                // B forgets the rename only once the source's removal is
                // on this set's replicas: else a failover now serves the
                // set from a copy that still has the intent and the source
                // name, whose settling would then hear "not installed"
                // and keep both names. (A deposed primary never gets
                // there: B keeps the record.)
                if !me.replicated_now().await {
                    return;
                }
                let _ = me
                    .call_peer(
                        b_server,
                        Op::RenameResolve {
                            tx,
                            coordinator: me.id,
                            forget: true,
                        },
                    )
                    .await;
            });
            Ok((touched, held))
        }
    }
}

/// Step 3 on B.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn install(
    srv: &Arc<Server>,
    tx: TxId,
    coordinator: ServerId,
    dp: InodeId,
    dn: &FileName,
    ino: InodeId,
    kind: FileKind,
    noreplace: bool,
    hold: &Hold,
) -> Result<(Option<(InodeId, FileKind)>, bool), WireError> {
    let marker = keys::rename_done(coordinator, tx);
    if let Some(v) = srv.kv.get(&marker).map_err(kv_err)? {
        return match decode_marker(&v) {
            Some(Marker::Aborted { .. }) => Err(err(ErrorCode::Stale, "rename was aborted")),
            // A retry of this very install: already done (whether it held
            // the target is not recorded; a held target missed here is
            // freed at its owner's next start).
            Some(Marker::Installed(done, r)) if done == ino => Ok((r, false)),
            // Same id, another inode: never install on a stale record.
            Some(Marker::Installed(..)) => Err(err(
                ErrorCode::Stale,
                "rename id already used for another inode",
            )),
            None => Err(err(ErrorCode::Io, "corrupt rename marker")),
        };
    }
    if !srv.holds_dentry(dp, dn) {
        return Err(err(
            ErrorCode::Stale,
            "destination name is not held by this server",
        ));
    }
    let (sealed, target) = seal_target(srv, dp, dn, ino, kind, noreplace).await?;
    let result = async {
        srv.wait_unsealed(dp).await?;
        srv.dir_owner(dp).await?;
        let mut keys = vec![LockKey::Dentry(dp, dn)];
        if let Some(t) = target {
            keys.push(LockKey::Inode(t));
        }
        keys.extend(DirChanges::one(dp, 0).local_keys(srv.id));
        // Unsealed under the gate (as in `rename_local`).
        let guard = tokio::time::timeout(LOCK_WAIT, srv.lock_unsealed(dp, &keys))
            .await
            .map_err(|_| err(ErrorCode::TryAgain, "destination busy"))??;
        if srv.load_dentry(dp, dn)?.map(|(_, i)| i) != target {
            return Err(err(ErrorCode::TryAgain, "the target changed during rename"));
        }
        let mut b = WriteBatch::new();
        let done = install_into(srv, &mut b, dp, dn, ino, kind, noreplace, &sealed, hold)?;
        let replaced = if done.same {
            Some((ino, kind))
        } else {
            done.replaced
        };
        // The source's server moves its directory's link down (step 4).
        let changes = if done.same {
            DirChanges::default()
        } else {
            install_changes(dp, kind, &done)
        };
        let time = Timestamp::now();
        let tickets = srv.touch_local(&mut b, &changes, time)?;
        b.put(&marker, &encode_marker(&Marker::Installed(ino, replaced)));
        {
            // A resolve that came while this install waited for its locks
            // may have aborted it (a coordinator's copy settling after a
            // failover): look again, with the marker's lock held through
            // the write (the replicated simulation, seed 3843).
            let _marker = srv.locks.marker(coordinator, tx);
            if srv.kv.get(&marker).map_err(kv_err)?.is_some() {
                return Err(err(ErrorCode::Stale, "rename was settled meanwhile"));
            }
            srv.kv.write(b, true).map_err(kv_err)?;
        }
        drop(guard);
        Ok((done, replaced, tickets))
    }
    .await;
    match result {
        Ok((done, replaced, tickets)) => {
            srv.touch_remote(tickets).await;
            let held = after_install(srv, &done).await?;
            Ok((replaced, held))
        }
        Err(e) => {
            if let Some(s) = &sealed {
                srv.unseal(&s.removal).await;
            }
            Err(e)
        }
    }
}

/// RENAME_EXCHANGE: swap two names held by this server atomically. Each
/// as looked at before (the source's kind and inode; the destination's,
/// when the names are in two directories): else TryAgain, as the
/// directory-move checks were made on those.
async fn exchange(
    srv: &Arc<Server>,
    (sp, sn, kind, ino): (InodeId, &FileName, FileKind, InodeId),
    (dp, dn, seen): (InodeId, &FileName, Option<(FileKind, InodeId)>),
) -> Result<Vec<TouchToken>, WireError> {
    if !srv.holds_dentry(dp, dn) {
        return Err(err(
            ErrorCode::NotSupported,
            "RENAME_EXCHANGE of names held by two servers is not supported yet",
        ));
    }
    let mut parents = DirChanges::one(sp, 0);
    parents.add(dp, 0);
    let mut lock_keys = vec![LockKey::Dentry(sp, sn), LockKey::Dentry(dp, dn)];
    lock_keys.extend(parents.local_keys(srv.id));
    let g = srv.locks.lock(&lock_keys).await?;
    let (sk, si) = srv
        .load_dentry(sp, sn)?
        .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
    let (dk, di) = srv
        .load_dentry(dp, dn)?
        .ok_or_else(|| err(ErrorCode::NotFound, ""))?;
    if (sk, si) != (kind, ino) || (sp != dp && seen != Some((dk, di))) {
        return Err(err(ErrorCode::TryAgain, "a name changed during rename"));
    }
    let mut b = WriteBatch::new();
    Server::put_dentry(&mut b, sp, sn, dk, di);
    Server::put_dentry(&mut b, dp, dn, sk, si);
    if sp != dp {
        if sk == FileKind::Dir {
            srv.note_dir_moved(&mut b, si, sp, dp)?;
        }
        if dk == FileKind::Dir {
            srv.note_dir_moved(&mut b, di, dp, sp)?;
        }
    }
    // Each directory loses the ".." of what left it and gains the other's.
    let mut changes = DirChanges::one(sp, dir_links(dk) - dir_links(sk));
    changes.add(dp, dir_links(sk) - dir_links(dk));
    let time = Timestamp::now();
    let tickets = srv.touch_local(&mut b, &changes, time)?;
    srv.kv.write(b, false).map_err(kv_err)?;
    drop(g);
    Ok(srv.touch_queued(tickets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use madfs_kv::{KvStore, MemStore};

    #[test]
    fn only_aborted_markers_past_their_time_are_swept() {
        let kv = MemStore::new();
        let now = 1_000_000;
        let a = ServerId(1);
        let mut b = WriteBatch::new();
        let old = ABORTED_KEPT_FOR.as_secs() + 1;
        b.put(
            &keys::rename_done(a, TxId(1)),
            &encode_marker(&Marker::Aborted { since: now - old }),
        );
        b.put(
            &keys::rename_done(a, TxId(2)),
            &encode_marker(&Marker::Aborted { since: now - 5 }),
        );
        b.put(
            &keys::rename_done(a, TxId(3)),
            &encode_marker(&Marker::Installed(InodeId(9), None)),
        );
        // A marker of the version before the time: swept at once.
        b.put(&keys::rename_done(a, TxId(4)), &[MARK_ABORTED]);
        kv.write(b, false).unwrap();
        assert_eq!(sweep_aborted(&kv, now).unwrap(), 2);
        let left = |tx| kv.get(&keys::rename_done(a, TxId(tx))).unwrap().is_some();
        assert!(!left(1) && left(2) && left(3) && !left(4));
        assert!(matches!(
            decode_marker(&kv.get(&keys::rename_done(a, TxId(2))).unwrap().unwrap()),
            Some(Marker::Aborted { since }) if since == now - 5
        ));
        assert_eq!(sweep_aborted(&kv, now).unwrap(), 0);
    }
}
