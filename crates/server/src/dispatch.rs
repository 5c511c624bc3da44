//! The one table from opcode to handler (`Server::dispatch`), the server's
//! side of the RPC layer (`Handler`), and the background work a start runs.

use crate::errors::{err, io_err, kv_err, OpResult};
use crate::perm::{self, owner_of};
use crate::service::{blocking, Server};
use madfs_proto::auth::Role;
use madfs_proto::message::{Op, Reply};
use madfs_proto::{ErrorCode, Request, WireError};
use madfs_rpc::serve::{CallContext, Handler};
use madfs_types::{stable_hash, FileKind};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Server {
    /// The store is served from now on: `start_replication`, then
    /// `start_recoveries`.
    pub fn start_background(self: Arc<Self>) {
        self.start_replication();
        self.start_recoveries();
    }

    /// Keep the copies acknowledgements wait for in the store
    /// (`Replicator::start_noting`) and ship its records to them.
    pub fn start_replication(self: &Arc<Self>) {
        if let Some(r) = &self.replication {
            r.start_noting(self.unreplicated.clone());
            r.start_shippers(self.clone());
        }
    }

    /// Start the background work: finish the directory touches, renames,
    /// chunk purges, directory removals and links dropped on other servers
    /// that a crash interrupted. Each acts on other servers from what this
    /// store holds, so with replicas only once the map says the store is
    /// still its set's (failover.rs `Router::start_home_recoveries`): a
    /// store whose set moved while its server was down may hold changes
    /// no copy got, never acknowledged, which the set no longer has.
    pub fn start_recoveries(self: Arc<Self>) {
        // Before anything new of those directories: what a crash left unsent.
        self.resend_touches();
        // Links to drop on other servers that a crash or an unreachable
        // owner left (then whatever later sends fail).
        tokio::spawn(self.clone().resend_link_drops());
        let me = self.clone();
        tokio::spawn(async move { me.resend_dir_parent_changes().await });
        let me = self.clone();
        tokio::spawn(async move {
            crate::rename::recover(&me).await;
            me.recover_orphans().await;
            me.recover_dir_removals().await;
        });
        // The replies kept for retries of requests that run once expire
        // (once.rs); a deposed store is left alone.
        tokio::spawn(async move {
            loop {
                if !self.pause(crate::once::SWEEP_EVERY).await {
                    return;
                }
                self.clear_removal_records();
                let kv = self.kv.clone();
                let now = crate::rename::now_secs();
                let swept = blocking(move || {
                    let sweep = || {
                        let replies = crate::once::sweep(kv.as_ref(), now)?;
                        let aborted = crate::rename::sweep_aborted(kv.as_ref(), now)?;
                        Ok::<_, madfs_kv::KvError>((replies, aborted))
                    };
                    sweep().map_err(|e| std::io::Error::other(e.to_string()))
                });
                match swept.await {
                    Ok((r, a)) if r + a > 0 => tracing::debug!(
                        "swept {r} replies kept for retries, {a} aborted rename markers"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("sweeping the replies kept for retries: {e}"),
                }
            }
        });
    }

    /// Wait `d`, or less if the set moves away from this store meanwhile
    /// (`Replicator::retire`); false if it has. Background loops pause
    /// with it, so a deposed store's `Server` is dropped (its store
    /// closed, and with RocksDB its lock released) without waiting out
    /// their pauses: a copy of the set kept in the same directory is
    /// opened again only then.
    pub(crate) async fn pause(&self, d: Duration) -> bool {
        match &self.replication {
            None => {
                tokio::time::sleep(d).await;
                true
            }
            Some(r) => {
                tokio::select! {
                    () = tokio::time::sleep(d) => !r.retired(),
                    () = r.until_retired() => false,
                }
            }
        }
    }

    /// Whether the set moved away from this store (never without replicas).
    pub(crate) fn deposed(&self) -> bool {
        self.replication.as_ref().is_some_and(|r| r.retired())
    }

    /// With replicas: whether every replica in the set has what this
    /// server wrote so far, waiting for it at most `REPLICATION_WAIT_MAX`
    /// (true without replicas). For a step that must be on the replicas
    /// before another server acts on it.
    pub(crate) async fn replicated_now(&self) -> bool {
        match &self.replication {
            None => true,
            // A deposed store's changes never count: its set is served
            // from a copy that has only what was acknowledged.
            Some(r) if r.retired() => false,
            Some(r) => {
                let last = r.last_seq();
                tokio::time::timeout(REPLICATION_WAIT_MAX, r.wait_replicated(last))
                    .await
                    .is_ok()
            }
        }
    }

    /// `replicated_now`, as the error an operation answers when it is not:
    /// its change is in this store but may not be in the set's copies, so
    /// another server must not act on it yet, and the outcome is unknown.
    /// Another server acting on a change a failover then loses is what
    /// this guards against: an unlink's owner freeing the inode of a name
    /// the new primary still has (found by the simulation with replicas,
    /// seed 1263 of the soak: an rmdir on a lossy network).
    pub(crate) async fn must_be_replicated(&self, what: &str) -> Result<(), WireError> {
        if self.replicated_now().await {
            return Ok(());
        }
        Err(err(
            ErrorCode::TimedOut,
            format!(
                "server {}: {what} is not on every replica of the set; it may or may not \
                 have been done",
                self.id
            ),
        ))
    }

    /// Run a request; with replicas, answer only once every replica in the
    /// set has what this server wrote up to the handler's end (its own
    /// changes and any before them).
    pub(crate) async fn dispatch(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> OpResult {
        let replicated = !req.op.for_a_copy();
        // A request that must run once and already ran (here, or on the
        // primary whose copy this store was: a retry after a failover)
        // gets the reply it got then (once.rs).
        // Only a resend may have run before: a first send is not looked up.
        let once = req.once.filter(|_| req.op.runs_once());
        let done_before = match once {
            Some(o) if o.resent => crate::once::answered(self.kv.as_ref(), o.id).map_err(kv_err)?,
            _ => None,
        };
        let result = match done_before {
            Some(reply) => Ok((reply, Vec::new())),
            None => {
                let opcode = req.op.opcode();
                crate::once::run(once.map(|o| o.id), opcode, self.dispatch_op(ctx, req, data)).await
            }
        };
        if let (Some(r), true, Ok(_)) = (&self.replication, replicated, &result) {
            let last = r.last_seq();
            let waited = Instant::now();
            let in_time = tokio::time::timeout(REPLICATION_WAIT_MAX, r.wait_replicated(last))
                .await
                .is_ok();
            crate::replication::stats()
                .wait
                .observe(waited.elapsed().as_secs_f64());
            if !in_time {
                // Done here, not on every replica, and the membership group
                // has not taken the laggard out (this server may be cut
                // off): not acknowledged. Not `Unavailable`, which callers
                // (the pools) take for "refused before running" and send
                // again: the operation ran, and most are not idempotent
                // (an AdjustLinks sent twice freed a file another name
                // still had).
                return Err(err(
                    ErrorCode::TimedOut,
                    format!(
                        "server {}: not on every replica within {REPLICATION_WAIT_MAX:?}; \
                         not acknowledged",
                        self.id
                    ),
                ));
            }
        }
        result
    }

    async fn dispatch_op(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> OpResult {
        let c = &req.creds;
        let ok = |r: Reply| Ok((r, Vec::new()));
        match req.op {
            Op::Lookup { parent, name } => ok(self.lookup(c, parent, &name).await?),
            Op::Open {
                parent,
                name,
                data_max,
            } => self.open_lookup(c, parent, &name, data_max).await,
            Op::GetAttr { ino, after } => {
                // The client's own changes to a directory: their touches first.
                if !after.is_empty() {
                    self.wait_touches(ino, &after).await;
                }
                ok(Reply::Attr(self.must_inode(ino)?.attr))
            }
            Op::SetAttr { ino, changes } => ok(Reply::Attr(self.setattr(c, ino, changes).await?)),
            Op::Create {
                parent,
                name,
                kind,
                perm,
                exclusive,
                symlink_target,
            } => {
                if kind.is_special() {
                    return Err(err(
                        ErrorCode::InvalidArgument,
                        "special files come by Mknod",
                    ));
                }
                ok(self
                    .create(
                        c,
                        parent,
                        &name,
                        kind,
                        perm,
                        exclusive,
                        symlink_target,
                        data,
                        0,
                    )
                    .await?)
            }
            Op::Mknod {
                parent,
                name,
                kind,
                perm,
                rdev,
            } => ok(self.mknod(c, parent, &name, kind, perm, rdev).await?),
            Op::Remove {
                parent,
                name,
                dir,
                hold,
            } => ok(retry_races(|| self.remove(c, parent, &name, dir, &hold)).await?),
            Op::Release { ino } => ok(self.release_held(ino).await?),
            Op::Access { ino, mask } => {
                let inode = self.must_inode(ino)?;
                perm::check(&owner_of(&inode.attr), c, mask)?;
                ok(Reply::Attr(inode.attr))
            }
            Op::Read {
                ino,
                chunk,
                offset,
                len,
            } => self.read(ino, chunk, offset, len).await,
            Op::Write {
                ino,
                chunk,
                offset,
                file_size,
            } => ok(self.write(ino, chunk, offset, file_size, data).await?),
            Op::UpdateSize { ino, size, mtime } => ok(Reply::SizeUpdated {
                attr: self.update_size(ino, size, mtime).await?,
                verifier: self.write_verifier(),
            }),
            Op::Fsync => {
                self.sync.sync().await.map_err(|e| err(ErrorCode::Io, e))?;
                ok(self.synced_reply())
            }
            Op::ReadDir {
                dir,
                after,
                max_entries,
            } => ok(self.readdir(c, dir, after, max_entries).await?),
            Op::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                flags,
                hold,
            } => {
                let (touched, held) = retry_races(|| {
                    crate::rename::rename(
                        self, c, src_parent, &src_name, dst_parent, &dst_name, flags, &hold,
                    )
                })
                .await?;
                // A replaced target held for the client: it must release it.
                ok(crate::rename::rename_reply(self, held, touched))
            }
            Op::Link { ino, parent, name } => ok(self.link(c, ino, parent, &name).await?),
            Op::ReadLink { ino } => {
                let inode = self.must_inode(ino)?;
                if inode.attr.kind != FileKind::Symlink {
                    return Err(err(ErrorCode::InvalidArgument, "not a symlink"));
                }
                ok(Reply::Target(inode.target))
            }
            Op::TruncateChunks { ino, size } => {
                let (chunks, cs) = (self.chunks.clone(), self.chunk_size);
                blocking(move || chunks.truncate(ino, size, cs))
                    .await
                    .map_err(io_err)?;
                ok(Reply::Empty)
            }
            Op::StatFs => ok(Reply::FsStats(self.statfs()?)),
            Op::Find {
                query,
                after,
                max_entries,
            } => {
                let (kv, id) = (self.indexed.clone(), self.id);
                let page = tokio::task::spawn_blocking(move || {
                    crate::find::find_page(kv, id, &query, after, max_entries)
                })
                .await
                .map_err(|e| err(ErrorCode::Io, format!("find task failed: {e}")))??;
                ok(page)
            }
            Op::AdjustLinks { ino, delta, hold } => ok(self.adjust_links(ino, delta, hold).await?),
            Op::RenameInstall {
                tx,
                coordinator,
                dst_parent,
                dst_name,
                ino,
                kind,
                noreplace,
                hold,
            } => {
                let (replaced, held) = crate::rename::install(
                    self,
                    tx,
                    coordinator,
                    dst_parent,
                    &dst_name,
                    ino,
                    kind,
                    noreplace,
                    &hold,
                )
                .await?;
                ok(Reply::Installed { replaced, held })
            }
            Op::RenameResolve {
                tx,
                coordinator,
                forget,
            } => ok(Reply::Resolved {
                installed: crate::rename::resolve(self, tx, coordinator, forget)?,
            }),
            Op::DirMoveLock {
                holder,
                token,
                release,
            } => ok(self.dir_move_lock(holder, token, release).await?),
            Op::DirParent { ino, change } => ok(self.dir_parent(ino, change).await?),
            Op::DirMoveSettled { token } => ok(self.dir_move_settled(token)?),
            Op::FixDirLinks { dir, seen, want } => {
                ok(self.fix_dir_links(c, dir, seen, want).await?)
            }
            Op::ListInodes { after, max_entries } => {
                ok(self.list_inodes(c, after, max_entries).await?)
            }
            Op::Adopt {
                ino,
                into,
                name,
                seen,
            } => ok(self.adopt(c, ino, into, &name, seen).await?),
            Op::DropName { parent, name, ino } => ok(self.drop_name(c, parent, &name, ino).await?),
            Op::RemakeDir { dir, parent, nlink } => {
                ok(self.remake_dir(c, dir, parent, nlink).await?)
            }
            Op::FixFileLinks { ino, seen, want } => {
                ok(self.fix_file_links(c, ino, seen, want).await?)
            }
            Op::TouchDir {
                dir,
                sender,
                seq,
                time,
                nlink_delta,
            } => {
                debug_assert_eq!(ctx.role, Role::Peer);
                ok(self
                    .apply_touch(dir, sender, seq, time, nlink_delta)
                    .await?)
            }
            Op::ReplicaApply {
                set,
                stream,
                first_seq,
                heads,
            } => {
                debug_assert_eq!(ctx.role, Role::Peer);
                self.copies
                    .apply(set, stream, first_seq, &heads, data)
                    .await
            }
            Op::ReplicaDigests {
                set,
                stream,
                chunks,
            } => {
                debug_assert_eq!(ctx.role, Role::Peer);
                self.copies.digests(set, stream, chunks).await
            }
            Op::ReplicaKeyRange {
                set,
                stream,
                after,
                upto,
                digest,
            } => {
                debug_assert_eq!(ctx.role, Role::Peer);
                self.copies
                    .key_range(set, stream, after, upto, digest)
                    .await
            }
            Op::Membership { .. } => Err(err(
                ErrorCode::InvalidArgument,
                "this server takes no part in a membership group",
            )),
            // Answered by the process's router (failover.rs); a server
            // reached without one (the simulation) serves its own set only.
            Op::GetRoutes => ok(Reply::Routes {
                epoch: 0,
                serving: (0..self.servers as u16)
                    .map(madfs_types::ServerId)
                    .collect(),
                in_sync: Vec::new(),
                addresses: Vec::new(),
                voters: Vec::new(),
                lost: Vec::new(),
            }),
            op @ (Op::Seal { .. }
            | Op::ReportSeals { .. }
            | Op::PurgeChunks { .. }
            | Op::ChunkExtent { .. }
            | Op::InvalidateDir { .. }) => {
                debug_assert_eq!(ctx.role, Role::Peer);
                self.local_peer_op(op).await
            }
        }
    }
}

/// Longest a request waits for its records to reach every replica before
/// it is answered as not acknowledged (TimedOut).
const REPLICATION_WAIT_MAX: Duration = Duration::from_secs(10);

/// Times an operation that found its entries changed under it (TryAgain)
/// starts over before the caller sees EAGAIN, which rename(2) and unlink(2)
/// never return: racing renames onto one name must all succeed.
const RACE_RETRIES_MAX: u32 = 32;
/// Longest pause between two attempts (about 2 s over all of them).
const RACE_BACKOFF_MAX: Duration = Duration::from_millis(64);

pub(crate) async fn retry_races<T, F, Fut>(mut op: F) -> Result<T, WireError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, WireError>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.code == ErrorCode::TryAgain && attempt < RACE_RETRIES_MAX => {
                attempt += 1;
                if attempt <= 2 {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(race_backoff(attempt)).await;
                }
            }
            other => return other,
        }
    }
}

