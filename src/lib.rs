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
//! - release and extend act only where our value (a 128-bit random token, then the public owner
//!   label) is still present; extend never re-creates a lock that lost its quorum (once an
//!   extension won on a quorum, the keys are re-set with `SET NX` on nodes that lost them, so a
//!   lock regains a node that was down: see docs/algorithm.md, "Healing");
//! - a failed, timed-out or cancelled attempt releases on every node that may hold its token.
//!
//! ## What is not
//! A holder that pauses (GC, SIGSTOP, a swapped-out VM) past its deadline can still act after
//! another client got the lock: only a fencing token checked by the protected resource covers
//! that. A node whose clock jumps, or that restarts without its data within a TTL, can break
//! mutual exclusion (use `appendfsync always`, or keep a crashed node out for longer than the TTL).
//!
//! ## Layout: folders and layers that only look down
//! Each folder of `src/` is a group of layers, each module a layer of its own or shares one;
//! a module may use only modules of LOWER layers, and a folder only the folders below it
//! (`tests/layers.rs` fails otherwise), so a reader can start at the bottom and a change ripples
//! only upwards. Each folder's `mod.rs` says what it owns and must not touch; each file opens
//! with what it owns. Bottom to top:
//!
//! | folder | what it owns | modules, bottom to top |
//! |---|---|---|
//! | `base/` | values, decoders, scripts; no I/O | [`error`], `metrics`, `endpoint`, `scripts`, `sem_rw_scripts`, `reply`, `slots`, `line`, `owner` |
//! | `nodes/` | one node: connections, cluster shards, batching, the subscriber | `busy`, `caps`, `connection`, `node_status`, `cluster`, `topology`, `native`, `batch`, `node`, `node_gate`, `node_lock`, `node_extend_many`, `node_primitives`, `node_ops`, `subscriber` |
//! | `rounds/` | the quorum rounds and the acquire loop | `quorum`, `holds`, `background`, `redlock`, `held_rounds`, `attempt`, `handover`, `acquire_loop`, `lock` |
//! | `ops/` | what an operator does to locks it does not hold | `inspect`, `force` |
//! | `hold/` | holding a lock while work runs | `pacing`, `status`, `renewal`, `keepalive`, `with_lock`, `shutdown` |
//! | `primitives/` | elections, semaphores, read-write locks, leases | `leader`, `observe`, `semaphore_round`, `rwlock_round`, `campaign`, `campaign_observers`, `election`, `semaphore`, `lease`, `rwlock` |
//! | `config.rs` | the builder: validates, then constructs; nothing imports it back | [`config`] |
//!
//! The public API is re-exported here at the crate root; the folders are private.
//!
//! The test machinery (local `redis-server` nodes, node control, a fault proxy, the safety checker
//! and the torture run) lives in the `fredlock-testkit` crate beside this one, not in the library.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod base;
pub mod config;
mod hold;
mod nodes;
mod ops;
mod primitives;
mod rounds;

pub use base::error::{
    Error, HeldBy, InvalidInput, LostReason, Names, NodeError, NodeErrorKind, NotHeldReason,
    Result, Round, Vote, Votes,
};
pub use base::owner::{MAX_LABEL_LEN, MAX_TOKEN_LEN, SEPARATOR};
pub use base::slots::MAX_RESOURCE_LEN;
pub use config::{Builder, Retry};
pub use hold::keepalive::{KeepAlive, KeepAliveOptions, LockHandle, Rejected};
pub use hold::shutdown::Shutdown;
pub use hold::with_lock::{OnLost, WithLock};
pub use nodes::node_status::NodeStatus;
pub use ops::inspect::{
    Holder, Inspection, NodeView, RwInspection, RwNodeState, RwNodeView, Verdict,
};
pub use primitives::campaign::{Role, Term};
pub use primitives::election::{ElectOptions, Election, MAX_VALUE_LEN};
pub use primitives::leader::Leader;
pub use primitives::lease::Lease;
pub use primitives::observe::Observer;
pub use primitives::rwlock::{ReadGuard, RwLock, WriteGuard};
pub use primitives::semaphore::{Permit, Semaphore, SemaphoreInspection, MAX_PERMITS};
pub use rounds::lock::{Lock, ReleaseReport};
pub use rounds::options::AcquireOptions;
#[allow(deprecated)]
pub use rounds::redlock::FALLBACK_FACTOR;
pub use rounds::redlock::{Redlock, Resources};

pub use base::error;
/// The fred crate fredlock is built on, re-exported so callers can build clients of the same version.
pub use fred;

// The code blocks of README.md and every docs/*.md, compiled by `cargo test --doc` (only then:
// these items exist under `cfg(doctest)` alone, so they are not in the API or its
// documentation; algorithm.md and benchmarks.md have no Rust block yet). A ```rust block there is
// code a reader can copy as it is: a whole program (`rust,no_run` when it needs nodes), or
// functions with the helpers they call. Blocks that are not Rust are tagged (```sh, ```toml,
// ```text): rustdoc compiles a bare ``` fence as Rust.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
pub struct OperationsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/servers.md")]
pub struct ServersDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/torture.md")]
pub struct TortureDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/architecture.md")]
pub struct ArchitectureDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/algorithm.md")]
pub struct AlgorithmDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/benchmarks.md")]
pub struct BenchmarksDoctests;
