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
//! A third variant, an in-process `tokio::sync::Mutex` with the same hold, is the ceiling of
//! the harness: the rate of a lock that costs nothing but a task hand-over.
//!
//! Two holds: `precise` (a blocking 1 ms sleep in `spawn_blocking`, about 1.07 ms here) and
//! `tokio` (`tokio::time::sleep(1 ms)`, which rounds to the timer's millisecond ticks and takes
//! about 2 ms): the hold bounds the rate at 1 / hold, whatever the lock does.
//!
//! Method: the variants take turns within each round (the order alternating between rounds), so
//! a change in the machine's load falls on all of them alike; the table shows the median over
//! rounds of each figure (max: the largest of all rounds).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::{Redlock, Retry};
use fredlock_testkit::{self as testkit, RespValue};
use hdrhistogram::Histogram;

const TASKS: usize = 16;
const TTL: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);
const RETRY: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_millis(5),
    jitter: Duration::from_millis(5),
};

/// What the 16 tasks contend on.
#[derive(Clone)]
enum Target {
    Redlock(Redlock),
    /// An in-process `tokio::sync::Mutex`: no Redis at all, the ceiling this harness can
    /// measure with a given hold (the hold plus a task hand-over).
    Local(Arc<tokio::sync::Mutex<()>>),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Hold {
    Precise,
    Tokio,
}

impl Hold {
    async fn hold(self) {
        match self {
            Hold::Precise => {
                tokio::task::spawn_blocking(|| std::thread::sleep(HOLD))
                    .await
                    .expect("hold");
            }
            Hold::Tokio => tokio::time::sleep(HOLD).await,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Hold::Precise => "precise 1 ms",
            Hold::Tokio => "tokio::time::sleep(1 ms)",
        }
    }
}

struct Round {
    per_second: f64,
    commands_per_acquisition: f64,
    /// This process's CPU time per acquisition, µs (10 ms clock ticks over the round).
    client_cpu_us: f64,
    /// The nodes' CPU time per acquisition, µs (INFO cpu).
    server_cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    hold_us: f64,
    handover_us: f64,
    fewest: u64,
    most: u64,
}

#[derive(Default)]
struct Series(Vec<Round>);

impl Series {
    fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        let mut v: Vec<f64> = self.0.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return f64::NAN;
        }
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }
    fn max(&self, f: impl Fn(&Round) -> f64) -> f64 {
        self.0.iter().map(f).fold(0.0, f64::max)
    }
}

/// Calls per command (INFO commandstats), summed over every command but INFO and CONFIG.
async fn commands(addrs: &[SocketAddr]) -> u64 {
    let mut total = 0;
    for a in addrs {
        let reply = testkit::resp_command(*a, &["INFO", "commandstats"], Duration::from_secs(5))
            .await
            .expect("INFO commandstats");
        let RespValue::Bulk(Some(text)) = reply else {
            panic!("INFO commandstats: unexpected reply {reply:?}");
        };
        for line in String::from_utf8_lossy(&text).lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let name = rest.split(':').next().unwrap_or("");
            if name == "info" || name.starts_with("config") {
                continue;
            }
            let calls = rest
                .split(&[':', ','][..])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0);
            total += calls;
        }
    }
    total
}

async fn reset_stats(addrs: &[SocketAddr]) {
    for a in addrs {
        testkit::resp_command(*a, &["CONFIG", "RESETSTAT"], Duration::from_secs(5))
            .await
            .expect("CONFIG RESETSTAT");
    }
}

