//! fredlock against a raw-fred floor and a peer (rslock 0.10, the most used Rust Redlock), on
//! the same nodes, in one run.
//!
//! ```text
//! cargo run --release --example bench [-- --quick]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`) and prints one
//! markdown table, ready to paste into README.md:
//!
//! - (a) serial acquire+release cycle latency, fredlock vs a RAW FLOOR: three plain fred clients
//!   (configured like fredlock's) doing `SET key token NX PX ttl` on every node at once, then a
//!   compare-and-delete script via `EVALSHA` on every node at once, each step decided at 2 of 3
//!   answers, as a Redlock decides. Nothing else: no per-command options, no background or
//!   clean-up work. The same serial cycle is also measured on a current-thread runtime, and
//!   against node-redlock (npm `redlock` 5, a child `node` process), all in one run (see
//!   `support/serial.rs`; `-- --serial` runs only those rows and (b)).
//! - (b) 64 tasks cycling acquire+release on their own keys for a fixed time: cycles/s. On a small
//!   machine this is bound by CPU, so it shows fredlock's CPU cost per cycle; the bench also
//!   prints that cost directly.
//! - (e) the serial cycle with fencing tokens on (one more round per acquire), interleaved with
//!   the others; (f) a semaphore of 4 permits with 16 contenders holding 1 ms: acquisitions/s.
//! - (c) one of the three nodes replaced by a listener that accepts TCP and never answers: the
//!   serial cycle latency must stay close to the healthy one (fredlock decides on the quorum and
//!   does not wait for the silent node). A second row does the same with a node that connected
//!   normally and then went silent (a fault proxy switched to blackhole), where every command to
//!   it really stays in flight until the 500 ms per-node timeout.
//!
//! - (g) every Redlock node a Redis Cluster of 3 shards (fredlock routes each command to the
//!   shard that owns its key's slot) against 3 single servers: the (b) load, but each task takes
//!   a fresh key every cycle (64 fixed keys would measure how those 64 happen to hash: one shard
//!   got 26 of them in a trial run), rounds interleaved. Also the Redis commands per cycle and each shard's share of its node's commands (INFO
//!   commandstats, reset with CONFIG RESETSTAT first; it counts the calls inside scripts too),
//!   and a smaller set of locks kept alive on the clusters. On 2 cores the 9 shards, the 3
//!   single servers and the client share the same cores: the row shows how evenly the shards
//!   share the work and what the routing costs, not a speed-up.
//! - (h) capacity inputs: the redis-server CPU time per command under (g)'s traffic, one
//!   redis-server saturated by a pipelined raw-RESP loader sending the cycle's commands (its
//!   commands/s on one core), and the server memory per held lock key (INFO memory during (d)).
//!
//! - the FLEET table, last (alone with `-- --fleet-only`): P = 4, 16, 64 separate child
//!   processes, each one client and one waiter, on one key, one 4-permit semaphore and one
//!   leadership, for fredlock default, fredlock polling and rslock, with the issue's targets
//!   beside the figures; plus 16 waiters as tasks of one process against a tokio Mutex (see
//!   `support/fleet/mod.rs` for the method).
//!
//! Method, because these machines are small (2 cores), shared and noisy:
//! - every variant is warmed up first (connections, allocator, scripts cached, CPU caches);
//! - the variants are interleaved: within a serial round, floor, fredlock and fredlock-with-a-
//!   blackhole take turns in blocks of 50 cycles (a few ms), and throughput rounds alternate
//!   floor and fredlock. A change in the machine's load (another build, a test suite) then falls
//!   on every variant alike instead of on whichever happened to run at that moment;
//! - there are several rounds, and the table shows the MEDIAN across rounds of each round's
//!   percentile (or rate), so one spoiled round does not move the result;
//! - every measurement loop runs in a spawned task, as a request handler would, not on the
//!   runtime's `block_on` thread.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{
    ClientLike, Config, Expiration, KeysInterface, LuaInterface, ReconnectPolicy, SetOptions, Value,
};
use fredlock::{NodeErrorKind, Redlock, ReleaseReport, Vote};
use fredlock_testkit::{
    self as testkit, Blackhole, Fault, FaultProxy, LocalCluster, LocalNodes, RespValue, TestNodes,
};
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;

#[path = "support/serial.rs"]
mod serial;
#[path = "support/mod.rs"]
mod support;

use support::keepalive::{run_child, run_if_child, ChildSpec, Sample, Variant};
use support::waiters::{self, Hold, Series as WSeries, Target as WTarget};
use support::{command_output, loadavg, median, process_cpu, resident_bytes};

/// TTL of every lock. Long enough that nothing expires during a cycle; with fredlock's defaults
/// it also gives the default per-node timeout of 500 ms, the same as (c) sets explicitly.
const TTL: Duration = Duration::from_secs(10);
/// Tasks in the throughput test, each on its own key.
const TASKS: usize = 64;
/// Per-node timeout of the silent-node Redlocks, set explicitly: were fredlock waiting for the
/// silent node, every cycle would take at least this long.
const SILENT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The floor's compare-and-delete, the classic single-key form.
const FLOOR_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// How much to measure: the full run, or `--quick` (`make bench BENCH_ARGS=--quick`).
struct Plan {
    /// Serial cycles run by each variant before any measurement.
    warmup_cycles: usize,
    /// Interleaved rounds of the serial measurements.
    rounds: usize,
    /// Serial cycles per variant per round.
    cycles: usize,
    /// Throughput: warm-up time per variant, then `throughput_rounds` interleaved rounds of
    /// `throughput_round` each per variant.
    throughput_warmup: Duration,
    throughput_rounds: usize,
    throughput_round: Duration,
    /// TTL of the kept-alive locks of (d) and (g); each is measured over two TTLs.
    keep_ttl: Duration,
    /// (g) Locks kept alive on the clusters.
    cluster_kept: usize,
    /// (h) How long the loader saturates one server (after a warm-up of a fifth of that).
    saturation: Duration,
    /// (d) Locks kept alive in-process (the single-server baseline of (g)).
    keep_locks: usize,
    /// (w) 16 waiters on one key: rounds and seconds per variant per round.
    waiter_rounds: usize,
    waiter_secs: f64,
    /// (k) batched keep-alive children: locks, TTL, rounds (each variant a child per round).
    keepalive_locks: usize,
    keepalive_ttl: Duration,
    keepalive_rounds: usize,
    /// (n) serial cycles per variant per round for N = 3, 5, 7.
    n_cycles: usize,
    /// The fleet table (P child processes on one lock); `--fleet-only` runs only that.
    fleet: support::fleet::table::Plan,
    fleet_only: bool,
    /// Only the serial rows on both runtimes (with node-redlock) and (b).
    serial_only: bool,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            warmup_cycles: 2_000,
            rounds: 5,
            cycles: 4_000,
            throughput_warmup: Duration::from_millis(500),
            throughput_rounds: 10,
            throughput_round: Duration::from_millis(300),
            keep_ttl: Duration::from_secs(6),
            cluster_kept: 3_000,
            saturation: Duration::from_secs(2),
            keep_locks: 10_000,
            waiter_rounds: 5,
            waiter_secs: 2.0,
            keepalive_locks: 2_000,
            keepalive_ttl: Duration::from_secs(3),
            keepalive_rounds: 2,
            n_cycles: 1_000,
            fleet: support::fleet::table::Plan::full(),
            fleet_only: false,
            serial_only: false,
        }
    }

    fn quick() -> Plan {
        Plan {
            warmup_cycles: 300,
            rounds: 5,
            cycles: 600,
            throughput_warmup: Duration::from_millis(200),
            throughput_rounds: 6,
            throughput_round: Duration::from_millis(170),
            keep_ttl: Duration::from_secs(3),
            cluster_kept: 1_000,
            saturation: Duration::from_secs(1),
            keep_locks: 3_000,
            waiter_rounds: 3,
            waiter_secs: 1.0,
            keepalive_locks: 1_000,
            keepalive_ttl: Duration::from_secs(2),
            keepalive_rounds: 1,
            n_cycles: 300,
            fleet: support::fleet::table::Plan::quick(),
            fleet_only: false,
            serial_only: false,
        }
    }
}

/// The raw floor: one plain fred client per node and nothing else.
struct Floor {
    clients: Vec<Client>,
    /// SHA1 of [`FLOOR_RELEASE`], as returned by `SCRIPT LOAD` on every node.
    release_sha: String,
}

impl Floor {
    /// Connects one client per URL with the settings of fredlock's own clients (see
    /// `src/nodes/node.rs`): TCP_NODELAY above all (without it, Nagle's algorithm can hold a small
    /// request back until the previous one is acknowledged, up to the ~40 ms delayed-ACK time),
    /// and the same reconnect policy, attempts, buffer and default timeout, so that only the code
    /// on top of the client differs.
    async fn connect(urls: &[String]) -> Floor {
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let mut config =
                Config::from_url(url).unwrap_or_else(|e| panic!("floor: bad URL {url}: {e}"));
            // Deliberately a copy of fredlock's client settings (src/nodes/node.rs), not a call into
            // them: the floor must stay plain fred, and a fair baseline needs the same settings.
            config.fail_fast = true;
            let client = fredlock::fred::types::Builder::from_config(config)
                .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_secs(2);
                    c.internal_command_timeout = Duration::from_secs(2);
                    c.max_command_attempts = 1;
                    c.max_command_buffer_len = 100_000;
                    c.tcp.nodelay = Some(true);
                })
                .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
                .build()
                .unwrap_or_else(|e| panic!("floor: cannot build a client for {url}: {e}"));
            client
                .init()
                .await
                .unwrap_or_else(|e| panic!("floor: cannot connect to {url}: {e}"));
            clients.push(client);
        }
        let mut release_sha = None;
        for (client, url) in clients.iter().zip(urls) {
            let sha: String = client
                .script_load(FLOOR_RELEASE)
                .await
                .unwrap_or_else(|e| panic!("floor: SCRIPT LOAD on {url}: {e}"));
            assert!(
                release_sha.as_ref().is_none_or(|s| *s == sha),
                "floor: SCRIPT LOAD returned different SHA1s"
            );
            release_sha = Some(sha);
        }
        Floor {
            clients,
            release_sha: release_sha.expect("floor: at least one node"),
        }
    }

    /// One acquire+release: SET NX PX everywhere at once, decided at 2 of 3 OKs, then EVALSHA
    /// everywhere at once, decided at 2 of 3 deletions (the third node's command still runs,
    /// in order on its connection; nobody waits for it), as a Redlock decides.
    /// The replies are checked (a benchmark of failing commands would be meaningless), which
    /// costs a few comparisons.
    async fn cycle(&self, key: &str) {
        // A fresh 128-bit token per lock, as fredlock makes: part of any correct lock.
        let token = format!("{:032x}", rand::random::<u128>());
        let quorum = self.clients.len() / 2 + 1;
        let mut sets: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|c| {
                c.set::<Value, _, _>(
                    key,
                    token.as_str(),
                    Some(Expiration::PX(TTL.as_millis() as i64)),
                    Some(SetOptions::NX),
                    false,
                )
            })
            .collect();
        for _ in 0..quorum {
            match sets.next().await {
                Some(Ok(Value::String(s))) if s == "OK" => {}
                other => panic!("floor: SET {key} NX: expected OK, got {other:?}"),
            }
        }
        drop(sets);
        let mut dels: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|c| c.evalsha::<i64, _, _, _>(self.release_sha.as_str(), key, token.as_str()))
            .collect();
        for _ in 0..quorum {
            match dels.next().await {
                Some(Ok(1)) => {}
                other => panic!("floor: EVALSHA release {key}: expected 1, got {other:?}"),
            }
        }
    }
}

