//! One Redis node: one fred [`Client`], commands bounded by a per-node timeout that fred itself
//! enforces, and the decoding of every reply into a [`Vote`] or a typed [`NodeError`].
//!
//! This is the only file that knows how fred is configured and what Redis answers look like.
//! The traps it avoids (see `shared/notes/fred-10.md`):
//! - `with_options(..).evalsha(..)` ignores the options, so every command goes through
//!   `with_options(..).custom(..)`, which honours them;
//! - a reconnect policy is always set (without one a dropped connection hangs the client forever);
//! - `max_attempts = 1`: a `SET NX` in flight when a connection resets is never replayed later;
//! - per-command timeouts are fred's own, so a command that timed out before being written is
//!   skipped rather than written after a reconnect;
//! - `fail_fast`: while a node is disconnected its commands fail at once instead of queueing;
//! - the command queue is bounded.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{
    ClientLike, ClientState, Config, ErrorKind, Expiration, KeysInterface, Options,
    ReconnectPolicy, ServerConfig, SetOptions, Value,
};
use fred::types::{ClusterHash, CustomCommand};

use crate::error::{InvalidInput, NodeError, NodeErrorKind, Vote};
use crate::scripts::Script;

pub use fred::clients::Client;

/// One configured Redis node.
pub(crate) struct Node {
    client: Client,
    /// `host:port/db`, safe to log.
    pub(crate) name: String,
    /// Whether fredlock created the client (and so quits it when the Redlock is dropped).
    owned: bool,
    /// Outcome of the latest connection attempt of fredlock's connect loop.
    link: tokio::sync::watch::Sender<Link>,
    /// Set when the Redlock is dropped: the connect loop stops.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

/// Where a node's connection stands, as far as the connect loop knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// The first attempt has not finished yet.
    Connecting,
    /// The latest attempt connected (fred's reconnect policy handles later drops).
    Up,
    /// The latest attempt failed; the loop retries with backoff.
    Down,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        if self.owned {
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
}

impl Node {
    /// Builds a client for `url` with fredlock's settings; connecting happens later.
    pub(crate) fn from_url(index: usize, url: &str) -> Result<Node, InvalidInput> {
        let mut config = Config::from_url(url).map_err(|e| InvalidInput::InvalidUrl {
            index,
            reason: scrub(e.details(), url),
        })?;
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
            .map_err(|e| InvalidInput::InvalidUrl {
                index,
                reason: scrub(e.details(), url),
            })?;
        let mut node = Node::from_client(client);
        node.owned = true;
        Ok(node)
    }

