//! 16 waiters on one key, each holding it 1 ms: polling against wake-ups on release, in one run.
//!
//! ```text
//! cargo run --release --example bench_waiters [-- --quick]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`, whose command
//! statistics it then resets) and prints one markdown table:
//!
//! - acquisitions/s: 16 tasks loop `acquire` (TTL 10 s, retry every 5 ms + up to 5 ms of jitter,
//!   never giving up), hold the lock, `release`, for a fixed time; all acquisitions divided by
//!   the time until the last task finished;
//! - Redis commands per acquisition: `INFO commandstats` summed over the nodes (it counts the
//!   calls inside scripts too: a release is EVAL + GET + DEL, + PUBLISH with wake-ups), after a
//!   `CONFIG RESETSTAT`, without the bench's own INFO and CONFIG calls;
//! - the wait of each acquisition (from the `acquire` call to the lock): p50, p99 and max, and
//!   the fewest and most acquisitions of one task, so that starvation shows;
//! - the hand-over: from the start of a holder's `release` to the next grant (p50), the part of
//!   each cycle that the lock itself costs (a cycle is the hold plus the hand-over).
//!
//! - CPU per acquisition: this process's (client) and the nodes' (INFO cpu), so that the cost of
//!   polling shows even when the rate does not.
//!
//! A third variant has no hand-over window (`Builder::handover_window(Duration::ZERO)`: each
//! hand-over between the tasks is a round). A fourth, an in-process `tokio::sync::Mutex` with
//! the same hold, is the ceiling of the harness: the rate of a lock that costs nothing but a
//! task hand-over.
//!
//! Two holds: `precise` (a blocking 1 ms sleep in `spawn_blocking`, about 1.07 ms here) and
//! `tokio` (`tokio::time::sleep(1 ms)`, which rounds to the timer's millisecond ticks and takes
//! about 2 ms): the hold bounds the rate at 1 / hold, whatever the lock does.
//!
//! Method: the variants take turns within each round (the order alternating between rounds), so
//! a change in the machine's load falls on all of them alike; the table shows the median over
//! rounds of each figure (max: the largest of all rounds).

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use fredlock::Redlock;
use fredlock_testkit as testkit;
use support::waiters::{round, Hold, Series, Target, RETRY, TASKS};
use support::{addr_of, command_output as output};

/// The holds measured: a precise 1 ms, and `tokio::time::sleep(1 ms)`.
const HOLDS: [Hold; 2] = [Hold::Precise, Hold::Tokio];

/// A variant: its name in the table, and what it locks.
type Variant = (&'static str, Target);

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, secs) = if quick { (3, 1.0) } else { (5, 2.0) };
    if cfg!(debug_assertions) {
        eprintln!("note: a debug build; run with --release for figures worth comparing");
    }
    let nodes = testkit::from_env_or_start(3).await.expect("nodes");
    let urls = nodes.urls();
    let mut addrs = Vec::new();
    for u in &urls {
        addrs.push(addr_of(u).await);
    }
    let variants = variants(&urls).await;
    let key = format!("bench:waiters:{:08x}", rand::random::<u32>());
    // Warm-up: connections, scripts, the subscriber connections and the channel.
    for (_, t) in &variants {
        for h in HOLDS {
            round(t, &addrs, &key, h, 0.3).await;
        }
    }
    let load_before = output("uptime", &[]);
    let series = measure(&variants, &addrs, &key, rounds, secs).await;
    let load_after = output("uptime", &[]);
    println!(
        "`cargo run --release --example bench_waiters{}`: 3 nodes ({}), {TASKS} tasks on one key, TTL 10 s, retry 5 ms + 5 ms jitter; {rounds} rounds of {secs} s per variant, interleaved; medians over rounds (max: over all rounds). {} cores; load before: {load_before}; after: {load_after}",
        if quick { " -- --quick" } else { "" },
        output("redis-server", &["--version"]),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!();
    print_table(&variants, &series);
    for (_, target) in &variants {
        if let Target::Redlock(redlock) = target {
            redlock.close().await;
        }
    }
    drop(nodes);
}

