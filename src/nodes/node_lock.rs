//! A lock's commands on one node: acquire (`SET NX`, or the all-or-none and fenced scripts,
//! or through the gate's wait line), release, extend, shorten, a lease's check, and raising
//! fencing counters; on a cluster node, one call per hash slot the keys span.
//!
//! Without Lua: on a single server whose user may run `DELIFEQ` (Valkey >= 9.0) or `DELEX`
//! (Redis >= 8.4, untested), a one-key lock's release and extension go through them (`native`),
//! except on the lock's gate node while it keeps a wait line; a gate whose user may not run
//! scripts keeps no line from then on; and a node that can neither run scripts nor
//! compare-and-delete natively is never sent a lock's `SET` (see `caps`).
//!
//! Owns: which path each of a lock's commands takes on one node (batch, native, script, gate)
//! and its arguments.
//! Must not: configure fred or send a command but through `node` (its options), decode a reply
//! by hand (reply), count votes across nodes (quorum) or decide anything about a lock (redlock).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;

use crate::base::error::{NodeError, NodeErrorKind, Vote};
use crate::base::reply::{self, Acquired};
use crate::base::scripts::Script;
use crate::nodes::batch::{Held, LineRef};
use crate::nodes::node::{all, Backend, Node};

/// The server refused a script to this user (`NOPERM ... 'eval'`), or it was known to.
fn scripts_denied(e: &NodeError) -> bool {
    e.kind == NodeErrorKind::Permission
}

