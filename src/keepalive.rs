//! Locks that stay held while the work runs: a background extension task, a lost-lock signal that
//! fires no later than the deadline, and [`Redlock::with_lock`], which cancels the work for real
//! when the lock is lost.
//!
//! The state every party sees is one `watch` value ([`Status`]) that only moves forward: once a
//! lock is marked lost it stays lost, and a new deadline is published only if it was obtained
//! before the old one passed. The extension task and every `lost()` waiter race to mark the lock
//! lost at the deadline; whoever comes first wins, and both agree on the outcome.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, InvalidInput, NotHeldReason, Result};
use crate::lock::{Lock, ReleaseReport};
use crate::redlock::{Redlock, Resources};

/// Why a kept-alive lock stopped being held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// A quorum of nodes no longer holds our token (it expired there, or someone took it over).
    TokenGone,
    /// The deadline passed without a successful extension (too few nodes reachable in time).
    Expired,
    /// The budget (maximum hold time or number of extensions) ran out, so the lock was left to
    /// expire at its last deadline.
    BudgetExhausted,
    /// The lock was released (or the guard dropped) on purpose; not a failure.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::TokenGone => "a quorum no longer holds the token",
            LostReason::Expired => "the deadline passed without a successful extension",
            LostReason::BudgetExhausted => "the keep-alive budget ran out",
            LostReason::Released => "released",
        })
    }
}

/// How a [`KeepAlive`] extends its lock. Build with [`KeepAliveOptions::default()`] and the
/// setters; every value is validated when the guard starts.
#[derive(Debug, Clone, PartialEq)]
pub struct KeepAliveOptions {
    renew_when_left: f64,
    ttl: Option<Duration>,
    max_hold: Option<Duration>,
    max_extensions: Option<u32>,
    retry_delay: Option<Duration>,
}

impl Default for KeepAliveOptions {
    /// Extend when a third of the TTL is left, with the lock's own TTL, without a budget;
    /// retry a failed round after `ttl / 30` (clamped to 5-500 ms) while validity is left.
    fn default() -> Self {
        KeepAliveOptions {
            renew_when_left: 1.0 / 3.0,
            ttl: None,
            max_hold: None,
            max_extensions: None,
            retry_delay: None,
        }
    }
}

