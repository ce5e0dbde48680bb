//! The release rounds that hand a lock to a waiter of the same `Redlock` (see `handover` for
//! the offers they take): as it is, with no command, while the holder's tenure allows it; or in
//! one `PASS` round that releases the holder's value and sets the waiter's.
//!
//! Owns: the two hand-overs and the clean-up of a failed one. Must not: keep the offers' books
//! (handover), decide when a waiter attempts (acquire_loop) or build a `Lock`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Vote, Votes};
use crate::base::reply::Passed;
use crate::nodes::batch::LineRef;
use crate::nodes::node::Held;
use crate::rounds::background;
use crate::rounds::handover::{Cell, Offer};
use crate::rounds::quorum::{self, fan_out_rest, Outcome};
use crate::rounds::redlock::{Grant, Inner};

/// What a holder's release needs to hand its lock over as it is: its deadline, and when a
/// round last set its keys (the start of its process's tenure).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tenure {
    pub(crate) deadline: Instant,
    pub(crate) keys_set_at: Instant,
}

/// A node's answer still running after a round was decided.
type LateVote = std::pin::Pin<Box<dyn std::future::Future<Output = Vote> + Send>>;

/// A hand-over under way: if the release's future is dropped before the round's outcome, the
/// waiter is told it failed and its value is released wherever it landed (the holder's own
/// `Lock`, still armed, releases the holder's value).
struct Taking<'a> {
    inner: &'a Arc<Inner>,
    cell: Option<Arc<Cell<Grant>>>,
    held: Arc<Held>,
    ttl: Duration,
}

