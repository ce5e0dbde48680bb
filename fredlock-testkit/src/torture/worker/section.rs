//! The steps a client takes under a lock: the counter increment of a critical section (only
//! while the lock has a guard of validity left), release, extend, and the S1 quorum look right
//! after a grant. Every step records what it did with the checker.
//!
//! Owns these shared steps and the write guard ([`PendingWrite`]). Must not choose what to do
//! (the operations in the sibling files do) nor judge anything itself beyond recording: the
//! checker decides.

use std::sync::Arc;
use std::time::Duration;

use fredlock::fred::prelude::{KeysInterface, Value};
use fredlock::Lock;
use tokio::time::Instant;

use super::super::env::{data_key, same};
use super::super::schedule::ms;
use super::{Stale, Worker};
use crate::checker::{Checker, DataValue, GrantId, ViolationKind};

/// Validity a critical section wants left before it reads or writes: a holder must not act
/// past its deadline (row 10 is outside Redlock's guarantee), so each step leaves room for a
/// slow `GET`/`SET` on a loaded machine.
pub(super) fn section_guard(ttl: Duration) -> Duration {
    ms(25) + ttl / 10
}

/// Records a counter write as uncertain if its future is dropped before the `SET` answered.
struct PendingWrite {
    checker: Arc<Checker>,
    id: u64,
    done: bool,
}

impl PendingWrite {
    fn complete(mut self, at: Instant) {
        self.checker.complete_write(self.id, at);
        self.done = true;
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.done {
            self.checker.uncertain_write(self.id);
        }
    }
}

impl Worker {
    /// One non-atomic read-modify-write of `resource`'s counter, only while `valid()` says the
    /// lock has enough validity left (checked before the GET and again before the SET).
    pub(super) async fn increment(
        &mut self,
        grant: GrantId,
        resource: &str,
        pause: Duration,
        valid: impl Fn() -> bool,
    ) -> bool {
        if !valid() {
            self.stats.writes_skipped += 1;
            return false;
        }
        let key = data_key(resource);
        let read_at = Instant::now();
        let raw: Option<String> = match self.data.get(key.as_str()).await {
            Ok(v) => v,
            Err(_) => {
                self.stats.data_errors += 1;
                return false;
            }
        };
        let Some(read) = DataValue::parse(raw.as_deref()) else {
            self.checker().violation(
                ViolationKind::LostUpdate,
                format!("{key}: unparsable counter {raw:?}"),
            );
            return false;
        };
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        if !valid() {
            self.stats.writes_skipped += 1;
            return false;
        }
        let id = self.checker().begin_write(grant, resource, read, read_at);
        // From here until the SET is answered, a dropped future (a cancelled with_lock
        // section) leaves the write's outcome unknown: the guard records that.
        let pending = PendingWrite {
            checker: self.env.checker.clone(),
            id,
            done: false,
        };
        let res: Result<Value, _> = self
            .data
            .set(key.as_str(), read.next(id).encode(), None, None, false)
            .await;
        match res {
            Ok(_) => {
                pending.complete(Instant::now());
                self.stats.writes += 1;
                true
            }
            Err(_) => {
                self.stats.data_errors += 1;
                false
            }
        }
    }

    /// Releases a stale lock outside the stale-lock checks (eviction, end of run). Its window
    /// was recorded up to its deadline; if that has not passed yet, a release now really ends
    /// it early (the next holder may get in at once), so the window must end here.
    pub(super) async fn release_stale(&mut self, stale: Stale) {
        self.checker().event(format!(
            "client {}: engine releases stale grant #{} (deadline in {:?})",
            self.id,
            stale.grant,
            stale.lock.remaining()
        ));
        self.checker()
            .close(stale.grant, Instant::now(), stale.lock.deadline());
        let _ = stale.lock.release().await;
    }

    /// Closes the window at the release call's start (or the deadline), then releases.
    pub(super) async fn release(&mut self, grant: GrantId, lock: Lock) {
        self.checker().close(grant, Instant::now(), lock.deadline());
        self.stats.repairs += lock.repairs();
        self.count_release(lock.release().await);
    }

    pub(super) async fn extend(&mut self, grant: GrantId, lock: &mut Lock, ttl: Duration) -> bool {
        let old = lock.deadline();
        let call = Instant::now();
        let ok = lock.extend(ttl).await.is_ok();
        self.stats.extends += 1;
        self.stats.extends_ok += u64::from(ok);
        self.checker()
            .extended(grant, call, old, ttl, ok.then(|| lock.deadline()));
        ok
    }

    /// S1: right after a grant, its token must be on a quorum of nodes.
    pub(super) async fn verify_quorum(&mut self, grant: GrantId, lock: &Lock) {
        let before = self.env.epochs();
        let Ok(inspection) = self.env.observer.inspect(&lock.resources()[0]).await else {
            return;
        };
        let in_time = Instant::now() < lock.deadline();
        let eligible = same(&before, &self.env.epochs());
        self.checker()
            .check_quorum(grant, lock.token(), &inspection, &eligible, in_time);
        self.stats.quorum_checks += 1;
    }
}
