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
//! Without Lua: every script call on a node whose user may not run scripts fails at once, unsent,
//! with [`NodeErrorKind::Permission`] and the fix (the plain and native paths that avoid scripts
//! are chosen by the commands, see `node_lock` and `node_ops`).
//!
//! The commands themselves are in the files beside this one, each an `impl Node` of its own: a
//! lock's (`node_lock`), a wait line's gate (`node_gate`), a batch of extensions
//! (`node_extend_many`), the primitives' (`node_primitives`) and an operator's (`node_ops`).
//!
//! Owns: the fred client of one node, its life (connect, close), its per-command options, how a
//! command or script is sent (EVALSHA, EVAL, their arguments), and a cluster node's keys grouped
//! by hash slot.
//! Must not: choose a command's path or arguments (the `node_*` files), decode a reply by hand
//! (reply), count votes across nodes (quorum) or decide anything about a lock (redlock).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{ClientLike, Config, ServerConfig, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::base::error::{InvalidInput, NodeError, NodeErrorKind, Vote};
use crate::base::scripts::Script;
pub(crate) use crate::nodes::batch::{GateAnswer, Held, LineRef, Place};
use crate::nodes::batcher::Batch;
use crate::nodes::cluster::Shards;
use crate::nodes::connection::{self, options, Servers, State};

pub(crate) use crate::base::reply::{Acquired, Queue, Slot};
pub use fred::clients::Client;

/// How a node reaches its data.
#[derive(Clone)]
pub(super) enum Backend {
    /// One server (or a sentinel group) behind one fred client.
    Server(Client),
    /// A Redis Cluster: fredlock routes by slot itself (see `cluster`).
    Cluster(Arc<Shards>),
}

/// One configured Redis node.
pub(crate) struct Node {
    pub(super) backend: Backend,
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
    pub(super) batch: Option<Batch>,
    /// This node refused a line script (the user may not run scripts): it keeps no lines.
    pub(super) no_line: std::sync::atomic::AtomicBool,
    /// This node refused a woken head's turn without a script (no `+zpopmin`): the line's
    /// script takes turns here (see `node_gate`).
    pub(super) no_plain_turn: std::sync::atomic::AtomicBool,
    /// A Sentinel-managed node's stall bound (see `connection::spawn`).
    stall: Option<Duration>,
    /// Replicas that must acknowledge each vote of an acquire or extension (see `confirm`).
    pub(crate) confirm: Option<crate::nodes::confirm::Confirm>,
    /// The task that sends this node's `WAIT`s, from its first confirmation on.
    pub(super) waits: std::sync::OnceLock<crate::nodes::confirm::Waits>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.state.close();
        if let Some(batch) = &self.batch {
            batch.close();
        }
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
    pub(super) fn subset(&self, idx: &[usize]) -> Held {
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
            repairs: Default::default(),
            wire: Default::default(),
            announce: self.announce.clone(),
            batched: Default::default(),
        }
    }
}

