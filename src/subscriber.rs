//! One subscriber connection per node per Redlock, shared by all its waiters: it keeps the
//! channels the waiters need subscribed, and hands every release message to the waiters'
//! registry (`waiters`), which decides whom it wakes.
//!
//! Started lazily by the first acquire that has to wait, so a Redlock whose acquires never wait
//! opens no extra connection. A channel is the lock key itself (a release publishes its token on
//! it, see `scripts::RELEASE_WAKE`); it stays subscribed for [`LINGER`] after its last waiter
//! left, so that a key contended now and then does not pay a SUBSCRIBE and an UNSUBSCRIBE per
//! wait.
//!
//! Faults: when a subscriber connection drops, its subscriptions stop counting at once (waiters
//! whose channels lose coverage poll at the retry pace); fred reconnects it, the channels are
//! subscribed again, and a channel whose coverage comes back wakes one waiter (messages may have
//! been lost meanwhile). A node that never answers only leaves its subscriptions unconfirmed;
//! the waiters' fallback timer covers what no message reports (an expired holder, a lost
//! message). Redis Cluster nodes have no subscriber (a script's PUBLISH would be broadcast over
//! the whole cluster bus): their waiters rely on the other nodes' messages, or poll.
//!
//! Owns: the subscriber connections, SUBSCRIBE/UNSUBSCRIBE, turning connection events into
//! coverage changes. Must not: decide whom a message wakes (waiters) or send lock commands.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::prelude::{Config, Options};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::connection::classify;
use crate::node::{Client, Node};
use crate::waiters::Registry;

/// How long a channel stays subscribed after its last waiter left.
pub(crate) const LINGER: Duration = Duration::from_secs(5);
/// Bound on one SUBSCRIBE or UNSUBSCRIBE round trip.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Messages fred may queue for this task before it counts them as lost.
const QUEUE: usize = 4096;

/// The subscriber connections of one Redlock and the registry of its waiters.
pub(crate) struct Subscribers {
    registry: Arc<Registry>,
    /// Per node: its name and the configuration to connect with (`None`: no subscriber).
    nodes: Vec<Option<(String, Config)>>,
    tasks: Mutex<Option<Vec<JoinHandle<()>>>>,
    closed: watch::Sender<bool>,
}

impl std::fmt::Debug for Subscribers {
    // A node's configuration may carry its password: names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<Option<&str>> = self
            .nodes
            .iter()
            .map(|n| n.as_ref().map(|(name, _)| name.as_str()))
            .collect();
        f.debug_struct("Subscribers")
            .field("nodes", &nodes)
            .finish()
    }
}

impl Subscribers {
    /// Subscribers for `nodes`, or `None` when too few of them can have one for a channel ever
    /// to be covered (then waiters poll, and releases publish nothing).
    pub(crate) fn new(nodes: &[Node], quorum: usize) -> Option<Subscribers> {
        let configs: Vec<Option<(String, Config)>> = nodes
            .iter()
            .map(|n| n.subscriber_config().map(|c| (n.name.clone(), c)))
            .collect();
        let capable = configs.iter().filter(|c| c.is_some()).count();
        let needed = nodes.len().saturating_sub(quorum).saturating_add(1);
        if capable < needed {
            return None;
        }
        Some(Subscribers {
            registry: Arc::new(Registry::new(nodes.len(), quorum)),
            nodes: configs,
            tasks: Mutex::new(None),
            closed: watch::Sender::new(false),
        })
    }

    /// Whether node `index` has a subscriber (so its releases should publish).
    pub(crate) fn listens_to(&self, index: usize) -> bool {
        self.nodes.get(index).is_some_and(Option::is_some)
    }

    /// The waiters' registry.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A release of `token` on `key` was just handed to every node's connection: wakes a waiter
    /// of this Redlock at once, without waiting for the nodes' messages (which then count as
    /// repeats). Its attempt's commands queue behind the release on each connection, so they
    /// land after it. Starts nothing.
    pub(crate) fn released(&self, key: &str, token: &str) {
        self.registry.dispatch(key, token);
    }

