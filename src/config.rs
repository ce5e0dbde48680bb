//! The builder: every default in one place, every input validated before anything connects.
//!
//! Owns: [`Builder`], defaults, validation, construction of the node clients. Must not: send lock
//! commands; nothing below imports it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::ClientLike;

use crate::base::error::{Error, InvalidInput, NodeError, NodeErrorKind, Result};
use crate::base::line::Line;
use crate::nodes::confirm::Confirm;
use crate::nodes::connection::{Identity, Servers};
use crate::nodes::node::{Client, Node};
use crate::nodes::subscriber::Subscribers;
use crate::rounds::quorum;
pub use crate::rounds::redlock::Retry;
use crate::rounds::redlock::{Inner, Redlock};

/// Default clock-drift factor (1% of the TTL, plus a fixed 2 ms).
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default key prefix: the resource `orders:42` is the Redis key `fredlock:orders:42`.
pub const DEFAULT_KEY_PREFIX: &str = "fredlock:";
/// Default time `build()` waits for a quorum of nodes to connect before returning anyway.
pub const DEFAULT_CONNECT_WAIT: Duration = Duration::from_secs(2);
/// Default [`Builder::handover_window`]: how long after a round set a lock's keys its holder may
/// still pass it to a waiter of the same `Redlock` as it is, without asking the wait line.
pub const DEFAULT_HANDOVER_WINDOW: Duration = Duration::from_millis(50);
/// The longest per-node timeout accepted: a node that takes longer is down for a lock's purposes.
pub const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(3600);

enum NodeSpec {
    Url(String),
    Client(Client),
}

/// Builds a [`Redlock`]. Start with [`Redlock::builder()`].
///
/// ```no_run
/// # async fn demo() -> Result<(), fredlock::Error> {
/// use std::time::Duration;
/// use fredlock::{Redlock, Retry};
/// let redlock = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .retry(Retry { attempts: 10, delay: Duration::from_millis(200), jitter: Duration::from_millis(100) })
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
pub struct Builder {
    nodes: Vec<NodeSpec>,
    retry: Retry,
    drift_factor: f64,
    node_timeout: Option<Duration>,
    key_prefix: String,
    owner_label: Option<String>,
    connect_wait: Duration,
    require_quorum: bool,
    fencing_tokens: bool,
    wake_on_release: bool,
    handover_window: Duration,
    confirm: Option<Confirm>,
}

impl fmt::Debug for Builder {
    // URLs may carry passwords: show how many nodes, not what they are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("nodes", &self.nodes.len())
            .field("retry", &self.retry)
            .field("drift_factor", &self.drift_factor)
            .field("node_timeout", &self.node_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("owner_label", &self.owner_label)
            .field("connect_wait", &self.connect_wait)
            .field("require_quorum", &self.require_quorum)
            .field("fencing_tokens", &self.fencing_tokens)
            .field("wake_on_release", &self.wake_on_release)
            .field("handover_window", &self.handover_window)
            .field("confirm", &self.confirm)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            nodes: Vec::new(),
            retry: Retry::default(),
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_string(),
            owner_label: None,
            connect_wait: DEFAULT_CONNECT_WAIT,
            require_quorum: false,
            fencing_tokens: false,
            wake_on_release: true,
            handover_window: DEFAULT_HANDOVER_WINDOW,
            confirm: None,
        }
    }
}

impl Redlock {
    /// Starts a [`Builder`].
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl Builder {
    /// Adds nodes by URL (`redis://`, `rediss://`, `valkey://`, `redis-sentinel://`,
    /// `redis-cluster://`; see fred's `Config::from_url`). Each URL must be an INDEPENDENT
    /// server: replicas of one another do not make a quorum.
    ///
    /// A node may be a Redis Cluster (`redis-cluster://h1:p1?node=h2:p2&node=h3:p3`, the
    /// addresses being seeds): its shards share that node's load and its keys; it still casts one
    /// vote. fredlock reads the slot table itself and sends each command to the shard that owns
    /// the key, following `MOVED` and `ASK` (a redirected command was executed nowhere); a
    /// shard that is down fails that node's vote only for keys in its slots. Key placement: a
    /// lock's fencing counter and all keys of one semaphore share a slot by construction; the
    /// keys of a multi-resource lock may span slots (one all-or-none script per slot, the node
    /// granting only if every slot granted). A key prefix with an unbalanced `{` or `}` can
    /// defeat the placement: such keys are refused with [`InvalidInput::CrossSlot`].
    /// [`Redlock::client`](crate::Redlock::client) is `None` for a cluster node.
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes
            .extend(urls.into_iter().map(|u| NodeSpec::Url(u.into())));
        self
    }

