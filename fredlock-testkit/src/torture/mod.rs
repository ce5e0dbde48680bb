// This file owns the run's configuration, the order in which a run is set up, started, stopped
// and collected (`run`), and the module's public names. It must not hold the logic of a fault,
// of a client operation or of a check: those live in the files declared below, one concern each.
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
use fredlock::Retry;

mod cluster_faults;
mod controls;
pub mod election;
mod env;
mod faults;
mod fleet;
mod mode_controls;
mod nodes;
mod report;
mod schedule;
mod stats;
mod worker;

pub use controls::{cluster_controls, negative_controls, ControlResult};
pub use fleet::{
    liveness_controls, Floor, Live, Liveness, LivenessControl, CALIBRATION, FAULT_RATE_SHARE,
    FLEET_RETRY, OUTAGE_GAP, RATE_SHARE, WAIT_FACTOR,
};
pub use report::{liveness_markdown, markdown, Report};
pub use schedule::{fingerprint, random_seed, schedule, Episode, FaultKind, SlotMove};
pub use stats::Stats;

use env::{final_checks, read_finals, read_registers, Env};
use faults::{join_lanes, spawn_lanes};
use nodes::Nodes;
use schedule::ms;
use worker::{join_workers, spawn_workers};

/// A node killed in the run comes back (empty) only after the maximum TTL plus this much:
/// every key it held has expired everywhere by then, so its empty restart cannot help a second
/// holder in (the "delayed restart" of the notes).
pub const RESTART_MARGIN: Duration = Duration::from_millis(200);
/// How long a proxy resets connections after a swallowing fault, before it passes again: long
/// enough for fred to see the reset and drop its (desynchronised) connection.
pub const RESET_HOLD: Duration = Duration::from_millis(100);
/// On cluster nodes, the time the schedule allows a restart after its delay, until the node
/// serves keys again: a restarted shard refuses keys for Redis' 2 s "writable delay", then its
/// peers must agree that the cluster is healthy.
pub const CLUSTER_RESTART: Duration = Duration::from_secs(3);
/// The value of the planted foreign keys.
pub const FOREIGN_VALUE: &str = "foreign-owner";

/// What one run does. Build with [`TortureConfig::new`] and adjust the fields.
#[derive(Debug, Clone)]
pub struct TortureConfig {
    /// Lock nodes: 3 or 5 (any odd number works).
    pub nodes: usize,
    /// Contending clients, each with its own proxies and `Redlock`.
    pub clients: usize,
    /// Shared resources the clients contend for.
    pub resources: usize,
    /// Resources held by a foreign owner on every node for the whole run.
    pub foreign_resources: usize,
    /// How long the clients run (the fault schedule fits inside it).
    pub duration: Duration,
    /// Seeds the fault schedule and every client's operations.
    pub seed: u64,
    /// Shortest TTL a client asks for.
    pub ttl_min: Duration,
    /// Longest TTL a client asks for (bounds every key's life: the restart delay depends on it).
    pub ttl_max: Duration,
    /// Which faults the schedule may use.
    pub faults: Vec<FaultKind>,
    /// Per-node timeout of most clients: short, as the algorithm wants.
    pub node_timeout: Duration,
    /// Per-node timeout of every third client (ids 2, 5, ...): long enough that latency faults
    /// produce grants with shrunken validity and `ValidityExpired` errors (row 7).
    pub patient_node_timeout: Duration,
    /// The clients' drift factor (the checker's S2 bound uses the same).
    pub drift_factor: f64,
    /// The clients' retry policy.
    pub retry: Retry,
    /// Fencing mode: the nodes are durable (append-only file, `fsync` on every write, so a
    /// killed node restarts WITH its fencing counters, as the fencing docs require), and clients
    /// also take fenced locks and write their tokens to fenced registers on the data node.
    /// Semaphore permits are part of every run.
    pub fencing: bool,
    /// Cluster nodes: every lock node is a [`LocalCluster`](crate::LocalCluster) of this many
    /// shards (3 or more, so that a shard down fails only its own slots), with the faults of
    /// [`FaultKind::CLUSTER`]; `None`: plain redis-servers behind every client's proxies. Set it
    /// with [`on_clusters`](Self::on_clusters).
    pub cluster_shards: Option<usize>,
    /// Fleet mode (see [`fleet`](Self::fleet)): the clients mostly WAIT for the hot resources,
    /// and the run judges liveness beside safety (see [`Liveness`]).
    pub fleet: bool,
    /// The clients' [`wake_on_release`](fredlock::Builder::wake_on_release) (default on, as
    /// the library's); off, they poll.
    pub wake_on_release: bool,
}

