//! One node's connection as fredlock follows it: the connect loop, the latest cause of failure in
//! the server's or the operating system's own words, and the server's identity.
//!
//! Why identity: two entries that reach one server (a database index, `localhost` and
//! `127.0.0.1`, a DNS alias) would let one server vote twice and fake a majority. Once connected
//! (and after every reconnect) each node asks `INFO server` for the server's `run_id`; a node whose
//! server already answers for another entry is not counted ([`NodeErrorKind::Duplicate`]).
//!
//! Right after that `INFO`, at every (re)connect and before the node counts, `caps::probe`
//! learns what this user may do without Lua (scripts allowed? `DELIFEQ` / `DELEX`?), kept in
//! [`State::caps`].
//!
//! Owns: connecting, reconnect bookkeeping, classifying fred's errors, identity.
//! Must not: send lock commands or count votes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::EventInterface;
use fred::prelude::{ClientLike, ClientState, ErrorKind, Options, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::watch;

use crate::base::error::{NodeError, NodeErrorKind};

pub use fred::clients::Client;

/// Where a node's connection stands, as far as the connect loop knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// The first attempt has not finished yet.
    Connecting,
    /// Connected and identified (fred's reconnect policy handles later drops).
    Up,
    /// The latest attempt failed; the loop retries with backoff.
    Down,
}

/// What is known of the server behind a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Identity {
    /// Not connected and identified yet: the node does not count.
    Unknown,
    /// The server's `run_id`; unique among this Redlock's nodes.
    Known(String),
    /// `INFO` is not allowed for this user (ACL): the node counts, but a duplicate behind an alias
    /// cannot be detected (logged once at WARN).
    Unverifiable,
    /// The same server as an earlier entry: never counted.
    Duplicate {
        /// Index of the other entry.
        of: usize,
        /// Its name.
        name: String,
        /// The shared run_id.
        run_id: String,
    },
}

/// The run_ids seen by the nodes of one Redlock: a node whose server already answers for
/// another entry is a duplicate.
#[derive(Debug, Default)]
pub(crate) struct Servers {
    seen: Mutex<Vec<(usize, String, String)>>,
}

impl Servers {
    /// Records `run_id` for node `index` and returns its identity.
    fn record(&self, index: usize, name: &str, run_id: String) -> Identity {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(i, _, _)| *i != index);
        if let Some((of, other, _)) = seen.iter().find(|(_, _, r)| *r == run_id) {
            return Identity::Duplicate {
                of: *of,
                name: other.clone(),
                run_id,
            };
        }
        seen.push((index, name.to_string(), run_id.clone()));
        Identity::Known(run_id)
    }
}

/// The state the connect loop shares with the node.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) index: usize,
    /// `host:port/db`, safe to log.
    pub(crate) name: String,
    pub(crate) link: watch::Sender<Link>,
    pub(crate) identity: watch::Sender<Identity>,
    /// The latest connection failure, cleared on (re)connect (a watch: `status` waits for a
    /// node's first attempt to end).
    cause: watch::Sender<Option<(NodeErrorKind, String)>>,
    /// Whether this node's votes counted when last looked at (`None`: not yet looked at), or
    /// the kind of failure that kept them from counting: a change is logged and counted once.
    usable: Mutex<Option<Result<(), NodeErrorKind>>>,
    closed: watch::Sender<bool>,
    /// fred's connection task runs (a first connection succeeded, or the client came connected).
    started: std::sync::atomic::AtomicBool,
    servers: Arc<Servers>,
    /// What the server lets this user do without Lua (probed at every (re)connect).
    pub(crate) caps: crate::nodes::caps::Caps,
    /// Work still running for callers that stopped waiting (`close` waits for it).
    pub(crate) busy: Arc<crate::nodes::busy::Busy>,
}

impl State {
    pub(crate) fn new(index: usize, name: String, servers: Arc<Servers>) -> Arc<State> {
        Arc::new(State {
            index,
            name,
            link: watch::Sender::new(Link::Connecting),
            identity: watch::Sender::new(Identity::Unknown),
            cause: watch::Sender::new(None),
            usable: Mutex::new(None),
            closed: watch::Sender::new(false),
            started: Default::default(),
            servers,
            caps: Default::default(),
            busy: Default::default(),
        })
    }

