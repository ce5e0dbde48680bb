//! The short operations of a client: acquire (or try_acquire) with a critical section, a
//! two-resource acquire, an extend timed near the deadline (row 13), a lock abandoned to expire
//! (kept as a stale lock for `stale.rs`), and attempts on the foreign-held resources (S3).
//!
//! Owns these operations' sequences of steps. Must not implement a step (increment, release,
//! extend are in `section.rs`) nor hold operations that outlive the TTL (`keep_alive.rs`) or
//! that probe the nodes (`stale.rs`, `takeover.rs`, `cleanup.rs`).

use std::time::Duration;

use tokio::time::Instant;

use super::section::section_guard;
use super::{Op, Stale, Worker};
use crate::checker::{GrantKind, ViolationKind};

/// Stale locks a client keeps at most (older ones are released).
const MAX_STALE: usize = 4;

impl Worker {
    pub(super) async fn op_acquire(&mut self, op: &Op, try_only: bool) {
        let r = self.resource(op.resources[0]);
        let called_at = Instant::now();
        let res = if try_only {
            self.redlock.try_acquire(r.as_str(), op.ttl).await
        } else {
            self.redlock.acquire(r.as_str(), op.ttl).await.map(Some)
        };
        let granted_at = Instant::now();
        if !try_only {
            // Gave up: waited out its retry budget while others held the resource.
            let gave_up = matches!(res, Err(fredlock::Error::Contended { .. }));
            self.stats.live.waited(granted_at - called_at, !gave_up);
        }
        let Some(mut lock) = self.outcome(res) else {
            return;
        };
        let kind = if try_only {
            GrantKind::TryAcquire
        } else {
            GrantKind::Acquire
        };
        let g = self.checker().grant(self.id, &lock, kind, granted_at);
        if op.flag {
            self.verify_quorum(g, &lock).await;
        }
        let guard = section_guard(op.ttl.min(op.ttl2));
        let half = op.steps.len() / 2;
        for (i, &(pause, _)) in op.steps.iter().enumerate() {
            if op.flag2 && i == half {
                self.extend(g, &mut lock, op.ttl2).await;
            }
            self.increment(g, &r, pause, || lock.remaining() >= guard)
                .await;
        }
        let index = op.resources[0] % self.env.resources.len();
        self.stats.live.granted(index, granted_at.elapsed());
        self.release(g, lock).await;
    }

    pub(super) async fn op_multi(&mut self, op: &Op) {
        let r1 = self.resource(op.resources[0]);
        let r2 = self.resource(op.resources[1]);
        let res = self
            .redlock
            .acquire([r1.as_str(), r2.as_str()], op.ttl)
            .await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Multi, granted_at);
        let guard = section_guard(op.ttl);
        for &(pause, _) in &op.steps {
            for r in lock.resources().to_vec() {
                self.increment(g, &r, pause, || lock.remaining() >= guard)
                    .await;
            }
        }
        self.release(g, lock).await;
    }

    pub(super) async fn op_extend_near_expiry(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(mut lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Acquire, granted_at);
        let guard = section_guard(op.ttl);
        self.increment(g, &r, op.steps[0].0, || lock.remaining() >= guard)
            .await;
        // Right before, at or just after the deadline (row 13).
        let at = if op.offset_us < 0 {
            lock.deadline()
                .checked_sub(Duration::from_micros(op.offset_us.unsigned_abs()))
                .unwrap_or(lock.deadline())
        } else {
            lock.deadline() + Duration::from_micros(op.offset_us as u64)
        };
        tokio::time::sleep_until(at).await;
        if self.extend(g, &mut lock, op.ttl2).await {
            let guard = section_guard(op.ttl2);
            self.increment(g, &r, op.steps[1].0, || lock.remaining() >= guard)
                .await;
        }
        self.release(g, lock).await;
    }

    pub(super) async fn op_abandon(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let epochs = self.env.epochs();
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Abandoned, granted_at);
        let guard = section_guard(op.ttl);
        self.increment(g, &r, op.steps[0].0, || lock.remaining() >= guard)
            .await;
        // Formally held until the deadline: the window runs to it (the stricter choice).
        self.checker().close(g, lock.deadline(), lock.deadline());
        self.stale.push(Stale {
            lock,
            grant: g,
            epochs,
        });
        if self.stale.len() > MAX_STALE {
            let oldest = self.stale.remove(0);
            self.release_stale(oldest).await;
        }
    }

    /// Foreign-held resources must never be granted, alone or with another resource, and the
    /// failed attempt's clean-up must not delete the foreign key (checked at the end).
    pub(super) async fn op_foreign(&mut self, op: &Op) {
        let f = self.env.foreign[op.foreign % self.env.foreign.len()].clone();
        self.stats.foreign_attempts += 1;
        let granted = if op.flag {
            let r = self.resource(op.resources[0]);
            self.redlock
                .acquire([r.as_str(), f.as_str()], op.ttl)
                .await
                .ok()
        } else {
            self.redlock
                .try_acquire(f.as_str(), op.ttl)
                .await
                .ok()
                .flatten()
        };
        if let Some(lock) = granted {
            self.checker().violation(
                ViolationKind::ForeignGranted,
                format!(
                    "client {} was granted {:?} (token {}) although {f} is held by a foreign owner on every node",
                    self.id,
                    lock.resources(),
                    lock.token()
                ),
            );
            let _ = lock.release().await;
        }
    }
}