impl TortureConfig {
    /// Defaults: 4 clients, 3 resources, 2 foreign resources, TTLs 50-200 ms, every fault,
    /// node timeout 50 ms (100 ms for patient clients), drift factor 0.01, 3 fast retries.
    pub fn new(nodes: usize, seed: u64, duration: Duration) -> TortureConfig {
        TortureConfig {
            nodes,
            clients: 4,
            resources: 3,
            foreign_resources: 2,
            duration,
            seed,
            ttl_min: Duration::from_millis(50),
            ttl_max: Duration::from_millis(200),
            faults: FaultKind::ALL.to_vec(),
            node_timeout: Duration::from_millis(50),
            patient_node_timeout: Duration::from_millis(100),
            drift_factor: fredlock::config::DEFAULT_DRIFT_FACTOR,
            retry: Retry {
                attempts: 3,
                delay: Duration::from_millis(5),
                jitter: Duration::from_millis(10),
            },
            fencing: false,
            cluster_shards: None,
            fleet: false,
            wake_on_release: true,
        }
    }

    /// Fleet mode on `nodes` plain nodes: 32 clients (each its own `Redlock`, with its own
    /// proxies, connections and subscribers) waiting for 3 hot resources with the retry of
    /// [`FLEET_RETRY`], every fault; the operations are mostly waiting acquires with a critical
    /// section (plus cancelled acquires, try_acquire and semaphore permits). Besides the safety
    /// checks, the report's liveness rows judge the hot resources' rates and the longest wait
    /// against a floor client measured in the same run ([`Liveness`]).
    pub fn fleet(nodes: usize, seed: u64, duration: Duration) -> TortureConfig {
        let mut config = TortureConfig::new(nodes, seed, duration);
        config.clients = 32;
        config.resources = 3;
        config.retry = FLEET_RETRY;
        config.fleet = true;
        config
    }

    /// The same run in fencing mode (see [`fencing`](Self::fencing)).
    pub fn with_fencing(mut self) -> TortureConfig {
        self.fencing = true;
        self
    }

    /// The same run with every node a Redis Cluster of `shards` shards and the cluster faults
    /// (see [`cluster_shards`](Self::cluster_shards)).
    pub fn on_clusters(mut self, shards: usize) -> TortureConfig {
        self.cluster_shards = Some(shards);
        self.faults = FaultKind::CLUSTER.to_vec();
        self
    }

    /// The faults this kind of node can take: [`FaultKind::ALL`] on plain nodes,
    /// [`FaultKind::CLUSTER`] on clusters ([`faults`](Self::faults) picks among them).
    pub fn fault_kinds(&self) -> &'static [FaultKind] {
        match self.cluster_shards {
            Some(_) => &FaultKind::CLUSTER,
            None => &FaultKind::ALL,
        }
    }

    /// The run's name in reports: `N=3`, `N=3, fencing`, `N=3 clusters of 3 shards`, ...
    pub fn label(&self) -> String {
        let fenced = if self.fencing { ", fencing" } else { "" };
        let fleet = match (self.fleet, self.wake_on_release) {
            (true, true) => ", fleet",
            (true, false) => ", fleet, polling",
            (false, true) => "",
            (false, false) => ", polling",
        };
        match self.cluster_shards {
            Some(shards) => format!(
                "N={} clusters of {shards} shards{fenced}{fleet}",
                self.nodes
            ),
            None => format!("N={}{fenced}{fleet}", self.nodes),
        }
    }

    /// How long a killed node stays down: the maximum TTL plus [`RESTART_MARGIN`].
    pub fn restart_delay(&self) -> Duration {
        self.ttl_max + RESTART_MARGIN
    }

    /// The command that replays this run (same schedule and operation sequences): this run
    /// alone, for its whole duration.
    pub fn replay_command(&self) -> String {
        let mode = match (self.cluster_shards.is_some(), self.fencing) {
            _ if self.fleet => "fleet",
            (false, false) => "plain",
            (false, true) => "fencing",
            (true, false) => "cluster-plain",
            (true, true) => "cluster-fencing",
        };
        let shards = self
            .cluster_shards
            .map_or(String::new(), |s| format!(" --shards {s}"));
        let polling = if self.wake_on_release {
            ""
        } else {
            " --no-wake"
        };
        format!(
            "cargo run --release --example torture -- --secs {} --seed {} --nodes {} --clients {} --resources {} --mode {mode}{shards}{polling}",
            self.duration.as_secs(),
            self.seed,
            self.nodes,
            self.clients,
            self.resources,
        )
    }

    /// Lanes of per-client network faults: one per 4 clients, at least 2 (fleet mode: 2; each lane faults
    /// one of its own clients at a time, or all of them for latency). None on cluster nodes,
    /// which have no proxies.
    pub fn client_lanes(&self) -> usize {
        if self.cluster_shards.is_some() {
            return 0;
        }
        if self.fleet {
            // Two clients of the fleet faulted at a time: every kind of fault, without most
            // clients' links faulted at once (that would measure the faults, not hand-overs).
            return 2.min(self.clients);
        }
        (self.clients / 4).max(2).min(self.clients)
    }

    /// Every lane of the schedule: lane 0 (node faults), then the client lanes on plain nodes,
    /// or the slot-migration and connection-kill lanes on cluster nodes.
    pub fn lanes(&self) -> usize {
        match self.cluster_shards {
            Some(_) => 3,
            None => 1 + self.client_lanes(),
        }
    }

    fn patient(&self, client: usize) -> bool {
        client % 3 == 2
    }

    fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }
}

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
