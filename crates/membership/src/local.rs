//! An in-process [`Transport`] for tests: every node of a group lives in
//! one process, messages are handed to the target's `Membership::handle`
//! as a task of its own, and the test cuts links (partitions), loses
//! messages and delays them, all from one seed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use madfs_types::ServerId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Membership, Transport};

/// How long a lost message keeps its caller waiting before failing; the
/// crate's own timeouts are shorter, so they fire first, as over TCP.
const LOST_MESSAGE_WAIT: Duration = Duration::from_secs(30);

/// The network of an in-process group.
pub struct LocalNet {
    state: Mutex<NetState>,
}

struct NetState {
    nodes: HashMap<ServerId, Membership>,
    /// Servers talk only within the same group; everyone starts in group 0.
    group_of: HashMap<ServerId, u32>,
    next_group: u32,
    /// Chance, in thousandths, that a message (or its reply) is lost.
    loss_per_mille: u32,
    /// Each message is delayed up to this long.
    delay_max: Duration,
    rng: ChaCha8Rng,
}

/// One node's end of a [`LocalNet`].
struct LocalTransport {
    net: Arc<LocalNet>,
    from: ServerId,
}

impl LocalNet {
    /// An empty network whose losses and delays are drawn from `seed`.
    pub fn new(seed: u64) -> Arc<LocalNet> {
        Arc::new(LocalNet {
            state: Mutex::new(NetState {
                nodes: HashMap::new(),
                group_of: HashMap::new(),
                next_group: 1,
                loss_per_mille: 0,
                delay_max: Duration::ZERO,
                rng: ChaCha8Rng::seed_from_u64(seed),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The transport that server `from` sends with.
    pub fn transport(self: &Arc<Self>, from: ServerId) -> Arc<dyn Transport> {
        Arc::new(LocalTransport {
            net: self.clone(),
            from,
        })
    }

    /// Deliver messages for `node.me()` to `node` from now on.
    pub fn attach(&self, node: Membership) {
        self.lock().nodes.insert(node.me(), node);
    }

    /// Stop delivering to `server` (as if its process died).
    pub fn detach(&self, server: ServerId) {
        self.lock().nodes.remove(&server);
    }

    /// Cut `side` off from everyone else (it still talks within itself).
    pub fn partition(&self, side: &[ServerId]) {
        let mut state = self.lock();
        let group = state.next_group;
        state.next_group += 1;
        for server in side {
            state.group_of.insert(*server, group);
        }
    }

    /// Cut `server` off from everyone.
    pub fn isolate(&self, server: ServerId) {
        self.partition(&[server]);
    }

    /// Put `server` back on the main side (group 0) of any partition.
    pub fn rejoin(&self, server: ServerId) {
        self.lock().group_of.remove(&server);
    }

    /// Join every partition again.
    pub fn heal(&self) {
        self.lock().group_of.clear();
    }

    /// Lose each message, and each reply, with this chance in thousandths.
    pub fn set_loss(&self, per_mille: u32) {
        assert!(per_mille <= 1000, "a chance in thousandths");
        self.lock().loss_per_mille = per_mille;
    }

    /// Delay each message and each reply by up to `delay_max`.
    pub fn set_delay(&self, delay_max: Duration) {
        self.lock().delay_max = delay_max;
    }

    /// Whether a message from `from` to `to` would be delivered now: the
    /// link is not cut and the draw did not lose it. For tests' own
    /// messages (pings) over the same partitions.
    pub fn delivers(&self, from: ServerId, to: ServerId) -> bool {
        let mut state = self.lock();
        state.linked(from, to) && !state.lose()
    }

    /// A delay drawn for one message.
    fn draw_delay(&self) -> Duration {
        let mut state = self.lock();
        let max = state.delay_max.as_micros() as u64;
        if max == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(state.rng.random_range(0..=max))
    }
}

impl NetState {
    fn linked(&self, a: ServerId, b: ServerId) -> bool {
        self.group_of.get(&a).copied().unwrap_or(0) == self.group_of.get(&b).copied().unwrap_or(0)
    }

    fn lose(&mut self) -> bool {
        self.loss_per_mille > 0 && self.rng.random_range(0..1000) < self.loss_per_mille
    }
}

/// What happens to one message at the moment it would be delivered.
enum Fate {
    Delivered(Membership),
    Lost,
    Refused(String),
}

impl LocalNet {
    fn fate(&self, from: ServerId, to: ServerId) -> Fate {
        let mut state = self.lock();
        if !state.linked(from, to) {
            return Fate::Refused(format!("no route from {from} to {to}"));
        }
        if state.lose() {
            return Fate::Lost;
        }
        match state.nodes.get(&to) {
            Some(node) => Fate::Delivered(node.clone()),
            None => Fate::Refused(format!("server {to} is down")),
        }
    }

    /// Whether a reply from `from` to `to` arrives: a partition made while
    /// the request was served cuts it too.
    fn reply_arrives(&self, from: ServerId, to: ServerId) -> bool {
        let mut state = self.lock();
        state.linked(from, to) && !state.lose()
    }
}

impl Transport for LocalTransport {
    fn call(&self, to: ServerId, msg: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>, String>> {
        let net = self.net.clone();
        let from = self.from;
        Box::pin(async move {
            tokio::time::sleep(net.draw_delay()).await;
            let node = match net.fate(from, to) {
                Fate::Delivered(node) => node,
                Fate::Refused(why) => return Err(why),
                Fate::Lost => {
                    tokio::time::sleep(LOST_MESSAGE_WAIT).await;
                    return Err("message lost".into());
                }
            };
            // The receiver works on in its own task even if the caller gives
            // up, as a real server would.
            let handled = tokio::spawn(async move { node.handle(&msg).await });
            let reply = match handled.await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(e) => return Err(format!("handler of {to} failed: {e}")),
            };
            tokio::time::sleep(net.draw_delay()).await;
            if !net.reply_arrives(to, from) {
                tokio::time::sleep(LOST_MESSAGE_WAIT).await;
                return Err("reply lost".into());
            }
            Ok(reply)
        })
    }
}
