//! The quorum rounds and the acquire loop.
//!
//! The fan-out and the tally (`quorum`), the Redlock's shared state and requests (`redlock`),
//! extend and release over every node (`held_rounds`), one acquire attempt and its turn in line
//! (`attempt`), a release that hands the lock to a waiter of the same process (its offers:
//! `handover`; its rounds: `handover_rounds`),
//! work that outlives its call (`background`: drop-path releases, retries), what is held and
//! under way for `close()` (`holds`), the
//! acquire retry loop as a state machine (`acquire_loop`), the per-call options (`options`) and
//! the [`Lock`](crate::Lock) it hands out (`lock`).
//!
//! Must not: keep a lock alive (that is `hold`), or hand out a semaphore's, an election's or a
//! read-write lock's handles (that is `primitives`).

pub(crate) mod acquire_loop;
pub(crate) mod attempt;
pub(crate) mod background;
pub(crate) mod handover;
pub(crate) mod handover_rounds;
pub(crate) mod held_rounds;
pub(crate) mod holds;
pub(crate) mod lock;
pub(crate) mod options;
pub(crate) mod quorum;
pub(crate) mod redlock;
