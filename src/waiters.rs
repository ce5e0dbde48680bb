//! The waiting acquires of one Redlock, and which of them a release wakes.
//!
//! A release publishes its token on one channel per lock key, on every node where it deleted the
//! key (see `scripts::RELEASE_WAKE`); the subscriber (one connection per node, one layer up)
//! hands each message to [`Registry::dispatch`]. The rules, per channel:
//!
//! - **One waiter per release.** A message with a token not seen before on the channel wakes ONE
//!   waiter: the longest-waiting one that is asleep (FIFO), or, if every waiter is busy with an
//!   attempt, the first of them (it retries as soon as its attempt fails). Waking all of them
//!   would be a thundering herd: only one can win, the others' attempts are wasted commands.
//! - **The N messages of one release are one wake-up.** The same release publishes the same token
//!   on each of its nodes. A repeat goes to the waiter that got the first one (its handler): if
//!   that waiter's attempt failed meanwhile (the release had not reached enough nodes yet, as
//!   can happen for a waiter in another process), it retries once more; if it acquired, the
//!   repeat is dropped.
//! - **A wake-up is never stranded by its waiter.** A waiter that leaves without the lock
//!   (cancelled, out of time, an error) while its wake-up is pending or its attempt is running
//!   passes the wake-up on to the next waiter. After a failed attempt that ran to its end, later
//!   repeats of that token go to another waiter.
//! - **Nothing is lost between a failed attempt and the wait.** A waiter is registered before it
//!   waits, and its last attempt before any wait starts after its channels were subscribed. The
//!   caller either took a [`Snapshot`] before its first attempt showing the channels already
//!   covered with no wake-up lost since ([`Registry::register`] then says `fresh`), or makes one
//!   more attempt once [`Waiter::until_covered`] returns.
//!
//! A channel is *covered* when its subscription is confirmed on at least `nodes - quorum + 1`
//! nodes: then any release that deleted the key on a quorum published on at least one node we
//! listen to. While a channel is not covered, waiters poll at the retry policy's pace.
//!
//! Owns: waiters, channels, FIFO order, de-duplication and hand-over of wake-ups, which node
//! confirmed which subscription. Must not: talk to Redis (the subscriber does) or decide when to
//! attempt (the retry loop does). Pure bookkeeping behind one mutex, never held across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How long a failed attempt's token stays quiet (its clean-up's messages come within a node
/// timeout; a paused node's later still).
const QUIET_FOR: Duration = Duration::from_secs(10);
/// Quiet tokens kept before old ones are dropped.
const QUIET_MAX: usize = 4096;

/// The registry of one Redlock: every channel someone waits on (or recently did), every waiter.
#[derive(Debug)]
pub(crate) struct Registry {
    state: Mutex<State>,
    /// Nodes that may confirm subscriptions (all configured nodes are counted in `needed`).
    nodes: usize,
    /// Confirmed nodes a channel needs to be covered: `nodes - quorum + 1`.
    needed: usize,
    /// Bumped when the set of wanted channels changes (the subscriber tasks watch it).
    wanted: watch::Sender<u64>,
    /// Bumped when any channel's coverage changes (sleeping waiters re-pick their timer).
    coverage: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    channels: HashMap<String, Channel>,
    waiters: HashMap<u64, WaiterState>,
    next_id: u64,
    next_generation: u64,
    next_synthetic: u64,
    /// Tokens of this Redlock's own failed attempts, whose clean-up messages wake nobody, and
    /// when each was added.
    quiet: HashMap<String, Instant>,
    /// Per node: channels created or removed since that node's subscriber last looked.
    changed: Vec<Vec<String>>,
    /// Per node: its subscriber connection is up (`Some(true)`), down (`Some(false)`), or not
    /// known yet (`None`: connecting).
    up: Vec<Option<bool>>,
}

