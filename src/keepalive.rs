//! Locks that stay held while the work runs: a background extension task, a lost-lock signal that
//! fires no later than the deadline, and [`Redlock::with_lock`], which cancels the work for real
//! when the lock is lost.
//!
//! The state every party sees is one `watch` value ([`Status`]) that only moves forward: once a
//! lock is marked lost it stays lost, and a new deadline is published only if it was obtained
//! before the old one passed and lies after it. The extension task and every `lost()` waiter race
//! to mark the lock lost at the deadline; whoever comes first wins, and both agree on the outcome.
//!
//! The task owns the [`Lock`] inside a [`Holder`] whose `Drop` publishes "lost" BEFORE the lock
//! (and so its keys) goes: whatever way the task ends (a panic, the runtime shutting down, an
//! early return), no handle can still say "held" once the keys may be released.
//!
//! Owns: the extension task, its count against `max_extensions`, the lost signal, `with_lock`.
//! [`KeepAliveOptions`] and the schedule's arithmetic (when to extend, for how long, when to give
//! up) are `pacing`'s.
//! Must not: talk to nodes except through [`Lock::extend`]'s round.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, LostReason, Names, NotHeldReason, Result};
use crate::lock::{Lock, ReleaseReport};
use crate::pacing::{self, Pacing};

