//! Hand-over inside one process: a holder's release passes the lock straight to a waiter of the
//! same `Redlock`, instead of a release round, a wake-up and the waiter's acquire round: as it
//! is (no command: the waiter takes the holder's keys, token and deadline) within the holder's
//! hand-over window, otherwise in one round (below). The rounds are `handover_rounds`'.
//!
//! A waiter in a key's line (refused, told its place) *offers* the value its next attempt would
//! set ([`Offer`], kept in [`Handovers`] by key). A release of that key by the same `Redlock`
//! takes the oldest offer (by member, so the waiter that started first goes first) and sends
//! each node `PASS` (`GATE_PASS` on the gate): where the key still holds the holder's value, or
//! is free, it now holds the waiter's, with the waiter's TTL. The gate passes only when no
//! waiter of another process is ahead in the line (the order across processes stays the line's);
//! otherwise it does the holder's ordinary release there, waking the line's head. The waiter is
//! granted when the gate and a quorum passed, within the waiter's validity counted from the
//! round's start; otherwise its value is cleaned up, like a failed attempt's, and it attempts
//! as usual.
//!
//! A waiter about to ask the gate for a place while another waiter of the same `Redlock` has
//! one ([`Handovers::lined`]) offers without asking anything: it is *queued in the process*
//! (`Offer::lined` false). The lock reaches the process through the lined waiter's place in the
//! line, then passes between the process's waiters; beyond a window, `GATE_PASS` grants such
//! a waiter only while no member of another process is in the line at all (it is behind every
//! member), and when refused there it attempts at once and joins the line at its back.
//!
//! Owns: offers and their state, generic over the grant they end with ([`Ticket`], the
//! waiter's side; [`Cell::finish`], the releaser's). Must not: send anything (the round is
//! `handover_rounds`' `hand_over`, the offer is made by `attempt`), decide when a waiter attempts
//! (acquire_loop) or build a `Lock`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::nodes::node::Held;

/// What a waiter's next attempt would set, offered to a release of the same key.
pub(crate) struct Offer {
    pub(crate) held: Arc<Held>,
    pub(crate) member: Arc<str>,
    pub(crate) ttl_ms: u64,
    pub(crate) ttl: Duration,
    pub(crate) validity: Duration,
    /// The waiter may take the holder's lock as it is (see `handover_rounds`): not when it
    /// holds for a minimum, which would be counted from the hand-over.
    pub(crate) as_is: bool,
    /// The waiter is in the key's line on its gate (refused there); `false`: queued behind a
    /// waiter of this `Redlock` that is, without a place of its own (see [`Handovers::lined`]).
    pub(crate) lined: bool,
}

/// Where an offer stands; `G` is the grant a hand-over ends with.
enum State<G> {
    Open(Offer),
    /// A release is handing the lock over (its round is running).
    Taken,
    /// Handed over: the waiter's grant, or `None` when the hand-over failed.
    Done(Option<G>),
    /// The waiter left (its acquire returned or was dropped): a grant arriving now is released.
    Left,
}

/// One offer, shared by the waiter's [`Ticket`] and the release that takes it.
pub(crate) struct Cell<G> {
    state: Mutex<State<G>>,
    done: Notify,
}

impl<G> Cell<G> {
    fn lock(&self) -> MutexGuard<'_, State<G>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The round's outcome; a grant the waiter can no longer take is given back.
    pub(crate) fn finish(&self, grant: Option<G>) -> Option<G> {
        let mut state = self.lock();
        if matches!(*state, State::Left) {
            return grant;
        }
        *state = State::Done(grant);
        drop(state);
        self.done.notify_one();
        None
    }
}

type Offers<G> = HashMap<String, BTreeMap<u64, Arc<Cell<G>>>>;

/// The open offers of one `Redlock`, by key, then by member sequence (oldest first).
pub(crate) struct Handovers<G> {
    offers: Mutex<Offers<G>>,
    /// How many offers are registered: a release checks this before taking the mutex.
    count: AtomicUsize,
}

impl<G> Default for Handovers<G> {
    fn default() -> Self {
        Handovers {
            offers: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
        }
    }
}