#[derive(Debug)]
struct Channel {
    /// Distinguishes this entry from an earlier one of the same name (removed, then re-created).
    generation: u64,
    /// Waiters on this channel, oldest first.
    queue: VecDeque<u64>,
    /// Per node: the subscription is confirmed on the node's current connection.
    confirmed: Vec<bool>,
    /// Bumped whenever a wake-up may have been lost for someone not registered yet: a message
    /// that found no waiter, the loss of coverage.
    epoch: u64,
    /// The latest token dispatched here and the waiter that handles it (`None`: consumed by a
    /// waiter that acquired, so repeats are dropped).
    latest: Option<(String, Option<u64>)>,
    /// Has been covered before (so covering it again, after a loss, wakes a waiter).
    was_covered: bool,
    /// A waiter gave up waiting for coverage: covering it later wakes a waiter.
    late: bool,
    /// When the last waiter left (the subscription lingers for a while, see [`Registry::sweep`]).
    idle_since: Option<Instant>,
}

#[derive(Debug)]
struct WaiterState {
    channels: Vec<String>,
    notify: Arc<Notify>,
    /// A wake-up is pending (the waiter has not started the attempt it calls for).
    woken: bool,
    /// An attempt is running.
    attempting: bool,
}

/// What a caller saw before its first attempt: per channel, the entry and its epoch when it was
/// covered (`None` otherwise).
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot(Vec<Option<(u64, u64)>>);

/// Which waiter a message goes to.
enum Pick {
    One(u64),
    /// Every waiter already has a wake-up pending: the message is delivered in effect.
    AllWoken(u64),
    Nobody,
}

/// A waiting acquire: registered on its channels until dropped (or [`acquired`](Self::acquired)).
///
/// Dropping it without `acquired` passes on a pending wake-up, or the one its running attempt
/// was answering, to the next waiter.
#[derive(Debug)]
pub(crate) struct Waiter {
    registry: Arc<Registry>,
    id: u64,
    notify: Arc<Notify>,
    coverage: watch::Receiver<u64>,
    acquired: bool,
}

