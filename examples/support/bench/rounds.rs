//! The measurement rounds: serial latency ([`serial_round`]), throughput of `TASKS` tasks
//! ([`throughput_round`], [`throughput_b`]) and the semaphore round, with their per-round figures.
//! Knows nothing of servers' counters or of the report.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::Redlock;
use hdrhistogram::Histogram;

use crate::plan::Plan;
use crate::servers::commands_processed;
use crate::support::{median, process_cpu};
use crate::targets::{Names, Target, ThirdNode};
use crate::{TASKS, TTL};

/// One serial round's result, in nanoseconds.
pub(crate) struct Round {
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) third: ThirdNode,
}

/// Cycles per block in a serial round: small enough (a few ms) that a change in the machine's
/// load lasting longer than a few blocks falls on every variant alike.
pub(crate) const BLOCK: usize = 50;

/// Runs `cycles` serial acquire+release cycles of each variant (target, resource) and records
/// each cycle's duration. The variants take turns in blocks of [`BLOCK`] cycles, in a rotating
/// order, so that they are measured under the same conditions. Runs in one spawned task.
pub(crate) async fn serial_round(variants: &[(&Target, &str)], cycles: usize) -> Vec<Round> {
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
pub(crate) struct Throughput {
    pub(crate) per_second: f64,
    pub(crate) cycles: u64,
    pub(crate) cpu_per_cycle_us: Option<f64>,
}

/// Runs `TASKS` tasks, each cycling on its own key (`{prefix}:{task}`; with `fresh_keys`, a new
/// one every cycle, `{prefix}:{task}:{cycle}`) until `duration` has passed. The elapsed time
/// runs until the last task finished its last cycle, so no partial work is lost. Also measures
/// this process's CPU time per cycle: on a shared 2-core machine that is a steadier measure of
/// the client's cost than cycles/s (the Redis servers are not counted).
pub(crate) async fn throughput_round(
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
pub(crate) async fn spawn_and_wait<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(work)
        .await
        .expect("a measurement task panicked")
}

/// Per-round percentiles of one serial variant, kept to print the spread under the table.
#[derive(Default)]
pub(crate) struct Series {
    pub(crate) p50: Vec<f64>,
    pub(crate) p99: Vec<f64>,
    pub(crate) third: ThirdNode,
}

impl Series {
    pub(crate) fn push(&mut self, round: Round) {
        self.p50.push(round.p50 as f64 / 1_000.0);
        self.p99.push(round.p99 as f64 / 1_000.0);
        self.third.merge(round.third);
    }
    pub(crate) fn p50(&self) -> f64 {
        median(self.p50.clone())
    }
    pub(crate) fn p99(&self) -> f64 {
        median(self.p99.clone())
    }
}

/// (f) Semaphore contention: permits and contenders.
pub(crate) const SEM_PERMITS: usize = 4;
pub(crate) const SEM_TASKS: usize = 16;

/// One semaphore round: acquisitions/s, Redis commands per acquisition (INFO commandstats on
/// every node, which counts the calls inside scripts too), and how often more holders than
/// permits were seen on the client side (must be 0).
pub(crate) struct SemaphoreRound {
    pub(crate) per_second: f64,
    pub(crate) commands_per_acquisition: f64,
    pub(crate) over_permits: u64,
}

/// `SEM_TASKS` tasks take a permit of one semaphore, hold it 1 ms, release it, until `duration`
/// has passed. Retries every 1-2 ms while all permits are taken.
pub(crate) async fn semaphore_round(
    urls: &[String],
    name: &str,
    duration: Duration,
) -> SemaphoreRound {
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

/// (b): `TASKS` tasks cycling on own keys, for floor, rslock and fredlock (in that order), in
/// interleaved rounds after a warm-up of each.
pub(crate) async fn throughput_b(
    targets: [&Target; 3],
    plan: &Plan,
    prefix: &str,
) -> [Vec<Throughput>; 3] {
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
