//! One Redis node: one fred [`Client`], commands bounded by a per-node timeout that fred itself
//! enforces, each reply handed to `reply` to become a [`Vote`] or a typed [`NodeError`].
//!
//! This is the only file that knows how fred is configured (what Redis answers look like is
//! `reply`'s).
//! The fred 10 traps it avoids, each of which was seen to break a lock:
//! - `with_options(..).evalsha(..)` ignores the options, so every command goes through
//!   `with_options(..).custom(..)`, which honours them;
//! - a reconnect policy is always set (without one a dropped connection hangs the client forever);
//! - `max_attempts = 1`: a `SET NX` in flight when a connection resets is never replayed later;
//! - per-command timeouts are fred's own, so a command that timed out before being written is
//!   skipped rather than written after a reconnect;
//! - `fail_fast`: while a node is disconnected its commands fail at once instead of queueing;
//! - the command queue is bounded.
//!
//! Without Lua: on a single server whose user may run `DELIFEQ` (Valkey >= 9.0) or `DELEX`
//! (Redis >= 8.4, untested), a one-key lock's release and extension go through them (`native`),
//! except on the lock's gate node while it keeps a wait line; every script call on a node whose
//! user may not run scripts fails at once, unsent, with [`NodeErrorKind::Permission`] and the
//! fix; and a node that can neither run scripts nor compare-and-delete natively is never sent
//! a lock's `SET` (see `caps`).
//!
//! Owns: the fred client of one node, its per-command options, the arguments of each command.
//! Must not: decode a reply by hand (reply), count votes across nodes (quorum) or decide anything
//! about a lock (redlock).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{ClientLike, Config, ServerConfig, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::base::error::{InvalidInput, NodeError, NodeErrorKind, Vote};
use crate::base::reply;
use crate::base::scripts::Script;
use crate::nodes::batch::Batch;
pub(crate) use crate::nodes::batch::{Held, LineRef};
use crate::nodes::cluster::Shards;
use crate::nodes::connection::{self, options, Link, Servers, State};

pub(crate) use crate::base::reply::{Acquired, Queue, Slot};
pub use fred::clients::Client;

/// How a node reaches its data.
enum Backend {
    /// One server (or a sentinel group) behind one fred client.
    Server(Client),
    /// A Redis Cluster: fredlock routes by slot itself (see `cluster`).
    Cluster(Arc<Shards>),
}

/// One configured Redis node.
pub(crate) struct Node {
    backend: Backend,
    /// `host:port/db`, safe to log.
    pub(crate) name: String,
    /// The server's address without the database index (`host:port`, or the sorted hosts of a
    /// cluster or sentinel group): two entries with the same address are one server.
    pub(crate) addr: String,
    /// Whether fredlock created the client (and so quits it when the Redlock is dropped).
    owned: bool,
    /// QUIT was sent (by `close`): a second one makes fred warn about a stopped client.
    quit: std::sync::atomic::AtomicBool,
    /// What the connect loop knows: link, identity, latest cause of failure.
    pub(crate) state: Arc<State>,
    /// A single server's hot path (single-key acquire and release), coalesced under
    /// concurrency (see `batch`); `None` on a cluster node.
    batch: Option<Batch>,
    /// This node refused a line script (the user may not run scripts): it keeps no lines.
    no_line: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.state.close();
        match &self.backend {
            Backend::Cluster(shards) => shards.close_now(),
            Backend::Server(client) => {
                if self.should_quit() {
                    if let Ok(rt) = tokio::runtime::Handle::try_current() {
                        let client = client.clone();
                        rt.spawn(async move {
                            let _ = client.quit().await;
                        });
                    }
                }
            }
        }
    }
}

impl Held {
    /// The secret token part of the value.
    pub(crate) fn token(&self) -> &str {
        crate::base::owner::split(&self.value).0
    }

    /// The owner label part of the value (`None`: none stored).
    pub(crate) fn label(&self) -> Option<&str> {
        crate::base::owner::split(&self.value).1
    }

    /// The keys at positions `idx` (one hash slot's share of a multi-resource lock).
    fn subset(&self, idx: &[usize]) -> Held {
        let pick = |v: &[String]| -> Vec<String> {
            if v.len() == self.keys.len() {
                idx.iter().map(|&i| v[i].clone()).collect()
            } else {
                v.to_vec()
            }
        };
        Held {
            keys: pick(&self.keys),
            value: self.value.clone(),
            custom: self.custom,
            resources: pick(&self.resources),
            fence_keys: if self.fence_keys.is_empty() {
                Vec::new()
            } else {
                pick(&self.fence_keys)
            },
            line: None,
        }
    }
}

/// The server refused a script to this user (`NOPERM ... 'eval'`), or it was known to.
fn scripts_denied(e: &NodeError) -> bool {
    e.kind == NodeErrorKind::Permission
}