    /// Starts the subscriber connections (once; later calls do nothing). Needs a tokio runtime.
    pub(crate) fn start(&self) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if tasks.is_some() || *self.closed.borrow() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let spawned = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.clone().map(|(name, config)| (i, name, config)))
            .map(|(i, name, config)| {
                let task = Task {
                    node: i,
                    name,
                    registry: self.registry.clone(),
                    closed: self.closed.subscribe(),
                };
                rt.spawn(task.run(config))
            })
            .collect();
        *tasks = Some(spawned);
    }

    /// `token` is a failed attempt's, about to be cleaned up: its release messages wake nobody
    /// here.
    pub(crate) fn own_cleanup(&self, token: &str) {
        self.registry.quiet(token);
    }

    /// Stops every subscriber connection (QUIT) and waits for it. Waiters left fall back to
    /// polling (their commands fail anyway once the Redlock is closed).
    pub(crate) async fn close(&self) {
        self.closed.send_replace(true);
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for Subscribers {
    fn drop(&mut self) {
        // The tasks quit their connections when they see this.
        self.closed.send_replace(true);
    }
}

/// A fred client for a subscriber connection: fredlock's usual settings (see
/// `connection::client`), with room for a burst of messages.
fn client(config: Config) -> Result<Client, fred::error::Error> {
    let mut builder = crate::connection::builder(config, 10_000);
    builder.with_performance_config(|p| p.broadcast_channel_capacity = QUEUE);
    builder.build()
}

fn options() -> Options {
    Options {
        timeout: Some(COMMAND_TIMEOUT),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
    }
}

/// One node's subscriber: connects, keeps the wanted channels subscribed, dispatches messages.
struct Task {
    node: usize,
    name: String,
    registry: Arc<Registry>,
    closed: watch::Receiver<bool>,
}

impl Task {
    async fn run(mut self, config: Config) {
        let client = match client(config) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node = %self.name, cause = %classify(&e).1, "fredlock: cannot create the subscriber connection; waiters on this node poll");
                self.registry.set_up(self.node, false);
                return;
            }
        };
        let mut closed = self.closed.clone();
        tokio::select! {
            connected = self.serve(&client) => {
                if connected {
                    let _ = tokio::time::timeout(COMMAND_TIMEOUT, client.quit()).await;
                }
            }
            () = async { let _ = closed.wait_for(|c| *c).await; } => {
                if client.is_connected() {
                    let _ = tokio::time::timeout(COMMAND_TIMEOUT, client.quit()).await;
                }
            }
        }
        self.registry.set_up(self.node, false);
        self.registry.lost(self.node);
    }

    /// Returns whether it ever connected (so the client must be quit).
    async fn serve(&mut self, client: &Client) -> bool {
        use tokio::sync::broadcast::error::RecvError;
        let mut messages = client.message_rx();
        let mut reconnects = client.reconnect_rx();
        let mut errors = client.error_rx();
        let mut wanted = self.registry.wanted_changes();
        let mut backoff = Duration::from_millis(50);
        let mut warned = false;
        loop {
            match client.init().await {
                Ok(_) => break,
                Err(e) => {
                    self.registry.set_up(self.node, false);
                    if !warned {
                        tracing::warn!(node = %self.name, cause = %classify(&e).1, "fredlock: subscriber connection failed; retrying (waiters poll meanwhile)");
                        warned = true;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        self.registry.set_up(self.node, true);
        let mut subscribed: HashSet<String> = HashSet::new();
        // Set by a connection error: the next reconnect event means "subscribe again".
        let mut dropped = false;
        let mut retry_at: Option<Instant> = None;
        // The subscriptions may differ from the wanted channels (checked only then: not on
        // every message); `full`: compare with every wanted channel, not just the changes.
        let mut dirty = true;
        let mut full = true;
        let mut sweep = tokio::time::interval(LINGER / 2);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if dirty && retry_at.is_none_or(|t| Instant::now() >= t) {
                retry_at = None;
                dirty = false;
                if let Err(e) = self
                    .sync(client, &mut subscribed, std::mem::take(&mut full))
                    .await
                {
                    tracing::debug!(node = %self.name, cause = %classify(&e).1, "fredlock: subscribing failed; retrying");
                    dirty = true;
                    full = true;
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                } else {
                    backoff = Duration::from_millis(50);
                }
            }
            let retry = async {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                m = messages.recv() => match m {
                    Ok(message) => {
                        if let Some(token) = message.value.as_str() {
                            self.registry.dispatch(&message.channel, &token);
                        }
                    }
                    Err(RecvError::Lagged(_)) => self.registry.overflowed(),
                    Err(RecvError::Closed) => return true,
                },
                e = errors.recv() => {
                    if let Ok((e, _)) = &e {
                        tracing::debug!(node = %self.name, cause = %classify(e).1, "fredlock: subscriber connection error");
                    }
                    if matches!(e, Err(RecvError::Closed)) {
                        return true;
                    }
                    // Messages published from now until we are subscribed again are lost.
                    dropped = true;
                    dirty = true;
                    full = true;
                    subscribed.clear();
                    self.registry.lost(self.node);
                    self.registry.set_up(self.node, false);
                }
                r = reconnects.recv() => {
                    if matches!(r, Err(RecvError::Closed)) {
                        return true;
                    }
                    if dropped || matches!(r, Err(RecvError::Lagged(_))) {
                        dropped = false;
                        dirty = true;
                        full = true;
                        subscribed.clear();
                        self.registry.lost(self.node);
                        self.registry.set_up(self.node, true);
                        retry_at = None;
                    }
                }
                c = wanted.changed() => {
                    if c.is_err() {
                        return true;
                    }
                    dirty = true;
                }
                _ = sweep.tick() => {
                    // Removing channels bumps `wanted`, which marks the set dirty.
                    self.registry.sweep(Instant::now(), LINGER);
                }
                () = retry => {}
            }
        }
    }

    /// Subscribes the wanted channels not subscribed yet, unsubscribes those no longer wanted,
    /// and confirms the rest (an entry re-created while its subscription stood). `full`:
    /// against every wanted channel (after a reconnect or a failure), else against the changes
    /// since the last call (a waiter per new key must not cost a pass over every channel).
    async fn sync(
        &self,
        client: &Client,
        subscribed: &mut HashSet<String>,
        full: bool,
    ) -> Result<(), fred::error::Error> {
        let (want, gone): (Vec<String>, Vec<String>) = if full {
            let wanted = self.registry.wanted(self.node);
            let keep: HashSet<&String> = wanted.iter().collect();
            let gone = subscribed
                .iter()
                .filter(|c| !keep.contains(c))
                .cloned()
                .collect();
            (wanted, gone)
        } else {
            self.registry.changes(self.node)
        };
        let gone: Vec<String> = gone.into_iter().filter(|g| subscribed.remove(g)).collect();
        if !gone.is_empty() {
            client.with_options(&options()).unsubscribe(gone).await?;
        }
        let (standing, new): (Vec<String>, Vec<String>) =
            want.into_iter().partition(|c| subscribed.contains(c));
        if !standing.is_empty() {
            self.registry.confirm(self.node, &standing);
        }
        if !new.is_empty() {
            // One SUBSCRIBE for all: Redis subscribes them in one go, and its first
            // confirmation (the one fred waits for) comes after all of them took effect.
            client
                .with_options(&options())
                .subscribe(new.clone())
                .await?;
            subscribed.extend(new.iter().cloned());
            self.registry.confirm(self.node, &new);
        }
        Ok(())
    }
}