    /// Whether fred's connection task runs for this client.
    pub(crate) fn started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops the connect loop.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    fn set_cause(&self, cause: Option<(NodeErrorKind, String)>) {
        self.cause.send_replace(cause);
    }

    /// Changes of [`cause`](Self::cause), to wait for a first attempt's outcome.
    pub(crate) fn cause_changes(&self) -> watch::Receiver<Option<(NodeErrorKind, String)>> {
        self.cause.subscribe()
    }

    /// The latest connection failure, if the node is not connected because of one.
    pub(crate) fn cause(&self) -> Option<NodeError> {
        let cause = self.cause.borrow().clone();
        cause.map(|(kind, message)| NodeError {
            node: self.name.clone(),
            kind,
            message,
        })
    }

    /// `Ok` when this node's votes count; otherwise why not.
    pub(crate) fn counts(&self) -> Result<(), NodeError> {
        match &*self.identity.borrow() {
            Identity::Known(_) | Identity::Unverifiable => Ok(()),
            Identity::Duplicate { of, name, run_id } => Err(NodeError {
                node: self.name.clone(),
                kind: NodeErrorKind::Duplicate,
                message: format!("same server as node {of} ({name}, run_id {run_id}); not counted"),
            }),
            Identity::Unknown => Err(self.cause().unwrap_or_else(|| self.not_yet())),
        }
    }

    /// Why a node without a known cause does not count yet: its first connection attempt has
    /// not ended, or it connected and the server has not answered `INFO` yet.
    fn not_yet(&self) -> NodeError {
        let message = if *self.link.borrow() == Link::Connecting && !self.started() {
            "not connected yet: the first connection attempt has not ended"
        } else {
            "not connected yet: connected, waiting for the server's INFO reply"
        };
        NodeError {
            node: self.name.clone(),
            kind: NodeErrorKind::Connection,
            message: message.into(),
        }
    }

    /// Looks at whether this node's votes count now and, once per change (usable, or unusable
    /// for another kind of reason than before), logs it (WARN with the node and the server's
    /// or the OS's words when it stops counting, INFO when it counts again) and sets the
    /// `fredlock_node_usable` gauge. A node that refuses our credentials (NOAUTH, WRONGPASS)
    /// is otherwise silent: the fleet has lost fault tolerance and nothing else says so.
    pub(crate) fn observe(&self) {
        // A closed Redlock's connections going away is no news.
        if self.is_closed() {
            return;
        }
        // Identified once, a node whose connection dropped since does not count either.
        let now = self
            .counts()
            .and_then(|()| self.cause().map_or(Ok(()), Err));
        let next = now.as_ref().map(|_| ()).map_err(|e| e.kind);
        let before = {
            let mut last = self.usable.lock().unwrap_or_else(|p| p.into_inner());
            if *last == Some(next) {
                return;
            }
            last.replace(next)
        };
        crate::base::metrics::node_usable(&self.name, next.is_ok());
        match now {
            Ok(()) => {
                if matches!(before, Some(Err(_))) {
                    tracing::info!(node = %self.name, "fredlock: node usable again");
                }
            }
            // Said by `warn_identity` already.
            Err(e) if e.kind == NodeErrorKind::Duplicate => {}
            Err(e) => {
                tracing::warn!(node = %self.name, kind = %e.kind, cause = %e.message, "fredlock: node not usable (its votes do not count); retrying in the background");
            }
        }
    }

    /// Whether [`close`](Self::close) was called; resolves at once when it was.
    pub(crate) async fn closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// A node identified by other means than `INFO` (a cluster: by its node ids): records `id`
    /// like a `run_id`, clears the cause and marks the node up.
    pub(crate) fn identified(&self, id: String) {
        let identity = self.servers.record(self.index, &self.name, id);
        warn_identity(&self.name, &identity);
        self.started
            .store(true, std::sync::atomic::Ordering::Release);
        self.set_cause(None);
        self.identity.send_replace(identity);
        self.link.send_replace(Link::Up);
        self.observe();
    }