/// One node's vote from its slots' votes: failed if any failed, refused if any refused.
pub(super) fn all(votes: Vec<Vote>) -> Vote {
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

impl Node {
    /// Builds a client for `url` with fredlock's settings; connecting happens later.
    pub(crate) fn from_url(
        index: usize,
        url: &str,
        servers: Arc<Servers>,
        node_timeout: Option<Duration>,
    ) -> Result<Node, InvalidInput> {
        crate::base::endpoint::check(index, url)?;
        let invalid = |e: fred::error::Error| InvalidInput::InvalidUrl {
            index,
            url: crate::base::endpoint::redact(url),
            // fred's URL messages name the part that is wrong, never the URL itself.
            reason: e.details().to_string(),
        };
        let config = Config::from_url(&crate::base::endpoint::normalized(url)).map_err(invalid)?;
        let client = connection::client(config).map_err(invalid)?;
        let mut node = Node::from_client(index, client, servers, node_timeout);
        node.owned = true;
        Ok(node)
    }

    /// Wraps a caller's client. It must have a reconnect policy (checked by the builder). A
    /// cluster client only lends its configuration: fredlock opens its own shard clients.
    /// `node_timeout` (the builder's) bounds the stall watch of a Sentinel-managed node.
    pub(crate) fn from_client(
        index: usize,
        client: Client,
        servers: Arc<Servers>,
        node_timeout: Option<Duration>,
    ) -> Node {
        let config = client.client_config();
        // A group's connection that stops answering is given up (and the sentinels asked
        // again), so that the node follows a failover away from a frozen primary.
        let stall = matches!(config.server, ServerConfig::Sentinel { .. })
            .then(|| connection::stall_bound(node_timeout));
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
            no_plain_turn: Default::default(),
            stall,
            confirm: None,
            waits: Default::default(),
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
            Backend::Server(client) => {
                connection::spawn(client.clone(), self.state.clone(), self.stall)
            }
            Backend::Cluster(shards) => shards.spawn(),
        }
    }

    /// Stops the connect loop and, for clients fredlock created, sends QUIT behind whatever is
    /// queued (so queued releases are answered first): once the work callers left running has
    /// ended (see `busy`; at most `CLOSE_WAIT`) and what waits in the batcher's queue was handed
    /// to fred, then behind it in fred's order.
    pub(crate) async fn close(&self) {
        // First what callers left running (a late NOSCRIPT's EVAL joins the batcher's queue).
        if !self.state.busy.idle(crate::nodes::busy::CLOSE_WAIT).await {
            tracing::warn!(node = %self.name, "fredlock: closing with commands still unanswered after {:?}", crate::nodes::busy::CLOSE_WAIT);
        }
        if let Some(batch) = &self.batch {
            batch.drained().await;
        }
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

    /// One command with fredlock's options: fred's own timeout, one attempt, fail fast while the
    /// connection is down.
    pub(super) async fn call(
        &self,
        cmd: &'static str,
        key_offset: usize,
        args: Vec<Value>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let route = (&self.backend, self.batch.as_ref());
        send(route, &self.state, cmd, key_offset, args, timeout).await
    }

    /// `work` on `keys` in this node's command order: on a single server, after everything this
    /// process handed to the node before for those keys (the batcher's queue included: see
    /// `Batch::ordered`); on a cluster node, at once (its shards keep their own order). `failed` makes a `T` of an
    /// error when `work` could not be sent.
    pub(super) async fn in_order<T: Send + 'static>(
        &self,
        keys: Vec<String>,
        timeout: Duration,
        work: impl FnOnce(Duration) -> crate::nodes::batch::Boxed<T> + Send + 'static,
        failed: impl FnOnce(NodeError) -> T,
    ) -> T {
        match &self.batch {
            Some(batch) => batch.ordered(keys, timeout, work, failed).await,
            None => work(timeout).await,
        }
    }

    /// EVALSHA, and on NOSCRIPT an immediate EVAL on the same connection. `always_eval`
    /// scripts are never resent: whole until the server is known to have them, then by hash
    /// (see `never_resent`). `args(first)` builds the arguments after the script or its hash.
    ///
    /// The one rule for late answers lives here: a script, once handed to fred, runs its whole
    /// protocol whether or not its caller still waits (see `batch::Finish`): a round that
    /// decided without this node, or a caller that gave up, never leaves a `NOSCRIPT` unanswered
    /// (a shortening, a fencing counter's raise or an extension silently not done there). This
    /// is safe because every script sent by hash only changes keys that already hold our
    /// value, or raises a max-register: landing late, after later commands of ours, it acts on
    /// nothing that is not ours. Scripts that may CREATE a key (the acquires, the batch, the
    /// release) are `always_eval` and sent once: never resent behind a clean-up.
    pub(super) async fn eval_with(
        &self,
        script: &Script,
        timeout: Duration,
        args: impl Fn(&str) -> Vec<Value>,
    ) -> Result<Value, NodeError> {
        if let Some(e) = crate::nodes::native::scripts_refused(&self.state) {
            return Err(e);
        }
        if script.always_eval {
            return self.never_resent(script, timeout, args).await;
        }
        let route = (self.backend.clone(), self.batch.clone(), self.state.clone());
        let (sha, body) = (args(&script.sha), script.body);
        let name = self.name.clone();
        let work = async move {
            let (backend, batch, state) = route;
            let route = (&backend, batch.as_ref());
            let mut eval = sha.clone();
            let reply = match send(route, &state, "EVALSHA", 2, sha, timeout).await {
                Err(e) if e.kind == NodeErrorKind::Server && e.message.contains("NOSCRIPT") => {
                    tracing::debug!(node = %name, "NOSCRIPT: resending the script with EVAL");
                    eval[0] = Value::from(body);
                    send(route, &state, "EVAL", 2, eval, timeout).await
                }
                other => other,
            };
            crate::nodes::native::scripted(&state, reply)
        };
        crate::nodes::batch::Finish::new(&self.state, work).await
    }

    /// An `always_eval` script: whole, until a single server is known to have it; then by
    /// hash, and a `NOSCRIPT` answer (the script did not run) is this node's refusal of this
    /// one call, never resent (a resend could land after what the caller sent next).
    async fn never_resent(
        &self,
        script: &Script,
        timeout: Duration,
        args: impl Fn(&str) -> Vec<Value>,
    ) -> Result<Value, NodeError> {
        let caps = &self.state.caps;
        let slot = script
            .slot
            .filter(|_| matches!(self.backend, Backend::Server(_)));
        if let Some(slot) = slot.filter(|&s| caps.knows(s)) {
            let reply = self.call("EVALSHA", 2, args(&script.sha), timeout).await;
            if let Err(e) = &reply {
                if e.kind == NodeErrorKind::Server && e.message.contains("NOSCRIPT") {
                    caps.set_known(slot, false);
                }
            }
            return crate::nodes::native::scripted(&self.state, reply);
        }
        // A round that decided without this node drops the call: the body was most likely
        // sent, so it counts as known then too (if not, one NOSCRIPT later sends it again).
        let mut known = slot.map(|slot| KnownOnDrop { caps, slot });
        let reply = self.call("EVAL", 2, args(script.body), timeout).await;
        if let Some(k) = known.take() {
            std::mem::forget(k);
            if let (Some(slot), true) = (slot, reply.is_ok()) {
                caps.set_known(slot, true);
            }
        }
        crate::nodes::native::scripted(&self.state, reply)
    }

    /// A script over `held`'s keys with ARGV = token (and `extra`).
    pub(super) async fn script(
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
    pub(super) async fn script_on(
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

    /// On a cluster node, marks a command that may create `token`'s keys as running until the
    /// guard drops (releases wait for it).
    pub(super) fn inflight(&self, token: &str) -> Option<crate::nodes::cluster::Inflight<'_>> {
        match &self.backend {
            Backend::Cluster(shards) => Some(shards.begin(token)),
            Backend::Server(_) => None,
        }
    }

    /// Key positions grouped by hash slot, when this is a cluster node and the keys span
    /// slots (one script per slot); `None` when one script takes every key.
    pub(super) fn slot_groups(&self, keys: &[String]) -> Option<Vec<Vec<usize>>> {
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

    pub(super) fn unexpected(&self, what: &str) -> NodeError {
        NodeError {
            node: self.name.clone(),
            kind: NodeErrorKind::UnexpectedReply,
            message: format!("a slot's reply lacked its {what}"),
        }
    }
}

/// Marks an `always_eval` script as in the server's cache when its EVAL's caller stops waiting
/// (see `Node::never_resent`).
struct KnownOnDrop<'a> {
    caps: &'a crate::nodes::caps::Caps,
    slot: u8,
}

impl Drop for KnownOnDrop<'_> {
    fn drop(&mut self) {
        self.caps.set_known(self.slot, true);
    }
}

