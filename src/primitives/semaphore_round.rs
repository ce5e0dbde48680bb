//! The slot-choosing round of a [`Semaphore`](crate::Semaphore): one attempt at a permit.
//! Every node takes the first free slot in one shared, randomly rotated order, in one script;
//! a slot set by a quorum is granted, the partial grants elsewhere are released. With a wait
//! line, a waiter not known to be its head asks the gate alone first.
//!
//! Owns: one attempt (send, settle, grant or refuse), the tally of slot answers, the clean-up
//! of a refused or dropped attempt. Must not: retry (the acquire loop does), count holders per
//! node, or know the public [`Permit`](crate::Permit) type (it hands back a lock and its slot).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{InvalidInput, Vote, Votes};
use crate::nodes::node::{Held, LineRef, Queue, Slot};
use crate::nodes::node_primitives::SlotRequest;
use crate::rounds::attempt::{fencing_tokens, Failure, Grant, Turn};
use crate::rounds::lock::Lock;
use crate::rounds::quorum::{self, fan_out, Late, Outcome};
use crate::rounds::redlock::{new_token, spawn_release, Redlock, RESERVED};

/// One semaphore's slots, as an attempt sees them.
#[derive(Clone, Copy)]
pub(crate) struct Slots<'a> {
    pub(crate) redlock: &'a Redlock,
    pub(crate) name: &'a str,
    pub(crate) permits: usize,
}

/// One attempt's parameters.
pub(crate) struct Attempt<'a> {
    pub(crate) ttl: Duration,
    pub(crate) ttl_ms: u64,
    pub(crate) validity: Duration,
    pub(crate) timeout: Duration,
    /// The semaphore's gate and line key.
    pub(crate) gate: Option<(usize, &'a str)>,
    pub(crate) turn: Turn,
}

/// One attempt's slots and answers, between its steps.
struct Taken {
    /// The slots in the order every node tried them (randomly rotated).
    order: Vec<usize>,
    slot_keys: Vec<String>,
    value: String,
    /// Our token on every slot: what a refused or dropped attempt releases.
    all_slots: Arc<Held>,
    t0: Instant,
    deadline: Instant,
    answers: Vec<Option<Slot>>,
    /// Which nodes were sent the request.
    sent: Vec<bool>,
}

