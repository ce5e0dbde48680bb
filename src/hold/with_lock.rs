//! [`Redlock::with_lock`]: acquire, keep alive, run the caller's work, release on every exit
//! path, and cancel the work for real when the lock is lost.
//!
//! Owns: the work's lifecycle around a kept-alive lock.
//! Must not: extend or release by itself (the keep-alive guard below does).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::base::error::{Error, LostReason, Result};
use crate::hold::keepalive::{KeepAliveOptions, LockHandle};
use crate::rounds::options::AcquireOptions;
use crate::rounds::redlock::{Redlock, Resources};

/// What [`Redlock::with_lock_using`] does when the lock is lost while the closure runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Drop (cancel) the closure's future at once and return [`Error::Lost`]. The default.
    #[default]
    Cancel,
    /// Let the closure run on; it should watch [`LockHandle::lost`] itself. Its value is
    /// returned even if the lock was lost.
    Continue,
}

/// Options of [`Redlock::with_lock_using`].
#[derive(Debug, Clone, Default)]
pub struct WithLock {
    /// How the lock is kept alive while the closure runs.
    pub keep_alive: KeepAliveOptions,
    /// What happens when the lock is lost.
    pub on_lost: OnLost,
    /// Bound on the acquire's total wait (see [`Redlock::acquire_with`]); `None` = the retry
    /// policy alone.
    pub wait: Option<Duration>,
    /// Hold the lock at least this long from its acquisition, however soon the closure
    /// returns (see [`AcquireOptions::hold_at_least`]); `None` = release at once. At most the
    /// TTL: a longer one is refused ([`InvalidInput::HoldLongerThanTtl`](crate::InvalidInput::HoldLongerThanTtl)).
    pub hold_at_least: Option<Duration>,
}

impl WithLock {
    /// Sets [`hold_at_least`](WithLock#structfield.hold_at_least) (see
    /// [`AcquireOptions::hold_at_least`]).
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.hold_at_least = Some(at_least);
        self
    }
}

impl Redlock {
    /// Acquires `resources`, keeps the lock alive, runs `f` with a [`LockHandle`], and releases
    /// on every exit path. If the lock is lost while `f` runs, `f`'s future is dropped at once
    /// (no later than the lock's deadline) and [`Error::Lost`] is returned.
    ///
    /// What cancellation means inside `f`: the future stops at its current `.await` point and
    /// is dropped, running destructors; code between two `.await`s is never interrupted, so a
    /// blocking loop without `.await` is not stopped (use [`OnLost::Continue`] and check
    /// [`LockHandle::is_lost`] there). Side effects already sent elsewhere (a request on the wire)
    /// are not undone; a resource that must reject late writes needs a fencing token.
    ///
    /// Release: after `f` returns, the lock is released and awaited; if `f` panics, the lock is
    /// released, then the panic resumes; if the lock is lost, [`Error::Lost`] is returned at once
    /// and the release runs in the background; if this future is dropped, `f` is dropped and the
    /// lock released in the background. A failed final release is logged, not returned: the work
    /// completed while the lock was valid. When [`Redlock::close`] ends the work (reason
    /// [`LostReason::Closed`]), `f` is dropped at once and [`Error::Lost`] is returned once
    /// `close()` has released the lock.
    pub async fn with_lock<F, Fut, T>(
        &self,
        resources: impl Resources,
        ttl: Duration,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.with_lock_using(resources, ttl, WithLock::default(), f)
            .await
    }

    /// [`with_lock`](Self::with_lock) with options (keep-alive settings, what to do on loss, a
    /// bound on the acquire's wait).
    pub async fn with_lock_using<F, Fut, T>(
        &self,
        resources: impl Resources,
        ttl: Duration,
        options: WithLock,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        options.keep_alive.validate(self.inner.drift_factor)?;
        let mut acquire = AcquireOptions::new();
        if let Some(wait) = options.wait {
            acquire = acquire.wait(wait);
        }
        if let Some(at_least) = options.hold_at_least {
            acquire = acquire.hold_at_least(at_least);
        }
        let lock = self.acquire_using(resources, ttl, &acquire).await?;
        let guard = lock.keep_alive_with(options.keep_alive)?;
        let handle = guard.handle();
        let work = AssertUnwindSafe(f(handle.clone())).catch_unwind();
        let outcome = match options.on_lost {
            OnLost::Cancel => {
                tokio::pin!(work);
                tokio::select! {
                    biased;
                    reason = handle.lost() => {
                        // `work` is dropped when this scope ends, before the release below.
                        Err(reason)
                    }
                    out = &mut work => Ok(out),
                }
            }
            OnLost::Continue => Ok(work.await),
        };
        match outcome {
            Err(reason) => {
                // The error is due now (the deadline is here): the release runs in the
                // background, as the guard drops.
                let resources = guard.handle().names();
                drop(guard);
                if reason == LostReason::Closed {
                    // `close()` releases the lock: return once that is done, so that a `main`
                    // that ends with this work does not end the release with it.
                    self.inner.holds.released().await;
                }
                Err(Error::Lost { resources, reason })
            }
            Ok(out) => {
                if let Err(e) = guard.release().await {
                    tracing::warn!(error = %e, "fredlock: with_lock: final release failed; the keys expire with their TTL");
                }
                match out {
                    Ok(value) => Ok(value),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
    }
}
