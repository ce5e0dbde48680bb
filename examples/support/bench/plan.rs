//! How much the bench measures: [`Plan`] (full or `--quick`) and the command line that picks it.
//! Must not measure anything.
use std::time::Duration;

use crate::support;
use crate::support::fleet::Work;

/// How much to measure: the full run, or `--quick` (`make bench BENCH_ARGS=--quick`).
pub(crate) struct Plan {
    /// Serial cycles run by each variant before any measurement.
    pub(crate) warmup_cycles: usize,
    /// Interleaved rounds of the serial measurements.
    pub(crate) rounds: usize,
    /// Serial cycles per variant per round.
    pub(crate) cycles: usize,
    /// Throughput: warm-up time per variant, then `throughput_rounds` interleaved rounds of
    /// `throughput_round` each per variant.
    pub(crate) throughput_warmup: Duration,
    pub(crate) throughput_rounds: usize,
    pub(crate) throughput_round: Duration,
    /// TTL of the kept-alive locks of (d) and (g); each is measured over two TTLs.
    pub(crate) keep_ttl: Duration,
    /// (g) Locks kept alive on the clusters.
    pub(crate) cluster_kept: usize,
    /// (h) How long the loader saturates one server (after a warm-up of a fifth of that).
    pub(crate) saturation: Duration,
    /// (d) Locks kept alive in-process (the single-server baseline of (g)).
    pub(crate) keep_locks: usize,
    /// (w) 16 waiters on one key: rounds and seconds per variant per round.
    pub(crate) waiter_rounds: usize,
    pub(crate) waiter_secs: f64,
    /// (k) batched keep-alive children: locks, TTL, rounds (each variant a child per round).
    pub(crate) keepalive_locks: usize,
    pub(crate) keepalive_ttl: Duration,
    pub(crate) keepalive_rounds: usize,
    /// (n) serial cycles per variant per round for N = 3, 5, 7.
    pub(crate) n_cycles: usize,
    /// The fleet table (P child processes on one lock); `--fleet-only` runs only that.
    pub(crate) fleet: support::fleet::table::Plan,
    pub(crate) fleet_only: bool,
    /// Only the serial rows on both runtimes (with node-redlock) and (b).
    pub(crate) serial_only: bool,
}

impl Plan {
    pub(crate) fn full() -> Plan {
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

    pub(crate) fn quick() -> Plan {
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

pub(crate) fn parse_args() -> Plan {
    let usage =
        "usage: cargo run --release --example bench [-- [--quick] [--fleet-only] [--fleet-work mutex|semaphore|election] [--serial] [--keepalive-locks N]]";
    let mut plan = Plan::full();
    let (mut locks, mut fleet_only, mut serial_only) = (None, false, false);
    let mut works = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => plan = Plan::quick(),
            "--fleet-only" => fleet_only = true,
            "--serial" => serial_only = true,
            "--fleet-work" => match args.next().as_deref().and_then(Work::parse) {
                Some(w) => works = Some(vec![w]),
                None => {
                    eprintln!("bench: --fleet-work wants mutex, semaphore or election\n{usage}");
                    std::process::exit(2);
                }
            },
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
    if let Some(works) = works {
        plan.fleet.works = works;
    }
    plan.fleet_only = fleet_only;
    plan.serial_only = serial_only;
    plan
}