/// What a cycle runs on.
#[derive(Clone)]
enum Target {
    Floor(Arc<Floor>),
    Fredlock(Redlock),
    /// rslock 0.10 (redis-rs multiplexed connections), the most used Rust Redlock: a peer.
    Rslock(Arc<rslock::LockManager>),
}

/// A resource name and the floor's key for it (a different key: fredlock's last release of a
/// cycle may still be in flight when the floor starts, on another connection).
#[derive(Clone)]
struct Names {
    resource: String,
    floor_key: String,
    rslock_key: String,
}

impl Names {
    fn new(resource: String) -> Names {
        Names {
            floor_key: format!("floor:{resource}"),
            rslock_key: format!("rslock:{resource}"),
            resource,
        }
    }
}

impl Target {
    /// One acquire+release. For fredlock, the release report (it shows what the third node did).
    async fn cycle(&self, names: &Names) -> Option<ReleaseReport> {
        match self {
            Target::Floor(floor) => {
                floor.cycle(&names.floor_key).await;
                None
            }
            Target::Rslock(manager) => {
                let lock = manager
                    .lock(names.rslock_key.as_bytes(), TTL)
                    .await
                    .unwrap_or_else(|e| panic!("rslock: lock {}: {e:?}", names.rslock_key));
                manager.unlock(&lock).await;
                None
            }
            Target::Fredlock(redlock) => {
                let lock = redlock
                    .acquire(names.resource.as_str(), TTL)
                    .await
                    .unwrap_or_else(|e| panic!("fredlock: acquire {}: {e}", names.resource));
                let report = lock
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("fredlock: release {}: {e}", names.resource));
                Some(report)
            }
        }
    }
}

/// How the third node's release went, over a serial run (for the silent-node rows: it shows
/// whether its commands failed at once or were still in flight when fredlock moved on).
#[derive(Default, Clone, Copy)]
struct ThirdNode {
    answered: u64,
    pending: u64,
    failed_timeout: u64,
    failed_connection: u64,
    failed_other: u64,
}

impl ThirdNode {
    fn add(&mut self, report: &ReleaseReport) {
        match report.votes.0.get(2) {
            Some(Vote::Granted | Vote::Refused) => self.answered += 1,
            Some(Vote::Pending) | None => self.pending += 1,
            Some(Vote::Failed(e)) => match e.kind {
                NodeErrorKind::Timeout => self.failed_timeout += 1,
                NodeErrorKind::Connection => self.failed_connection += 1,
                _ => self.failed_other += 1,
            },
        }
    }

    fn merge(&mut self, other: ThirdNode) {
        self.answered += other.answered;
        self.pending += other.pending;
        self.failed_timeout += other.failed_timeout;
        self.failed_connection += other.failed_connection;
        self.failed_other += other.failed_other;
    }
}

/// One serial round's result, in nanoseconds.
struct Round {
    p50: u64,
    p99: u64,
    third: ThirdNode,
}

/// Cycles per block in a serial round: small enough (a few ms) that a change in the machine's
/// load lasting longer than a few blocks falls on every variant alike.
const BLOCK: usize = 50;

/// Runs `cycles` serial acquire+release cycles of each variant (target, resource) and records
/// each cycle's duration. The variants take turns in blocks of [`BLOCK`] cycles, in a rotating
/// order, so that they are measured under the same conditions. Runs in one spawned task.
async fn serial_round(variants: &[(&Target, &str)], cycles: usize) -> Vec<Round> {
    let variants: Vec<(Target, Names)> = variants
        .iter()
        .map(|(target, resource)| ((*target).clone(), Names::new(resource.to_string())))
        .collect();
    spawn_and_wait(async move {
        let mut recorded: Vec<(Histogram<u64>, ThirdNode)> = variants
            .iter()
            .map(|_| {
                // 1 µs .. 60 s at 3 significant digits.
                let hist = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)
                    .expect("histogram bounds are valid");
                (hist, ThirdNode::default())
            })
            .collect();
        let n = variants.len();
        let mut done = 0;
        for block in 0.. {
            if done >= cycles {
                break;
            }
            let size = BLOCK.min(cycles - done);
            for k in 0..n {
                let i = (block + k) % n;
                let (target, names) = &variants[i];
                let (hist, third) = &mut recorded[i];
                for _ in 0..size {
                    let start = Instant::now();
                    let report = target.cycle(names).await;
                    hist.saturating_record(start.elapsed().as_nanos() as u64);
                    if let Some(report) = report {
                        third.add(&report);
                    }
                }
            }
            done += size;
        }
        recorded
            .into_iter()
            .map(|(hist, third)| Round {
                p50: hist.value_at_quantile(0.50),
                p99: hist.value_at_quantile(0.99),
                third,
            })
            .collect()
    })
    .await
}

/// One throughput round: cycles/s, and this process's CPU time per cycle when known.
struct Throughput {
    per_second: f64,
    cycles: u64,
    cpu_per_cycle_us: Option<f64>,
}

/// Runs `TASKS` tasks, each cycling on its own key (`{prefix}:{task}`; with `fresh_keys`, a new
/// one every cycle, `{prefix}:{task}:{cycle}`) until `duration` has passed. The elapsed time
/// runs until the last task finished its last cycle, so no partial work is lost. Also measures
/// this process's CPU time per cycle: on a shared 2-core machine that is a steadier measure of
/// the client's cost than cycles/s (the Redis servers are not counted).
async fn throughput_round(
    target: &Target,
    prefix: &str,
    duration: Duration,
    fresh_keys: bool,
) -> Throughput {
    let cpu_before = process_cpu();
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let target = target.clone();
            let own = format!("{prefix}:{i}");
            let mut names = Names::new(own.clone());
            tokio::spawn(async move {
                let mut cycles = 0u64;
                while Instant::now() < end {
                    if fresh_keys {
                        names = Names::new(format!("{own}:{cycles}"));
                    }
                    target.cycle(&names).await;
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("a throughput task panicked");
    }
    let elapsed = start.elapsed();
    let cpu = cpu_before
        .zip(process_cpu())
        .map(|(a, b)| b.saturating_sub(a));
    Throughput {
        per_second: total as f64 / elapsed.as_secs_f64(),
        cycles: total,
        cpu_per_cycle_us: cpu.map(|c| c.as_secs_f64() * 1e6 / total.max(1) as f64),
    }
}

/// Runs `work` as its own task (on a runtime worker, like a request handler) and waits for it.
async fn spawn_and_wait<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    tokio::spawn(work)
        .await
        .expect("a measurement task panicked")
}

/// Per-round percentiles of one serial variant, kept to print the spread under the table.
#[derive(Default)]
struct Series {
    p50: Vec<f64>,
    p99: Vec<f64>,
    third: ThirdNode,
}

impl Series {
    fn push(&mut self, round: Round) {
        self.p50.push(round.p50 as f64 / 1_000.0);
        self.p99.push(round.p99 as f64 / 1_000.0);
        self.third.merge(round.third);
    }
    fn p50(&self) -> f64 {
        median(self.p50.clone())
    }
    fn p99(&self) -> f64 {
        median(self.p99.clone())
    }
}

fn parse_args() -> Plan {
    let usage =
        "usage: cargo run --release --example bench [-- [--quick] [--fleet-only] [--serial] [--keepalive-locks N]]";
    let mut plan = Plan::full();
    let (mut locks, mut fleet_only, mut serial_only) = (None, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => plan = Plan::quick(),
            "--fleet-only" => fleet_only = true,
            "--serial" => serial_only = true,
            "--keepalive-locks" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => locks = Some(n),
                None => {
                    eprintln!("bench: --keepalive-locks wants a number\n{usage}");
                    std::process::exit(2);
                }
            },
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => {
                eprintln!("bench: unknown argument {other:?}\n{usage}");
                std::process::exit(2);
            }
        }
    }
    if let Some(n) = locks {
        plan.keepalive_locks = n;
    }
    plan.fleet_only = fleet_only;
    plan.serial_only = serial_only;
    plan
}

/// `host:port` of a `redis://` URL, resolved, for the fault proxy.
async fn socket_addr(url: &str) -> std::net::SocketAddr {
    let config = Config::from_url(url).unwrap_or_else(|e| panic!("bad node URL {url}: {e}"));
    let server = config
        .server
        .hosts()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no host in {url}"));
    tokio::net::lookup_host((server.host.to_string(), server.port))
        .await
        .unwrap_or_else(|e| panic!("cannot resolve {url}: {e}"))
        .next()
        .unwrap_or_else(|| panic!("{url} resolves to no address"))
}

async fn redlock(urls: Vec<String>, node_timeout: Option<Duration>) -> Redlock {
    let mut builder = Redlock::builder().nodes(urls);
    if let Some(t) = node_timeout {
        builder = builder.node_timeout(t);
    }
    builder.build().await.expect("build a Redlock")
}

/// INFO `section` of node `i`, through the Redlock's own fred client (single-server nodes).
async fn node_info(redlock: &Redlock, i: usize, section: &'static str) -> String {
    use fredlock::fred::types::{ClusterHash, CustomCommand};
    let client = redlock
        .client(i)
        .expect("a single-server node has a client");
    let info: Value = client
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec![section],
        )
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.as_str().map(|s| s.into_owned()).unwrap_or_default()
}

/// The number after `field:` in an INFO text.
fn info_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `total_commands_processed` (INFO stats) of each node, through fredlock's clients.
async fn commands_per_node(redlock: &Redlock) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..redlock.node_names().len() {
        let stats = node_info(redlock, i, "stats").await;
        out.push(info_field(&stats, "total_commands_processed").unwrap_or(0));
    }
    out
}

/// Sum of `total_commands_processed` over the nodes (INFO stats), through fredlock's clients.
async fn commands_processed(redlock: &Redlock) -> u64 {
    commands_per_node(redlock).await.iter().sum()
}

/// (f) Semaphore contention: permits and contenders.
const SEM_PERMITS: usize = 4;
const SEM_TASKS: usize = 16;

/// One semaphore round: acquisitions/s, Redis commands per acquisition (INFO commandstats on
/// every node, which counts the calls inside scripts too), and how often more holders than
/// permits were seen on the client side (must be 0).
struct SemaphoreRound {
    per_second: f64,
    commands_per_acquisition: f64,
    over_permits: u64,
}

