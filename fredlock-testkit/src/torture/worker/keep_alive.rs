//! The operations that hold a lock past its TTL through the library's keep-alive:
//! `Lock::keep_alive` sections and `with_lock` sections (cancelled when the lock is lost). Each
//! window ends when the holder stopped acting or its lost signal fired (S8).
//!
//! Owns these two operations and the clock of a `with_lock` closure ([`DropClock`]). Must not
//! implement a step (the increment is in `section.rs`) nor judge the lost signal's lateness
//! (the checker does).

use std::sync::{Arc, Mutex};

use fredlock::{Error, LockHandle, LostReason};
use tokio::time::Instant;

use super::section::section_guard;
use super::{Op, Worker};
use crate::checker::{GrantId, GrantKind};

/// Records when a `with_lock` closure stopped (returned or was cancelled).
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

impl Worker {
    pub(super) async fn op_keep_alive(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::KeepAlive, granted_at);
        let guard = lock.keep_alive();
        let handle = guard.handle();
        // Records when the lost signal fired (S8), from its own task as a real waiter would.
        let lost: Arc<Mutex<Option<(LostReason, Instant)>>> = Arc::default();
        let watcher = {
            let (handle, lost) = (handle.clone(), lost.clone());
            tokio::spawn(async move {
                let reason = handle.lost().await;
                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some((reason, Instant::now()));
            })
        };
        let margin = section_guard(op.ttl);
        for &(pause, sleep) in &op.steps {
            if handle.is_lost() {
                break;
            }
            self.increment(g, &r, pause, || {
                !handle.is_lost() && handle.remaining() >= margin
            })
            .await;
            tokio::time::sleep(sleep).await;
        }
        let stopped = Instant::now();
        let deadline = handle.deadline();
        let fired = *lost.lock().unwrap_or_else(|p| p.into_inner());
        let end = match fired {
            Some((reason, at)) if reason != LostReason::Released => {
                self.stats.lost += 1;
                self.checker().lost_signal(g, at, deadline);
                at.min(stopped)
            }
            _ => {
                if handle.is_lost() {
                    self.stats.lost += 1;
                }
                stopped
            }
        };
        self.checker().close(g, end, deadline);
        self.stats.repairs += handle.repairs();
        watcher.abort();
        match guard.release().await {
            Ok(_) => self.stats.releases_ok += 1,
            Err(Error::NotHeld { .. }) => self.stats.releases_not_held += 1,
            Err(_) => self.stats.releases_failed += 1,
        }
    }

    pub(super) async fn op_with_lock(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let redlock = self.redlock.clone();
        let info: Arc<Mutex<Option<(GrantId, LockHandle)>>> = Arc::default();
        let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (ttl, margin, steps) = (op.ttl, section_guard(op.ttl), op.steps.clone());
        let me = &mut *self;
        let res = {
            let (info, stopped, r2) = (info.clone(), stopped.clone(), r.clone());
            redlock
                .with_lock(r.as_str(), ttl, move |handle| async move {
                    let started = Instant::now();
                    let g = me.checker().grant_handle(
                        me.id,
                        &handle,
                        ttl,
                        GrantKind::WithLock,
                        started,
                    );
                    *info.lock().unwrap_or_else(|p| p.into_inner()) = Some((g, handle.clone()));
                    // Dropped when the closure returns OR is cancelled: when it stopped acting.
                    let _clock = DropClock(stopped);
                    for (pause, sleep) in steps {
                        if handle.is_lost() {
                            break;
                        }
                        me.increment(g, &r2, pause, || {
                            !handle.is_lost() && handle.remaining() >= margin
                        })
                        .await;
                        tokio::time::sleep(sleep).await;
                    }
                })
                .await
        };
        let info = info.lock().unwrap_or_else(|p| p.into_inner()).take();
        let lost = matches!(res, Err(Error::Lost { .. }));
        self.stats.attempted += 1;
        match (&res, &info) {
            (Ok(()), _) | (Err(Error::Lost { .. }), Some(_)) => self.stats.granted += 1,
            _ => {}
        }
        if let Err(e) = &res {
            self.stats.failed(e);
        }
        if let Some((g, handle)) = info {
            let stopped_at = stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(Instant::now);
            let deadline = handle.deadline();
            self.stats.repairs += handle.repairs();
            if lost {
                self.checker().lost_signal(g, stopped_at, deadline);
            }
            self.checker().close(g, stopped_at, deadline);
        }
    }
}
