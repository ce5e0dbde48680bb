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
//!   label) is still present; extend never re-creates an expired key;
//! - a failed, timed-out or cancelled attempt releases on every node that may hold its token.
//!
//! ## What is not
//! A holder that pauses (GC, SIGSTOP, a swapped-out VM) past its deadline can still act after
//! another client got the lock: only a fencing token checked by the protected resource covers
//! that. A node whose clock jumps, or that restarts without its data within a TTL, can break
//! mutual exclusion (use `appendfsync always`, or keep a crashed node out for longer than the TTL).
//!
//! ## Layout: layers that only look down
//! Each module may use only modules of LOWER layers (`tests/layers.rs` fails otherwise), so a
//! reader can start at the bottom and a change ripples only upwards. Bottom to top:
//!
//! 0. [`error`]: errors and plain value types (`Votes`, `NodeError`, `LostReason`). Imports nothing of ours.
//!    Just above it, `metrics`: counters and histograms through the `metrics` facade (feature
//!    `metrics`; empty functions without it); observes, never decides. Beside it, `caps`: what
//!    one node's user may do without Lua (run scripts? `DELIFEQ` / `DELEX`?), probed at every
//!    (re)connect.
//! 1. `endpoint` (node URLs checked and redacted by structure), `scripts` (every Lua script with
//!    its KEYS/ARGV contract), `connection` (one node's connect loop, its latest cause of failure
//!    in the server's words, the server's `run_id` so one server never votes twice), `reply`
//!    (every reply decoded into a vote, a slot, counters or a holder, or a typed error; pure),
//!    `slots` (Redis Cluster hash slots and how derived keys share their lock's slot; pure),
//!    `line` (the waiting acquires of a Redlock as members of the wait lines kept on each
//!    contended key's gate node: member names, wake-ups, subscriber liveness; pure
//!    bookkeeping), `owner`
//!    (what a lock key stores: the secret token, the separator and the public owner label;
//!    label and token checks, fingerprints; pure).
//! 2. `cluster`: a node that is a Redis Cluster: its slot table, one fred client per shard,
//!    `MOVED`/`ASK` redirects followed without ever replaying a command of unknown outcome.
//!    `native`: a one-key lock's release, extension and inspection without Lua (`DELIFEQ`,
//!    `DELEX`, `SET ... IFEQ`). Just above them,
//!    `batch`: a single server's hot path (single-key acquire and release): sent at once when
//!    the node is idle, otherwise queued and sent as one script call per node per round trip,
//!    in order, never replayed.
//! 3. `node` (one Redis node: one fred client or a cluster's shards, per-command options, each
//!    command's arguments), `quorum` (the one fan-out primitive, the quorum tally, validity
//!    arithmetic; pure).
//! 4. `background`: work that outlives its call: drop-path releases, release retries, and the
//!    count [`Redlock::close`] waits for; generic over the Redlock above it. `pacing`:
//!    [`KeepAliveOptions`] and the schedule and budget arithmetic they drive (when to extend,
//!    for how long, when to give up; pure). `subscriber`: one subscriber connection per node,
//!    started by the first acquire that waits, subscribed to the Redlock's own wake-up channel,
//!    feeding its messages to `line`.
//! 5. `redlock`: the rounds: one acquire attempt, extend, release; [`Redlock`] and its shared state.
//!    Just above it, `acquire_loop`: the retry loop of every acquire (attempt, decide, wait) and
//!    a waiter's place in the resource's wait line.
//! 6. `lock` ([`Lock`] and the acquire calls that hand it out), `inspect` ([`Redlock::inspect`]),
//!    `leader` (an election's record beside its lock: term number, campaign value, priority;
//!    [`Redlock::leader_of`] and the rounds that write the record).
//!    Just above them, `status`: a kept-alive lock's status as its driver and every handle see
//!    it (one value that only moves forward: the deadline, lost and why).
//! 7. `force` ([`Redlock::force_release`]: an operator breaks a lock, whoever holds it),
//!    `observe` ([`Redlock::observe`]: an [`Observer`]'s subscriber connections and the reads
//!    that follow who leads an election),
//!    `renewal`: who extends a kept-alive lock and when: the per-lock cycle (schedule, budget,
//!    retries), the status every handle reads, and its two drivers: the Redlock's shared
//!    renewer, which extends the locks due together with one script call per node, and a task
//!    per lock.
//! 8. `keepalive`: [`KeepAlive`] and [`LockHandle`]: the guard, its release and the lost signal.
//!    Just above it, the rounds of the primitives: `semaphore_round` (one attempt at a permit:
//!    every node takes the first free slot of one shared order) and `rwlock_round` (one attempt
//!    at a read share or the write lock, the downgrade) and `campaign` (an election
//!    participant's background task, the [`Role`] and [`Term`] it publishes).
//! 9. `with_lock` ([`Redlock::with_lock`]), `election` ([`Election`]), `semaphore` ([`Semaphore`]:
//!    at most N holders, each permit a quorum lock on one of N slots), `lease` ([`Lease`]: a
//!    held lock handed to another process; [`Redlock::resume`], [`Redlock::release_lease`]),
//!    `rwlock` ([`RwLock`]: many readers or one writer, each reader a quorum lock of its own).
//! 10. [`config`]: the builder; validates, then constructs. Nothing imports it back.
//!
//! The test machinery (local `redis-server` nodes, node control, a fault proxy, the safety checker
//! and the torture run) lives in the `fredlock-testkit` crate beside this one, not in the library.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod acquire_loop;
mod background;
mod batch;
mod campaign;
mod caps;
mod cluster;
pub mod config;
mod connection;
mod election;
mod endpoint;
pub mod error;
mod force;
mod inspect;
mod keepalive;
mod leader;
mod lease;
mod line;
mod lock;
mod metrics;
mod native;
mod node;
mod observe;
mod owner;
mod pacing;
mod quorum;
mod redlock;
mod renewal;
mod reply;
mod rwlock;
mod rwlock_round;
mod scripts;
mod semaphore;
mod semaphore_round;
mod slots;
mod status;
mod subscriber;
mod with_lock;

pub use campaign::{Role, Term};
pub use config::{Builder, Retry};
pub use election::{ElectOptions, Election, MAX_VALUE_LEN};
pub use error::{
    Error, InvalidInput, LostReason, Names, NodeError, NodeErrorKind, NotHeldReason, Result, Round,
    Vote, Votes,
};
pub use inspect::{Holder, Inspection, NodeView, RwInspection, RwNodeState, RwNodeView, Verdict};
pub use keepalive::{KeepAlive, KeepAliveOptions, LockHandle, Rejected};
pub use leader::Leader;
pub use lease::Lease;
pub use lock::{AcquireOptions, Lock, ReleaseReport};
pub use observe::Observer;
pub use owner::{MAX_LABEL_LEN, MAX_TOKEN_LEN, SEPARATOR};
#[allow(deprecated)]
pub use redlock::FALLBACK_FACTOR;
pub use redlock::{Redlock, Resources};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Permit, Semaphore, SemaphoreInspection, MAX_PERMITS};
pub use with_lock::{OnLost, WithLock};

/// The fred crate fredlock is built on, re-exported so callers can build clients of the same version.
pub use fred;