/// `SEM_TASKS` tasks take a permit of one semaphore, hold it 1 ms, release it, until `duration`
/// has passed. Retries every 1-2 ms while all permits are taken.
async fn semaphore_round(urls: &[String], name: &str, duration: Duration) -> SemaphoreRound {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .retry(fredlock::Retry {
            attempts: u32::MAX,
            delay: Duration::from_millis(1),
            jitter: Duration::from_millis(1),
        })
        .build()
        .await
        .expect("build a Redlock");
    let sem = redlock
        .semaphore(name, SEM_PERMITS)
        .expect("a valid semaphore");
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let over = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let commands_before = commands_processed(&redlock).await;
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..SEM_TASKS)
        .map(|_| {
            let (sem, inside, over) = (sem.clone(), inside.clone(), over.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end {
                    let permit = sem.acquire(TTL).await.expect("semaphore acquire");
                    use std::sync::atomic::Ordering::SeqCst;
                    if inside.fetch_add(1, SeqCst) + 1 > SEM_PERMITS {
                        over.fetch_add(1, SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, SeqCst);
                    permit.release().await.expect("semaphore release");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("a semaphore task panicked");
    }
    let elapsed = start.elapsed();
    let commands = commands_processed(&redlock).await - commands_before;
    redlock.close().await;
    SemaphoreRound {
        per_second: total as f64 / elapsed.as_secs_f64(),
        commands_per_acquisition: commands as f64 / total.max(1) as f64,
        over_permits: over.load(std::sync::atomic::Ordering::SeqCst),
    }
}

/// Upper bound for one counter read or reset on a local server.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Commands the bench sends itself to read and reset the counters: left out of every count.
const OWN_COMMANDS: [&str; 2] = ["info", "config"];

/// A local redis-server process, read directly (not through fred): its command counters, its
/// CPU time and its memory, from INFO. For the cluster shards, which fredlock reaches through
/// clients of its own (`Redlock::client` has none to lend for a cluster node).
struct Server {
    addr: SocketAddr,
}

impl Server {
    /// Every process of `nodes`, in index order.
    fn all(nodes: &LocalNodes) -> Vec<Server> {
        (0..nodes.len())
            .map(|i| Server {
                addr: nodes.addr(i),
            })
            .collect()
    }

    async fn command(&self, args: &[&str]) -> RespValue {
        testkit::resp_command(self.addr, args, ADMIN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.addr))
    }

    /// INFO of the given sections (several at once: Redis 7).
    async fn info(&self, sections: &[&str]) -> String {
        let args: Vec<&str> = std::iter::once("INFO")
            .chain(sections.iter().copied())
            .collect();
        match self.command(&args).await {
            RespValue::Bulk(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
            other => panic!("INFO {sections:?} on {}: {other:?}", self.addr),
        }
    }

    /// Calls per command since the last CONFIG RESETSTAT (INFO commandstats, which counts the
    /// calls scripts make too), without the bench's own INFO and CONFIG.
    async fn calls(&self) -> BTreeMap<String, u64> {
        calls(&self.info(&["commandstats"]).await)
    }

    /// [`calls`](Self::calls) and the CPU time the process used so far (INFO cpu: user + system,
    /// all threads, to the microsecond), read at the same moment.
    async fn counters(&self) -> (BTreeMap<String, u64>, Duration) {
        let text = self.info(&["commandstats", "cpu"]).await;
        let seconds = |field| {
            text.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("INFO cpu on {}: no {field}", self.addr))
        };
        let cpu = seconds("used_cpu_user") + seconds("used_cpu_sys");
        (calls(&text), Duration::from_secs_f64(cpu))
    }

    async fn reset_stats(&self) {
        match self.command(&["CONFIG", "RESETSTAT"]).await {
            RespValue::Simple(ok) if ok == "OK" => {}
            other => panic!("CONFIG RESETSTAT on {}: {other:?}", self.addr),
        }
    }

    /// Memory the data takes: `used_memory` without the clients' buffers (`mem_clients_normal`),
    /// which swell and shrink with the traffic of the moment.
    async fn data_memory(&self) -> u64 {
        data_memory(&self.info(&["memory"]).await)
    }
}

/// `used_memory - mem_clients_normal` of an INFO memory text.
fn data_memory(info: &str) -> u64 {
    let used = info_field(info, "used_memory").unwrap_or(0);
    used.saturating_sub(info_field(info, "mem_clients_normal").unwrap_or(0))
}

/// Calls per command of an INFO commandstats text, without the bench's own INFO and CONFIG.
fn calls(text: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        // cmdstat_set:calls=12,usec=30,... (subcommands as cmdstat_config|resetstat)
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if OWN_COMMANDS.contains(&name.split('|').next().unwrap_or(name)) {
            continue;
        }
        let n = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        calls.insert(name.to_string(), n);
    }
    calls
}

/// The counters of some servers at one moment.
struct Snapshot {
    calls: Vec<BTreeMap<String, u64>>,
    cpu: Vec<Duration>,
    at: Instant,
}

impl Snapshot {
    async fn take(servers: &[Server]) -> Snapshot {
        let mut snapshot = Snapshot {
            calls: Vec::with_capacity(servers.len()),
            cpu: Vec::with_capacity(servers.len()),
            at: Instant::now(),
        };
        for server in servers {
            let (calls, cpu) = server.counters().await;
            snapshot.calls.push(calls);
            snapshot.cpu.push(cpu);
        }
        snapshot
    }
}

/// What some servers did between two snapshots.
#[derive(Default, Clone)]
struct Work {
    /// Commands per server.
    per_server: Vec<u64>,
    /// Calls per command, all servers together.
    per_command: BTreeMap<String, u64>,
    /// CPU time of all the servers together.
    cpu: Duration,
    /// Wall time between the snapshots.
    elapsed: Duration,
}

impl Work {
    fn between(before: &Snapshot, after: &Snapshot) -> Work {
        let mut work = Work {
            elapsed: after.at.saturating_duration_since(before.at),
            ..Work::default()
        };
        for (b, a) in before.calls.iter().zip(&after.calls) {
            let mut total = 0;
            for (name, n) in a {
                let d = n.saturating_sub(b.get(name).copied().unwrap_or(0));
                total += d;
                *work.per_command.entry(name.clone()).or_default() += d;
            }
            work.per_server.push(total);
        }
        for (b, a) in before.cpu.iter().zip(&after.cpu) {
            work.cpu += a.saturating_sub(*b);
        }
        work
    }

    fn commands(&self) -> u64 {
        self.per_server.iter().sum()
    }

    fn add(&mut self, other: &Work) {
        if self.per_server.is_empty() {
            *self = other.clone();
            return;
        }
        for (mine, theirs) in self.per_server.iter_mut().zip(&other.per_server) {
            *mine += theirs;
        }
        for (name, n) in &other.per_command {
            *self.per_command.entry(name.clone()).or_default() += n;
        }
        self.cpu += other.cpu;
        self.elapsed += other.elapsed;
    }

    /// Server CPU per command, µs.
    fn cpu_per_command_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.commands().max(1) as f64
    }

    /// Server CPU per command, µs, without what the servers burn when idle (`idle`: CPU
    /// seconds per second, all of them together; [`idle_rate`]).
    fn net_cpu_per_command_us(&self, idle: f64) -> f64 {
        let net = self.cpu.as_secs_f64() - idle * self.elapsed.as_secs_f64();
        net.max(0.0) * 1e6 / self.commands().max(1) as f64
    }
}

/// CPU seconds per second that `servers` use together while nobody sends them anything
/// (serverCron; for cluster shards also the cluster bus), over `window`.
async fn idle_rate(servers: &[Server], window: Duration) -> f64 {
    let before = Snapshot::take(servers).await;
    tokio::time::sleep(window).await;
    let after = Snapshot::take(servers).await;
    let work = Work::between(&before, &after);
    work.cpu.as_secs_f64() / work.elapsed.as_secs_f64()
}

/// A throughput round ([`throughput_round`]) with what the servers did during it.
struct Metered {
    round: Throughput,
    work: Work,
}

/// [`throughput_round`], with the servers' counters read before and after. Replies the early
/// decision left in flight land within the short pause before the second reading.
async fn metered_round(
    target: &Target,
    prefix: &str,
    duration: Duration,
    servers: &[Server],
) -> Metered {
    let before = Snapshot::take(servers).await;
    let round = throughput_round(target, prefix, duration, true).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = Snapshot::take(servers).await;
    Metered {
        round,
        work: Work::between(&before, &after),
    }
}

/// Where the Redis-side counters of a keep-alive measurement come from.
enum Meter<'a> {
    /// INFO through the Redlock's own fred clients, one per node (single servers, local or
    /// from FREDLOCK_NODES).
    Clients,
    /// INFO from each local process directly (the cluster shards).
    Servers(&'a [Server]),
}

impl Meter<'_> {
    /// Commands per server (per node for `Clients`) so far.
    async fn commands(&self, redlock: &Redlock) -> Vec<u64> {
        match self {
            Meter::Clients => commands_per_node(redlock).await,
            Meter::Servers(servers) => {
                let mut out = Vec::new();
                for server in *servers {
                    out.push(server.calls().await.values().sum());
                }
                out
            }
        }
    }

    /// [`data_memory`] of all the servers together.
    async fn data_memory(&self, redlock: &Redlock) -> u64 {
        let mut total = 0;
        match self {
            Meter::Clients => {
                for i in 0..redlock.node_names().len() {
                    let text = node_info(redlock, i, "memory").await;
                    total += data_memory(&text);
                }
            }
            Meter::Servers(servers) => {
                for server in *servers {
                    total += server.data_memory().await;
                }
            }
        }
        total
    }
}

/// (d) What holding many locks with keep-alive costs.
struct KeepAliveLoad {
    locks: usize,
    ttl: Duration,
    bytes_per_lock: Option<f64>,
    /// Server memory per held lock, per Redlock node ([`data_memory`]).
    server_bytes_per_lock: f64,
    commands_per_second: f64,
    /// Commands per server over the window (per node for [`Meter::Clients`]).
    per_server: Vec<u64>,
    /// Extension rounds per lock over the window (about 3: one every 2/3 of the TTL).
    extensions_per_lock: f64,
    /// Time taken to acquire them all (256 acquires in flight at a time).
    acquired_in: Duration,
    lost: usize,
}

