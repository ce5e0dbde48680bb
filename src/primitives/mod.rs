//! What is built from quorum locks: elections, semaphores, read-write locks, leases.
//!
//! An election's record (`leader`), its campaign task (`campaign`) and handle (`election`), who
//! leads seen from anywhere (`observe`), the campaigns' shared observers (`campaign_observers`), the semaphore's rounds and handle (`semaphore_round`,
//! `semaphore`), the read-write lock's rounds and handle (`rwlock_round`, `rwlock`) and a held lock
//! handed to another process (`lease`).
//!
//! Must not: reach past `rounds` and `hold` to a node's commands for what those layers offer.

pub(crate) mod campaign;
pub(crate) mod campaign_observers;
pub(crate) mod election;
pub(crate) mod leader;
pub(crate) mod lease;
pub(crate) mod observe;
pub(crate) mod rwlock;
pub(crate) mod rwlock_round;
pub(crate) mod semaphore;
pub(crate) mod semaphore_round;
