//! What a Redlock holds right now and which acquires are under way, so that
//! [`Redlock::close`](crate::Redlock::close) can end them all before the connections go: a
//! process that exits after `close()` leaves no key behind for its TTL, and the next waiter in
//! another process is woken by the releases at once.
//!
//! Every [`Lock`](crate::Lock) (and so every permit, read or write guard and election term)
//! registers here when it is granted and leaves when it is dropped. Its [`Claim`] says who
//! releases it: the holder (its `release`, its drop) or `close()`, whichever comes first; the
//! other one sends nothing.
//!
//! Owns: the registry, the closed flag and its wake-up, the count of acquires under way.
//! Must not: send a command (the Redlock one layer up releases what [`Holds::close`] hands it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::nodes::node::Held;

/// The locks of one Redlock and its acquires under way.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    state: Mutex<State>,
    closed: AtomicBool,
    /// Set once `close()` has released every lock it took.
    released: AtomicBool,
    /// Told when the Redlock closes, when the last acquire under way ends, and when `close()`
    /// has released what it took.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    locks: HashMap<u64, (Arc<Held>, Arc<Claim>)>,
    acquiring: usize,
}

/// Who releases one lock: its holder or `close()`. Also what `close()` needs to release it as
/// its holder would (the TTL for the node timeouts, the end of a minimum hold).
pub(crate) struct Claim {
    owner: AtomicU8,
    shape: Mutex<Shape>,
    /// Run when `close()` takes the lock (the keep-alive layer marks its handles lost).
    on_close: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("owner", &self.owner.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

const HELD: u8 = 0;
const RELEASING: u8 = 1;
const CLOSED: u8 = 2;

/// The parts of a lock that its release depends on and that change while it is held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// The TTL of the last acquire or extend.
    pub(crate) ttl: Duration,
    /// The end of a minimum hold ([`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least)):
    /// a release before it shortens the keys instead of deleting them.
    pub(crate) minimum_until: Option<Instant>,
}

/// A lock `close()` took, to be released as its holder would have.
pub(crate) struct Taken {
    pub(crate) held: Arc<Held>,
    pub(crate) shape: Shape,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Claim {
    /// The holder releases: `false` when `close()` took the lock first (it is released).
    pub(crate) fn release(&self) -> bool {
        let was = self
            .owner
            .compare_exchange(HELD, RELEASING, Ordering::AcqRel, Ordering::Acquire);
        matches!(was, Ok(_) | Err(RELEASING))
    }

    /// Whether `close()` took the lock: its keys are released, nothing more may be sent for it.
    pub(crate) fn closed(&self) -> bool {
        self.owner.load(Ordering::Acquire) == CLOSED
    }

    /// Records a new TTL (an extension) or minimum hold.
    pub(crate) fn reshape(&self, change: impl FnOnce(&mut Shape)) {
        change(&mut guard(&self.shape));
    }

    /// Runs `f` when `close()` takes the lock, or at once when it already has.
    pub(crate) fn on_close(&self, f: Box<dyn FnOnce() + Send>) {
        let mut hooks = guard(&self.on_close);
        if self.closed() {
            drop(hooks);
            f();
        } else {
            hooks.push(f);
        }
    }

    fn take(&self) -> Option<Shape> {
        self.owner
            .compare_exchange(HELD, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let hooks = std::mem::take(&mut *guard(&self.on_close));
        for f in hooks {
            f();
        }
        Some(*guard(&self.shape))
    }
}

/// An acquire under way: `close()` waits for it to end (granted, so registered, or refused).
pub(crate) struct InFlight<'a>(&'a Holds);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = guard(&self.0.state);
        state.acquiring -= 1;
        if state.acquiring == 0 {
            self.0.changed.notify_waiters();
        }
    }
}

impl Holds {
    /// Registers a granted lock: its id (for [`Holds::forget`]) and its claim.
    pub(crate) fn register(&self, held: Arc<Held>, shape: Shape) -> (u64, Arc<Claim>) {
        let claim = Arc::new(Claim {
            owner: AtomicU8::new(HELD),
            shape: Mutex::new(shape),
            on_close: Mutex::new(Vec::new()),
        });
        let mut state = guard(&self.state);
        let id = state.next;
        state.next += 1;
        state.locks.insert(id, (held, claim.clone()));
        (id, claim)
    }

    /// The lock `id` was dropped.
    pub(crate) fn forget(&self, id: u64) {
        guard(&self.state).locks.remove(&id);
    }

    /// An acquire starts; `None` once the Redlock is closed.
    pub(crate) fn acquiring(&self) -> Option<InFlight<'_>> {
        let mut state = guard(&self.state);
        if self.is_closed() {
            return None;
        }
        state.acquiring += 1;
        Some(InFlight(self))
    }

    /// Whether [`Holds::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once the Redlock is closed (at once if it is).
    pub(crate) async fn closing(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_closed() {
                return;
            }
            changed.await;
        }
    }

    /// Resolves once `close()` has released every lock it took (its releases were answered by a
    /// quorum, or failed): work stopped by `close()` returns after this, so that a process
    /// whose `main` ends with that work does not end the releases with it.
    pub(crate) async fn released(&self) {
        loop {
            let changed = self.changed.notified();
            if self.released.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// `close()` has released every lock it took.
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Closes: no acquire starts from now on and those waiting end, then, once every acquire
    /// under way has ended, takes every lock still held (running its `on_close` hooks) and
    /// hands them back to be released.
    pub(crate) async fn close(&self) -> Vec<Taken> {
        {
            let _state = guard(&self.state);
            self.closed.store(true, Ordering::Release);
        }
        self.changed.notify_waiters();
        loop {
            let changed = self.changed.notified();
            if guard(&self.state).acquiring == 0 {
                break;
            }
            changed.await;
        }
        let locks: Vec<_> = guard(&self.state).locks.values().cloned().collect();
        locks
            .into_iter()
            .filter_map(|(held, claim)| claim.take().map(|shape| Taken { held, shape }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_claim() -> Claim {
        Claim {
            owner: AtomicU8::new(HELD),
            shape: Mutex::new(Shape {
                ttl: Duration::from_secs(1),
                minimum_until: None,
            }),
            on_close: Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn the_first_of_holder_and_close_releases() {
        let claim = held_claim();
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        claim.on_close(Box::new(move || f.store(true, Ordering::Release)));
        assert!(claim.take().is_some());
        assert!(fired.load(Ordering::Acquire), "close runs the hooks");
        assert!(!claim.release(), "the holder sends nothing after close");
        assert!(claim.take().is_none(), "close takes a lock once");

        let claim = held_claim();
        assert!(claim.release());
        assert!(
            claim.release(),
            "a release resent from a drop path still goes"
        );
        assert!(
            claim.take().is_none(),
            "close leaves a lock its holder releases"
        );
    }
}
