//! One node: its connections and what is sent to it.
//!
//! What a node still has to finish for callers gone (`busy`), a node's connect loop and the server it found (`connection`), what a caller can read of it
//! without asking it (`node_status`), what that server lets this client
//! do without Lua (`caps`), the native compare-and-delete commands (`native`), a node that is a Redis
//! Cluster (`cluster`) and what its replies say (`topology`: the slot table, redirects), the single server's batched hot path and command order (`batch`: what is queued and sent; `batcher`: the queue's handle and task), a node's client, options and
//! how it sends a command (`node`), and the commands themselves: a wait line's gate (`node_gate`),
//! a lock's (`node_lock`), a batch of extensions (`node_extend_many`), the primitives'
//! (`node_primitives`) and an operator's (`node_ops`); and the subscriber connection that carries
//! wake-ups (`subscriber`).
//!
//! Must not: decide anything across nodes (no quorum, no validity), or know what a lock handle is.

pub(crate) mod batch;
pub(crate) mod batcher;
pub(crate) mod busy;
pub(crate) mod caps;
pub(crate) mod cluster;
pub(crate) mod confirm;
pub(crate) mod connection;
pub(crate) mod native;
pub(crate) mod node;
pub(crate) mod node_confirm;
pub(crate) mod node_extend_many;
pub(crate) mod node_gate;
pub(crate) mod node_lock;
pub(crate) mod node_ops;
pub(crate) mod node_primitives;
pub(crate) mod node_status;
pub(crate) mod subscriber;
pub(crate) mod topology;
