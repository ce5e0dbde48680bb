//! The status of a kept-alive lock, as its driver and every handle see it: one value
//! ([`Status`], in a [`StatusCell`]) that only moves forward. Once a lock is marked lost it
//! stays lost; the driver and every `lost()` waiter race to mark it lost at the deadline, and
//! whoever comes first wins, both agreeing on the outcome.
//!
//! Owns: [`Status`], its cell and receiver, the lost/expire transitions. Must not: extend, hold
//! or release a lock (the drivers in `renewal` do), or decide when to renew (`pacing` does).

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::base::error::LostReason;
use crate::hold::pacing::fire_at;

/// What every observer of a kept-alive lock sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    pub(crate) deadline: Instant,
    pub(crate) lost: Option<LostReason>,
    /// The budget allows no further extension: expiry at `deadline` is a budget loss.
    pub(crate) final_deadline: bool,
    pub(crate) extensions: u32,
}

/// The status of one kept-alive lock, shared by its driver and every handle: the value with a
/// version, and a notification for those waiting for a change. Like a `tokio::sync::watch`
/// channel, at a quarter of its size (a watch channel keeps nine `Notify`s, about 360 bytes,
/// which was a third of the memory per held lock).
#[derive(Debug)]
pub(crate) struct StatusCell {
    state: Mutex<(Status, u64)>,
    changed: Notify,
}

/// A kept-alive lock's status, as its driver and its handles hold it.
pub(crate) type Shared = Arc<StatusCell>;

impl StatusCell {
    /// A cell holding `status`.
    pub(crate) fn new(status: Status) -> Shared {
        Arc::new(StatusCell {
            state: Mutex::new((status, 0)),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (Status, u64)> {
        // The value is Copy and every update is one closure: a panic inside one leaves a whole
        // value behind, so a poisoned lock is still a consistent status.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current status.
    pub(crate) fn borrow(&self) -> Status {
        self.state().0
    }

    /// Applies `modify`; when it returns true, the status counts as changed and every waiter
    /// is woken. Returns what `modify` returned.
    pub(crate) fn send_if_modified(&self, modify: impl FnOnce(&mut Status) -> bool) -> bool {
        let modified = {
            let mut state = self.state();
            let modified = modify(&mut state.0);
            if modified {
                state.1 = state.1.wrapping_add(1);
            }
            modified
        };
        if modified {
            self.changed.notify_waiters();
        }
        modified
    }

    /// Applies `modify` and wakes every waiter.
    pub(crate) fn send_modify(&self, modify: impl FnOnce(&mut Status)) {
        self.send_if_modified(|s| {
            modify(s);
            true
        });
    }

    /// A receiver that has seen the current status.
    pub(crate) fn subscribe(self: &Arc<Self>) -> StatusRx {
        let seen = self.state().1;
        StatusRx {
            cell: self.clone(),
            seen,
        }
    }
}

/// Follows the changes of a [`StatusCell`], as a `watch::Receiver` does.
#[derive(Debug)]
pub(crate) struct StatusRx {
    cell: Shared,
    seen: u64,
}

/// The status can no longer change. Never returned today (every receiver keeps its cell), kept
/// so that a waiter states what it does if it ever is.
#[derive(Debug)]
pub(crate) struct Closed;

impl StatusRx {
    /// The current status, which counts as seen from now on.
    pub(crate) fn borrow_and_update(&mut self) -> Status {
        let (status, version) = *self.cell.state();
        self.seen = version;
        status
    }

    /// Resolves once the status changed since it was last seen (at once if it already has).
    ///
    /// Cancellation: safe at any point; it only observes.
    pub(crate) async fn changed(&mut self) -> std::result::Result<(), Closed> {
        loop {
            let notified = self.cell.changed.notified();
            tokio::pin!(notified);
            // Registered BEFORE the version is read: a change made after the read wakes it.
            notified.as_mut().enable();
            let version = self.cell.state().1;
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            notified.await;
        }
    }
}

/// Marks the lock lost at or after its deadline, unless it already is. Returns the reason.
pub(crate) fn expire(tx: &Shared) -> Option<LostReason> {
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

/// Marks the lock lost with `reason`, unless it already is.
pub(crate) fn mark_lost(tx: &Shared, reason: LostReason) {
    tx.send_if_modified(|s| {
        if s.lost.is_none() {
            s.lost = Some(reason);
            crate::base::metrics::lost(reason);
            true
        } else {
            false
        }
    });
}
