//! What holding many locks with keep-alive costs: the batched renewer (the default) against a
//! task per lock (`KeepAliveOptions::batched(false)`, the path before batching), in one run.
//!
//! ```text
//! cargo run --release --example bench_keepalive [-- --locks 10000 --ttl-ms 6000 --rounds 3]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`). Each round runs
//! three children one after the other (the order alternates between rounds), each a FRESH
//! PROCESS of this example, so that one variant's freed memory cannot be reused by another and
//! the memory figures are those of a process that only did this. A keep-alive child:
//! 1. connects (a Redlock over the nodes) and notes its resident memory and live heap;
//! 2. acquires `--locks` locks (256 acquires at a time) and keeps each alive with its variant as
//!    soon as it is acquired (as row (d) of `make bench` does, docs/benchmarks.md);
//! 3. notes memory again: (after - before) / locks is the memory per held lock, as resident
//!    memory (RSS, what row (d) reports), as RSS after handing the allocator's free memory back
//!    to the OS (glibc `malloc_trim`, on both ends), and as live heap bytes (a counting
//!    allocator): RSS also holds what the acquire phase allocated and freed;
//! 4. for a window of 2 TTLs (every lock is extended about three times), measures on every node
//!    (INFO commandstats and INFO cpu, deltas over the window): the scripts the client sent
//!    (`EVALSHA` + `EVAL` calls: one per round trip), every command Redis ran (calls inside
//!    scripts included, the bench's own INFO excluded), the nodes' CPU time (user + sys) and the
//!    time the scripts ran; and its own CPU time;
//! 5. counts the locks lost (must be 0), then releases everything.
//!
//! The third child acquires the same number of locks the same way WITHOUT keep-alive and only
//! notes its memory: what a held lock costs anyway, so that the keep-alive's own share shows.
//!
//! The parent prints one markdown table: medians over rounds, the ratio before / batched, the
//! keep-alive targets (round trips, node CPU, memory per held lock), and the machine's load
//! before and after (`/proc/loadavg`).
//! The nodes' idle CPU (their own timers, measured for 5 s before the rounds) is printed too,
//! and subtracted in the "above idle" row.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fredlock::Redlock;
use fredlock_testkit as testkit;
use support::keepalive::{node_stats, run_child, run_if_child, ChildSpec, Sample, Variant};
use support::{command_output, loadavg, median};

struct Args {
    locks: usize,
    ttl: Duration,
    rounds: usize,
    window: Option<Duration>,
}

fn parse_args() -> Args {
    let mut args = Args {
        locks: 10_000,
        ttl: Duration::from_secs(6),
        rounds: 3,
        window: None,
    };
    let mut it = std::env::args().skip(1);
    let usage = "usage: bench_keepalive [--locks N] [--ttl-ms MS] [--rounds R] [--window-ms MS]";
    let number = |v: Option<String>| -> u64 {
        v.and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("{usage}");
            std::process::exit(2)
        })
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--locks" => args.locks = number(it.next()) as usize,
            "--ttl-ms" => args.ttl = Duration::from_millis(number(it.next())),
            "--rounds" => args.rounds = number(it.next()).max(1) as usize,
            "--window-ms" => args.window = Some(Duration::from_millis(number(it.next()))),
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => {
                eprintln!("bench_keepalive: unknown argument {other:?}\n{usage}");
                std::process::exit(2);
            }
        }
    }
    args
}