impl<G> std::fmt::Debug for Handovers<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handovers")
            .field("offers", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl<G> Handovers<G> {
    fn lock(&self) -> MutexGuard<'_, Offers<G>> {
        self.offers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any waiter of this Redlock offered (one atomic load).
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    fn remove(&self, key: &str, seq: u64, cell: &Arc<Cell<G>>) {
        let mut offers = self.lock();
        let Some(by_seq) = offers.get_mut(key) else {
            return;
        };
        if by_seq.get(&seq).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            by_seq.remove(&seq);
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        if by_seq.is_empty() {
            offers.remove(key);
        }
    }

    /// Whether a waiter of this `Redlock` with a place in `key`'s line has an open offer: a
    /// newcomer may then wait behind it in the process, sending nothing (the lock comes to
    /// the process through that waiter's place, then passes between its waiters).
    pub(crate) fn lined(&self, key: &str) -> bool {
        if !self.any() {
            return false;
        }
        let offers = self.lock();
        offers.get(key).is_some_and(|by_seq| {
            by_seq
                .values()
                .any(|cell| matches!(&*cell.lock(), State::Open(o) if o.lined))
        })
    }

    /// The member of the oldest open offer for `key` queued in the process, when no open offer
    /// for `key` comes from the line (nobody of this `Redlock` left there to bring it the lock).
    pub(crate) fn stranded(&self, key: &str) -> Option<Arc<str>> {
        if !self.any() {
            return None;
        }
        let offers = self.lock();
        let mut first = None;
        for cell in offers.get(key)?.values() {
            if let State::Open(o) = &*cell.lock() {
                if o.lined {
                    return None;
                }
                first = first.or_else(|| Some(o.member.clone()));
            }
        }
        first
    }

    /// The oldest open offer for `key`, marked taken.
    pub(crate) fn take(&self, key: &str) -> Option<(Arc<Cell<G>>, Offer)> {
        if !self.any() {
            return None;
        }
        let mut offers = self.lock();
        let by_seq = offers.get_mut(key)?;
        let mut found = None;
        while let Some((_, cell)) = by_seq.pop_first() {
            self.count.fetch_sub(1, Ordering::Relaxed);
            let mut state = cell.lock();
            if let State::Open(_) = &*state {
                let State::Open(offer) = std::mem::replace(&mut *state, State::Taken) else {
                    unreachable!("matched just above");
                };
                drop(state);
                found = Some((cell, offer));
                break;
            }
        }
        if by_seq.is_empty() {
            offers.remove(key);
        }
        found
    }
}

/// What becomes of a grant delivered to a waiter that never took it (released, like a dropped
/// lock's).
pub(crate) type Orphan<G> = Box<dyn FnOnce(G) + Send + Sync>;

/// A waiter's offer, held by its acquire until the next attempt: [`Ticket::settle`] withdraws
/// it, or waits for the hand-over under way. Dropping it (the acquire returned, gave up or was
/// dropped) withdraws it; a grant delivered but not taken goes to its `orphan` function.
pub(crate) struct Ticket<G> {
    handovers: Arc<Handovers<G>>,
    key: String,
    seq: u64,
    cell: Arc<Cell<G>>,
    orphan: Option<Orphan<G>>,
}

impl<G> Ticket<G> {
    /// Registers `offer` for `key` (the waiter's member sequence `seq` orders it).
    pub(crate) fn offer(
        handovers: &Arc<Handovers<G>>,
        key: &str,
        seq: u64,
        offer: Offer,
        orphan: Orphan<G>,
    ) -> Ticket<G> {
        let cell = Arc::new(Cell {
            state: Mutex::new(State::Open(offer)),
            done: Notify::new(),
        });
        let old = handovers
            .lock()
            .entry(key.to_string())
            .or_default()
            .insert(seq, cell.clone());
        if old.is_none() {
            handovers.count.fetch_add(1, Ordering::Relaxed);
        }
        Ticket {
            handovers: handovers.clone(),
            key: key.to_string(),
            seq,
            cell,
            orphan: Some(orphan),
        }
    }

    /// Before the waiter's next attempt: the lock if it was handed over; `None` when the offer
    /// was still open (now withdrawn) or the hand-over failed. Waits at most one round (the
    /// release's, bounded by its node timeout) when one is under way.
    pub(crate) async fn settle(self) -> Option<G> {
        loop {
            let notified = self.cell.done.notified();
            {
                let mut state = self.cell.lock();
                match &mut *state {
                    State::Open(_) => {
                        *state = State::Left;
                        return None;
                    }
                    State::Done(grant) => return grant.take(),
                    State::Left => return None,
                    State::Taken => {}
                }
            }
            notified.await;
        }
    }
}

impl<G> Drop for Ticket<G> {
    fn drop(&mut self) {
        self.handovers.remove(&self.key, self.seq, &self.cell);
        let mut state = self.cell.lock();
        let left = std::mem::replace(&mut *state, State::Left);
        drop(state);
        // A grant delivered but never taken (the waiter stopped between the round and its
        // next attempt).
        if let (State::Done(Some(grant)), Some(orphan)) = (left, self.orphan.take()) {
            orphan(grant);
        }
    }
}

/// A waiter's side between its attempts: the offer of its last refused attempt, then the grant
/// handed over for its next one.
pub(crate) struct Handoff<G> {
    ticket: Mutex<Option<Ticket<G>>>,
    handed: Mutex<Option<G>>,
}

impl<G> Default for Handoff<G> {
    fn default() -> Self {
        Handoff {
            ticket: Mutex::new(None),
            handed: Mutex::new(None),
        }
    }
}

impl<G> std::fmt::Debug for Handoff<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handoff")
    }
}

impl<G> Handoff<G> {
    /// The offer of the attempt that just failed (replacing none: each attempt settles the
    /// previous one first).
    pub(crate) fn offered(&self, ticket: Option<Ticket<G>>) {
        *self.ticket.lock().unwrap_or_else(|p| p.into_inner()) = ticket;
    }

    /// Before an attempt: settles the last offer; `true` when it brought a grant (the next
    /// attempt takes it instead of sending anything).
    pub(crate) async fn settle(&self) -> bool {
        let ticket = self.ticket.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(ticket) = ticket else {
            return false;
        };
        let Some(grant) = ticket.settle().await else {
            return false;
        };
        *self.handed.lock().unwrap_or_else(|p| p.into_inner()) = Some(grant);
        true
    }

    /// Withdraws the last offer now (the waiter is leaving), as dropping it would.
    pub(crate) fn withdraw(&self) {
        let ticket = self.ticket.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(ticket);
    }

    /// The grant handed over, if any (taken once).
    pub(crate) fn take_handed(&self) -> Option<G> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}
