//! One node: its connections and what is sent to it.
//!
//! A node's connect loop and the server it found (`connection`), what that server lets this client
//! do without Lua (`caps`), the native compare-and-delete commands (`native`), a node that is a Redis
//! Cluster (`cluster`) and what its replies say (`topology`: the slot table, redirects), the single
//! server's batched hot path (`batch`), a node's commands with their arguments and options (`node`)
//! and the subscriber connection that carries wake-ups (`subscriber`).
//!
//! Must not: decide anything across nodes (no quorum, no validity), or know what a lock handle is.

pub(crate) mod batch;
pub(crate) mod caps;
pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod native;
pub(crate) mod node;
pub(crate) mod subscriber;
pub(crate) mod topology;