/// The gate scripts' arguments after a semaphore's own: member, lease, channel prefix.
fn line_argv(line: &LineRef) -> [Value; 3] {
    [
        Value::from(line.member.as_deref().unwrap_or("")),
        Value::Integer(crate::base::line::LEASE.as_millis() as i64),
        Value::from(line.local.prefix()),
    ]
}

/// One node's vote from its slots' votes: failed if any failed, refused if any refused.
fn all(votes: Vec<Vote>) -> Vote {
    let mut out = Vote::Granted;
    for vote in votes {
        match vote {
            Vote::Failed(e) => return Vote::Failed(e),
            Vote::Refused => out = Vote::Refused,
            Vote::Granted | Vote::Pending => {}
        }
    }
    out
}

/// A semaphore slot request, the same for every node of one attempt.
#[derive(Debug)]
pub(crate) struct SlotRequest {
    pub(crate) meta_key: String,
    /// The slot keys in the order to try.
    pub(crate) slot_keys: Vec<String>,
    /// With fencing: their counters in the same order; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
    /// The value to store (see [`Held::value`]).
    pub(crate) value: String,
    pub(crate) ttl_ms: u64,
    /// The semaphore's wait line (its gate takes the slot through it).
    pub(crate) line: Option<LineRef>,
}

/// One lock's share of a batched extension (see [`Node::extend_many`]): its keys and token, and
/// the TTL to set.
#[derive(Debug)]
pub(crate) struct Extension {
    pub(crate) held: Arc<Held>,
    pub(crate) ttl_ms: u64,
}

/// Part of a batched extension that one script call carries: a lock (its index in the batch)
/// and which of its keys (`None`: all of them; on a cluster node, one hash slot's share).
type Part = (usize, Option<Vec<usize>>);

impl Node {
    /// Builds a client for `url` with fredlock's settings; connecting happens later.
    pub(crate) fn from_url(
        index: usize,
        url: &str,
        servers: Arc<Servers>,
    ) -> Result<Node, InvalidInput> {
        crate::base::endpoint::check(index, url)?;
        let invalid = |e: fred::error::Error| InvalidInput::InvalidUrl {
            index,
            url: crate::base::endpoint::redact(url),
            // fred's URL messages name the part that is wrong, never the URL itself.
            reason: e.details().to_string(),
        };
        let config = Config::from_url(url.trim()).map_err(invalid)?;
        let client = connection::client(config).map_err(invalid)?;
        let mut node = Node::from_client(index, client, servers);
        node.owned = true;
        Ok(node)
    }

    /// Wraps a caller's client. It must have a reconnect policy (checked by the builder). A
    /// cluster client only lends its configuration: fredlock opens its own shard clients.
    pub(crate) fn from_client(index: usize, client: Client, servers: Arc<Servers>) -> Node {
        let config = client.client_config();
        let (name, addr) = describe(&config);
        let state = State::new(index, name.clone(), servers);
        let (backend, batch) = if config.server.is_clustered() {
            let shards = Shards::new(index, name.clone(), config, state.clone());
            (Backend::Cluster(Arc::new(shards)), None)
        } else {
            let batch = Batch::new(client.clone(), state.clone());
            (Backend::Server(client), Some(batch))
        };
        Node {
            backend,
            state,
            name,
            addr,
            owned: false,
            quit: Default::default(),
            batch,
            no_line: Default::default(),
        }
    }

    /// The configuration a subscriber connection to this node uses; `None` for a cluster node
    /// (a script's PUBLISH there is broadcast to every shard: its waiters poll instead).
    pub(crate) fn subscriber_config(&self) -> Option<Config> {
        match &self.backend {
            Backend::Server(client) => Some(client.client_config()),
            Backend::Cluster(_) => None,
        }
    }

    /// The fred client of a single-server node; `None` for a cluster node (its commands go
    /// through one client per shard that fredlock keeps).
    pub(crate) fn client(&self) -> Option<&Client> {
        match &self.backend {
            Backend::Server(client) => Some(client),
            Backend::Cluster(_) => None,
        }
    }

    /// Whether every command sent to this node so far has left fred's channel to its router
    /// task (fred's `command_queue_len` is zero): the router has written each one to the
    /// connection or failed it, so their fred timeouts can no longer make fred skip them (see
    /// `quorum::fan_out_handed`). Always `false` on a cluster node, whose commands may be
    /// redirected and resent, and whose releases wait for the acquire in flight.
    pub(crate) fn handed_over(&self) -> bool {
        use fred::interfaces::MetricsInterface;
        match &self.backend {
            Backend::Server(client) => client.command_queue_len() == 0,
            Backend::Cluster(_) => false,
        }
    }

