//! Observing an election from any process: who leads, pushed as it changes.
//!
//! An [`Observer`] keeps one subscriber connection per node (its own, separate from the lock
//! connections and from the waiters' subscribers) on the election record's channel. Every
//! claim, proclaim, extension, request to yield and resign publishes there the node's own view
//! of the election (the view a read returns: whether the lock holds the record's term, the
//! term, the value, the priority, the lock's TTL, a request to yield), written by the same
//! script that changed it. The observer keeps each node's latest view and names a leader only when a
//! quorum of them hold the same live term, as a read of every node does: so a change of leader
//! costs the observer no command at all, whatever the number of observers. A node's messages
//! arrive in the order it wrote; a duplicated one changes nothing. A view's TTL counts from the
//! message's arrival, so `Leader::valid_until` can be late by the message's time in transit
//! (from a read, it counts from before the read: never late). Anyone allowed to `PUBLISH` on
//! the channel could forge a view; it stands until the node's next message or the next read.
//!
//! The observer reads every node instead (once per burst of messages):
//! - at the start, and after a subscriber connection comes back (and is subscribed again) or
//!   messages were dropped;
//! - when a known view's lock may have expired by now (a live view past its TTL): the leader's
//!   extensions announce the new TTL on single servers, but not where scripts are denied or on
//!   a Redis Cluster node, and a message can be lost; likewise at the moment the term's keys
//!   expire at a quorum unless extended (the quorum-th longest TTL plus 1 ms), so a killed
//!   leader shows as `None` within its TTL of its last extension;
//! - on a message of an older version of this library (which says only "read again");
//! - on every message, while some node has no subscriber (a Redis Cluster node, or one whose
//!   subscriber connection never subscribed): that node's view would go stale; and then also
//!   while a term is live on some nodes but not on a quorum (its claim may still be on its way
//!   to a node that sends no views): again after 50 ms, doubling up to 2 s.
//!
//! While nothing changes, an observer sends nothing: every extension of the leader's lock
//! announces each node's view with its new TTL (one `PUBLISH` per node and extension, whatever
//! the number of observers), and without a leader there is nothing to wait for.
//!
//! Owns: the subscriber connections of observers, the read loop. Must not: write anything.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::prelude::{Config, Options};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::base::error::Result;
use crate::primitives::leader::{
    decode_announced, tally, ElectionState, Leader, NodeView, Stamped,
};
use crate::rounds::redlock::Redlock;

/// Bound on one SUBSCRIBE round trip, and on waiting for the subscriptions at start.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest pause between reads while too few nodes answer.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// First pause before reading again a term live on too few nodes (see `Reader::unsettled`).
const SETTLE_FIRST: Duration = Duration::from_millis(50);

