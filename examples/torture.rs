//! The fault-injection torture run with its safety checker, for N = 3 and N = 5, and for N = 3
//! Redis Clusters of 3 shards each, plus the negative controls that prove the checker can see a
//! violation.
//!
//! ```text
//! make torture SECS=600 SEED=12345        # seven runs of 85 s (the last: fleet), then the controls
//! cargo run --release --example torture -- --secs 120 --seed 7
//! cargo run --release --example torture -- --secs 60 --nodes 5 --clients 6 --resources 2
//! cargo run --release --example torture -- --mode cluster-plain --secs 120 --seed 7
//! ```
//!
//! `--mode` picks the runs: `plain` (plain nodes), `fencing` (plain nodes, fencing mode: durable
//! nodes, fenced locks and registers), `both` (those two), `cluster-plain` and
//! `cluster-fencing` (every node a Redis Cluster of `--shards` shards, 3 by default: the shards
//! are killed, frozen, have their connections reset and their slots migrated, see
//! `TortureConfig::cluster_shards`), `cluster` (those two), `fleet` (32 clients, each its own
//! `Redlock`, waiting for 3 hot resources under every fault, with liveness rows judged against
//! a floor client of the same run, then the liveness controls: a thundering-herd strawman that
//! must be flagged and fredlock polling that must not; see `TortureConfig::fleet`), and `all`
//! (the five; the default). Every mode ends with the election mode (candidates and observers,
//! with its control) and the failover mode (every node a Sentinel group, failed over at random
//! while clients contend with confirmed votes, with its control); `election` and `failover` run
//! only that, for the whole `--secs`.
//! Without `--nodes`, plain nodes run with 3 nodes and with 5, clusters with 3; the time is split
//! evenly between the runs. Semaphore permits are part of every run. Without
//! `--clients`/`--resources`, 40 clients share 30 resources (about 10,000 checked grants a
//! minute on 2 cores); `--profile` prints where the clients' time went. Without
//! `--seed`, a random seed is drawn and printed. A seed replays the same fault schedule and the
//! same per-client sequences of operations (not the same timing); the report prints the exact
//! command. Exit code: 0 when no run found a violation and every negative control behaved, 1
//! otherwise, 2 when a run could not be set up (for example redis-server is missing).

use std::process::ExitCode;
use std::time::Duration;

use fredlock_testkit::torture::{self, TortureConfig};

/// Clients and resources of a long run: enough contention and throughput to check 100,000
/// grants in 10 minutes, few enough that the 2-core machine's timers stay on time.
const LONG_RUN_CLIENTS: usize = 40;
const LONG_RUN_RESOURCES: usize = 30;
/// The liveness controls: as many clients as the fleet run, on 2 hot resources (as the test's
/// controls), each contender for this long. On the fleet's 3 resources the herd strawman came
/// out at 0.45x its floor in a release run, against the flag at 0.5x: flagged, with no margin.
const FLEET_CLIENTS: usize = 32;
const CONTROL_RESOURCES: usize = 2;
const FLEET_CONTROL: Duration = Duration::from_secs(10);

struct Args {
    secs: u64,
    seed: Option<u64>,
    nodes: Option<usize>,
    clients: Option<usize>,
    resources: Option<usize>,
    /// Print where the clients' time went, by operation kind.
    profile: bool,
    /// The clients poll (`wake_on_release(false)`).
    no_wake: bool,
    /// Which kinds of run: (cluster nodes, fencing).
    modes: Vec<(bool, bool)>,
    /// Also the fleet run and its liveness controls.
    fleet: bool,
    /// Shards per cluster node.
    shards: usize,
    /// `--mode` as given, for the replay command.
    mode_name: Option<String>,
}