    /// A failed attempt of a connect loop other than [`spawn`]'s: records the cause, and marks
    /// the node down while it has never been up.
    pub(crate) fn failed(&self, e: &NodeError) {
        self.set_cause(Some((e.kind, e.message.clone())));
        if *self.link.borrow() != Link::Up {
            self.link.send_replace(Link::Down);
        }
        self.observe();
    }

    /// Turns a fred error into a [`NodeError`] with the most useful words: a command refused
    /// because the connection is down carries the connection's own cause (`WRONGPASS ...`,
    /// `Connection refused`) instead of fred's generic "Connection closed unexpectedly.".
    pub(crate) fn error(&self, e: &fred::error::Error) -> NodeError {
        let (kind, message) = classify(e);
        if kind == NodeErrorKind::Connection {
            if let Some(cause) = self.cause() {
                return NodeError {
                    message: format!("not connected: {}", cause.message),
                    ..cause
                };
            }
            // fred's "Connection closed unexpectedly." for a command refused while the first
            // attempt is still under way says nothing true: say what the votes say.
            if !self.started() {
                return self.not_yet();
            }
        }
        NodeError {
            node: self.name.clone(),
            kind,
            message,
        }
    }
}

/// The kind of a fred error and its message, with IO errors in plain words
/// (`Connection refused (os error 111)`, not fred's `Os { code: 111, ... }`).
pub(crate) fn classify(e: &fred::error::Error) -> (NodeErrorKind, String) {
    let kind = match e.kind() {
        ErrorKind::Timeout => NodeErrorKind::Timeout,
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Routing => NodeErrorKind::Connection,
        ErrorKind::Auth => NodeErrorKind::Auth,
        ErrorKind::Backpressure | ErrorKind::Config | ErrorKind::Url => NodeErrorKind::Client,
        ErrorKind::Parse | ErrorKind::Protocol => NodeErrorKind::UnexpectedReply,
        // `Tls` exists only when one of fred's TLS features is on (ours, or the application's).
        other if format!("{other:?}") == "Tls" => NodeErrorKind::Tls,
        _ => {
            let d = e.details();
            if d.starts_with("NOAUTH") || d.starts_with("WRONGPASS") {
                NodeErrorKind::Auth
            } else if d.starts_with("NOPERM") {
                NodeErrorKind::Permission
            } else if d.contains("Failed to route command") {
                // fred's words when the node's connection is down.
                NodeErrorKind::Connection
            } else {
                NodeErrorKind::Server
            }
        }
    };
    let message = plain_words(e.details());
    // fred hands rustls' handshake failures over as IO errors.
    if kind == NodeErrorKind::Connection && is_tls_failure(&message) {
        return (
            NodeErrorKind::Tls,
            format!(
                "handshake failed: {message} (does the client trust the server's certificate \
                 authority, and does the URL's host name match the certificate?)"
            ),
        );
    }
    (kind, with_hint(kind, message))
}

/// [`classify`] for a failed connection attempt, where a timeout means that nothing answered
/// within [`CONNECT_TIMEOUT`]: fred's own words ("Request timed out.") would read like a slow
/// command.
fn classify_connect(e: &fred::error::Error) -> (NodeErrorKind, String) {
    let (kind, message) = classify(e);
    if kind != NodeErrorKind::Timeout {
        return (kind, message);
    }
    let message = format!(
        "nothing answered the connection attempt within {} s (is this port a Redis or Valkey server? \
         is the host up, and does a firewall let the packets through?)",
        CONNECT_TIMEOUT.as_secs()
    );
    (kind, message)
}

