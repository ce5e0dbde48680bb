//! Hand-over inside one process: a holder's release passes the lock straight to a waiter of the
//! same `Redlock` in one round, instead of a release round, a wake-up and the waiter's acquire
//! round.
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
//! Owns: offers and their state ([`Ticket`], the waiter's side), the release that hands over
//! (`Inner::hand_over`). Must not: decide when a waiter attempts (acquire_loop) or build a
//! `Lock` (lock: a handed grant is an attempt's grant).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::base::error::{Vote, Votes};
use crate::base::reply::Passed;
use crate::nodes::node::Held;
use crate::rounds::attempt::{Grant, Turn};
use crate::rounds::background;
use crate::rounds::quorum::{self, fan_out_rest, Outcome};
use crate::rounds::redlock::{Inner, Request};

/// What a waiter's next attempt would set, offered to a release of the same key.
pub(crate) struct Offer {
    held: Arc<Held>,
    member: Arc<str>,
    ttl_ms: u64,
    ttl: Duration,
    validity: Duration,
}

/// Where an offer stands.
enum State {
    Open(Offer),
    /// A release is handing the lock over (its round is running).
    Taken,
    /// Handed over: the waiter's grant, or `None` when the hand-over failed.
    Done(Option<Grant>),
    /// The waiter left (its acquire returned or was dropped): a grant arriving now is released.
    Left,
}

struct Cell {
    state: Mutex<State>,
    done: Notify,
}

