//! A counting semaphore that stays safe under a quorum: at most `permits` holders of one name,
//! across the fleet, under every fault a Redlock mutex survives.
//!
//! Why not per-node counting (one sorted set per node, a quorum vote on "fewer than N members"):
//! different majorities can admit different holders, so a partition admits more holders than
//! permits. Here each permit IS a Redlock mutex: a semaphore of `p` permits has `p` slots, each a
//! lock key, and a permit is a quorum grant of one slot. Two holders of one slot are excluded as
//! any two holders of a lock are, so at most `p` hold a permit at any instant.
//!
//! One round in the common case: every node gets the same (randomly rotated) order of slots and
//! sets the first free one, in one script; a slot set by a quorum is granted. When nodes pick
//! different slots (they saw different free slots), no slot may reach a quorum: the partial
//! grants are released and the attempt counts as contended. Every slot gets its own fencing
//! counter when fencing is on.
//!
//! The number of permits is recorded per name on every node (a key without expiry): asking for
//! another number under the same name is rejected ([`InvalidInput::PermitsMismatch`]), since two
//! numbers at once would admit more holders than the smaller one allows.
//!
//! Owns: slots, the slot-choosing round, [`Permit`]. Must not: count holders per node.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire_loop::WaitLine;
use crate::error::{InvalidInput, NodeError, NodeErrorKind, Result, Vote, Votes};
use crate::inspect::{Holder, Inspection, NodeView};
use crate::keepalive::{KeepAlive, KeepAliveOptions, Rejected};
use crate::lock::{Lock, ReleaseReport};
use crate::node::{Held, Queue, Slot, SlotRequest};
use crate::quorum::{self, fan_out, Late, Outcome};
use crate::redlock::{
    fencing_tokens, new_token, spawn_release, Failure, Grant, Redlock, Turn, RESERVED,
};

/// The most permits one semaphore may have (each acquire script walks the slots).
pub const MAX_PERMITS: usize = 1024;

/// A semaphore of `permits` slots over a [`Redlock`]'s nodes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore {
    redlock: Redlock,
    name: String,
    permits: usize,
}

/// One permit of a [`Semaphore`]: a quorum lock on one of its slots. Extend, release and keep
/// it alive exactly like a [`Lock`]; dropping it releases it in the background.
#[must_use = "dropping a Permit releases it at once"]
#[derive(Debug)]
pub struct Permit {
    lock: Lock,
    slot: usize,
}

/// Every slot of a semaphore, node by node. See [`Semaphore::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreInspection {
    /// The semaphore's name.
    pub name: String,
    /// Its number of permits (slots).
    pub permits: usize,
    /// One inspection per slot, in slot order; a slot is held when [`Inspection::holder`] is
    /// `Some` (its token is on a quorum of nodes).
    pub slots: Vec<Inspection>,
}

impl SemaphoreInspection {
    /// How many slots are held on a quorum.
    pub fn held(&self) -> usize {
        self.slots.iter().filter(|s| s.holder().is_some()).count()
    }
}

impl Redlock {
    /// A semaphore named `name` with `permits` permits (1 to [`MAX_PERMITS`]): at most that many
    /// holders at once across every client of these nodes. `permits = 1` is a mutex. Nothing is
    /// sent until the first acquire.
    ///
    /// Errors: [`InvalidInput`] for an empty name, a name starting with `~`, or a number of
    /// permits out of range. Using one name with two numbers of permits is rejected at acquire
    /// ([`InvalidInput::PermitsMismatch`]).
    pub fn semaphore(&self, name: impl Into<String>, permits: usize) -> Result<Semaphore> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource.into());
        }
        if name.starts_with(RESERVED) {
            return Err(InvalidInput::ReservedResource(name).into());
        }
        if permits == 0 {
            return Err(InvalidInput::ZeroPermits.into());
        }
        if permits > MAX_PERMITS {
            return Err(InvalidInput::TooManyPermits {
                asked: permits,
                max: MAX_PERMITS,
            }
            .into());
        }
        let semaphore = Semaphore {
            redlock: self.clone(),
            name,
            permits,
        };
        // One script takes the semaphore's keys: on a cluster node they must share a slot.
        let mut keys = vec![semaphore.meta_key()];
        for i in 0..permits {
            keys.push(self.key(&semaphore.slot_resource(i)));
            if self.inner.fencing {
                keys.push(self.fence_key(&semaphore.slot_resource(i)));
            }
        }
        self.check_slots(&keys)?;
        Ok(semaphore)
    }
}