/// fredlock polling, fredlock with wake-ups, the same with no hand-over window (every
/// hand-over inside the process is a round), and an in-process mutex as the ceiling.
async fn variants(urls: &[String]) -> [Variant; 4] {
    let build = |wake: bool, window: Duration| {
        Redlock::builder()
            .nodes(urls.to_vec())
            .retry(RETRY)
            .wake_on_release(wake)
            .handover_window(window)
            .build()
    };
    let window = fredlock::config::DEFAULT_HANDOVER_WINDOW;
    let polling = build(false, window).await.expect("build");
    let waking = build(true, window).await.expect("build");
    let rounds = build(true, Duration::ZERO).await.expect("build");
    [
        ("polling", Target::Redlock(polling)),
        ("wake-ups", Target::Redlock(waking)),
        (
            "wake-ups, no hand-over window (a round per hand-over)",
            Target::Redlock(rounds),
        ),
        (
            "in-process tokio Mutex (ceiling, no Redis)",
            Target::Local(Arc::new(tokio::sync::Mutex::new(()))),
        ),
    ]
}

/// The rounds: per hold, each variant in turn (the order alternating between rounds).
/// Returns the series by hold, then by variant.
async fn measure(
    variants: &[Variant],
    addrs: &[std::net::SocketAddr],
    key: &str,
    rounds: usize,
    secs: f64,
) -> Vec<Vec<Series>> {
    let mut series: Vec<Vec<Series>> = HOLDS
        .iter()
        .map(|_| variants.iter().map(|_| Series::default()).collect())
        .collect();
    for r in 0..rounds {
        for (h, hold) in HOLDS.iter().enumerate() {
            let order: Vec<usize> = if r % 2 == 0 {
                vec![0, 1, 2, 3]
            } else {
                vec![3, 2, 1, 0]
            };
            for v in order {
                let got = round(&variants[v].1, addrs, key, *hold, secs).await;
                eprintln!(
                    "round {r} {} {}: {:.0} acq/s, {:.1} commands/acq, wait p50 {:.0} us p99 {:.0} us, hand-over p50 {:.0} us",
                    hold.name(),
                    variants[v].0,
                    got.per_second,
                    got.commands_per_acquisition,
                    got.p50_us,
                    got.p99_us,
                    got.handover_us
                );
                series[h][v].0.push(got);
            }
        }
    }
    series
}

/// One row per hold and variant, then wake-ups against polling per hold.
fn print_table(variants: &[Variant], series: &[Vec<Series>]) {
    println!("| hold (measured) | variant | acquisitions/s | Redis commands / acquisition | wait p50 | wait p99 | wait max | hand-over p50 | acquisitions per task (fewest-most) | CPU / acquisition: client, nodes |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|---|");
    for (h, hold) in HOLDS.iter().enumerate() {
        for (v, (name, _)) in variants.iter().enumerate() {
            let s = &series[h][v];
            println!(
                "| {} ({:.2} ms) | {name} | {:.0} | {:.1} | {:.2} ms | {:.2} ms | {:.1} ms | {:.0} µs | {:.0}-{:.0} | {:.0} µs, {:.0} µs |",
                hold.name(),
                s.median(|r| r.hold_us) / 1_000.0,
                s.median(|r| r.per_second),
                s.median(|r| r.commands_per_acquisition),
                s.median(|r| r.p50_us) / 1_000.0,
                s.median(|r| r.p99_us) / 1_000.0,
                s.max(|r| r.max_us) / 1_000.0,
                s.median(|r| r.handover_us),
                s.median(|r| r.fewest as f64),
                s.median(|r| r.most as f64),
                s.median(|r| r.client_cpu_us),
                s.median(|r| r.server_cpu_us),
            );
        }
        let rate = |v: usize| series[h][v].median(|r| r.per_second);
        println!(
            "| {} | wake-ups / no window; / tokio Mutex | {:.2}x; {:.2}x | | | | | | | |",
            hold.name(),
            rate(1) / rate(2),
            rate(1) / rate(3),
        );
        let cmds = |v: usize| series[h][v].median(|r| r.commands_per_acquisition);
        println!(
            "| {} | wake-ups / polling | {:.2}x | {:.2}x | | | | | | {:.2}x, {:.2}x |",
            hold.name(),
            rate(1) / rate(0),
            cmds(1) / cmds(0),
            series[h][1].median(|r| r.client_cpu_us) / series[h][0].median(|r| r.client_cpu_us),
            series[h][1].median(|r| r.server_cpu_us) / series[h][0].median(|r| r.server_cpu_us),
        );
    }
}
