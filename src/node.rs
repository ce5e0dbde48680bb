//! One Redis node: one fred [`Client`], commands bounded by a per-node timeout that fred itself
//! enforces, and the decoding of every reply into a [`Vote`] or a typed [`NodeError`].
//!
//! This is the only file that knows how fred is configured and what Redis answers look like.
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
//! Owns: the fred client of one node, its per-command options, reply decoding into votes.
//! Must not: count votes across nodes (quorum) or decide anything about a lock (redlock).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{
    ClientLike, Config, Expiration, KeysInterface, Options, ReconnectPolicy, ServerConfig,
    SetOptions, Value,
};
use fred::types::{ClusterHash, CustomCommand};

use crate::connection::{self, Link, Servers, State};
use crate::error::{InvalidInput, NodeError, NodeErrorKind, Vote};
use crate::scripts::Script;

pub use fred::clients::Client;

/// One configured Redis node.
pub(crate) struct Node {
    client: Client,
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
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.state.close();
        if self.should_quit() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let client = self.client.clone();
                rt.spawn(async move {
                    let _ = client.quit().await;
                });
            }
        }
    }
}

/// Lock keys and the owner token, shared by every per-node command of one lock.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) keys: Vec<String>,
    pub(crate) token: String,
    /// The resource names (for error messages; never sent).
    pub(crate) resources: Vec<String>,
    /// With fencing: each key's counter key, in the same order; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
}

/// One node's answer to an acquire: its vote and, with fencing, each key's counter.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub(crate) vote: Vote,
    pub(crate) counters: Option<Vec<u64>>,
}

impl Acquired {
    fn plain(vote: Vote) -> Acquired {
        Acquired {
            vote,
            counters: None,
        }
    }
}

/// A semaphore slot request, the same for every node of one attempt.
#[derive(Debug)]
pub(crate) struct SlotRequest {
    pub(crate) meta_key: String,
    /// The slot keys in the order to try.
    pub(crate) slot_keys: Vec<String>,
    /// With fencing: their counters in the same order; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
    pub(crate) token: String,
    pub(crate) ttl_ms: u64,
}

/// One node's answer to a slot request.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// Set the slot at this position of the order; its counter (0 without fencing).
    Took { position: usize, counter: u64 },
    /// Every slot is taken.
    Full,
    /// The name is in use with this other number of permits.
    Mismatch(String),
    /// An error or timeout: outcome unknown.
    Failed(NodeError),
}