impl Semaphore {
    /// The name given to [`Redlock::semaphore`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of permits.
    pub fn permits(&self) -> usize {
        self.permits
    }

    /// The resource name of slot `i` (its lock key is [`Redlock::key`] of it).
    pub fn slot_resource(&self, i: usize) -> String {
        crate::slots::semaphore_part(RESERVED, &self.name, &i.to_string())
    }

    fn meta_key(&self) -> String {
        self.redlock.key(&crate::slots::semaphore_part(
            RESERVED, &self.name, "permits",
        ))
    }

    /// Takes a permit for `ttl`, retrying per the Redlock's [`crate::Retry`] while every permit
    /// is taken or nodes fail. Errors as [`Redlock::acquire`], plus
    /// [`InvalidInput::PermitsMismatch`].
    ///
    /// Cancellation: dropping the future releases whatever the current attempt may have set,
    /// on every node, in the background.
    pub async fn acquire(&self, ttl: Duration) -> Result<Permit> {
        self.acquire_inner(ttl, self.redlock.inner.retry, None)
            .await
    }

    /// Like [`acquire`](Self::acquire), bounded by `wait` instead of a number of attempts (as
    /// [`Redlock::acquire_with`]; `Duration::MAX` waits without a limit).
    ///
    /// Cancellation: as for [`acquire`](Self::acquire).
    pub async fn acquire_with(&self, ttl: Duration, wait: Duration) -> Result<Permit> {
        self.acquire_inner(ttl, self.redlock.inner.retry, Some(wait))
            .await
    }