impl Registry {
    /// A registry for `nodes` nodes of which `quorum` must agree.
    pub(crate) fn new(nodes: usize, quorum: usize) -> Registry {
        Registry {
            state: Mutex::new(State {
                up: vec![None; nodes],
                changed: vec![Vec::new(); nodes],
                ..State::default()
            }),
            nodes,
            needed: nodes.saturating_sub(quorum).saturating_add(1),
            wanted: watch::Sender::new(0),
            coverage: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_covered(&self, ch: &Channel) -> bool {
        ch.confirmed.iter().filter(|c| **c).count() >= self.needed
    }

    /// What the caller may rely on before its first attempt (see [`register`](Self::register)).
    pub(crate) fn snapshot(&self, channels: &[String]) -> Snapshot {
        let st = self.lock();
        Snapshot(
            channels
                .iter()
                .map(|c| {
                    st.channels
                        .get(c)
                        .filter(|ch| self.is_covered(ch))
                        .map(|ch| (ch.generation, ch.epoch))
                })
                .collect(),
        )
    }

    /// Whether every channel is covered and already has a waiter: a new acquire of this
    /// Redlock should then queue behind them rather than attempt (the lock is held or being
    /// handed to the first of them; an attempt would only cost commands and barge ahead).
    pub(crate) fn queued(&self, channels: &[String]) -> bool {
        let st = self.lock();
        !channels.is_empty()
            && channels.iter().all(|c| {
                st.channels
                    .get(c)
                    .is_some_and(|ch| !ch.queue.is_empty() && self.is_covered(ch))
            })
    }

    /// Registers a waiter on `channels`. `fresh`: per `snapshot` (taken before the attempt that
    /// just failed), every channel was covered then and no wake-up has been lost since, so the
    /// waiter may wait without another attempt. Otherwise the caller must wait for coverage
    /// ([`Waiter::until_covered`]) and attempt once more before waiting.
    pub(crate) fn register(
        self: &Arc<Self>,
        channels: &[String],
        snapshot: &Snapshot,
    ) -> (Waiter, bool) {
        let notify = Arc::new(Notify::new());
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        let mut fresh = snapshot.0.len() == channels.len();
        let mut created = false;
        for (i, name) in channels.iter().enumerate() {
            if !st.channels.contains_key(name) {
                let generation = st.next_generation;
                st.next_generation += 1;
                st.channels.insert(
                    name.clone(),
                    Channel {
                        generation,
                        queue: VecDeque::new(),
                        confirmed: vec![false; self.nodes],
                        epoch: 0,
                        latest: None,
                        was_covered: false,
                        late: false,
                        idle_since: None,
                    },
                );
                created = true;
                for c in st.changed.iter_mut() {
                    c.push(name.clone());
                }
            }
            let Some(ch) = st.channels.get_mut(name) else {
                continue;
            };
            let seen = snapshot.0.get(i).copied().flatten();
            fresh &= seen == Some((ch.generation, ch.epoch)) && self.is_covered(ch);
            ch.queue.push_back(id);
            ch.idle_since = None;
        }
        st.waiters.insert(
            id,
            WaiterState {
                channels: channels.to_vec(),
                notify: notify.clone(),
                woken: false,
                attempting: false,
            },
        );
        drop(st);
        crate::metrics::waiters(1.0);
        if created {
            self.wanted.send_modify(|v| *v = v.wrapping_add(1));
        }
        let waiter = Waiter {
            registry: self.clone(),
            id,
            notify,
            coverage: self.coverage.subscribe(),
            acquired: false,
        };
        (waiter, fresh)
    }

    /// `token` belongs to a failed attempt of this Redlock: the messages of its clean-up are
    /// not news here (the lock is held elsewhere) and wake nobody, least of all the waiter that
    /// made the attempt. Remembered for [`QUIET_FOR`].
    pub(crate) fn quiet(&self, token: &str) {
        let now = Instant::now();
        let mut st = self.lock();
        if st.quiet.len() >= QUIET_MAX {
            st.quiet
                .retain(|_, t| now.saturating_duration_since(*t) < QUIET_FOR);
            if st.quiet.len() >= QUIET_MAX {
                // Many failures a second: forget all but the newest (a late message of a
                // forgotten one costs one spurious attempt, nothing more).
                st.quiet.clear();
            }
        }
        st.quiet.insert(token.to_string(), now);
    }

    /// A message: `token` was released on `channel` (or a synthetic wake-up). Wakes at most one
    /// waiter, as described at the top of this file.
    pub(crate) fn dispatch(&self, channel: &str, token: &str) {
        let mut st = self.lock();
        if st.quiet.contains_key(token) {
            return;
        }
        let State {
            channels, waiters, ..
        } = &mut *st;
        let Some(ch) = channels.get_mut(channel) else {
            return;
        };
        if let Some((latest, handler)) = &ch.latest {
            if latest == token {
                if let Some(w) = handler.and_then(|h| waiters.get_mut(&h)) {
                    wake(w);
                }
                return;
            }
        }
        match pick(ch, waiters) {
            Pick::One(id) => {
                ch.latest = Some((token.to_string(), Some(id)));
                if let Some(w) = waiters.get_mut(&id) {
                    wake(w);
                }
            }
            Pick::AllWoken(first) => ch.latest = Some((token.to_string(), Some(first))),
            Pick::Nobody => {
                ch.latest = None;
                ch.epoch = ch.epoch.wrapping_add(1);
            }
        }
    }

    /// A wake-up that no release sent (coverage regained after messages may have been lost):
    /// wakes one waiter of `channel`.
    fn synthetic(st: &mut State, channel: &str) -> Option<Arc<Notify>> {
        let token = format!("~resync:{}", st.next_synthetic);
        st.next_synthetic += 1;
        let State {
            channels, waiters, ..
        } = st;
        let ch = channels.get_mut(channel)?;
        match pick(ch, waiters) {
            Pick::One(id) => {
                ch.latest = Some((token, Some(id)));
                let w = waiters.get_mut(&id)?;
                w.woken = true;
                Some(w.notify.clone())
            }
            Pick::AllWoken(_) | Pick::Nobody => None,
        }
    }

    /// The channels to keep subscribed (with waiters, or lingering), for node `node`'s
    /// subscriber starting afresh; its record of changes starts from here.
    pub(crate) fn wanted(&self, node: usize) -> Vec<String> {
        let mut st = self.lock();
        if let Some(c) = st.changed.get_mut(node) {
            c.clear();
        }
        st.channels.keys().cloned().collect()
    }

    /// What changed for node `node`'s subscriber since it last looked: `(subscribe,
    /// unsubscribe)`, each channel in the list its current state calls for (a channel removed
    /// and created again is wanted; one created and removed is not).
    pub(crate) fn changes(&self, node: usize) -> (Vec<String>, Vec<String>) {
        let mut st = self.lock();
        let Some(changed) = st.changed.get_mut(node).map(std::mem::take) else {
            return (Vec::new(), Vec::new());
        };
        let mut seen = std::collections::HashSet::new();
        let (mut add, mut remove) = (Vec::new(), Vec::new());
        for name in changed {
            if !seen.insert(name.clone()) {
                continue;
            }
            if st.channels.contains_key(&name) {
                add.push(name);
            } else {
                remove.push(name);
            }
        }
        (add, remove)
    }

    /// A receiver that changes whenever [`wanted`](Self::wanted) may have.
    pub(crate) fn wanted_changes(&self) -> watch::Receiver<u64> {
        self.wanted.subscribe()
    }

    /// Node `node`'s subscriber connection is up (`true`) or down.
    pub(crate) fn set_up(&self, node: usize, up: bool) {
        let mut st = self.lock();
        if let Some(u) = st.up.get_mut(node) {
            *u = Some(up);
        }
        drop(st);
        self.coverage.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether enough subscriber connections are up (or still connecting) for a channel to be
    /// covered.
    fn enough_up(&self) -> bool {
        self.lock().up.iter().filter(|u| **u != Some(false)).count() >= self.needed
    }

    /// `node` confirmed its subscription to `channels` (on its current connection).
    pub(crate) fn confirm(&self, node: usize, channels: &[String]) {
        let mut wakes = Vec::new();
        let mut changed = false;
        let mut st = self.lock();
        for name in channels {
            let Some(ch) = st.channels.get_mut(name) else {
                continue;
            };
            let Some(c) = ch.confirmed.get_mut(node) else {
                continue;
            };
            if *c {
                continue;
            }
            let before = self.is_covered(ch);
            ch.confirmed[node] = true;
            if !before && self.is_covered(ch) {
                changed = true;
                let resync = ch.was_covered || ch.late;
                ch.was_covered = true;
                ch.late = false;
                if resync {
                    wakes.extend(Self::synthetic(&mut st, name));
                }
            }
        }
        drop(st);
        for n in wakes {
            n.notify_one();
        }
        if changed {
            self.coverage.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// `node`'s subscriptions are gone (its connection dropped, or messages were lost): nothing
    /// it confirmed counts any more. Channels that lose coverage may have lost a wake-up.
    pub(crate) fn lost(&self, node: usize) {
        let mut st = self.lock();
        for ch in st.channels.values_mut() {
            if ch.confirmed.get(node).copied().unwrap_or(false) {
                let before = self.is_covered(ch);
                ch.confirmed[node] = false;
                if before && !self.is_covered(ch) {
                    ch.epoch = ch.epoch.wrapping_add(1);
                }
            }
        }
        drop(st);
        self.coverage.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Messages from `node` may have been lost although its subscriptions stand (the local
    /// queue overflowed): wakes one waiter per channel, and counts a loss for those registering.
    pub(crate) fn overflowed(&self) {
        let mut st = self.lock();
        let names: Vec<String> = st.channels.keys().cloned().collect();
        let mut wakes = Vec::new();
        for name in names {
            if let Some(ch) = st.channels.get_mut(&name) {
                ch.epoch = ch.epoch.wrapping_add(1);
            }
            wakes.extend(Self::synthetic(&mut st, &name));
        }
        drop(st);
        for n in wakes {
            n.notify_one();
        }
    }

    /// Removes channels without waiters for longer than `linger`; returns whether any was
    /// removed (their subscriptions can go).
    pub(crate) fn sweep(&self, now: Instant, linger: Duration) -> bool {
        let mut st = self.lock();
        let gone: Vec<String> = st
            .channels
            .iter()
            .filter(|(_, ch)| {
                ch.idle_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= linger)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            st.channels.remove(name);
            for c in st.changed.iter_mut() {
                c.push(name.clone());
            }
        }
        let removed = !gone.is_empty();
        drop(st);
        if removed {
            self.wanted.send_modify(|v| *v = v.wrapping_add(1));
        }
        removed
    }

    /// How many waiters are registered (for tests and diagnostics).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Removes waiter `id`. `acquired`: its attempt got the lock, so a wake-up it handles is
    /// used up. Otherwise a wake-up it had not answered yet goes to the next waiter.
    fn leave(&self, id: u64, acquired: bool) {
        let mut wakes = Vec::new();
        let now = Instant::now();
        let mut st = self.lock();
        let Some(me) = st.waiters.remove(&id) else {
            return;
        };
        crate::metrics::waiters(-1.0);
        let unanswered = me.woken || me.attempting;
        let State {
            channels, waiters, ..
        } = &mut *st;
        for name in &me.channels {
            let Some(ch) = channels.get_mut(name) else {
                continue;
            };
            ch.queue.retain(|w| *w != id);
            if ch.queue.is_empty() {
                ch.idle_since = Some(now);
            }
            if !matches!(ch.latest, Some((_, Some(h))) if h == id) {
                continue;
            }
            if acquired {
                if let Some((_, h)) = &mut ch.latest {
                    *h = None;
                }
            } else if unanswered {
                match pick(ch, waiters) {
                    Pick::One(next) => {
                        if let Some(w) = waiters.get_mut(&next) {
                            w.woken = true;
                            wakes.push(w.notify.clone());
                        }
                        if let Some((_, h)) = &mut ch.latest {
                            *h = Some(next);
                        }
                    }
                    Pick::AllWoken(first) => {
                        if let Some((_, h)) = &mut ch.latest {
                            *h = Some(first);
                        }
                    }
                    Pick::Nobody => {
                        ch.latest = None;
                        ch.epoch = ch.epoch.wrapping_add(1);
                    }
                }
            } else {
                // Its failed attempt answered this token: a repeat of it is news for another.
                ch.latest = None;
            }
        }
        drop(st);
        for n in wakes {
            n.notify_one();
        }
    }
}

/// The waiter a new wake-up goes to: the first asleep in FIFO order, else the first busy with
/// an attempt; never one with a wake-up already pending.
fn pick(ch: &Channel, waiters: &HashMap<u64, WaiterState>) -> Pick {
    let mut busy = None;
    let mut first = None;
    for &id in &ch.queue {
        let Some(w) = waiters.get(&id) else {
            continue;
        };
        first.get_or_insert(id);
        if w.woken {
            continue;
        }
        if !w.attempting {
            return Pick::One(id);
        }
        busy.get_or_insert(id);
    }
    match (busy, first) {
        (Some(id), _) => Pick::One(id),
        (None, Some(id)) => Pick::AllWoken(id),
        (None, None) => Pick::Nobody,
    }
}

fn wake(w: &mut WaiterState) {
    w.woken = true;
    w.notify.notify_one();
}

impl Waiter {
    /// Whether every channel of this waiter is covered now.
    pub(crate) fn covered(&self) -> bool {
        let st = self.registry.lock();
        let Some(me) = st.waiters.get(&self.id) else {
            return false;
        };
        me.channels.iter().all(|c| {
            st.channels
                .get(c)
                .is_some_and(|ch| self.registry.is_covered(ch))
        })
    }

    /// Waits until every channel is covered, or `until`, or until coverage is out of reach (too
    /// few subscriber connections up). Returns whether they are covered. Channels still not
    /// covered are marked so that covering them later wakes a waiter.
    pub(crate) async fn until_covered(&mut self, until: Instant) -> bool {
        loop {
            let _ = self.coverage.borrow_and_update();
            if self.covered() {
                return true;
            }
            if !self.registry.enough_up() {
                break;
            }
            tokio::select! {
                changed = self.coverage.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep_until(until) => break,
            }
        }
        let mut st = self.registry.lock();
        let names = st
            .waiters
            .get(&self.id)
            .map(|w| w.channels.clone())
            .unwrap_or_default();
        for name in names {
            if let Some(ch) = st.channels.get_mut(&name) {
                if !self.registry.is_covered(ch) {
                    ch.late = true;
                }
            }
        }
        false
    }

    /// Whether this waiter is the longest waiting of its (first) channel: the one whose
    /// fallback timer runs at the shorter pace.
    pub(crate) fn is_head(&self) -> bool {
        let st = self.registry.lock();
        st.waiters
            .get(&self.id)
            .and_then(|w| w.channels.first())
            .and_then(|c| st.channels.get(c))
            .is_some_and(|ch| ch.queue.front() == Some(&self.id))
    }

    /// A receiver that changes whenever any channel's coverage may have changed.
    pub(crate) fn coverage(&self) -> watch::Receiver<u64> {
        self.registry.coverage.subscribe()
    }

    /// An attempt starts: a pending wake-up is answered by it.
    pub(crate) fn begin_attempt(&self) {
        let mut st = self.registry.lock();
        if let Some(me) = st.waiters.get_mut(&self.id) {
            me.woken = false;
            me.attempting = true;
        }
    }

    /// The attempt ended without the lock.
    pub(crate) fn end_attempt(&self) {
        let mut st = self.registry.lock();
        if let Some(me) = st.waiters.get_mut(&self.id) {
            me.attempting = false;
        }
    }

    /// Resolves once a wake-up is pending for this waiter (at once if one already is).
    ///
    /// Cancellation: safe; a wake-up that arrives meanwhile stays pending.
    pub(crate) async fn woken(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pending = {
                let st = self.registry.lock();
                st.waiters.get(&self.id).is_some_and(|w| w.woken)
            };
            if pending {
                return;
            }
            notified.await;
        }
    }

    /// The waiter's attempt got the lock: leaves, using up the wake-up it was answering.
    pub(crate) fn acquired(mut self) {
        self.acquired = true;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.registry.leave(self.id, self.acquired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A registry of 3 nodes (quorum 2: covered with 2 confirmations) with `ch` confirmed.
    fn covered(ch: &[&str]) -> Arc<Registry> {
        let r = Arc::new(Registry::new(3, 2));
        // A waiter creates the entries; the subscriber confirms them.
        let (w, _) = r.register(&names(ch), &Snapshot::default());
        r.confirm(0, &names(ch));
        r.confirm(1, &names(ch));
        drop(w);
        r
    }

    fn pending(w: &Waiter) -> bool {
        let st = w.registry.lock();
        st.waiters.get(&w.id).is_some_and(|s| s.woken)
    }

    #[test]
    fn one_release_wakes_one_waiter_once() {
        let r = covered(&["k"]);
        let snap = r.snapshot(&names(&["k"]));
        let ws: Vec<Waiter> = (0..4)
            .map(|_| r.register(&names(&["k"]), &snap).0)
            .collect();
        // The same token from three nodes.
        for _ in 0..3 {
            r.dispatch("k", "t1");
        }
        let woken: Vec<bool> = ws.iter().map(pending).collect();
        assert_eq!(
            woken,
            [true, false, false, false],
            "the oldest waiter, once"
        );
        // It attempts and acquires: later repeats of t1 are dropped.
        ws[0].begin_attempt();
        r.dispatch("k", "t1");
        let mut ws = ws.into_iter();
        ws.next().unwrap().acquired();
        r.dispatch("k", "t1");
        assert!(
            ws.all(|w| !pending(&w)),
            "repeats of a used token wake nobody"
        );
    }

    #[test]
    fn a_repeat_during_a_failing_attempt_makes_the_handler_retry() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        let (b, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.dispatch("k", "t1");
        assert!(pending(&a));
        a.begin_attempt();
        // The release reaches another node while a's attempt runs (a waiter in another process).
        r.dispatch("k", "t1");
        a.end_attempt();
        assert!(pending(&a), "a retries");
        assert!(!pending(&b), "b sleeps on");
    }

    #[test]
    fn a_new_token_while_everyone_is_busy_goes_to_the_first_busy_waiter() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        a.begin_attempt();
        r.dispatch("k", "t1");
        assert!(pending(&a), "kept for after its attempt");
        a.end_attempt();
        assert!(pending(&a));
    }

    #[test]
    fn a_cancelled_waiter_passes_its_wake_up_on() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        let (b, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.dispatch("k", "t1");
        assert!(pending(&a) && !pending(&b));
        drop(a);
        assert!(pending(&b), "the wake-up moved on");
        // ... and repeats of t1 now go to b.
        b.begin_attempt();
        r.dispatch("k", "t1");
        assert!(pending(&b));
    }

    #[test]
    fn a_waiter_cancelled_mid_attempt_passes_on_too() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        let (b, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.dispatch("k", "t1");
        a.begin_attempt();
        drop(a);
        assert!(pending(&b));
    }

    #[test]
    fn after_a_failed_attempt_repeats_go_to_another_waiter_once_it_leaves() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        let (b, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.dispatch("k", "t1");
        a.begin_attempt();
        a.end_attempt();
        drop(a); // gave up after its answer to t1 failed
        assert!(!pending(&b), "its wake-up was answered");
        r.dispatch("k", "t1"); // the release lands on another node later
        assert!(pending(&b));
    }

    #[test]
    fn a_message_nobody_waits_for_makes_the_next_registration_stale() {
        let r = covered(&["k"]);
        let snap = r.snapshot(&names(&["k"]));
        r.dispatch("k", "t1"); // between the caller's failed attempt and its registration
        let (_w, fresh) = r.register(&names(&["k"]), &snap);
        assert!(!fresh, "must attempt again before waiting");
        let snap = r.snapshot(&names(&["k"]));
        let (_w2, fresh) = r.register(&names(&["k"]), &snap);
        assert!(fresh);
    }

    #[test]
    fn registration_is_stale_until_covered() {
        let r = Arc::new(Registry::new(3, 2));
        let snap = r.snapshot(&names(&["k"]));
        let (_w, fresh) = r.register(&names(&["k"]), &snap);
        assert!(!fresh);
        r.confirm(0, &names(&["k"]));
        let (_w2, fresh) = r.register(&names(&["k"]), &r.snapshot(&names(&["k"])));
        assert!(!fresh, "one confirmation of the two needed");
        r.confirm(2, &names(&["k"]));
        let (_w3, fresh) = r.register(&names(&["k"]), &r.snapshot(&names(&["k"])));
        assert!(fresh);
    }

    #[test]
    fn losing_coverage_wakes_once_regained_and_stales_snapshots() {
        let r = covered(&["k"]);
        let snap = r.snapshot(&names(&["k"]));
        let (a, fresh) = r.register(&names(&["k"]), &snap);
        assert!(fresh);
        r.lost(1);
        let (_b, fresh) = r.register(&names(&["k"]), &snap);
        assert!(!fresh);
        assert!(!pending(&a));
        r.confirm(1, &names(&["k"]));
        assert!(
            pending(&a),
            "messages may have been lost meanwhile: one waiter retries"
        );
    }

    #[test]
    fn a_multi_key_release_wakes_one_waiter_per_key_at_most() {
        let r = covered(&["a", "b"]);
        let (ab, _) = r.register(&names(&["a", "b"]), &Snapshot::default());
        let (b, _) = r.register(&names(&["b"]), &Snapshot::default());
        r.dispatch("a", "t1");
        assert!(pending(&ab));
        ab.begin_attempt();
        r.dispatch("b", "t1");
        assert!(pending(&b), "the key b was freed too");
    }

    #[test]
    fn newcomers_queue_behind_waiters_and_the_oldest_is_head() {
        let r = covered(&["k"]);
        assert!(!r.queued(&names(&["k"])), "nobody waits");
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        assert!(r.queued(&names(&["k"])));
        assert!(!r.queued(&names(&["k", "other"])));
        let (b, _) = r.register(&names(&["k"]), &Snapshot::default());
        assert!(a.is_head() && !b.is_head());
        drop(a);
        assert!(b.is_head());
    }

    #[test]
    fn a_failed_attempt_s_own_clean_up_wakes_nobody() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.quiet("mine");
        r.dispatch("k", "mine");
        assert!(!pending(&a));
        r.dispatch("k", "theirs");
        assert!(pending(&a));
    }

    #[test]
    fn idle_channels_linger_then_go() {
        let r = covered(&["k"]);
        assert_eq!(r.changes(0), (names(&["k"]), vec![]));
        assert_eq!(r.changes(0), (vec![], vec![]), "taken");
        let t = Instant::now();
        assert!(!r.sweep(t, Duration::from_secs(1)));
        assert!(r.sweep(t + Duration::from_secs(2), Duration::from_secs(1)));
        assert_eq!(r.changes(0), (vec![], names(&["k"])));
        assert!(r.wanted(0).is_empty());
        assert_eq!(r.waiting(), 0);
        // Node 1 never looked: created then removed, it has nothing to subscribe.
        assert_eq!(r.changes(1), (vec![], names(&["k"])));
    }

    #[tokio::test]
    async fn woken_resolves_for_a_wake_up_sent_before_it_was_awaited() {
        let r = covered(&["k"]);
        let (a, _) = r.register(&names(&["k"]), &Snapshot::default());
        r.dispatch("k", "t1");
        tokio::time::timeout(Duration::from_secs(5), a.woken())
            .await
            .expect("the pending wake-up");
    }
}