impl Node {
    /// `SET key token NX PX ttl` for one key, the all-or-none script for several; with fencing,
    /// the script that also reads each key's counter. A grant counts once the node's replicas
    /// confirmed it, when the builder asks for that (see `confirm`).
    pub(crate) async fn acquire(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Acquired {
        held.batched.mark(self.state.index, false);
        // A waiter's call on its gate may take several round trips (a turn that finds the key
        // held) and still set the key at the last: what ends the lock there waits for it.
        let _call = self
            .gated(&held.line)
            .filter(|l| l.member.is_some())
            .map(|l| l.call.begin());
        let mut acquired = 'vote: {
            // A node that is not identified yet, or is the same server as another entry, must not
            // vote: nothing is sent, so nothing needs cleaning up there.
            if let Err(e) = self.state.counts() {
                break 'vote Acquired::plain(Vote::Failed(e));
            }
            // Neither scripts nor a native compare-and-delete: a key set here could never be
            // released nor extended, so nothing is set.
            if let Some(message) = self.state.caps.no_lock() {
                break 'vote Acquired::plain(Vote::Failed(NodeError {
                    node: self.name.clone(),
                    kind: NodeErrorKind::Permission,
                    message,
                }));
            }
            // Only a waiter in line asks the gate's script; a first attempt sends the plain
            // `SET NX` here too (the line's machinery starts at its first refusal).
            let member = |l: &&LineRef| l.member.is_some();
            if let Some(line) = self.gated(&held.line).filter(member) {
                let _running = self.inflight(&held.value);
                let here = self.acquire_gated(&held, line, ttl_ms, timeout);
                let answer = match &self.backend {
                    Backend::Server(_) => here.await,
                    Backend::Cluster(_) => {
                        Box::pin(crate::nodes::cluster::creating(&held.value, here)).await
                    }
                };
                // Told also when the attempt was decided without it (see `GateAnswer`).
                if let Some(told) = &line.answer {
                    told.tell(answer.vote == Vote::Granted);
                }
                match &answer.vote {
                    // This user may not run scripts here: no line on this node; the plain SET.
                    Vote::Failed(e) if scripts_denied(e) => {
                        tracing::warn!(node = %self.name, cause = %e.message, "fredlock: this node refuses scripts, so it keeps no wait line (waiters poll); grant +@scripting to the user");
                        self.no_line
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => break 'vote answer,
                }
            }
            if let (Some(batch), [_], true) = (
                &self.batch,
                held.keys.as_slice(),
                held.fence_keys.is_empty(),
            ) {
                let reply = batch.acquire(&held, ttl_ms, timeout).await;
                break 'vote Acquired::plain(reply::set_nx(&self.name, reply));
            }
            let _running = self.inflight(&held.value);
            match &self.backend {
                Backend::Server(_) => self.acquire_here(&held, ttl_ms, timeout).await,
                Backend::Cluster(_) => {
                    let here = self.acquire_here(&held, ttl_ms, timeout);
                    Box::pin(crate::nodes::cluster::creating(&held.value, here)).await
                }
            }
        };
        // In this function's own body, not a layer around it: the acquire path's futures nest
        // deep enough already.
        if self.confirm.is_some() {
            acquired.vote = self.confirmed(acquired.vote, timeout).await;
        }
        acquired
    }

    async fn acquire_here(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Acquired {
        let Some(groups) = self.slot_groups(&held.keys) else {
            return self.acquire_one(held, ttl_ms, timeout).await;
        };
        // A cluster node whose keys span slots: one all-or-none script per slot; the node
        // grants only if every slot granted (a partial grant is cleaned up by the release that
        // follows any failed attempt, like on any node that did not grant).
        let parts = futures::future::join_all(groups.iter().map(|g| {
            let sub = held.subset(g);
            let this = &self;
            async move { this.acquire_one(&sub, ttl_ms, timeout).await }
        }))
        .await;
        let vote = all(parts.iter().map(|a| a.vote.clone()).collect());
        let counters = match (&vote, held.fence_keys.is_empty()) {
            (Vote::Granted, false) => {
                let mut counters = vec![0; held.keys.len()];
                for (g, part) in groups.iter().zip(&parts) {
                    let Some(got) = &part.counters else {
                        return Acquired::plain(Vote::Failed(self.unexpected("fencing counters")));
                    };
                    for (&i, &c) in g.iter().zip(got) {
                        counters[i] = c;
                    }
                }
                Some(counters)
            }
            _ => None,
        };
        Acquired {
            counters,
            ..Acquired::plain(vote)
        }
    }

    async fn acquire_one(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Acquired {
        if !held.fence_keys.is_empty() {
            return self.acquire_fenced(held, ttl_ms, timeout).await;
        }
        Acquired::plain(self.acquire_plain(held, ttl_ms, timeout).await)
    }

    async fn acquire_plain(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Vote {
        // One key on a cluster node (a single server's acquire goes through `batch`), or a
        // repair of one key on any node.
        if let [key] = held.keys.as_slice() {
            let args = vec![
                Value::from(key.as_str()),
                Value::from(held.value.as_str()),
                Value::from("PX"),
                Value::Integer(ttl_ms as i64),
                Value::from("NX"),
            ];
            reply::set_nx(&self.name, self.call("SET", 0, args, timeout).await)
        } else {
            let scripts = crate::base::scripts::Scripts::get();
            let reply = self
                .script(&scripts.acquire_many, held, Some(ttl_ms), timeout)
                .await;
            reply::vote(&self.name, reply)
        }
    }

    async fn acquire_fenced(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Acquired {
        let scripts = crate::base::scripts::Scripts::get();
        let keys: Vec<&str> = held
            .keys
            .iter()
            .chain(&held.fence_keys)
            .map(String::as_str)
            .collect();
        let argv = [
            Value::from(held.value.as_str()),
            Value::Integer(ttl_ms as i64),
        ];
        let reply = self
            .script_on(&scripts.acquire_fenced, &keys, &argv, timeout)
            .await;
        reply::fenced_acquire(&self.name, reply, held.keys.len())
    }

    /// Deletes the keys that still hold our token. Granted when every key was ours.
    ///
    /// On a single server, dropping this future once polled still releases (the command is in
    /// fred's queue, behind this node's earlier commands); callers rely on that. On a cluster
    /// node a release may need several steps (waiting for the token's acquire, redirects), so it
    /// runs in a task of its own that a dropped future does not stop.
    pub(crate) async fn release(self: Arc<Self>, held: Arc<Held>, timeout: Duration) -> Vote {
        // No repair of this lock is written after its release (see `repair`).
        held.repairs.close();
        // Marked again only if the release goes into the batcher (see `Batched`).
        held.batched.mark(self.state.index, false);
        if !self.is_cluster() {
            return self.release_here(&held, timeout).await;
        }
        let name = self.name.clone();
        let mut work = Box::pin(async move { self.release_here(&held, timeout).await });
        // Polled here first, which hands the command to the shard's connection at once: behind
        // this token's SET there (if the SET is redirected, so is the release, whose resend then
        // waits for it: see `Shards::call`), and ahead of a next acquire of the same key by this
        // process (spawning first let that SET overtake the release and be refused).
        if let std::task::Poll::Ready(vote) = futures::poll!(work.as_mut()) {
            return vote;
        }
        let task = tokio::spawn(work);
        task.await.unwrap_or_else(|e| {
            Vote::Failed(NodeError {
                node: name,
                kind: NodeErrorKind::Client,
                message: format!("the release task ended without an answer: {e}"),
            })
        })
    }

    async fn release_here(&self, held: &Arc<Held>, timeout: Duration) -> Vote {
        self.after_gate_call(held, timeout).await;
        // Sent even to a duplicate (it only deletes our own token), but a duplicate's answer
        // is never counted.
        let counts = self.state.counts();
        if let Some(line) = self.gated(&held.line) {
            match self.gate_release(held, line, timeout).await {
                // This user may not run scripts here (learnt now: a first attempt sends no
                // script): no line on this node; the plain release below.
                Err(e) if scripts_denied(&e) => {
                    self.no_line
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                reply => return Self::duplicate_or(counts, self.gate_vote(held, line, reply)),
            }
        }
        match self.resign(held, timeout).await {
            // Scripts taken away from this user since the term began: the plain release
            // (native on Valkey; observers learn of the end from the other nodes or at expiry).
            Some(Err(e)) if scripts_denied(&e) => {}
            Some(reply) => {
                return Self::duplicate_or(counts, reply::released(&self.name, reply, 1))
            }
            None => {}
        }
        let vote = match self.slot_groups(&held.keys) {
            None => {
                let reply = match (&self.batch, held.keys.len()) {
                    (Some(batch), 1) => batch.release(held, timeout).await,
                    _ => self.release_script(held, timeout).await,
                };
                reply::released(&self.name, reply, held.keys.len())
            }
            Some(groups) => {
                let this = self;
                all(futures::future::join_all(groups.iter().map(|g| {
                    let sub = held.subset(g);
                    async move {
                        let reply = this.release_script(&sub, timeout).await;
                        reply::released(&this.name, reply, sub.keys.len())
                    }
                }))
                .await)
            }
        };
        Self::duplicate_or(counts, vote)
    }

    /// An election term's release on a single server that is not its line's gate: the
    /// compare-and-delete and the announcement of the election's view to observers, in one
    /// script (`ELECT_RESIGN`). `None`: not such a release (the plain one follows).
    async fn resign(&self, held: &Held, timeout: Duration) -> Option<Result<Value, NodeError>> {
        let keys = self.announced(held)?;
        let scripts = crate::base::scripts::Scripts::get();
        let argv = [Value::from(held.value.as_str())];
        Some(
            self.script_on(&scripts.elect_resign, &keys, &argv, timeout)
                .await,
        )
    }

    /// An election term's keys on a single server: the lock key, the election's record and
    /// its yield request, whose view the term's extensions and release announce to observers
    /// (`None`: not a term's lock, or a cluster node, where observers read instead).
    pub(super) fn announced<'a>(&self, held: &'a Held) -> Option<[&'a str; 3]> {
        match (held.announce.get(), held.keys.as_slice(), held.custom) {
            (Some(a), [key], false) if !self.is_cluster() => {
                Some([key.as_str(), a[0].as_str(), a[1].as_str()])
            }
            _ => None,
        }
    }

    /// An election term's extension on a single server, announcing this node's view of the
    /// election after it (`ELECT_EXTEND`), so that observers see the new TTL without reading.
    /// `None`: not a term's lock here, or this user may not run scripts here (the plain
    /// extension follows; observers then read at the TTL they knew).
    async fn extend_announced(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Option<Vote> {
        let keys = self.announced(held)?;
        if self.state.caps.lua_free_only() {
            return None;
        }
        if let Err(e) = self.state.counts() {
            return Some(Vote::Failed(e));
        }
        let scripts = crate::base::scripts::Scripts::get();
        let argv = [
            Value::from(held.value.as_str()),
            Value::Integer(ttl_ms as i64),
        ];
        match self
            .script_on(&scripts.elect_extend, &keys, &argv, timeout)
            .await
        {
            Err(e) if scripts_denied(&e) => None,
            reply => Some(reply::vote(&self.name, reply)),
        }
    }

    /// A duplicate node's answer is never counted.
    fn duplicate_or(counts: Result<(), NodeError>, vote: Vote) -> Vote {
        match counts {
            Err(e) if e.kind == NodeErrorKind::Duplicate => Vote::Failed(e),
            _ => vote,
        }
    }

    /// The gate's release reply as a vote; a member it woke that is this Redlock's own is
    /// woken at once, and the key counts as contended.
    fn gate_vote(&self, held: &Held, line: &LineRef, reply: Result<Value, NodeError>) -> Vote {
        let (vote, woken) = reply::gate_released(&self.name, reply, held.keys.len());
        if let Some(member) = woken {
            line.local.woke(&member);
            if let Some(key) = held.keys.first() {
                line.local.mark_hot(key);
            }
        }
        vote
    }

    /// The release script over `held`'s keys; on a cluster node, a redirected resend waits for
    /// this token's acquire (see `Shards::call`).
    pub(super) async fn release_script(
        &self,
        held: &Held,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        let release = &scripts.release;
        let Backend::Cluster(shards) = &self.backend else {
            return self.script(release, held, None, timeout).await;
        };
        let Some(first) = held.keys.first() else {
            return Ok(Value::Integer(0));
        };
        let mut args = Vec::with_capacity(held.keys.len() + 3);
        args.push(Value::from(release.body));
        args.push(Value::Integer(held.keys.len() as i64));
        args.extend(held.keys.iter().map(|k| Value::from(k.as_str())));
        args.push(Value::from(held.value.as_str()));
        Box::pin(shards.call("EVAL", first, args, timeout, Some(&held.value))).await
    }

    /// Resets the TTL of every key if all still hold our token; never re-creates a key.
    pub(crate) async fn extend(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        let vote = self.clone().extend_unconfirmed(held, ttl_ms, timeout).await;
        self.confirmed(vote, timeout).await
    }

    /// [`extend`](Self::extend) before the replicas' confirmation: an election term's
    /// announced extension, the native one, or the script.
    pub(super) async fn extend_unconfirmed(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        if let Some(vote) = self.extend_announced(&held, ttl_ms, timeout).await {
            return vote;
        }
        if let Some(vote) = self.extend_native(&held, ttl_ms, timeout).await {
            return vote;
        }
        let scripts = crate::base::scripts::Scripts::get();
        self.ttl_script(&scripts.extend, held, ttl_ms, timeout)
            .await
    }

    /// Re-sets `held`'s keys on this node where they are missing, with our value and `ttl_ms`:
    /// `SET key value NX PX ttl` for one key (no script, so a node without Lua is repaired
    /// too), the all-or-none REPAIR script for several (one call per hash slot on a cluster
    /// node). Never overwrites another value and never touches a fencing counter. Sent only
    /// after an extension of the lock won on a quorum (see `held_rounds`). `None`: nothing was
    /// sent, because the lock's release began (see [`Repairs`](crate::nodes::batch::Repairs):
    /// the check and the hand-over to the connection are one step, so a repair never lands
    /// after the release).
    pub(crate) async fn repair(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Option<Vote> {
        if let Err(e) = self.state.counts() {
            return Some(Vote::Failed(e));
        }
        if self.state.caps.no_lock().is_some() {
            // A key set here could never be released nor extended (as for an acquire).
            return None;
        }
        let this = &*self;
        let keys = &*held;
        let work = async move {
            let _running = this.inflight(&keys.value);
            match this.slot_groups(&keys.keys) {
                None => this.repair_one(keys, ttl_ms, timeout).await,
                Some(groups) => all(futures::future::join_all(groups.iter().map(|g| {
                    let sub = keys.subset(g);
                    async move { this.repair_script(&sub, ttl_ms, timeout).await }
                }))
                .await),
            }
        };
        let mut call: std::pin::Pin<Box<dyn std::future::Future<Output = Vote> + Send + '_>> =
            match &self.backend {
                Backend::Server(_) => Box::pin(work),
                Backend::Cluster(_) => Box::pin(crate::nodes::cluster::creating(&held.value, work)),
            };
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(held.repairs.first_poll(call.as_mut(), cx))
        })
        .await?;
        Some(match first {
            std::task::Poll::Ready(vote) => vote,
            std::task::Poll::Pending => call.await,
        })
    }

    /// [`repair`](Self::repair) in one call: `SET NX` for a one-key lock (its key is missing
    /// here, or another value is there), the script for several keys.
    async fn repair_one(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Vote {
        if held.keys.len() == 1 {
            return self.acquire_plain(held, ttl_ms, timeout).await;
        }
        self.repair_script(held, ttl_ms, timeout).await
    }

    /// The REPAIR script over `held`'s keys (one hash slot's share of them on a cluster node:
    /// even one key, which may be ours already while another slot's is missing).
    async fn repair_script(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Vote {
        let scripts = crate::base::scripts::Scripts::get();
        let reply = self
            .script(&scripts.repair, held, Some(ttl_ms), timeout)
            .await;
        reply::vote(&self.name, reply)
    }

    /// A one-key lock's extension with `SET ... IFEQ` (see `native`) on a single server that
    /// has it; `None` where the script does it.
    async fn extend_native(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Option<Vote> {
        let (Backend::Server(client), [key]) = (&self.backend, held.keys.as_slice()) else {
            return None;
        };
        if let Err(e) = self.state.counts() {
            return Some(Vote::Failed(e));
        }
        let (client, state) = (client.clone(), self.state.clone());
        let (key, value) = (key.clone(), held.value.clone());
        let work = move |timeout| -> crate::nodes::batch::Boxed<_> {
            Box::pin(async move {
                crate::nodes::native::extend(&client, &state, &key, &value, ttl_ms, timeout).await
            })
        };
        let keys = held.keys.clone();
        let reply = self.in_order(keys, timeout, work, |e| Some(Err(e))).await?;
        Some(reply::set_nx(&self.name, reply))
    }

    /// Lowers the TTL of every key to `ttl_ms` if all still hold our token (a key already
    /// closer to expiry keeps its TTL); never lengthens or re-creates a key.
    pub(crate) async fn shorten(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        held.repairs.close();
        self.after_gate_call(&held, timeout).await;
        let scripts = crate::base::scripts::Scripts::get();
        self.ttl_script(&scripts.shorten, held, ttl_ms, timeout)
            .await
    }

    /// EXTEND or SHORTEN over `held`'s keys (one call per hash slot on a cluster node).
    async fn ttl_script(
        self: Arc<Self>,
        script: &'static Script,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        if let Err(e) = self.state.counts() {
            return Vote::Failed(e);
        }
        let this = &*self;
        let one = |sub: Held| async move {
            let reply = this.script(script, &sub, Some(ttl_ms), timeout).await;
            reply::vote(&this.name, reply)
        };
        match self.slot_groups(&held.keys) {
            None => {
                let reply = self.script(script, &held, Some(ttl_ms), timeout).await;
                reply::vote(&self.name, reply)
            }
            Some(groups) => {
                let subs = groups.iter().map(|g| one(held.subset(g)));
                all(futures::future::join_all(subs).await)
            }
        }
    }

    /// Whether every key still holds our token here, and the shortest TTL left (a lease's
    /// check; changes nothing). On a cluster node, one call per hash slot.
    pub(crate) async fn check_lease(
        self: Arc<Self>,
        held: Arc<Held>,
        timeout: Duration,
    ) -> reply::Checked {
        if let Err(e) = self.state.counts() {
            return reply::lease_checked(&self.name, Err(e));
        }
        let scripts = crate::base::scripts::Scripts::get();
        let this = &*self;
        let one = |sub: Held| async move {
            let reply = this.script(&scripts.lease_check, &sub, None, timeout).await;
            reply::lease_checked(&this.name, reply)
        };
        let groups = self
            .slot_groups(&held.keys)
            .unwrap_or_else(|| vec![(0..held.keys.len()).collect()]);
        let parts = futures::future::join_all(groups.iter().map(|g| one(held.subset(g)))).await;
        let pttl_ms = parts.iter().map(|c| c.pttl_ms).min().unwrap_or(0);
        let vote = all(parts.into_iter().map(|c| c.vote).collect());
        reply::Checked { vote, pttl_ms }
    }

    /// Raises each fencing counter to at least its token (a max-register). Granted when done
    /// (and, with confirmation, once the replicas have it).
    pub(crate) async fn raise_fence(
        self: Arc<Self>,
        fence: Arc<(Vec<String>, Vec<u64>)>,
        timeout: Duration,
    ) -> Vote {
        if let Err(e) = self.state.counts() {
            return Vote::Failed(e);
        }
        let (this, fence) = (&*self, &*fence);
        let raise = |idx: Vec<usize>| async move {
            let scripts = crate::base::scripts::Scripts::get();
            let keys: Vec<&str> = idx.iter().map(|&i| fence.0[i].as_str()).collect();
            let argv: Vec<Value> = idx
                .iter()
                .map(|&i| Value::Integer(fence.1[i] as i64))
                .collect();
            let reply = this
                .script_on(&scripts.fence_raise, &keys, &argv, timeout)
                .await;
            reply::fence_raised(&this.name, reply)
        };
        let vote = match self.slot_groups(&fence.0) {
            None => raise((0..fence.0.len()).collect()).await,
            Some(groups) => all(futures::future::join_all(groups.into_iter().map(raise)).await),
        };
        // A raise a failover lost could let a later quorum hand out a smaller token: it counts
        // once the replicas confirmed it, as the acquire did (see `confirm`).
        self.confirmed(vote, timeout).await
    }
}

#[cfg(test)]
mod future_size {
    use super::*;
    use crate::nodes::connection::Servers;

    /// Every round moves one future per node into a box, so their size is paid per command:
    /// fred's command futures (~5 KB) must stay boxed, on every path (a cluster node's redirect
    /// loop once made every node future 6.6 KB, single-server nodes included).
    #[test]
    fn node_futures_stay_small() {
        let servers = Arc::new(Servers::default());
        let node = Arc::new(Node::from_url(0, "redis://127.0.0.1:1", servers, None).expect("node"));
        let held = Arc::new(Held {
            keys: vec!["a".into()],
            value: "t".into(),
            custom: false,
            resources: Vec::new(),
            fence_keys: Vec::new(),
            line: None,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        });
        let second = Duration::from_secs(1);
        let sizes = [
            std::mem::size_of_val(&node.clone().acquire(held.clone(), 1000, second)),
            std::mem::size_of_val(&node.clone().release(held.clone(), second)),
            std::mem::size_of_val(&node.clone().extend(held.clone(), 1000, second)),
        ];
        assert!(sizes.iter().all(|&s| s <= 2048), "{sizes:?}");
    }
}
