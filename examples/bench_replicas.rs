//! What confirmed votes cost: the same Redlock over 3 local Sentinel-managed groups (each a
//! primary, one replica and a sentinel), with and without `confirm_replicas(1, 100 ms)`.
//!
//! ```text
//! cargo run --release --example bench_replicas [-- --quick]
//! ```
//!
//! Two measures, each variant in turn within every round (a rotating order, so a change in the
//! machine's load falls on both alike), the median over rounds:
//! - serial: one acquire+release of one lock at a time, p50 of a block of cycles;
//! - 64 tasks, each acquiring and releasing locks of its own, cycles per second.
//!
//! The ratio confirmed / unconfirmed is the cost: one `WAIT` per node after each grant (one more
//! round trip, plus the replica's acknowledgement).

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::Redlock;
use fredlock_testkit::LocalSentinel;

const TTL: Duration = Duration::from_secs(10);
const CONFIRM_TIMEOUT: Duration = Duration::from_millis(100);
const TASKS: usize = 64;

struct Plan {
    rounds: usize,
    block: usize,
    window: Duration,
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let plan = match quick {
        true => Plan {
            rounds: 3,
            block: 200,
            window: Duration::from_millis(500),
        },
        false => Plan {
            rounds: 7,
            block: 500,
            window: Duration::from_secs(1),
        },
    };
    let (a, b, c) = tokio::join!(group(), group(), group());
    let urls: Vec<String> = [&a, &b, &c].iter().map(|g| g.url()).collect();
    let variants = [
        ("unconfirmed", redlock(&urls, false).await),
        ("confirm_replicas(1, 100 ms)", redlock(&urls, true).await),
    ];
    println!(
        "## Confirmed votes (bench_replicas): 3 Sentinel groups (primary + 1 replica + 1 \
         sentinel each), {} {}, commit {}, {} rounds",
        fredlock_testkit::Server::from_env().map_or("?".into(), |s| s.to_string()),
        support::command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        support::command_output("git", &["rev-parse", "--short", "HEAD"]),
        plan.rounds,
    );
    let mut serial = vec![Vec::new(); variants.len()];
    let mut tasks = vec![Vec::new(); variants.len()];
    for round in 0..plan.rounds {
        for k in 0..variants.len() {
            let v = (round + k) % variants.len();
            let redlock = &variants[v].1;
            serial[v].push(serial_p50_us(redlock, plan.block).await);
            tasks[v].push(throughput(redlock, plan.window).await);
        }
    }
    println!();
    println!("| variant | serial acquire+release p50 | ratio | {TASKS} tasks, cycles/s | ratio |");
    println!("|---|---:|---:|---:|---:|");
    let base_serial = support::median(serial[0].clone());
    let base_tasks = support::median(tasks[0].clone());
    for (v, (name, _)) in variants.iter().enumerate() {
        let s = support::median(serial[v].clone());
        let t = support::median(tasks[v].clone());
        println!(
            "| {name} | {s:.0} µs | {:.2}x | {t:.0} | {:.2}x |",
            s / base_serial,
            t / base_tasks
        );
    }
    for (_, redlock) in variants {
        redlock.close().await;
    }
}

async fn group() -> LocalSentinel {
    LocalSentinel::start(1, 1)
        .await
        .expect("start a Sentinel group (redis-server or valkey-server on PATH)")
}

async fn redlock(urls: &[String], confirm: bool) -> Redlock {
    let mut builder = Redlock::builder()
        .nodes(urls.to_vec())
        .connect_wait(Duration::from_secs(20))
        .require_quorum(true);
    if confirm {
        builder = builder.confirm_replicas(1, CONFIRM_TIMEOUT);
    }
    builder.build().await.expect("build")
}

/// p50 (µs) of `cycles` serial acquire+release cycles on one resource.
async fn serial_p50_us(redlock: &Redlock, cycles: usize) -> f64 {
    let resource = format!("bench-replicas-serial-{}", std::process::id());
    let mut samples = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let start = Instant::now();
        let lock = redlock.acquire(&resource, TTL).await.expect("acquire");
        lock.release().await.expect("release");
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    support::median(samples)
}

/// Cycles per second of [`TASKS`] tasks, each on resources of its own, for `window`.
async fn throughput(redlock: &Redlock, window: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..TASKS)
        .map(|t| {
            let (redlock, stop, done) = (redlock.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let resource = format!("bench-replicas-task-{t}-{}", std::process::id());
                while !stop.load(Ordering::Relaxed) {
                    let lock = redlock.acquire(&resource, TTL).await.expect("acquire");
                    lock.release().await.expect("release");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("a task panicked");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}