    /// Wraps a caller's client. It must have a reconnect policy (checked by the builder).
    pub(crate) fn from_client(client: Client) -> Node {
        let name = describe(&client.client_config());
        Node {
            client,
            name,
            owned: false,
            link: tokio::sync::watch::Sender::new(Link::Connecting),
            closed: Arc::default(),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Starts fredlock's connect loop unless the client is already connected or connecting;
    /// never waits. The loop makes the first attempt at once, then retries failed attempts with
    /// backoff (50 ms doubling to 2 s) until one succeeds; from then on fred's reconnect policy
    /// takes over. A service can therefore start while a node is down.
    pub(crate) fn connect(&self) {
        if self.client.state() != ClientState::Disconnected {
            self.link.send_replace(Link::Up);
            return;
        }
        let client = self.client.clone();
        let link = self.link.clone();
        let closed = self.closed.clone();
        let name = self.name.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            while !closed.load(std::sync::atomic::Ordering::Acquire) {
                match client.init().await {
                    Ok(task) => {
                        link.send_replace(Link::Up);
                        backoff = Duration::from_millis(50);
                        // Runs until the client quits (fred reconnects on its own meanwhile).
                        let _ = task.await;
                    }
                    Err(e) => {
                        link.send_replace(Link::Down);
                        tracing::debug!(node = %name, error = %e.details(), "fredlock: connection attempt failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// Stops the connect loop and, for clients fredlock created, sends QUIT behind whatever is
    /// queued (so queued releases are answered first).
    pub(crate) async fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        if self.owned {
            let _ = self.client.quit().await;
        }
    }

    /// Resolves once the first connection attempt finished: true when connected.
    pub(crate) async fn first_attempt(&self) -> bool {
        let mut rx = self.link.subscribe();
        let up = match rx.wait_for(|l| *l != Link::Connecting).await {
            Ok(l) => *l == Link::Up,
            Err(_) => false,
        };
        up
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
    /// kept: a release still lands after this node's earlier commands).
    async fn script(
        &self,
        script: &Script,
        held: &Held,
        extra: Option<u64>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        // Built again (rarely) for the EVAL fallback rather than cloned on every EVALSHA: the
        // extend script runs every renewal of every kept-alive lock.
        let args = |first: &str| {
            let mut args = Vec::with_capacity(held.keys.len() + 4);
            args.push(Value::from(first));
            args.push(Value::Integer(held.keys.len() as i64));
            args.extend(held.keys.iter().map(|k| Value::from(k.as_str())));
            args.push(Value::from(held.token.as_str()));
            if let Some(x) = extra {
                args.push(Value::Integer(x as i64));
            }
            args
        };
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

    /// `SET key token NX PX ttl` for one key, the all-or-none script for several.
    pub(crate) async fn acquire(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
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
            self.script(&scripts.acquire_many, &held, Some(ttl_ms), timeout)
                .await
        };
        self.vote(reply)
    }

    /// Resets the TTL of every key if all still hold our token; never re-creates a key.
    pub(crate) async fn extend(
        self: Arc<Self>,
        held: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Vote {
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
        match self.script(&scripts.release, &held, None, timeout).await {
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
        let scripts = crate::scripts::Scripts::get();
        let held = Held {
            keys: vec![key],
            token: String::new(),
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
        let kind = match e.kind() {
            ErrorKind::Timeout => NodeErrorKind::Timeout,
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Routing => NodeErrorKind::Connection,
            ErrorKind::Auth => NodeErrorKind::Auth,
            ErrorKind::Backpressure | ErrorKind::Config | ErrorKind::Url => NodeErrorKind::Client,
            ErrorKind::Parse | ErrorKind::Protocol => NodeErrorKind::UnexpectedReply,
            _ => NodeErrorKind::Server,
        };
        NodeError {
            node: self.name.clone(),
            kind,
            message: e.details().to_string(),
        }
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

/// `host:port/db` for a centralized config, a descriptive form otherwise. Never credentials.
fn describe(config: &Config) -> String {
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
            format!("{}:{}/{}", canonical_host(&server.host), server.port, db)
        }
        ServerConfig::Clustered { hosts: h, .. } => format!("cluster({})", hosts(h)),
        ServerConfig::Sentinel {
            hosts: h,
            service_name,
            ..
        } => format!("sentinel({service_name}@{})/{db}", hosts(h)),
        #[allow(unreachable_patterns)]
        _ => "unknown".to_string(),
    }
}

/// Loopback spelled three ways is one server: duplicate detection must see that.
fn canonical_host(host: &str) -> &str {
    match host {
        "localhost" | "127.0.0.1" | "::1" | "[::1]" => "127.0.0.1",
        other => other,
    }
}

/// fred's URL errors may echo the URL, which may hold a password.
fn scrub(details: &str, url: &str) -> String {
    let mut out = details.replace(url, "<url>");
    if let Some((userinfo, _)) = url.split_once('@') {
        if let Some((_, secret)) = userinfo.rsplit_once(':') {
            if !secret.is_empty() && !secret.starts_with("//") {
                out = out.replace(secret, "<redacted>");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_are_one_server() {
        let a = Node::from_url(0, "redis://localhost:7001").unwrap();
        let b = Node::from_url(1, "redis://127.0.0.1:7001/0").unwrap();
        assert_eq!(a.name, b.name);
        let c = Node::from_url(2, "redis://127.0.0.1:7001/1").unwrap();
        assert_ne!(a.name, c.name);
    }

    #[test]
    fn names_and_errors_hide_credentials() {
        let a = Node::from_url(0, "redis://user:hunter2@127.0.0.1:7001").unwrap();
        assert!(!a.name.contains("hunter2"));
        assert!(!format!("{a:?}").contains("hunter2"));
        let err = Node::from_url(0, "redis://user:hunter2@127.0.0.1:notaport").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn scrub_removes_secret() {
        assert_eq!(
            scrub("bad redis://u:pw@h:1", "redis://u:pw@h:1"),
            "bad <url>"
        );
        assert_eq!(
            scrub("pw is wrong", "redis://u:pw@h:1"),
            "<redacted> is wrong"
        );
    }
}