/// Follows who leads an election ([`Redlock::observe`]); for processes that do not campaign as
/// well as for candidates. Dropping it closes its connections.
#[derive(Debug)]
pub struct Observer {
    leader: watch::Receiver<Option<Leader>>,
    state: watch::Receiver<ElectionState>,
    closed: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Observer {
    /// A receiver of every change of leader, term or value (`None`: no leader). Not woken by a
    /// mere extension of the same term. The receiver has already seen the current leader: its
    /// `borrow()` shows it (as [`current`](Self::current)), and its first `changed()` resolves
    /// at the next change after this call, never with the value already shown.
    pub fn watch(&self) -> watch::Receiver<Option<Leader>> {
        let mut rx = self.leader.clone();
        rx.mark_unchanged();
        rx
    }

    /// The leader as last read (`None`: no valid term, or no read reached a quorum yet).
    pub fn current(&self) -> Option<Leader> {
        self.leader.borrow().clone()
    }

    /// The full state as last read (leader's priority, a pending request to yield).
    pub(crate) fn state(&self) -> watch::Receiver<ElectionState> {
        self.state.clone()
    }

    /// Whether its read loop still runs (it ends with its runtime, or when closed).
    pub(crate) fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops observing and closes the connections (QUIT), waiting for them.
    ///
    /// Cancellation: dropping the future still stops it; the connections close in the
    /// background.
    pub async fn close(mut self) {
        self.closed.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

impl Redlock {
    /// Starts observing the election `resource`: [`Observer::watch`] then yields every change of
    /// leader, pushed by the nodes (see "Elections others can see" in docs/guide.md: a resign, a
    /// new term and a proclaim arrive within a round trip; a killed leader shows as `None` once
    /// its keys expire). Returns once the subscriptions are in place (on every node that answers
    /// within 2 s) and the first read is done, so [`Observer::current`] is right from the start.
    /// Must be called inside a tokio runtime.
    ///
    /// Redis Cluster nodes get no subscriber (their published messages go to every shard):
    /// with one among the nodes, the observer reads every node on each message of the others
    /// (once per burst), and at the expiry-time read.
    ///
    /// Errors: [`InvalidInput`](crate::InvalidInput) for an empty, reserved or too long name, at once.
    ///
    /// Cancellation: dropping the future closes what it opened.
    pub async fn observe(&self, resource: &str) -> Result<Observer> {
        self.observe_as(resource, None).await
    }

    /// [`observe`](Self::observe) for a campaign of `priority` (`Some`): it listens on the
    /// campaigns' channel, which hears only requests to yield and claims of a priority other
    /// than the last term's (not every claim, extension and resign: 64 waiting candidates
    /// are not woken 3 times per change of leader), and it skips the reads at the leader's
    /// expected expiry while the leader has that same priority and nobody asks to yield. The
    /// campaign only uses the leader's priority and the requests to yield, and a stale view of
    /// a leader of its own priority changes neither (the line's head notices an expired holder
    /// by itself); a candidate of higher priority reads the current term before it asks the
    /// leader to yield.
    pub(crate) async fn observe_as(
        &self,
        resource: &str,
        campaign: Option<u32>,
    ) -> Result<Observer> {
        self.check_election_name(resource)?;
        let (leader_tx, leader_rx) = watch::channel(None);
        let (state_tx, state_rx) = watch::channel(ElectionState::default());
        let (closed_tx, _) = watch::channel(false);
        let wake = Arc::new(Wake::default());
        // A campaign hears only what changes it (see `scripts::elect_lib`): a change of leader
        // among candidates of one priority wakes none of them.
        let channel = match campaign {
            None => self.election_key(resource),
            Some(_) => format!("{}|prio", self.election_key(resource)),
        };
        let (subscribed_tx, mut subscribed_rx) = watch::channel(0usize);
        let subscribed_tx = Arc::new(subscribed_tx);
        let mut subscribers = Vec::new();
        for (index, node) in self.inner.nodes.iter().enumerate() {
            if let Some(config) = node.subscriber_config() {
                let sub = Subscriber {
                    index,
                    node: node.name.clone(),
                    channel: channel.clone(),
                    wake: wake.clone(),
                    closed: closed_tx.subscribe(),
                    subscribed: subscribed_tx.clone(),
                };
                subscribers.push(tokio::spawn(sub.run(config)));
            }
        }
        let wanted = subscribers.len();
        let mut reader = Reader {
            redlock: self.clone(),
            resource: resource.to_string(),
            leader: leader_tx,
            state: state_tx,
            known: vec![None; self.inner.nodes.len()],
            subscribed: subscribed_rx.clone(),
            campaign,
            settle: SETTLE_FIRST,
        };
        // Wait for the subscriptions (bounded), then read once before handing it out.
        let _ =
            tokio::time::timeout(COMMAND_TIMEOUT, subscribed_rx.wait_for(|n| *n >= wanted)).await;
        let first = reader.read(&wake).await;
        let closed = closed_tx.subscribe();
        let task = tokio::spawn(reader.run(first, wake, closed, subscribers));
        Ok(Observer {
            leader: leader_rx,
            state: state_rx,
            closed: closed_tx,
            task: Some(task),
        })
    }
}

struct Reader {
    redlock: Redlock,
    resource: String,
    leader: watch::Sender<Option<Leader>>,
    state: watch::Sender<ElectionState>,
    /// Each node's latest view, from a read or from its messages (`None`: not known).
    known: Vec<Option<Stamped>>,
    /// How many nodes' subscriber connections have subscribed (once each).
    subscribed: watch::Receiver<usize>,
    /// The priority of the campaign this observer serves (see [`Redlock::observe_as`]).
    campaign: Option<u32>,
    /// The next pause before reading again a term live on too few nodes (see `unsettled`).
    settle: Duration,
}

impl Reader {
    /// One read of every node; returns when to read again without a message. Views that
    /// nodes announced while the read was under way are applied after it (a node's messages
    /// come in the order it wrote).
    async fn read(&mut self, wake: &Wake) -> std::result::Result<Option<Instant>, ()> {
        // What arrived before the read is older than what it finds.
        wake.apply_views(&mut self.known);
        match self.redlock.election_views(&self.resource).await {
            Ok(views) => {
                self.known = views;
                wake.apply_views(&mut self.known);
                let next = self.show();
                Ok(next.or_else(|| self.unsettled()))
            }
            Err(e) => {
                tracing::debug!(resource = %self.resource, error = %e, "fredlock: observer read failed");
                // Nobody can be named without a quorum once the last term's validity ran out.
                let stale = self
                    .leader
                    .borrow()
                    .as_ref()
                    .is_some_and(|l| Instant::now() >= l.valid_until);
                if stale {
                    self.publish(None);
                }
                Err(())
            }
        }
    }

    /// When to read again a term that some node shows live but not yet a quorum, while some
    /// node sends no views (a cluster node, a subscriber not up): its claim may still be on its
    /// way there (a read on the first node's message can overtake it), and no message would
    /// say when it lands. 50 ms, doubling up to [`MAX_BACKOFF`] while it stays so; `None`
    /// otherwise (every node announces its own changes).
    fn unsettled(&mut self) -> Option<Instant> {
        let partial = self.leader.borrow().is_none()
            && *self.subscribed.borrow() < self.known.len()
            && self.known.iter().flatten().any(|s| s.view.live);
        if !partial {
            self.settle = SETTLE_FIRST;
            return None;
        }
        let at = Instant::now() + self.settle;
        self.settle = (self.settle * 2).min(MAX_BACKOFF);
        Some(at)
    }

    /// Names the leader the known views show; returns when to read again without a message.
    fn show(&self) -> Option<Instant> {
        let mut state = tally(&self.known, self.redlock.inner.quorum);
        let quiet = self.campaign.is_some_and(|p| state.same_priority(p));
        let next = state.recheck_at.filter(|_| !quiet);
        if state.leader.is_none() {
            let before = self.state.borrow().vacant_since;
            state.vacant_since = before.or(Some(Instant::now()));
        }
        self.publish(state.leader.clone());
        self.state.send_replace(state);
        next
    }

    /// Whether the known views can name the leader without a read: every node has a
    /// subscriber (a Redis Cluster node or one whose subscriber never subscribed sends no
    /// views: its known view could be stale), a quorum of views known, none of them live past
    /// its earliest expiry (its holder may have extended it since: no message says so).
    fn enough(&self) -> bool {
        let now = Instant::now();
        let known = self.known.iter().flatten();
        *self.subscribed.borrow() >= self.known.len()
            && known.clone().count() >= self.redlock.inner.quorum
            && known
                .filter(|s| s.view.live)
                .all(|s| s.expires_from() > now)
    }

    /// Sends `leader` to the watchers when it is another leader, term or value; a new
    /// validity of the same term is stored without waking them.
    fn publish(&self, leader: Option<Leader>) {
        self.leader.send_if_modified(|cur| {
            let changed = !Leader::same(cur, &leader);
            *cur = leader;
            changed
        });
    }

    async fn run(
        mut self,
        first: std::result::Result<Option<Instant>, ()>,
        wake: Arc<Wake>,
        mut closed: watch::Receiver<bool>,
        subscribers: Vec<JoinHandle<()>>,
    ) {
        let mut backoff = Duration::from_millis(50);
        let mut next = first.unwrap_or_else(|()| Some(Instant::now() + backoff));
        loop {
            let timer = async {
                match next {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = closed.wait_for(|c| *c) => break,
                () = wake.notify.notified() => {
                    // A node's announced view is applied as it is; anything else is read.
                    let seen = self.state.borrow().version;
                    match wake.take(seen, &mut self.known) {
                        Needs::Nothing => continue,
                        Needs::Tally if self.enough() => {
                            next = self.show();
                            continue;
                        }
                        Needs::Tally | Needs::Read => {}
                    }
                }
                () = timer => {}
            }
            next = match self.read(&wake).await {
                Ok(next) => {
                    backoff = Duration::from_millis(50);
                    next
                }
                Err(()) => {
                    let at = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    Some(at)
                }
            };
        }
        for s in subscribers {
            let _ = s.await;
        }
    }
}

/// What the subscribers tell the reader: a change was announced.
#[derive(Default)]
struct Wake {
    notify: Notify,
    pending: std::sync::Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// Something was announced that needs a read whatever was read before (a resubscription,
    /// lost messages, a message of an older version that carries no view).
    read: bool,
    /// The newest `(term, version)` announced by an older version's claim or proclaim.
    newest: (u64, u64),
    /// Views announced by the nodes, by node index, in arrival order.
    views: Vec<(usize, Stamped)>,
}

/// What the announcements since the last look ask of the reader.
enum Needs {
    Nothing,
    /// Views arrived: name the leader from the known views (or read, if they cannot).
    Tally,
    Read,
}

/// A message from a node's subscriber connection.
enum Announced {
    /// The node's view, as its script published it.
    View(usize, NodeView),
    /// An older version's `term:version` of a claim or proclaim.
    Version((u64, u64)),
    /// Anything else: read.
    Other,
}

impl Wake {
    fn announce(&self, message: Announced) {
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match message {
                Announced::View(node, view) => {
                    let now = Instant::now();
                    let (from, to) = (now, now);
                    p.views.push((node, Stamped { view, from, to }));
                }
                Announced::Version(v) => p.newest = p.newest.max(v),
                Announced::Other => p.read = true,
            }
        }
        self.notify.notify_one();
    }

    /// What is needed, given the version last read; applies the announced views to `known`
    /// (and resets the requests).
    fn take(&self, seen: (u64, u64), known: &mut [Option<Stamped>]) -> Needs {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let views = p.apply(known);
        let read = p.read || p.newest > seen;
        p.read = false;
        match (read, views) {
            (true, _) => Needs::Read,
            (false, true) => Needs::Tally,
            (false, false) => Needs::Nothing,
        }
    }

    /// Applies the views announced so far to `known` (before and after a read).
    fn apply_views(&self, known: &mut [Option<Stamped>]) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.apply(known);
    }
}

impl Pending {
    /// Moves the announced views into `known`; whether there were any.
    fn apply(&mut self, known: &mut [Option<Stamped>]) -> bool {
        let any = !self.views.is_empty();
        for (node, view) in self.views.drain(..) {
            if let Some(slot) = known.get_mut(node) {
                *slot = Some(view);
            }
        }
        any
    }
}

/// A message published on the election's channel, as the reader needs it.
fn parse(node: usize, text: Option<&str>) -> Announced {
    let Some(text) = text else {
        return Announced::Other;
    };
    if let Some(view) = decode_announced(text) {
        return Announced::View(node, view);
    }
    let version = text
        .split_once(':')
        .and_then(|(t, v)| Some((t.parse().ok()?, v.parse().ok()?)));
    version.map_or(Announced::Other, Announced::Version)
}

/// One node's subscriber connection of one observer.
struct Subscriber {
    /// The node's index among the Redlock's nodes, and its name.
    index: usize,
    node: String,
    channel: String,
    wake: Arc<Wake>,
    closed: watch::Receiver<bool>,
    /// Counts subscriptions made (the start waits for one per node).
    subscribed: Arc<watch::Sender<usize>>,
}

fn options() -> Options {
    Options {
        timeout: Some(COMMAND_TIMEOUT),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
    }
}

impl Subscriber {
    async fn run(mut self, config: Config) {
        let client = match crate::nodes::connection::builder(config, 1_000).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node = %self.node, cause = %crate::nodes::connection::classify(&e).1, "fredlock: cannot create an observer's subscriber connection; changes on this node are read at expiry times only");
                return;
            }
        };
        let mut closed = self.closed.clone();
        tokio::select! {
            () = self.serve(&client) => {}
            _ = closed.wait_for(|c| *c) => {}
        }
        if client.is_connected() {
            let _ = tokio::time::timeout(COMMAND_TIMEOUT, client.quit()).await;
        }
    }

    async fn serve(&mut self, client: &fred::clients::Client) {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        let mut messages = client.message_rx();
        let mut reconnects = client.reconnect_rx();
        let mut errors = client.error_rx();
        let mut backoff = Duration::from_millis(50);
        while client.init().await.is_err() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        // fred also announces the first connection as a reconnection: the subscription below
        // covers it (otherwise every new observer subscribed and read twice).
        while !matches!(
            reconnects.try_recv(),
            Err(TryRecvError::Empty | TryRecvError::Closed)
        ) {}
        let mut first = true;
        // Subscribe (again), then read: what was published while unsubscribed is read then.
        let mut resubscribe = true;
        loop {
            if resubscribe {
                match client
                    .with_options(&options())
                    .subscribe(self.channel.clone())
                    .await
                {
                    Ok(()) => {
                        resubscribe = false;
                        backoff = Duration::from_millis(50);
                        if first {
                            first = false;
                            self.subscribed.send_modify(|n| *n += 1);
                        } else {
                            self.wake.announce(Announced::Other);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(node = %self.node, cause = %crate::nodes::connection::classify(&e).1, "fredlock: observer subscribe failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            tokio::select! {
                m = messages.recv() => match m {
                    Ok(message) => {
                        let text = message.value.as_string();
                        self.wake.announce(parse(self.index, text.as_deref()));
                    }
                    // Messages were dropped: read again.
                    Err(RecvError::Lagged(_)) => self.wake.announce(Announced::Other),
                    Err(RecvError::Closed) => return,
                },
                e = errors.recv() => {
                    if matches!(e, Err(RecvError::Closed)) {
                        return;
                    }
                    // Messages published from now until subscribed again are lost: the
                    // reconnect re-subscribes and reads.
                }
                r = reconnects.recv() => {
                    if matches!(r, Err(RecvError::Closed)) {
                        return;
                    }
                    resubscribe = true;
                }
            }
        }
    }
}