impl KeepAliveOptions {
    /// Extend when this fraction of the TTL is left before the deadline, in `(0, 1)`
    /// (default 1/3).
    pub fn renew_when_left(mut self, fraction: f64) -> Self {
        self.renew_when_left = fraction;
        self
    }
    /// TTL of each extension (default: the TTL the lock was acquired with).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Never hold the lock longer than this, counted from the acquire's start: the last extension
    /// is shortened to end there, then the lock is lost with [`LostReason::BudgetExhausted`].
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }
    /// Extend at most this many times, then let the lock expire
    /// ([`LostReason::BudgetExhausted`]).
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.max_extensions = Some(max);
        self
    }
    /// Pause between extension rounds that failed transiently (a node down, a timeout), while
    /// validity is left.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = Some(delay);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        if !(self.renew_when_left > 0.0 && self.renew_when_left < 1.0) {
            return Err(InvalidInput::KeepAlive("renew_when_left must be in (0, 1)"));
        }
        if self.ttl.is_some_and(|t| t.is_zero()) {
            return Err(InvalidInput::ZeroTtl);
        }
        if self.retry_delay.is_some_and(|d| d.is_zero()) {
            return Err(InvalidInput::KeepAlive(
                "retry_delay must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// What every observer of a kept-alive lock sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    pub(crate) deadline: Instant,
    pub(crate) lost: Option<LostReason>,
    /// The budget allows no further extension: expiry at `deadline` is a budget loss.
    final_deadline: bool,
    extensions: u32,
}

type Shared = Arc<watch::Sender<Status>>;

/// The lost signal fires this long BEFORE the deadline: timers fire at or after their instant
/// (tokio rounds up to the millisecond), and the signal must come no later than the deadline.
pub(crate) const LOST_MARGIN: Duration = Duration::from_millis(2);

/// When the lost signal fires for a given deadline.
pub(crate) fn fire_at(deadline: Instant) -> Instant {
    deadline.checked_sub(LOST_MARGIN).unwrap_or(deadline)
}

/// Marks the lock lost at or after its deadline, unless it already is. Returns the reason.
fn expire(tx: &Shared) -> Option<LostReason> {
    tx.send_if_modified(|s| {
        if s.lost.is_none() && Instant::now() >= fire_at(s.deadline) {
            s.lost = Some(if s.final_deadline {
                LostReason::BudgetExhausted
            } else {
                LostReason::Expired
            });
            true
        } else {
            false
        }
    });
    tx.borrow().lost
}

fn mark_lost(tx: &Shared, reason: LostReason) {
    tx.send_if_modified(|s| {
        if s.lost.is_none() {
            s.lost = Some(reason);
            true
        } else {
            false
        }
    });
}

/// A cheap, clonable view of a kept-alive lock: its token, deadline and lost signal. Given to
/// the closure of [`Redlock::with_lock`]; get one from [`KeepAlive::handle`].
#[derive(Debug, Clone)]
pub struct LockHandle {
    tx: Shared,
    token: Arc<str>,
    resources: Arc<[String]>,
}

impl LockHandle {
    /// Resolves when the lock is lost, with the reason, and at the latest at its current
    /// deadline: the timer is set 2 ms before it, since timers fire at or after their instant.
    /// This future watches the clock itself, so it fires on time even if the extension task is
    /// starved (a starved waiter can of course only notice when it runs again). Resolves with [`LostReason::Released`] once the lock is released.
    /// Any number of tasks may wait on clones of the handle.
    ///
    /// Cancellation: safe at any point; it only observes.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.tx.subscribe();
        loop {
            let (deadline, lost) = {
                let s = rx.borrow_and_update();
                (s.deadline, s.lost)
            };
            if let Some(reason) = lost {
                return reason;
            }
            tokio::select! {
                () = tokio::time::sleep_until(fire_at(deadline)) => {
                    if let Some(reason) = expire(&self.tx) {
                        return reason;
                    }
                }
                _ = rx.changed() => {}
            }
        }
    }

    /// Whether the lock is lost (or released) right now, counting a passed deadline as lost.
    pub fn is_lost(&self) -> bool {
        let s = *self.tx.borrow();
        s.lost.is_some() || Instant::now() >= fire_at(s.deadline)
    }

    /// The current deadline (moves forward with each extension).
    pub fn deadline(&self) -> Instant {
        self.tx.borrow().deadline
    }

    /// A receiver that sees every change (extension, loss) of this lock's status.
    pub(crate) fn changes(&self) -> watch::Receiver<Status> {
        self.tx.subscribe()
    }

    /// Validity left before the current deadline; zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.tx.borrow().lost.is_some() {
            return Duration::ZERO;
        }
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// How many extensions succeeded so far.
    pub fn extensions(&self) -> u32 {
        self.tx.borrow().extensions
    }

    /// The owner token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The resources held.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }
}

/// A lock kept alive by a background task until [`release`](KeepAlive::release) or drop.
///
/// Dropping it stops the extension task and releases the lock in the background.
#[must_use = "dropping a KeepAlive releases the lock at once"]
#[derive(Debug)]
pub struct KeepAlive {
    handle: LockHandle,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Lock>>,
}

/// A [`Lock::keep_alive_with`] call whose options were rejected: the error, and the lock, still
/// held and untouched. Converting it into an [`Error`] (for example with `?`) drops the lock,
/// which releases it in the background.
#[derive(Debug)]
pub struct Rejected {
    /// What was wrong with the options.
    pub error: Error,
    /// The lock, still held.
    pub lock: Lock,
}

impl From<Box<Rejected>> for Error {
    fn from(r: Box<Rejected>) -> Error {
        r.error
    }
}

