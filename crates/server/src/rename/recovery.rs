//! A cross-server rename's recovery (rename.rs, step 6): the markers the
//! destination's server keeps of each install, the answer it gives the
//! coordinator about them (RenameResolve), the sweep of aborted ones, and
//! the coordinator's settling of every intent it still holds.

use super::*;

pub(super) enum Marker {
    /// Installed `ino`; what it replaced, if anything.
    Installed(InodeId, Option<(InodeId, FileKind)>),
    /// Refused for good; since when (seconds since the epoch, B's clock;
    /// 0 in a marker of an older version).
    Aborted { since: u64 },
}

pub(super) fn encode_marker(m: &Marker) -> Vec<u8> {
    let mut e = Encoder::new();
    match m {
        Marker::Installed(ino, None) => {
            e.u8(MARK_INSTALLED);
            e.ino(*ino);
        }
        Marker::Installed(ino, Some((i, k))) => {
            e.u8(MARK_REPLACED);
            e.ino(*ino);
            e.ino(*i);
            e.kind(*k);
        }
        Marker::Aborted { since } => {
            e.u8(MARK_ABORTED);
            e.u64(*since);
        }
    }
    e.into_bytes()
}

pub(super) fn decode_marker(v: &[u8]) -> Option<Marker> {
    let mut d = Decoder::new(v);
    match d.u8().ok()? {
        MARK_INSTALLED => Some(Marker::Installed(d.ino().ok()?, None)),
        MARK_REPLACED => Some(Marker::Installed(
            d.ino().ok()?,
            Some((d.ino().ok()?, d.kind().ok()?)),
        )),
        MARK_ABORTED => Some(Marker::Aborted {
            since: d.u64().unwrap_or(0),
        }),
        _ => None,
    }
}

/// Step 6 on B: was tx installed? If not, make sure it never will be.
pub(crate) fn resolve(
    srv: &Server,
    tx: TxId,
    coordinator: ServerId,
    forget: bool,
) -> Result<bool, WireError> {
    let marker = keys::rename_done(coordinator, tx);
    // An install in progress writes its marker either before this looks
    // or not at all (`install`).
    let _marker = srv.locks.marker(coordinator, tx);
    let stored = match srv.kv.get(&marker).map_err(kv_err)? {
        Some(v) => decode_marker(&v),
        None => None,
    };
    let installed = match stored {
        // The target already was a link to the inode: the install changed
        // nothing, and the source name must stay (rename(2) of two links
        // of one file does nothing), so A is told "not installed".
        Some(Marker::Installed(ino, Some((r, _)))) => r != ino,
        Some(Marker::Installed(..)) => true,
        _ => false,
    };
    let aborted = matches!(stored, Some(Marker::Aborted { .. }));
    let mut b = WriteBatch::new();
    if forget && !aborted {
        b.delete(&marker);
    } else if !installed && !aborted {
        b.put(
            &marker,
            &encode_marker(&Marker::Aborted { since: now_secs() }),
        );
    }
    // (An aborted marker stays, whatever A says, until `sweep_aborted`.)
    srv.kv.write(b, true).map_err(kv_err)?;
    Ok(installed)
}

/// Seconds since the epoch by the wall clock: what aborted markers and
/// kept replies are dated with (0 before 1970).
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Delete the aborted markers older than `ABORTED_KEPT_FOR` at `now`
/// (seconds since the epoch); how many.
pub(crate) fn sweep_aborted(kv: &dyn madfs_kv::KvStore, now: u64) -> madfs_kv::Result<usize> {
    let cutoff = now.saturating_sub(ABORTED_KEPT_FOR.as_secs());
    // Aborted markers are few (renames a failover or a lost reply
    // interrupted): collected whole, deleted in batches.
    let mut old = Vec::new();
    kv.scan_visit(keys::RENAME_DONE, keys::RENAME_DONE, &mut |k, v| {
        if matches!(decode_marker(v), Some(Marker::Aborted { since }) if since <= cutoff) {
            old.push(k.to_vec());
        }
        true
    })?;
    for keys in old.chunks(SWEEP_BATCH_MAX) {
        let mut b = WriteBatch::new();
        for k in keys {
            b.delete(k);
        }
        kv.write(b, false)?;
    }
    Ok(old.len())
}