impl Slots<'_> {
    /// The resource name of slot `i`.
    pub(crate) fn slot_resource(&self, i: usize) -> String {
        crate::base::slots::semaphore_part(RESERVED, self.name, &i.to_string())
    }

    /// The key recording the semaphore's number of permits (and naming its wait line).
    pub(crate) fn meta_key(&self) -> String {
        self.redlock.key(&crate::base::slots::semaphore_part(
            RESERVED, self.name, "permits",
        ))
    }

    /// The slots in a random rotation (the order every node of one attempt tries them), their
    /// lock keys and, with fencing, their counters' keys.
    fn rotated(&self) -> (Vec<usize>, Vec<String>, Vec<String>) {
        let start = rand::random_range(0..self.permits);
        let order: Vec<usize> = (0..self.permits)
            .map(|k| (start + k) % self.permits)
            .collect();
        let slot_keys: Vec<String> = order
            .iter()
            .map(|&i| self.redlock.key(&self.slot_resource(i)))
            .collect();
        let fence_keys = if self.redlock.inner.fencing {
            order
                .iter()
                .map(|&i| self.redlock.fence_key(&self.slot_resource(i)))
                .collect()
        } else {
            Vec::new()
        };
        (order, slot_keys, fence_keys)
    }

    /// One attempt: every node takes the first free slot in one shared, randomly rotated
    /// order. A grant is the slot's lock and the slot.
    pub(crate) async fn attempt(
        &self,
        at: Attempt<'_>,
    ) -> std::result::Result<(Lock, usize), Failure> {
        let Attempt {
            ttl,
            ttl_ms,
            validity,
            timeout,
            gate,
            turn,
        } = at;
        let inner = &self.redlock.inner;
        let line = |turn: &Turn| gate.map(|(g, key)| inner.line_ref(g, key, turn));
        let n = inner.nodes.len();
        let (order, slot_keys, fence_keys) = self.rotated();
        // The Redlock's owner label, stored with the permit like a lock's.
        let value = crate::base::owner::value(&new_token(), &inner.label);
        let req = Arc::new(SlotRequest {
            meta_key: self.meta_key(),
            slot_keys: slot_keys.clone(),
            fence_keys,
            value: value.clone(),
            ttl_ms,
            line: line(&turn),
        });
        // Armed until settled: a dropped attempt releases our token from every slot, everywhere.
        let all_slots = Arc::new(Held {
            keys: slot_keys.clone(),
            value: value.clone(),
            custom: false,
            resources: vec![self.name.to_string()],
            fence_keys: Vec::new(),
            line: line(&turn),
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        });
        let mut guard = Guard(Some((self.redlock.clone(), all_slots.clone())), ttl);
        let t0 = Instant::now();
        let Some(deadline) = t0.checked_add(validity) else {
            guard.0 = None;
            return Err(Failure::Expired(Duration::ZERO));
        };
        let (answers, sent) = match gate {
            Some((g, _)) if turn.probe => self.probe_round(&req, g, deadline, timeout).await,
            _ => (
                self.slot_round(&req, None, deadline, timeout).await,
                vec![true; n],
            ),
        };
        let at_gate = gate.and_then(|(g, _)| answers[g].as_ref());
        // Told here, answered or not: a slot's late answer is not awaited (its place is left
        // at once, as after a refusal).
        turn.gated.tell(matches!(at_gate, Some(Slot::Took { .. })));
        let waiting = match at_gate {
            Some(Slot::Waiting(rank)) => Some(*rank),
            _ => None,
        };
        let taken = Taken {
            order,
            slot_keys,
            value,
            all_slots,
            t0,
            deadline,
            answers,
            sent,
        };
        // Refused by the gate's line: no grant, whatever the other nodes said (see
        // `Redlock::attempt`).
        if let Some(rank) = waiting {
            if rank > 0 || winning_position(&taken.answers, self.permits, inner.quorum).is_none() {
                let votes = slot_votes(&taken.answers, None);
                self.release_everywhere(&taken, guard, ttl).await;
                return Err(Failure::Queued(
                    votes,
                    Queue {
                        rank,
                        exact: true,
                        pttl: -1,
                    },
                ));
            }
        }
        self.settle(taken, guard, ttl, timeout, || {
            line(&turn).map(|l| l.granted())
        })
        .await
    }

    /// The answers are in: grant the slot a quorum set within the validity (with its fencing
    /// token raised on a quorum, when fencing is on), or refuse.
    async fn settle(
        &self,
        t: Taken,
        mut guard: Guard,
        ttl: Duration,
        timeout: Duration,
        line: impl FnOnce() -> Option<LineRef>,
    ) -> std::result::Result<(Lock, usize), Failure> {
        let inner = &self.redlock.inner;
        let now = Instant::now();
        let winner = winning_position(&t.answers, self.permits, inner.quorum);
        let votes = slot_votes(&t.answers, winner);
        let mut failure = None;
        if let (Some(position), true) = (winner, now < t.deadline) {
            let slot = t.order[position];
            match self.fence(&t, &votes, slot, timeout).await {
                Ok(fencing) => {
                    guard.0 = None;
                    let lock = self.grant(t, position, fencing, ttl, line()).await;
                    return Ok((lock, slot));
                }
                Err(f) => failure = Some(f),
            }
        }
        self.refuse(t, guard, ttl, failure, votes, now).await
    }

    /// With fencing, raises the winning slot's counter on a quorum: its tokens, or the
    /// failure when no quorum raised it within the validity. `None` without fencing.
    async fn fence(
        &self,
        t: &Taken,
        votes: &Votes,
        slot: usize,
        timeout: Duration,
    ) -> std::result::Result<Option<Vec<u64>>, Failure> {
        let inner = &self.redlock.inner;
        if !inner.fencing {
            return Ok(None);
        }
        let counters: Vec<Option<Vec<u64>>> = t
            .answers
            .iter()
            .map(|a| match a {
                Some(Slot::Took { counter, .. }) => Some(vec![*counter]),
                _ => None,
            })
            .collect();
        let tokens = fencing_tokens(votes, &counters, 1);
        let key = [self.redlock.fence_key(&self.slot_resource(slot))];
        let raised = inner.raise_fence(&key, &tokens, t.deadline, timeout).await;
        let now = Instant::now();
        if quorum::outcome(&raised.0) == Outcome::Reached && now < t.deadline {
            Ok(Some(tokens))
        } else if now < t.deadline {
            Err(Failure::Unavailable(raised))
        } else {
            Err(Failure::Expired(now.duration_since(t.t0)))
        }
    }

    /// The slot at `position` is ours: drop our token from the other slots, hand out the lock.
    async fn grant(
        &self,
        t: Taken,
        position: usize,
        fencing: Option<Vec<u64>>,
        ttl: Duration,
        line: Option<LineRef>,
    ) -> Lock {
        let inner = &self.redlock.inner;
        let n = inner.nodes.len();
        // Nodes that set another slot, or may have: drop our token from the others.
        let others = Arc::new(Held {
            keys: t
                .slot_keys
                .iter()
                .enumerate()
                .filter(|(p, _)| *p != position)
                .map(|(_, k)| k.clone())
                .collect(),
            ..clone_held(&t.all_slots)
        });
        let strays = (0..n).filter(|&i| may_hold_other(&t.answers[i], position));
        inner.release_unawaited(&others, strays, ttl).await;
        let held = Arc::new(Held {
            keys: vec![t.slot_keys[position].clone()],
            value: t.value,
            custom: false,
            resources: vec![self.slot_resource(t.order[position])],
            fence_keys: Vec::new(),
            // Its release wakes the semaphore's line.
            line,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        });
        let grant = Grant {
            held,
            t0: t.t0,
            deadline: t.deadline,
            fencing,
            handed: None,
        };
        Lock::from_grant(self.redlock.clone(), grant, ttl)
    }

    /// No grant: release our token wherever it may be (without waiting), and say why.
    async fn refuse(
        &self,
        t: Taken,
        guard: Guard,
        ttl: Duration,
        failure: Option<Failure>,
        votes: Votes,
        now: Instant,
    ) -> std::result::Result<(Lock, usize), Failure> {
        let (n, q) = (self.redlock.inner.nodes.len(), self.redlock.inner.quorum);
        self.release_everywhere(&t, guard, ttl).await;
        let mismatch = t
            .answers
            .iter()
            .filter_map(|a| match a {
                Some(Slot::Mismatch(p)) => Some(p.clone()),
                _ => None,
            })
            .collect::<Vec<_>>();
        if mismatch.len() >= q {
            return Err(Failure::Rejected(InvalidInput::PermitsMismatch {
                name: self.name.to_string(),
                asked: self.permits,
                existing: mismatch[0].clone(),
            }));
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        if now >= t.deadline && votes.0.contains(&Vote::Pending) {
            return Err(Failure::Expired(now.duration_since(t.t0)));
        }
        if votes.failed() > n - q {
            Err(Failure::Unavailable(votes))
        } else {
            Err(Failure::Contended(votes))
        }
    }

    /// Releases our token from every slot on every node that was sent the attempt and may
    /// hold it (without waiting), then disarms the guard.
    async fn release_everywhere(&self, t: &Taken, mut guard: Guard, ttl: Duration) {
        let targets = (0..self.redlock.inner.nodes.len())
            .filter(|&i| t.sent[i] && may_hold_other(&t.answers[i], usize::MAX));
        self.redlock
            .inner
            .release_unawaited(&t.all_slots, targets, ttl)
            .await;
        guard.0 = None;
    }

    /// Every node (but `skip`) takes a slot at once, decided as soon as a slot's fate is known.
    async fn slot_round(
        &self,
        req: &Arc<SlotRequest>,
        skip: Option<(usize, Slot)>,
        deadline: Instant,
        timeout: Duration,
    ) -> Vec<Option<Slot>> {
        let inner = &self.redlock.inner;
        let (n, q, permits) = (inner.nodes.len(), inner.quorum, self.permits);
        let skipped = skip.as_ref().map(|(i, _)| *i);
        let calls = inner
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != skipped)
            .map(|(i, node)| (i, node.clone().take_slot(req.clone(), timeout)));
        let known = skip.clone();
        let mut answers = fan_out(
            n,
            calls,
            Some(deadline),
            Late::Finish,
            move |a| match &known {
                Some((i, s)) => {
                    let mut all = a.to_vec();
                    all[*i] = Some(s.clone());
                    decided(&all, permits, q)
                }
                None => decided(a, permits, q),
            },
        )
        .await;
        if let Some((i, s)) = skip {
            answers[i] = Some(s);
        }
        answers
    }

    /// The gate alone first, then (if it took a slot) every other node; also which nodes
    /// were sent anything.
    async fn probe_round(
        &self,
        req: &Arc<SlotRequest>,
        gate: usize,
        deadline: Instant,
        timeout: Duration,
    ) -> (Vec<Option<Slot>>, Vec<bool>) {
        let inner = &self.redlock.inner;
        let n = inner.nodes.len();
        let call = inner.nodes[gate].clone().take_slot(req.clone(), timeout);
        let mut first = fan_out(n, [(gate, call)], Some(deadline), Late::Finish, |a| {
            a[gate].is_some()
        })
        .await;
        match first[gate].take() {
            Some(took @ Slot::Took { .. }) => {
                let answers = self
                    .slot_round(req, Some((gate, took)), deadline, timeout)
                    .await;
                (answers, vec![true; n])
            }
            other => {
                first[gate] = other;
                let mut sent = vec![false; n];
                sent[gate] = true;
                (first, sent)
            }
        }
    }
}

