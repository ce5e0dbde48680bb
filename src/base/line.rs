//! The waiting acquires of one Redlock, as members of the wait lines on the gate nodes.
//!
//! A contended lock key has a *wait line* on one node, its *gate* (chosen by rendezvous hash of
//! the key over the node addresses, so every process picks the same one): the scripts in
//! `scripts` (`GATE_ACQUIRE`, `GATE_RELEASE`, `LINE_LEAVE`) grant the gate's vote only to the
//! head of the line, add refused waiters at its back, and wake the head, and only the head,
//! when a holder releases: one `PUBLISH` per release, fleet-wide, on the head's process's own
//! channel. Each waiter renews a short lease in the line (the head and the waiter right
//! behind it by probing the gate, which also notices a lost wake-up, an expired holder or a
//! dead head; the waiters further back with one `SET` every [`RENEW_FAR`], asking their place
//! with one `ZRANK` at every second renewal and probing once they are the head or right
//! behind it), so a waiter
//! whose process died drops out within [`LEASE`].
//!
//! This module is the local half: each waiter's member name (`<instance>:<seq>`, the instance
//! being this Redlock's random id), the wake-up it receives (from the subscriber, or directly
//! from a release of this same Redlock), which subscriber connections are up, and which keys
//! were seen contended lately (a new acquire of such a key asks the gate alone first, rather
//! than setting keys on every node and splitting votes with the woken head).
//!
//! Owns: members, their wake-ups, subscriber liveness, the recently-contended keys. Must not:
//! talk to Redis (the subscriber and the node layer do) or decide when to attempt (the retry
//! loop does). Pure bookkeeping behind one mutex, never held across an await.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a waiter's place in a line lives without renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(3);
/// How often a waiter renews its place (a probe of the gate) while wake-ups reach it.
pub(crate) const RENEW: Duration = Duration::from_secs(1);
/// How often a waiter two places or more behind the head renews its place (one `SET`), within
/// [`LEASE`] with a second to spare: only the head and the waiter right behind it look every
/// [`RENEW`] (so a lost wake-up and a dead head are noticed as soon), and a long line's upkeep,
/// paid per second, costs half as much.
pub(crate) const RENEW_FAR: Duration = Duration::from_secs(2);
/// How long a key counts as contended after the last sign of it.
const HOT_FOR: Duration = Duration::from_secs(2);
/// Contended keys remembered at most (older ones are forgotten first).
const HOT_MAX: usize = 4096;
/// Leases of granted members remembered at most for `close()` (older ones are forgotten
/// first, and expire by themselves within [`LEASE`]).
const SPENT_MAX: usize = 4096;

/// The wait-line state of one Redlock.
#[derive(Debug)]
pub(crate) struct Line {
    /// This Redlock's random id: the first part of its members, the end of its channel.
    instance: String,
    /// The wake-up channels' common prefix (`<key prefix>~wake:`).
    prefix: String,
    /// The next member's sequence number (taken when an acquire starts: see [`Line::seq`]).
    next: std::sync::atomic::AtomicU64,
    /// Some key was marked hot once: until then [`Line::is_hot`] takes no lock.
    any_hot: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per member: its wake-up, the gate it waits at, and whether the last wake-up came from
    /// its gate (the head's turn) rather than a subscriber coming up (look again).
    waiters: HashMap<u64, Slot>,
    /// Per node: its subscriber confirmed our channel on its current connection.
    up: Vec<bool>,
    hot: HashMap<String, Instant>,
    /// The leases of members granted lately, as (gate, lease key, expiry): a lease outlives
    /// its member's grant (a grant refused elsewhere rejoins at the front by it), and
    /// [`Line::take_spent`] lets `close()` delete those still alive.
    spent: std::collections::VecDeque<(usize, String, Instant)>,
}

#[derive(Debug, Clone)]
struct Slot {
    notify: Arc<Notify>,
    gate: Option<usize>,
    turn: Arc<std::sync::atomic::AtomicBool>,
}

/// One waiting acquire's place: its member name and its wake-up. Dropping it stops local
/// delivery; leaving the line on the gate is the caller's (see `Redlock::leave_line`).
#[derive(Debug)]
pub(crate) struct Member {
    line: Arc<Line>,
    seq: u64,
    name: Arc<str>,
    notify: Arc<Notify>,
    turn: Arc<std::sync::atomic::AtomicBool>,
}