/// How long a connection attempt may take to connect, and then for the server's first answer.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The server's or the OS's words, plus what to do about the common causes.
fn with_hint(kind: NodeErrorKind, message: String) -> String {
    let hint = match kind {
        NodeErrorKind::Auth => "check the user name and password in this node's URL",
        // A reply that is not RESP at all (an HTTP or SSH server, say): fred's decoder fails.
        NodeErrorKind::UnexpectedReply if message.contains("Decode Error") => {
            "the reply is not the Redis protocol: is this port a Redis or Valkey server?"
        }
        _ if message.contains("Connection refused") => {
            "is the server running and listening on this address?"
        }
        _ if message.contains("lookup address") => "check the host name in this node's URL",
        _ => return message,
    };
    format!("{message} ({hint})")
}

/// rustls' error names for a failed handshake (`InvalidCertificate(UnknownIssuer)`, ...).
fn is_tls_failure(message: &str) -> bool {
    [
        "InvalidCertificate",
        "NoCertificatesPresented",
        "AlertReceived",
        "HandshakeFailure",
        "PeerIncompatible",
        "PeerMisbehaved",
        "InappropriateHandshakeMessage",
        "InvalidMessage",
        "UnsupportedNameType",
    ]
    .iter()
    .any(|name| message.contains(name))
}

/// fred formats IO errors with `Debug`; keep only the words a person reads.
fn plain_words(details: &str) -> String {
    let field = |name: &str| {
        let start = details.find(&format!("{name}: \""))? + name.len() + 3;
        let end = details[start..].find('"')? + start;
        Some(details[start..end].to_string())
    };
    if details.starts_with("Os {") {
        if let (Some(message), Some(code)) = (field("message"), os_code(details)) {
            return format!("{message} (os error {code})");
        }
    }
    if details.starts_with("Custom {") || details.starts_with("Kind(") {
        if let Some(error) = field("error") {
            return error;
        }
        // An unquoted error value: `error: InvalidCertificate(UnknownIssuer) }`.
        if let Some(start) = details.find("error: ") {
            let rest = &details[start + 7..];
            return rest.strip_suffix(" }").unwrap_or(rest).to_string();
        }
    }
    details.to_string()
}