/// A pause that grows with `attempt` and differs from call to call: two
/// cross-server renames that swap names each hold their source while the
/// other's install waits for it; both give up (TryAgain) and retry, and
/// with equal pauses they would meet again every time (found by the
/// simulation, seed 35 with MADFS_SIM_RENAME_RACES=files).
fn race_backoff(attempt: u32) -> Duration {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let base = RACE_BACKOFF_MAX.min(Duration::from_millis(1 << attempt.min(16)));
    let spread = stable_hash(&[&CALLS.fetch_add(1, Ordering::Relaxed).to_le_bytes()]);
    let base_us = base.as_micros() as u64;
    Duration::from_micros(base_us / 2 + spread % base_us.max(1))
}

impl Handler for Server {
    fn handle(
        self: &Arc<Self>,
        ctx: CallContext,
        req: Request,
        data: Vec<u8>,
    ) -> impl Future<Output = OpResult> + Send {
        self.dispatch(ctx, req, data)
    }
}

/// The entry point when the server counts its requests (metrics.rs).
impl Handler for crate::metrics::Metered {
    async fn handle(self: &Arc<Self>, ctx: CallContext, req: Request, data: Vec<u8>) -> OpResult {
        let (op, data_in, started) = (req.op.opcode(), data.len(), Instant::now());
        let result = self.server.dispatch(ctx, req, data).await;
        self.metrics.record(op, started.elapsed(), data_in, &result);
        result
    }
}