pub(crate) use crate::pacing::fire_at;
pub use crate::pacing::KeepAliveOptions;

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
/// the closure of [`Redlock::with_lock`](crate::Redlock::with_lock); get one from [`KeepAlive::handle`].
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

    /// Resolves at the next change of this lock: `Ok(new deadline)` after an extension,
    /// `Err(reason)` once it is lost (at once if it already is, and at the latest at the
    /// deadline, as [`lost`](Self::lost)). Changes that happen between two calls are not
    /// replayed: read [`deadline`](Self::deadline) for the current value.
    ///
    /// Cancellation: safe at any point; it only observes.
    pub async fn changed(&self) -> std::result::Result<Instant, LostReason> {
        let mut rx = self.tx.subscribe();
        loop {
            let (deadline, lost) = {
                let s = rx.borrow_and_update();
                (s.deadline, s.lost)
            };
            if let Some(reason) = lost {
                return Err(reason);
            }
            tokio::select! {
                () = tokio::time::sleep_until(fire_at(deadline)) => {
                    if let Some(reason) = expire(&self.tx) {
                        return Err(reason);
                    }
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        return Err(LostReason::TaskEnded);
                    }
                    let s = *rx.borrow_and_update();
                    return match s.lost {
                        Some(reason) => Err(reason),
                        None => Ok(s.deadline),
                    };
                }
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
        match options.validate(self.redlock().inner.drift_factor) {
            Ok(()) => Ok(self.start_keep_alive(options)),
            Err(e) => Err(Box::new(Rejected {
                error: e.into(),
                lock: self,
            })),
        }
    }

    fn start_keep_alive(self, options: KeepAliveOptions) -> KeepAlive {
        // A budget shorter than the acquire's validity caps the very first deadline.
        let hold_end = pacing::hold_end(self.acquired_at(), options.max_hold);
        let capped = hold_end.is_some_and(|end| end < self.deadline());
        let status = Status {
            deadline: pacing::cap(self.deadline(), hold_end),
            lost: None,
            final_deadline: capped || options.max_extensions == Some(0),
            extensions: 0,
        };
        let tx: Shared = Arc::new(watch::Sender::new(status));
        let handle = LockHandle {
            tx: tx.clone(),
            token: Arc::from(self.token()),
            resources: Arc::from(self.resources()),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let holder = Holder {
            lock: Some(self),
            tx,
        };
        let task = tokio::spawn(extend_loop(holder, options, hold_end, stop_rx));
        KeepAlive {
            handle,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }
}

/// The extension task's lock. Whatever way the task ends without handing the lock back (a
/// panic, the runtime shutting down, a return that forgot to), dropping this publishes "lost"
/// FIRST, and only then drops the lock, which releases its keys in the background.
struct Holder {
    lock: Option<Lock>,
    tx: Shared,
}

impl Holder {
    fn lock(&mut self) -> &mut Lock {
        // `lock` is `None` only after `hand_back`, which consumes the holder.
        let present = self.lock.as_mut();
        present.expect("the lock is present until handed back") // ok: see above
    }

    /// Ends the task normally: the lock goes back to whoever awaits the task.
    fn hand_back(mut self) -> Lock {
        let present = self.lock.take();
        present.expect("the lock is present until handed back") // ok: see `lock`
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if self.lock.is_some() {
            mark_lost(&self.tx, LostReason::TaskEnded);
            tracing::warn!("fredlock: keep-alive task ended without handing its lock back (panic or runtime shutdown); the lock counts as lost and is released");
        }
        // `self.lock` is dropped after this: its keys are released in the background.
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
                resources: Names(self.handle.resources().to_vec()),
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

/// The extension task. Owns the lock (in a [`Holder`]) and hands it back when stopped or lost.
///
/// One cycle: sleep until `renew_when_left` of the TTL is left (and at least `ttl / 10` after the
/// previous round started); size this round's TTL within the budget, afresh on every retry; send
/// it only if it moves the deadline forward by at least `ttl / 20`; publish the new deadline only
/// if it is later than the published one and obtained before that one passed.
async fn extend_loop(
    mut holder: Holder,
    options: KeepAliveOptions,
    hold_end: Option<Instant>,
    mut stop: oneshot::Receiver<()>,
) -> Lock {
    let tx = holder.tx.clone();
    let schedule = Pacing::new(
        &options,
        holder.lock().ttl(),
        hold_end,
        holder.lock().redlock().inner.drift_factor,
    );
    let span = tracing::debug_span!("fredlock.keep_alive", resources = ?holder.lock().resources());
    let mut last_round = holder.lock().acquired_at();
    loop {
        let (deadline, final_deadline) = {
            let s = tx.borrow();
            (s.deadline, s.final_deadline)
        };
        let spent = options
            .max_extensions
            .is_some_and(|m| tx.borrow().extensions >= m);
        if final_deadline || spent {
            tx.send_if_modified(|s| !std::mem::replace(&mut s.final_deadline, true));
            tracing::debug!(parent: &span, "keep-alive budget spent; the lock expires at its deadline");
            tokio::select! {
                biased;
                _ = &mut stop => return holder.hand_back(),
                () = tokio::time::sleep_until(fire_at(deadline)) => {}
            }
            expire(&tx);
            return holder.hand_back();
        }
        let renew_at = schedule.renew_at(deadline, last_round);
        tokio::select! {
            biased;
            _ = &mut stop => return holder.hand_back(),
            () = tokio::time::sleep_until(renew_at) => {}
        }

        // Extend, retrying transient failures while validity is left.
        loop {
            let now = Instant::now();
            last_round = now;
            let this_ttl = schedule.round_ttl(now);
            if !schedule.useful(this_ttl, now, deadline) {
                // No extension within the budget would move the deadline forward: the last
                // deadline stands (an extension now could only shorten the keys).
                tx.send_modify(|s| s.final_deadline = true);
                break;
            }
            let result = tokio::select! {
                biased;
                _ = &mut stop => return holder.hand_back(),
                r = holder.lock().extend_inner(this_ttl, true) => r,
            };
            match result {
                Ok(()) => {
                    let obtained = holder.lock().deadline();
                    let new_deadline = pacing::cap(obtained, hold_end);
                    let published = tx.send_if_modified(|s| {
                        if s.lost.is_some()
                            || Instant::now() >= fire_at(s.deadline)
                            || new_deadline <= s.deadline
                        {
                            return false;
                        }
                        s.deadline = new_deadline;
                        s.extensions = s.extensions.saturating_add(1);
                        if this_ttl < schedule.ttl {
                            // Shortened to fit the budget: this is the last one.
                            s.final_deadline = true;
                        }
                        true
                    });
                    if !published {
                        // Someone saw the old deadline pass first: the lock counts as lost.
                        expire(&tx);
                        if tx.borrow().lost.is_some() {
                            return holder.hand_back();
                        }
                    }
                    break;
                }
                Err(Error::NotHeld {
                    reason: NotHeldReason::TokenGone,
                    ..
                }) => {
                    tracing::warn!(parent: &span, "fredlock: lock lost: a quorum no longer holds the token");
                    mark_lost(&tx, LostReason::TokenGone);
                    return holder.hand_back();
                }
                Err(Error::NotHeld { .. }) => {
                    expire(&tx);
                    mark_lost(&tx, LostReason::Expired);
                    tracing::warn!(parent: &span, "fredlock: lock lost: deadline passed before an extension succeeded");
                    return holder.hand_back();
                }
                Err(e) => {
                    tracing::debug!(parent: &span, error = %e, "extension round failed; retrying within validity");
                    let give_up = fire_at(tx.borrow().deadline);
                    let Some(next) = schedule.retry_at(Instant::now(), give_up) else {
                        tokio::select! {
                            biased;
                            _ = &mut stop => return holder.hand_back(),
                            () = tokio::time::sleep_until(give_up) => {}
                        }
                        expire(&tx);
                        tracing::warn!(parent: &span, "fredlock: lock lost: no extension succeeded before the deadline");
                        return holder.hand_back();
                    };
                    tokio::select! {
                        biased;
                        _ = &mut stop => return holder.hand_back(),
                        () = tokio::time::sleep_until(next) => {}
                    }
                }
            }
        }
    }
}