/// A counter as the scripts return it: a non-negative integer.
fn counter(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

impl Node {
    /// Builds a client for `url` with fredlock's settings; connecting happens later.
    pub(crate) fn from_url(
        index: usize,
        url: &str,
        servers: Arc<Servers>,
    ) -> Result<Node, InvalidInput> {
        crate::endpoint::check(index, url)?;
        let invalid = |e: fred::error::Error| InvalidInput::InvalidUrl {
            index,
            url: crate::endpoint::redact(url),
            // fred's URL messages name the part that is wrong, never the URL itself.
            reason: e.details().to_string(),
        };
        let mut config = Config::from_url(url.trim()).map_err(invalid)?;
        // The first attempt is made at once and its failure reported (fred's reconnect policy
        // would sleep before even the first attempt); fredlock's connect loop retries it.
        config.fail_fast = true;
        let client = fred::types::Builder::from_config(config)
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(2);
                c.internal_command_timeout = Duration::from_secs(2);
                c.max_command_attempts = 1;
                c.max_command_buffer_len = 100_000;
                c.tcp.nodelay = Some(true);
            })
            .with_performance_config(|p| {
                // A safety net only: every fredlock command carries its own timeout.
                p.default_command_timeout = Duration::from_secs(5);
            })
            .build()
            .map_err(invalid)?;
        let mut node = Node::from_client(index, client, servers);
        node.owned = true;
        Ok(node)
    }

    /// Wraps a caller's client. It must have a reconnect policy (checked by the builder).
    pub(crate) fn from_client(index: usize, client: Client, servers: Arc<Servers>) -> Node {
        let (name, addr) = describe(&client.client_config());
        Node {
            client,
            state: State::new(index, name.clone(), servers),
            name,
            addr,
            owned: false,
            quit: Default::default(),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
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
        connection::spawn(self.client.clone(), self.state.clone());
    }

    /// Stops the connect loop and, for clients fredlock created, sends QUIT behind whatever is
    /// queued (so queued releases are answered first).
    pub(crate) async fn close(&self) {
        self.state.close();
        if self.should_quit() {
            let _ = self.client.quit().await;
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
        let command = CustomCommand::new_static(cmd, ClusterHash::Offset(key_offset), false);
        // Boxed: fred's command futures are ~5 KB and would otherwise be copied into every
        // per-node future of every round (measured: the largest user-space cost per cycle).
        Box::pin(
            self.client
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
        if script.always_eval {
            return self.call("EVAL", 2, args(script.body), timeout).await;
        }
        match self.call("EVALSHA", 2, args(&script.sha), timeout).await {
            Err(e) if e.kind == NodeErrorKind::Server && e.message.contains("NOSCRIPT") => {
                tracing::debug!(node = %self.name, "NOSCRIPT: resending the script with EVAL");
                self.call("EVAL", 2, args(script.body), timeout).await
            }
            other => other,
        }
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
            args.push(Value::from(held.token.as_str()));
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
        if !held.fence_keys.is_empty() {
            return self.acquire_fenced(&held, ttl_ms, timeout).await;
        }
        Acquired::plain(self.acquire_plain(&held, ttl_ms, timeout).await)
    }

    async fn acquire_plain(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Vote {
        let reply = if let [key] = held.keys.as_slice() {
            // The typed SET (unlike EVAL and custom commands, which fred flushes one by one)
            // lets fred batch concurrent SETs into one socket write. `WithOptions` implements
            // the keys interface, so timeout, attempts and fail-fast are honoured here.
            let client = self.client.with_options(&options(timeout));
            let set = client.set::<Value, _, _>(
                key.as_str(),
                held.token.as_str(),
                Some(Expiration::PX(ttl_ms as i64)),
                Some(SetOptions::NX),
                false,
            );
            match Box::pin(set).await.map_err(|e| self.error(e)) {
                Ok(Value::String(s)) if s == "OK" => return Vote::Granted,
                Ok(Value::Null) => return Vote::Refused,
                other => other,
            }
        } else {
            let scripts = crate::scripts::Scripts::get();
            self.script(&scripts.acquire_many, held, Some(ttl_ms), timeout)
                .await
        };
        self.vote(reply)
    }

    async fn acquire_fenced(&self, held: &Held, ttl_ms: u64, timeout: Duration) -> Acquired {
        let scripts = crate::scripts::Scripts::get();
        let keys: Vec<&str> = held
            .keys
            .iter()
            .chain(&held.fence_keys)
            .map(String::as_str)
            .collect();
        let argv = [
            Value::from(held.token.as_str()),
            Value::Integer(ttl_ms as i64),
        ];
        let reply = self
            .script_on(&scripts.acquire_fenced, &keys, &argv, timeout)
            .await;
        match reply {
            Ok(Value::Array(parts)) => match parts.split_first() {
                Some((Value::Integer(1), counters)) if counters.len() == held.keys.len() => {
                    match counters.iter().map(counter).collect::<Option<Vec<u64>>>() {
                        Some(counters) => Acquired {
                            vote: Vote::Granted,
                            counters: Some(counters),
                        },
                        // Set, but a counter is garbage: not a grant (and released as unknown).
                        None => Acquired::plain(Vote::Failed(
                            self.unexpected("numeric fencing counters"),
                        )),
                    }
                }
                Some((Value::Integer(0), [])) => Acquired::plain(Vote::Refused),
                _ => Acquired::plain(Vote::Failed(self.unexpected("{1, counters...} or {0}"))),
            },
            Ok(_) => Acquired::plain(Vote::Failed(self.unexpected("an array"))),
            Err(e) => Acquired::plain(Vote::Failed(e)),
        }
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
        let scripts = crate::scripts::Scripts::get();
        let keys: Vec<&str> = fence.0.iter().map(String::as_str).collect();
        let argv: Vec<Value> = fence.1.iter().map(|t| Value::Integer(*t as i64)).collect();
        match self
            .script_on(&scripts.fence_raise, &keys, &argv, timeout)
            .await
        {
            Ok(Value::Integer(1)) => Vote::Granted,
            Ok(_) => Vote::Failed(self.unexpected("1")),
            Err(e) => Vote::Failed(e),
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
        let scripts = crate::scripts::Scripts::get();
        let keys: Vec<&str> = std::iter::once(&req.meta_key)
            .chain(&req.slot_keys)
            .chain(&req.fence_keys)
            .map(String::as_str)
            .collect();
        let fenced = if req.fence_keys.is_empty() { "0" } else { "1" };
        let argv = [
            Value::from(req.token.as_str()),
            Value::Integer(req.ttl_ms as i64),
            Value::Integer(req.slot_keys.len() as i64),
            Value::from(fenced),
        ];
        let reply = self
            .script_on(&scripts.sem_acquire, &keys, &argv, timeout)
            .await;
        match reply {
            Ok(Value::Array(parts)) => match parts.as_slice() {
                [Value::Integer(1), Value::Integer(pos), c] => {
                    match (usize::try_from(*pos).ok(), counter(c)) {
                        (Some(position), Some(counter)) if position < req.slot_keys.len() => {
                            Slot::Took { position, counter }
                        }
                        _ => Slot::Failed(self.unexpected("a slot position and a counter")),
                    }
                }
                [Value::Integer(0)] => Slot::Full,
                [Value::Integer(-1), permits] => {
                    Slot::Mismatch(permits.as_str().map(|p| p.into_owned()).unwrap_or_default())
                }
                _ => Slot::Failed(self.unexpected("{1, slot, counter}, {0} or {-1, permits}")),
            },
            Ok(_) => Slot::Failed(self.unexpected("an array")),
            Err(e) => Slot::Failed(e),
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
        let scripts = crate::scripts::Scripts::get();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = self
            .script_on(&scripts.view_many, &refs, &[], timeout)
            .await?;
        let Value::Array(parts) = reply else {
            return Err(self.unexpected("an array"));
        };
        if parts.len() != 2 * keys.len() {
            return Err(self.unexpected("a value and a pttl per key"));
        }
        parts
            .chunks(2)
            .map(|pair| match pair {
                [Value::Null, _] => Ok(None),
                [value, Value::Integer(pttl)] => match value.as_str() {
                    Some(v) => Ok(Some((v.into_owned(), *pttl))),
                    None => Err(self.unexpected("a string value")),
                },
                _ => Err(self.unexpected("[value, pttl]")),
            })
            .collect()
    }

    /// Resets the TTL of every key if all still hold our token; never re-creates a key.
    pub(crate) async fn extend(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
        if let Err(e) = self.state.counts() {
            return Vote::Failed(e);
        }
        let scripts = crate::scripts::Scripts::get();
        let reply = self
            .script(&scripts.extend, &held, Some(ttl_ms), timeout)
            .await;
        self.vote(reply)
    }

    /// Deletes the keys that still hold our token. Granted when every key was ours.
    pub(crate) async fn release(self: Arc<Self>, held: Arc<Held>, timeout: Duration) -> Vote {
        let scripts = crate::scripts::Scripts::get();
        let all = held.keys.len() as i64;
        // Sent even to a duplicate (it only deletes our own token), but a duplicate's answer
        // is never counted.
        let counts = self.state.counts();
        let reply = self.script(&scripts.release, &held, None, timeout).await;
        if let Err(e) = counts.as_ref() {
            if e.kind == NodeErrorKind::Duplicate {
                return Vote::Failed(e.clone());
            }
        }
        match reply {
            Ok(Value::Integer(n)) if n == all => Vote::Granted,
            Ok(Value::Integer(n)) if (0..all).contains(&n) => Vote::Refused,
            Ok(_) => Vote::Failed(self.unexpected("the number of keys deleted")),
            Err(e) => Vote::Failed(e),
        }
    }

    /// Who holds `key` here: `Some((token, pttl_ms))`, or `None` when the key does not exist.
    pub(crate) async fn inspect(
        self: Arc<Self>,
        key: String,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        if let Err(e) = self.state.counts() {
            if e.kind == NodeErrorKind::Duplicate {
                return Err(e);
            }
        }
        let scripts = crate::scripts::Scripts::get();
        let held = Held {
            keys: vec![key],
            token: String::new(),
            resources: Vec::new(),
            fence_keys: Vec::new(),
        };
        // INSPECT takes no ARGV, but `script` always appends the token; Redis ignores it.
        match self.script(&scripts.inspect, &held, None, timeout).await? {
            Value::Array(parts) => match parts.as_slice() {
                [Value::Null, _] => Ok(None),
                [value, Value::Integer(pttl)] => match value.as_str() {
                    Some(token) => Ok(Some((token.into_owned(), *pttl))),
                    None => Err(self.unexpected("a string value")),
                },
                _ => Err(self.unexpected("[value, pttl]")),
            },
            _ => Err(self.unexpected("an array")),
        }
    }

    /// Replies of the 1/0 scripts: 1 granted, 0 refused, anything else is a failure (never a grant).
    fn vote(&self, reply: Result<Value, NodeError>) -> Vote {
        match reply {
            Ok(Value::Integer(1)) => Vote::Granted,
            Ok(Value::Integer(0)) => Vote::Refused,
            Ok(_) => Vote::Failed(self.unexpected("OK, nil, 0 or 1")),
            Err(e) => Vote::Failed(e),
        }
    }

    fn unexpected(&self, wanted: &str) -> NodeError {
        NodeError {
            node: self.name.clone(),
            kind: NodeErrorKind::UnexpectedReply,
            message: format!("expected {wanted}"),
        }
    }

    fn error(&self, e: fred::error::Error) -> NodeError {
        self.state.error(&e)
    }
}

/// fredlock's options on every command: fred's own timeout (a command that timed out before
/// being written is skipped), one attempt (never replayed after a reconnect), fail fast while the
/// connection is down (no queueing behind a reconnect).
fn options(timeout: Duration) -> Options {
    Options {
        timeout: Some(timeout),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
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
