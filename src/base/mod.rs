//! The ground floor: values, decoders and scripts; no I/O, no tasks.
//!
//! Errors and plain value types (`error`; the refused inputs in `invalid`), metrics through the `metrics` facade (`metrics`: observes,
//! never decides), node URLs checked and redacted (`endpoint`), what a lock key stores (`owner`),
//! every reply decoded into a vote, a slot, counters or a holder (`reply`), Redis Cluster hash slots
//! (`slots`), every Lua script with its KEYS/ARGV contract (`scripts`; the semaphore's and the
//! read-write lock's in `sem_rw_scripts`) and the bookkeeping of the wait lines a Redlock's waiters
//! stand in (`line`).
//!
//! Must not: talk to a server, spawn a task, or import from any folder above.

pub(crate) mod endpoint;
pub mod error;
pub(crate) mod invalid;
pub(crate) mod line;
pub(crate) mod metrics;
pub(crate) mod owner;
pub(crate) mod reply;
pub(crate) mod scripts;
pub(crate) mod sem_rw_scripts;
pub(crate) mod slots;