impl Line {
    /// The line state of a Redlock over `nodes` nodes whose keys start with `key_prefix`.
    pub(crate) fn new(key_prefix: &str, nodes: usize) -> Line {
        Line {
            next: Default::default(),
            any_hot: Default::default(),
            instance: format!("{:032x}", rand::random::<u128>()),
            prefix: format!("{key_prefix}~wake:"),
            state: Mutex::new(State {
                up: vec![false; nodes],
                ..State::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The channel prefix every release script publishes under.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// What every member name of this Redlock starts with (`<instance>:`).
    pub(crate) fn member_prefix(&self) -> String {
        format!("{}:", self.instance)
    }

    /// This Redlock's own wake-up channel.
    pub(crate) fn channel(&self) -> String {
        format!("{}{}", self.prefix, self.instance)
    }

    /// A sequence number for a member to come: taken when an acquire starts (one atomic
    /// step), so members order by their acquires' start even though each is created only at
    /// its acquire's first refusal ([`Line::member`]).
    pub(crate) fn seq(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// A new member waiting at `gate` (not in its line until its first refused attempt), with
    /// a sequence number from [`Line::seq`].
    pub(crate) fn member(self: &Arc<Self>, gate: Option<usize>, seq: u64) -> Member {
        let notify = Arc::new(Notify::new());
        let turn = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut st = self.lock();
        let slot = Slot {
            notify: notify.clone(),
            gate,
            turn: turn.clone(),
        };
        st.waiters.insert(seq, slot);
        drop(st);
        crate::base::metrics::waiters(1.0);
        Member {
            line: self.clone(),
            seq,
            name: format!("{}:{seq}", self.instance).into(),
            notify,
            turn,
        }
    }

    /// A wake-up message from a subscriber: `<seq>|<why>`, the member's turn, or only a look at
    /// its gate when `why` is `look` (a head left while the key was held: the member is the
    /// head now). Unknown or malformed: ignored (a member that left, or a message that is not
    /// ours).
    pub(crate) fn dispatch(&self, payload: &str) {
        let mut parts = payload.split('|');
        let seq = parts.next().and_then(|s| s.parse::<u64>().ok());
        if let Some(seq) = seq {
            self.wake_seq(seq, parts.next() != Some("look"));
        }
    }

    /// A release script woke `member`: when it is one of ours, wake it now rather than after
    /// the message's trip through the subscriber (which then finds it gone, or wakes it again:
    /// one spare probe of the gate).
    pub(crate) fn woke(&self, member: &str) {
        self.wake_ours(member, true);
    }

    /// Wakes `member`, when it is one of ours, to look at its gate first (not as the head):
    /// a waiter queued in the process whose hand-over the gate refused joins the line now.
    pub(crate) fn nudge(&self, member: &str) {
        self.wake_ours(member, false);
    }

    fn wake_ours(&self, member: &str, turn: bool) {
        let Some((instance, seq)) = member.split_once(':') else {
            return;
        };
        if instance == self.instance {
            if let Ok(seq) = seq.parse::<u64>() {
                self.wake_seq(seq, turn);
            }
        }
    }

    /// Whether `member` is one of this Redlock's waiters still waiting (its acquire has not
    /// returned, given up or been dropped). A late clean-up of one of its attempts (a release
    /// retried in the background) must not put a member that left back in line: nobody would
    /// take that turn, and the gate would refuse everyone else until the place's lease ran out.
    pub(crate) fn waits(&self, member: &str) -> bool {
        let Some((instance, seq)) = member.split_once(':') else {
            return false;
        };
        instance == self.instance
            && seq
                .parse::<u64>()
                .is_ok_and(|seq| self.lock().waiters.contains_key(&seq))
    }

    fn wake_seq(&self, seq: u64, turn: bool) {
        let slot = self.lock().waiters.get(&seq).cloned();
        if let Some(s) = slot {
            if turn {
                s.turn.store(true, std::sync::atomic::Ordering::Release);
            }
            s.notify.notify_one();
        }
    }

    /// Node `node`'s subscriber is subscribed (`true`) or not. Coming up wakes every member
    /// waiting at that gate once: a message may have been lost while it was down (or before
    /// the first subscription), so each looks at its gate again.
    pub(crate) fn set_up(&self, node: usize, up: bool) {
        let mut st = self.lock();
        let Some(slot) = st.up.get_mut(node) else {
            return;
        };
        if *slot == up {
            return;
        }
        *slot = up;
        let all: Vec<Arc<Notify>> = if up {
            st.waiters
                .values()
                .filter(|s| s.gate == Some(node))
                .map(|s| s.notify.clone())
                .collect()
        } else {
            Vec::new()
        };
        drop(st);
        for n in all {
            n.notify_one();
        }
    }

    /// Whether wake-ups from node `node` reach this Redlock now.
    pub(crate) fn is_up(&self, node: usize) -> bool {
        self.lock().up.get(node).copied().unwrap_or(false)
    }

    /// `key` showed contention (a line, a refusal, a woken waiter).
    pub(crate) fn mark_hot(&self, key: &str) {
        let now = Instant::now();
        let mut st = self.lock();
        if st.hot.len() >= HOT_MAX && !st.hot.contains_key(key) {
            st.hot
                .retain(|_, t| now.saturating_duration_since(*t) < HOT_FOR);
            if st.hot.len() >= HOT_MAX {
                st.hot.clear();
            }
        }
        st.hot.insert(key.to_string(), now);
        self.any_hot
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether `key` showed contention within the last couple of seconds.
    pub(crate) fn is_hot(&self, key: &str) -> bool {
        // Relaxed: a mark another task made a moment ago may be missed, as it may be missed
        // by a look that came a moment earlier; it only steers the first attempt.
        if !self.any_hot.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        self.lock()
            .hot
            .get(key)
            .is_some_and(|t| t.elapsed() < HOT_FOR)
    }
}

impl Line {
    /// Remembers the lease `lease_key` on `gate` of a member that was granted, until the lease
    /// expires (at most [`SPENT_MAX`] of them, the oldest forgotten first).
    pub(crate) fn spent(&self, gate: usize, lease_key: String) {
        let now = Instant::now();
        let mut st = self.lock();
        while st
            .spent
            .front()
            .is_some_and(|(_, _, until)| *until <= now || st.spent.len() >= SPENT_MAX)
        {
            st.spent.pop_front();
        }
        let until = now.checked_add(LEASE).unwrap_or(now);
        st.spent.push_back((gate, lease_key, until));
    }

    /// The remembered leases not expired yet, by gate node; forgets them all.
    pub(crate) fn take_spent(&self) -> Vec<(usize, Vec<String>)> {
        let now = Instant::now();
        let mut by_gate: Vec<(usize, Vec<String>)> = Vec::new();
        for (gate, key, until) in std::mem::take(&mut self.lock().spent) {
            if until <= now {
                continue;
            }
            match by_gate.iter_mut().find(|(g, _)| *g == gate) {
                Some((_, keys)) => keys.push(key),
                None => by_gate.push((gate, vec![key])),
            }
        }
        by_gate
    }
}

impl Member {
    /// The member's name in the lines: `<instance>:<seq>`.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Resolves at the next wake-up (one stored if it came while the member was busy).
    pub(crate) async fn woken(&self) {
        self.notify.notified().await;
    }

    /// Whether the last wake-up came from the gate (the head's turn: attempt everywhere) and
    /// not from a subscriber coming up (look at the gate first); reading it resets it.
    pub(crate) fn take_turn(&self) -> bool {
        self.turn.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Forgets a wake-up stored while the member was attempting (its attempt answered it).
    pub(crate) fn clear(&self) {
        self.turn.store(false, std::sync::atomic::Ordering::Release);
        // `notified()` consumes a stored permit when polled once.
        let notified = self.notify.notified();
        let mut notified = std::pin::pin!(notified);
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let _ = notified.as_mut().poll(&mut cx);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.line.lock().waiters.remove(&self.seq);
        crate::base::metrics::waiters(-1.0);
    }
}

/// A waiter's call on its gate while it runs (see `Node::acquire`). A turn that finds the key
/// held takes several round trips there (the pop and the `SET`, the put-back, the line script's
/// look), and the look still sets the key if it is free by then; the attempt may meanwhile have
/// been granted by the other nodes and its lock released. What ends that lock on the gate (its
/// release, a hand-over, a shortening) first waits for this call, so it lands after it: sent
/// at once, it could land between two of those round trips and leave the key of a released
/// lock on the gate for a whole TTL.
#[derive(Debug, Default)]
pub(crate) struct GateCall {
    running: std::sync::atomic::AtomicBool,
    done: Notify,
}

/// Marks a [`GateCall`] as running until dropped (also when the call's future is dropped:
/// whatever it handed to the connection is then ahead of anything sent after).
pub(crate) struct Running<'a>(&'a GateCall);

impl GateCall {
    /// The call starts.
    pub(crate) fn begin(&self) -> Running<'_> {
        self.running
            .store(true, std::sync::atomic::Ordering::Release);
        Running(self)
    }

    /// Whether the call still runs.
    pub(crate) fn is_running(&self) -> bool {
        self.running.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until the call is over, at most `within`; at once when none runs.
    pub(crate) async fn settled(&self, within: Duration) {
        use std::sync::atomic::Ordering::Acquire;
        if !self.running.load(Acquire) {
            return;
        }
        let done = self.done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if self.running.load(Acquire) {
            let _ = tokio::time::timeout(within, done).await;
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0
            .running
            .store(false, std::sync::atomic::Ordering::Release);
        self.0.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_wakes_its_member_only() {
        let line = Arc::new(Line::new("p:", 3));
        let a = line.member(Some(1), line.seq());
        let b = line.member(Some(1), line.seq());
        let seq_b = b.name().split(':').nth(1).unwrap_or("").to_string();
        line.dispatch(&format!("{seq_b}|x"));
        tokio::time::timeout(Duration::from_secs(5), b.woken())
            .await
            .expect("b is woken");
        assert!(b.take_turn(), "a release's wake-up is the member's turn");
        // `look`: woken to look at its gate, not for its turn.
        line.dispatch(&format!("{seq_b}|look"));
        tokio::time::timeout(Duration::from_secs(5), b.woken())
            .await
            .expect("b is woken to look");
        assert!(!b.take_turn(), "a look is not a turn");
        let a_woken = tokio::time::timeout(Duration::from_millis(20), a.woken()).await;
        assert!(a_woken.is_err(), "a was not woken");
        // Garbage is ignored.
        line.dispatch("zzz");
        line.dispatch("");
        line.woke("not-ours:1");
        line.woke(a.name());
        tokio::time::timeout(Duration::from_secs(5), a.woken())
            .await
            .expect("a is woken by a release of its own Redlock");
    }

    #[tokio::test]
    async fn clear_forgets_a_stored_wake_up_and_subscriber_up_wakes_all() {
        let line = Arc::new(Line::new("p:", 2));
        let a = line.member(Some(1), line.seq());
        line.woke(a.name());
        a.clear();
        let stored = tokio::time::timeout(Duration::from_millis(20), a.woken()).await;
        assert!(stored.is_err(), "the stored wake-up was cleared");
        assert!(!line.is_up(1));
        line.set_up(1, true);
        assert!(line.is_up(1));
        tokio::time::timeout(Duration::from_secs(5), a.woken())
            .await
            .expect("a subscriber coming up wakes every member");
        line.set_up(7, true); // out of range: ignored
    }

    #[test]
    fn spent_leases_are_kept_until_they_expire_and_bounded() {
        let line = Line::new("p:", 3);
        line.spent(2, "a".into());
        line.spent(0, "b".into());
        line.spent(2, "c".into());
        assert_eq!(
            line.take_spent(),
            vec![
                (2, vec!["a".to_string(), "c".to_string()]),
                (0, vec!["b".to_string()])
            ]
        );
        assert!(line.take_spent().is_empty(), "taken once");
        for i in 0..SPENT_MAX + 10 {
            line.spent(1, i.to_string());
        }
        let kept = line.take_spent();
        assert_eq!(kept[0].1.len(), SPENT_MAX);
        assert_eq!(kept[0].1[0], "10", "the oldest are forgotten first");
    }

    #[test]
    fn hot_keys_are_remembered_and_bounded() {
        let line = Line::new("p:", 1);
        assert!(!line.is_hot("k"));
        line.mark_hot("k");
        assert!(line.is_hot("k"));
        for i in 0..(HOT_MAX + 10) {
            line.mark_hot(&format!("k{i}"));
        }
        assert!(line.lock().hot.len() <= HOT_MAX);
    }
}