    /// Adds nodes as ready-made fred clients, for TLS, authentication, sentinel or cluster
    /// set-ups the URL form does not cover (of a cluster client, fredlock uses only the
    /// configuration: it opens one client per shard of its own, as described at
    /// [`nodes`](Self::nodes)). Each client must have a reconnect policy
    /// (`fred::types::Builder::set_policy`); `build()` rejects one without. fredlock sets its own
    /// per-command options (timeout, one attempt, fail fast) on every command it sends, and
    /// calls `connect()` on clients that are not connected or connecting yet.
    pub fn clients<I>(mut self, clients: I) -> Self
    where
        I: IntoIterator<Item = Client>,
    {
        self.nodes.extend(clients.into_iter().map(NodeSpec::Client));
        self
    }

    /// Retry policy of [`Redlock::acquire`] (default: [`Retry::default()`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Clock-drift factor, in `[0, 0.5)` (default 0.01). The validity of a lock is
    /// `ttl - (ttl * drift_factor + 2 ms)`, counted from before the first command was sent.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Per-node command timeout, in `(0, 1 h]` (`build()` rejects others). Default: derived from
    /// each call's TTL, 5% of it, clamped to `[10 ms, 500 ms]` and at most half the TTL. A node
    /// that does not answer in time counts as failed for that attempt (and is released, since its
    /// outcome is unknown). An acquire attempt never waits past its validity, whatever this is.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Prefix of every Redis key (default `"fredlock:"`). With Redis Cluster nodes, a prefix
    /// without `{` and `}` lets each resource land in its own slot (spread over the shards); a
    /// prefix with a complete hash tag (`"{locks}:"`) puts every key in one slot (one shard); a
    /// prefix with an unbalanced brace is refused at acquire ([`InvalidInput::CrossSlot`]).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The owner label stored with every lock, permit and leadership of this `Redlock` that does
    /// not name its own ([`AcquireOptions::label`](crate::AcquireOptions::label)); default
    /// `host:pid` (the host name and this process's id). [`Redlock::inspect`] and
    /// `fredlock inspect` show it, so that an operator sees WHO holds a lock.
    ///
    /// The label is public: anyone who can read the keys can read it, and knowing it gives no
    /// power over the lock (every command compares the secret token stored before it). An
    /// empty label stores none. At most [`MAX_LABEL_LEN`](crate::MAX_LABEL_LEN) bytes of
    /// printable text: `build()` rejects anything else with [`InvalidInput::InvalidLabel`].
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.owner_label = Some(label.into());
        self
    }

    /// How long `build()` waits for a quorum of nodes to connect (default 2 s). It returns as
    /// soon as a quorum is connected and identified (plus up to 100 ms for the others' first
    /// attempts), or when this runs out, whichever is first; nodes that are down keep connecting
    /// in the background. `Duration::MAX` waits without a limit; `Duration::ZERO` does not wait.
    pub fn connect_wait(mut self, wait: Duration) -> Self {
        self.connect_wait = wait;
        self
    }

    /// Strict start (default off): `build()` fails with [`Error::Connect`], listing each node
    /// that did not connect and why (`WRONGPASS ...`, `Connection refused`), when no quorum is
    /// connected within [`connect_wait`](Self::connect_wait). Off, `build()` returns anyway and
    /// acquires fail with [`Error::Unavailable`] until a quorum is reachable.
    pub fn require_quorum(mut self, strict: bool) -> Self {
        self.require_quorum = strict;
        self
    }

    /// Hand out a fencing token with every lock (default off): [`crate::Lock::fencing_token`],
    /// strictly increasing across successive holders of the same resource, for the protected
    /// resource to check (reject any write with a token lower than the highest it has seen).
    ///
    /// How: each node keeps a counter per resource (key [`Redlock::fence_key`]), read by the
    /// acquire script itself, so a grant never lacks its counter. The token is one more than
    /// the largest counter among the granting nodes, and it is written back to a quorum (as a
    /// maximum) before the lock is returned: any later grant's quorum overlaps that write and
    /// goes higher. (Taking the largest of per-node `INCR`s instead repeats tokens.) Costs one
    /// more round per acquire; extend and release never touch the counters.
    ///
    /// **Counters must survive restarts.** They never expire, so a delayed restart does not
    /// protect them: run the nodes with `appendonly yes` and `appendfsync always`, or keep a node
    /// that lost its data out of the fleet. One node restarting empty can make a token repeat.
    pub fn fencing_tokens(mut self, enabled: bool) -> Self {
        self.fencing_tokens = enabled;
        self
    }

    /// Wake waiting acquires when a lock is released, instead of only polling (default on).
    ///
    /// Either way, an acquire that has to wait for a single resource (a lock, a semaphore, an
    /// election) takes a place in the resource's *wait line*, kept on one node chosen by the
    /// resource's name (its gate); that node grants its vote only to the line's head, so the
    /// waiters of the whole fleet take turns in arrival order instead of racing, and only the
    /// head ever sets keys on the other nodes (see "Many processes: waiting in line" in
    /// docs/algorithm.md).
    ///
    /// On: a release on the gate wakes the line's head, and only the head, with one message on
    /// the head's process's own channel, received through ONE subscriber connection per node
    /// per `Redlock` (opened by the first acquire that waits), whatever the number of keys. The
    /// other waiters keep their place with one command every 2 s (the waiter right behind the
    /// head: a look at the gate every second, to notice a dead head). A holder that crashed
    /// is noticed when its key expires on the gate (the head times its next look by the key's
    /// TTL there). See [`Retry`] for what `attempts` then means.
    ///
    /// Off: no subscriber connection; waiters still keep their places, and the head asks the
    /// gate at the [`Retry`] pace, and so does the next in line; the others poll one pause per place
    /// behind the head (up to 8 pauses, at most once a second).
    ///
    /// Clients of one resource may mix settings (and versions): exclusion never depends on the
    /// line, only on the quorum; a client that does not follow the line can only slow the
    /// others down to polling.
    pub fn wake_on_release(mut self, on: bool) -> Self {
        self.wake_on_release = on;
        self
    }

    /// How long a process may keep a contended lock among its own waiters (default
    /// [`DEFAULT_HANDOVER_WINDOW`], 50 ms; `Duration::ZERO`: never).
    ///
    /// When [`Lock::release`](crate::Lock::release) finds a waiter of the same `Redlock` on the
    /// same resource (an `acquire` that was refused and waits in the resource's line), it hands
    /// the lock to that waiter instead of releasing it. Within this window after a round last
    /// set the lock's keys (the acquire that got it from the nodes), the hand-over sends
    /// nothing: the waiter's [`Lock`](crate::Lock) takes over the holder's keys as they are,
    /// with the same [`token`](crate::Lock::token), the holder's
    /// [`deadline`](crate::Lock::deadline), and [`acquired_at`](crate::Lock::acquired_at) the
    /// moment it was handed over; the nodes see one holder throughout. After the window, or
    /// when the waiter asked for another TTL or label, or holds for a minimum
    /// ([`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least)), the
    /// hand-over is one round that replaces the holder's token with the waiter's on every node
    /// (a fresh token and TTL), and only when no waiter of another process is ahead of it in
    /// the line; otherwise the lock is released and the line's head woken. Never for a lock
    /// with fencing tokens, a caller's token or several resources.
    ///
    /// So waiters of one process take turns at the cost of a task wake-up, while waiters of
    /// other processes wait at most one window (plus the holds under way) beyond their place in
    /// line. The window is also capped at a tenth of the lock's TTL, so a lock handed over as it
    /// is keeps at least its validity less that. Zero turns it off: every hand-over takes a
    /// round and every acquisition gets a fresh token.
    pub fn handover_window(mut self, window: Duration) -> Self {
        self.handover_window = window;
        self
    }

    /// Counts a node's vote for an acquire (and an extension, and a hand-over's new key) only
    /// once at least `replicas` of its replicas acknowledged the write: `WAIT replicas timeout`
    /// on the same connection, right after the write's reply. Fewer within `timeout` is a
    /// failed vote from that node ([`NodeErrorKind::Unconfirmed`](crate::NodeErrorKind),
    /// naming the node and the count), and the attempt releases there as after any failure.
    ///
    /// For nodes with replicas and automatic failover (Sentinel-managed groups, a cloud's
    /// managed primary): replication is asynchronous, so a primary that fails right after a
    /// grant may be replaced by a replica that never received the key, and another client
    /// then gets the lock within its TTL. With a confirmed vote the key is on `replicas`
    /// replicas before it counts; Sentinel promotes the replica with the most data, so one
    /// confirmed replica is enough while the group's priorities are left at their defaults.
    /// Costs each acquire and extension one more round trip per node, plus the replication
    /// delay; while a node has fewer live replicas than asked, it can grant nothing (it waits
    /// `timeout` for each vote: that wait also delays whatever else is queued on its
    /// connection).
    ///
    /// `replicas` must be at least 1 and `timeout` in `(0, 1 h]`; a Redis Cluster node is
    /// refused (`build()` fails with [`InvalidInput::ConfirmReplicas`]). Default: no
    /// confirmation.
    pub fn confirm_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.confirm = Some(Confirm {
            replicas,
            timeout,
            fsync: false,
        });
        self
    }

    /// As [`confirm_replicas`](Self::confirm_replicas), but each vote counts once the write is
    /// in the append-only file, fsynced, on the node's primary AND on `replicas` of its
    /// replicas (`WAITAOF 1 replicas timeout`; Redis 7.2 or later, Valkey): a crash of every
    /// one of them, even a power cut, keeps it. `replicas` may be 0: the primary's own fsync
    /// only, for a single server with `appendfsync everysec` that must not lose a lock key to a
    /// restart. The servers need `appendonly yes` (else the server refuses, and the vote fails
    /// with its words); a server without `WAITAOF` (Redis 7.0) fails every vote, naming the
    /// command. The last call of the two wins.
    pub fn confirm_replicas_fsynced(mut self, replicas: u32, timeout: Duration) -> Self {
        self.confirm = Some(Confirm {
            replicas,
            timeout,
            fsync: true,
        });
        self
    }

    /// Validates everything, creates one fred client per node and starts connecting.
    ///
    /// Returns once a quorum of nodes is connected or after `connect_wait`, whichever comes first:
    /// a service can start while nodes are down (acquires fail with [`Error::Unavailable`]
    /// until a quorum is back). It fails with [`Error::Connect`] (in strict mode, or not) when
    /// so many nodes refuse the credentials (`NOAUTH`, `WRONGPASS`) that no quorum accepts
    /// them: that is a configuration mistake, not an outage. It fails with
    /// [`Error::NotPermitted`] when so many nodes can grant no lock at all that no quorum is
    /// left: their user may not run Lua scripts and the server has no native compare-and-delete
    /// (`DELIFEQ`: Valkey >= 9.0; `DELEX`: Redis >= 8.4), so a key set there could be neither
    /// released nor extended (with fewer such nodes, each is logged at WARN and never sent a
    /// lock's `SET`). Each node that does not count is
    /// logged at WARN level once per change of its state (with the server's words), and
    /// [`Redlock::node_status`] (and the `fredlock_node_usable` gauge, feature `metrics`) says
    /// which nodes count and why not: a `build()` that succeeded may still have lost fault
    /// tolerance. Must be called inside a tokio runtime, and the `Redlock` must be
    /// used in that runtime (fred's connection tasks live there).
    ///
    /// Cancellation: dropping the future before it completes leaves the clients created so far
    /// to shut down when dropped; nothing is locked.
    pub async fn build(self) -> Result<Redlock> {
        let (drift_factor, label) = self.checked()?;
        let servers = Arc::new(Servers::default());
        let nodes = create_nodes(self.nodes, &servers, self.node_timeout, self.confirm)?;
        let line = Arc::new(Line::new(&self.key_prefix, nodes.len()));
        let wake = if self.wake_on_release {
            Subscribers::new(&nodes, line.clone())
        } else {
            None
        };
        let nodes: Vec<Arc<Node>> = nodes.into_iter().map(Arc::new).collect();
        for node in &nodes {
            node.connect();
        }
        let waited = wait_for_quorum(&nodes, self.connect_wait).await;
        no_aliases(&nodes)?;
        let q = quorum::quorum(nodes.len());
        if let Some(e) = no_lock(&nodes, q) {
            return Err(e);
        }
        enough_connected(&nodes, q, self.require_quorum, waited)?;
        Ok(Redlock::from_inner(Inner {
            quorum: q,
            nodes,
            retry: self.retry,
            drift_factor,
            node_timeout: self.node_timeout,
            key_prefix: self.key_prefix,
            label,
            fencing: self.fencing_tokens,
            background: Default::default(),
            renewer: Default::default(),
            campaigns: Default::default(),
            closing: Default::default(),
            holds: Default::default(),
            handover_window: self.handover_window,
            handovers: Default::default(),
            line,
            wake,
        }))
    }

    /// The settings checked, before anything connects: the drift factor (a plain zero for
    /// -0.0) and the owner label to use.
    fn checked(&self) -> Result<(f64, String)> {
        if self.nodes.is_empty() {
            return Err(InvalidInput::NoNodes.into());
        }
        if !(self.drift_factor.is_finite() && (0.0..0.5).contains(&self.drift_factor)) {
            return Err(InvalidInput::DriftFactor(self.drift_factor).into());
        }
        // -0.0 is in range; make it a plain zero.
        let drift_factor = self.drift_factor.abs();
        if let Some(c) = self.confirm {
            let reason = if c.replicas == 0 && !c.fsync {
                Some("0 replicas confirm nothing: leave confirm_replicas unset".to_string())
            } else if c.timeout.is_zero() {
                Some("a timeout of zero would make WAIT block until enough replicas answer".into())
            } else if c.timeout > MAX_NODE_TIMEOUT {
                Some(format!(
                    "timeout {:?} is too large (at most 1 hour)",
                    c.timeout
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(InvalidInput::ConfirmReplicas { reason }.into());
            }
        }
        self.retry.validate()?;
        let label = match &self.owner_label {
            Some(label) => {
                crate::base::owner::check_label(label)?;
                label.clone()
            }
            None => crate::base::owner::default_label(),
        };
        match self.node_timeout {
            Some(t) if t.is_zero() => return Err(InvalidInput::ZeroNodeTimeout.into()),
            Some(t) if t > MAX_NODE_TIMEOUT => {
                return Err(InvalidInput::NodeTimeoutTooLarge(t).into())
            }
            _ => {}
        }
        Ok((drift_factor, label))
    }
}

/// One node per spec, not connected yet; a client without a reconnect policy or an address
/// listed twice is refused.
fn create_nodes(
    specs: Vec<NodeSpec>,
    servers: &Arc<Servers>,
    node_timeout: Option<Duration>,
    confirm: Option<Confirm>,
) -> Result<Vec<Node>> {
    let mut nodes: Vec<Node> = Vec::with_capacity(specs.len());
    // A `WAIT` blocks its connection for up to its timeout: no stall before that.
    let node_timeout = match confirm {
        Some(c) => Some(
            node_timeout
                .unwrap_or(Duration::ZERO)
                .saturating_add(c.timeout),
        ),
        None => node_timeout,
    };
    for (index, spec) in specs.into_iter().enumerate() {
        let node = match spec {
            NodeSpec::Url(url) => Node::from_url(index, &url, servers.clone(), node_timeout)?,
            NodeSpec::Client(client) => {
                if client.client_reconnect_policy().is_none() {
                    return Err(InvalidInput::NoReconnectPolicy { index }.into());
                }
                Node::from_client(index, client, servers.clone(), node_timeout)
            }
        };
        if confirm.is_some() && node.is_cluster() {
            return Err(InvalidInput::ConfirmReplicas {
                reason: format!("node {index} ({}) is a Redis Cluster", node.name),
            }
            .into());
        }
        let mut node = node;
        node.confirm = confirm;
        // The same address is the same server, whatever the database index.
        if let Some(first) = nodes.iter().position(|n| n.addr == node.addr) {
            return Err(duplicate(first, &nodes[first], index, &node, String::new()));
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// Aliases (localhost / an IP / a DNS name) only show once connected: same run_id.
fn no_aliases(nodes: &[Arc<Node>]) -> Result<()> {
    for (second, node) in nodes.iter().enumerate() {
        if let Identity::Duplicate { of, run_id, .. } = &*node.state.identity.borrow() {
            let how = format!(" (same run_id {run_id})");
            return Err(duplicate(*of, &nodes[*of], second, node, how));
        }
    }
    Ok(())
}

/// [`Error::Connect`] when fewer than `q` nodes count and `strict` (`require_quorum`), or when
/// so many nodes refused the credentials that no quorum is left.
fn enough_connected(nodes: &[Arc<Node>], q: usize, strict: bool, waited: Duration) -> Result<()> {
    let down: Vec<NodeError> = nodes
        .iter()
        .filter(|n| n.state.counts().is_err())
        .map(|n| {
            n.state.cause().unwrap_or_else(|| NodeError {
                node: n.name.clone(),
                kind: NodeErrorKind::Connection,
                message: "still connecting".into(),
            })
        })
        .collect();
    // Each node that does not count was logged (WARN) by its connection, once.
    let connected = nodes.len() - down.len();
    // Credentials refused by too many nodes will not fix themselves: fail at once, also
    // without `require_quorum`, instead of failing every acquire.
    let refused = down
        .iter()
        .filter(|e| e.kind == NodeErrorKind::Auth)
        .count();
    if (connected < q && strict) || nodes.len() - refused < q {
        return Err(Error::Connect {
            nodes: nodes.len(),
            quorum: q,
            connected,
            waited,
            failures: down,
        });
    }
    Ok(())
}

/// The nodes where no lock can ever be granted (this user may not run scripts, and the server
/// has no native compare-and-delete: a key set there could be neither released nor extended),
/// each logged at WARN; [`Error::NotPermitted`] when they leave fewer than a quorum.
fn no_lock(nodes: &[Arc<Node>], quorum: usize) -> Option<Error> {
    let failures: Vec<NodeError> = nodes
        .iter()
        .filter_map(|n| {
            let message = n.state.caps.no_lock()?;
            tracing::warn!(node = %n.name, "fredlock: no lock can be taken on this node: {message}");
            Some(NodeError {
                node: n.name.clone(),
                kind: NodeErrorKind::Permission,
                message,
            })
        })
        .collect();
    (nodes.len() - failures.len() < quorum).then(|| Error::NotPermitted {
        subject: "every lock".into(),
        nodes: nodes.len(),
        quorum,
        failures,
    })
}

fn duplicate(first: usize, a: &Node, second: usize, b: &Node, how: String) -> Error {
    Error::InvalidInput(InvalidInput::DuplicateNode {
        first,
        first_node: a.name.clone(),
        second,
        second_node: b.name.clone(),
        how,
    })
}

/// Waits until a quorum of nodes is connected and identified, then gives the others only
/// [`CONNECT_GRACE`] more; never longer than `wait` in all (`Duration::MAX`: no limit). As
/// soon as so many nodes refuse the credentials that no quorum can connect (an answer that is
/// final), the others get the same grace. Returns how long it waited.
async fn wait_for_quorum(nodes: &[Arc<Node>], wait: Duration) -> Duration {
    use futures::stream::{FuturesUnordered, StreamExt};
    let started = tokio::time::Instant::now();
    let q = quorum::quorum(nodes.len());
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .map(|n| crate::nodes::node_status::up_or_refused(&n.state))
        .collect();
    let (mut connected, mut refused) = (0, 0);
    // `None`: no limit.
    let mut until = started.checked_add(wait);
    loop {
        let next = match until {
            Some(t) => match tokio::time::timeout_at(t, pending.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
            None => pending.next().await,
        };
        match next {
            None => break,
            Some(true) => connected += 1,
            Some(false) => refused += 1,
        }
        // Either answer is known once a quorum has connected or can no longer connect: the
        // others get a grace to end their first attempts, so that the error names their causes.
        if connected >= q || nodes.len() - refused < q {
            let grace = tokio::time::Instant::now() + CONNECT_GRACE;
            until = Some(until.map_or(grace, |u| u.min(grace)));
        }
    }
    started.elapsed()
}

/// Once a quorum is connected, how much longer `build()` waits for the other nodes' first
/// connection attempts (a node that accepts TCP but never answers would otherwise hold it up).
pub const CONNECT_GRACE: Duration = Duration::from_millis(100);
