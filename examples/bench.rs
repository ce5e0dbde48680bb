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
//!   against node-redlock (npm `redlock` 5) and redlock-universal 0.8 (each a child `node`
//!   process), and the commands each node runs per uncontended cycle, all in one run (see
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock_testkit::{self as testkit, TestNodes};

#[path = "support/bench/load.rs"]
mod load;
#[path = "support/bench/plan.rs"]
mod plan;
#[path = "support/bench/report.rs"]
mod report;
#[path = "support/bench/report_capacity.rs"]
mod report_capacity;
#[path = "support/bench/rounds.rs"]
mod rounds;
#[path = "support/bench/runs.rs"]
mod runs;
#[path = "support/serial.rs"]
mod serial;
#[path = "support/bench/servers.rs"]
mod servers;
#[path = "support/mod.rs"]
mod support;
#[path = "support/bench/targets.rs"]
mod targets;

use load::keep_alive_load;
use plan::{parse_args, Plan};
use report::{print_details, print_header, print_summary, Results};
use report_capacity::{print_capacity, print_details_capacity, print_spread};
use rounds::{semaphore_round, throughput_b, SemaphoreRound, Throughput};
use runs::{cluster_rows, keepalive_rounds, mixed_rounds, scaling_rounds, targets, waiter_rounds};
use servers::Meter;
use support::keepalive::run_if_child;
use support::{command_output, loadavg, median};
use targets::{redlock, rslock_target, Floor, Target};

/// TTL of every lock. Long enough that nothing expires during a cycle; with fredlock's defaults
/// it also gives the default per-node timeout of 500 ms, the same as (c) sets explicitly.
const TTL: Duration = Duration::from_secs(10);
/// Tasks in the throughput test, each on its own key.
const TASKS: usize = 64;
/// Per-node timeout of the silent-node Redlocks, set explicitly: were fredlock waiting for the
/// silent node, every cycle would take at least this long.
const SILENT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The largest of `rates`, leaving out a missing (`NaN`) one.
fn best_of(rates: &[f64]) -> f64 {
    rates
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::max)
}

/// `-- --serial`: the serial rows on both runtimes and the Node Redlocks, then (b), nothing else.
async fn serial_only(urls: &[String], run: &str, plan: &Plan) {
    let serial = serial::measure(urls, run, plan).await;
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
    let (node, node_name) = serial.best_node_throughput();
    println!("(b) {TASKS} tasks, own keys, multi-thread runtime, median of {} rounds (load average before {load_before}, after {load_after}):", plan.throughput_rounds);
    println!(
        "| cycles/s | floor {f:.0} | rslock {r:.0} | {node_name} {node:.0} | fredlock {h:.0} | fredlock / floor {:.3} | fredlock / rslock {:.3} | fredlock / best of the three {:.3} (target ≥ 1.2) | client CPU µs per cycle: floor {}, rslock {}, fredlock {} |",
        h / f,
        h / r,
        h / best_of(&[f, r, node]),
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

/// What the tables say about this run: the machine, the versions and the command.
struct Facts {
    nproc: usize,
    redis_version: String,
    date: String,
    git: String,
    command: String,
}

impl Facts {
    fn gather() -> Facts {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let command = match args.is_empty() {
            true => "cargo run --release --example bench".to_string(),
            false => format!("cargo run --release --example bench -- {}", args.join(" ")),
        };
        Facts {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            redis_version: command_output("redis-server", &["--version"]),
            date: command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            git: command_output("git", &["describe", "--always", "--dirty"]),
            command,
        }
    }

    /// The header of the `--serial` and `--fleet-only` runs.
    fn print_short(&self) {
        let Facts {
            nproc,
            redis_version,
            date,
            git,
            command,
        } = self;
        println!("machine: nproc={nproc}, {redis_version}, {date}");
        println!("fredlock {} (git {git})", env!("CARGO_PKG_VERSION"));
        println!("command: `{command}`");
    }
}

async fn bench() {
    if run_if_child().await {
        return;
    }
    let plan = parse_args();
    let facts = Facts::gather();
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
    let nproc = facts.nproc;
    if plan.serial_only {
        facts.print_short();
        serial_only(&urls, &run, &plan).await;
        return;
    }
    if plan.fleet_only {
        facts.print_short();
        support::fleet::table::measure(&urls, &run, &plan.fleet)
            .await
            .print(nproc);
        return;
    }
    let results = measure(&nodes, &run, &plan, facts).await;
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

/// The full run: every row but the fleet table, in the order that interleaves best.
async fn measure(nodes: &TestNodes, run: &str, plan: &Plan, facts: Facts) -> Results {
    let urls = nodes.urls();
    let targets = targets(nodes, &urls, run).await;
    let run_started = Instant::now();
    let load_before = loadavg();
    let mixed = mixed_rounds(&targets, plan, run).await;
    // The serial rows on both runtimes, with the Node Redlocks.
    let serial = serial::measure(&urls, run, plan).await;
    // (b) throughput, interleaved rounds as well.
    let tput_prefix = format!("{run}:tput");
    let [t_floor, t_rslock, t_healthy] = throughput_b(
        [&targets.floor, &targets.rslock, &targets.healthy],
        plan,
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

    let clusters = cluster_rows(nodes, plan, run).await;
    // (w) 16 waiters on one key; (k) the batched keep-alive children; (n) N = 3, 5, 7.
    let waited = waiter_rounds(&urls, plan, run).await;
    let kept = keepalive_rounds(&urls, plan, run).await;
    let scaled = scaling_rounds(plan, run).await;
    let load_after = loadavg();
    let Facts {
        nproc,
        redis_version,
        date,
        git,
        command,
    } = facts;
    Results {
        nproc,
        redis_version,
        date,
        git,
        command,
        where_: targets.where_.clone(),
        blackhole_connections: targets.blackhole.connections(),
        run: run.to_string(),
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
    }
}