/// Decided once some position has a quorum, or none can reach one any more.
fn decided(answers: &[Option<Slot>], permits: usize, q: usize) -> bool {
    let unanswered = answers.iter().filter(|a| a.is_none()).count();
    let best = best_position(answers, permits).map_or(0, |(_, c)| c);
    best >= q || best + unanswered < q
}

fn best_position(answers: &[Option<Slot>], permits: usize) -> Option<(usize, usize)> {
    let mut counts = vec![0usize; permits];
    for a in answers.iter().flatten() {
        if let Slot::Took { position, .. } = a {
            counts[*position] += 1;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .max_by_key(|&(_, c)| c)
        .filter(|&(_, c)| c > 0)
}

fn winning_position(answers: &[Option<Slot>], permits: usize, q: usize) -> Option<usize> {
    best_position(answers, permits)
        .filter(|&(_, c)| c >= q)
        .map(|(p, _)| p)
}

/// Whether node's answer leaves our token on some slot other than `position`: it set another
/// slot, or its outcome is unknown.
fn may_hold_other(answer: &Option<Slot>, position: usize) -> bool {
    match answer {
        Some(Slot::Took { position: p, .. }) => *p != position,
        Some(Slot::Full) | Some(Slot::Waiting(_)) | Some(Slot::Mismatch(_)) => false,
        Some(Slot::Failed(_)) | None => true,
    }
}

/// Per node, as votes (for errors): the winning slot is a grant, another slot or a full
/// semaphore a refusal.
fn slot_votes(answers: &[Option<Slot>], winner: Option<usize>) -> Votes {
    Votes(
        answers
            .iter()
            .map(|a| match a {
                Some(Slot::Took { position, .. }) if Some(*position) == winner => Vote::Granted,
                Some(Slot::Took { .. })
                | Some(Slot::Full)
                | Some(Slot::Waiting(_))
                | Some(Slot::Mismatch(_)) => Vote::Refused,
                Some(Slot::Failed(e)) => Vote::Failed(e.clone()),
                None => Vote::Pending,
            })
            .collect(),
    )
}

fn clone_held(h: &Held) -> Held {
    Held {
        keys: h.keys.clone(),
        value: h.value.clone(),
        custom: h.custom,
        resources: h.resources.clone(),
        fence_keys: h.fence_keys.clone(),
        line: None,
        repairs: Default::default(),
        wire: Default::default(),
        announce: Default::default(),
        batched: Default::default(),
    }
}

/// Releases an attempt's token from every slot on every node if the attempt is dropped.
struct Guard(Option<(Redlock, Arc<Held>)>, Duration);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some((redlock, held)) = self.0.take() {
            spawn_release(
                redlock.inner.clone(),
                held,
                self.1,
                "semaphore acquire cancelled",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn took(position: usize) -> Option<Slot> {
        Some(Slot::Took {
            position,
            counter: 0,
        })
    }

    #[test]
    fn a_slot_needs_a_quorum_of_the_same_position() {
        // N = 3, q = 2: two nodes on slot 1 win; a split 0/1/2 decides "none".
        let a = [took(1), took(1), None];
        assert!(decided(&a, 4, 2));
        assert_eq!(winning_position(&a, 4, 2), Some(1));
        let split = [took(0), took(1), took(2)];
        assert!(decided(&split, 4, 2));
        assert_eq!(winning_position(&split, 4, 2), None);
        let open = [took(0), None, Some(Slot::Full)];
        assert!(!decided(&open, 4, 2));
        let lost = [took(0), Some(Slot::Full), Some(Slot::Full)];
        assert!(decided(&lost, 4, 2));
        assert_eq!(winning_position(&lost, 4, 2), None);
    }

    #[test]
    fn clean_up_targets() {
        assert!(!may_hold_other(&took(1), 1));
        assert!(may_hold_other(&took(0), 1));
        assert!(may_hold_other(&None, 1));
        assert!(!may_hold_other(&Some(Slot::Full), 1));
    }
}
