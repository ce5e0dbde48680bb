//! A Redlock node that is a Redis Cluster (or a Valkey cluster): fredlock routes each command
//! to the shard that owns its key's slot itself, over one fred client per shard primary, and
//! follows `MOVED` and `ASK` redirects.
//!
//! Why not fred's own cluster client (measured against redis-server 7.0.15 and fred 10.1): with
//! one attempt per command, which a lock needs (a `SET NX` is never replayed), fred answers a
//! `MOVED` with "Too many failed write attempts.", the same words it uses for a command that was
//! written and then caught by a reconnect (whose outcome is unknown), so the two cannot be told
//! apart; it routes `EVAL`/`EVALSHA` custom commands by the script instead of the key; an `ASK`
//! ends its routing task for good (every later command times out); and one shard down fails
//! every slot. Here:
//! - a redirect is an error reply: the command was executed nowhere, so it is sent again to the
//!   shard named (for `ASK`: `ASKING` and the command pipelined on one connection), at most
//!   [`MAX_REDIRECTS`] times and within the command's own timeout. Any other failure is returned
//!   as it is, never retried;
//! - a shard that is down fails only the keys of its slots;
//! - the slot table comes from `CLUSTER SLOTS`: at start, after a `MOVED` (which also patches
//!   that slot at once), and after a shard's connection failed (a failover may have moved slots);
//! - the node's identity is the smallest node id in the cluster, so one cluster listed twice
//!   votes once.
//!
//! Owns: the slot table, the shard clients and redirects. Must not: decode lock replies or
//! count votes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use fred::clients::{Client, Pipeline};
use fred::prelude::{ClientLike, Config, Server, ServerConfig, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::Notify;

use crate::base::error::{NodeError, NodeErrorKind};
use crate::base::slots;
use crate::nodes::connection::{self, options, Link, Servers, State};
use crate::nodes::topology::{host_of, parse_slots, redirect, Redirect, Table, Topology};

/// Redirects followed for one command before giving up (a resharding moves a slot once).
pub(crate) const MAX_REDIRECTS: usize = 5;

tokio::task_local! {
    /// The token whose keys the commands sent from this future may create (see [`creating`]).
    static CREATES: Arc<str>;
}

/// Runs `f`, an acquire on a cluster node, so that its commands record where they were sent:
/// a release of the same token can then tell whether the connection's order covers it
/// ([`Shards::call`]).
pub(crate) async fn creating<F: std::future::Future>(token: &str, f: F) -> F::Output {
    CREATES.scope(Arc::from(token), f).await
}

/// The key-creating work of one token on this node (see [`Shards::begin`]).
#[derive(Default)]
struct Running {
    /// Live [`Inflight`] guards.
    guards: usize,
    /// Each key-creating command sent so far, by id, and where it is.
    placed: Vec<(u64, Place)>,
    settled: Arc<Notify>,
}

/// Where one key-creating command is.
#[derive(Debug, Clone, PartialEq)]
enum Place {
    /// Waiting for a connection, or following a redirect.
    Waiting,
    /// Queued on the connection of this shard (`host:port`).
    Queued(String),
    /// Answered by the server: whatever it did is done, so any command sent now lands after it
    /// (kept until the token's last guard goes: its acquire may still be between this answer
    /// and its end, on another thread).
    Answered,
}

/// One shard primary.
struct Shard {
    /// `host:port`, as the cluster names it.
    addr: String,
    client: Client,
    state: Arc<State>,
}

/// The shards of one cluster node.
pub(crate) struct Shards {
    index: usize,
    /// The node's name, safe to log.
    node: String,
    /// The node's configuration (credentials, TLS); each shard's is this with one server.
    template: Config,
    seeds: Vec<String>,
    table: RwLock<Arc<Table>>,
    shards: Mutex<HashMap<String, Arc<Shard>>>,
    refresh: Notify,
    /// The node's state (link, identity, cause), shared with `node`.
    state: Arc<State>,
    /// Commands that may create keys, by token, still running (see [`Shards::settled`]).
    inflight: Mutex<HashMap<String, Running>>,
    /// Ids of key-creating commands ([`Running::placed`]).
    next_id: std::sync::atomic::AtomicU64,
}

/// Marks a key-creating command of one token as running until dropped.
pub(crate) struct Inflight<'a> {
    shards: &'a Shards,
    token: String,
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut map = self.shards.lock_inflight();
        if let Some(running) = map.get_mut(&self.token) {
            running.guards -= 1;
            if running.guards == 0 {
                running.settled.notify_waiters();
                map.remove(&self.token);
            }
        }
    }
}