impl<'a> Taking<'a> {
    fn new(inner: &'a Arc<Inner>, cell: Arc<Cell<Grant>>, offer: &Offer) -> Taking<'a> {
        Taking {
            inner,
            cell: Some(cell),
            held: offer.held.clone(),
            ttl: offer.ttl,
        }
    }

    /// The round's outcome for the waiter; a grant it can no longer take is given back.
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

impl Inner {
    /// A holder's release: handed to a waiter of this `Redlock` when one offered (see
    /// [`Inner::hand_over`]), otherwise released on every node ([`Inner::release_all`]).
    pub(crate) async fn release_or_hand_over(
        self: &Arc<Self>,
        held: &Arc<Held>,
        ttl: Duration,
        tenure: Option<Tenure>,
    ) -> Votes {
        if let Some(votes) = self.hand_over(held, ttl, tenure).await {
            crate::base::metrics::failures(&votes.0);
            return votes;
        }
        self.release_all(held, ttl).await
    }

    /// Whether the lock can go to `offer`'s waiter as it is: the holder's keys set by a round
    /// less than the hand-over window ago (and less than a tenth of the TTL: the waiter keeps
    /// at least nine tenths of its validity), the same TTL and label, a waiter that does not
    /// hold for a minimum (counted from the hand-over, it could outlast the keys).
    fn as_is(&self, held: &Held, ttl: Duration, tenure: &Tenure, offer: &Offer) -> bool {
        let now = Instant::now();
        let window = self.handover_window.min(ttl / 10);
        let since = now.saturating_duration_since(tenure.keys_set_at);
        let left = tenure.deadline.saturating_duration_since(now);
        offer.as_is
            && since < window
            && left >= offer.validity.saturating_sub(window)
            && offer.ttl == ttl
            && offer.held.label() == held.label()
    }

    /// Hands the lock to `offer`'s waiter as it is: its keys and token stay on the nodes, the
    /// waiter's lock has the holder's deadline, and nothing is sent but the waiter's leave from
    /// the line (handed to the gate's connection before the waiter can run, so it lands before
    /// anything the waiter sends there; nothing for a waiter that was not in the gate's line).
    /// `None` when the waiter left meanwhile: the holder
    /// still holds, and releases as usual.
    fn pass_as_is(
        self: &Arc<Self>,
        held: &Arc<Held>,
        line: &LineRef,
        tenure: Tenure,
        cell: Arc<Cell<Grant>>,
        offer: &Offer,
    ) -> Option<Votes> {
        let grant = Grant {
            held: Arc::new(Held {
                keys: held.keys.clone(),
                value: held.value.clone(),
                custom: false,
                resources: held.resources.clone(),
                fence_keys: Vec::new(),
                line: Some(line.granted()),
                repairs: Default::default(),
                wire: Default::default(),
                announce: held.announce.clone(),
                batched: Default::default(),
            }),
            t0: Instant::now(),
            deadline: tenure.deadline,
            fencing: None,
            handed: Some(tenure.keys_set_at),
        };
        // Before the grant is delivered: the waiter's leave is the first of its commands (none
        // for a waiter queued in the process, which has no place on the gate).
        if offer.lined {
            self.leave_now(line, &held.keys, &offer.member);
        }
        if cell.finish(Some(grant)).is_some() {
            return None;
        }
        // The holder's repairs stop here (the waiter's lock makes its own).
        held.repairs.close();
        self.line.mark_hot(&held.keys[0]);
        self.line.woke(&offer.member);
        Some(Votes(vec![Vote::Granted; self.nodes.len()]))
    }

    /// Takes `member` out of `line` on its gate: the command is handed to the gate's connection
    /// before this returns (the first poll); its answer is read in a task, and a failed leave
    /// is retried there (see `leave_line`).
    fn leave_now(self: &Arc<Self>, line: &LineRef, keys: &[String], member: &str) {
        let node = self.nodes[line.gate].clone();
        let spec = Arc::new((
            line.key.clone(),
            member.to_string(),
            self.line.prefix().to_string(),
        ));
        let mut call =
            Box::pin(node.leave_line(Arc::new(keys.to_vec()), spec, self.release_timeout()));
        let first = futures::FutureExt::poll_unpin(
            &mut call,
            &mut std::task::Context::from_waker(futures::task::noop_waker_ref()),
        );
        match first {
            std::task::Poll::Ready(Ok(_)) => {}
            std::task::Poll::Ready(Err(_)) => self.leave_line(
                line.gate,
                keys.to_vec(),
                line.key.clone(),
                member.to_string(),
            ),
            std::task::Poll::Pending => {
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                let inner = self.clone();
                let (gate, keys, line_key) = (line.gate, keys.to_vec(), line.key.clone());
                let member = member.to_string();
                rt.spawn(async move {
                    if call.await.is_err() {
                        inner.leave_line(gate, keys, line_key, member);
                    }
                });
            }
        }
    }
}

impl Inner {
    /// A holder's release that hands the lock to a waiter of this `Redlock`, when one offered
    /// (see `handover`'s doc): as it is, when `tenure` allows it ([`Inner::pass_as_is`]), or
    /// in one `PASS` round. `None`: nobody to hand over to, or the waiter left meanwhile; the
    /// caller releases as usual. Otherwise the holder's release votes (granted where its key is
    /// gone; everywhere for a lock handed over as it is).
    pub(crate) async fn hand_over(
        self: &Arc<Self>,
        held: &Arc<Held>,
        ttl: Duration,
        tenure: Option<Tenure>,
    ) -> Option<Votes> {
        // The common case (nobody of this Redlock waits): one atomic load.
        if !self.handovers.any() {
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
        if let Some(tenure) = tenure.filter(|t| self.as_is(held, ttl, t, &offer)) {
            return self.pass_as_is(held, line, tenure, cell, &offer);
        }
        let mut taking = Taking::new(self, cell, &offer);
        let gate = line.gate;
        let t0 = Instant::now();
        let timeout = self.release_timeout();
        let (mut ours, theirs, kept, late) = self.pass_round(held, &offer, gate).await;
        let deadline = t0.checked_add(offer.validity);
        let passed = theirs.0.get(gate) == Some(&Vote::Granted)
            && quorum::outcome(&theirs.0) == Outcome::Reached
            && deadline.is_some_and(|d| Instant::now() < d);
        match deadline.filter(|_| passed) {
            Some(deadline) => {
                if let Some(l) = &offer.held.line {
                    l.wake.store(true, std::sync::atomic::Ordering::Release);
                }
                self.line.mark_hot(key);
                let grant = Grant {
                    held: offer.held.clone(),
                    t0,
                    deadline,
                    fencing: None,
                    handed: None,
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
                // now. Refused there (another process's waiter is ahead): it waits on in its
                // place, or, queued in the process (no place), asks the gate now, which puts
                // it in line.
                if theirs.0.get(gate) == Some(&Vote::Granted) {
                    self.line.woke(&offer.member);
                } else if !offer.lined {
                    self.line.nudge(&offer.member);
                }
                // Our key on the gate, kept: the ordinary release, which wakes the line's head.
                if kept {
                    let release = self.nodes[gate].clone().release(held.clone(), timeout);
                    ours.0[gate] = release.await;
                }
            }
        }
        // Our key where the round failed or is still running: released in the background.
        background::finish_release(self, held, background::failed_nodes(&ours.0), late, ttl);
        Some(ours)
    }

    /// `PASS` on every node, decided once the gate answered and both outcomes (the holder's
    /// release, the waiter's acquire) are known: their votes, whether the gate kept our key
    /// (another process's waiter is ahead), and the holder's votes still running.
    async fn pass_round(
        &self,
        held: &Arc<Held>,
        offer: &Offer,
        gate: usize,
    ) -> (Votes, Votes, bool, Vec<(usize, LateVote)>) {
        let timeout = self.release_timeout();
        let calls = self.nodes.iter().enumerate().map(|(i, n)| {
            let call = n
                .clone()
                .pass(held.clone(), offer.held.clone(), offer.ttl_ms, timeout);
            (i, call)
        });
        let pick = |answers: &[Option<Passed>], f: fn(&Passed) -> &Vote| {
            let votes = answers
                .iter()
                .map(|p| p.as_ref().map_or(Vote::Pending, |p| f(p).clone()));
            Votes(votes.collect())
        };
        let (answers, late) = fan_out_rest(self.nodes.len(), calls, |a| {
            let known = |f| quorum::outcome(&pick(a, f).0) != Outcome::Undecided;
            a.get(gate).is_some_and(Option::is_some) && known(|p| &p.theirs) && known(|p| &p.ours)
        })
        .await;
        let kept = answers
            .get(gate)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.kept);
        let late = late
            .into_iter()
            .map(|(i, call)| -> (usize, LateVote) { (i, Box::pin(async move { call.await.ours })) })
            .collect();
        let (ours, theirs) = (pick(&answers, |p| &p.ours), pick(&answers, |p| &p.theirs));
        (ours, theirs, kept, late)
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
