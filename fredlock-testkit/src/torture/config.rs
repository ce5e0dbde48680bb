//! What one run does ([`TortureConfig`]) and the fixed figures every part of the run shares (the
//! restart margin, the reset after a swallowing fault, the fleet clients' retry).
//!
//! Owns the configuration and what follows from it alone (labels, lanes, the replay command).
//! Must not start or run anything: the schedule, the nodes, the clients and the report read it.

use std::time::Duration;

use fredlock::Retry;

use super::fault_kind::FaultKind;

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
/// The retry of fleet clients: waits of up to about 4.5 s at 5 ms + up to 5 ms of jitter.
pub const FLEET_RETRY: Retry = Retry {
    attempts: 600,
    delay: Duration::from_millis(5),
    jitter: Duration::from_millis(5),
};

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
    /// and the run judges liveness beside safety (see [`Liveness`](super::Liveness)).
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
    /// against a floor client measured in the same run ([`Liveness`](super::Liveness)).
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

    pub(super) fn patient(&self, client: usize) -> bool {
        client % 3 == 2
    }

    pub(super) fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }
}