impl Cell {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The round's outcome; a grant the waiter can no longer take is given back.
    fn finish(&self, grant: Option<Grant>) -> Option<Grant> {
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

/// The open offers of one `Redlock`, by key, then by member sequence (oldest first).
#[derive(Default)]
pub(crate) struct Handovers {
    offers: Mutex<HashMap<String, BTreeMap<u64, Arc<Cell>>>>,
    /// How many offers are registered: a release checks this before taking the mutex.
    count: AtomicUsize,
}

impl std::fmt::Debug for Handovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handovers")
            .field("offers", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl Handovers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, BTreeMap<u64, Arc<Cell>>>> {
        self.offers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, key: &str, seq: u64, offer: Offer) -> Arc<Cell> {
        let cell = Arc::new(Cell {
            state: Mutex::new(State::Open(offer)),
            done: Notify::new(),
        });
        let mut offers = self.lock();
        let old = offers
            .entry(key.to_string())
            .or_default()
            .insert(seq, cell.clone());
        if old.is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        cell
    }

    fn remove(&self, key: &str, seq: u64, cell: &Arc<Cell>) {
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

    /// The oldest open offer for `key`, marked taken.
    fn take(&self, key: &str) -> Option<(Arc<Cell>, Offer)> {
        if self.count.load(Ordering::Relaxed) == 0 {
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

/// A waiter's offer, held by its acquire until the next attempt: [`Ticket::settle`] withdraws
/// it, or waits for the hand-over under way. Dropping it (the acquire returned, gave up or was
/// dropped) withdraws it; a hand-over still running then releases what it got.
pub(crate) struct Ticket {
    inner: Arc<Inner>,
    key: String,
    seq: u64,
    ttl: Duration,
    cell: Arc<Cell>,
}

impl Ticket {
    /// Before the waiter's next attempt: the lock if it was handed over; `None` when the offer
    /// was still open (now withdrawn) or the hand-over failed. Waits at most one round (the
    /// release's, bounded by its node timeout) when one is under way.
    pub(crate) async fn settle(self) -> Option<Grant> {
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

impl Drop for Ticket {
    fn drop(&mut self) {
        self.inner.handovers.remove(&self.key, self.seq, &self.cell);
        let mut state = self.cell.lock();
        let left = std::mem::replace(&mut *state, State::Left);
        drop(state);
        // A grant delivered but never taken (the waiter stopped between the round and its
        // next attempt): its keys are released like a dropped lock's.
        if let State::Done(Some(grant)) = left {
            let why = "a handed-over lock nobody took";
            background::spawn_release(self.inner.clone(), grant.held, self.ttl, why);
        }
    }
}

/// A hand-over under way: if the release's future is dropped before the round's outcome, the
/// waiter is told it failed and its value is released wherever it landed (the holder's own
/// `Lock`, still armed, releases the holder's value).
struct Taking<'a> {
    inner: &'a Arc<Inner>,
    cell: Option<Arc<Cell>>,
    held: Arc<Held>,
    ttl: Duration,
}

impl Taking<'_> {
    fn finish(&mut self, grant: Option<Grant>) -> Option<Grant> {
        self.cell.take()?.finish(grant)
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            let why = "a hand-over dropped mid-round";
            background::spawn_release(self.inner.clone(), self.held.clone(), self.ttl, why);
            cell.finish(None);
        }
    }
}

/// A waiter's side between its attempts: the offer of its last refused attempt, then the grant
/// handed over for its next one.
#[derive(Default)]
pub(crate) struct Handoff {
    ticket: Mutex<Option<Ticket>>,
    handed: Mutex<Option<Grant>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handoff")
    }
}

impl Handoff {
    /// The offer of the attempt that just failed (replacing none: each attempt settles the
    /// previous one first).
    pub(crate) fn offered(&self, ticket: Option<Ticket>) {
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

    /// The grant handed over, if any (taken once).
    pub(crate) fn take_handed(&self) -> Option<Grant> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Inner {
    /// The offer a waiter refused with its place in line makes for its next attempt; `None` when
    /// the request cannot be handed over (several keys, fencing, a caller's token, a node that
    /// cannot run `PASS`).
    pub(crate) fn offer(self: &Arc<Self>, req: &Request, turn: &Turn) -> Option<Ticket> {
        let member = turn.member.clone()?;
        let [key] = req.keys.as_slice() else {
            return None;
        };
        if req.token.is_some() || !req.fence_keys.is_empty() || req.line.is_none() {
            return None;
        }
        if !self.nodes.iter().all(|n| n.can_pass()) {
            return None;
        }
        let seq = member.rsplit(':').next()?.parse::<u64>().ok()?;
        let offer = Offer {
            held: self.held_for(req, turn),
            member,
            ttl_ms: req.ttl_ms,
            ttl: req.ttl,
            validity: req.validity,
        };
        let ttl = req.ttl;
        let cell = self.handovers.add(key, seq, offer);
        Some(Ticket {
            inner: self.clone(),
            key: key.clone(),
            seq,
            ttl,
            cell,
        })
    }

    /// A holder's release that hands the lock to a waiter of this `Redlock`, when one offered
    /// (see the module's doc). `None`: nobody to hand over to; the caller releases as usual.
    /// Otherwise the holder's release votes (granted where its key is gone).
    pub(crate) async fn hand_over(
        self: &Arc<Self>,
        held: &Arc<Held>,
        ttl: Duration,
    ) -> Option<Votes> {
        // The common case (nobody of this Redlock waits): one atomic load.
        if self.handovers.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let line = held.line.as_ref()?;
        let [key] = held.keys.as_slice() else {
            return None;
        };
        if held.custom || !held.fence_keys.is_empty() {
            return None;
        }
        // A node that stopped running scripts since the offer: the usual release (the offer
        // stays; its waiter withdraws it at its next look at the gate).
        if !self.nodes.iter().all(|n| n.can_pass()) {
            return None;
        }
        let (cell, offer) = self.handovers.take(key)?;
        let mut taking = Taking {
            inner: self,
            cell: Some(cell),
            held: offer.held.clone(),
            ttl: offer.ttl,
        };
        let t0 = Instant::now();
        let timeout = self.release_timeout();
        let calls = self.nodes.iter().enumerate().map(|(i, n)| {
            let call = n
                .clone()
                .pass(held.clone(), offer.held.clone(), offer.ttl_ms, timeout);
            (i, call)
        });
        let gate = line.gate;
        let (answers, late) = fan_out_rest(self.nodes.len(), calls, |a| {
            let known = |pick: fn(&Passed) -> &Vote| {
                let votes: Vec<Vote> = a
                    .iter()
                    .map(|p| p.as_ref().map_or(Vote::Pending, |p| pick(p).clone()))
                    .collect();
                quorum::outcome(&votes) != Outcome::Undecided
            };
            a.get(gate).is_some_and(Option::is_some) && known(|p| &p.theirs) && known(|p| &p.ours)
        })
        .await;
        let pick = |f: fn(&Passed) -> &Vote| {
            Votes(
                answers
                    .iter()
                    .map(|p| p.as_ref().map_or(Vote::Pending, |p| f(p).clone()))
                    .collect(),
            )
        };
        let (mut ours, theirs) = (pick(|p| &p.ours), pick(|p| &p.theirs));
        let kept = answers
            .get(gate)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.kept);
        let deadline = t0.checked_add(offer.validity);
        let passed = theirs.0.get(gate) == Some(&Vote::Granted)
            && quorum::outcome(&theirs.0) == Outcome::Reached
            && deadline.is_some_and(|d| Instant::now() < d);
        match deadline.filter(|_| passed) {
            Some(deadline) => {
                if let Some(l) = &offer.held.line {
                    l.wake.store(true, Ordering::Release);
                }
                self.line.mark_hot(key);
                let grant = Grant {
                    held: offer.held.clone(),
                    t0,
                    deadline,
                    fencing: None,
                };
                match taking.finish(Some(grant)) {
                    // The waiter left meanwhile: its lock is released.
                    Some(orphan) => {
                        let all = 0..self.nodes.len();
                        self.release_unawaited(&orphan.held, all, offer.ttl).await;
                    }
                    None => self.line.woke(&offer.member),
                }
            }
            None => {
                // The waiter's value wherever it may be, like a failed attempt's clean-up.
                let targets = (0..theirs.0.len()).filter(|&i| theirs.0[i] != Vote::Refused);
                if kept {
                    // Awaited: the head our release wakes below must not find it in its way.
                    self.clean_up(&offer.held, targets, offer.ttl).await;
                } else {
                    // Handed to the connections before the waiter attempts again.
                    self.release_unawaited(&offer.held, targets, offer.ttl)
                        .await;
                }
                taking.finish(None);
                // Passed on the gate (its clean-up puts the waiter back at the front): its turn
                // now. Refused there (another process's waiter is ahead): it waits on.
                if theirs.0.get(gate) == Some(&Vote::Granted) {
                    self.line.woke(&offer.member);
                }
                // Our key on the gate, kept: the ordinary release, which wakes the line's head.
                if kept {
                    let release = self.nodes[gate].clone().release(held.clone(), timeout);
                    ours.0[gate] = release.await;
                }
            }
        }
        // Our key where the round failed or is still running: released in the background.
        let late = late
            .into_iter()
            .map(|(i, call)| (i, Box::pin(async move { call.await.ours })))
            .collect::<Vec<_>>();
        background::finish_release(self, held, background::failed_nodes(&ours.0), late, ttl);
        Some(ours)
    }

    /// Releases `held` on `targets` and waits for the answers (within the release timeout);
    /// those that failed are retried in the background.
    async fn clean_up(
        self: &Arc<Self>,
        held: &Arc<Held>,
        targets: impl Iterator<Item = usize>,
        ttl: Duration,
    ) {
        let timeout = self.release_timeout();
        let calls = targets.map(|i| {
            let call = self.nodes[i].clone().release(held.clone(), timeout);
            async move { (i, call.await) }
        });
        let answers = futures::future::join_all(calls).await;
        let failed = answers
            .into_iter()
            .filter(|(_, vote)| background::is_failed(vote))
            .map(|(i, _)| i)
            .collect();
        let none: Vec<(usize, std::future::Ready<Vote>)> = Vec::new();
        background::finish_release(self, held, failed, none, ttl);
    }
}
