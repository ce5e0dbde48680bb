//! 16 waiters on one key, each holding it 1 ms: the rounds `bench_waiters` and `bench` run
//! (fredlock polling, fredlock woken by release, rslock, and an in-process mutex as the
//! ceiling), with what each round measures.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::{Redlock, Retry};

use super::process_cpu;
use fredlock_testkit::{self as testkit, RespValue};
use hdrhistogram::Histogram;

pub const TASKS: usize = 16;
pub const TTL: Duration = Duration::from_secs(10);
pub const HOLD: Duration = Duration::from_millis(1);
pub const RETRY: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_millis(5),
    jitter: Duration::from_millis(5),
};

/// What the 16 tasks contend on.
#[derive(Clone)]
pub enum Target {
    Redlock(Redlock),
    /// An in-process `tokio::sync::Mutex`: no Redis at all, the ceiling this harness can
    /// measure with a given hold (the hold plus a task hand-over).
    Local(Arc<tokio::sync::Mutex<()>>),
    /// rslock 0.10 (a peer): it retries after a random pause in `[0, 10 ms)`, its only form of
    /// pause (mean 5 ms; fredlock's 5 ms + up to 5 ms has a mean of 7.5 ms).
    Rslock(Arc<rslock::LockManager>),
}

/// An rslock manager for the waiters' rounds: waits by retrying, as described at
/// [`Target::Rslock`].
pub fn rslock(urls: &[String]) -> rslock::LockManager {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    // acquire_no_guard retries without a pause once `count` tries fail: keep count large.
    manager.set_retry(1_000_000, Duration::from_millis(10));
    manager
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hold {
    Precise,
    Tokio,
}

impl Hold {
    pub async fn hold(self) {
        match self {
            // The fleet table's hold: a thread sleep, then a spin to exactly 1 ms.
            Hold::Precise => super::fleet::precise_hold().await,
            Hold::Tokio => tokio::time::sleep(HOLD).await,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Hold::Precise => "precise 1 ms",
            Hold::Tokio => "tokio::time::sleep(1 ms)",
        }
    }
}

pub struct Round {
    pub per_second: f64,
    pub commands_per_acquisition: f64,
    /// This process's CPU time per acquisition, µs (10 ms clock ticks over the round).
    pub client_cpu_us: f64,
    /// The nodes' CPU time per acquisition, µs (INFO cpu).
    pub server_cpu_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub hold_us: f64,
    pub handover_us: f64,
    pub fewest: u64,
    pub most: u64,
}

#[derive(Default)]
pub struct Series(pub Vec<Round>);

impl Series {
    pub fn median(&self, f: impl Fn(&Round) -> f64) -> f64 {
        super::median(self.0.iter().map(f).collect())
    }
    pub fn max(&self, f: impl Fn(&Round) -> f64) -> f64 {
        self.0.iter().map(f).fold(0.0, f64::max)
    }
}

/// Calls per command (INFO commandstats), summed over every command but INFO and CONFIG.
pub async fn commands(addrs: &[SocketAddr]) -> u64 {
    commands_by_name(addrs).await.values().sum()
}

/// [`commands`] per node and command: `"<node index>:<command>"` -> calls.
pub async fn commands_by_name(addrs: &[SocketAddr]) -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    for (i, a) in addrs.iter().enumerate() {
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
            *by_name.entry(format!("{i}:{name}")).or_insert(0) += calls;
        }
    }
    by_name
}

pub async fn reset_stats(addrs: &[SocketAddr]) {
    for a in addrs {
        testkit::resp_command(*a, &["CONFIG", "RESETSTAT"], Duration::from_secs(5))
            .await
            .expect("CONFIG RESETSTAT");
    }
}

/// The nodes' CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user, all nodes), seconds.
pub async fn server_cpu(addrs: &[SocketAddr]) -> f64 {
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

/// This process's CPU seconds so far (0 where unknown).
fn cpu_seconds() -> f64 {
    process_cpu().map_or(0.0, |d| d.as_secs_f64())
}

pub async fn round(
    target: &Target,
    addrs: &[SocketAddr],
    key: &str,
    hold: Hold,
    secs: f64,
) -> Round {
    reset_stats(addrs).await;
    let (cpu0, server0) = (cpu_seconds(), server_cpu(addrs).await);
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
                let mut rslock_held = None;
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let (lock, local) = match &target {
                        Target::Redlock(r) => (
                            Some(r.acquire(key.as_str(), TTL).await.expect("acquire")),
                            None,
                        ),
                        Target::Local(m) => (None, Some(m.clone().lock_owned().await)),
                        Target::Rslock(m) => {
                            let lock = m
                                .acquire_no_guard(key.as_bytes(), TTL)
                                .await
                                .expect("rslock acquire");
                            rslock_held = Some(lock);
                            (None, None)
                        }
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
                    if let (Target::Rslock(m), Some(lock)) = (&target, rslock_held.take()) {
                        m.unlock(&lock).await;
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
    let cpu = cpu_seconds() - cpu0;
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
