//! Holding a lock while work runs.
//!
//! The keep-alive schedule and budget arithmetic (`pacing`), the status every handle reads
//! (`status`), who extends a kept-alive lock and when (`renewal`), the guard and its lost signal
//! (`keepalive`), [`Redlock::with_lock`](crate::Redlock::with_lock) (`with_lock`), and closing on a
//! shutdown signal (`shutdown`).
//!
//! Must not: decide a quorum itself (it asks `rounds`), or know about the primitives above.

pub(crate) mod keepalive;
pub(crate) mod pacing;
pub(crate) mod renewal;
pub(crate) mod shutdown;
pub(crate) mod status;
pub(crate) mod with_lock;
