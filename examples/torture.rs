//! The fault-injection torture run with its safety checker, for N = 3 and N = 5, plus the
//! negative controls that prove the checker can see a violation.
//!
//! ```text
//! make torture SECS=600 SEED=12345        # both N, 300 s each, then the controls
//! cargo run --release --example torture -- --secs 120 --seed 7
//! cargo run --release --example torture -- --secs 60 --nodes 5 --clients 6 --resources 2
//! ```
//!
//! Without `--nodes`, the time is split between runs on 3 nodes and on 5; without `--mode`,
//! each N runs once without and once with fencing (durable nodes, fenced locks and registers);
//! semaphore permits are part of every run. Without
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

struct Args {
    secs: u64,
    seed: Option<u64>,
    nodes: Option<usize>,
    clients: Option<usize>,
    resources: Option<usize>,
    /// Print where the clients' time went, by operation kind.
    profile: bool,
    /// Which modes run: without fencing, with fencing (durable nodes), or both.
    modes: Vec<bool>,
}

const USAGE: &str =
    "usage: torture [--secs N] [--seed S] [--nodes 3|5] [--clients K] [--resources M] [--mode both|plain|fencing] [--profile]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        secs: 60,
        seed: None,
        nodes: None,
        clients: None,
        resources: None,
        profile: false,
        modes: vec![false, true],
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
                args.modes = match value.as_str() {
                    "both" => vec![false, true],
                    "plain" => vec![false],
                    "fencing" => vec![true],
                    other => {
                        return Err(format!(
                            "--mode must be both, plain or fencing, not {other:?}"
                        ))
                    }
                }
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
    let node_counts = match args.nodes {
        Some(n) => vec![n],
        None => vec![3, 5],
    };
    let runs: Vec<(usize, bool)> = node_counts
        .iter()
        .flat_map(|&n| args.modes.iter().map(move |&f| (n, f)))
        .collect();
    let per_run = Duration::from_secs(args.secs / runs.len() as u64);
    println!(
        "torture: seed {seed}, {} s per run, runs (N, fencing) = {runs:?} (replay all: `cargo run --release --example torture -- --secs {} --seed {seed}`)",
        per_run.as_secs(),
        args.secs
    );
    let mut reports = Vec::new();
    for (n, fencing) in runs {
        let mut config = TortureConfig::new(n, seed, per_run);
        config.fencing = fencing;
        config.clients = args.clients.unwrap_or(LONG_RUN_CLIENTS);
        config.resources = args.resources.unwrap_or(LONG_RUN_RESOURCES);
        eprintln!(
            "torture: N={n}, fencing {fencing}, K={}, M={}, {} s ...",
            config.clients,
            config.resources,
            per_run.as_secs()
        );
        match torture::run(config).await {
            Ok(report) => {
                eprintln!(
                    "torture: N={n}, fencing {fencing}: {} grants, {} violations",
                    report.stats.granted,
                    report.violations()
                );
                if args.profile {
                    let total: Duration = report.stats.op_time.values().sum();
                    for ((kind, granted), d) in &report.stats.op_time {
                        eprintln!(
                            "  {kind:>20} {:>5} {:>8.1} s {:>5.1}%",
                            if *granted { "grant" } else { "none" },
                            d.as_secs_f64(),
                            100.0 * d.as_secs_f64() / total.as_secs_f64()
                        );
                    }
                    eprintln!("  ops {:?}", report.stats.ops);
                }
                reports.push(report);
            }
            Err(e) => {
                eprintln!("torture: N={n} could not run: {e}");
                return ExitCode::from(2);
            }
        }
    }
    eprintln!("torture: negative controls ...");
    let controls = torture::negative_controls().await;
    println!("{}", torture::markdown(&reports, &controls));
    let violations: usize = reports.iter().map(|r| r.violations()).sum();
    let failed_controls = controls.iter().filter(|c| !c.pass).count();
    println!(
        "torture: seed {seed}: {violations} violation(s) in the main runs, {failed_controls} negative control(s) failed"
    );
    if violations > 0 || failed_controls > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
