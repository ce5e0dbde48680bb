// This file owns the order in which a run is set up, started, stopped and collected (`run`),
// and the module's public names. It is the top of the folder: the files below import from one
// another, never from here (the configuration lives in `config.rs`), so no import runs in a
// circle. It must not hold the logic of a fault, of a client operation or of a check: those
// live in the files declared below, one concern each. From the bottom up (a file imports
// only files named before it here; `fredlock-testkit/tests/layers.rs` checks that no import
// runs in a circle):
//   fault_kind, config                     the vocabulary and the run's figures
//   schedule, resources, nodes, board      the seeded plan, names, node control, proxy faults
//   env                                    the state the clients and the fault lanes share
//   cluster_faults, faults, fleet          the lanes that inject faults; fleet mode's liveness
//   stats, worker/                         the clients and what they count
//   verdict, mode_controls, controls       the negative controls and their verdicts
//   election_check, election, report       the election mode (its checker, its run); the tables
//   failover                               the failover mode: Sentinel groups failed over
//! The fault-injection torture run: K clients contend for M resources over N local nodes while
//! a seeded schedule kills, freezes, partitions and delays nodes and connections; a
//! [`Checker`] decides afterwards whether any safety property broke. Plus the negative controls
//! that prove the checker can see a violation when one is planted.
//!
//! # Set-up of a run
//! - N lock nodes ([`LocalNodes`]), plus one more redis-server, the DATA node, that holds the
//!   lost-update counters and is never faulted (the thing the lock protects).
//! - Every client has its OWN [`FaultProxy`](crate::FaultProxy) per node and its own
//!   [`Redlock`](fredlock::Redlock) over its proxies, so a fault can hit one client (a slow
//!   link, held replies) or every client (a partition).
//! - "Foreign" lock keys (`foreign:0..F`) are planted on every node with a value no client
//!   owns and a TTL longer than the run: clients try to take them and must never get them, and
//!   they must all be intact at the end.
//! - An observer `Redlock` straight on the nodes (no proxy) inspects keys for the checks.
//!
//! # The schedule
//! One seeded `StdRng` generates, before anything runs, a list of fault episodes on several
//! lanes: lane 0 holds node faults (kill with a DELAYED restart, SIGSTOP, a partition of every
//! client from some nodes, SCRIPT FLUSH), one at a time and on a minority of the nodes, except
//! the row 3 and row 5 episodes that take a majority (nothing can be granted then, which the
//! checker verifies). Lanes 1 and up (one per 4 clients, at least 2) hold per-client network
//! faults (held replies, latency, dropped replies, resets), each lane on its own share of the
//! clients. Episode lengths and gaps are sized in units of the longest TTL, so the run spends
//! its time on many short episodes rather than a few long ones. Each client draws its
//! operations from its own seeded `StdRng`. So a seed replays the same fault schedule and the
//! same sequence of operations per client; what it cannot replay is timing (which operation is
//! in flight when a fault hits).
//!
//! # Assumption A, kept on purpose
//! At most a minority of nodes is faulty at a time (except rows 3 and 5, which make everything
//! unavailable); a killed node comes back EMPTY only after the maximum TTL plus a margin
//! ("delayed restart"); no node clock jumps. Per-client network faults do not make a node
//! faulty (Redlock's safety does not depend on the network). Swallowing faults (blackhole,
//! dropped replies) always end with a ~100 ms reset before traffic passes again: fred pipelines
//! and matches replies to requests in order, so swallowed bytes would desynchronise the stream,
//! which real TCP cannot do without the connection dying.
//!
//! # What a client does
//! A seeded mix of: acquire + critical section + release (sometimes with an inspection that the
//! token is on a quorum, sometimes with an extend half-way); try_acquire; a two-resource
//! acquire; keep-alive sections longer than the TTL; `with_lock` sections (cancelled when the
//! lock is lost); an extend timed near the deadline; abandoned locks kept as stale `Lock`
//! values, later extended and released (often after the client re-acquired the resource, so
//! another holder's key is there: rows 13 and 14); attempts on the foreign resources; and a
//! private-resource probe where the keys are deleted or taken over behind the lock's back
//! before it extends and releases (S4, S5 at the script level); and a clean-up probe (S6): an
//! acquire on a private resource cancelled after 0-3 ms, failed, or granted and released, must
//! leave no key on any node whose state and link did not change meanwhile. Every critical section is a
//! non-atomic read-modify-write of a counter on the data node, done only while the lock still
//! has a guard of validity left (so a holder does not act past its deadline: row 10 is not
//! covered by Redlock, and this run is about what Redlock does guarantee). Also a permit of one
//! of two semaphores (2 and 3 permits) held a while; and, in fencing mode
//! ([`TortureConfig::fencing`]: durable nodes), a fenced lock whose holder writes its token to a
//! fenced register on the data node, sometimes only after stalling past its deadline.
//!
//! # Fleet mode
//! With [`TortureConfig::fleet`], 32 clients (each its own `Redlock`, proxies, connections and
//! subscribers) mostly WAIT for 3 hot resources, with every fault (two client fault lanes) and
//! the checker unchanged. Liveness rows judge each hot resource's acquisitions per second and
//! the longest wait against a floor client of the same run (see [`Liveness`]);
//! [`liveness_controls`] run a thundering-herd strawman, which they must flag, and fredlock
//! polling, which they must not.
//!
//! # Cluster nodes
//! With [`TortureConfig::cluster_shards`] (see [`TortureConfig::on_clusters`]), every lock node
//! is a [`LocalCluster`](crate::LocalCluster) of that many shards, and fredlock routes each
//! command by hash slot, following `MOVED` and `ASK`. A [`FaultProxy`](crate::FaultProxy) cannot
//! sit in front of a cluster (its redirects name the shards' real addresses), so the clients
//! talk to the shards directly and the faults are the nodes' own ([`FaultKind::CLUSTER`]): lane
//! 0 kills (with the delayed restart) or freezes a whole node or ONE shard of it, or flushes its
//! scripts; lane 1 migrates the slot of a contended resource's keys on some nodes and holds it
//! half-way (`ASK`, then `MOVED` once it finishes; with fencing, a fenced acquire whose lock key
//! and counter are split between the two shards gets `TRYAGAIN` from that node, which costs the
//! vote, not safety); lane 2 resets every client's connections to one shard (`CLIENT KILL`).
//! Two lanes never act on one node at once. The clients' own faults (cancelled acquires,
//! keep-alive, stale locks, takeovers) are the same as on plain nodes. In fencing mode the
//! shards are durable, as fencing requires. A shard restarted EMPTY at once is row 11 again:
//! [`cluster_controls`] check that the checker sees it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::checker::Checker;
use super::{Fault, LocalNodes};