/// Where one key-creating command is queued, while it runs (see [`Running::placed`]).
struct Placement<'a> {
    shards: &'a Shards,
    token: Arc<str>,
    id: u64,
}

impl Placement<'_> {
    fn at(&self, place: Place) {
        let mut map = self.shards.lock_inflight();
        if let Some(running) = map.get_mut(&*self.token) {
            if let Some(entry) = running.placed.iter_mut().find(|(id, _)| *id == self.id) {
                entry.1 = place;
            }
        }
    }
}

impl Drop for Placement<'_> {
    /// A command dropped unanswered is forgotten (nothing to wait for if it never left; if it
    /// did, the guard still running covers it); an answered one stays (see [`Place::Answered`]).
    fn drop(&mut self) {
        let mut map = self.shards.lock_inflight();
        if let Some(running) = map.get_mut(&*self.token) {
            running
                .placed
                .retain(|(id, at)| *id != self.id || *at == Place::Answered);
        }
    }
}

impl Shards {
    /// Shards for a cluster configuration; nothing connects before [`spawn`](Self::spawn).
    pub(crate) fn new(index: usize, node: String, template: Config, state: Arc<State>) -> Shards {
        let seeds = match &template.server {
            ServerConfig::Clustered { hosts, .. } => hosts
                .iter()
                .map(|s| format!("{}:{}", s.host, s.port))
                .collect(),
            _ => Vec::new(),
        };
        Shards {
            index,
            node,
            template,
            seeds,
            table: RwLock::new(Arc::new(Table::default())),
            shards: Mutex::new(HashMap::new()),
            refresh: Notify::new(),
            state,
            inflight: Mutex::new(HashMap::new()),
            next_id: Default::default(),
        }
    }

    fn lock_inflight(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a command that may create `token`'s keys as running. A redirect breaks the order a
    /// single connection gives (a `SET` answered `ASK` may reach the target after a release that
    /// was sent later), so a release first waits for these ([`settled`](Self::settled)).
    pub(crate) fn begin(&self, token: &str) -> Inflight<'_> {
        let mut map = self.lock_inflight();
        map.entry(token.to_string()).or_default().guards += 1;
        Inflight {
            shards: self,
            token: token.to_string(),
        }
    }

    /// Waits (at most `within`) until no command that may create `token`'s keys is running
    /// here, so that a release lands after them.
    pub(crate) async fn settled(&self, token: &str, within: Duration) {
        let _ = tokio::time::timeout(within, async {
            loop {
                let Some(notify) = self.lock_inflight().get(token).map(|r| r.settled.clone())
                else {
                    return;
                };
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !self.lock_inflight().contains_key(token) {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }

    /// Registers a key-creating command of `token` (not placed yet); `None` when the token has
    /// no [`Inflight`] guard here (nothing waits on it).
    fn place(&self, token: Arc<str>) -> Option<Placement<'_>> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut map = self.lock_inflight();
        map.get_mut(&*token)?.placed.push((id, Place::Waiting));
        Some(Placement {
            shards: self,
            token,
            id,
        })
    }

    /// Whether a command sent now to `shard` lands after every key-creating command of
    /// `token`: none is running, or each is answered or queued on that shard's connection.
    fn behind(&self, token: &str, shard: &str) -> bool {
        match self.lock_inflight().get(token) {
            None => true,
            Some(running) => {
                !running.placed.is_empty()
                    && running.placed.iter().all(|(_, at)| match at {
                        Place::Waiting => false,
                        Place::Queued(addr) => addr == shard,
                        Place::Answered => true,
                    })
            }
        }
    }

    /// Starts the topology loop: reads the slot table (retrying with backoff until a seed
    /// answers), identifies the node, then re-reads the table whenever asked. Never waits.
    pub(crate) fn spawn(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.run() => {}
                () = this.state.closed() => {}
            }
        });
    }