/// The nodes' CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user, all nodes), seconds.
async fn server_cpu(addrs: &[SocketAddr]) -> f64 {
    let mut total = 0.0;
    for a in addrs {
        let reply = testkit::resp_command(*a, &["INFO", "cpu"], Duration::from_secs(5))
            .await
            .expect("INFO cpu");
        let RespValue::Bulk(Some(text)) = reply else {
            continue;
        };
        for line in String::from_utf8_lossy(&text).lines() {
            for field in ["used_cpu_sys:", "used_cpu_user:"] {
                if let Some(v) = line.strip_prefix(field) {
                    total += v.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
        }
    }
    total
}

/// This process's CPU time (user + system), from /proc/self/stat (Linux; 10 ms ticks).
fn process_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

async fn round(target: &Target, addrs: &[SocketAddr], key: &str, hold: Hold, secs: f64) -> Round {
    reset_stats(addrs).await;
    let (cpu0, server0) = (process_cpu(), server_cpu(addrs).await);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let held_ns = Arc::new(AtomicU64::new(0));
    // When the latest release started (ns since `start`; 0: none yet).
    let released_at = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (target, key, held_ns, released_at) = (
                target.clone(),
                key.to_string(),
                held_ns.clone(),
                released_at.clone(),
            );
            tokio::spawn(async move {
                let mut waits = Histogram::<u64>::new(3).expect("histogram");
                let mut handovers = Histogram::<u64>::new(3).expect("histogram");
                let mut n = 0u64;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let (lock, local) = match &target {
                        Target::Redlock(r) => (
                            Some(r.acquire(key.as_str(), TTL).await.expect("acquire")),
                            None,
                        ),
                        Target::Local(m) => (None, Some(m.clone().lock_owned().await)),
                    };
                    let granted = start.elapsed().as_nanos() as u64;
                    let _ = waits.record(t0.elapsed().as_micros() as u64);
                    let released = released_at.load(Ordering::SeqCst);
                    if released > 0 && granted > released {
                        let _ = handovers.record((granted - released) / 1_000);
                    }
                    let h0 = Instant::now();
                    hold.hold().await;
                    held_ns.fetch_add(h0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    released_at.store(start.elapsed().as_nanos() as u64, Ordering::SeqCst);
                    if let Some(lock) = lock {
                        lock.release().await.expect("release");
                    }
                    drop(local);
                    n += 1;
                }
                (n, waits, handovers)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    let mut handovers = Histogram::<u64>::new(3).expect("histogram");
    let (mut fewest, mut most) = (u64::MAX, 0);
    for t in tasks {
        let (n, waits, h) = t.await.expect("a task panicked");
        total += n;
        fewest = fewest.min(n);
        most = most.max(n);
        all.add(waits).expect("merge");
        handovers.add(h).expect("merge");
    }
    let elapsed = start.elapsed();
    let cpu = process_cpu() - cpu0;
    let server = server_cpu(addrs).await - server0;
    let cmds = commands(addrs).await;
    let n = total.max(1) as f64;
    Round {
        per_second: total as f64 / elapsed.as_secs_f64(),
        commands_per_acquisition: cmds as f64 / n,
        client_cpu_us: cpu * 1e6 / n,
        server_cpu_us: server * 1e6 / n,
        p50_us: all.value_at_quantile(0.5) as f64,
        p99_us: all.value_at_quantile(0.99) as f64,
        max_us: all.max() as f64,
        hold_us: held_ns.load(Ordering::Relaxed) as f64 / total.max(1) as f64 / 1_000.0,
        handover_us: handovers.value_at_quantile(0.5) as f64,
        fewest,
        most,
    }
}

async fn addr_of(url: &str) -> SocketAddr {
    let rest = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .split(['/', '?'])
        .next()
        .unwrap_or("");
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    tokio::net::lookup_host(hostport)
        .await
        .unwrap_or_else(|e| panic!("cannot resolve {url}: {e}"))
        .next()
        .unwrap_or_else(|| panic!("{url} resolves to no address"))
}

fn output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

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
    let build = |wake: bool| {
        Redlock::builder()
            .nodes(urls.clone())
            .retry(RETRY)
            .wake_on_release(wake)
            .build()
    };
    let polling = build(false).await.expect("build");
    let waking = build(true).await.expect("build");
    let variants = [
        ("polling", Target::Redlock(polling.clone())),
        ("wake-ups", Target::Redlock(waking.clone())),
        (
            "in-process tokio Mutex (ceiling, no Redis)",
            Target::Local(Arc::new(tokio::sync::Mutex::new(()))),
        ),
    ];
    let holds = [Hold::Precise, Hold::Tokio];
    let key = format!("bench:waiters:{:08x}", rand::random::<u32>());
    // Warm-up: connections, scripts, the subscriber connections and the channel.
    for (_, t) in &variants {
        for h in holds {
            round(t, &addrs, &key, h, 0.3).await;
        }
    }
    let mut series: Vec<Vec<Series>> = holds
        .iter()
        .map(|_| variants.iter().map(|_| Series::default()).collect())
        .collect();
    let load_before = output("uptime", &[]);
    for r in 0..rounds {
        for (h, hold) in holds.iter().enumerate() {
            let order: Vec<usize> = if r % 2 == 0 {
                vec![0, 1, 2]
            } else {
                vec![2, 1, 0]
            };
            for v in order {
                let got = round(&variants[v].1, &addrs, &key, *hold, secs).await;
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
    let load_after = output("uptime", &[]);
    println!(
        "`cargo run --release --example bench_waiters{}`: 3 nodes ({}), {TASKS} tasks on one key, TTL 10 s, retry 5 ms + 5 ms jitter; {rounds} rounds of {secs} s per variant, interleaved; medians over rounds (max: over all rounds). {} cores; load before: {load_before}; after: {load_after}",
        if quick { " -- --quick" } else { "" },
        output("redis-server", &["--version"]),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!();
    println!("| hold (measured) | variant | acquisitions/s | Redis commands / acquisition | wait p50 | wait p99 | wait max | hand-over p50 | acquisitions per task (fewest-most) | CPU / acquisition: client, nodes |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|---|");
    for (h, hold) in holds.iter().enumerate() {
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
    polling.close().await;
    waking.close().await;
    drop(nodes);
}
