//! What an operator does to locks it does not hold.
//!
//! [`Redlock::inspect`](crate::Redlock::inspect) reads each node's view of a lock (`inspect`);
//! [`Redlock::force_release`](crate::Redlock::force_release) breaks a lock whoever holds it
//! (`force`).
//!
//! Must not: take or extend a lock.

pub(crate) mod force;
pub(crate) mod inspect;
