//! Test support for fredlock: real local Redis nodes, node control and network faults, the
//! safety checker and the torture run.
//!
//! A crate of its own (the way tokio keeps `tokio-test` beside `tokio`), so that the lock library
//! carries none of it. Meant for fredlock's own tests, examples and benchmarks, and for users who
//! want to test their locking code against real, independent nodes that crash, stall or
//! misbehave: add `fredlock-testkit` as a dev-dependency.
//!
//! * [`LocalNodes`] starts N independent `redis-server` processes on free
//!   loopback ports (no persistence, one temp dir each), and can
//!   [`kill`](LocalNodes::kill), [`pause`](LocalNodes::pause) /
//!   [`resume`](LocalNodes::resume) (SIGSTOP/SIGCONT) and
//!   [`restart`](LocalNodes::restart) them (empty, same port). It also speaks
//!   just enough RESP2 ([`LocalNodes::command`], [`RespValue`]) to inspect or
//!   poke a node without going through fred. All processes are killed when it
//!   is dropped.
//! * [`LocalCluster`] starts a local Redis Cluster of N primaries (cluster mode, free loopback
//!   ports, the slots split evenly) to use as ONE Redlock node (`url()` is a
//!   `redis-cluster://` URL), with shard control ([`kill_shard`](LocalCluster::kill_shard),
//!   [`pause_shard`](LocalCluster::pause_shard), [`restart_shard`](LocalCluster::restart_shard):
//!   back empty, with its slots) and slot migrations held half-way
//!   ([`begin_migration`](LocalCluster::begin_migration)), so that clients meet `MOVED` and `ASK`
//!   redirects. [`resp_pipeline`] sends several commands on one connection (e.g. `ASKING` and
//!   the command it allows).
//! * [`LocalSentinel`] starts a Sentinel-managed group (a primary, replicas and sentinels, from
//!   the same server binary) to use as ONE Redlock node (`url()` is a `redis-sentinel://` URL),
//!   and fails it over on demand ([`failover`](LocalSentinel::failover),
//!   [`kill_primary`](LocalSentinel::kill_primary), [`pause_primary`](LocalSentinel::pause_primary)).
//! * [`FaultProxy`] is an in-process TCP proxy in front of a node whose
//!   [`Fault`] (latency, blackhole, dropped or held replies, connection
//!   resets) can be switched at run time. No root or `tc` needed.
//! * [`Blackhole`] is a listener that accepts connections and never answers.
//! * [`demo`] runs the examples' demonstrations (`make demo`, `make scheduler`): nodes, worker
//!   processes, timelines and verdicts, so that the examples keep only the code that uses the
//!   lock.
//!
//! # Requirements
//!
//! `redis-server` (7.0 or newer) must be on `PATH`; install it with
//! `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`.
//! The `FREDLOCK_REDIS_SERVER` environment variable overrides the binary.
//! `FREDLOCK_SERVER=valkey` runs `valkey-server` (9.0 or newer) instead, everywhere: the binary
//! from `FREDLOCK_VALKEY_SERVER`, else the copy `make valkey-server` caches, else `PATH`. See
//! [`Server`].
//! Node control uses Unix signals, so the testkit is Unix-only.
//!
//! # External nodes
//!
//! [`from_env_or_start`] uses the nodes listed in `FREDLOCK_NODES`
//! (comma-separated `redis://` URLs) when it names enough of them, and starts
//! local nodes otherwise. Tests that need node control should use
//! [`TestNodes::local`] and skip when it is `None`.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use fredlock_testkit::{Fault, FaultProxy, LocalNodes};
//!
//! let mut nodes = LocalNodes::start(3).await?;
//! nodes.set(0, "k", "v").await?;
//! assert_eq!(nodes.get(0, "k").await?.as_deref(), Some("v"));
//!
//! let proxy = FaultProxy::start(nodes.addr(1)).await?;
//! proxy.set(Fault::HoldReplies); // clients of proxy.url() now stall
//! proxy.set(Fault::Pass); // ...and get their replies
//!
//! nodes.kill(2)?; // crash a node
//! nodes.restart(2).await?; // back, empty, on the same port
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
// Signals (SIGSTOP, SIGKILL) and SO_LINGER need libc.
#![allow(unsafe_code)]

pub mod checker;
mod cluster;
mod cluster_reply;
pub mod demo;
mod flavour;
mod process;
mod proxy;
mod resp;
mod sentinel;
mod server;
pub mod strawman;
mod test_nodes;
pub mod torture;

pub use cluster::{LocalCluster, Migration, CLUSTER_SLOTS};
pub use flavour::{
    valkey_cache_path, Server, REDIS_BIN_ENV, SERVER_ENV, VALKEY_BIN_ENV, VALKEY_VERSION,
};
pub use process::terminate;
pub use proxy::{Blackhole, Fault, FaultProxy};
pub use resp::{resp_command, resp_pipeline, RespValue};
pub use sentinel::{LocalSentinel, SENTINEL_DOWN_AFTER, SENTINEL_SERVICE, SYNC_KEY};
pub use server::LocalNodes;
pub use test_nodes::{env_nodes, from_env_or_start, TestNodes};
