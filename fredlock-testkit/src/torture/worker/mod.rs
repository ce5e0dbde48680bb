//! A client of the torture run ([`Worker`]): its seeded sequence of operations ([`draw_op`]),
//! the loop that runs them until the run stops, and the probes it runs in tasks of its own.
//!
//! Owns the drawing of operations (from the client's seed alone, never from what happened at
//! run time) and their dispatch. Must not hold an operation's body: each kind lives in a file
//! below (`ops.rs`, `keep_alive.rs`, `stale.rs`, `takeover.rs`, `cleanup.rs`), on top of the
//! critical-section steps of `section.rs`.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::ClientLike;
use fredlock::{Error, Lock, Redlock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::config::TortureConfig;
use super::env::{data_client, ClientRedlocks, Env};
use super::schedule::{pick_weighted, rand_dur, stream};
use super::stats::Stats;
use crate::checker::{Checker, GrantId, ViolationKind};

mod cleanup;
mod handoff;
mod keep_alive;
mod modes;
mod ops;
mod section;
mod stale;
mod takeover;

/// Steps of a keep-alive or `with_lock` section at most.
const MAX_STEPS: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum OpKind {
    Acquire,
    TryAcquire,
    Multi,
    KeepAlive,
    WithLock,
    ExtendNearExpiry,
    Abandon,
    Stale,
    Foreign,
    Takeover,
    Cancel,
    Permit,
    Fenced,
    ReadWrite,
    Lease,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::TryAcquire => "try_acquire",
            OpKind::Multi => "multi",
            OpKind::KeepAlive => "keep_alive",
            OpKind::WithLock => "with_lock",
            OpKind::ExtendNearExpiry => "extend_near_expiry",
            OpKind::Abandon => "abandon",
            OpKind::Stale => "stale",
            OpKind::Foreign => "foreign",
            OpKind::Takeover => "takeover",
            OpKind::Cancel => "cancelled_acquire",
            OpKind::Permit => "semaphore_permit",
            OpKind::Fenced => "fenced_write",
            OpKind::ReadWrite => "rwlock",
            OpKind::Lease => "lease_resume",
        }
    }
}

const OP_WEIGHTS: [(OpKind, u32); 15] = [
    (OpKind::Acquire, 24),
    (OpKind::TryAcquire, 14),
    (OpKind::Multi, 10),
    (OpKind::KeepAlive, 5),
    (OpKind::WithLock, 5),
    (OpKind::ExtendNearExpiry, 5),
    (OpKind::Abandon, 5),
    (OpKind::Stale, 8),
    (OpKind::Foreign, 5),
    (OpKind::Takeover, 4),
    (OpKind::Cancel, 6),
    (OpKind::Permit, 8),
    (OpKind::Fenced, 8),
    (OpKind::ReadWrite, 5),
    (OpKind::Lease, 3),
];

/// Fleet mode: mostly waiting acquires of the hot resources, plus cancelled acquires,
/// try_acquire and semaphore permits (nothing that holds a hot resource for long: the liveness
/// rows measure hand-overs).
const FLEET_WEIGHTS: [(OpKind, u32); 4] = [
    (OpKind::Acquire, 75),
    (OpKind::TryAcquire, 5),
    (OpKind::Cancel, 10),
    (OpKind::Permit, 10),
];

/// One operation, drawn entirely up front with a fixed number of draws per operation, so that
/// a client's sequence of operations depends on its seed alone, not on what happened at run
/// time.
#[derive(Debug, Clone)]
struct Op {
    kind: OpKind,
    resources: [usize; 2],
    foreign: usize,
    ttl: Duration,
    ttl2: Duration,
    /// (pause between GET and SET, sleep after the write).
    steps: Vec<(Duration, Duration)>,
    flag: bool,
    flag2: bool,
    /// When to extend, relative to the deadline (negative: before it).
    offset_us: i64,
    pick: usize,
    think: Duration,
}