impl Lock {
    /// Keeps this lock alive in the background with [`KeepAliveOptions::default()`]: extends it
    /// when a third of its TTL is left, until released or lost. Must be called inside a tokio
    /// runtime (it spawns the extension task).
    pub fn keep_alive(self) -> KeepAlive {
        self.start_keep_alive(KeepAliveOptions::default())
    }

    /// Keeps this lock alive with the given options. Invalid options give back the lock with the
    /// error ([`Rejected`]); `?` turns that into the error and releases the lock.
    pub fn keep_alive_with(
        self,
        options: KeepAliveOptions,
    ) -> std::result::Result<KeepAlive, Box<Rejected>> {
        match options.validate() {
            Ok(()) => Ok(self.start_keep_alive(options)),
            Err(e) => Err(Box::new(Rejected {
                error: e.into(),
                lock: self,
            })),
        }
    }

    fn start_keep_alive(self, options: KeepAliveOptions) -> KeepAlive {
        let status = Status {
            deadline: self.deadline(),
            lost: None,
            final_deadline: false,
            extensions: 0,
        };
        let tx: Shared = Arc::new(watch::Sender::new(status));
        let handle = LockHandle {
            tx: tx.clone(),
            token: Arc::from(self.token()),
            resources: Arc::from(self.resources()),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(extend_loop(self, tx, options, stop_rx));
        KeepAlive {
            handle,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }
}

impl KeepAlive {
    /// A clonable view (token, deadline, lost signal) to hand to other tasks.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// See [`LockHandle::lost`].
    pub async fn lost(&self) -> LostReason {
        self.handle.lost().await
    }

    /// See [`LockHandle::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// See [`LockHandle::deadline`].
    pub fn deadline(&self) -> Instant {
        self.handle.deadline()
    }

    /// See [`LockHandle::remaining`].
    pub fn remaining(&self) -> Duration {
        self.handle.remaining()
    }

    /// See [`LockHandle::token`].
    pub fn token(&self) -> &str {
        self.handle.token()
    }

    /// See [`LockHandle::resources`].
    pub fn resources(&self) -> &[String] {
        self.handle.resources()
    }

    /// See [`LockHandle::extensions`].
    pub fn extensions(&self) -> u32 {
        self.handle.extensions()
    }

    /// Stops the extension task first (an extension in flight is abandoned; on each node it is
    /// queued before the release, so no extension can land after it), then releases the lock.
    /// Waiters on `lost()` then see [`LostReason::Released`], unless the lock was already lost.
    ///
    /// Errors as [`Lock::release`]; [`Error::NotHeld`] when the lock had been lost.
    ///
    /// Cancellation: dropping the future still releases, in the background.
    pub async fn release(mut self) -> Result<ReleaseReport> {
        let lock = self.stop_task().await;
        let lost_before = self.handle.tx.borrow().lost;
        mark_lost(&self.handle.tx, LostReason::Released);
        match lock {
            Some(lock) => lock.release().await,
            None => Err(Error::NotHeld {
                reason: match lost_before {
                    Some(LostReason::TokenGone) => NotHeldReason::TokenGone,
                    _ => NotHeldReason::Expired,
                },
                votes: Default::default(),
            }),
        }
    }

    async fn stop_task(&mut self) -> Option<Lock> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take()?.await {
            Ok(lock) => Some(lock),
            Err(e) => {
                tracing::error!(error = %e, "fredlock: keep-alive task failed; the lock expires with its TTL");
                None
            }
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        // Dropping `stop` ends the task, which drops the Lock, which releases in the background.
        mark_lost(&self.handle.tx, LostReason::Released);
    }
}

/// The extension task. Owns the lock and hands it back when stopped or lost.
async fn extend_loop(
    mut lock: Lock,
    tx: Shared,
    options: KeepAliveOptions,
    mut stop: oneshot::Receiver<()>,
) -> Lock {
    let ttl = options.ttl.unwrap_or(lock.ttl());
    let retry_delay = options
        .retry_delay
        .unwrap_or_else(|| (ttl / 30).clamp(Duration::from_millis(5), Duration::from_millis(500)));
    let hold_end = options.max_hold.map(|h| lock.acquired_at() + h);
    let span = tracing::debug_span!("fredlock.keep_alive", resources = ?lock.resources());
    loop {
        let deadline = lock.deadline();
        let renew_at = deadline
            .checked_sub(ttl.mul_f64(options.renew_when_left))
            .unwrap_or(deadline);
        tokio::select! {
            biased;
            _ = &mut stop => return lock,
            () = tokio::time::sleep_until(renew_at) => {}
        }

        // Budget: how long may the next extension be?
        let mut this_ttl = ttl;
        let spent_extensions = options
            .max_extensions
            .is_some_and(|m| tx.borrow().extensions >= m);
        let hold_left = hold_end.map(|end| end.saturating_duration_since(Instant::now()));
        if let Some(left) = hold_left {
            this_ttl = this_ttl.min(left);
        }
        let too_short =
            crate::quorum::validity(this_ttl, lock.redlock().inner.drift_factor).is_err();
        if spent_extensions || too_short || hold_left.is_some_and(|l| l.is_zero()) {
            tx.send_modify(|s| s.final_deadline = true);
            tracing::debug!(parent: &span, "keep-alive budget spent; the lock expires at its deadline");
            tokio::select! {
                biased;
                _ = &mut stop => return lock,
                () = tokio::time::sleep_until(fire_at(deadline)) => {}
            }
            expire(&tx);
            return lock;
        }

        // Extend, retrying transient failures while validity is left.
        loop {
            let result = tokio::select! {
                biased;
                _ = &mut stop => return lock,
                r = lock.extend_inner(this_ttl, true) => r,
            };
            match result {
                Ok(()) => {
                    let new_deadline = lock.deadline();
                    let published = tx.send_if_modified(|s| {
                        if s.lost.is_some() || Instant::now() >= fire_at(s.deadline) {
                            return false;
                        }
                        s.deadline = new_deadline;
                        s.extensions += 1;
                        if this_ttl < ttl {
                            // Shortened to end at max_hold: this is the last one.
                            s.final_deadline = true;
                        }
                        true
                    });
                    if !published {
                        // Someone saw the old deadline pass first: the lock counts as lost.
                        expire(&tx);
                        return lock;
                    }
                    break;
                }
                Err(Error::NotHeld {
                    reason: NotHeldReason::TokenGone,
                    ..
                }) => {
                    tracing::warn!(parent: &span, "fredlock: lock lost: a quorum no longer holds the token");
                    mark_lost(&tx, LostReason::TokenGone);
                    return lock;
                }
                Err(Error::NotHeld { .. }) => {
                    expire(&tx);
                    mark_lost(&tx, LostReason::Expired);
                    tracing::warn!(parent: &span, "fredlock: lock lost: deadline passed before an extension succeeded");
                    return lock;
                }
                Err(e) => {
                    tracing::debug!(parent: &span, error = %e, "extension round failed; retrying within validity");
                    let next = Instant::now() + retry_delay;
                    if next >= fire_at(lock.deadline()) {
                        tokio::select! {
                            biased;
                            _ = &mut stop => return lock,
                            () = tokio::time::sleep_until(fire_at(lock.deadline())) => {}
                        }
                        expire(&tx);
                        tracing::warn!(parent: &span, "fredlock: lock lost: no extension succeeded before the deadline");
                        return lock;
                    }
                    tokio::select! {
                        biased;
                        _ = &mut stop => return lock,
                        () = tokio::time::sleep_until(next) => {}
                    }
                }
            }
        }
    }
}

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
    /// released, then the panic resumes; if this future is dropped, `f` is dropped and the lock
    /// released in the background. A failed final release is logged, not returned: the work
    /// completed while the lock was valid.
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
        options.keep_alive.validate()?;
        let lock = match options.wait {
            Some(wait) => self.acquire_with(resources, ttl, wait).await?,
            None => self.acquire(resources, ttl).await?,
        };
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
                if let Err(e) = guard.release().await {
                    tracing::debug!(error = %e, "fredlock: release after losing the lock");
                }
                Err(Error::Lost { reason })
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
