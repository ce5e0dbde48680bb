//! # fredlock
//!
//! One lock that every replica of a service respects: the Redlock algorithm over N independent
//! Redis or Valkey nodes, on the [`fred`] client and tokio.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fredlock::Error> {
//! use std::time::Duration;
//! use fredlock::Redlock;
//!
//! let redlock = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .build()
//!     .await?;
//! let lock = redlock.acquire("orders:42", Duration::from_secs(10)).await?;
//! // ... the critical section, finished before lock.deadline() ...
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## What is guaranteed
//! Assuming at most (N-1)/2 nodes are faulty, no node restarts empty within the TTL, node clocks
//! run at a rate within the drift factor, and the holder does not pause past its deadline:
//! - a lock is granted only when a quorum (N/2+1 of the CONFIGURED nodes) set the key in the same
//!   attempt and validity is left: `deadline = start + ttl - (ttl * drift + 2 ms)`, measured on the
//!   monotonic clock from before the first command;
//! - so no two holders' `[start, deadline]` windows overlap for a resource;
//! - release and extend act only where our 128-bit random token is still present; extend never
//!   re-creates an expired key;
//! - a failed, timed-out or cancelled attempt releases on every node that may hold its token.
//!
//! ## What is not
//! A holder that pauses (GC, SIGSTOP, a swapped-out VM) past its deadline can still act after
//! another client got the lock: only a fencing token checked by the protected resource covers
//! that. A node whose clock jumps, or that restarts without its data within a TTL, can break
//! mutual exclusion (use `appendfsync always`, or keep a crashed node out for longer than the TTL).
//!
//! ## Layout
//! - [`config`]: the builder, defaults in one place, validation of every input.
//! - `endpoint`: node URLs checked (clean messages) and redacted by structure.
//! - `connection`: one node's connect loop, its latest cause of failure in the server's words,
//!   and the server's identity (`run_id`), so that one server never votes twice.
//! - `node`: one Redis node (one fred client), per-command timeouts, reply decoding.
//! - `scripts`: every Lua script, each with its KEYS/ARGV contract.
//! - `quorum`: the one fan-out primitive, early decision, validity arithmetic.
//! - `redlock`: acquire / try_acquire / inspect, and the extend and release rounds.
//! - `lock`: [`Lock`], extend / release, drop behaviour.
//! - `keepalive`: [`KeepAlive`] (background extension, the lost signal) and [`Redlock::with_lock`].
//! - `election`: [`Election`], leader election over one resource, observed through a `watch`.
//! - [`error`]: one [`Error`] whose variants a caller can act on.
//! - `testkit` (feature `testkit`): local `redis-server` nodes, node control, a fault proxy.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod config;
mod connection;
mod election;
mod endpoint;
pub mod error;
mod keepalive;
mod lock;
mod node;
mod quorum;
mod redlock;
mod scripts;
#[cfg(feature = "testkit")]
#[allow(unsafe_code)] // signals (SIGSTOP, SIGKILL) and SO_LINGER need libc
pub mod testkit;

pub use config::{Builder, Retry};
pub use election::{Election, Role, Term};
pub use error::{
    Error, InvalidInput, LostReason, Names, NodeError, NodeErrorKind, NotHeldReason, Result, Vote,
    Votes,
};
pub use keepalive::{KeepAlive, KeepAliveOptions, LockHandle, OnLost, Rejected, WithLock};
pub use lock::{Lock, ReleaseReport};
pub use redlock::{Holder, Inspection, NodeView, Redlock, Resources};

/// The fred crate fredlock is built on, re-exported so callers can build clients of the same version.
pub use fred;