#[tokio::main]
async fn main() {
    if run_if_child().await {
        return;
    }
    let args = parse_args();
    if cfg!(debug_assertions) {
        eprintln!("bench_keepalive: WARNING: a debug build; run with --release");
    }
    let load_before = loadavg();
    let nodes = testkit::from_env_or_start(3)
        .await
        .expect("start 3 local redis-server nodes (is redis-server on PATH?)");
    let urls = nodes.urls();
    // The nodes' idle CPU: what they spend with no lock at all (their own timers).
    let idle_cpu_per_s = {
        let redlock = Redlock::builder()
            .nodes(urls.clone())
            .build()
            .await
            .expect("build");
        let a = node_stats(&redlock).await;
        let t = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let d = node_stats(&redlock).await.minus(a);
        let per_s = d.cpu / t.elapsed().as_secs_f64();
        redlock.close().await;
        per_s
    };
    let run = format!("bench-keepalive:{}", std::process::id());
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [Variant::PerLock, Variant::Batched, Variant::Plain]
        } else {
            [Variant::Plain, Variant::Batched, Variant::PerLock]
        };
        for variant in order {
            let prefix = format!("{run}:{round}:{}", variant.name());
            let s = run_child(&ChildSpec {
                variant,
                urls: &urls,
                prefix: &prefix,
                locks: args.locks,
                ttl: args.ttl,
                window: args.window.unwrap_or(args.ttl * 2),
            });
            eprintln!(
                "round {round} {:>8}: {:8.1} scripts/s, {:8.1} commands/s, node cpu {:.5} s/lock/min, {:6.0} B RSS/lock, {:6.0} B heap/lock, {} lost",
                variant.name(),
                s.scripts_per_s,
                s.commands_per_s,
                s.node_cpu,
                s.rss_per_lock,
                s.heap_per_lock,
                s.lost
            );
            samples.entry(variant.name()).or_default().push(s);
        }
    }
    let load_after = loadavg();
    let med = |v: Variant, f: &dyn Fn(&Sample) -> f64| {
        median(
            samples
                .get(v.name())
                .map_or(Vec::new(), |s| s.iter().map(f).collect()),
        )
    };
    let lost = |v: Variant| -> u64 {
        samples
            .get(v.name())
            .map_or(0, |s| s.iter().map(|x| x.lost).sum())
    };
    let idle_per_lock_minute = idle_cpu_per_s / args.locks as f64 * 60.0;
    println!();
    println!(
        "machine: nproc={}, {}, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_output("redis-server", &["--version"]),
        command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])
    );
    println!(
        "fredlock {} (git {})",
        env!("CARGO_PKG_VERSION"),
        command_output("git", &["describe", "--always", "--dirty"])
    );
    println!(
        "command: `cargo run --release --example bench_keepalive -- --locks {} --ttl-ms {} --rounds {}`",
        args.locks,
        args.ttl.as_millis(),
        args.rounds
    );
    println!("load average (1, 5, 15 min): before {load_before}; after {load_after}");
    println!(
        "method: {} locks kept alive, TTL {} s, renewed when 1/3 is left; window {} s per child; {} rounds, each variant in a fresh child process, order alternating; medians over rounds",
        args.locks,
        args.ttl.as_secs_f64(),
        args.window.unwrap_or(args.ttl * 2).as_secs_f64(),
        args.rounds
    );
    println!(
        "nodes' idle CPU: {:.4} s/s over 3 nodes ({:.6} s per lock per minute at {} locks)",
        idle_cpu_per_s, idle_per_lock_minute, args.locks
    );
    println!();
    println!(
        "| measurement | per-lock tasks (before) | batched | before / batched | target | met? |"
    );
    println!("|---|---:|---:|---:|---|---|");
    let row = |name: &str,
               f: &dyn Fn(&Sample) -> f64,
               digits: usize,
               target: &str,
               met: &dyn Fn(f64, f64) -> Option<bool>| {
        let (a, b) = (med(Variant::PerLock, f), med(Variant::Batched, f));
        let verdict = match met(a, b) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        println!(
            "| {name} | {a:.digits$} | {b:.digits$} | {:.2} | {target} | {verdict} |",
            a / b
        );
    };
    let none = |_: f64, _: f64| None;
    row(
        "client→node commands/s (EVALSHA + EVAL: round trips)",
        &|s| s.scripts_per_s,
        1,
        "≥ 10x fewer",
        &|a, b| Some(a / b >= 10.0),
    );
    row(
        "Redis commands/s, all nodes (calls inside scripts included)",
        &|s| s.commands_per_s,
        1,
        "—",
        &none,
    );
    row(
        "node CPU s per held lock per minute (3 nodes)",
        &|s| s.node_cpu,
        6,
        "≥ 2x less",
        &|a, b| Some(a / b >= 2.0),
    );
    row(
        "node CPU s per held lock per minute, above idle",
        &|s| s.node_cpu - idle_per_lock_minute,
        6,
        "—",
        &none,
    );
    row(
        "node CPU µs per lock extension (3 nodes)",
        &|s| s.node_cpu_per_extension,
        2,
        "—",
        &none,
    );
    row(
        "memory per held lock, RSS delta (B)",
        &|s| s.rss_per_lock,
        0,
        "≤ 1024 B (batched)",
        &|_, b| Some(b <= 1024.0),
    );
    row(
        "memory per held lock, RSS delta after malloc_trim (B)",
        &|s| s.trimmed_rss_per_lock,
        0,
        "—",
        &none,
    );
    row(
        "memory per held lock, live heap delta (B)",
        &|s| s.heap_per_lock,
        0,
        "≤ 1024 B (batched)",
        &|_, b| Some(b <= 1024.0),
    );
    let (plain_rss, plain_heap) = (
        med(Variant::Plain, &|s| s.rss_per_lock),
        med(Variant::Plain, &|s| s.heap_per_lock),
    );
    row(
        &format!("the keep-alive's own share, RSS: minus {plain_rss:.0} B for a lock without keep-alive (B)"),
        &|s| s.rss_per_lock - plain_rss,
        0,
        "—",
        &none,
    );
    row(
        &format!("the keep-alive's own share, live heap: minus {plain_heap:.0} B (B)"),
        &|s| s.heap_per_lock - plain_heap,
        0,
        "—",
        &none,
    );
    row(
        "client CPU s per held lock per minute",
        &|s| s.client_cpu,
        6,
        "—",
        &none,
    );
    row(
        "locks extended per second",
        &|s| s.extensions_per_s,
        1,
        "—",
        &none,
    );
    row(
        "locks per script call",
        &|s| s.locks_per_script,
        1,
        "—",
        &none,
    );
    row(
        "µs per script call on the node (INFO commandstats)",
        &|s| s.usec_per_script,
        1,
        "—",
        &none,
    );
    let (la, lb) = (lost(Variant::PerLock), lost(Variant::Batched));
    println!(
        "| locks lost, all rounds | {la} | {lb} | — | 0 | {} |",
        if la == 0 && lb == 0 { "yes" } else { "**no**" }
    );
}