/// Acquires `locks` locks with keep-alive at once, measures this process's memory growth, the
/// servers' memory growth and their command rate over two TTLs (every lock extended about three
/// times), releases, closes `redlock`.
async fn keep_alive_load(
    redlock: Redlock,
    meter: Meter<'_>,
    prefix: &str,
    locks: usize,
    ttl: Duration,
) -> KeepAliveLoad {
    let before = resident_bytes();
    let server_before = meter.data_memory(&redlock).await;
    let acquiring = Instant::now();
    let mut guards = Vec::with_capacity(locks);
    let mut pending = futures::stream::FuturesUnordered::new();
    use futures::StreamExt;
    for i in 0..locks {
        let (redlock, name) = (redlock.clone(), format!("{prefix}:{i}"));
        pending.push(async move { redlock.acquire(name.as_str(), ttl).await });
        if pending.len() >= 256 {
            let lock = pending.next().await.expect("one result").expect("acquire");
            guards.push(lock.keep_alive());
        }
    }
    while let Some(lock) = pending.next().await {
        guards.push(lock.expect("acquire").keep_alive());
    }
    let acquired_in = acquiring.elapsed();
    let after = resident_bytes();
    let server_after = meter.data_memory(&redlock).await;
    let window = ttl * 2;
    let extensions = |guards: &[fredlock::KeepAlive]| {
        guards
            .iter()
            .map(|g| u64::from(g.extensions()))
            .sum::<u64>()
    };
    let c0 = meter.commands(&redlock).await;
    let e0 = extensions(&guards);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let c1 = meter.commands(&redlock).await;
    let e1 = extensions(&guards);
    let elapsed = t0.elapsed().as_secs_f64();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let releases =
        futures::stream::iter(guards.into_iter().map(|g| g.release())).buffer_unordered(256);
    let _: Vec<_> = releases.collect().await;
    let nodes = redlock.node_names().len();
    redlock.close().await;
    let per_server: Vec<u64> = c0.iter().zip(&c1).map(|(a, b)| b - a).collect();
    KeepAliveLoad {
        locks,
        ttl,
        bytes_per_lock: match (before, after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / locks as f64),
            _ => None,
        },
        server_bytes_per_lock: server_after.saturating_sub(server_before) as f64
            / (locks * nodes) as f64,
        commands_per_second: per_server.iter().sum::<u64>() as f64 / elapsed,
        per_server,
        extensions_per_lock: (e1 - e0) as f64 / locks as f64,
        acquired_in,
        lost,
    }
}

/// (g) Shards per Redlock node.
const CLUSTER_SHARDS: usize = 3;