fn draw_op(rng: &mut StdRng, config: &TortureConfig) -> Op {
    let kind = match config.fleet {
        true => pick_weighted(rng, &FLEET_WEIGHTS),
        false => pick_weighted(rng, &OP_WEIGHTS),
    };
    let m = config.resources.max(1);
    let a = rng.random_range(0..m);
    let x = rng.random_range(0..m.max(2) - 1);
    let b = if m < 2 { a } else { (a + 1 + x) % m };
    let foreign = rng.random_range(0..config.foreign_resources.max(1));
    let ttl = rand_dur(rng, config.ttl_min, config.ttl_max);
    let ttl2 = rand_dur(rng, config.ttl_min, config.ttl_max);
    let n = rng.random_range(1..=MAX_STEPS);
    let long = matches!(kind, OpKind::KeepAlive | OpKind::WithLock);
    let mut steps = Vec::with_capacity(MAX_STEPS);
    for _ in 0..MAX_STEPS {
        let pause = Duration::from_micros(rng.random_range(0..=3_000));
        let sleep = ttl.mul_f64(rng.random_range(0.0..0.5));
        steps.push((pause, if long { sleep } else { Duration::ZERO }));
    }
    steps.truncate(match kind {
        OpKind::KeepAlive | OpKind::WithLock => n,
        OpKind::Acquire | OpKind::TryAcquire | OpKind::Multi => n.min(3),
        _ => 2,
    });
    let flag = rng.random_bool(0.3);
    let flag2 = rng.random_bool(0.25);
    if kind == OpKind::KeepAlive && flag2 {
        // A long section (up to 12 TTLs): it often outlives a node's outage, so that its
        // keep-alive finds the node back without the lock's key and repairs it there.
        for step in &mut steps {
            step.1 *= 4;
        }
    }
    Op {
        kind,
        resources: [a, b],
        foreign,
        ttl,
        ttl2,
        steps,
        flag,
        flag2,
        offset_us: rng.random_range(-8_000..=3_000),
        pick: rng.random_range(0..1_000),
        think: Duration::from_micros(rng.random_range(0..=2_000)),
    }
}

struct Stale {
    lock: Lock,
    grant: GrantId,
    /// Node epochs from before its acquire was sent.
    epochs: Vec<u64>,
}

struct Worker {
    id: usize,
    env: Arc<Env>,
    redlock: Redlock,
    /// Fencing mode: the same client's `Redlock` with fencing tokens (same proxies).
    fenced: Option<Redlock>,
    data: Client,
    rng: StdRng,
    stats: Stats,
    stale: Vec<Stale>,
    private_seq: u64,
    node_timeout: Duration,
    /// Probes running in tasks of their own (awaited before the client finishes).
    probes: Vec<tokio::task::JoinHandle<Stats>>,
}

impl Worker {
    async fn run(mut self, stop_at: Instant) -> Stats {
        while Instant::now() < stop_at {
            let op = draw_op(&mut self.rng, &self.env.config);
            *self.stats.ops.entry(op.kind.name()).or_default() += 1;
            let (began, granted) = (Instant::now(), self.stats.granted);
            match op.kind {
                OpKind::Acquire => self.op_acquire(&op, false).await,
                OpKind::TryAcquire => self.op_acquire(&op, true).await,
                OpKind::Multi => self.op_multi(&op).await,
                OpKind::KeepAlive => self.op_keep_alive(&op).await,
                OpKind::WithLock => self.op_with_lock(&op).await,
                OpKind::ExtendNearExpiry => self.op_extend_near_expiry(&op).await,
                OpKind::Abandon => self.op_abandon(&op).await,
                OpKind::Stale => self.op_stale(&op).await,
                OpKind::Foreign => self.op_foreign(&op).await,
                OpKind::Takeover => self.op_takeover(&op).await,
                OpKind::Cancel => self.op_cancel(&op).await,
                OpKind::Permit => self.op_permit(&op).await,
                OpKind::Fenced => self.op_fenced(&op).await,
                OpKind::ReadWrite => self.op_rw(&op).await,
                OpKind::Lease => self.op_lease(&op).await,
            }
            tokio::time::sleep(op.think).await;
            let key = (op.kind.name(), self.stats.granted > granted);
            *self.stats.op_time.entry(key).or_default() += began.elapsed();
        }
        // Leave nothing behind: stale locks are released (owner-only, so harmless).
        for s in std::mem::take(&mut self.stale) {
            self.release_stale(s).await;
        }
        for probe in std::mem::take(&mut self.probes) {
            self.join_probe(probe).await;
        }
        self.redlock.close().await;
        if let Some(fenced) = &self.fenced {
            fenced.close().await;
        }
        let _ = self.data.quit().await;
        self.stats
    }