    /// One attempt: `Ok(None)` when every permit is taken.
    ///
    /// Cancellation: as for [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Permit>> {
        match self.acquire_inner(ttl, crate::Retry::once(), None).await {
            Ok(p) => Ok(Some(p)),
            Err(crate::Error::Contended { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn acquire_inner(
        &self,
        ttl: Duration,
        retry: crate::Retry,
        wait: Option<Duration>,
    ) -> Result<Permit> {
        // Validates the TTL exactly as a lock's (the slot name is ours, so unchecked).
        let req = self
            .redlock
            .request_unchecked(vec![self.slot_resource(0)], ttl)?;
        let name = [self.name.clone()];
        let span = tracing::debug_span!("fredlock.semaphore", name = %self.name, permits = self.permits, attempt = tracing::field::Empty);
        // One wait line per semaphore, on the gate of its `permits` record; a waiter is woken
        // by the release of any slot.
        let meta = self.meta_key();
        let gate = self.redlock.inner.gate_of(&meta);
        let line_key = crate::slots::line_key(&self.redlock.inner.key_prefix, &meta);
        let line = gate.map(|gate| WaitLine {
            gate,
            line_key: line_key.clone(),
            keys: (0..self.permits)
                .map(|i| self.redlock.key(&self.slot_resource(i)))
                .collect(),
            hot: meta.clone(),
        });
        let gate = gate.map(|g| (g, line_key.as_str()));
        let req = &req;
        let attempt = |turn: Turn| async move {
            let at = Attempt {
                ttl,
                ttl_ms: req.ttl_ms,
                validity: req.validity,
                timeout: req.timeout,
                gate,
                turn,
            };
            self.attempt(at).await
        };
        tracing::Instrument::instrument(
            self.redlock
                .with_retries(retry, wait, &name, line, ttl, attempt),
            span,
        )
        .await
    }

    /// One attempt: every node takes the first free slot in one shared, randomly rotated order.
    async fn attempt(&self, at: Attempt<'_>) -> std::result::Result<Permit, Failure> {
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
        let q = inner.quorum;
        let start = rand::random_range(0..self.permits);
        let order: Vec<usize> = (0..self.permits)
            .map(|k| (start + k) % self.permits)
            .collect();
        let slot_keys: Vec<String> = order
            .iter()
            .map(|&i| self.redlock.key(&self.slot_resource(i)))
            .collect();
        let fence_keys = if inner.fencing {
            order
                .iter()
                .map(|&i| self.redlock.fence_key(&self.slot_resource(i)))
                .collect()
        } else {
            Vec::new()
        };
        // The Redlock's owner label, stored with the permit like a lock's.
        let value = crate::owner::value(&new_token(), &inner.label);
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
            resources: vec![self.name.clone()],
            fence_keys: Vec::new(),
            line: line(&turn),
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
        turn.gated.store(
            matches!(at_gate, Some(Slot::Took { .. })),
            std::sync::atomic::Ordering::Relaxed,
        );
        // Refused by the gate's line: no grant, whatever the other nodes said (see
        // `Redlock::attempt`).
        if let Some(Slot::Waiting(rank)) = at_gate {
            let winner = winning_position(&answers, self.permits, q);
            if *rank > 0 || winner.is_none() {
                let rank = *rank;
                let targets =
                    (0..n).filter(|&i| sent[i] && may_hold_other(&answers[i], usize::MAX));
                inner.release_unawaited(&all_slots, targets, ttl).await;
                guard.0 = None;
                let votes = slot_votes(&answers, None);
                return Err(Failure::Queued(votes, Queue { rank, pttl: -1 }));
            }
        }
        let mut now = Instant::now();
        let winner = winning_position(&answers, self.permits, q);
        let mismatch = answers
            .iter()
            .filter_map(|a| match a {
                Some(Slot::Mismatch(p)) => Some(p.clone()),
                _ => None,
            })
            .collect::<Vec<_>>();
        let votes = slot_votes(&answers, winner);
        let mut failure = None;
        if let (Some(position), true) = (winner, now < deadline) {
            let slot = order[position];
            let mut fencing = None;
            if inner.fencing {
                let counters: Vec<Option<Vec<u64>>> = answers
                    .iter()
                    .map(|a| match a {
                        Some(Slot::Took { counter, .. }) => Some(vec![*counter]),
                        _ => None,
                    })
                    .collect();
                let tokens = fencing_tokens(&votes, &counters, 1);
                let key = [self.redlock.fence_key(&self.slot_resource(slot))];
                let raised = inner.raise_fence(&key, &tokens, deadline, timeout).await;
                now = Instant::now();
                if quorum::outcome(&raised.0) == Outcome::Reached && now < deadline {
                    fencing = Some(tokens);
                } else {
                    failure = Some(if now < deadline {
                        Failure::Unavailable(raised)
                    } else {
                        Failure::Expired(now.duration_since(t0))
                    });
                }
            }
            if failure.is_none() {
                guard.0 = None;
                // Nodes that set another slot, or may have: drop our token from the others.
                let others = Arc::new(Held {
                    keys: slot_keys
                        .iter()
                        .enumerate()
                        .filter(|(p, _)| *p != position)
                        .map(|(_, k)| k.clone())
                        .collect(),
                    ..clone_held(&all_slots)
                });
                let strays = (0..n).filter(|&i| may_hold_other(&answers[i], position));
                inner.release_unawaited(&others, strays, ttl).await;
                let held = Arc::new(Held {
                    keys: vec![slot_keys[position].clone()],
                    value,
                    custom: false,
                    resources: vec![self.slot_resource(slot)],
                    fence_keys: Vec::new(),
                    // Its release wakes the semaphore's line.
                    line: line(&turn).map(|l| l.granted()),
                });
                let grant = Grant {
                    held,
                    t0,
                    deadline,
                    fencing,
                };
                let lock = Lock::from_grant(self.redlock.clone(), grant, ttl);
                return Ok(Permit { lock, slot });
            }
        }
        // No grant: release our token wherever it may be, without waiting.
        let targets = (0..n).filter(|&i| sent[i] && may_hold_other(&answers[i], usize::MAX));
        inner.release_unawaited(&all_slots, targets, ttl).await;
        guard.0 = None;
        if mismatch.len() >= q {
            return Err(Failure::Rejected(InvalidInput::PermitsMismatch {
                name: self.name.clone(),
                asked: self.permits,
                existing: mismatch[0].clone(),
            }));
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        if now >= deadline && votes.0.contains(&Vote::Pending) {
            return Err(Failure::Expired(now.duration_since(t0)));
        }
        if votes.failed() > n - q {
            Err(Failure::Unavailable(votes))
        } else {
            Err(Failure::Contended(votes))
        }
    }

    /// How many permits are held right now, as seen on a quorum: slots whose token is on a
    /// quorum of nodes. One read of every slot on every node (each node atomically).
    ///
    /// Cancellation: safe (read-only).
    pub async fn count(&self) -> Result<usize> {
        Ok(self.inspect().await?.held())
    }

    /// Every slot, node by node: holder label, token fingerprint and TTL. One read per node, waiting for every
    /// node (each bounded by the per-node timeout, default 500 ms).
    ///
    /// Cancellation: safe (read-only).
    pub async fn inspect(&self) -> Result<SemaphoreInspection> {
        let inner = &self.redlock.inner;
        let keys: Arc<Vec<String>> = Arc::new(
            (0..self.permits)
                .map(|i| self.redlock.key(&self.slot_resource(i)))
                .collect(),
        );
        let timeout = inner.node_timeout.unwrap_or(Duration::from_millis(500));
        let calls = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (i, node.clone().view(keys.clone(), timeout)));
        let answers = fan_out(inner.nodes.len(), calls, None, Late::Drop, |_| false).await;
        let slots = (0..self.permits)
            .map(|slot| Inspection {
                resource: self.slot_resource(slot),
                quorum: inner.quorum,
                nodes: answers
                    .iter()
                    .zip(&inner.nodes)
                    .map(|(answer, node)| NodeView {
                        node: node.name.clone(),
                        state: match answer {
                            Some(Ok(values)) => Ok(values[slot]
                                .as_ref()
                                .map(|(value, pttl)| Holder::from_value(value, *pttl))),
                            Some(Err(e)) => Err(e.clone()),
                            None => Err(NodeError {
                                node: node.name.clone(),
                                kind: NodeErrorKind::Timeout,
                                message: "no answer".into(),
                            }),
                        },
                    })
                    .collect(),
            })
            .collect();
        Ok(SemaphoreInspection {
            name: self.name.clone(),
            permits: self.permits,
            slots,
        })
    }
}

/// Decided once some position has a quorum, or none can reach one any more.
/// One attempt's parameters.
struct Attempt<'a> {
    ttl: Duration,
    ttl_ms: u64,
    validity: Duration,
    timeout: Duration,
    /// The semaphore's gate and line key.
    gate: Option<(usize, &'a str)>,
    turn: Turn,
}

impl Semaphore {
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

impl Permit {
    /// The slot this permit holds, in `0..permits`.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The permit as the lock it is (on the slot's resource).
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The secret owner token (see [`Lock::token`]).
    pub fn token(&self) -> &str {
        self.lock.token()
    }

    /// The owner label stored with the permit (the `Redlock`'s; see [`Lock::label`]).
    pub fn label(&self) -> Option<&str> {
        self.lock.label()
    }

    /// The token's public fingerprint (see [`Lock::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        self.lock.fingerprint()
    }

    /// When the permit must be considered lost (see [`Lock::deadline`]).
    pub fn deadline(&self) -> Instant {
        self.lock.deadline()
    }

    /// Validity left.
    pub fn remaining(&self) -> Duration {
        self.lock.remaining()
    }

    /// The slot's fencing token (with [`fencing_tokens`](crate::Builder::fencing_tokens)):
    /// strictly larger than that of every earlier holder of this slot.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }

    /// Extends the permit, as [`Lock::extend`].
    ///
    /// Cancellation: as for [`Lock::extend`].
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.lock.extend(ttl).await
    }

    /// Releases the permit, as [`Lock::release`].
    ///
    /// Cancellation: dropping the future still releases, in the background.
    pub async fn release(self) -> Result<ReleaseReport> {
        self.lock.release().await
    }

    /// Keeps the permit alive in the background, with the same lost signal as a lock
    /// ([`Lock::keep_alive`]).
    pub fn keep_alive(self) -> KeepAlive {
        self.lock.keep_alive()
    }

    /// [`keep_alive`](Self::keep_alive) with options ([`Lock::keep_alive_with`]).
    pub fn keep_alive_with(
        self,
        options: KeepAliveOptions,
    ) -> std::result::Result<KeepAlive, Box<Rejected>> {
        self.lock.keep_alive_with(options)
    }

    /// The lock this permit is.
    pub fn into_lock(self) -> Lock {
        self.lock
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
