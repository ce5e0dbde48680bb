//! The semaphore and fencing operations of a client: a permit of one of the run's semaphores
//! held for a while, and a fenced lock whose holder writes its token to a fenced register on
//! the data node (sometimes only after stalling past its deadline, as a paused process would).
//!
//! Owns these two operations and the fenced register's script. Must not decide whether the
//! history is safe (the checker's `modes.rs` does) nor touch the plain lock operations.

use fredlock::fred::prelude::LuaInterface;
use fredlock::Error;
use tokio::time::Instant;

use super::super::resources::{fenced_resource, register_keys, SEMAPHORES};
use super::section::section_guard;
use super::{Op, Worker};
use crate::checker::{GrantKind, ViolationKind};

/// A fenced register: accepts ARGV[1] only if it is larger than the stored token, and logs
/// every accepted token (KEYS[2]) so the checker can verify the order afterwards. 1 accepted,
/// 0 refused.
const FENCED_WRITE: &str = r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > current then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"#;

impl Worker {
    /// A permit of one of the run's semaphores, held in steps while it has validity left, then
    /// released. The checker counts overlapping permit windows per semaphore.
    pub(super) async fn op_permit(&mut self, op: &Op) {
        let (name, permits) = SEMAPHORES[op.resources[0] % SEMAPHORES.len()];
        let sem = match self.redlock.semaphore(name, permits) {
            Ok(sem) => sem,
            Err(e) => {
                let detail = format!("client {}: semaphore({name}, {permits}): {e}", self.id);
                return self.checker().violation(ViolationKind::Engine, detail);
            }
        };
        let res = if op.flag {
            sem.try_acquire(op.ttl).await
        } else {
            sem.acquire(op.ttl).await.map(Some)
        };
        let granted_at = Instant::now();
        let Some(permit) = self.outcome(res) else {
            return;
        };
        self.stats.permits += 1;
        let g = self
            .checker()
            .grant(self.id, permit.lock(), GrantKind::Permit, granted_at);
        self.checker().permit(g, name, permits);
        let guard = section_guard(op.ttl);
        for &(pause, _) in &op.steps {
            if permit.remaining() < guard + pause {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        self.checker().close(g, Instant::now(), permit.deadline());
        self.count_release(permit.release().await);
    }

    /// A lock with a fencing token; its holder writes the token to the resource's fenced
    /// register. With `flag2`, the holder first stalls until past its deadline (a GC pause): the
    /// register must then refuse it if a newer holder wrote meanwhile, which the checker's
    /// token-order and register checks cover. Without fencing mode, a plain acquire.
    pub(super) async fn op_fenced(&mut self, op: &Op) {
        let Some(fenced) = self.fenced.clone() else {
            return self.op_acquire(op, false).await;
        };
        let r = fenced_resource(op.resources[0]);
        let res = fenced.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Fenced, granted_at);
        let Some(token) = lock.fencing_token() else {
            let detail = format!("client {}: a fenced lock of {r} without a token", self.id);
            return self.checker().violation(ViolationKind::Engine, detail);
        };
        self.checker().fencing_token(g, &r, token);
        let stalled = op.flag2;
        if stalled {
            // The window ends at the deadline; the write comes after it.
            self.checker().close(g, Instant::now(), lock.deadline());
            // Long enough (50-200 ms past the deadline) that another client has usually taken
            // the resource and written with a larger token: the register must refuse this one.
            tokio::time::sleep_until(lock.deadline() + op.ttl2).await;
        }
        let (register, log) = register_keys(&r);
        let accepted = self
            .data
            .eval::<i64, _, _, _>(FENCED_WRITE, vec![register, log], vec![token.to_string()])
            .await;
        match (accepted, stalled) {
            (Ok(1), false) => self.stats.fenced_accepted += 1,
            (Ok(1), true) => self.stats.fenced_stale_accepted += 1,
            (Ok(_), false) => self.stats.fenced_refused += 1,
            (Ok(_), true) => self.stats.fenced_stale_refused += 1,
            (Err(_), _) => self.stats.data_errors += 1,
        }
        self.checker().close(g, Instant::now(), lock.deadline());
        self.count_release(lock.release().await);
    }

    pub(super) fn count_release<T>(&mut self, res: Result<T, Error>) {
        match res {
            Ok(_) => self.stats.releases_ok += 1,
            Err(Error::NotHeld { .. }) => self.stats.releases_not_held += 1,
            Err(_) => self.stats.releases_failed += 1,
        }
    }
}
