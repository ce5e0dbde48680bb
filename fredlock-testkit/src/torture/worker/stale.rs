//! Rows 13 and 14: a stale lock (abandoned by `ops.rs`, its deadline passed) is extended and
//! released, often while this client holds the resource again under a new token. The extend
//! must not revive the stale token (S5); neither the extend nor the release may touch the new
//! holder's keys, and the release must not say `Ok` while the new holder has a quorum (S4).
//!
//! Owns this operation and its looks at the nodes around each stale call. Must not keep or
//! evict stale locks (abandon and eviction are in `ops.rs` and `section.rs`).

use std::time::Duration;

use fredlock::{Inspection, Lock};
use tokio::time::Instant;

use super::super::env::same;
use super::super::schedule::ms;
use super::section::section_guard;
use super::{Op, Stale, Worker};
use crate::checker::{GrantId, GrantKind, ViolationKind};

impl Worker {
    /// Rows 13 and 14: extend and release a lock whose deadline passed, often while this
    /// client holds the resource again under a new token.
    pub(super) async fn op_stale(&mut self, op: &Op) {
        let Some(mut stale) = self.take_ready_stale(op) else {
            self.stats.stale_skipped += 1;
            return;
        };
        let r = stale.lock.resources()[0].clone();
        let mut holder = None;
        if op.flag || op.flag2 {
            holder = self.reacquire(&r, op.ttl).await;
        }
        let e0 = self.env.epochs();
        let after = self
            .stale_extend(&mut stale, op.ttl2, holder.as_ref(), &e0)
            .await;
        self.stale_release(op, stale.lock, holder, after, &e0).await;
    }

    /// The stale lock `op` picks among those ready; `None` when none is.
    fn take_ready_stale(&mut self, op: &Op) -> Option<Stale> {
        let now = Instant::now();
        // Old enough that every SET of its acquire has landed or been dropped by fred.
        let ready: Vec<usize> = (0..self.stale.len())
            .filter(|&i| {
                let l = &self.stale[i].lock;
                l.deadline() + ms(5) < now && l.acquired_at() + self.node_timeout + ms(100) < now
            })
            .collect();
        if ready.is_empty() {
            return None;
        }
        Some(self.stale.remove(ready[op.pick % ready.len()]))
    }

    /// Takes `r` again under a new token (the new holder), if it can.
    async fn reacquire(&mut self, r: &str, ttl: Duration) -> Option<(Lock, GrantId)> {
        // Patient: the point is to have a live holder while the stale lock acts.
        let res = self
            .redlock
            .acquire_with(r, ttl, self.env.config.ttl_max)
            .await;
        let at = Instant::now();
        let l = self.outcome(res.map(Some))?;
        let gb = self.checker().grant(self.id, &l, GrantKind::Reacquire, at);
        Some((l, gb))
    }

    /// Extends the stale lock, with the S5 revival check and the S4 check of the new holder's
    /// keys; returns the inspection taken after the extend.
    async fn stale_extend(
        &mut self,
        stale: &mut Stale,
        ttl2: Duration,
        holder: Option<&(Lock, GrantId)>,
        e0: &[u64],
    ) -> Option<Inspection> {
        let r = stale.lock.resources()[0].clone();
        let token = stale.lock.token().to_string();
        let before = self.env.observer.inspect(&r).await.ok();
        let old = stale.lock.deadline();
        let call = Instant::now();
        let res = stale.lock.extend(ttl2).await;
        self.stats.stale_extends += 1;
        self.checker().extended(
            stale.grant,
            call,
            old,
            ttl2,
            res.is_ok().then(|| stale.lock.deadline()),
        );
        let after = self.env.observer.inspect(&r).await.ok();
        let e1 = self.env.epochs();
        if let (Some(b), Some(a)) = (&before, &after) {
            self.checker()
                .check_revival("stale extend", &token, b, a, &same(&stale.epochs, &e1));
            if let Some((hl, _)) = holder {
                if Instant::now() < hl.deadline() {
                    self.checker().check_holder_intact(
                        "stale extend vs the new holder",
                        hl.token(),
                        b,
                        a,
                        &same(e0, &e1),
                    );
                }
            }
        }
        after
    }

    /// Releases the stale lock. With a new holder, the release must not say `Ok` nor touch the
    /// holder's keys; the holder then does its critical section and releases.
    async fn stale_release(
        &mut self,
        op: &Op,
        lock: Lock,
        holder: Option<(Lock, GrantId)>,
        after: Option<Inspection>,
        e0: &[u64],
    ) {
        let r = lock.resources()[0].clone();
        let token = lock.token().to_string();
        let released = lock.release().await;
        match holder {
            None => self.stats.stale_releases += 1,
            Some((hl, gb)) => {
                self.stats.stale_releases_with_holder += 1;
                if released.is_ok() {
                    self.checker().violation(
                        ViolationKind::StaleOpSucceeded,
                        format!(
                            "stale release of {r} (token {token}) returned Ok while grant #{gb} (token {}) held a quorum",
                            hl.token()
                        ),
                    );
                }
                let after2 = self.env.observer.inspect(&r).await.ok();
                let e2 = self.env.epochs();
                if let (Some(a), Some(a2)) = (&after, &after2) {
                    if Instant::now() < hl.deadline() {
                        self.checker().check_holder_intact(
                            "stale release vs the new holder",
                            hl.token(),
                            a,
                            a2,
                            &same(e0, &e2),
                        );
                    }
                }
                let guard = section_guard(op.ttl);
                self.increment(gb, &r, op.steps[0].0, || hl.remaining() >= guard)
                    .await;
                self.release(gb, hl).await;
            }
        }
    }
}