/// The command that replays every run of this invocation with `seed`.
fn replay_all(args: &Args, seed: u64) -> String {
    let mut cmd = format!(
        "cargo run --release --example torture -- --secs {} --seed {seed}",
        args.secs
    );
    let options = [
        ("--nodes", args.nodes.map(|n| n.to_string())),
        ("--clients", args.clients.map(|k| k.to_string())),
        ("--resources", args.resources.map(|m| m.to_string())),
        ("--mode", args.mode_name.clone()),
        (
            "--shards",
            (args.shards != 3).then(|| args.shards.to_string()),
        ),
    ];
    for (flag, value) in options {
        if let Some(v) = value {
            cmd.push_str(&format!(" {flag} {v}"));
        }
    }
    if args.no_wake {
        cmd.push_str(" --no-wake");
    }
    cmd
}

const USAGE: &str =
    "usage: torture [--secs N] [--seed S] [--nodes 3|5] [--clients K] [--resources M] [--mode all|both|plain|fencing|cluster|cluster-plain|cluster-fencing|fleet|election|failover] [--shards S] [--profile] [--no-wake]";

/// Plain nodes without and with fencing.
const PLAIN_MODES: [(bool, bool); 2] = [(false, false), (false, true)];
/// Cluster nodes without and with fencing.
const CLUSTER_MODES: [(bool, bool); 2] = [(true, false), (true, true)];

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        secs: 60,
        seed: None,
        nodes: None,
        clients: None,
        resources: None,
        profile: false,
        no_wake: false,
        modes: PLAIN_MODES.into_iter().chain(CLUSTER_MODES).collect(),
        fleet: true,
        shards: 3,
        mode_name: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--profile" {
            args.profile = true;
            continue;
        }
        if flag == "--no-wake" {
            args.no_wake = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let number = |what: &str| -> Result<u64, String> {
            value
                .parse::<u64>()
                .map_err(|_| format!("{what}: {value:?} is not a non-negative integer"))
        };
        match flag.as_str() {
            "--secs" => args.secs = number("--secs")?,
            // Empty (as `make torture SEED=` passes it) means random.
            "--seed" if value.is_empty() => args.seed = None,
            "--seed" => args.seed = Some(number("--seed")?),
            "--nodes" => {
                let n = number("--nodes")? as usize;
                if n < 3 || n % 2 == 0 {
                    return Err(format!("--nodes must be odd and at least 3, not {n}"));
                }
                args.nodes = Some(n);
            }
            "--clients" => args.clients = Some((number("--clients")? as usize).max(1)),
            "--resources" => args.resources = Some((number("--resources")? as usize).max(1)),
            "--mode" => {
                args.mode_name = Some(value.clone());
                args.fleet = matches!(value.as_str(), "all" | "fleet");
                args.modes = match value.as_str() {
                    "fleet" => Vec::new(),
                    "all" => PLAIN_MODES.into_iter().chain(CLUSTER_MODES).collect(),
                    "both" => PLAIN_MODES.to_vec(),
                    "plain" => vec![(false, false)],
                    "fencing" => vec![(false, true)],
                    "cluster" => CLUSTER_MODES.to_vec(),
                    "cluster-plain" => vec![(true, false)],
                    "cluster-fencing" => vec![(true, true)],
                    "election" | "failover" => Vec::new(),
                    other => {
                        return Err(format!(
                            "--mode must be all, both, plain, fencing, cluster, cluster-plain, cluster-fencing, fleet, election or failover, not {other:?}"
                        ))
                    }
                }
            }
            "--shards" => {
                let s = number("--shards")? as usize;
                if s < 3 {
                    // With fewer, a shard down leaves the others in the minority of the
                    // cluster, which then refuses every key.
                    return Err(format!("--shards must be at least 3, not {s}"));
                }
                args.shards = s;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.secs < 5 {
        return Err("--secs must be at least 5".into());
    }
    Ok(args)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("torture: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if cfg!(debug_assertions) {
        eprintln!("torture: a debug build; use --release for long runs");
    }
    let seed = args.seed.unwrap_or_else(torture::random_seed);
    if args.mode_name.as_deref() == Some("failover") {
        println!(
            "torture: seed {seed}, the failover mode only, {} s",
            args.secs
        );
        return match failover(seed, Duration::from_secs(args.secs)).await {
            true => ExitCode::from(1),
            false => ExitCode::SUCCESS,
        };
    }
    if args.mode_name.as_deref() == Some("election") {
        println!(
            "torture: seed {seed}, the election mode only, {} s",
            args.secs
        );
        return match election(seed, Duration::from_secs(args.secs)).await {
            true => ExitCode::from(1),
            false => ExitCode::SUCCESS,
        };
    }
    let (configs, per_run) = configs(&args, seed);
    let labels: Vec<String> = configs.iter().map(TortureConfig::label).collect();
    println!(
        "torture: seed {seed}, {} s per run, runs {labels:?} (replay all: `{}`)",
        per_run.as_secs(),
        replay_all(&args, seed)
    );
    let any_cluster = configs.iter().any(|c| c.cluster_shards.is_some());
    let Some(reports) = run_all(&args, configs, per_run).await else {
        return ExitCode::from(2);
    };
    let Some((controls, liveness)) = controls(&args, any_cluster).await else {
        return ExitCode::from(2);
    };
    println!("{}", torture::markdown(&reports, &controls));
    if !liveness.is_empty() {
        println!("{}", torture::liveness_markdown(&liveness));
    }
    let violations: usize = reports.iter().map(|r| r.violations()).sum();
    let failed_controls =
        controls.iter().filter(|c| !c.pass).count() + liveness.iter().filter(|c| !c.pass).count();
    println!(
        "torture: seed {seed}: {violations} violation(s) in the main runs, {failed_controls} negative control(s) failed"
    );
    let election_failed = election(seed, per_run).await;
    let failover_failed = failover(seed, per_run).await;
    if violations > 0 || failed_controls > 0 || election_failed || failover_failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The runs of this invocation, and the time each gets: plain nodes first (N = 3, then 5; each
/// without, then with fencing), then clusters, then the fleet run.
fn configs(args: &Args, seed: u64) -> (Vec<TortureConfig>, Duration) {
    let plain_counts = args.nodes.map_or(vec![3, 5], |n| vec![n]);
    let cluster_counts = args.nodes.map_or(vec![3], |n| vec![n]);
    let mut runs: Vec<(usize, (bool, bool))> = Vec::new();
    for &n in &plain_counts {
        runs.extend(args.modes.iter().filter(|m| !m.0).map(|&m| (n, m)));
    }
    for &n in &cluster_counts {
        runs.extend(args.modes.iter().filter(|m| m.0).map(|&m| (n, m)));
    }
    let per_run = Duration::from_secs(args.secs / (runs.len() + usize::from(args.fleet)) as u64);
    let mut configs: Vec<TortureConfig> = runs
        .iter()
        .map(|&(n, (cluster, fencing))| {
            let mut config = TortureConfig::new(n, seed, per_run);
            if cluster {
                config = config.on_clusters(args.shards);
            }
            config.fencing = fencing;
            config.wake_on_release = !args.no_wake;
            config.clients = args.clients.unwrap_or(LONG_RUN_CLIENTS);
            config.resources = args.resources.unwrap_or(LONG_RUN_RESOURCES);
            config
        })
        .collect();
    if args.fleet {
        let mut fleet = TortureConfig::fleet(args.nodes.unwrap_or(3), seed, per_run);
        fleet.clients = args.clients.unwrap_or(fleet.clients);
        fleet.resources = args.resources.unwrap_or(fleet.resources);
        fleet.wake_on_release = !args.no_wake;
        configs.push(fleet);
    }
    (configs, per_run)
}

/// Every run, one after the other; `None` when one could not run (said on stderr).
async fn run_all(
    args: &Args,
    configs: Vec<TortureConfig>,
    per_run: Duration,
) -> Option<Vec<torture::Report>> {
    let mut reports = Vec::new();
    for config in configs {
        let label = config.label();
        eprintln!(
            "torture: {label}, K={}, M={}, {} s ...",
            config.clients,
            config.resources,
            per_run.as_secs()
        );
        match torture::run(config).await {
            Ok(report) => {
                eprintln!(
                    "torture: {label}: {} grants, {} violations",
                    report.stats.granted,
                    report.violations()
                );
                if args.profile {
                    print_profile(&report.stats);
                }
                reports.push(report);
            }
            Err(e) => {
                eprintln!("torture: {label} could not run: {e}");
                return None;
            }
        }
    }
    Some(reports)
}

/// `--profile`: where the clients' time went, by operation kind.
fn print_profile(stats: &torture::Stats) {
    let total: Duration = stats.op_time.values().sum();
    for ((kind, granted), d) in &stats.op_time {
        eprintln!(
            "  {kind:>20} {:>5} {:>8.1} s {:>5.1}%",
            if *granted { "grant" } else { "none" },
            d.as_secs_f64(),
            100.0 * d.as_secs_f64() / total.as_secs_f64()
        );
    }
    eprintln!("  ops {:?}", stats.ops);
}

/// The negative controls (with the cluster ones after a cluster run), and the liveness controls
/// after a fleet run; `None` when the liveness controls could not run (said on stderr).
async fn controls(
    args: &Args,
    any_cluster: bool,
) -> Option<(Vec<torture::ControlResult>, Vec<torture::LivenessControl>)> {
    eprintln!("torture: negative controls ...");
    let mut controls = torture::negative_controls().await;
    if any_cluster {
        controls.extend(torture::cluster_controls(args.shards).await);
    }
    if !args.fleet {
        return Some((controls, Vec::new()));
    }
    eprintln!("torture: liveness controls ...");
    match torture::liveness_controls(FLEET_CLIENTS, CONTROL_RESOURCES, FLEET_CONTROL).await {
        Ok(liveness) => Some((controls, liveness)),
        Err(e) => {
            eprintln!("torture: the liveness controls could not run: {e}");
            None
        }
    }
}

/// The election mode: candidates and observers, with its own control. Prints its line;
/// returns whether it failed.
async fn election(seed: u64, per_run: Duration) -> bool {
    let election = torture::election::ElectionConfig::new(seed, per_run);
    eprintln!("torture: election mode, {} s ...", per_run.as_secs());
    let (failed, line) = match torture::election::run(election).await {
        Ok(r) => (
            !r.violations.is_empty() || !r.control_caught(),
            format!(
                "torture: election mode: {} terms, {} fault episodes, {} observer changes, {} named terms nobody held, {} violation(s); never-resyncing observer caught: {}{}",
                r.terms,
                r.episodes,
                r.observed,
                r.unheld,
                r.violations.len(),
                r.control_caught(),
                r.violations.first().map_or(String::new(), |v| format!("; first: {v}"))
            ),
        ),
        Err(e) => (true, format!("torture: election mode could not run: {e}")),
    };
    println!("{line}");
    failed
}

/// The failover mode: Sentinel groups failed over under contending clients with confirmed
/// votes, then its control. Prints its line; returns whether it failed.
async fn failover(seed: u64, per_run: Duration) -> bool {
    let config = torture::failover::FailoverConfig::new(seed, per_run);
    eprintln!("torture: failover mode, {} s ...", per_run.as_secs());
    let (failed, line) = match torture::failover::run(config).await {
        Ok(r) => (
            !r.violations.is_empty() || !r.control_caught(),
            format!(
                "torture: failover mode: {} grants, {} acquires unavailable, failovers: {} killed, {} frozen, {} held back, {} two groups at once; {} violation(s); control: {} overlap(s) and {} fencing token(s) out of order without confirmation, first holder refused with it: {}{}",
                r.grants,
                r.unavailable,
                r.episodes[0],
                r.episodes[1],
                r.episodes[2],
                r.episodes[3],
                r.violations.len(),
                r.control_overlaps,
                r.control_fencing,
                r.control_confirmed_refused,
                r.violations.first().map_or(String::new(), |v| format!("; first: {v:?}"))
            ),
        ),
        Err(e) => (true, format!("torture: failover mode could not run: {e}")),
    };
    println!("{line}");
    failed
}