    async fn run(&self) {
        let mut backoff = Duration::from_millis(50);
        let mut warned = false;
        let mut replicas_warned = false;
        loop {
            match self.load().await {
                Ok(topology) => {
                    *self.table.write().unwrap_or_else(|p| p.into_inner()) =
                        Arc::new(topology.table);
                    if topology.replicas > 0 && !replicas_warned {
                        replicas_warned = true;
                        tracing::warn!(node = %self.node, replicas = topology.replicas, "fredlock: this cluster node has replicas; a failover to a replica can lose lock keys (replication is asynchronous), like a restart without data");
                    }
                    self.state.identified(format!("cluster:{}", topology.id));
                    backoff = Duration::from_millis(50);
                    self.refresh.notified().await;
                    // Several shards failing at once ask once.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    if !warned {
                        warned = true;
                        tracing::warn!(node = %self.node, kind = %e.kind, cause = %e.message, "fredlock: cannot read the cluster's slot table; retrying in the background");
                    }
                    self.state.failed(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Stops every shard's connect loop and quits the shard clients (after their queued
    /// commands).
    pub(crate) async fn close(&self) {
        let shards: Vec<Arc<Shard>> = self.lock_shards().drain().map(|(_, s)| s).collect();
        let quits = shards.iter().map(|s| async move {
            s.state.close();
            if s.state.started() {
                let _ = s.client.quit().await;
            }
        });
        futures::future::join_all(quits).await;
    }

    /// Closes without waiting (from a `Drop`).
    pub(crate) fn close_now(&self) {
        let shards: Vec<Arc<Shard>> = self.lock_shards().drain().map(|(_, s)| s).collect();
        for s in shards {
            s.state.close();
            if s.state.started() {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = s.client.quit().await;
                    });
                }
            }
        }
    }

    fn lock_shards(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Shard>>> {
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client of the primary at `addr`, created (and its connect loop started) on first use.
    fn shard(&self, addr: &str) -> Result<Arc<Shard>, NodeError> {
        let mut shards = self.lock_shards();
        if let Some(shard) = shards.get(addr) {
            return Ok(shard.clone());
        }
        if self.state.is_closed() {
            return Err(self.node_error(NodeErrorKind::Connection, "closed".into()));
        }
        let Some((host, port)) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        else {
            return Err(self.node_error(
                NodeErrorKind::UnexpectedReply,
                format!("the cluster named a shard at {addr:?}, which is not host:port"),
            ));
        };
        let mut config = self.template.clone();
        config.server = ServerConfig::Centralized {
            server: Server::new(host, port),
        };
        let client = connection::client(config).map_err(|e| {
            self.node_error(
                NodeErrorKind::Client,
                format!("shard {addr}: {}", e.details()),
            )
        })?;
        let state = State::new(
            self.index,
            format!("{} shard {addr}", self.node),
            Arc::new(Servers::default()),
        );
        connection::spawn(client.clone(), state.clone(), None);
        let shard = Arc::new(Shard {
            addr: addr.to_string(),
            client,
            state,
        });
        shards.insert(addr.to_string(), shard.clone());
        Ok(shard)
    }

    /// Reads `CLUSTER SLOTS` from the first shard or seed that answers.
    async fn load(&self) -> Result<Topology, NodeError> {
        let mut candidates: Vec<String> = self
            .table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ranges
            .iter()
            .map(|(_, _, a)| a.clone())
            .collect();
        candidates.extend(self.seeds.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|a| seen.insert(a.clone()));
        let mut last = None;
        for addr in candidates {
            let shard = self.shard(&addr)?;
            if !ready(&shard, Duration::from_secs(2)).await {
                last = Some(shard.state.cause().map_or_else(
                    || {
                        self.node_error(
                            NodeErrorKind::Connection,
                            format!("shard {addr}: not connected"),
                        )
                    },
                    |c| self.node_error(c.kind, format!("shard {addr}: {}", c.message)),
                ));
                continue;
            }
            let command = CustomCommand::new_static("CLUSTER", ClusterHash::FirstKey, false);
            let reply = shard
                .client
                .with_options(&options(Duration::from_secs(2)))
                .custom::<Value, Value>(command, vec![Value::from("SLOTS")])
                .await;
            match reply {
                Ok(value) => match parse_slots(&value, host_of(&addr)) {
                    Some(topology) if !topology.table.ranges.is_empty() => return Ok(topology),
                    Some(_) => {
                        last = Some(self.node_error(
                            NodeErrorKind::Server,
                            format!("shard {addr}: CLUSTER SLOTS lists no slot yet (is the cluster formed?)"),
                        ))
                    }
                    None => {
                        last = Some(self.node_error(
                            NodeErrorKind::UnexpectedReply,
                            format!("shard {addr}: CLUSTER SLOTS answered {value:?}"),
                        ))
                    }
                },
                Err(e) => last = Some(self.shard_error(&shard, &e)),
            }
        }
        Err(last.unwrap_or_else(|| {
            self.node_error(NodeErrorKind::Client, "no seed address in the URL".into())
        }))
    }

    /// One command on the shard that owns `key`'s slot, following redirects. `args` are the
    /// command's arguments (the key among them); `timeout` bounds the whole exchange.
    ///
    /// `after`: a token whose key-creating commands must land first (a release). A send goes
    /// out at once when each of them is queued on the same shard connection (one connection
    /// keeps order), and otherwise waits until they have settled ([`settled`](Self::settled)):
    /// a `SET` redirected, or sent to the old owner just before a `MOVED` changed the table,
    /// travels on another connection than this release. Inside [`creating`], a command records
    /// where it is queued for those releases.
    pub(crate) async fn call(
        &self,
        cmd: &'static str,
        key: &str,
        args: Vec<Value>,
        timeout: Duration,
        after: Option<&str>,
    ) -> Result<Value, NodeError> {
        let start = Instant::now();
        let slot = slots::slot(key);
        let mut target = self.owner_of(slot, key)?;
        let mut asking = false;
        // A key-creating command of an acquire records where it is queued (see `behind`).
        let placement = match after {
            None => CREATES
                .try_with(Arc::clone)
                .ok()
                .and_then(|token| self.place(token)),
            Some(_) => None,
        };
        for _ in 0..=MAX_REDIRECTS {
            if timeout.saturating_sub(start.elapsed()).is_zero() {
                return Err(self.node_error(
                    NodeErrorKind::Timeout,
                    format!("slot {slot} (key {key:?}): no answer in time after a redirect"),
                ));
            }
            let shard = self.shard(&target)?;
            let left = self
                .wait_to_send(&shard, &target, after, start, timeout)
                .await?;
            let sent = send(&shard.client, cmd, args.clone(), left, asking);
            let e = match placed(sent, &shard, placement.as_ref()).await {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            (target, asking) = self.follow(&shard, slot, &e)?;
        }
        Err(self.node_error(
            NodeErrorKind::Server,
            format!("slot {slot} (key {key:?}): still redirected after {MAX_REDIRECTS} redirects (is a resharding looping?)"),
        ))
    }

    /// The shard the slot table names for `slot` (of `key`); without one, a table refresh is
    /// asked for and the command fails.
    fn owner_of(&self, slot: u16, key: &str) -> Result<String, NodeError> {
        let owner = self
            .table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .owner(slot)
            .map(str::to_string);
        owner.ok_or_else(|| {
            self.refresh.notify_one();
            self.node_error(
                NodeErrorKind::Connection,
                format!("no shard serves slot {slot} (of key {key:?}) in the slot table yet"),
            )
        })
    }

    /// Before a send to `shard` (at `target`): waits for its first connection and, for a
    /// release (`after`), for the token's key-creating commands its connection's order does not
    /// cover. Returns the budget left for the command, or a timeout when none is left.
    async fn wait_to_send(
        &self,
        shard: &Shard,
        target: &str,
        after: Option<&str>,
        start: Instant,
        timeout: Duration,
    ) -> Result<Duration, NodeError> {
        if *shard.state.link.borrow() == Link::Connecting {
            ready(shard, timeout.saturating_sub(start.elapsed())).await;
        }
        // A release must land after its token's key-creating commands on this node. One
        // connection's order guarantees that only for those queued on this shard's
        // connection already; others (redirected, sent to the old owner just before a
        // `MOVED` changed the table, or still waiting for a connection, where commands
        // wake in no fixed order) are waited for. A release of a lock that was held finds
        // nothing running and is sent in this same poll, ahead of a next acquire's SET.
        if let Some(token) = after {
            if !self.behind(token, &shard.addr) {
                self.settled(token, timeout.saturating_sub(start.elapsed()))
                    .await;
            }
        }
        // What the waits used is gone: the command must not outlive its call's budget (a
        // clean-up release waits for it only that long).
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(self.node_error(
                NodeErrorKind::Timeout,
                format!("shard {target}: not connected in time"),
            ));
        }
        Ok(left)
    }

    /// After an error reply from `shard`: where a redirect sends the command next (the shard
    /// and whether `ASKING` goes first); any other error is the command's answer.
    fn follow(
        &self,
        shard: &Shard,
        slot: u16,
        e: &fred::error::Error,
    ) -> Result<(String, bool), NodeError> {
        // Redis omits the host (`:7001`) when it does not know its own address.
        let redirect = redirect(e).map(|(kind, slot, addr)| match addr.starts_with(':') {
            true => (kind, slot, format!("{}{addr}", host_of(&shard.addr))),
            false => (kind, slot, addr),
        });
        match redirect {
            Some((Redirect::Moved, moved, addr)) => {
                tracing::debug!(node = %self.node, slot = moved, to = %addr, "MOVED");
                self.patch(moved, &addr);
                Ok((addr, false))
            }
            Some((Redirect::Ask, _, addr)) => {
                tracing::debug!(node = %self.node, slot, to = %addr, "ASK");
                Ok((addr, true))
            }
            None => {
                let error = self.shard_error(shard, e);
                if error.kind == NodeErrorKind::Connection {
                    // The shard may have failed over: read the table again.
                    self.refresh.notify_one();
                }
                Err(error)
            }
        }
    }

    /// A `MOVED`: the slot is served elsewhere from now on; read the whole table again.
    fn patch(&self, slot: u16, addr: &str) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        let mut next = Table {
            ranges: table.ranges.clone(),
            moved: table.moved.clone(),
        };
        next.moved.insert(slot, addr.to_string());
        *table = Arc::new(next);
        drop(table);
        self.refresh.notify_one();
    }

    fn node_error(&self, kind: NodeErrorKind, message: String) -> NodeError {
        NodeError {
            node: self.node.clone(),
            kind,
            message,
        }
    }

    /// A shard's failure in its own words, named by the node and the shard.
    fn shard_error(&self, shard: &Shard, e: &fred::error::Error) -> NodeError {
        let error = shard.state.error(e);
        self.node_error(
            error.kind,
            format!("shard {}: {}", shard.addr, error.message),
        )
    }
}

/// Waits up to `wait` for a new shard client's first connection attempt; true when connected.
async fn ready(shard: &Shard, wait: Duration) -> bool {
    let mut rx = shard.state.link.subscribe();
    let _ = tokio::time::timeout(wait, rx.wait_for(|l| *l != Link::Connecting)).await;
    let up = *rx.borrow() == Link::Up;
    up
}

/// Runs `sending`, one attempt on `shard`; while it is queued on the shard's connection (after
/// its first poll handed it over), `placement` says so.
async fn placed<F: std::future::Future<Output = Result<Value, fred::error::Error>>>(
    sending: F,
    shard: &Shard,
    placement: Option<&Placement<'_>>,
) -> Result<Value, fred::error::Error> {
    let mut sending = std::pin::pin!(sending);
    // The first poll hands the command to the shard's connection.
    let reply = match futures::poll!(sending.as_mut()) {
        std::task::Poll::Ready(reply) => reply,
        std::task::Poll::Pending => {
            if let Some(placement) = placement {
                placement.at(Place::Queued(shard.addr.clone()));
            }
            sending.await
        }
    };
    if let Some(placement) = placement {
        // An error (a redirect among them) created nothing here; a resend is placed anew.
        placement.at(match reply {
            Ok(_) => Place::Answered,
            Err(_) => Place::Waiting,
        });
    }
    reply
}

/// One attempt; with `asking`, `ASKING` and the command pipelined so that nothing else runs on
/// that connection between them.
async fn send(
    client: &Client,
    cmd: &'static str,
    args: Vec<Value>,
    timeout: Duration,
    asking: bool,
) -> Result<Value, fred::error::Error> {
    let command = CustomCommand::new_static(cmd, ClusterHash::FirstKey, false);
    let options = options(timeout);
    if !asking {
        return Box::pin(
            client
                .with_options(&options)
                .custom::<Value, Value>(command, args),
        )
        .await;
    }
    let pipeline = Pipeline::from(client.with_options(&options));
    let asking = CustomCommand::new_static("ASKING", ClusterHash::FirstKey, false);
    let _: Value = pipeline.custom(asking, Vec::<Value>::new()).await?;
    let _: Value = pipeline.custom(command, args).await?;
    Box::pin(pipeline.last::<Value>()).await
}
