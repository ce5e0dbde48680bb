//! One subscriber connection per node per Redlock, shared by all its waiters, subscribed to ONE
//! channel: this Redlock's own wake-up channel (see `line`). A release script on a gate node
//! publishes there when it hands the lock to one of our waiters; the message names the waiter,
//! and [`Line::dispatch`] wakes it. The number of keys waited on changes nothing here: no
//! SUBSCRIBE per key, no message to anyone else.
//!
//! Started lazily by the first acquire that has to wait, so a Redlock whose acquires never wait
//! opens no extra connection.
//!
//! Faults: when a subscriber connection drops, the node counts as down at once (waiters whose
//! gate it is probe at the retry pace); fred reconnects it, the channel is subscribed again,
//! and coming back up wakes every waiter once (messages may have been lost meanwhile). Redis
//! Cluster nodes have no subscriber; their lines still work, their waiters probe.
//!
//! Owns: the subscriber connections, SUBSCRIBE, turning connection events into liveness.
//! Must not: decide whom a message wakes (the release script did) or send lock commands.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::prelude::{Config, Options};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::base::line::Line;
use crate::nodes::connection::classify;
use crate::nodes::node::{Client, Node};

/// Bound on one SUBSCRIBE round trip.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Messages fred may queue for this task before it counts them as lost.
const QUEUE: usize = 4096;

/// The subscriber connections of one Redlock.
pub(crate) struct Subscribers {
    line: Arc<Line>,
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
    /// Subscribers for the nodes that can have one (single servers), or `None` when none can.
    pub(crate) fn new(nodes: &[Node], line: Arc<Line>) -> Option<Subscribers> {
        let configs: Vec<Option<(String, Config)>> = nodes
            .iter()
            .map(|n| n.subscriber_config().map(|c| (n.name.clone(), c)))
            .collect();
        if configs.iter().all(Option::is_none) {
            return None;
        }
        Some(Subscribers {
            line,
            nodes: configs,
            tasks: Mutex::new(None),
            closed: watch::Sender::new(false),
        })
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
                    line: self.line.clone(),
                    closed: self.closed.subscribe(),
                };
                rt.spawn(task.run(config))
            })
            .collect();
        *tasks = Some(spawned);
    }

    /// Stops every subscriber connection (QUIT) and waits for it.
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
    let mut builder = crate::nodes::connection::builder(config, 10_000);
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

/// One node's subscriber: connects, keeps the channel subscribed, dispatches messages.
struct Task {
    node: usize,
    name: String,
    line: Arc<Line>,
    closed: watch::Receiver<bool>,
}

impl Task {
    async fn run(mut self, config: Config) {
        let client = match client(config) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node = %self.name, cause = %classify(&e).1, "fredlock: cannot create the subscriber connection; waiters whose gate this node is poll");
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
        self.line.set_up(self.node, false);
    }

    /// Returns whether it ever connected (so the client must be quit).
    async fn serve(&mut self, client: &Client) -> bool {
        use tokio::sync::broadcast::error::RecvError;
        let mut messages = client.message_rx();
        let mut reconnects = client.reconnect_rx();
        let mut errors = client.error_rx();
        let mut backoff = Duration::from_millis(50);
        let mut warned = false;
        while let Err(e) = client.init().await {
            if !warned {
                tracing::warn!(node = %self.name, cause = %classify(&e).1, "fredlock: subscriber connection failed; retrying (waiters poll meanwhile)");
                warned = true;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        let channel = self.line.channel();
        // Set by a connection error: the next reconnect event means "subscribe again".
        let mut dropped = false;
        let mut subscribed = false;
        backoff = Duration::from_millis(50);
        loop {
            if !subscribed && !dropped {
                match client
                    .with_options(&options())
                    .subscribe(channel.as_str())
                    .await
                {
                    Ok(()) => {
                        subscribed = true;
                        backoff = Duration::from_millis(50);
                        self.line.set_up(self.node, true);
                    }
                    Err(e) => {
                        tracing::debug!(node = %self.name, cause = %classify(&e).1, "fredlock: subscribing failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                        continue;
                    }
                }
            }
            tokio::select! {
                biased;
                m = messages.recv() => match m {
                    Ok(message) => {
                        if message.channel == channel.as_str() {
                            if let Some(payload) = message.value.as_str() {
                                self.line.dispatch(&payload);
                            }
                        }
                    }
                    // Messages lost: as after a reconnect, every waiter probes once.
                    Err(RecvError::Lagged(_)) => {
                        self.line.set_up(self.node, false);
                        self.line.set_up(self.node, true);
                    }
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
                    subscribed = false;
                    self.line.set_up(self.node, false);
                }
                r = reconnects.recv() => {
                    if matches!(r, Err(RecvError::Closed)) {
                        return true;
                    }
                    dropped = false;
                    subscribed = false;
                    self.line.set_up(self.node, false);
                }
            }
        }
    }
}