mod board;
mod cluster_faults;
mod config;
mod controls;
pub mod election;
mod election_check;
mod env;
pub mod failover;
mod fault_kind;
mod faults;
mod fleet;
mod mode_controls;
mod nodes;
mod report;
mod resources;
mod schedule;
mod stats;
mod verdict;
mod worker;

pub use config::{
    TortureConfig, CLUSTER_RESTART, FLEET_RETRY, FOREIGN_VALUE, RESET_HOLD, RESTART_MARGIN,
};
pub use controls::{cluster_controls, negative_controls};
pub use fault_kind::FaultKind;
pub use fleet::{
    liveness_controls, Floor, Live, Liveness, LivenessControl, CALIBRATION, FAULT_RATE_SHARE,
    OUTAGE_GAP, RATE_SHARE, WAIT_FACTOR,
};
pub use report::{liveness_markdown, markdown, Report};
pub use schedule::{fingerprint, random_seed, schedule, Episode, SlotMove};
pub use stats::Stats;
pub use verdict::ControlResult;

use env::{final_checks, read_finals, read_registers, Env};
use faults::{join_lanes, spawn_lanes};
use nodes::Nodes;
use schedule::ms;
use worker::{join_workers, spawn_workers};

/// Runs the torture run described by `config` and checks it. Needs `redis-server` (see the
/// [module docs](super)); runs best on a multi-threaded tokio runtime.
///
/// Cancellation: dropping the future stops the run; the nodes and proxies are killed as they
/// are dropped.
pub async fn run(config: TortureConfig) -> io::Result<Report> {
    let wall = Instant::now();
    let episodes = schedule(&config);
    let nodes = Nodes::start(&config).await?;
    let floor_urls = nodes.urls();
    let data_node = LocalNodes::start(1).await?;
    let checker = Arc::new(Checker::new(config.drift_factor));
    let (env, redlocks) = Env::start(&config, nodes, checker.clone()).await?;

    // Fleet mode: the floor client calibrates alone before anything else starts.
    let floor_client = match config.fleet {
        true => {
            let redlock = floor_redlock(&config, floor_urls).await?;
            let solo = fleet::calibrate(&redlock, "floor", config.ttl_max).await;
            Some((redlock, solo))
        }
        false => None,
    };
    let start = Instant::now();
    let stop_at = start + config.duration;
    checker.event(format!(
        "run starts: {} K={} M={} seed {}, clients stop {:?} later",
        config.label(),
        config.clients,
        config.resources,
        config.seed,
        config.duration
    ));
    let lanes = spawn_lanes(&env, &episodes, start);
    let workers = spawn_workers(&env, redlocks, &data_node.url(0), stop_at).await?;
    let floor = floor_client.map(|(redlock, solo)| {
        let lane = fleet::floor_lane(redlock, "floor".into(), config.ttl_max, solo, stop_at);
        tokio::spawn(lane)
    });
    // The scheduler probe: on a loaded machine every timer fires late by about this much.
    let probe = tokio::spawn(timer_probe(stop_at));
    tokio::time::sleep_until(stop_at).await;
    checker.event("clients stop (each finishes its operation, then releases its stale locks)");
    let timer_lateness = probe.await.unwrap_or_default();
    let stats = join_workers(&checker, workers).await;
    let liveness = match floor {
        Some(floor) => Some(Liveness::judge(
            config.label(),
            &stats.live,
            floor.await.map_err(env::io_err)?,
            (config.resources, config.clients),
            config.duration,
            fleet::FAULT_RATE_SHARE,
        )),
        None => None,
    };
    let injected = join_lanes(&checker, lanes).await;
    // Everything passes again, every node runs (defensive: the lanes already restored them).
    let all_clients: Vec<usize> = (0..config.clients).collect();
    let all_nodes: Vec<usize> = (0..config.nodes).collect();
    env.board.set(0, &all_clients, &all_nodes, Fault::Pass);
    env.board.set(1, &all_clients, &all_nodes, Fault::Pass);

    let leftover_keys = final_checks(&env).await;
    // Writes of cancelled sections may still be on their way to the data node.
    tokio::time::sleep(ms(200)).await;
    let finals = read_finals(&env, &data_node.url(0)).await?;
    read_registers(&env, &data_node.url(0)).await?;
    let check = checker.finish(&finals);
    env.observer.close().await;
    Ok(Report {
        fingerprint: fingerprint(&episodes),
        episodes: episodes.len(),
        config,
        stats,
        faults: injected.faults,
        skipped_episodes: injected.skipped,
        check,
        wall: wall.elapsed(),
        leftover_keys,
        timer_lateness,
        liveness,
    })
}

/// Fleet mode's floor client: straight on the nodes (no proxy: only node faults reach it),
/// with the clients' node timeout and retry.
async fn floor_redlock(config: &TortureConfig, urls: Vec<String>) -> io::Result<fredlock::Redlock> {
    fredlock::Redlock::builder()
        .nodes(urls)
        .node_timeout(config.node_timeout)
        .retry(config.retry)
        .drift_factor(config.drift_factor)
        .build()
        .await
        .map_err(env::io_err)
}

/// The worst wake-up delay of a task sleeping 5 ms at a time until `stop_at`: how late any
/// timer of this process fired meanwhile.
async fn timer_probe(stop_at: Instant) -> Duration {
    let mut worst = Duration::ZERO;
    while Instant::now() < stop_at {
        let due = Instant::now() + ms(5);
        tokio::time::sleep_until(due).await;
        worst = worst.max(Instant::now().saturating_duration_since(due));
    }
    worst
}
