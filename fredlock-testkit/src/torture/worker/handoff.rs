//! The read-write and lease operations of a client: a read share or the write lock of one of
//! the run's read-write locks, held for a while; and a lock handed over as a lease (text and
//! back) and resumed, sometimes only after its deadline, when resuming must fail.
//!
//! Owns these two operations. Must not decide whether the history is safe (the checker's
//! `rwmode.rs` and window checks do) nor touch the other operations.

use tokio::time::Instant;

use super::section::section_guard;
use super::{Op, Worker};
use crate::checker::{GrantKind, ViolationKind};

/// The run's read-write locks. Every client uses the same ones.
pub(in super::super) const RWLOCKS: [&str; 2] = ["rw:0", "rw:1"];

impl Worker {
    /// A read share (or, with `flag`, the write lock) of one of the run's read-write locks,
    /// held in steps while it has validity left, then released. The checker's read-write
    /// property: no write window overlaps any other window of the lock.
    pub(super) async fn op_rw(&mut self, op: &Op) {
        let name = RWLOCKS[op.resources[0] % RWLOCKS.len()];
        let rw = match self.redlock.rwlock(name) {
            Ok(rw) => rw,
            Err(e) => {
                let detail = format!("client {}: rwlock({name}): {e}", self.id);
                return self.checker().violation(ViolationKind::Engine, detail);
            }
        };
        let write = op.flag;
        let res = match (write, op.flag2) {
            (false, true) => rw.try_read(op.ttl).await.map(|g| g.map(|g| g.into_lock())),
            (false, false) => rw.read(op.ttl).await.map(|g| Some(g.into_lock())),
            (true, true) => rw.try_write(op.ttl).await.map(|g| g.map(|g| g.into_lock())),
            (true, false) => rw.write(op.ttl).await.map(|g| Some(g.into_lock())),
        };
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res) else {
            return;
        };
        if write {
            self.stats.rw_writes += 1;
        } else {
            self.stats.rw_reads += 1;
        }
        let kind = if write {
            GrantKind::Write
        } else {
            GrantKind::Read
        };
        let g = self.checker().grant(self.id, &lock, kind, granted_at);
        self.checker().rw_grant(g, name, write);
        let guard = section_guard(op.ttl);
        for &(pause, _) in &op.steps {
            if lock.remaining() < guard + pause {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        self.checker().close(g, Instant::now(), lock.deadline());
        self.count_release(lock.release().await);
    }

    /// A lock turned into a lease, printed and parsed back, and resumed (as another process
    /// would); the resumed lock is the same grant (same token), held in steps, then released.
    /// With `flag2`, resuming waits until past the deadline: it must then fail.
    pub(super) async fn op_lease(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Lease, granted_at);
        let deadline = lock.deadline();
        let text = lock.into_lease().to_string();
        let lease = match text.parse::<fredlock::Lease>() {
            Ok(lease) => lease,
            Err(e) => {
                let detail = format!("client {}: a printed lease does not parse: {e}", self.id);
                return self.checker().violation(ViolationKind::Engine, detail);
            }
        };
        if op.flag2 {
            // The holder stopped acting at its deadline; the resume comes after it.
            self.checker().close(g, Instant::now(), deadline);
            tokio::time::sleep_until(deadline + op.ttl2).await;
            match self.redlock.resume(lease).await {
                Ok(late) => {
                    let detail = format!(
                        "client {}: {r}: a lease resumed {:?} after its deadline",
                        self.id,
                        deadline.elapsed()
                    );
                    self.checker()
                        .violation(ViolationKind::StaleOpSucceeded, detail);
                    drop(late.into_lease());
                }
                Err(_) => self.stats.leases_refused += 1,
            }
            return;
        }
        let lock = match self.redlock.resume(lease).await {
            Ok(lock) => lock,
            Err(_) => {
                self.stats.leases_failed += 1;
                return self.checker().close(g, Instant::now(), deadline);
            }
        };
        self.stats.leases_resumed += 1;
        let guard = section_guard(op.ttl);
        for &(pause, _) in &op.steps {
            if lock.remaining() < guard + pause {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        self.checker().close(g, Instant::now(), lock.deadline());
        self.count_release(lock.release().await);
    }
}