/// A Redlock over `urls` (cluster nodes) once every node has read its slot table.
async fn cluster_redlock(urls: &[String]) -> Redlock {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .connect_wait(Duration::from_secs(20))
        .build()
        .await
        .expect("build a Redlock over the clusters");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = redlock.inspect("probe").await.expect("inspect");
        if seen.nodes.iter().all(|n| n.state.is_ok()) {
            return redlock;
        }
        assert!(
            Instant::now() < deadline,
            "a cluster node is still not up after 20 s: {:?}",
            seen.nodes.iter().map(|n| &n.state).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// "33%/34%/33%": each server's share of the total of its group of `group` servers (a Redlock
/// node's shards), groups separated by " · "; and the smallest and largest share.
fn shares(per_server: &[u64], group: usize) -> (String, f64, f64) {
    let (mut min, mut max) = (f64::MAX, 0f64);
    let text = per_server
        .chunks(group)
        .map(|shards| {
            let total = shards.iter().sum::<u64>().max(1) as f64;
            shards
                .iter()
                .map(|&n| {
                    let share = 100.0 * n as f64 / total;
                    (min, max) = (min.min(share), max.max(share));
                    format!("{share:.1}%")
                })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect::<Vec<_>>()
        .join(" · ");
    (text, min, max)
}

/// "set 3.0, eval 3.0, ...": calls per cycle of each command.
fn per_cycle(work: &Work, cycles: u64) -> String {
    work.per_command
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(name, &n)| format!("{name} {:.2}", n as f64 / cycles.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (h) The loader: connections, and acquire+release pairs in flight on each.
const LOADER_CONNECTIONS: usize = 8;
const LOADER_DEPTH: usize = 64;

/// (h) One server driven as hard as it goes.
struct Saturation {
    commands_per_second: f64,
    /// Server CPU time / wall time: about 1.0 when saturated.
    busy: f64,
    cpu_per_command_us: f64,
    /// This process's CPU time / wall time meanwhile (the loader's cost).
    client_busy: Option<f64>,
}

/// Drives one server with the commands of a lock cycle on one node, as fredlock sends them (a
/// `SET key token NX PX ttl`, then a compare-and-delete script sent with `EVAL`), pipelined
/// [`LOADER_DEPTH`] cycles deep on each of [`LOADER_CONNECTIONS`] connections, raw RESP, so that
/// the client costs far less than the server and the server's own limit shows. Runs a warm-up
/// of a fifth of `duration` first.
async fn saturate(server: &Server, prefix: &str, duration: Duration) -> Saturation {
    let load = |end: Instant| {
        let tasks: Vec<_> = (0..LOADER_CONNECTIONS)
            .map(|c| tokio::spawn(pipelined_cycles(server.addr, format!("{prefix}:{c}"), end)))
            .collect();
        async move {
            let mut cycles = 0;
            for task in tasks {
                cycles += task.await.expect("a loader task panicked");
            }
            cycles
        }
    };
    load(Instant::now() + duration / 5).await;
    let before = Snapshot::take(std::slice::from_ref(server)).await;
    let client_before = process_cpu();
    let start = Instant::now();
    load(start + duration).await;
    let elapsed = start.elapsed();
    let client = client_before
        .zip(process_cpu())
        .map(|(a, b)| b.saturating_sub(a));
    let after = Snapshot::take(std::slice::from_ref(server)).await;
    let work = Work::between(&before, &after);
    Saturation {
        commands_per_second: work.commands() as f64 / elapsed.as_secs_f64(),
        busy: work.cpu.as_secs_f64() / elapsed.as_secs_f64(),
        cpu_per_command_us: work.cpu_per_command_us(),
        client_busy: client.map(|c| c.as_secs_f64() / elapsed.as_secs_f64()),
    }
}

/// One loader connection: batches of [`LOADER_DEPTH`] SET NX PX + EVAL pairs on keys of its own,
/// every reply checked, until `end`. Returns the cycles done.
async fn pipelined_cycles(addr: SocketAddr, prefix: String, end: Instant) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("loader: connect to {addr}: {e}"));
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let keys: Vec<String> = (0..LOADER_DEPTH).map(|k| format!("{prefix}:{k}")).collect();
    let ttl = TTL.as_millis().to_string();
    let (mut request, mut replies, mut chunk) = (Vec::new(), Vec::new(), vec![0u8; 64 * 1024]);
    let mut cycles = 0;
    while Instant::now() < end {
        let token = format!("{:032x}", rand::random::<u128>());
        request.clear();
        for key in &keys {
            request.extend(RespValue::encode_command(&[
                "SET", key, &token, "NX", "PX", &ttl,
            ]));
            request.extend(RespValue::encode_command(&[
                "EVAL",
                FLOOR_RELEASE,
                "1",
                key,
                &token,
            ]));
        }
        stream.write_all(&request).await.expect("loader: write");
        let mut read = 0;
        let mut at = 0;
        while read < 2 * LOADER_DEPTH {
            match RespValue::parse(&replies[at..]).expect("loader: a RESP reply") {
                Some((reply, used)) => {
                    at += used;
                    let ok = match read % 2 {
                        0 => reply == RespValue::Simple("OK".into()),
                        _ => reply == RespValue::Integer(1),
                    };
                    assert!(ok, "loader: unexpected reply {reply:?}");
                    read += 1;
                }
                None => {
                    let n = stream.read(&mut chunk).await.expect("loader: read");
                    assert!(n > 0, "loader: {addr} closed the connection");
                    replies.extend_from_slice(&chunk[..n]);
                }
            }
        }
        replies.drain(..at);
        cycles += LOADER_DEPTH as u64;
    }
    cycles
}

/// (w) 16 waiters on one key with a 1 ms hold (the precise hold of `bench_waiters`): fredlock
/// polling, fredlock woken by release, rslock and an in-process mutex, interleaved within each
/// round (order alternating), after a warm-up round each.
async fn waiter_rounds(urls: &[String], plan: &Plan, run: &str) -> Vec<(&'static str, WSeries)> {
    let mut addrs = Vec::new();
    for u in urls {
        addrs.push(support::addr_of(u).await);
    }
    let build = |wake: bool| {
        Redlock::builder()
            .nodes(urls.to_vec())
            .retry(waiters::RETRY)
            .wake_on_release(wake)
            .build()
    };
    let variants: Vec<(&'static str, WTarget)> = vec![
        (
            "fredlock, polling",
            WTarget::Redlock(build(false).await.expect("build")),
        ),
        (
            "fredlock, woken by release",
            WTarget::Redlock(build(true).await.expect("build")),
        ),
        (
            "rslock 0.10",
            WTarget::Rslock(Arc::new(waiters::rslock(urls))),
        ),
        (
            "in-process tokio Mutex (ceiling, no Redis)",
            WTarget::Local(Arc::new(tokio::sync::Mutex::new(()))),
        ),
    ];
    let key = format!("{run}:waiters");
    for (_, t) in &variants {
        waiters::round(t, &addrs, &key, Hold::Precise, 0.3).await;
    }
    let mut series: Vec<WSeries> = variants.iter().map(|_| WSeries::default()).collect();
    for r in 0..plan.waiter_rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for v in order {
            let got = waiters::round(
                &variants[v].1,
                &addrs,
                &key,
                Hold::Precise,
                plan.waiter_secs,
            );
            series[v].0.push(got.await);
        }
    }
    for (_, t) in &variants {
        if let WTarget::Redlock(r) = t {
            r.close().await;
        }
    }
    variants.into_iter().map(|(n, _)| n).zip(series).collect()
}

/// (k) The keep-alive children (see `support::keepalive`): per round a batched, a per-lock and a
/// plain child, the order alternating; samples per variant.
async fn keepalive_rounds(
    urls: &[String],
    plan: &Plan,
    run: &str,
) -> BTreeMap<&'static str, Vec<Sample>> {
    let mut out: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    for round in 0..plan.keepalive_rounds {
        let mut order = [Variant::PerLock, Variant::Batched, Variant::Plain];
        if round % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            let (urls, prefix) = (urls.to_vec(), format!("{run}:k{round}:{}", variant.name()));
            let (locks, ttl) = (plan.keepalive_locks, plan.keepalive_ttl);
            let sample = tokio::task::spawn_blocking(move || {
                run_child(&ChildSpec {
                    variant,
                    urls: &urls,
                    prefix: &prefix,
                    locks,
                    ttl,
                    window: ttl * 2,
                })
            })
            .await
            .expect("a keep-alive child");
            out.entry(variant.name()).or_default().push(sample);
        }
    }
    out
}

/// (n) Serial p50 for N = 3, 5, 7 nodes: the raw floor and fredlock at each N, all six
/// interleaved in every round. Returns per N: (N, floor series, fredlock series).
async fn scaling_rounds(plan: &Plan, run: &str) -> Vec<(usize, Series, Series)> {
    let nodes = LocalNodes::start(7)
        .await
        .expect("start 7 local redis-server nodes");
    let urls = nodes.urls();
    let mut targets = Vec::new();
    for n in [3, 5, 7] {
        let floor = Target::Floor(Arc::new(Floor::connect(&urls[..n]).await));
        let fredlock = Target::Fredlock(redlock(urls[..n].to_vec(), None).await);
        targets.push((n, floor, fredlock));
    }
    let res: Vec<String> = targets
        .iter()
        .map(|(n, ..)| format!("{run}:n{n}"))
        .collect();
    let mixed: Vec<(&Target, &str)> = targets
        .iter()
        .zip(&res)
        .flat_map(|((_, f, l), r)| [(f, r.as_str()), (l, r.as_str())])
        .collect();
    serial_round(&mixed, plan.warmup_cycles / 2).await;
    let mut series: Vec<(Series, Series)> = targets.iter().map(|_| Default::default()).collect();
    for _ in 0..plan.rounds {
        let mut rounds = serial_round(&mixed, plan.n_cycles).await.into_iter();
        for (floor, fredlock) in &mut series {
            floor.push(rounds.next().expect("one result per variant"));
            fredlock.push(rounds.next().expect("one result per variant"));
        }
    }
    for (_, _, l) in &targets {
        if let Target::Fredlock(r) = l {
            r.close().await;
        }
    }
    targets
        .iter()
        .map(|(n, ..)| *n)
        .zip(series)
        .map(|(n, (f, l))| (n, f, l))
        .collect()
}

/// The fault variants and peers of the serial rows (a), (c), (c'), (e).
struct Targets {
    floor: Target,
    rslock: Target,
    healthy: Target,
    fenced: Target,
    silent: Target,
    stalled: Target,
    blackhole: Blackhole,
    /// Kept alive for `stalled`.
    _proxy: FaultProxy,
    /// The nodes, as the tables name them.
    where_: String,
}

async fn targets(nodes: &TestNodes, urls: &[String], run: &str) -> Targets {
    let urls = urls.to_vec();

    let floor = Target::Floor(Arc::new(Floor::connect(&urls).await));
    let rslock = rslock_target(&urls);
    let healthy_redlock = redlock(urls.clone(), None).await;
    // Node names as fredlock shows them (`host:port/db`): URLs may carry passwords.
    let where_ = match &nodes {
        TestNodes::Local(_) => "3 local redis-server nodes",
        TestNodes::External(_) => "FREDLOCK_NODES",
    };
    let where_ = format!("{where_} ({})", healthy_redlock.node_names().join(", "));
    let healthy = Target::Fredlock(healthy_redlock);
    // (e): the same, handing out fencing tokens (one more round per acquire: the write-back).
    let fenced = Target::Fredlock(
        Redlock::builder()
            .nodes(urls.clone())
            .fencing_tokens(true)
            .build()
            .await
            .expect("build a fencing Redlock"),
    );

    // (c): the third node is a listener that accepts TCP and never answers, from the start.
    let blackhole = Blackhole::start()
        .await
        .expect("start the blackhole listener");
    let silent_urls = vec![urls[0].clone(), urls[1].clone(), blackhole.url()];
    let silent = Target::Fredlock(redlock(silent_urls, Some(SILENT_NODE_TIMEOUT)).await);

    // (c'): the third node connects normally through a proxy, which then swallows everything.
    let proxy = FaultProxy::start(socket_addr(&urls[2]).await)
        .await
        .expect("start the fault proxy");
    let stalled_urls = vec![urls[0].clone(), urls[1].clone(), proxy.url()];
    let stalled_redlock = redlock(stalled_urls, Some(SILENT_NODE_TIMEOUT)).await;
    // `inspect` waits for every node: proof that the proxied node is connected and answering
    // before it goes silent.
    let probe = stalled_redlock
        .inspect(&format!("{run}:probe"))
        .await
        .expect("inspect through the proxy");
    if let Err(e) = &probe.nodes[2].state {
        panic!("the proxied node did not answer before the fault: {e}");
    }
    proxy.set(Fault::Blackhole);
    let stalled = Target::Fredlock(stalled_redlock);

    // Commands to a silent node stay in flight until the per-node timeout; let them expire
    // before measuring anything else, so their timers and clean-up do not land in another
    // variant's round.
    Targets {
        floor,
        rslock,
        healthy,
        fenced,
        silent,
        stalled,
        blackhole,
        _proxy: proxy,
        where_,
    }
}

/// The serial series of (a), (c), (c') and (e).
struct Mixed {
    s_floor: Series,
    s_rslock: Series,
    s_healthy: Series,
    s_silent: Series,
    s_stalled: Series,
    s_fenced: Series,
}

/// (a), (c), (e) in interleaved blocks, (c') alone after each round.
async fn mixed_rounds(t: &Targets, plan: &Plan, run: &str) -> Mixed {
    let (serial_res, silent_res, stalled_res, fenced_res) = (
        format!("{run}:serial"),
        format!("{run}:silent"),
        format!("{run}:stalled"),
        format!("{run}:fenced"),
    );
    let Targets {
        floor,
        rslock,
        healthy,
        fenced,
        silent,
        stalled,
        ..
    } = t;

    let settle = || tokio::time::sleep(SILENT_NODE_TIMEOUT + Duration::from_millis(100));

    // (a) and (c): floor, fredlock and fredlock with a blackhole node take turns in small blocks.
    // fred never completes its handshake with the blackhole (its PING is never answered), so
    // commands to it fail at once and leave nothing behind that could slow the others down.
    let mixed = [
        (floor, serial_res.as_str()),
        (rslock, serial_res.as_str()),
        (healthy, serial_res.as_str()),
        (silent, silent_res.as_str()),
        (fenced, fenced_res.as_str()),
    ];
    // (c'): measured on its own, because everything it sends to the silent node stays in flight
    // for 500 ms and would then expire during the other variants' cycles.
    let alone = [(stalled, stalled_res.as_str())];

    // Warm-up: connections, scripts cached in Redis, allocator and CPU caches, for each variant.
    serial_round(&mixed, plan.warmup_cycles).await;
    serial_round(&alone, plan.warmup_cycles).await;
    settle().await;

    let (mut s_floor, mut s_rslock, mut s_healthy, mut s_silent, mut s_stalled, mut s_fenced) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    for _ in 0..plan.rounds {
        let mut mixed_rounds = serial_round(&mixed, plan.cycles).await.into_iter();
        for series in [
            &mut s_floor,
            &mut s_rslock,
            &mut s_healthy,
            &mut s_silent,
            &mut s_fenced,
        ] {
            series.push(mixed_rounds.next().expect("one result per variant"));
        }
        let mut alone_rounds = serial_round(&alone, plan.cycles).await.into_iter();
        s_stalled.push(alone_rounds.next().expect("one result per variant"));
        settle().await;
    }

    Mixed {
        s_floor,
        s_rslock,
        s_healthy,
        s_silent,
        s_stalled,
        s_fenced,
    }
}

/// (g) and (h): the cluster rows and the saturated single server.
struct Clusters {
    g_single: Vec<Metered>,
    g_cluster: Vec<Metered>,
    idle_single: f64,
    idle_shards: f64,
    g_keep: KeepAliveLoad,
    saturation: Saturation,
}

async fn cluster_rows(nodes: &TestNodes, plan: &Plan, run: &str) -> Clusters {
    // (g) Each node a 3-shard cluster against 3 single servers, both local (with FREDLOCK_NODES,
    // 3 local single servers of its own), so that the servers can be read and reset directly.
    let own_singles;
    let singles: &LocalNodes = match nodes.local() {
        Some(local) => local,
        None => {
            own_singles = LocalNodes::start(3)
                .await
                .expect("start 3 local redis-server nodes");
            &own_singles
        }
    };
    let clusters: Vec<LocalCluster> = join_all((0..3).map(|_| LocalCluster::start(CLUSTER_SHARDS)))
        .await
        .into_iter()
        .map(|c| c.expect("start a local 3-shard Redis Cluster"))
        .collect();
    let cluster_urls: Vec<String> = clusters.iter().map(LocalCluster::url).collect();
    let single_servers = Server::all(singles);
    let shard_servers: Vec<Server> = clusters
        .iter()
        .flat_map(|c| Server::all(c.nodes()))
        .collect();
    let single_lock = redlock(singles.urls(), None).await;
    let cluster_lock = cluster_redlock(&cluster_urls).await;
    let g_prefix = format!("{run}:g");
    let on_single = Target::Fredlock(single_lock.clone());
    let on_cluster = Target::Fredlock(cluster_lock.clone());
    throughput_round(&on_single, &g_prefix, plan.throughput_warmup, true).await;
    throughput_round(&on_cluster, &g_prefix, plan.throughput_warmup, true).await;
    for server in single_servers.iter().chain(&shard_servers) {
        server.reset_stats().await;
    }
    // What the servers burn idle, to take out of the CPU per command of (h).
    let idle_window = plan.throughput_round * 3;
    let (idle_single, idle_shards) = (
        idle_rate(&single_servers, idle_window).await,
        idle_rate(&shard_servers, idle_window).await,
    );
    let (mut g_single, mut g_cluster) = (Vec::new(), Vec::new());
    for round in 0..plan.throughput_rounds {
        for turn in 0..2 {
            if (round + turn) % 2 == 0 {
                let m = metered_round(
                    &on_single,
                    &g_prefix,
                    plan.throughput_round,
                    &single_servers,
                );
                g_single.push(m.await);
            } else {
                let m = metered_round(
                    &on_cluster,
                    &g_prefix,
                    plan.throughput_round,
                    &shard_servers,
                );
                g_cluster.push(m.await);
            }
        }
    }
    single_lock.close().await;
    cluster_lock.close().await;
    let g_keep = keep_alive_load(
        cluster_redlock(&cluster_urls).await,
        Meter::Servers(&shard_servers),
        &format!("{run}:gkeep"),
        plan.cluster_kept,
        plan.keep_ttl,
    )
    .await;
    drop(clusters);

    // (h) One single server saturated by the pipelined loader.
    let saturation = saturate(&single_servers[0], &format!("{run}:sat"), plan.saturation).await;
    Clusters {
        g_single,
        g_cluster,
        idle_single,
        idle_shards,
        g_keep,
        saturation,
    }
}

/// Everything the full run measured, for the tables.
struct Results {
    nproc: usize,
    redis_version: String,
    date: String,
    git: String,
    command: String,
    where_: String,
    blackhole_connections: usize,
    run: String,
    load_before: String,
    load_after: String,
    measured_for: Duration,
    mixed: Mixed,
    serial: serial::Serial,
    t_floor: Vec<Throughput>,
    t_rslock: Vec<Throughput>,
    t_healthy: Vec<Throughput>,
    sem_rounds: Vec<SemaphoreRound>,
    keep: KeepAliveLoad,
    clusters: Clusters,
    waited: Vec<(&'static str, WSeries)>,
    kept: BTreeMap<&'static str, Vec<Sample>>,
    scaled: Vec<(usize, Series, Series)>,
}

fn yes_no(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

fn rates(t: &[Throughput]) -> Vec<f64> {
    t.iter().map(|t| t.per_second).collect()
}

fn cpu(t: &[Throughput]) -> Option<f64> {
    let v: Option<Vec<f64>> = t.iter().map(|t| t.cpu_per_cycle_us).collect();
    v.map(median)
}

/// The medians most rows use.
struct Key {
    f50: f64,
    h50: f64,
    f99: f64,
    h99: f64,
    tf: f64,
    th: f64,
    tr: f64,
    r50: f64,
    r99: f64,
    c50: f64,
    c99: f64,
    d50: f64,
    d99: f64,
}

impl Results {
    fn key(&self) -> Key {
        let m = &self.mixed;
        Key {
            f50: m.s_floor.p50(),
            h50: m.s_healthy.p50(),
            f99: m.s_floor.p99(),
            h99: m.s_healthy.p99(),
            tf: median(rates(&self.t_floor)),
            th: median(rates(&self.t_healthy)),
            tr: median(rates(&self.t_rslock)),
            r50: m.s_rslock.p50(),
            r99: m.s_rslock.p99(),
            c50: m.s_silent.p50(),
            c99: m.s_silent.p99(),
            d50: m.s_stalled.p50(),
            d99: m.s_stalled.p99(),
        }
    }
}

fn print_header(r: &Results, plan: &Plan) {
    let Results {
        nproc,
        redis_version,
        date,
        git,
        command,
        where_,
        load_before,
        load_after,
        serial,
        ..
    } = r;

    println!();
    println!("machine: nproc={nproc}, {redis_version}, {date}");
    println!("fredlock {} (git {git})", env!("CARGO_PKG_VERSION"));
    println!("command: `{command}`");
    println!("nodes: {where_}");
    println!(
        "method: TTL {} s; serial: median over {} interleaved rounds of {} cycles per variant \
         (after {} warm-up cycles); throughput: {TASKS} tasks, median over {} interleaved rounds \
         of {} ms per variant ((g) the same, single servers and clusters alternating); kept \
         alive: TTL {} s, measured over two TTLs; loader: {} ms after {} ms of warm-up",
        TTL.as_secs(),
        plan.rounds,
        plan.cycles,
        plan.warmup_cycles,
        plan.throughput_rounds,
        plan.throughput_round.as_millis(),
        plan.keep_ttl.as_secs(),
        plan.saturation.as_millis(),
        (plan.saturation / 5).as_millis()
    );
    println!();
    // Issue 11's table: fredlock against rslock and the raw floor, all from this run.
    println!("load average (1, 5, 15 min): before {load_before}; after {load_after}");
    println!();
    serial.print(plan.rounds, plan.cycles);
}

fn print_summary(r: &Results, plan: &Plan) {
    let Key {
        f50,
        h50,
        tf,
        th,
        tr,
        r50,
        c50,
        ..
    } = r.key();
    let Results {
        waited,
        kept: _,
        scaled: _,
        ..
    } = r;

    println!("| workload | raw fred floor | rslock 0.10 | fredlock | fredlock / rslock | fredlock / floor | target | met? |");
    println!("|---|---:|---:|---:|---:|---:|---|---|");
    println!(
        "| serial acquire+release p50, µs | {f50:.1} | {r50:.1} | {h50:.1} | {:.3} | {:.3} | ≤ 0.9x rslock | {} |",
        h50 / r50,
        h50 / f50,
        yes_no(h50 / r50 <= 0.9)
    );
    println!(
        "| {TASKS} tasks, own keys, cycles/s | {tf:.0} | {tr:.0} | {th:.0} | {:.3} | {:.3} | ≥ 1.2x rslock | {} |",
        th / tr,
        th / tf,
        yes_no(th / tr >= 1.2)
    );
    let w = |name: &str| {
        waited
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
            .expect("a waiter variant")
    };
    let (w_poll, w_wake, w_rs, w_mutex) = (
        w("fredlock, polling"),
        w("fredlock, woken by release"),
        w("rslock 0.10"),
        w("in-process tokio Mutex (ceiling, no Redis)"),
    );
    let rate = |s: &WSeries| s.median(|r| r.per_second);
    let cmds = |s: &WSeries| s.median(|r| r.commands_per_acquisition);
    println!(
        "| 16 waiters on one key, 1 ms hold (precise), acquisitions/s (retry 5 ms + 5 ms jitter; rslock: 0-10 ms): fredlock woken by release (polling: {:.0}; in-process mutex ceiling: {:.0}) | — | {:.0} | {:.0} | {:.3} | — | ≥ 1.5x the best peer | {} |",
        rate(w_poll),
        rate(w_mutex),
        rate(w_rs),
        rate(w_wake),
        rate(w_wake) / rate(w_rs),
        yes_no(rate(w_wake) / rate(w_rs) >= 1.5)
    );
    println!(
        "| the same: Redis commands per acquisition (INFO commandstats; polling: {:.1}) | — | {:.1} | {:.1} | {:.3} | — | ≤ 0.5x the thriftiest peer | {} |",
        cmds(w_poll),
        cmds(w_rs),
        cmds(w_wake),
        cmds(w_wake) / cmds(w_rs),
        yes_no(cmds(w_wake) / cmds(w_rs) <= 0.5)
    );
    let waits = |s: &WSeries| {
        format!(
            "{:.1} / {:.1} / {:.0}",
            s.median(|r| r.p50_us) / 1e3,
            s.median(|r| r.p99_us) / 1e3,
            s.max(|r| r.max_us) / 1e3
        )
    };
    println!(
        "| the same: wait per acquisition p50 / p99 / max, ms (polling: {}; mutex: {}) | — | {} | {} | — | — | — | — |",
        waits(w_poll),
        waits(w_mutex),
        waits(w_rs),
        waits(w_wake)
    );
    println!(
        "| 1 of 3 nodes never answers (a blackhole; node timeout 500 ms), p50, µs (ratio: against healthy fredlock) | — | — | {c50:.1} | — | {:.3} | ≤ 1.5x healthy | {} |",
        c50 / h50,
        yes_no(c50 / h50 <= 1.5)
    );
    print_summary_kept(r, plan);
}

/// The summary's keep-alive rows and the N = 3, 5, 7 rows.
fn print_summary_kept(r: &Results, plan: &Plan) {
    let Results { kept, scaled, .. } = r;
    let k = |v: Variant, f: &dyn Fn(&Sample) -> f64| {
        median(
            kept.get(v.name())
                .map_or(Vec::new(), |s| s.iter().map(f).collect()),
        )
    };
    let k_lost: u64 = kept.values().flatten().map(|s| s.lost).sum();
    let per_lock_scripts = |v: Variant| k(v, &|s| s.scripts_per_s) / plan.keepalive_locks as f64;
    println!(
        "| batched keep-alive, {} locks (TTL {} s): client→node script calls/s per held lock (a task per lock: {:.4}) | — | — | {:.5} | — | — | ≥ 10x fewer than a task per lock | {} ({:.0}x) |",
        plan.keepalive_locks,
        plan.keepalive_ttl.as_secs_f64(),
        per_lock_scripts(Variant::PerLock),
        per_lock_scripts(Variant::Batched),
        yes_no(per_lock_scripts(Variant::PerLock) / per_lock_scripts(Variant::Batched) >= 10.0),
        per_lock_scripts(Variant::PerLock) / per_lock_scripts(Variant::Batched)
    );
    let node_cpu = |v: Variant| k(v, &|s| s.node_cpu);
    println!(
        "| the same: node CPU s per held lock per minute, 3 nodes (a task per lock: {:.6}) | — | — | {:.6} | — | — | ≥ 2x less | {} ({:.2}x) |",
        node_cpu(Variant::PerLock),
        node_cpu(Variant::Batched),
        yes_no(node_cpu(Variant::PerLock) / node_cpu(Variant::Batched) >= 2.0),
        node_cpu(Variant::PerLock) / node_cpu(Variant::Batched)
    );
    let (heap, rss) = (
        k(Variant::Batched, &|s| s.heap_per_lock),
        k(Variant::Batched, &|s| s.rss_per_lock),
    );
    println!(
        "| the same: memory per held lock, live heap (RSS: {rss:.0} B; a task per lock: {:.0} B heap; {k_lost} locks lost) | — | — | {heap:.0} B | — | — | ≤ 1 KB | {} |",
        k(Variant::PerLock, &|s| s.heap_per_lock),
        yes_no(heap <= 1024.0 && k_lost == 0)
    );
    for (n, floor, fredlock) in scaled {
        let (f, l) = (floor.p50(), fredlock.p50());
        println!(
            "| N = {n}: serial acquire+release p50, µs | {f:.1} | — | {l:.1} | — | {:.3} | ≤ 1.0x the floor | {} |",
            l / f,
            yes_no(l / f <= 1.0)
        );
    }
}

fn print_details(r: &Results) {
    let Key {
        f50,
        h50,
        f99,
        h99,
        tf,
        th,
        tr,
        r50,
        r99,
        c50,
        c99,
        d50,
        d99,
    } = r.key();
    let Results {
        mixed, sem_rounds, ..
    } = r;
    let s_fenced = &mixed.s_fenced;

    println!();
    println!("Details (the earlier rows (a)-(h)):");
    println!();
    println!("| measurement | baseline | fredlock | ratio | target | met? |");
    println!("|---|---:|---:|---:|---|---|");
    println!(
        "| (a) serial acquire+release p50, µs (baseline: raw fred floor) | {f50:.1} | {h50:.1} | {:.3} | ≤ 1.05 | {} |",
        h50 / f50,
        yes_no(h50 / f50 <= 1.05)
    );
    println!(
        "| (a) serial acquire+release p99, µs (baseline: raw fred floor) | {f99:.1} | {h99:.1} | {:.3} | — | — |",
        h99 / f99
    );
    println!(
        "| (a) serial acquire+release p50, µs (baseline: rslock 0.10) | {r50:.1} | {h50:.1} | {:.3} | ≤ 0.9 | {} |",
        h50 / r50,
        yes_no(h50 / r50 <= 0.9)
    );
    println!(
        "| (a) serial acquire+release p99, µs (baseline: rslock 0.10) | {r99:.1} | {h99:.1} | {:.3} | — | — |",
        h99 / r99
    );
    println!(
        "| (b) {TASKS} tasks, own keys: cycles/s (baseline: rslock 0.10) | {tr:.0} | {th:.0} | {:.3} | ≥ 1.2 | {} |",
        th / tr,
        yes_no(th / tr >= 1.2)
    );
    println!(
        "| (b) {TASKS} tasks, own keys: cycles/s (baseline: raw fred floor) | {tf:.0} | {th:.0} | {:.3} | ≥ 0.95 | {} |",
        th / tf,
        yes_no(th / tf >= 0.95)
    );
    println!(
        "| (c) 1 of 3 nodes a blackhole, node timeout 500 ms: p50, µs (baseline: healthy fredlock) | {h50:.1} | {c50:.1} | {:.3} | ≤ 1.5 | {} |",
        c50 / h50,
        yes_no(c50 / h50 <= 1.5)
    );
    println!(
        "| (c) 1 of 3 nodes a blackhole: p99, µs (baseline: healthy fredlock) | {h99:.1} | {c99:.1} | {:.3} | — | — |",
        c99 / h99
    );
    println!(
        "| (c') 1 of 3 nodes silent after connecting, node timeout 500 ms: p50, µs (baseline: healthy fredlock) | {h50:.1} | {d50:.1} | {:.3} | ≤ 1.5 | {} |",
        d50 / h50,
        yes_no(d50 / h50 <= 1.5)
    );
    println!(
        "| (c') 1 of 3 nodes silent after connecting: p99, µs (baseline: healthy fredlock) | {h99:.1} | {d99:.1} | {:.3} | — | — |",
        d99 / h99
    );
    let (e50, e99) = (s_fenced.p50(), s_fenced.p99());
    println!(
        "| (e) serial acquire+release p50 with fencing tokens, µs (baseline: fredlock without) | {h50:.1} | {e50:.1} | {:.3} | — | — |",
        e50 / h50
    );
    println!(
        "| (e) serial acquire+release p99 with fencing tokens, µs (baseline: fredlock without) | {h99:.1} | {e99:.1} | {:.3} | — | — |",
        e99 / h99
    );
    let sem_rate = median(sem_rounds.iter().map(|r| r.per_second).collect());
    let sem_cmds = median(
        sem_rounds
            .iter()
            .map(|r| r.commands_per_acquisition)
            .collect(),
    );
    println!(
        "| (f) semaphore, {SEM_PERMITS} permits, {SEM_TASKS} contenders, 1 ms hold: acquisitions/s (Redis commands per acquisition: {sem_cmds:.1}) | — | {sem_rate:.0} | — | — | {} over permits |",
        sem_rounds.iter().map(|r| r.over_permits).sum::<u64>()
    );
}

/// The (g) and (h) figures several tables use.
struct G {
    gs_work: Work,
    gs_cycles: u64,
    gc_work: Work,
    gc_cycles: u64,
    gs: f64,
    gc: f64,
    cs: f64,
    cc: f64,
    g_shares: String,
    g_min: f64,
    g_max: f64,
    k_shares: String,
    k_min: f64,
    k_max: f64,
    d_per: f64,
    g_per: f64,
    us_single: f64,
    us_shard: f64,
    net_single: f64,
    net_shard: f64,
}

fn g_rates(r: &[Metered]) -> Vec<f64> {
    r.iter().map(|m| m.round.per_second).collect()
}

fn g_figures(r: &Results) -> G {
    let (keep, c) = (&r.keep, &r.clusters);
    let g_total = |rounds: &[Metered]| {
        let mut work = Work::default();
        for m in rounds {
            work.add(&m.work);
        }
        (work, rounds.iter().map(|m| m.round.cycles).sum::<u64>())
    };
    let (gs_work, gs_cycles) = g_total(&c.g_single);
    let (gc_work, gc_cycles) = g_total(&c.g_cluster);
    let (g_shares, g_min, g_max) = shares(&gc_work.per_server, CLUSTER_SHARDS);
    let (k_shares, k_min, k_max) = shares(&c.g_keep.per_server, CLUSTER_SHARDS);
    G {
        gs: median(g_rates(&c.g_single)),
        gc: median(g_rates(&c.g_cluster)),
        cs: gs_work.commands() as f64 / gs_cycles.max(1) as f64,
        cc: gc_work.commands() as f64 / gc_cycles.max(1) as f64,
        d_per: keep.commands_per_second / keep.locks as f64,
        g_per: c.g_keep.commands_per_second / c.g_keep.locks as f64,
        us_single: gs_work.cpu_per_command_us(),
        us_shard: gc_work.cpu_per_command_us(),
        net_single: gs_work.net_cpu_per_command_us(c.idle_single),
        net_shard: gc_work.net_cpu_per_command_us(c.idle_shards),
        gs_work,
        gs_cycles,
        gc_work,
        gc_cycles,
        g_shares,
        g_min,
        g_max,
        k_shares,
        k_min,
        k_max,
    }
}

fn print_details_capacity(r: &Results) {
    let Results { keep, clusters, .. } = r;
    let Clusters {
        g_keep, saturation, ..
    } = clusters;
    let G {
        gc_work,
        gs,
        gc,
        cs,
        cc,
        g_min,
        g_max,
        k_min,
        k_max,
        d_per,
        g_per,
        net_single,
        net_shard,
        ..
    } = g_figures(r);
    let even = 100.0 / CLUSTER_SHARDS as f64;

    // Extending at 2/3 of the TTL: locks x nodes / (ttl x 2/3) EVALSHA per second, plus the
    // commands each script runs (GET, PEXPIRE), which INFO counts too.
    let rounds_per_second = keep.locks as f64 / (keep.ttl.as_secs_f64() * 2.0 / 3.0);
    println!(
        "| (d) {} locks kept alive (TTL {} s): memory per held lock | — | {} | — | — | — |",
        keep.locks,
        keep.ttl.as_secs(),
        keep.bytes_per_lock
            .map_or("n/a".to_string(), |b| format!("{:.0} B", b))
    );
    println!(
        "| (d) {} locks kept alive: Redis commands/s, all nodes (extension rounds/s: {:.0}) | — | {:.0} | — | — | {} lost |",
        keep.locks,
        rounds_per_second,
        keep.commands_per_second,
        keep.lost
    );
    println!(
        "| (g) {TASKS} tasks, a fresh key per cycle, each of 3 nodes a {CLUSTER_SHARDS}-shard Redis Cluster: cycles/s (baseline: fredlock on 3 single servers) | {gs:.0} | {gc:.0} | {:.3} | — (2 cores: distribution, not speed-up) | — |",
        gc / gs
    );
    println!(
        "| (g) Redis commands per acquire+release, all 3 nodes (INFO commandstats; baseline: single servers) | {cs:.2} | {cc:.2} | {:.3} | — | — |",
        cc / cs
    );
    println!(
        "| (g) each shard's share of its node's commands, min / max of {} shards (even: {even:.1}%) | — | {g_min:.1}% / {g_max:.1}% | — | — | — |",
        gc_work.per_server.len()
    );
    println!(
        "| (g) {} locks kept alive on the clusters (TTL {} s): Redis commands/s per held lock, all nodes (baseline: (d), {} locks on single servers) | {d_per:.3} | {g_per:.3} | {:.3} | — | {} lost |",
        g_keep.locks,
        g_keep.ttl.as_secs(),
        keep.locks,
        g_per / d_per,
        g_keep.lost
    );
    println!(
        "| (g) kept-alive locks on the clusters: each shard's share of its node's commands, min / max (even: {even:.1}%) | — | {k_min:.1}% / {k_max:.1}% | — | — | — |"
    );
    println!(
        "| (h) redis-server CPU per Redis command during (g), net of the idle servers' own use, µs (baseline: single servers; fredlock: cluster shards) | {net_single:.2} | {net_shard:.2} | {:.3} | — | — |",
        net_shard / net_single
    );
    println!(
        "| (h) one redis-server driven by a pipelined raw-RESP loader ({LOADER_CONNECTIONS} connections x {LOADER_DEPTH} cycles in flight, SET NX PX + EVAL release): Redis commands/s (server CPU busy {:.0}%, loader {}) | — | {:.0} | — | — | {} |",
        saturation.busy * 100.0,
        saturation
            .client_busy
            .map_or("n/a".to_string(), |b| format!("{:.0}%", b * 100.0)),
        saturation.commands_per_second,
        if saturation.busy >= 0.9 { "saturated" } else { "**not saturated**" }
    );
    println!(
        "| (d) server memory per held lock, per node, B (INFO used_memory - mem_clients_normal; baseline: single servers, (d); fredlock: a {CLUSTER_SHARDS}-shard cluster node, (g)) | {:.0} | {:.0} | {:.3} | — | — |",
        keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock / keep.server_bytes_per_lock
    );
    println!();
}

fn print_spread(r: &Results) {
    let Results {
        mixed,
        t_floor,
        t_rslock,
        t_healthy,
        keep,
        clusters,
        nproc,
        ..
    } = r;
    let Mixed {
        s_floor,
        s_rslock,
        s_healthy,
        s_silent,
        s_stalled,
        s_fenced,
    } = mixed;
    let Clusters {
        g_single,
        g_cluster,
        g_keep,
        ..
    } = clusters;
    let G {
        gs_work,
        gs_cycles,
        gc_work,
        gc_cycles,
        g_shares,
        k_shares,
        ..
    } = g_figures(r);

    // The spread behind the medians, and what the silent node did: enough to judge the noise.
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for name in ["p50", "p99"] {
        let of = |s: &Series| list(if name == "p50" { &s.p50 } else { &s.p99 });
        println!(
            "per-round {name} (µs): floor [{}], rslock [{}], fredlock [{}], blackhole [{}], silent-after-connect [{}], fencing [{}]",
            of(s_floor),
            of(s_rslock),
            of(s_healthy),
            of(s_silent),
            of(s_stalled),
            of(s_fenced)
        );
    }
    println!(
        "per-round cycles/s: floor [{}], rslock [{}], fredlock [{}]",
        list(&rates(t_floor)),
        list(&rates(t_rslock)),
        list(&rates(t_healthy))
    );
    if let (Some(f), Some(r), Some(h)) = (cpu(t_floor), cpu(t_rslock), cpu(t_healthy)) {
        println!(
            "(b) client CPU per cycle (this process, all threads; median of rounds): floor {f:.1} µs, rslock {r:.1} µs, fredlock {h:.1} µs ({:.2}x the floor, {:.2}x rslock)",
            h / f,
            h / r
        );
    }
    for (name, t) in [
        ("blackhole", s_silent.third),
        ("silent-after-connect", s_stalled.third),
    ] {
        println!(
            "third node's release vote ({name}): answered {}, pending (still in flight) {}, failed: timeout {}, connection {}, other {}",
            t.answered, t.pending, t.failed_timeout, t.failed_connection, t.failed_other
        );
    }
    println!(
        "(g) per-round cycles/s: single servers [{}], clusters [{}]",
        list(&g_rates(g_single)),
        list(&g_rates(g_cluster))
    );
    let g_cpu = |r: &[Metered]| {
        let v: Option<Vec<f64>> = r.iter().map(|m| m.round.cpu_per_cycle_us).collect();
        v.map(median)
    };
    if let (Some(s), Some(c)) = (g_cpu(g_single), g_cpu(g_cluster)) {
        println!(
            "(g) client CPU per cycle (median of rounds): single servers {s:.1} µs, clusters {c:.1} µs ({:.2}x)",
            c / s
        );
    }
    println!(
        "(g) Redis commands per cycle, by command: single servers: {}; clusters: {}",
        per_cycle(&gs_work, gs_cycles),
        per_cycle(&gc_work, gc_cycles)
    );
    println!("(g) each node's commands by shard (node 1 · node 2 · node 3): {g_shares}");
    println!("(g) kept-alive locks, each node's commands by shard: {k_shares}");
    if keep.lost > 0 || g_keep.lost > 0 {
        println!(
            "(d), (g) WARNING: kept-alive locks were lost ({} of {} on single servers, acquired in {:.1} s; {} of {} on clusters, acquired in {:.1} s): this process could not extend them in time (is the machine overloaded?), so their commands/s are below the steady rate",
            keep.lost,
            keep.locks,
            keep.acquired_in.as_secs_f64(),
            g_keep.lost,
            g_keep.locks,
            g_keep.acquired_in.as_secs_f64()
        );
    }
    println!(
        "(d), (g) extension rounds per kept-alive lock over the two-TTL window (3 expected): single servers {:.2}, clusters {:.2}",
        keep.extensions_per_lock, g_keep.extensions_per_lock
    );
    println!(
        "(g) these {nproc} cores run the client, the 3 single servers and the 9 shards together: the cluster row shows how evenly the shards share the commands and what routing by slot costs the client, not a speed-up (on their own machines, each shard would bring its own core)"
    );
}

fn print_capacity(r: &Results) {
    let Results {
        keep,
        clusters,
        run,
        measured_for,
        blackhole_connections,
        ..
    } = r;
    let Clusters {
        idle_single,
        idle_shards,
        g_keep,
        saturation,
        ..
    } = clusters;
    let G {
        cs,
        d_per,
        g_per,
        us_single,
        us_shard,
        net_single,
        net_shard,
        ..
    } = g_figures(r);

    let ttl_s = keep.ttl.as_secs_f64();
    println!("(h) capacity inputs, from this run:");
    println!(
        "  - a lock cycle (acquire+release, one key): {cs:.1} Redis commands over the 3 nodes, {:.1} per node",
        cs / 3.0
    );
    println!(
        "  - a held lock with keep-alive (extended every 2/3 of the TTL; 3 nodes x 3 commands per round = 13.5 / TTL in s expected): {d_per:.2} commands/s over the 3 nodes at TTL {ttl_s:.0} s on single servers ({} lost), {g_per:.2} on clusters ({} lost), i.e. {:.1} and {:.1} / TTL in s per node",
        keep.lost,
        g_keep.lost,
        d_per * ttl_s / 3.0,
        g_per * g_keep.ttl.as_secs_f64() / 3.0
    );
    println!(
        "  - redis-server CPU per command under fredlock's traffic in (g), net of idle use: {net_single:.2} µs on a single server, {net_shard:.2} µs on a cluster shard, i.e. {:.0} and {:.0} commands/s per fully busy core (gross: {us_single:.2} and {us_shard:.2} µs; idle: {:.1} ms/s for the 3 single servers, {:.1} ms/s for the 9 shards)",
        1e6 / net_single,
        1e6 / net_shard,
        idle_single * 1e3,
        idle_shards * 1e3
    );
    println!(
        "  - pipelined (the loader): {:.2} µs per command, {:.0} commands/s at {:.0}% of a core, i.e. {:.0} commands/s per fully busy core",
        saturation.cpu_per_command_us,
        saturation.commands_per_second,
        saturation.busy * 100.0,
        1e6 / saturation.cpu_per_command_us
    );
    println!(
        "  - memory per held lock: {:.0} B per node on single servers, {:.0} B per cluster node (keys of {} bytes, 32-character tokens); {} in the holding process",
        keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock,
        format!("fredlock:{run}:keep:1234").len(),
        keep.bytes_per_lock
            .map_or("n/a".to_string(), |b| format!("{b:.0} B"))
    );
    println!(
        "measured in {:.1} s (blackhole accepted {} connections)",
        measured_for.as_secs_f64(),
        blackhole_connections
    );
}

/// (b): `TASKS` tasks cycling on own keys, for floor, rslock and fredlock (in that order), in
/// interleaved rounds after a warm-up of each.
async fn throughput_b(targets: [&Target; 3], plan: &Plan, prefix: &str) -> [Vec<Throughput>; 3] {
    for target in targets {
        throughput_round(target, prefix, plan.throughput_warmup, false).await;
    }
    let mut out: [Vec<Throughput>; 3] = Default::default();
    for round in 0..plan.throughput_rounds {
        // Each variant goes first, second and third in turn.
        let mut order = [0, 1, 2];
        order.rotate_left(round % 3);
        for which in order {
            let t = throughput_round(targets[which], prefix, plan.throughput_round, false).await;
            out[which].push(t);
        }
    }
    out
}

fn rslock_target(urls: &[String]) -> Target {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    // Own keys, so contention never retries; a retry would only show up as a failure.
    manager.set_retry(3, Duration::from_millis(5));
    Target::Rslock(Arc::new(manager))
}

/// `-- --serial`: the serial rows on both runtimes and node-redlock, then (b), nothing else.
async fn serial_only(urls: &[String], run: &str, plan: &Plan) {
    let serial = serial::measure(urls, run, plan.warmup_cycles, plan.rounds, plan.cycles).await;
    let floor = Target::Floor(Arc::new(Floor::connect(urls).await));
    let rslock = rslock_target(urls);
    let healthy = Target::Fredlock(redlock(urls.to_vec(), None).await);
    let load_before = loadavg();
    let prefix = format!("{run}:tput");
    let [tf, tr, th] = throughput_b([&floor, &rslock, &healthy], plan, &prefix).await;
    let load_after = loadavg();
    println!();
    serial.print(plan.rounds, plan.cycles);
    let rates = |t: &[Throughput]| median(t.iter().map(|t| t.per_second).collect());
    let cpu = |t: &[Throughput]| {
        let v: Option<Vec<f64>> = t.iter().map(|t| t.cpu_per_cycle_us).collect();
        v.map_or("n/a".to_string(), |v| format!("{:.1}", median(v)))
    };
    let (f, r, h) = (rates(&tf), rates(&tr), rates(&th));
    println!("(b) {TASKS} tasks, own keys, multi-thread runtime, median of {} rounds (load average before {load_before}, after {load_after}):", plan.throughput_rounds);
    println!(
        "| cycles/s | floor {f:.0} | rslock {r:.0} | fredlock {h:.0} | fredlock / floor {:.3} | fredlock / rslock {:.3} | client CPU µs per cycle: floor {}, rslock {}, fredlock {} |",
        h / f,
        h / r,
        cpu(&tf),
        cpu(&tr),
        cpu(&th)
    );
}

fn main() {
    if support::fleet::run_if_child() {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(bench());
}

async fn bench() {
    if run_if_child().await {
        return;
    }
    let plan = parse_args();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match args.is_empty() {
        true => "cargo run --release --example bench".to_string(),
        false => format!("cargo run --release --example bench -- {}", args.join(" ")),
    };
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let redis_version = command_output("redis-server", &["--version"]);
    let date = command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]);
    let git = command_output("git", &["describe", "--always", "--dirty"]);
    if cfg!(debug_assertions) {
        eprintln!("bench: WARNING: a debug build; numbers are meaningless without --release");
    }

    // Nodes: FREDLOCK_NODES when it names 3, local redis-server processes otherwise. The
    // silent-node rows always need a local listener / proxy, which work in front of any node.
    let nodes = testkit::from_env_or_start(3)
        .await
        .expect("start 3 local redis-server nodes (is redis-server on PATH?)");
    let urls = nodes.urls();

    // Keys unique to this run: leftovers of an aborted run on external nodes (alive for a TTL)
    // cannot make an acquire wait or fail.
    let run = format!("bench:{}", std::process::id());
    if plan.serial_only {
        println!("machine: nproc={nproc}, {redis_version}, {date}");
        println!("fredlock {} (git {git})", env!("CARGO_PKG_VERSION"));
        println!("command: `{command}`");
        serial_only(&urls, &run, &plan).await;
        return;
    }
    if plan.fleet_only {
        println!("machine: nproc={nproc}, {redis_version}, {date}");
        println!("fredlock {} (git {git})", env!("CARGO_PKG_VERSION"));
        println!("command: `{command}`");
        support::fleet::table::measure(&urls, &run, &plan.fleet)
            .await
            .print(nproc);
        return;
    }
    let targets = targets(&nodes, &urls, &run).await;
    let run_started = Instant::now();
    let load_before = loadavg();
    let mixed = mixed_rounds(&targets, &plan, &run).await;
    // The serial rows on both runtimes, with node-redlock.
    let serial = serial::measure(&urls, &run, plan.warmup_cycles, plan.rounds, plan.cycles).await;
    // (b) throughput, interleaved rounds as well.
    let tput_prefix = format!("{run}:tput");
    let [t_floor, t_rslock, t_healthy] = throughput_b(
        [&targets.floor, &targets.rslock, &targets.healthy],
        &plan,
        &tput_prefix,
    )
    .await;
    // (f) 16 contenders on a semaphore of 4 permits.
    let sem_rounds: Vec<SemaphoreRound> = {
        let mut v = Vec::new();
        semaphore_round(&urls, &format!("{run}:sem"), plan.throughput_warmup).await;
        for _ in 0..plan.throughput_rounds {
            v.push(semaphore_round(&urls, &format!("{run}:sem"), plan.throughput_round).await);
        }
        v
    };
    // (d) 10,000 locks kept alive at once from this process.
    let keep = keep_alive_load(
        redlock(urls.clone(), None).await,
        Meter::Clients,
        &format!("{run}:keep"),
        plan.keep_locks,
        plan.keep_ttl,
    )
    .await;

    let clusters = cluster_rows(&nodes, &plan, &run).await;
    // (w) 16 waiters on one key; (k) the batched keep-alive children; (n) N = 3, 5, 7.
    let waited = waiter_rounds(&urls, &plan, &run).await;
    let kept = keepalive_rounds(&urls, &plan, &run).await;
    let scaled = scaling_rounds(&plan, &run).await;
    let load_after = loadavg();
    let results = Results {
        nproc,
        redis_version,
        date,
        git,
        command,
        where_: targets.where_.clone(),
        blackhole_connections: targets.blackhole.connections(),
        run: run.clone(),
        load_before,
        load_after,
        measured_for: run_started.elapsed(),
        mixed,
        serial,
        t_floor,
        t_rslock,
        t_healthy,
        sem_rounds,
        keep,
        clusters,
        waited,
        kept,
        scaled,
    };
    print_header(&results, &plan);
    print_summary(&results, &plan);
    print_details(&results);
    print_details_capacity(&results);
    print_spread(&results);
    print_capacity(&results);
    // The fleet table last: its children are processes of their own.
    support::fleet::table::measure(&urls, &run, &plan.fleet)
        .await
        .print(nproc);
}