    fn resource(&self, i: usize) -> String {
        self.env.resources[i % self.env.resources.len()].clone()
    }

    fn checker(&self) -> &Checker {
        &self.env.checker
    }

    /// Counts an acquire outcome; returns the lock if granted.
    fn outcome<T>(&mut self, res: Result<Option<T>, Error>) -> Option<T> {
        self.stats.outcome(res)
    }

    /// Runs a probe in a task of its own; its counters join this client's when it is done.
    async fn spawn_probe(&mut self, probe: impl Future<Output = Stats> + Send + 'static) {
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.probes)
            .into_iter()
            .partition(|p| p.is_finished());
        self.probes = running;
        for p in done {
            self.join_probe(p).await;
        }
        self.probes.push(tokio::spawn(probe));
    }

    async fn join_probe(&mut self, probe: tokio::task::JoinHandle<Stats>) {
        match probe.await {
            Ok(stats) => self.stats.merge(&stats),
            Err(e) => self.checker().violation(
                ViolationKind::Panic,
                format!("client {}: probe task: {e}", self.id),
            ),
        }
    }
}

/// Starts one client task per `Redlock` (each with its own data-node client and seeded
/// operations), running until `stop_at`.
pub(super) async fn spawn_workers(
    env: &Arc<Env>,
    redlocks: Vec<ClientRedlocks>,
    data_url: &str,
    stop_at: Instant,
) -> io::Result<Vec<JoinHandle<Stats>>> {
    let mut workers = Vec::new();
    for (id, c) in redlocks.into_iter().enumerate() {
        let ClientRedlocks {
            redlock,
            fenced,
            node_timeout,
        } = c;
        let worker = Worker {
            id,
            env: env.clone(),
            redlock,
            fenced,
            data: data_client(data_url).await?,
            rng: StdRng::seed_from_u64(stream(&env.config, 1_000 + id as u64)),
            stats: Stats::default(),
            stale: Vec::new(),
            private_seq: 0,
            node_timeout,
            probes: Vec::new(),
        };
        workers.push(tokio::spawn(worker.run(stop_at)));
    }
    Ok(workers)
}

/// Waits for every client; their counters, summed. A client that panicked is a violation.
pub(super) async fn join_workers(checker: &Checker, workers: Vec<JoinHandle<Stats>>) -> Stats {
    let mut stats = Stats::default();
    for (id, w) in workers.into_iter().enumerate() {
        match w.await {
            Ok(s) => stats.merge(&s),
            Err(e) => checker.violation(ViolationKind::Panic, format!("client {id}: {e}")),
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::super::schedule::mix;
    use super::*;

    #[test]
    fn operations_replay_from_the_seed() {
        let config = TortureConfig::new(3, 7, Duration::from_secs(10));
        let draw = || {
            let mut rng = StdRng::seed_from_u64(mix(7, 1_000));
            (0..100)
                .map(|_| format!("{:?}", draw_op(&mut rng, &config)))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(), draw());
    }
}