/// Step 6 on A for one intent: retry until B answers. The source name is
/// held (`Locks::unsettle`) from when the outcome became unknown (or from
/// the store's open, `hold_unsettled`) until this settles it.
pub(super) async fn settle(
    srv: &Arc<Server>,
    tx: TxId,
    intent: Intent,
    dir_move: Option<crate::dir_moves::DirMoveGuard>,
) {
    let moves_dir = intent.moves_dir();
    let b_server = dentry_server(intent.dst_parent, &intent.dst_name, srv.servers);
    let mut wait = Duration::from_millis(200);
    loop {
        // A deposed store's renames are settled by its set's new primary
        // (its recovery finds the intent in its copy); this store refuses
        // the writes, and a directory move's lock is left to its lease
        // (`DirMoveGuard`). Retrying here held that lock for good: every
        // later directory move failed with EBUSY (the replicated
        // simulation with 4 servers, seed 9302).
        if srv.deposed() {
            return;
        }
        let q = Op::RenameResolve {
            tx,
            coordinator: srv.id,
            forget: false,
        };
        match srv.call_peer(b_server, q).await {
            Ok(Reply::Resolved { installed }) => {
                let changes = DirChanges::one(intent.src_parent, -dir_links(intent.kind));
                let mut lock_keys = vec![LockKey::Dentry(intent.src_parent, &intent.src_name)];
                lock_keys.extend(changes.local_keys(srv.id));
                let g = srv.locks.lock_settling(&lock_keys).await;
                // Settled meanwhile by the same intent's other settle (the
                // start's recovery also finds intents left since the open).
                if let Ok(None) = srv.kv.get(&keys::rename_intent(tx)) {
                    return;
                }
                let mut b = WriteBatch::new();
                let time = Timestamp::now();
                let mut tickets = None;
                if installed
                    && srv
                        .load_dentry(intent.src_parent, &intent.src_name)
                        .ok()
                        .flatten()
                        == Some((intent.kind, intent.ino))
                {
                    b.delete(&keys::dentry(intent.src_parent, &intent.src_name));
                    tickets = srv.touch_local(&mut b, &changes, time).ok();
                    if moves_dir {
                        if let Err(e) = srv.note_dir_moved(
                            &mut b,
                            intent.ino,
                            intent.src_parent,
                            intent.dst_parent,
                        ) {
                            tracing::warn!("settling rename {tx:?}: {e}");
                        }
                    }
                }
                b.delete(&keys::rename_intent(tx));
                match srv.kv.write(b, true) {
                    Ok(()) => {
                        srv.locks.settle(intent.src_parent, &intent.src_name);
                        drop(g);
                        if let Some(t) = tickets {
                            srv.touch_remote(t).await;
                        }
                        if moves_dir {
                            srv.finish_dir_parent_change(intent.ino, dir_move.as_ref())
                                .await;
                        }
                        // As in step 5: not before the replicas have it.
                        if !srv.replicated_now().await {
                            return;
                        }
                        let _ = srv
                            .call_peer(
                                b_server,
                                Op::RenameResolve {
                                    tx,
                                    coordinator: srv.id,
                                    forget: true,
                                },
                            )
                            .await;
                        return;
                    }
                    Err(e) => tracing::warn!("settling rename {tx:?}: {e}"),
                }
            }
            Ok(other) => tracing::warn!("settling rename {tx:?}: unexpected reply {other:?}"),
            Err(e) => tracing::warn!("settling rename {tx:?} with server {b_server}: {e}"),
        }
        if let Some(g) = &dir_move {
            g.renew().await;
        }
        srv.pause(wait).await;
        wait = (wait * 2).min(Duration::from_secs(10));
    }
}

/// The intents in this server's store (renames a crash or a failover
/// interrupted), `None` for one that does not decode.
pub(super) fn stored_intents(srv: &Server) -> Result<Vec<(TxId, Option<Intent>)>, WireError> {
    let stored = srv
        .kv
        .scan(keys::RENAME_INTENT, keys::RENAME_INTENT, 100_000)
        .map_err(kv_err)?;
    Ok(stored
        .into_iter()
        .filter_map(|(k, v)| {
            let tx = k
                .get(4..12)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)?;
            Some((TxId(tx), Intent::decode(&v)))
        })
        .collect())
}

/// Whether a rename that moves a directory between parents, interrupted
/// by a crash or a failover, is still to be settled here (dir_moves.rs: a
/// lock held past its lease by such a move is not handed on before).
pub(crate) fn dir_move_unsettled(srv: &Server) -> Result<bool, WireError> {
    Ok(stored_intents(srv)?
        .iter()
        .any(|(_, i)| i.as_ref().is_some_and(Intent::moves_dir)))
}

/// At the store's open, before any request: hold the source name of every
/// stored intent until `recover` settles it.
pub(crate) fn hold_unsettled(srv: &Server) -> Result<usize, WireError> {
    let intents = stored_intents(srv)?;
    for (_, intent) in &intents {
        if let Some(i) = intent {
            srv.locks.unsettle(i.src_parent, &i.src_name);
        }
    }
    Ok(intents.len())
}

/// Finish every rename a crash interrupted, all at once (one destination
/// that does not answer holds up only its own renames).
pub(crate) async fn recover(srv: &Arc<Server>) {
    let intents = match stored_intents(srv) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("scanning rename intents: {e}");
            return;
        }
    };
    let mut settling = Vec::new();
    for (tx, intent) in intents {
        match intent {
            Some(intent) => settling.push(settle(srv, tx, intent, None)),
            None => tracing::warn!("corrupt rename intent {tx:?}"),
        }
    }
    futures::future::join_all(settling).await;
}
