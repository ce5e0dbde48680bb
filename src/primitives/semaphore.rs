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
//! Owns: [`Semaphore`] and its slots' names, [`Permit`], the acquire calls and the reads
//! (count, inspect). The slot-choosing round itself is `semaphore_round`'s.
//! Must not: count holders per node, or send an attempt's commands itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{InvalidInput, NodeError, NodeErrorKind, Result};
use crate::hold::keepalive::{KeepAlive, KeepAliveOptions, Rejected};
use crate::ops::inspect::{Holder, Inspection, NodeView};
use crate::primitives::semaphore_round::{Attempt, Slots};
use crate::rounds::acquire_loop::WaitLine;
use crate::rounds::attempt::Turn;
use crate::rounds::lock::{Lock, ReleaseReport};
use crate::rounds::quorum::{fan_out, Late};
use crate::rounds::redlock::Redlock;

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
    /// Errors: [`InvalidInput`](crate::InvalidInput) for an empty name, one over
    /// [`MAX_RESOURCE_LEN`](crate::MAX_RESOURCE_LEN) bytes, a name starting with `~`, or a number of
    /// permits out of range. Using one name with two numbers of permits is rejected at acquire
    /// ([`InvalidInput::PermitsMismatch`]).
    pub fn semaphore(&self, name: impl Into<String>, permits: usize) -> Result<Semaphore> {
        let name = name.into();
        crate::base::slots::check_name(&name)?;
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
        self.slots().slot_resource(i)
    }

    fn meta_key(&self) -> String {
        self.slots().meta_key()
    }

    /// The slots, as the slot-choosing round sees them.
    fn slots(&self) -> Slots<'_> {
        Slots {
            redlock: &self.redlock,
            name: &self.name,
            permits: self.permits,
        }
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
        let line_key = crate::base::slots::line_key(&self.redlock.inner.key_prefix, &meta);
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
            let (lock, slot) = self.slots().attempt(at).await?;
            Ok(Permit { lock, slot })
        };
        tracing::Instrument::instrument(
            self.redlock
                .with_retries(retry, (wait, None), &name, line, ttl, attempt),
            span,
        )
        .await
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