fn os_code(details: &str) -> Option<i64> {
    let start = details.find("code: ")? + 6;
    let digits: String = details[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

/// fredlock's options on every command: fred's own timeout (a command that timed out before
/// being written is skipped), one attempt (never replayed after a reconnect), fail fast while the
/// connection is down (no queueing behind a reconnect).
pub(crate) fn options(timeout: Duration) -> Options {
    Options {
        timeout: Some(timeout),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
    }
}

/// A fred client for `config` with fredlock's settings; connecting happens later.
pub(crate) fn client(config: fred::prelude::Config) -> Result<Client, fred::error::Error> {
    builder(config, 100_000).build()
}

/// How long a Sentinel-managed node's connection may go without answering a `PING` before
/// fredlock makes fred open it again (asking the sentinels for the primary): twice the longest
/// command timeout fredlock sends it (its node timeout when set above 2 s, its identification's
/// 2 s otherwise), so that a slow answer is never taken for a stall.
pub(crate) fn stall_bound(node_timeout: Option<Duration>) -> Duration {
    node_timeout
        .unwrap_or(IDENTIFY_TIMEOUT)
        .max(IDENTIFY_TIMEOUT)
        .saturating_mul(2)
}

/// The timeout of the `INFO server` that identifies a server after each (re)connect.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// fredlock's fred settings for one connection, for [`client`] and the subscriber connections:
/// one attempt per command (never a replay), a bounded queue of `buffer` commands, a reconnect
/// policy, and timeouts on everything.
pub(crate) fn builder(mut config: fred::prelude::Config, buffer: usize) -> fred::types::Builder {
    // The first attempt is made at once and its failure reported (fred's reconnect policy
    // would sleep before even the first attempt); fredlock's connect loop retries it.
    config.fail_fast = true;
    let mut builder = fred::types::Builder::from_config(config);
    builder
        .set_policy(fred::prelude::ReconnectPolicy::new_exponential(
            0, 50, 2_000, 2,
        ))
        .with_connection_config(|c| {
            c.connection_timeout = CONNECT_TIMEOUT;
            c.internal_command_timeout = CONNECT_TIMEOUT;
            c.max_command_attempts = 1;
            c.max_command_buffer_len = buffer;
            c.tcp.nodelay = Some(true);
        })
        .with_performance_config(|p| {
            // A safety net only: every fredlock command carries its own timeout.
            p.default_command_timeout = Duration::from_secs(5);
        });
    builder
}

/// Starts the connect loop for `client` (always; an already connected client skips to
/// identification). It never waits. The first attempt is made at once; failed attempts are
/// retried with backoff (50 ms doubling to 2 s), each cause recorded; once connected the server
/// is identified, and identified again after every reconnect.
///
/// With `stall` (a Sentinel-managed node, see [`stall_bound`]), it also sends a `PING` every
/// quarter of it, and makes fred reconnect when one goes unanswered that long: a primary that
/// stops answering without closing its connections (frozen, or cut off by the network) would
/// otherwise keep the node after the sentinels promoted a replica, until it came back. (fred's
/// own unresponsive check counts from the latest write, so steady traffic never trips it.)
pub(crate) fn spawn(client: Client, state: Arc<State>, stall: Option<Duration>) {
    tokio::spawn(async move {
        let mut closed = state.closed.subscribe();
        tokio::select! {
            () = run(client.clone(), state.clone()) => {}
            () = watch_stall(client, &state, stall) => {}
            _ = closed.wait_for(|c| *c) => {}
        }
    });
}

/// See [`spawn`]: never returns.
async fn watch_stall(client: Client, state: &State, stall: Option<Duration>) {
    let Some(stall) = stall else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep((stall / 4).max(Duration::from_millis(100))).await;
        if client.state() != ClientState::Connected {
            continue;
        }
        let ping = CustomCommand::new_static("PING", ClusterHash::Random, false);
        let reply = client
            .with_options(&options(stall))
            .custom::<Value, Value>(ping, Vec::new())
            .await;
        if matches!(&reply, Err(e) if *e.kind() == ErrorKind::Timeout) {
            tracing::warn!(
                node = %state.name,
                "no answer to PING within {stall:?}: reconnecting (through the sentinels)"
            );
            state.set_cause(Some((
                NodeErrorKind::Timeout,
                format!("no answer within {stall:?}; reconnecting through the sentinels"),
            )));
            state.observe();
            let _ = tokio::time::timeout(stall, client.force_reconnection()).await;
        }
    }
}

async fn run(client: Client, state: Arc<State>) {
    let mut reconnects = client.reconnect_rx();
    let mut errors = client.error_rx();
    let mut backoff = Duration::from_millis(50);
    let task = if client.state() == ClientState::Disconnected {
        loop {
            match client.init().await {
                Ok(task) => break Some(task),
                Err(e) => {
                    state.set_cause(Some(classify_connect(&e)));
                    state.link.send_replace(Link::Down);
                    state.observe();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    } else {
        None
    };
    state
        .started
        .store(true, std::sync::atomic::Ordering::Release);
    state.set_cause(None);
    identify(&client, &state).await;
    state.link.send_replace(Link::Up);
    state.observe();
    let done = async {
        match task {
            // Runs until the client quits (fred reconnects on its own meanwhile).
            Some(task) => {
                let _ = task.await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(done);
    loop {
        use tokio::sync::broadcast::error::RecvError;
        tokio::select! {
            () = &mut done => return,
            r = reconnects.recv() => match r {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    state.set_cause(None);
                    identify(&client, &state).await;
                    state.observe();
                }
                Err(RecvError::Closed) => return,
            },
            r = errors.recv() => match r {
                Ok((e, _)) => {
                    state.set_cause(Some(classify(&e)));
                    state.observe();
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
        }
    }
}

/// Asks the server for its `run_id` (retrying while it does not answer) and records it.
async fn identify(client: &Client, state: &State) {
    let mut pause = Duration::from_millis(20);
    loop {
        let info = CustomCommand::new_static("INFO", ClusterHash::Random, false);
        let reply = client
            .with_options(&options(IDENTIFY_TIMEOUT))
            .custom::<Value, Value>(info, vec![Value::from("server")])
            .await;
        let info = match &reply {
            Ok(value) => value.as_str().map(|s| s.to_string()),
            Err(_) => None,
        };
        let answered = match &reply {
            Ok(_) => true,
            Err(e) => e.details().contains("NOPERM"),
        };
        if answered && !same_server(&state.identity.borrow(), info.as_deref()) {
            state.caps.forget_scripts();
        }
        // What this user may do without Lua, learnt before the node counts (a probe that got
        // no answer is retried like INFO).
        let probed =
            answered && crate::nodes::caps::probe(client, info.as_deref(), &state.caps).await;
        let identity = match reply {
            Ok(_) if probed => match info.as_deref().and_then(run_id) {
                Some(id) => state.servers.record(state.index, &state.name, id),
                None => Identity::Unverifiable,
            },
            Err(_) if probed => Identity::Unverifiable,
            other => {
                if let Err(e) = other {
                    state.set_cause(Some(classify(&e)));
                    state.observe();
                }
                if *state.closed.borrow() {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        state.set_cause(None);
        warn_identity(&state.name, &identity);
        state.identity.send_replace(identity);
        return;
    }
}

/// Whether the server that answered `info` is the one this node was identified with, so the
/// scripts it was known to have are still cached there. A first identification counts as the
/// same: what was learnt meanwhile was learnt on this connection. A server whose `run_id`
/// cannot be read (no INFO) may have restarted: not the same.
fn same_server(known: &Identity, info: Option<&str>) -> bool {
    match (known, info.and_then(run_id)) {
        (Identity::Unknown, _) => true,
        (Identity::Known(old) | Identity::Duplicate { run_id: old, .. }, Some(new)) => *old == new,
        _ => false,
    }
}

fn warn_identity(node: &str, identity: &Identity) {
    match identity {
        Identity::Duplicate { of, name, run_id } => {
            tracing::warn!(node = %node, other = %name, other_index = of, %run_id, "fredlock: this node is the same server as another entry; it is not counted");
        }
        Identity::Unverifiable => {
            tracing::warn!(node = %node, "fredlock: cannot read INFO on this node (allow the INFO command for this user); a duplicate entry for the same server would not be detected");
        }
        _ => {}
    }
}

fn run_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_forgotten_only_when_the_server_changed() {
        let info = |id: &str| format!("# Server\r\nrun_id:{id}\r\n");
        let known = Identity::Known("a".into());
        assert!(same_server(&Identity::Unknown, None));
        assert!(same_server(&known, Some(&info("a"))));
        assert!(!same_server(&known, Some(&info("b"))), "a restarted server");
        assert!(
            !same_server(&known, None),
            "no run_id: it may have restarted"
        );
        assert!(!same_server(&Identity::Unverifiable, Some(&info("a"))));
    }

    #[test]
    fn io_errors_in_plain_words() {
        assert_eq!(
            plain_words(
                r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#
            ),
            "Connection refused (os error 111)"
        );
        assert_eq!(
            plain_words(
                r#"Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#
            ),
            "failed to lookup address information: Name or service not known"
        );
        assert_eq!(plain_words("WRONGPASS invalid"), "WRONGPASS invalid");
        assert_eq!(
            plain_words("Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }"),
            "InvalidCertificate(UnknownIssuer)"
        );
        assert!(is_tls_failure("InvalidCertificate(UnknownIssuer)"));
    }

    #[test]
    fn one_run_id_counts_once() {
        let servers = Servers::default();
        assert_eq!(
            servers.record(0, "a", "x".into()),
            Identity::Known("x".into())
        );
        assert!(matches!(
            servers.record(1, "b", "x".into()),
            Identity::Duplicate { of: 0, .. }
        ));
        assert_eq!(
            servers.record(2, "c", "y".into()),
            Identity::Known("y".into())
        );
        // Node 0 reconnects to a restarted server: its old run_id no longer blocks others.
        assert_eq!(
            servers.record(0, "a", "z".into()),
            Identity::Known("z".into())
        );
    }

    #[test]
    fn run_id_is_read_from_info() {
        assert_eq!(
            run_id("# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\n").as_deref(),
            Some("abc123")
        );
        assert_eq!(run_id("# Server\r\n"), None);
    }
}