/// One command to `backend` with fredlock's options, in the node's order (`batch`, see
/// `Node::in_order`).
async fn send(
    (backend, batch): (&Backend, Option<&Batch>),
    state: &Arc<State>,
    cmd: &'static str,
    key_offset: usize,
    args: Vec<Value>,
    timeout: Duration,
) -> Result<Value, NodeError> {
    let client = match backend {
        Backend::Server(client) => client,
        Backend::Cluster(shards) => {
            let Some(key) = args.get(key_offset).and_then(Value::as_str) else {
                return Err(NodeError {
                    node: state.name.clone(),
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
    let keys = match batch {
        Some(_) => keys_of(cmd, key_offset, &args),
        None => Vec::new(),
    };
    let (client, state) = (client.clone(), state.clone());
    let work = move |timeout| -> crate::nodes::batch::Boxed {
        let command = CustomCommand::new_static(cmd, ClusterHash::Offset(key_offset), false);
        // Boxed: fred's command futures are ~5 KB and would otherwise be copied into every
        // per-node future of every round (measured: the largest user-space cost per cycle).
        Box::pin(async move {
            let with = client.with_options(&options(timeout));
            let call = with.custom::<Value, Value>(command, args);
            call.await.map_err(|e| state.error(&e))
        })
    };
    match batch {
        Some(batch) => batch.ordered(keys, timeout, work, Err).await,
        None => work(timeout).await,
    }
}

/// The keys a command sent by [`send`] touches: a script's (after its key count), or the one at
/// `key_offset`.
fn keys_of(cmd: &str, key_offset: usize, args: &[Value]) -> Vec<String> {
    let key = |v: &Value| v.as_string();
    match (cmd, args.get(1).and_then(Value::as_i64)) {
        ("EVAL" | "EVALSHA", Some(n)) => {
            let n = usize::try_from(n).unwrap_or(0);
            args.iter().skip(2).take(n).filter_map(key).collect()
        }
        _ => args.get(key_offset).and_then(key).into_iter().collect(),
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
        #[cfg(feature = "unix-sockets")]
        ServerConfig::Unix { path } => {
            let addr = format!("unix:{}", path.display());
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
        let a = Node::from_url(0, "redis://localhost:7001", servers.clone(), None).unwrap();
        let b = Node::from_url(1, "redis://127.0.0.1:7001/0", servers.clone(), None).unwrap();
        assert_eq!(a.name, b.name);
        // A database index never makes a node independent.
        let c = Node::from_url(2, "redis://127.0.0.1:7001/1", servers, None).unwrap();
        assert_ne!(a.name, c.name);
        assert_eq!(a.addr, c.addr);
    }

    #[test]
    fn names_and_errors_hide_credentials() {
        let servers = Arc::new(Servers::default());
        let a = Node::from_url(
            0,
            "redis://user:hunter2@127.0.0.1:7001",
            servers.clone(),
            None,
        )
        .unwrap();
        assert!(!a.name.contains("hunter2"));
        assert!(!format!("{a:?}").contains("hunter2"));
        let err = Node::from_url(0, "redis://user:hunter2@127.0.0.1:notaport", servers, None)
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