    /// Whether this node is a Redis Cluster (each script must stay in one hash slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    /// QUIT once, and only a client of ours whose connection task runs: fred warns about a QUIT
    /// to a client that never connected or was already quit.
    fn should_quit(&self) -> bool {
        self.owned
            && self.state.started()
            && !self.quit.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Starts fredlock's connect loop (see [`connection::spawn`]); never waits. A service can
    /// therefore start while a node is down.
    pub(crate) fn connect(&self) {
        match &self.backend {
            Backend::Server(client) => connection::spawn(client.clone(), self.state.clone()),
            Backend::Cluster(shards) => shards.spawn(),
        }
    }

    /// Stops the connect loop and, for clients fredlock created, sends QUIT behind whatever is
    /// queued (so queued releases are answered first).
    pub(crate) async fn close(&self) {
        self.state.close();
        match &self.backend {
            Backend::Cluster(shards) => shards.close().await,
            Backend::Server(client) => {
                if self.should_quit() {
                    let _ = client.quit().await;
                }
            }
        }
    }

    /// Resolves once the node is connected and identified.
    pub(crate) async fn up(&self) {
        let mut rx = self.state.link.subscribe();
        let _ = rx.wait_for(|l| *l == Link::Up).await;
    }

    /// One command with fredlock's options: fred's own timeout, one attempt, fail fast while the
    /// connection is down.
    async fn call(
        &self,
        cmd: &'static str,
        key_offset: usize,
        args: Vec<Value>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let client = match &self.backend {
            Backend::Server(client) => client,
            Backend::Cluster(shards) => {
                let Some(key) = args.get(key_offset).and_then(Value::as_str) else {
                    return Err(NodeError {
                        node: self.name.clone(),
                        kind: NodeErrorKind::Client,
                        message: format!("{cmd} without a key cannot be routed on a cluster"),
                    });
                };
                let key = key.to_string();
                // Boxed for the same reason as fred's futures below: the redirect loop holds
                // fred futures, and every node future would otherwise carry them inline.
                return Box::pin(shards.call(cmd, &key, args, timeout, None)).await;
            }
        };
        let command = CustomCommand::new_static(cmd, ClusterHash::Offset(key_offset), false);
        // Boxed: fred's command futures are ~5 KB and would otherwise be copied into every
        // per-node future of every round (measured: the largest user-space cost per cycle).
        Box::pin(
            client
                .with_options(&options(timeout))
                .custom::<Value, Value>(command, args),
        )
        .await
        .map_err(|e| self.error(e))
    }

    /// EVALSHA, and on NOSCRIPT an immediate EVAL on the same connection (so per-node order is
    /// kept: a release still lands after this node's earlier commands). EVAL-only scripts are
    /// always sent whole. `args(first)` builds the arguments after the script or its hash; it is
    /// called again (rarely) for the EVAL fallback rather than cloned on every EVALSHA: the
    /// extend script runs every renewal of every kept-alive lock.
    async fn eval_with(
        &self,
        script: &Script,
        timeout: Duration,
        args: impl Fn(&str) -> Vec<Value>,
    ) -> Result<Value, NodeError> {
        if let Some(e) = crate::nodes::native::scripts_refused(&self.state) {
            return Err(e);
        }
        if script.always_eval {
            let reply = self.call("EVAL", 2, args(script.body), timeout).await;
            return crate::nodes::native::scripted(&self.state, reply);
        }
        let reply = match self.call("EVALSHA", 2, args(&script.sha), timeout).await {
            Err(e) if e.kind == NodeErrorKind::Server && e.message.contains("NOSCRIPT") => {
                tracing::debug!(node = %self.name, "NOSCRIPT: resending the script with EVAL");
                self.call("EVAL", 2, args(script.body), timeout).await
            }
            other => other,
        };
        crate::nodes::native::scripted(&self.state, reply)
    }

    /// The release script over `held`'s keys; on a cluster node, a redirected resend waits for
    /// this token's acquire (see `Shards::call`).
    async fn release_script(&self, held: &Held, timeout: Duration) -> Result<Value, NodeError> {
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

    /// A script over `held`'s keys with ARGV = token (and `extra`).
    async fn script(
        &self,
        script: &Script,
        held: &Held,
        extra: Option<u64>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.eval_with(script, timeout, |first| {
            let mut args = Vec::with_capacity(held.keys.len() + 4);
            args.push(Value::from(first));
            args.push(Value::Integer(held.keys.len() as i64));
            args.extend(held.keys.iter().map(|k| Value::from(k.as_str())));
            args.push(Value::from(held.value.as_str()));
            if let Some(x) = extra {
                args.push(Value::Integer(x as i64));
            }
            args
        })
        .await
    }

    /// A script over any keys and arguments.
    async fn script_on(
        &self,
        script: &Script,
        keys: &[&str],
        argv: &[Value],
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.eval_with(script, timeout, |first| {
            let mut args = Vec::with_capacity(keys.len() + argv.len() + 2);
            args.push(Value::from(first));
            args.push(Value::Integer(keys.len() as i64));
            args.extend(keys.iter().map(|k| Value::from(*k)));
            args.extend(argv.iter().cloned());
            args
        })
        .await
    }

    /// `SET key token NX PX ttl` for one key, the all-or-none script for several; with fencing,
    /// the script that also reads each key's counter.
    pub(crate) async fn acquire(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Acquired {
        // A node that is not identified yet, or is the same server as another entry, must not
        // vote: nothing is sent, so nothing needs cleaning up there.
        if let Err(e) = self.state.counts() {
            return Acquired::plain(Vote::Failed(e));
        }
        // Neither scripts nor a native compare-and-delete: a key set here could never be
        // released nor extended, so nothing is set.
        if let Some(message) = self.state.caps.no_lock() {
            return Acquired::plain(Vote::Failed(NodeError {
                node: self.name.clone(),
                kind: NodeErrorKind::Permission,
                message,
            }));
        }
        if let Some(line) = self.gated(&held.line) {
            let _running = self.inflight(&held.value);
            let here = self.acquire_gated(&held, line, ttl_ms, timeout);
            let answer = match &self.backend {
                Backend::Server(_) => here.await,
                Backend::Cluster(_) => {
                    Box::pin(crate::nodes::cluster::creating(&held.value, here)).await
                }
            };
            match &answer.vote {
                // This user may not run scripts here: no line on this node; the plain SET.
                Vote::Failed(e) if scripts_denied(e) => {
                    tracing::warn!(node = %self.name, cause = %e.message, "fredlock: this node refuses scripts, so it keeps no wait line (waiters poll); grant +@scripting to the user");
                    self.no_line
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                _ => return answer,
            }
        }
        if let (Some(batch), [_], true) = (
            &self.batch,
            held.keys.as_slice(),
            held.fence_keys.is_empty(),
        ) {
            let reply = batch.acquire(&held, ttl_ms, timeout).await;
            return Acquired::plain(reply::set_nx(&self.name, reply));
        }
        let _running = self.inflight(&held.value);
        match &self.backend {
            Backend::Server(_) => self.acquire_here(&held, ttl_ms, timeout).await,
            Backend::Cluster(_) => {
                let here = self.acquire_here(&held, ttl_ms, timeout);
                Box::pin(crate::nodes::cluster::creating(&held.value, here)).await
            }
        }
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

    /// On a cluster node, marks a command that may create `token`'s keys as running until the
    /// guard drops (releases wait for it).
    fn inflight(&self, token: &str) -> Option<crate::nodes::cluster::Inflight<'_>> {
        match &self.backend {
            Backend::Cluster(shards) => Some(shards.begin(token)),
            Backend::Server(_) => None,
        }
    }

    /// Key positions grouped by hash slot, when this is a cluster node and the keys span
    /// slots (one script per slot); `None` when one script takes every key.
    fn slot_groups(&self, keys: &[String]) -> Option<Vec<Vec<usize>>> {
        if !self.is_cluster() || keys.len() < 2 {
            return None;
        }
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = crate::base::slots::slot(key);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        (groups.len() > 1).then(|| groups.into_iter().map(|(_, m)| m).collect())
    }

    fn unexpected(&self, what: &str) -> NodeError {
        NodeError {
            node: self.name.clone(),
            kind: NodeErrorKind::UnexpectedReply,
            message: format!("a slot's reply lacked its {what}"),
        }
    }

    async fn acquire_plain(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Vote {
        // One key on a cluster node (a single server's goes through `batch`).
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

    /// Raises each fencing counter to at least its token (a max-register). Granted when done.
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
        match self.slot_groups(&fence.0) {
            None => raise((0..fence.0.len()).collect()).await,
            Some(groups) => all(futures::future::join_all(groups.into_iter().map(raise)).await),
        }
    }

    /// Takes the first free slot of a semaphore, in the order given.
    pub(crate) async fn take_slot(
        self: Arc<Self>,
        req: Arc<SlotRequest>,
        timeout: Duration,
    ) -> Slot {
        if let Err(e) = self.state.counts() {
            return Slot::Failed(e);
        }
        let _running = self.inflight(&req.value);
        match &self.backend {
            Backend::Server(_) => self.take_slot_here(&req, timeout).await,
            Backend::Cluster(_) => {
                let here = self.take_slot_here(&req, timeout);
                Box::pin(crate::nodes::cluster::creating(&req.value, here)).await
            }
        }
    }

    async fn take_slot_here(&self, req: &SlotRequest, timeout: Duration) -> Slot {
        let scripts = crate::base::scripts::Scripts::get();
        let keys: Vec<&str> = std::iter::once(&req.meta_key)
            .chain(&req.slot_keys)
            .chain(&req.fence_keys)
            .map(String::as_str)
            .collect();
        let fenced = if req.fence_keys.is_empty() { "0" } else { "1" };
        let mut argv = vec![
            Value::from(req.value.as_str()),
            Value::Integer(req.ttl_ms as i64),
            Value::Integer(req.slot_keys.len() as i64),
            Value::from(fenced),
        ];
        let mut keys = keys;
        let script = match self.gated(&req.line) {
            Some(line) => {
                keys.push(&line.key);
                argv.extend(line_argv(line));
                &scripts.sem_gate
            }
            None => &scripts.sem_acquire,
        };
        let reply = self.script_on(script, &keys, &argv, timeout).await;
        reply::slot(&self.name, reply, req.slot_keys.len())
    }

    /// A script of a primitive above (a read-write lock's) over `keys`, which share one hash
    /// slot, with `argv`. `creating`: the value the script may store, for an acquire (on a
    /// cluster node a release of that value then waits for it, as for a lock's acquire).
    pub(crate) async fn eval_script(
        self: Arc<Self>,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Arc<Vec<Value>>,
        creating: Option<Arc<str>>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.state.counts()?;
        let _running = creating.as_deref().and_then(|v| self.inflight(v));
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let here = self.script_on(script, &refs, &argv, timeout);
        match (&self.backend, creating) {
            (Backend::Cluster(_), Some(value)) => {
                Box::pin(crate::nodes::cluster::creating(&value, here)).await
            }
            _ => here.await,
        }
    }

    /// Reads several keys atomically: per key `Some((value, pttl_ms))`, or `None` when absent.
    pub(crate) async fn view(
        self: Arc<Self>,
        keys: Arc<Vec<String>>,
        timeout: Duration,
    ) -> Result<Vec<Option<(String, i64)>>, NodeError> {
        if let Err(e) = self.state.counts() {
            if e.kind == NodeErrorKind::Duplicate {
                return Err(e);
            }
        }
        let (this, keys) = (&*self, &*keys);
        let view = |idx: Vec<usize>| async move {
            let scripts = crate::base::scripts::Scripts::get();
            let refs: Vec<&str> = idx.iter().map(|&i| keys[i].as_str()).collect();
            let reply = this
                .script_on(&scripts.view_many, &refs, &[], timeout)
                .await;
            reply::views(&this.name, reply, idx.len()).map(|v| (idx, v))
        };
        let Some(groups) = self.slot_groups(keys) else {
            return view((0..keys.len()).collect()).await.map(|(_, v)| v);
        };
        let mut out = vec![None; keys.len()];
        for part in futures::future::join_all(groups.into_iter().map(view)).await {
            let (idx, views) = part?;
            for (i, v) in idx.into_iter().zip(views) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// Resets the TTL of every key if all still hold our token; never re-creates a key.
    pub(crate) async fn extend(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        if let Some(vote) = self.extend_native(&held, ttl_ms, timeout).await {
            return vote;
        }
        let scripts = crate::base::scripts::Scripts::get();
        self.ttl_script(&scripts.extend, held, ttl_ms, timeout)
            .await
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
        let reply =
            crate::nodes::native::extend(client, &self.state, key, &held.value, ttl_ms, timeout)
                .await?;
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

    /// Extends many locks at once: per lock, what [`extend`](Self::extend) does for one (reset
    /// every key's TTL if all still hold its token, never re-create a key), with one script call
    /// per TTL among the locks (usually one) on a single server, and one per TTL and hash slot
    /// on a cluster node (a cluster script stays in one slot; a lock whose keys span slots is
    /// granted only if every slot granted). Returns one vote per lock, in batch order; a call
    /// that failed (a timeout, a reset connection) fails every lock it carried, and one lock's
    /// bad key (WRONGTYPE) fails that lock alone.
    ///
    /// Cancellation: as [`extend`](Self::extend): a call already handed to fred still runs, and
    /// only ever extends keys that still hold their lock's token.
    pub(crate) async fn extend_many(
        self: Arc<Self>,
        batch: Arc<Vec<Extension>>,
        timeout: Duration,
    ) -> Vec<Vote> {
        if let Err(e) = self.state.counts() {
            return vec![Vote::Failed(e); batch.len()];
        }
        if let Some(votes) = self.extend_many_native(&batch, timeout).await {
            return votes;
        }
        // One script per TTL (and, on a cluster, per hash slot); a lock's keys may span slots.
        let mut groups: Vec<(u64, Vec<Part>)> = Vec::new();
        let mut index: std::collections::HashMap<(u64, u16), usize> = Default::default();
        let mut add = |ttl_ms: u64, slot: u16, part: Part| {
            let g = *index.entry((ttl_ms, slot)).or_insert_with(|| {
                groups.push((ttl_ms, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(part);
        };
        for (j, x) in batch.iter().enumerate() {
            let slot_of = |i: usize| match self.is_cluster() {
                true => x
                    .held
                    .keys
                    .get(i)
                    .map_or(0, |k| crate::base::slots::slot(k)),
                false => 0,
            };
            match self.slot_groups(&x.held.keys) {
                None => add(x.ttl_ms, slot_of(0), (j, None)),
                Some(slot_groups) => {
                    for g in slot_groups {
                        let slot = g.first().map_or(0, |&i| slot_of(i));
                        add(x.ttl_ms, slot, (j, Some(g)));
                    }
                }
            }
        }
        let this = &*self;
        let batch = &*batch;
        let answers = futures::future::join_all(
            groups
                .iter()
                .map(|(ttl_ms, parts)| this.extend_parts(batch, *ttl_ms, parts, timeout)),
        )
        .await;
        let mut per_lock: Vec<Vec<Vote>> = vec![Vec::new(); batch.len()];
        for ((_, parts), votes) in groups.iter().zip(answers) {
            for ((j, _), vote) in parts.iter().zip(votes) {
                per_lock[*j].push(vote);
            }
        }
        per_lock
            .into_iter()
            .map(|votes| match votes.is_empty() {
                // Never: every lock has a key. But no answer is never a grant.
                true => Vote::Failed(self.unexpected("answer")),
                false => all(votes),
            })
            .collect()
    }

    /// On a single server with `SET ... IFEQ` and only one-key locks in `batch`: one command
    /// per lock (see `native`); `None` where the batched script does it.
    async fn extend_many_native(
        &self,
        batch: &[Extension],
        timeout: Duration,
    ) -> Option<Vec<Vote>> {
        let Backend::Server(client) = &self.backend else {
            return None;
        };
        let items = batch
            .iter()
            .map(|x| (x.held.keys.as_slice(), x.held.value.as_str(), x.ttl_ms));
        let replies =
            crate::nodes::native::extend_many(client, &self.state, items, timeout).await?;
        Some(
            replies
                .into_iter()
                .map(|r| reply::set_nx(&self.name, r))
                .collect(),
        )
    }

    /// One batched extend script over `parts` of `batch`, all with `ttl_ms`: one vote per part.
    async fn extend_parts(
        &self,
        batch: &[Extension],
        ttl_ms: u64,
        parts: &[Part],
        timeout: Duration,
    ) -> Vec<Vote> {
        let scripts = crate::base::scripts::Scripts::get();
        let count = |(j, idx): &Part| idx.as_ref().map_or(batch[*j].held.keys.len(), Vec::len);
        let key_count: usize = parts.iter().map(count).sum();
        let reply = self
            .eval_with(&scripts.extend_many, timeout, |first| {
                let mut args = Vec::with_capacity(3 + 2 * key_count);
                args.push(Value::from(first));
                args.push(Value::Integer(key_count as i64));
                for (j, idx) in parts {
                    let keys = &batch[*j].held.keys;
                    match idx {
                        None => args.extend(keys.iter().map(|k| Value::from(k.as_str()))),
                        Some(idx) => {
                            args.extend(idx.iter().map(|&i| Value::from(keys[i].as_str())))
                        }
                    }
                }
                args.push(Value::Integer(ttl_ms as i64));
                for part in parts {
                    let token = batch[part.0].held.value.as_str();
                    args.extend((0..count(part)).map(|_| Value::from(token)));
                }
                args
            })
            .await;
        reply::extended_many(&self.name, reply, parts.len())
    }

    /// Deletes the keys that still hold our token. Granted when every key was ours.
    ///
    /// On a single server, dropping this future once polled still releases (the command is in
    /// fred's queue, behind this node's earlier commands); callers rely on that. On a cluster
    /// node a release may need several steps (waiting for the token's acquire, redirects), so it
    /// runs in a task of its own that a dropped future does not stop.
    pub(crate) async fn release(self: Arc<Self>, held: Arc<Held>, timeout: Duration) -> Vote {
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
        // Sent even to a duplicate (it only deletes our own token), but a duplicate's answer
        // is never counted.
        let counts = self.state.counts();
        let gated = self.gated(&held.line);
        let vote = match (gated, self.slot_groups(&held.keys)) {
            (Some(line), _) => {
                let reply = self.gate_release(held, line, timeout).await;
                let (vote, woken) = reply::gate_released(&self.name, reply, held.keys.len());
                if let Some(member) = woken {
                    line.local.woke(&member);
                    if let Some(key) = held.keys.first() {
                        line.local.mark_hot(key);
                    }
                }
                vote
            }
            (None, None) => {
                let reply = match (&self.batch, held.keys.len()) {
                    (Some(batch), 1) => batch.release(held, timeout).await,
                    _ => self.release_script(held, timeout).await,
                };
                reply::released(&self.name, reply, held.keys.len())
            }
            (None, Some(groups)) => {
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
        if let Err(e) = counts.as_ref() {
            if e.kind == NodeErrorKind::Duplicate {
                return Vote::Failed(e.clone());
            }
        }
        vote
    }

    /// `line` when this node is its gate (and may keep lines).
    fn gated<'a>(&self, line: &'a Option<LineRef>) -> Option<&'a LineRef> {
        line.as_ref()
            .filter(|l| l.gate == self.state.index)
            .filter(|_| !self.no_line.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// One key through its gate's wait line (`scripts::GATE_ACQUIRE`).
    async fn acquire_gated(
        &self,
        held: &Held,
        line: &LineRef,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Acquired {
        let scripts = crate::base::scripts::Scripts::get();
        let Some(key) = held.keys.first() else {
            return Acquired::plain(Vote::Failed(self.unexpected("key")));
        };
        let mut keys = vec![key.as_str(), line.key.as_str()];
        if let Some(fence) = held.fence_keys.first() {
            keys.push(fence);
        }
        let member = line.member.as_deref().unwrap_or("");
        let rank = if line.local.polls() { "rank" } else { "" };
        let argv = [
            Value::from(held.value.as_str()),
            Value::Integer(ttl_ms as i64),
            Value::from(member),
            Value::Integer(crate::base::line::LEASE.as_millis() as i64),
            Value::from(rank),
        ];
        let reply = self
            .script_on(&scripts.gate_acquire, &keys, &argv, timeout)
            .await;
        reply::gate_acquired(&self.name, reply, !held.fence_keys.is_empty())
    }

    /// The release on a gate (`scripts::GATE_RELEASE`): wakes the line's head after a holder's
    /// release, puts a waiter back at the front after its failed attempt.
    async fn gate_release(
        &self,
        held: &Held,
        line: &LineRef,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        let wake = line.wake.load(std::sync::atomic::Ordering::Acquire);
        let mode = match (&line.member, wake) {
            (_, true) => "w",
            // Back at the front only while the waiter still waits (not a late retry after it
            // left the line).
            (Some(member), false) if line.local.waits(member) => member,
            (_, false) => "q",
        };
        let mut args = Vec::with_capacity(held.keys.len() + 8);
        args.push(Value::from(scripts.gate_release.body));
        args.push(Value::Integer(held.keys.len() as i64 + 1));
        args.extend(held.keys.iter().map(|k| Value::from(k.as_str())));
        args.push(Value::from(line.key.as_str()));
        args.push(Value::from(held.value.as_str()));
        args.push(Value::from(mode));
        args.push(Value::Integer(crate::base::line::LEASE.as_millis() as i64));
        args.push(Value::from(line.local.prefix()));
        args.push(Value::from(format!("{:08x}", rand::random::<u32>())));
        if let Some(e) = crate::nodes::native::scripts_refused(&self.state) {
            return Err(e);
        }
        match &self.backend {
            Backend::Server(_) => {
                let reply = self.call("EVAL", 2, args, timeout).await;
                crate::nodes::native::scripted(&self.state, reply)
            }
            Backend::Cluster(shards) => {
                let Some(first) = held.keys.first() else {
                    return Ok(Value::Array(vec![Value::Integer(0), Value::from("")]));
                };
                Box::pin(shards.call("EVAL", first, args, timeout, Some(&held.value))).await
            }
        }
    }

    /// Leaves `line` (a waiter that gave up), or with no member pokes it (a broken lock): the
    /// next head is woken when a key is free. Returns the member woken.
    pub(crate) async fn leave_line(
        self: Arc<Self>,
        keys: Arc<Vec<String>>,
        line: Arc<(String, String, String)>,
        timeout: Duration,
    ) -> Result<Option<String>, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        let (line_key, member, prefix) = &*line;
        let all: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(line_key.as_str()))
            .collect();
        let argv = [Value::from(member.as_str()), Value::from(prefix.as_str())];
        match self
            .script_on(&scripts.line_leave, &all, &argv, timeout)
            .await?
        {
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) => Ok(Some(s.to_string())),
            Value::Bytes(b) if b.is_empty() => Ok(None),
            Value::Bytes(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            _ => Err(self.unexpected("woken member")),
        }
    }

    /// Any script over `keys` (of one hash slot) and `argv`; a node that may not vote (not
    /// identified yet, a duplicate) answers its error without anything being sent.
    pub(crate) async fn run_script(
        self: Arc<Self>,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Arc<Vec<Value>>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.state.counts()?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.script_on(script, &refs, &argv, timeout).await
    }

    /// Who holds `key` here: `Some((value, pttl_ms))`, or `None` when the key does not exist.
    pub(crate) async fn inspect(
        self: Arc<Self>,
        key: String,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        // Where scripts are denied but plain locks work: GET and PTTL (see `native`).
        if let (Backend::Server(client), true) = (&self.backend, self.state.caps.lua_free_only()) {
            if let Err(e) = self.state.counts() {
                if e.kind == NodeErrorKind::Duplicate {
                    return Err(e);
                }
            }
            let reply = crate::nodes::native::inspect(client, &self.state, &key, timeout).await;
            return reply::holder(&self.name, reply);
        }
        // INSPECT takes no ARGV, but `script` always appends the value; Redis ignores it.
        let scripts = crate::base::scripts::Scripts::get();
        self.holder_script(&scripts.inspect, key, None, timeout)
            .await
    }

    /// Deletes `key` here whoever holds it, and says what it held: `Some((value, pttl_ms))`, or
    /// `None` when there was no key. (The caller pokes the key's wait line, see `leave_line`.)
    pub(crate) async fn force_delete(
        self: Arc<Self>,
        key: String,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        self.holder_script(&scripts.force_break, key, None, timeout)
            .await
    }

    /// A script on one key that answers with its holder (INSPECT, FORCE_BREAK). A duplicate
    /// entry answers its duplicate error (an operator must see it); other nodes not identified
    /// yet are still asked.
    async fn holder_script(
        &self,
        script: &Script,
        key: String,
        extra: Option<u64>,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        if let Err(e) = self.state.counts() {
            if e.kind == NodeErrorKind::Duplicate {
                return Err(e);
            }
        }
        let held = Held {
            keys: vec![key],
            value: String::new(),
            custom: false,
            resources: Vec::new(),
            fence_keys: Vec::new(),
            line: None,
        };
        let reply = self.script(script, &held, extra, timeout).await;
        reply::holder(&self.name, reply)
    }

    fn error(&self, e: fred::error::Error) -> NodeError {
        self.state.error(&e)
    }
}

/// `(name, addr)`: `host:port/db` and `host:port` for a centralized config, a descriptive form
/// otherwise. Never credentials.
fn describe(config: &Config) -> (String, String) {
    let db = config.database.unwrap_or(0);
    let hosts = |hosts: &[fred::prelude::Server]| {
        let mut v: Vec<String> = hosts
            .iter()
            .map(|s| format!("{}:{}", canonical_host(&s.host), s.port))
            .collect();
        v.sort();
        v.join(",")
    };
    match &config.server {
        ServerConfig::Centralized { server } => {
            let addr = format!("{}:{}", canonical_host(&server.host), server.port);
            (format!("{addr}/{db}"), addr)
        }
        ServerConfig::Clustered { hosts: h, .. } => {
            let addr = format!("cluster({})", hosts(h));
            (addr.clone(), addr)
        }
        ServerConfig::Sentinel {
            hosts: h,
            service_name,
            ..
        } => {
            let addr = format!("sentinel({service_name}@{})", hosts(h));
            (format!("{addr}/{db}"), addr)
        }
        #[allow(unreachable_patterns)]
        _ => ("unknown".to_string(), "unknown".to_string()),
    }
}

/// Loopback spelled three ways is one server: duplicate detection must see that.
fn canonical_host(host: &str) -> &str {
    match host {
        "localhost" | "127.0.0.1" | "::1" | "[::1]" => "127.0.0.1",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_are_one_server() {
        let servers = Arc::new(Servers::default());
        let a = Node::from_url(0, "redis://localhost:7001", servers.clone()).unwrap();
        let b = Node::from_url(1, "redis://127.0.0.1:7001/0", servers.clone()).unwrap();
        assert_eq!(a.name, b.name);
        // A database index never makes a node independent.
        let c = Node::from_url(2, "redis://127.0.0.1:7001/1", servers).unwrap();
        assert_ne!(a.name, c.name);
        assert_eq!(a.addr, c.addr);
    }

    #[test]
    fn names_and_errors_hide_credentials() {
        let servers = Arc::new(Servers::default());
        let a = Node::from_url(0, "redis://user:hunter2@127.0.0.1:7001", servers.clone()).unwrap();
        assert!(!a.name.contains("hunter2"));
        assert!(!format!("{a:?}").contains("hunter2"));
        let err =
            Node::from_url(0, "redis://user:hunter2@127.0.0.1:notaport", servers).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
#[cfg(test)]
mod future_size {
    use super::*;

    /// Every round moves one future per node into a box, so their size is paid per command:
    /// fred's command futures (~5 KB) must stay boxed, on every path (a cluster node's redirect
    /// loop once made every node future 6.6 KB, single-server nodes included).
    #[test]
    fn node_futures_stay_small() {
        let servers = Arc::new(Servers::default());
        let node = Arc::new(Node::from_url(0, "redis://127.0.0.1:1", servers).expect("node"));
        let held = Arc::new(Held {
            keys: vec!["a".into()],
            value: "t".into(),
            custom: false,
            resources: Vec::new(),
            fence_keys: Vec::new(),
            line: None,
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
