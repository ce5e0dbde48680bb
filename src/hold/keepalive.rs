//! Locks that stay held while the work runs: the public face of a kept-alive lock ([`KeepAlive`],
//! [`LockHandle`]), its lost signal that fires no later than the deadline, and how a [`Lock`]
//! is handed to the layer below that extends it.
//!
//! Every waiter on the lost signal watches the clock itself and marks the lock lost at its
//! deadline, so the signal is on time however busy the renewer is; the status it reads only
//! moves forward (see `renewal`).
//!
//! Owns: the guard and its handles, what `release` and drop of the guard do.
//! Must not: extend a lock itself or keep a schedule (that is `renewal`'s, whose [`Status`] is
//! what every handle reads), or talk to nodes except through [`Lock::release`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Error, LostReason, Names, NotHeldReason, Result};
use crate::hold::pacing;
use crate::hold::renewal::Driver;
use crate::hold::status::{expire, mark_lost, Shared, Status, StatusCell, StatusRx};
use crate::nodes::node::Held;
use crate::rounds::lock::{Lock, ReleaseReport};

pub(crate) use crate::hold::pacing::fire_at;
pub use crate::hold::pacing::KeepAliveOptions;

/// A cheap, clonable view of a kept-alive lock: its token, deadline and lost signal. Given to
/// the closure of [`Redlock::with_lock`](crate::Redlock::with_lock); get one from [`KeepAlive::handle`].
///
/// `Debug` shows the resources, the label, the token's [`fingerprint`](LockHandle::fingerprint)
/// and the status (validity left, extensions, why it was lost), never the token.
#[derive(Clone)]
pub struct LockHandle {
    tx: Shared,
    /// The lock's keys, token and resource names (shared with the lock, not copied).
    held: Arc<Held>,
    /// With fencing: one token per resource, in `resources` order (the lock's, never changed
    /// by an extension).
    fencing: Option<Arc<[u64]>>,
}

impl std::fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.debug_fields(&mut f.debug_struct("LockHandle"))
    }
}

impl LockHandle {
    /// The fields `Debug` shows of a handle and of its guard: public ones only (the token is a
    /// secret: its fingerprint stands for it).
    fn debug_fields(&self, d: &mut std::fmt::DebugStruct<'_, '_>) -> std::fmt::Result {
        let lost = self.tx.borrow().lost;
        d.field("resources", &self.held.resources)
            .field("label", &self.label())
            .field("fingerprint", &self.fingerprint())
            .field("fencing_tokens", &self.fencing)
            .field("remaining", &self.remaining())
            .field("extensions", &self.extensions())
            .field("lost", &lost)
            .finish_non_exhaustive()
    }

    /// Resolves when the lock is lost, with the reason, and at the latest at its current
    /// deadline. Its timer is set 2 ms before the deadline; tokio's timer works in whole
    /// milliseconds and fires on the first tick at or after its instant, so on a runtime that
    /// is not busy this resolves between 2 ms and a fraction of a millisecond (measured:
    /// 0.15-1.4 ms) before the deadline, never more than 2 ms before it. A runtime busy for
    /// longer than that makes it late by as much.
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
                    let s = rx.borrow_and_update();
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
        let s = self.tx.borrow();
        s.lost.is_some() || Instant::now() >= fire_at(s.deadline)
    }

    /// The current deadline (moves forward with each extension).
    pub fn deadline(&self) -> Instant {
        self.tx.borrow().deadline
    }

    /// The resource names as errors show them.
    pub(crate) fn names(&self) -> Names {
        self.held.names()
    }

    /// A receiver that sees every change (extension, loss) of this lock's status.
    pub(crate) fn changes(&self) -> StatusRx {
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

    /// How many times a key of the lock was re-set on a node that had lost it (see
    /// [`Lock::repairs`](crate::Lock::repairs)).
    pub fn repairs(&self) -> u64 {
        self.held.repairs.count()
    }

    /// The secret owner token (see [`Lock::token`](crate::Lock::token)).
    pub fn token(&self) -> &str {
        self.held.token()
    }

    /// The owner label stored with the lock (see [`Lock::label`](crate::Lock::label)).
    pub fn label(&self) -> Option<&str> {
        self.held.label()
    }

    /// The token's public fingerprint (see [`Lock::fingerprint`](crate::Lock::fingerprint)).
    pub fn fingerprint(&self) -> String {
        crate::base::owner::fingerprint(self.held.token())
    }

    /// The resources held.
    pub fn resources(&self) -> &[String] {
        &self.held.resources
    }

    /// The lock's fencing token (of its first resource), as [`Lock::fencing_token`]: `None`
    /// unless the `Redlock` hands them out
    /// ([`fencing_tokens`](crate::Builder::fencing_tokens)). Pass it with every write to the
    /// protected resource, which rejects a write whose token is lower than the highest it has
    /// seen. It stays the same for the whole hold: extensions do not change it.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing.as_ref().and_then(|t| t.first().copied())
    }

    /// Every resource's fencing token, in [`resources`](Self::resources) order (see
    /// [`Lock::fencing_tokens`]).
    pub fn fencing_tokens(&self) -> Option<&[u64]> {
        self.fencing.as_deref()
    }
}

/// A lock kept alive in the background until [`release`](KeepAlive::release) or drop: by its
/// Redlock's shared renewer, which extends the locks due at about the same time with one call
/// per node (the default), or by a task of its own ([`KeepAliveOptions::batched`]).
///
/// Dropping it stops the extension and releases the lock in the background.
///
/// `Debug` shows the same fields as its [`LockHandle`]'s, never the token.
#[must_use = "dropping a KeepAlive releases the lock at once"]
pub struct KeepAlive {
    handle: LockHandle,
    driver: Driver,
}

impl std::fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.debug_fields(&mut f.debug_struct("KeepAlive"))
    }
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

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "keep-alive options rejected for lock {}: {} (the lock is still held: take it back from `Rejected::lock`, or drop it to release it)",
            self.lock.held().names(),
            self.error
        )
    }
}

/// So that `?` works into `Box<dyn std::error::Error>` and `anyhow::Error` (the lock is then
/// dropped, which releases it in the background). The source is [`Rejected::error`].
impl std::error::Error for Rejected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
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
        let tx: Shared = StatusCell::new(status);
        // `close()` releases the lock itself: the work under it must stop, and the renewer with it.
        let closed = tx.clone();
        self.on_close(Box::new(move || mark_lost(&closed, LostReason::Closed)));
        let handle = LockHandle {
            tx: tx.clone(),
            held: self.held().clone(),
            fencing: self.fencing_tokens().map(Arc::from),
        };
        let driver = Driver::start(self, tx, &options, hold_end);
        KeepAlive { handle, driver }
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

    /// See [`LockHandle::label`].
    pub fn label(&self) -> Option<&str> {
        self.handle.label()
    }

    /// See [`LockHandle::fingerprint`].
    pub fn fingerprint(&self) -> String {
        self.handle.fingerprint()
    }

    /// See [`LockHandle::resources`].
    pub fn resources(&self) -> &[String] {
        self.handle.resources()
    }

    /// See [`LockHandle::extensions`].
    pub fn extensions(&self) -> u32 {
        self.handle.extensions()
    }

    /// See [`LockHandle::fencing_token`].
    pub fn fencing_token(&self) -> Option<u64> {
        self.handle.fencing_token()
    }

    /// See [`LockHandle::fencing_tokens`].
    pub fn fencing_tokens(&self) -> Option<&[u64]> {
        self.handle.fencing_tokens()
    }

    /// Stops the extension first (the renewer, or the lock's own task, hands the lock back; an
    /// extension in flight is abandoned: on each node it is queued before the release, so no
    /// extension can land after it), then releases the lock.
    /// Waiters on `lost()` then see [`LostReason::Released`], unless the lock was already lost.
    ///
    /// Errors as [`Lock::release`]; [`Error::NotHeld`] when the lock had been lost;
    /// [`Error::Closed`] when [`Redlock::close`](crate::Redlock::close) released it.
    ///
    /// Cancellation: dropping the future still releases, in the background.
    pub async fn release(mut self) -> Result<ReleaseReport> {
        // "Lost" first: once the stop is sent, the lock can be dropped (and its keys released)
        // by the renewer if this future is dropped, before `Drop` below would publish it.
        let lost_before = self.handle.tx.borrow().lost;
        mark_lost(&self.handle.tx, LostReason::Released);
        let lock = self.driver.stop().await;
        match lock {
            Some(lock) => lock.release().await,
            None if lost_before == Some(LostReason::Closed) => Err(Error::Closed {
                resources: self.handle.held.names(),
            }),
            None => Err(Error::NotHeld {
                resources: self.handle.held.names(),
                reason: match lost_before {
                    Some(LostReason::TokenGone) => NotHeldReason::TokenGone,
                    _ => NotHeldReason::Expired,
                },
                votes: Default::default(),
            }),
        }
    }
}

impl KeepAlive {
    /// Stops the extension and hands back the lock, still held and not released (the lock is
    /// handed over, for a lease); `None` when it was lost. Handles then see
    /// [`LostReason::Released`].
    pub(crate) async fn stop(mut self) -> Option<Lock> {
        mark_lost(&self.handle.tx, LostReason::Released);
        self.driver.stop().await
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        // Lost first; then the driver drops the Lock, which releases in the background.
        mark_lost(&self.handle.tx, LostReason::Released);
        self.driver.abandon();
    }
}
