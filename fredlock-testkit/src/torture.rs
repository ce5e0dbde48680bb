//! The fault-injection torture run: K clients contend for M resources over N local nodes while
//! a seeded schedule kills, freezes, partitions and delays nodes and connections; a
//! [`Checker`] decides afterwards whether any safety property broke. Plus the negative controls
//! that prove the checker can see a violation when one is planted.
//!
//! # Set-up of a run
//! - N lock nodes ([`LocalNodes`]), plus one more redis-server, the DATA node, that holds the
//!   lost-update counters and is never faulted (the thing the lock protects).
//! - Every client has its OWN [`FaultProxy`] per node and its own [`Redlock`] over its proxies,
//!   so a fault can hit one client (a slow link, held replies) or every client (a partition).
//! - "Foreign" lock keys (`foreign:0..F`) are planted on every node with a value no client
//!   owns and a TTL longer than the run: clients try to take them and must never get them, and
//!   they must all be intact at the end.
//! - An observer `Redlock` straight on the nodes (no proxy) inspects keys for the checks.
//!
//! # The schedule
//! One seeded `StdRng` generates, before anything runs, a list of fault episodes on three
//! lanes: lane 0 holds node faults (kill with a DELAYED restart, SIGSTOP, a partition of every
//! client from some nodes, SCRIPT FLUSH), one at a time and on a minority of the nodes, except
//! the row 3 and row 5 episodes that take a majority (nothing can be granted then, which the
//! checker verifies). Lanes 1 and 2 hold per-client network faults (held replies, latency,
//! dropped replies, resets), each lane on its own half of the clients. Each client draws its
//! operations from its own seeded `StdRng`. So a seed replays the same fault schedule and the
//! same sequence of operations per client; what it cannot replay is timing (which operation is
//! in flight when a fault hits).
//!
//! # Assumption A, kept on purpose
//! At most a minority of nodes is faulty at a time (except rows 3 and 5, which make everything
//! unavailable); a killed node comes back EMPTY only after the maximum TTL plus a margin
//! ("delayed restart"); no node clock jumps. Per-client network faults do not make a node
//! faulty (Redlock's safety does not depend on the network). Swallowing faults (blackhole,
//! dropped replies) always end with a ~100 ms reset before traffic passes again: fred pipelines
//! and matches replies to requests in order, so swallowed bytes would desynchronise the stream,
//! which real TCP cannot do without the connection dying.
//!
//! # What a client does
//! A seeded mix of: acquire + critical section + release (sometimes with an inspection that the
//! token is on a quorum, sometimes with an extend half-way); try_acquire; a two-resource
//! acquire; keep-alive sections longer than the TTL; `with_lock` sections (cancelled when the
//! lock is lost); an extend timed near the deadline; abandoned locks kept as stale `Lock`
//! values, later extended and released (often after the client re-acquired the resource, so
//! another holder's key is there: rows 13 and 14); attempts on the foreign resources; and a
//! private-resource probe where the keys are deleted or taken over behind the lock's back
//! before it extends and releases (S4, S5 at the script level); and a clean-up probe (S6): an
//! acquire on a private resource cancelled after 0-3 ms, failed, or granted and released, must
//! leave no key on any node whose state and link did not change meanwhile. Every critical section is a
//! non-atomic read-modify-write of a counter on the data node, done only while the lock still
//! has a guard of validity left (so a holder does not act past its deadline: row 10 is not
//! covered by Redlock, and this run is about what Redlock does guarantee).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{ClientLike, Config, KeysInterface, ReconnectPolicy, Value};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::sync::RwLock;
use tokio::time::Instant;

use super::checker::{
    Checker, CheckerReport, DataValue, GrantId, GrantKind, NoteKind, ViolationKind,
};
use super::{Fault, FaultProxy, LocalNodes, RespValue};
use fredlock::{Error, Inspection, Lock, LockHandle, LostReason, Redlock, Retry};

/// A node killed in the run comes back (empty) only after the maximum TTL plus this much:
/// every key it held has expired everywhere by then, so its empty restart cannot help a second
/// holder in (the "delayed restart" of the notes).
pub const RESTART_MARGIN: Duration = Duration::from_millis(200);
/// How long a proxy resets connections after a swallowing fault, before it passes again: long
/// enough for fred to see the reset and drop its (desynchronised) connection.
pub const RESET_HOLD: Duration = Duration::from_millis(100);
/// The value of the planted foreign keys.
pub const FOREIGN_VALUE: &str = "foreign-owner";
/// Stale locks a client keeps at most (older ones are released).
const MAX_STALE: usize = 4;
/// Steps of a keep-alive or `with_lock` section at most.
const MAX_STEPS: usize = 6;
/// Per-node timeout of the observer's inspections.
const OBSERVER_TIMEOUT: Duration = Duration::from_millis(100);
/// The S6 probe looks a second time this long after the first look.
const CLEANUP_SECOND_LOOK: Duration = Duration::from_millis(500);
/// The S6 probe's private lock lives at least this long: a key left behind must still be there
/// at the second look.
const CLEANUP_TTL_MIN: Duration = Duration::from_secs(2);
/// How long a takeover probe waits for its acquire's SETs to show on every node.
const TAKEOVER_SETTLE: Duration = Duration::from_millis(150);
/// The takeover probe's private lock lives at least this long.
const TAKEOVER_TTL_MIN: Duration = Duration::from_millis(500);
/// Per-command timeout of the engine's raw admin commands (DEL, SET, PEXPIRE on nodes).
const ADMIN_TIMEOUT: Duration = Duration::from_millis(200);

/// What one run does. Build with [`TortureConfig::new`] and adjust the fields.
#[derive(Debug, Clone)]
pub struct TortureConfig {
    /// Lock nodes: 3 or 5 (any odd number works).
    pub nodes: usize,
    /// Contending clients, each with its own proxies and `Redlock`.
    pub clients: usize,
    /// Shared resources the clients contend for.
    pub resources: usize,
    /// Resources held by a foreign owner on every node for the whole run.
    pub foreign_resources: usize,
    /// How long the clients run (the fault schedule fits inside it).
    pub duration: Duration,
    /// Seeds the fault schedule and every client's operations.
    pub seed: u64,
    /// Shortest TTL a client asks for.
    pub ttl_min: Duration,
    /// Longest TTL a client asks for (bounds every key's life: the restart delay depends on it).
    pub ttl_max: Duration,
    /// Which faults the schedule may use.
    pub faults: Vec<FaultKind>,
    /// Per-node timeout of most clients: short, as the algorithm wants.
    pub node_timeout: Duration,
    /// Per-node timeout of every third client (ids 2, 5, ...): long enough that latency faults
    /// produce grants with shrunken validity and `ValidityExpired` errors (row 7).
    pub patient_node_timeout: Duration,
    /// The clients' drift factor (the checker's S2 bound uses the same).
    pub drift_factor: f64,
    /// The clients' retry policy.
    pub retry: Retry,
}

impl TortureConfig {
    /// Defaults: 4 clients, 3 resources, 2 foreign resources, TTLs 50-200 ms, every fault,
    /// node timeout 50 ms (100 ms for patient clients), drift factor 0.01, 3 fast retries.
    pub fn new(nodes: usize, seed: u64, duration: Duration) -> TortureConfig {
        TortureConfig {
            nodes,
            clients: 4,
            resources: 3,
            foreign_resources: 2,
            duration,
            seed,
            ttl_min: Duration::from_millis(50),
            ttl_max: Duration::from_millis(200),
            faults: FaultKind::ALL.to_vec(),
            node_timeout: Duration::from_millis(50),
            patient_node_timeout: Duration::from_millis(100),
            drift_factor: fredlock::config::DEFAULT_DRIFT_FACTOR,
            retry: Retry {
                attempts: 3,
                delay: Duration::from_millis(5),
                jitter: Duration::from_millis(10),
            },
        }
    }

    /// How long a killed node stays down: the maximum TTL plus [`RESTART_MARGIN`].
    pub fn restart_delay(&self) -> Duration {
        self.ttl_max + RESTART_MARGIN
    }

    /// The command that replays this run (same schedule and operation sequences).
    pub fn replay_command(&self) -> String {
        format!(
            "cargo run --release --example torture -- --secs {} --seed {} --nodes {} --clients {} --resources {}",
            self.duration.as_secs(),
            self.seed,
            self.nodes,
            self.clients,
            self.resources
        )
    }

    /// Lanes of per-client network faults: one per 4 clients, at least 2 (each lane faults
    /// one of its own clients at a time, or all of them for latency).
    pub fn client_lanes(&self) -> usize {
        (self.clients / 4).max(2).min(self.clients)
    }

    fn patient(&self, client: usize) -> bool {
        client % 3 == 2
    }

    fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }
}

/// The faults of the schedule, by fault-matrix row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Row 2: kill -9 a minority, restart it (empty) only after the max TTL + margin.
    KillMinority,
    /// Row 2 (network form): every client cut from a minority (blackhole, reset, pass).
    PartitionMinority,
    /// Row 3: every client cut from a majority; no grant may happen meanwhile.
    PartitionMajority,
    /// Row 3: kill -9 a majority, delayed restart; no grant may happen meanwhile.
    KillMajority,
    /// Row 4: SIGSTOP a minority, then SIGCONT.
    PauseMinority,
    /// Row 5: SIGSTOP a majority for longer than the max TTL; no grant meanwhile.
    PauseMajority,
    /// Row 6: one client's proxies hold replies for longer than the max TTL, then deliver.
    HoldReplies,
    /// Row 7: 0.3-1.1 x TTL of reply latency on some nodes for some clients.
    Latency,
    /// Row 8: requests delivered, replies dropped; then reset, then pass.
    DropReplies,
    /// Row 9: connections reset (mid-command) for a while.
    Reset,
    /// Row 15: SCRIPT FLUSH on a node (restarts are row 2's delayed restarts).
    ScriptFlush,
}

impl FaultKind {
    /// Every fault.
    pub const ALL: [FaultKind; 11] = [
        FaultKind::KillMinority,
        FaultKind::PartitionMinority,
        FaultKind::PartitionMajority,
        FaultKind::KillMajority,
        FaultKind::PauseMinority,
        FaultKind::PauseMajority,
        FaultKind::HoldReplies,
        FaultKind::Latency,
        FaultKind::DropReplies,
        FaultKind::Reset,
        FaultKind::ScriptFlush,
    ];

    /// The fault-matrix row.
    pub fn row(self) -> &'static str {
        match self {
            FaultKind::KillMinority | FaultKind::PartitionMinority => "2",
            FaultKind::PartitionMajority | FaultKind::KillMajority => "3",
            FaultKind::PauseMinority => "4",
            FaultKind::PauseMajority => "5",
            FaultKind::HoldReplies => "6",
            FaultKind::Latency => "7",
            FaultKind::DropReplies => "8",
            FaultKind::Reset => "9",
            FaultKind::ScriptFlush => "15",
        }
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            FaultKind::KillMinority => "kill -9 minority, delayed restart",
            FaultKind::PartitionMinority => "partition minority (all clients)",
            FaultKind::PartitionMajority => "partition majority (all clients)",
            FaultKind::KillMajority => "kill -9 majority, delayed restart",
            FaultKind::PauseMinority => "SIGSTOP minority",
            FaultKind::PauseMajority => "SIGSTOP majority > max TTL",
            FaultKind::HoldReplies => "hold replies > max TTL (1 client)",
            FaultKind::Latency => "latency 0.3-1.1 x TTL",
            FaultKind::DropReplies => "drop replies, then reset",
            FaultKind::Reset => "TCP reset mid-command",
            FaultKind::ScriptFlush => "SCRIPT FLUSH",
        }
    }

    /// Node faults (lane 0) versus per-client network faults (lanes 1, 2).
    fn node_level(self) -> bool {
        !matches!(
            self,
            FaultKind::HoldReplies | FaultKind::Latency | FaultKind::DropReplies | FaultKind::Reset
        )
    }

    /// Faults that take a majority (everything is unavailable meanwhile).
    fn majority(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionMajority | FaultKind::KillMajority | FaultKind::PauseMajority
        )
    }

    /// Relative frequency in the schedule.
    fn weight(self) -> u32 {
        match self {
            FaultKind::KillMinority | FaultKind::PauseMinority => 3,
            FaultKind::PartitionMinority | FaultKind::ScriptFlush => 2,
            FaultKind::PartitionMajority | FaultKind::KillMajority | FaultKind::PauseMajority => 1,
            FaultKind::Latency | FaultKind::Reset => 3,
            FaultKind::HoldReplies | FaultKind::DropReplies => 2,
        }
    }

    /// Time the episode occupies after its nominal duration (the reset before passing again).
    fn tail(self) -> Duration {
        match self {
            FaultKind::PartitionMinority
            | FaultKind::PartitionMajority
            | FaultKind::DropReplies => RESET_HOLD,
            _ => Duration::ZERO,
        }
    }
}

/// One fault episode of the schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// 0: node faults; 1 and up: per-client network faults (see
    /// [`TortureConfig::client_lanes`]).
    pub lane: usize,
    /// Offset from the start of the run.
    pub start: Duration,
    /// How long the fault is held (a kill: how long the node stays down).
    pub duration: Duration,
    /// The fault.
    pub kind: FaultKind,
    /// The nodes it hits.
    pub nodes: Vec<usize>,
    /// The clients whose proxies it hits (empty for node faults).
    pub clients: Vec<usize>,
    /// The proxy fault, for per-client network faults.
    pub fault: Option<Fault>,
}

/// The random stream `tag` of a run: N = 3 and N = 5 runs of one seed get different streams.
fn stream(config: &TortureConfig, tag: u64) -> u64 {
    mix(config.seed, tag ^ ((config.nodes as u64) << 40))
}

/// splitmix64: independent streams from one seed.
fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rand_dur(rng: &mut StdRng, lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (lo.as_micros() as u64, hi.max(lo).as_micros() as u64);
    Duration::from_micros(rng.random_range(lo..=hi))
}

fn pick_weighted<T: Copy>(rng: &mut StdRng, items: &[(T, u32)]) -> T {
    let total: u32 = items.iter().map(|i| i.1).sum();
    let mut x = rng.random_range(0..total);
    for &(item, w) in items {
        if x < w {
            return item;
        }
        x -= w;
    }
    items[items.len() - 1].0
}

/// `k` distinct nodes of `0..n`, sorted.
fn pick_nodes(rng: &mut StdRng, n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(rng);
    all.truncate(k);
    all.sort_unstable();
    all
}

/// The fault schedule of a run, generated from its seed alone (the same config gives the same
/// schedule). Every episode ends before `duration`.
pub fn schedule(config: &TortureConfig) -> Vec<Episode> {
    let mut rng = StdRng::seed_from_u64(stream(config, 1));
    let n = config.nodes;
    let minority = (n.saturating_sub(1)) / 2;
    let quorum = config.quorum();
    let end = config.duration.saturating_sub(ms(200));
    let mut out = Vec::new();
    let weighted = |node_level: bool| -> Vec<(FaultKind, u32)> {
        FaultKind::ALL
            .iter()
            .filter(|k| config.faults.contains(k) && k.node_level() == node_level)
            .filter(|k| minority > 0 || k.majority() || !k.node_level())
            .map(|&k| (k, k.weight()))
            .collect()
    };
    // Every length is a multiple of the longest TTL: long enough for a fault to catch holders
    // (and its minimum, where a row needs one, is set by the TTL), no longer than that, so the
    // run spends its time on many episodes rather than on a few long ones.
    let unit = config.ttl_max;
    let long = |rng: &mut StdRng, min: Duration| rand_dur(rng, min, min + unit / 2);
    let short = |rng: &mut StdRng| rand_dur(rng, ms(50), ms(50).max(unit * 2));
    let gap = |rng: &mut StdRng| rand_dur(rng, unit / 8, unit * 5 / 4);

    // Each lane first deals every kind it has once, in a seeded order, then picks by weight:
    // even a short run covers every row.
    let deck = |rng: &mut StdRng, kinds: &[(FaultKind, u32)]| -> Vec<FaultKind> {
        let mut d: Vec<FaultKind> = kinds.iter().map(|k| k.0).collect();
        d.shuffle(rng);
        d
    };

    // Lane 0: node faults, one at a time.
    let kinds = weighted(true);
    if !kinds.is_empty() {
        let mut t = gap(&mut rng);
        let mut misses = 0;
        let mut dealt = deck(&mut rng, &kinds);
        while misses < 8 {
            let kind = match dealt.pop() {
                Some(k) => k,
                None => pick_weighted(&mut rng, &kinds),
            };
            let count = if kind.majority() {
                rng.random_range(quorum..=n)
            } else if kind == FaultKind::ScriptFlush {
                1
            } else {
                rng.random_range(1..=minority.max(1))
            };
            let nodes = pick_nodes(&mut rng, n, count);
            let duration = match kind {
                // Down for longer than any key lives: the restart is safe (row 2).
                FaultKind::KillMinority | FaultKind::KillMajority => {
                    long(&mut rng, config.restart_delay())
                }
                FaultKind::PauseMajority => long(&mut rng, config.ttl_max + RESTART_MARGIN),
                FaultKind::ScriptFlush => Duration::ZERO,
                _ => short(&mut rng),
            };
            let busy = duration + kind.tail();
            let gap = gap(&mut rng);
            if t + busy > end {
                misses += 1;
                continue;
            }
            out.push(Episode {
                lane: 0,
                start: t,
                duration,
                kind,
                nodes,
                clients: Vec::new(),
                fault: None,
            });
            t += busy + gap;
        }
    }

    // Lanes 1.. : per-client network faults, each lane on its own clients.
    let kinds = weighted(false);
    let lanes = config.client_lanes();
    for lane in 0..lanes {
        if kinds.is_empty() {
            break;
        }
        let mine: Vec<usize> = (0..config.clients).filter(|c| c % lanes == lane).collect();
        let mut t = gap(&mut rng);
        let mut misses = 0;
        let mut dealt = deck(&mut rng, &kinds);
        while misses < 8 {
            let kind = match dealt.pop() {
                Some(k) => k,
                None => pick_weighted(&mut rng, &kinds),
            };
            let everyone = rng.random_bool(0.3);
            let one = mine[rng.random_range(0..mine.len())];
            let clients = if kind == FaultKind::Latency && everyone {
                mine.clone()
            } else {
                vec![one]
            };
            let count = rng.random_range(1..=n);
            let nodes = pick_nodes(&mut rng, n, count);
            let ttl = rand_dur(&mut rng, config.ttl_min, config.ttl_max);
            let factor = rng.random_range(0.3..=1.1);
            let (duration, fault) = match kind {
                FaultKind::HoldReplies => {
                    (long(&mut rng, config.ttl_max + ms(50)), Fault::HoldReplies)
                }
                FaultKind::Latency => (short(&mut rng), Fault::Latency(ttl.mul_f64(factor))),
                FaultKind::DropReplies => (short(&mut rng), Fault::DropReplies),
                _ => (
                    rand_dur(&mut rng, ms(50), ms(50).max(unit * 3 / 8)),
                    Fault::Reset,
                ),
            };
            let busy = duration + kind.tail();
            let gap = gap(&mut rng);
            if t + busy > end {
                misses += 1;
                continue;
            }
            out.push(Episode {
                lane: lane + 1,
                start: t,
                duration,
                kind,
                nodes,
                clients,
                fault: Some(fault),
            });
            t += busy + gap;
        }
    }
    out
}

/// FNV-1a of the schedule's debug form: two runs with the same fingerprint ran the same faults.
pub fn fingerprint(episodes: &[Episode]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{episodes:?}").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A fresh random seed (printed by the callers, so the run can be replayed).
pub fn random_seed() -> u64 {
    rand::random::<u64>() >> 1
}

/// Counters of one run, summed over the clients.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Acquire calls (acquire, try_acquire, two-resource acquire, `with_lock`), foreign ones
    /// excluded.
    pub attempted: u64,
    /// Of those, granted.
    pub granted: u64,
    /// Failed: held by someone else (including `try_acquire`'s `Ok(None)`).
    pub contended: u64,
    /// Failed: too few nodes reachable.
    pub unavailable: u64,
    /// Failed: a quorum granted too late.
    pub validity_expired: u64,
    /// Granted, then lost while kept alive (`lost()` fired, or `with_lock` returned `Lost`).
    pub lost: u64,
    /// Failed for another reason.
    pub other: u64,
    /// The first few "other" errors.
    pub other_errors: Vec<String>,
    /// Counter writes acknowledged.
    pub writes: u64,
    /// Counter writes skipped because too little validity was left (the guard).
    pub writes_skipped: u64,
    /// Data-node errors (the data node is never faulted: should be 0).
    pub data_errors: u64,
    /// Explicit extend calls on live locks.
    pub extends: u64,
    /// Of those, successful.
    pub extends_ok: u64,
    /// Releases that returned `Ok`.
    pub releases_ok: u64,
    /// Releases that returned `NotHeld`.
    pub releases_not_held: u64,
    /// Releases that returned another error.
    pub releases_failed: u64,
    /// Extends of stale (expired) locks.
    pub stale_extends: u64,
    /// Releases of stale locks while this client held the resource again.
    pub stale_releases_with_holder: u64,
    /// Releases of stale locks without a new holder.
    pub stale_releases: u64,
    /// Stale operations skipped (no stale lock was ready).
    pub stale_skipped: u64,
    /// Private-resource probes with the keys taken over by a foreign value.
    pub takeovers: u64,
    /// Private-resource probes with the keys deleted (revival).
    pub revivals: u64,
    /// Attempts on foreign resources.
    pub foreign_attempts: u64,
    /// Inspections that a fresh grant's token is on a quorum.
    pub quorum_checks: u64,
    /// S6 probes: acquires cancelled (future dropped), failed, granted (then released).
    pub cleanup_probes: [u64; 3],
    /// Operations run, by kind.
    pub ops: BTreeMap<&'static str, u64>,
    /// Client time by operation kind (think time included), split by whether it got a grant.
    pub op_time: BTreeMap<(&'static str, bool), Duration>,
}

impl Stats {
    fn merge(&mut self, o: &Stats) {
        self.attempted += o.attempted;
        self.granted += o.granted;
        self.contended += o.contended;
        self.unavailable += o.unavailable;
        self.validity_expired += o.validity_expired;
        self.lost += o.lost;
        self.other += o.other;
        for e in &o.other_errors {
            if self.other_errors.len() < 5 && !self.other_errors.contains(e) {
                self.other_errors.push(e.clone());
            }
        }
        self.writes += o.writes;
        self.writes_skipped += o.writes_skipped;
        self.data_errors += o.data_errors;
        self.extends += o.extends;
        self.extends_ok += o.extends_ok;
        self.releases_ok += o.releases_ok;
        self.releases_not_held += o.releases_not_held;
        self.releases_failed += o.releases_failed;
        self.stale_extends += o.stale_extends;
        self.stale_releases_with_holder += o.stale_releases_with_holder;
        self.stale_releases += o.stale_releases;
        self.stale_skipped += o.stale_skipped;
        self.takeovers += o.takeovers;
        self.revivals += o.revivals;
        self.foreign_attempts += o.foreign_attempts;
        self.quorum_checks += o.quorum_checks;
        for i in 0..3 {
            self.cleanup_probes[i] += o.cleanup_probes[i];
        }
        for (k, v) in &o.ops {
            *self.ops.entry(k).or_default() += v;
        }
        for (k, v) in &o.op_time {
            *self.op_time.entry(*k).or_default() += *v;
        }
    }

    /// Counts an acquire outcome; returns the lock if granted.
    fn outcome<T>(&mut self, res: Result<Option<T>, Error>) -> Option<T> {
        self.attempted += 1;
        match res {
            Ok(Some(lock)) => {
                self.granted += 1;
                Some(lock)
            }
            Ok(None) => {
                self.contended += 1;
                None
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    fn failed(&mut self, e: &Error) {
        match e {
            Error::Contended { .. } => self.contended += 1,
            Error::Unavailable { .. } => self.unavailable += 1,
            Error::ValidityExpired { .. } => self.validity_expired += 1,
            Error::Lost { .. } => self.lost += 1,
            other => {
                self.other += 1;
                if self.other_errors.len() < 5 {
                    self.other_errors.push(other.to_string());
                }
            }
        }
    }
}

/// Everything one run produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run's configuration.
    pub config: TortureConfig,
    /// Counters.
    pub stats: Stats,
    /// Faults injected: count and total time held, by kind.
    pub faults: BTreeMap<FaultKind, (u64, Duration)>,
    /// Episodes in the schedule.
    pub episodes: usize,
    /// [`fingerprint`] of the schedule.
    pub fingerprint: u64,
    /// The checker's verdict.
    pub check: CheckerReport,
    /// Wall time of the whole run (set-up and checks included).
    pub wall: Duration,
    /// Lock keys left on the nodes right after the run (each checked to expire within the TTL).
    pub leftover_keys: usize,
    /// The worst wake-up delay of a probe task sleeping 5 ms at a time during the run: how late
    /// ANY timer of this process could fire (the yardstick for the lost-signal lateness).
    pub timer_lateness: Duration,
}

impl Report {
    /// Violations found (any kind).
    pub fn violations(&self) -> usize {
        self.check.violations.len()
    }
}

/// Each client's proxies have two fault layers: the node lane's (a partition of every client)
/// wins over the client lanes' (one client's link). Each layer ends its swallowing faults with a
/// reset, so the effective fault does too.
struct Board {
    proxies: Vec<Vec<FaultProxy>>,
    layers: Mutex<Vec<Vec<[Fault; 2]>>>,
    /// Per client and node, bumped whenever that proxy's effective fault changes.
    epochs: Vec<Vec<AtomicU64>>,
}

impl Board {
    fn set(&self, layer: usize, clients: &[usize], nodes: &[usize], fault: Fault) {
        let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        for &c in clients {
            for &n in nodes {
                let l = &mut layers[c][n];
                l[layer] = fault;
                let effective = if l[0] != Fault::Pass { l[0] } else { l[1] };
                if self.proxies[c][n].fault() != effective {
                    self.epochs[c][n].fetch_add(1, Ordering::SeqCst);
                }
                self.proxies[c][n].set(effective);
            }
        }
    }

    /// One client's proxy epochs, by node.
    fn epochs(&self, client: usize) -> Vec<u64> {
        self.epochs[client]
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect()
    }
}

/// What the clients and the fault lanes share.
struct Env {
    config: TortureConfig,
    checker: Arc<Checker>,
    observer: Redlock,
    admin: RwLock<LocalNodes>,
    board: Board,
    /// Per node, bumped whenever it is killed, restarted, paused or resumed: a check that
    /// depends on a node's keys skips nodes whose epoch moved (a frozen node can execute an old
    /// `SET` late when it resumes; a restarted one lost everything).
    epochs: Vec<AtomicU64>,
    resources: Vec<String>,
    foreign: Vec<String>,
    foreign_px: u64,
}

impl Env {
    fn epochs(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect()
    }

    fn bump(&self, node: usize) {
        self.epochs[node].fetch_add(1, Ordering::SeqCst);
    }

    async fn plant_foreign(&self, admin: &LocalNodes, node: usize) {
        let px = self.foreign_px.to_string();
        for f in &self.foreign {
            let key = self.observer.key(f);
            let args = ["SET", key.as_str(), FOREIGN_VALUE, "PX", px.as_str()];
            if admin
                .command_timeout(node, &args, Duration::from_secs(2))
                .await
                .is_err()
            {
                self.checker.violation(
                    ViolationKind::Engine,
                    format!("could not plant {key} on node {node}"),
                );
            }
        }
    }
}

fn same(a: &[u64], b: &[u64]) -> Vec<bool> {
    a.iter().zip(b).map(|(x, y)| x == y).collect()
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A fred client to the data node (never faulted): one attempt per command (a write is never
/// replayed behind our back), a 2 s timeout as a safety net.
async fn data_client(url: &str) -> io::Result<Client> {
    let config = Config::from_url(url).map_err(io_err)?;
    let client = fredlock::fred::types::Builder::from_config(config)
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .with_connection_config(|c| {
            c.max_command_attempts = 1;
            c.tcp.nodelay = Some(true);
        })
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(2))
        .build()
        .map_err(io_err)?;
    client.init().await.map_err(io_err)?;
    Ok(client)
}

fn data_key(resource: &str) -> String {
    format!("data:{resource}")
}

/// Validity a critical section wants left before it reads or writes: a holder must not act
/// past its deadline (row 10 is outside Redlock's guarantee), so each step leaves room for a
/// slow `GET`/`SET` on a loaded machine.
fn section_guard(ttl: Duration) -> Duration {
    ms(25) + ttl / 10
}

/// Records a counter write as uncertain if its future is dropped before the `SET` answered.
struct PendingWrite {
    checker: Arc<Checker>,
    id: u64,
    done: bool,
}

impl PendingWrite {
    fn complete(mut self, at: Instant) {
        self.checker.complete_write(self.id, at);
        self.done = true;
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.done {
            self.checker.uncertain_write(self.id);
        }
    }
}

/// Records when a `with_lock` closure stopped (returned or was cancelled).
struct DropClock(Arc<Mutex<Option<Instant>>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

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
        }
    }
}

const OP_WEIGHTS: [(OpKind, u32); 11] = [
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
    let kind = pick_weighted(rng, &OP_WEIGHTS);
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
    Op {
        kind,
        resources: [a, b],
        foreign,
        ttl,
        ttl2,
        steps,
        flag: rng.random_bool(0.3),
        flag2: rng.random_bool(0.25),
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

    /// One non-atomic read-modify-write of `resource`'s counter, only while `valid()` says the
    /// lock has enough validity left (checked before the GET and again before the SET).
    async fn increment(
        &mut self,
        grant: GrantId,
        resource: &str,
        pause: Duration,
        valid: impl Fn() -> bool,
    ) -> bool {
        if !valid() {
            self.stats.writes_skipped += 1;
            return false;
        }
        let key = data_key(resource);
        let read_at = Instant::now();
        let raw: Option<String> = match self.data.get(key.as_str()).await {
            Ok(v) => v,
            Err(_) => {
                self.stats.data_errors += 1;
                return false;
            }
        };
        let Some(read) = DataValue::parse(raw.as_deref()) else {
            self.checker().violation(
                ViolationKind::LostUpdate,
                format!("{key}: unparsable counter {raw:?}"),
            );
            return false;
        };
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        if !valid() {
            self.stats.writes_skipped += 1;
            return false;
        }
        let id = self.checker().begin_write(grant, resource, read, read_at);
        // From here until the SET is answered, a dropped future (a cancelled with_lock
        // section) leaves the write's outcome unknown: the guard records that.
        let pending = PendingWrite {
            checker: self.env.checker.clone(),
            id,
            done: false,
        };
        let res: Result<Value, _> = self
            .data
            .set(key.as_str(), read.next(id).encode(), None, None, false)
            .await;
        match res {
            Ok(_) => {
                pending.complete(Instant::now());
                self.stats.writes += 1;
                true
            }
            Err(_) => {
                self.stats.data_errors += 1;
                false
            }
        }
    }

    /// Releases a stale lock outside the stale-lock checks (eviction, end of run). Its window
    /// was recorded up to its deadline; if that has not passed yet, a release now really ends
    /// it early (the next holder may get in at once), so the window must end here.
    async fn release_stale(&mut self, stale: Stale) {
        self.checker().event(format!(
            "client {}: engine releases stale grant #{} (deadline in {:?})",
            self.id,
            stale.grant,
            stale.lock.remaining()
        ));
        self.checker()
            .close(stale.grant, Instant::now(), stale.lock.deadline());
        let _ = stale.lock.release().await;
    }

    /// Closes the window at the release call's start (or the deadline), then releases.
    async fn release(&mut self, grant: GrantId, lock: Lock) {
        self.checker().close(grant, Instant::now(), lock.deadline());
        match lock.release().await {
            Ok(_) => self.stats.releases_ok += 1,
            Err(Error::NotHeld { .. }) => self.stats.releases_not_held += 1,
            Err(_) => self.stats.releases_failed += 1,
        }
    }

    async fn extend(&mut self, grant: GrantId, lock: &mut Lock, ttl: Duration) -> bool {
        let old = lock.deadline();
        let call = Instant::now();
        let ok = lock.extend(ttl).await.is_ok();
        self.stats.extends += 1;
        self.stats.extends_ok += u64::from(ok);
        self.checker()
            .extended(grant, call, old, ttl, ok.then(|| lock.deadline()));
        ok
    }

    /// S1: right after a grant, its token must be on a quorum of nodes.
    async fn verify_quorum(&mut self, grant: GrantId, lock: &Lock) {
        let before = self.env.epochs();
        let Ok(inspection) = self.env.observer.inspect(&lock.resources()[0]).await else {
            return;
        };
        let in_time = Instant::now() < lock.deadline();
        let eligible = same(&before, &self.env.epochs());
        self.checker()
            .check_quorum(grant, lock.token(), &inspection, &eligible, in_time);
        self.stats.quorum_checks += 1;
    }

    async fn op_acquire(&mut self, op: &Op, try_only: bool) {
        let r = self.resource(op.resources[0]);
        let res = if try_only {
            self.redlock.try_acquire(r.as_str(), op.ttl).await
        } else {
            self.redlock.acquire(r.as_str(), op.ttl).await.map(Some)
        };
        let granted_at = Instant::now();
        let Some(mut lock) = self.outcome(res) else {
            return;
        };
        let kind = if try_only {
            GrantKind::TryAcquire
        } else {
            GrantKind::Acquire
        };
        let g = self.checker().grant(self.id, &lock, kind, granted_at);
        if op.flag {
            self.verify_quorum(g, &lock).await;
        }
        let guard = section_guard(op.ttl.min(op.ttl2));
        let half = op.steps.len() / 2;
        for (i, &(pause, _)) in op.steps.iter().enumerate() {
            if op.flag2 && i == half {
                self.extend(g, &mut lock, op.ttl2).await;
            }
            self.increment(g, &r, pause, || lock.remaining() >= guard)
                .await;
        }
        self.release(g, lock).await;
    }

    async fn op_multi(&mut self, op: &Op) {
        let r1 = self.resource(op.resources[0]);
        let r2 = self.resource(op.resources[1]);
        let res = self
            .redlock
            .acquire([r1.as_str(), r2.as_str()], op.ttl)
            .await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Multi, granted_at);
        let guard = section_guard(op.ttl);
        for &(pause, _) in &op.steps {
            for r in lock.resources().to_vec() {
                self.increment(g, &r, pause, || lock.remaining() >= guard)
                    .await;
            }
        }
        self.release(g, lock).await;
    }

    async fn op_keep_alive(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::KeepAlive, granted_at);
        let guard = lock.keep_alive();
        let handle = guard.handle();
        // Records when the lost signal fired (S8), from its own task as a real waiter would.
        let lost: Arc<Mutex<Option<(LostReason, Instant)>>> = Arc::default();
        let watcher = {
            let (handle, lost) = (handle.clone(), lost.clone());
            tokio::spawn(async move {
                let reason = handle.lost().await;
                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some((reason, Instant::now()));
            })
        };
        let margin = section_guard(op.ttl);
        for &(pause, sleep) in &op.steps {
            if handle.is_lost() {
                break;
            }
            self.increment(g, &r, pause, || {
                !handle.is_lost() && handle.remaining() >= margin
            })
            .await;
            tokio::time::sleep(sleep).await;
        }
        let stopped = Instant::now();
        let deadline = handle.deadline();
        let fired = *lost.lock().unwrap_or_else(|p| p.into_inner());
        let end = match fired {
            Some((reason, at)) if reason != LostReason::Released => {
                self.stats.lost += 1;
                self.checker().lost_signal(g, at, deadline);
                at.min(stopped)
            }
            _ => {
                if handle.is_lost() {
                    self.stats.lost += 1;
                }
                stopped
            }
        };
        self.checker().close(g, end, deadline);
        watcher.abort();
        match guard.release().await {
            Ok(_) => self.stats.releases_ok += 1,
            Err(Error::NotHeld { .. }) => self.stats.releases_not_held += 1,
            Err(_) => self.stats.releases_failed += 1,
        }
    }

    async fn op_with_lock(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let redlock = self.redlock.clone();
        let info: Arc<Mutex<Option<(GrantId, LockHandle)>>> = Arc::default();
        let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (ttl, margin, steps) = (op.ttl, section_guard(op.ttl), op.steps.clone());
        let me = &mut *self;
        let res = {
            let (info, stopped, r2) = (info.clone(), stopped.clone(), r.clone());
            redlock
                .with_lock(r.as_str(), ttl, move |handle| async move {
                    let started = Instant::now();
                    let g = me.checker().grant_handle(
                        me.id,
                        &handle,
                        ttl,
                        GrantKind::WithLock,
                        started,
                    );
                    *info.lock().unwrap_or_else(|p| p.into_inner()) = Some((g, handle.clone()));
                    // Dropped when the closure returns OR is cancelled: when it stopped acting.
                    let _clock = DropClock(stopped);
                    for (pause, sleep) in steps {
                        if handle.is_lost() {
                            break;
                        }
                        me.increment(g, &r2, pause, || {
                            !handle.is_lost() && handle.remaining() >= margin
                        })
                        .await;
                        tokio::time::sleep(sleep).await;
                    }
                })
                .await
        };
        let info = info.lock().unwrap_or_else(|p| p.into_inner()).take();
        let lost = matches!(res, Err(Error::Lost { .. }));
        self.stats.attempted += 1;
        match (&res, &info) {
            (Ok(()), _) | (Err(Error::Lost { .. }), Some(_)) => self.stats.granted += 1,
            _ => {}
        }
        if let Err(e) = &res {
            self.stats.failed(e);
        }
        if let Some((g, handle)) = info {
            let stopped_at = stopped
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(Instant::now);
            let deadline = handle.deadline();
            if lost {
                self.checker().lost_signal(g, stopped_at, deadline);
            }
            self.checker().close(g, stopped_at, deadline);
        }
    }

    async fn op_extend_near_expiry(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(mut lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Acquire, granted_at);
        let guard = section_guard(op.ttl);
        self.increment(g, &r, op.steps[0].0, || lock.remaining() >= guard)
            .await;
        // Right before, at or just after the deadline (row 13).
        let at = if op.offset_us < 0 {
            lock.deadline()
                .checked_sub(Duration::from_micros(op.offset_us.unsigned_abs()))
                .unwrap_or(lock.deadline())
        } else {
            lock.deadline() + Duration::from_micros(op.offset_us as u64)
        };
        tokio::time::sleep_until(at).await;
        if self.extend(g, &mut lock, op.ttl2).await {
            let guard = section_guard(op.ttl2);
            self.increment(g, &r, op.steps[1].0, || lock.remaining() >= guard)
                .await;
        }
        self.release(g, lock).await;
    }

    async fn op_abandon(&mut self, op: &Op) {
        let r = self.resource(op.resources[0]);
        let epochs = self.env.epochs();
        let res = self.redlock.acquire(r.as_str(), op.ttl).await;
        let granted_at = Instant::now();
        let Some(lock) = self.outcome(res.map(Some)) else {
            return;
        };
        let g = self
            .checker()
            .grant(self.id, &lock, GrantKind::Abandoned, granted_at);
        let guard = section_guard(op.ttl);
        self.increment(g, &r, op.steps[0].0, || lock.remaining() >= guard)
            .await;
        // Formally held until the deadline: the window runs to it (the stricter choice).
        self.checker().close(g, lock.deadline(), lock.deadline());
        self.stale.push(Stale {
            lock,
            grant: g,
            epochs,
        });
        if self.stale.len() > MAX_STALE {
            let oldest = self.stale.remove(0);
            self.release_stale(oldest).await;
        }
    }

    /// Rows 13 and 14: extend and release a lock whose deadline passed, often while this
    /// client holds the resource again under a new token.
    async fn op_stale(&mut self, op: &Op) {
        let now = Instant::now();
        // Old enough that every SET of its acquire has landed or been dropped by fred.
        let ready: Vec<usize> = (0..self.stale.len())
            .filter(|&i| {
                let l = &self.stale[i].lock;
                l.deadline() + ms(5) < now && l.acquired_at() + self.node_timeout + ms(100) < now
            })
            .collect();
        if ready.is_empty() {
            self.stats.stale_skipped += 1;
            return;
        }
        let Stale {
            mut lock,
            grant,
            epochs,
        } = self.stale.remove(ready[op.pick % ready.len()]);
        let r = lock.resources()[0].clone();
        let token = lock.token().to_string();
        let mut holder = None;
        if op.flag || op.flag2 {
            // Patient: the point is to have a live holder while the stale lock acts.
            let res = self
                .redlock
                .acquire_with(r.as_str(), op.ttl, self.env.config.ttl_max)
                .await;
            let at = Instant::now();
            if let Some(l) = self.outcome(res.map(Some)) {
                let gb = self.checker().grant(self.id, &l, GrantKind::Reacquire, at);
                holder = Some((l, gb));
            }
        }
        let e0 = self.env.epochs();
        let before = self.env.observer.inspect(&r).await.ok();
        let old = lock.deadline();
        let call = Instant::now();
        let res = lock.extend(op.ttl2).await;
        self.stats.stale_extends += 1;
        self.checker().extended(
            grant,
            call,
            old,
            op.ttl2,
            res.is_ok().then(|| lock.deadline()),
        );
        let after = self.env.observer.inspect(&r).await.ok();
        let e1 = self.env.epochs();
        if let (Some(b), Some(a)) = (&before, &after) {
            self.checker()
                .check_revival("stale extend", &token, b, a, &same(&epochs, &e1));
            if let Some((hl, _)) = &holder {
                if Instant::now() < hl.deadline() {
                    self.checker().check_holder_intact(
                        "stale extend vs the new holder",
                        hl.token(),
                        b,
                        a,
                        &same(&e0, &e1),
                    );
                }
            }
        }
        let released = lock.release().await;
        match holder {
            None => self.stats.stale_releases += 1,
            Some((hl, gb)) => {
                self.stats.stale_releases_with_holder += 1;
                if released.is_ok() {
                    self.checker().violation(
                        ViolationKind::StaleOpSucceeded,
                        format!(
                            "stale release of {r} (token {token}) returned Ok while grant #{gb} (token {}) held a quorum",
                            hl.token()
                        ),
                    );
                }
                let after2 = self.env.observer.inspect(&r).await.ok();
                let e2 = self.env.epochs();
                if let (Some(a), Some(a2)) = (&after, &after2) {
                    if Instant::now() < hl.deadline() {
                        self.checker().check_holder_intact(
                            "stale release vs the new holder",
                            hl.token(),
                            a,
                            a2,
                            &same(&e0, &e2),
                        );
                    }
                }
                let guard = section_guard(op.ttl);
                self.increment(gb, &r, op.steps[0].0, || hl.remaining() >= guard)
                    .await;
                self.release(gb, hl).await;
            }
        }
    }

    /// Foreign-held resources must never be granted, alone or with another resource, and the
    /// failed attempt's clean-up must not delete the foreign key (checked at the end).
    async fn op_foreign(&mut self, op: &Op) {
        let f = self.env.foreign[op.foreign % self.env.foreign.len()].clone();
        self.stats.foreign_attempts += 1;
        let granted = if op.flag {
            let r = self.resource(op.resources[0]);
            self.redlock
                .acquire([r.as_str(), f.as_str()], op.ttl)
                .await
                .ok()
        } else {
            self.redlock
                .try_acquire(f.as_str(), op.ttl)
                .await
                .ok()
                .flatten()
        };
        if let Some(lock) = granted {
            self.checker().violation(
                ViolationKind::ForeignGranted,
                format!(
                    "client {} was granted {:?} (token {}) although {f} is held by a foreign owner on every node",
                    self.id,
                    lock.resources(),
                    lock.token()
                ),
            );
            let _ = lock.release().await;
        }
    }

    /// S4 and S5 at the script level, on a resource only this client uses (see
    /// [`TakeoverProbe`]). It waits on the nodes and on admin commands for most of its time, so
    /// it runs as a task of its own while the client goes on.
    async fn op_takeover(&mut self, op: &Op) {
        self.private_seq += 1;
        let probe = TakeoverProbe {
            env: self.env.clone(),
            redlock: self.redlock.clone(),
            client: self.id,
            resource: format!("private:{}:{}", self.id, self.private_seq),
            foreign: format!("takeover:{}:{}", self.id, self.private_seq),
            revive: op.flag,
            stats: Stats::default(),
        };
        self.spawn_probe(probe.run()).await;
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

    /// S6 on a resource only this client uses: an acquire given 0-3 ms (so its future is
    /// dropped before, during or after its SETs), or one that fails, or a lock released, must
    /// leave no key behind on any node it can reach. Only nodes whose state and whose proxy
    /// for this client did not change meanwhile count: a node that froze, restarted, or whose
    /// link reset may keep a key until its TTL, which S6 allows for unreachable nodes.
    ///
    /// The looks at the nodes wait for the clean-up to land (hundreds of milliseconds): they run
    /// in a task of their own, so the client goes on with its next operation meanwhile.
    async fn op_cancel(&mut self, op: &Op) {
        self.private_seq += 1;
        let p = format!("private:{}:{}", self.id, self.private_seq);
        // A long TTL (the resource is private, no one waits for it): a key left behind is still
        // there at the second look below, while a clean-up that is merely slow is not.
        let ttl = (self.env.config.ttl_max * 4).max(CLEANUP_TTL_MIN);
        let (e0, pe0) = (self.env.epochs(), self.env.board.epochs(self.id));
        let budget = Duration::from_micros(op.offset_us.unsigned_abs() % 3_000);
        let outcome =
            match tokio::time::timeout(budget, self.redlock.acquire(p.as_str(), ttl)).await {
                Ok(Ok(lock)) => {
                    self.stats.cleanup_probes[2] += 1;
                    let _ = lock.release().await;
                    "granted and released"
                }
                Ok(Err(_)) => {
                    self.stats.cleanup_probes[1] += 1;
                    "failed"
                }
                Err(_) => {
                    self.stats.cleanup_probes[0] += 1;
                    "cancelled"
                }
            };
        let probe = CleanupProbe {
            given_up: Instant::now(),
            env: self.env.clone(),
            client: self.id,
            node_timeout: self.node_timeout,
            resource: p,
            outcome,
            budget,
            ttl,
            node_epochs: e0,
            link_epochs: pe0,
        };
        self.spawn_probe(async move {
            probe.look().await;
            Stats::default()
        })
        .await;
    }
}

/// S4 and S5 at the script level, on a resource only one client uses: after the grant, the
/// keys are deleted (the lock is gone: extend must fail and not re-create them) or overwritten
/// by a foreign value (extend and release must not touch it).
struct TakeoverProbe {
    env: Arc<Env>,
    redlock: Redlock,
    client: usize,
    resource: String,
    /// The value that takes the keys over.
    foreign: String,
    /// Delete the keys (a revival probe) rather than take them over.
    revive: bool,
    stats: Stats,
}

impl TakeoverProbe {
    fn checker(&self) -> &Checker {
        &self.env.checker
    }

    async fn run(mut self) -> Stats {
        let p = self.resource.clone();
        let key = self.redlock.key(&p);
        // Private: a long TTL costs nothing and leaves the extend below well inside validity.
        let ttl = (self.env.config.ttl_max * 4).max(TAKEOVER_TTL_MIN);
        let e_grant = self.env.epochs();
        let res = self.redlock.acquire(p.as_str(), ttl).await;
        let granted_at = Instant::now();
        let Some(mut lock) = self.stats.outcome(res.map(Some)) else {
            return self.stats;
        };
        let g = self
            .checker()
            .grant(self.client, &lock, GrantKind::Acquire, granted_at);
        // Let every SET of this acquire reach its node first: one still on its way (queued in
        // the client, or in a starved proxy) could otherwise land after the deletion and look
        // like a revival. Usually the first look shows the token on every node that answers;
        // a node where it does not show counts as disturbed (it may still get it).
        let settle_until = Instant::now() + TAKEOVER_SETTLE;
        let seen = loop {
            let Ok(i) = self.env.observer.inspect(&p).await else {
                break vec![false; self.env.config.nodes];
            };
            let seen: Vec<bool> = i
                .nodes
                .iter()
                .map(|n| matches!(&n.state, Ok(Some(h)) if h.token == lock.token()))
                .collect();
            let absent = i.nodes.iter().any(|n| matches!(&n.state, Ok(None)));
            if !absent || Instant::now() >= settle_until {
                break seen;
            }
            tokio::time::sleep(ms(5)).await;
        };
        let revive = self.revive;
        let foreign = self.foreign.clone();
        {
            let admin = self.env.admin.read().await;
            for i in 0..self.env.config.nodes {
                let args: Vec<&str> = if revive {
                    vec!["DEL", key.as_str()]
                } else {
                    vec!["SET", key.as_str(), foreign.as_str(), "PX", "30000"]
                };
                let _ = admin.command_timeout(i, &args, ADMIN_TIMEOUT).await;
            }
        }
        let q = self.env.config.quorum();
        let e0 = self.env.epochs();
        let before = self.env.observer.inspect(&p).await.ok();
        let old = lock.deadline();
        let call = Instant::now();
        let extended = lock.extend(ttl).await.is_ok();
        self.checker()
            .extended(g, call, old, ttl, extended.then(|| lock.deadline()));
        let after = self.env.observer.inspect(&p).await.ok();
        let e1 = self.env.epochs();
        // Nodes that may still hold our token: where it was seen, unknown, or disturbed.
        let holders = |b: &Inspection, eligible: &[bool]| -> usize {
            b.nodes
                .iter()
                .enumerate()
                .filter(|(i, n)| match &n.state {
                    _ if !eligible[*i] => true,
                    Ok(Some(h)) => h.token == lock.token(),
                    Ok(None) => false,
                    Err(_) => true,
                })
                .count()
        };
        let eligible: Vec<bool> = same(&e_grant, &e1)
            .into_iter()
            .zip(&seen)
            .map(|(undisturbed, &seen)| undisturbed && seen)
            .collect();
        if let (Some(b), Some(a)) = (&before, &after) {
            let held = holders(b, &eligible);
            if extended && held < q {
                self.checker().violation(
                    ViolationKind::StaleOpSucceeded,
                    format!(
                        "extend of {p} (token {}) returned Ok after its keys were {} on all but {held} node(s)",
                        lock.token(),
                        if revive { "deleted" } else { "taken over" }
                    ),
                );
            }
            if revive {
                self.stats.revivals += 1;
                self.checker().check_revival(
                    "extend after the keys were deleted",
                    lock.token(),
                    b,
                    a,
                    &eligible,
                );
            } else {
                self.stats.takeovers += 1;
                self.check_takeover(
                    &key,
                    &foreign,
                    b,
                    a,
                    &same(&e0, &e1),
                    "extend after takeover",
                );
            }
        }
        let token = lock.token().to_string();
        let held = before.as_ref().map(|b| holders(b, &eligible));
        self.checker().close(g, Instant::now(), lock.deadline());
        let released = lock.release().await.is_ok();
        if released && held.is_some_and(|h| h < q) {
            self.checker().violation(
                ViolationKind::StaleOpSucceeded,
                format!("release of {p} (token {token}) returned Ok although its keys were gone"),
            );
        }
        if !revive {
            let after2 = self.env.observer.inspect(&p).await.ok();
            let e2 = self.env.epochs();
            if let (Some(b), Some(a2)) = (&before, &after2) {
                self.check_takeover(
                    &key,
                    &foreign,
                    b,
                    a2,
                    &same(&e0, &e2),
                    "release after takeover",
                );
            }
            let admin = self.env.admin.read().await;
            for i in 0..self.env.config.nodes {
                let _ = admin
                    .command_timeout(i, &["DEL", key.as_str()], ADMIN_TIMEOUT)
                    .await;
            }
        }
        self.stats
    }

    /// The foreign value planted by a takeover must be untouched (value, and a TTL still far
    /// above any TTL of ours: an extend must not PEXPIRE it).
    fn check_takeover(
        &self,
        key: &str,
        foreign: &str,
        before: &Inspection,
        after: &Inspection,
        eligible: &[bool],
        what: &str,
    ) {
        for (i, (b, a)) in before.nodes.iter().zip(&after.nodes).enumerate() {
            let planted = matches!(&b.state, Ok(Some(h)) if h.token == foreign);
            if !planted || !eligible[i] {
                continue;
            }
            match &a.state {
                Err(_) => {}
                Ok(found) => self.checker().check_foreign_value(
                    what,
                    i,
                    key,
                    foreign,
                    found.as_ref().map(|h| (h.token.as_str(), h.ttl)),
                    Duration::from_secs(20),
                ),
            }
        }
    }
}

/// The second half of an S6 clean-up probe ([`Worker::op_cancel`]): look at the nodes once the
/// background releases had time to land, and again later where a key was still there.
struct CleanupProbe {
    /// When the acquire returned or was cancelled.
    given_up: Instant,
    env: Arc<Env>,
    client: usize,
    node_timeout: Duration,
    resource: String,
    outcome: &'static str,
    budget: Duration,
    ttl: Duration,
    /// Node epochs and this client's link epochs from before the acquire.
    node_epochs: Vec<u64>,
    link_epochs: Vec<u64>,
}

impl CleanupProbe {
    async fn look(self) {
        let checker = &self.env.checker;
        let p = self.resource.as_str();
        // Background releases are queued behind their SETs on the same connections: they land
        // within a node timeout (the per-command timeout of fred bounds them).
        tokio::time::sleep(self.node_timeout + ms(150)).await;
        let Ok(first) = self.env.observer.inspect(p).await else {
            return;
        };
        checker.count_check("S6 clean-up");
        let held = |i: &Inspection, n: usize| match &i.nodes[n].state {
            Ok(Some(h)) => Some(h.token.clone()),
            _ => None,
        };
        let suspects: Vec<usize> = (0..first.nodes.len())
            .filter(|&n| held(&first, n).is_some())
            .collect();
        if suspects.is_empty() {
            return;
        }
        // Look again later: only a key that is still there (same token) was left behind.
        tokio::time::sleep(CLEANUP_SECOND_LOOK).await;
        let second_at = Instant::now();
        let Ok(second) = self.env.observer.inspect(p).await else {
            return;
        };
        let (e1, pe1) = (self.env.epochs(), self.env.board.epochs(self.client));
        for n in suspects {
            let token = held(&first, n);
            if self.node_epochs[n] != e1[n]
                || self.link_epochs[n] != pe1[n]
                || held(&second, n) != token
            {
                continue;
            }
            let ttl_left = match &second.nodes[n].state {
                Ok(Some(h)) => h.ttl,
                _ => None,
            };
            // When the node ran the SET, from the TTL it had left (to a millisecond or so).
            let set_at = ttl_left
                .and_then(|left| self.ttl.checked_sub(left))
                .and_then(|age| second_at.checked_sub(age));
            let landed = match set_at {
                Some(t) if t >= self.given_up => format!("{:?} after", t - self.given_up),
                Some(t) => format!("{:?} before", self.given_up - t),
                None => "?".to_string(),
            };
            checker.violation(
                ViolationKind::LeftKey,
                format!(
                    "client {}: acquire of {p} ({}, budget {:?}, ttl {:?}, node timeout {:?}) left token {} on node {n} ({ttl_left:?} left {:?} later; its SET ran about {landed} the acquire returned), node and link undisturbed. Events from 2 s before: {}",
                    self.client,
                    self.outcome,
                    self.budget,
                    self.ttl,
                    self.node_timeout,
                    token.unwrap_or_default(),
                    second_at - self.given_up,
                    checker.events(
                        self.given_up.checked_sub(Duration::from_secs(2)).unwrap_or(self.given_up),
                        second_at
                    ),
                ),
            );
        }
    }
}

/// Runs one lane of the schedule.
async fn run_lane(
    env: Arc<Env>,
    episodes: Vec<Episode>,
    start: Instant,
) -> Vec<(FaultKind, Duration)> {
    let all_clients: Vec<usize> = (0..env.config.clients).collect();
    let mut done = Vec::new();
    for ep in episodes {
        tokio::time::sleep_until(start + ep.start).await;
        let began = Instant::now();
        let label = format!("{} {:?}", ep.kind.describe(), ep.nodes);
        env.checker.event(format!(
            "fault begins: {label} clients {:?} {:?}",
            ep.clients, ep.fault
        ));
        match ep.kind {
            FaultKind::KillMinority | FaultKind::KillMajority => {
                {
                    let mut admin = env.admin.write().await;
                    for &i in &ep.nodes {
                        env.bump(i);
                        if let Err(e) = admin.kill(i) {
                            env.checker
                                .violation(ViolationKind::Engine, format!("kill {i}: {e}"));
                        }
                    }
                }
                let s = Instant::now();
                // The restart is delayed by at least the max TTL + margin from the kill.
                tokio::time::sleep(ep.duration).await;
                let e = Instant::now();
                // Clients must not reach a restarted node before the foreign owner has its keys
                // back (else a client could take a foreign resource the owner lost in the
                // restart, outside assumption A for that owner): reset them meanwhile.
                env.board.set(0, &all_clients, &ep.nodes, Fault::Reset);
                let mut admin = env.admin.write().await;
                for &i in &ep.nodes {
                    if let Err(err) = admin.start_node(i).await {
                        env.checker
                            .violation(ViolationKind::Engine, format!("restart {i}: {err}"));
                    }
                    env.bump(i);
                    // The node came back empty: the foreign owner takes its keys again.
                    env.plant_foreign(&admin, i).await;
                }
                drop(admin);
                env.board.set(0, &all_clients, &ep.nodes, Fault::Pass);
                if ep.kind.majority() {
                    env.checker.outage(s, e, label);
                }
            }
            FaultKind::PauseMinority | FaultKind::PauseMajority => {
                {
                    let admin = env.admin.read().await;
                    for &i in &ep.nodes {
                        env.bump(i);
                        let _ = admin.pause(i);
                    }
                }
                // SIGSTOP is delivered asynchronously; 5 ms is far more than it takes.
                let s = Instant::now() + ms(5);
                tokio::time::sleep(ep.duration).await;
                let e = Instant::now();
                let admin = env.admin.read().await;
                for &i in &ep.nodes {
                    let _ = admin.resume(i);
                    env.bump(i);
                }
                if ep.kind.majority() {
                    env.checker.outage(s, e, label);
                }
            }
            FaultKind::PartitionMinority | FaultKind::PartitionMajority => {
                env.board.set(0, &all_clients, &ep.nodes, Fault::Blackhole);
                let s = Instant::now();
                tokio::time::sleep(ep.duration).await;
                let e = Instant::now();
                env.board.set(0, &all_clients, &ep.nodes, Fault::Reset);
                tokio::time::sleep(RESET_HOLD).await;
                env.board.set(0, &all_clients, &ep.nodes, Fault::Pass);
                if ep.kind.majority() {
                    env.checker.outage(s, e, label);
                }
            }
            FaultKind::ScriptFlush => {
                let admin = env.admin.read().await;
                for &i in &ep.nodes {
                    let _ = admin.script_flush(i).await;
                }
            }
            FaultKind::HoldReplies
            | FaultKind::Latency
            | FaultKind::DropReplies
            | FaultKind::Reset => {
                let fault = ep.fault.unwrap_or(Fault::Reset);
                env.board.set(1, &ep.clients, &ep.nodes, fault);
                tokio::time::sleep(ep.duration).await;
                if matches!(fault, Fault::DropReplies | Fault::Blackhole) {
                    env.board.set(1, &ep.clients, &ep.nodes, Fault::Reset);
                    tokio::time::sleep(RESET_HOLD).await;
                }
                env.board.set(1, &ep.clients, &ep.nodes, Fault::Pass);
            }
        }
        env.checker.event(format!(
            "fault ends: {} {:?} clients {:?}",
            ep.kind.describe(),
            ep.nodes,
            ep.clients
        ));
        done.push((ep.kind, began.elapsed()));
    }
    done
}

/// Runs the torture run described by `config` and checks it. Needs `redis-server` (see the
/// [module docs](super)); runs best on a multi-threaded tokio runtime.
///
/// Cancellation: dropping the future stops the run; the nodes and proxies are killed as they
/// are dropped.
pub async fn run(config: TortureConfig) -> io::Result<Report> {
    let wall = Instant::now();
    let episodes = schedule(&config);
    let nodes = LocalNodes::start(config.nodes).await?;
    let data_node = LocalNodes::start(1).await?;
    let checker = Arc::new(Checker::new(config.drift_factor));
    let observer = Redlock::builder()
        .nodes(nodes.urls())
        .node_timeout(OBSERVER_TIMEOUT)
        .retry(Retry::once())
        .build()
        .await
        .map_err(io_err)?;
    let mut proxies = Vec::new();
    for _ in 0..config.clients {
        let mut mine = Vec::new();
        for i in 0..config.nodes {
            mine.push(FaultProxy::start(nodes.addr(i)).await?);
        }
        proxies.push(mine);
    }
    let mut redlocks = Vec::new();
    for (c, mine) in proxies.iter().enumerate() {
        let timeout = if config.patient(c) {
            config.patient_node_timeout
        } else {
            config.node_timeout
        };
        let redlock = Redlock::builder()
            .nodes(mine.iter().map(|p| p.url()))
            .node_timeout(timeout)
            .retry(config.retry)
            .drift_factor(config.drift_factor)
            .build()
            .await
            .map_err(io_err)?;
        redlocks.push((redlock, timeout));
    }
    let env = Arc::new(Env {
        foreign_px: (config.duration + Duration::from_secs(120)).as_millis() as u64,
        resources: (0..config.resources).map(|i| format!("res:{i}")).collect(),
        foreign: (0..config.foreign_resources.max(1))
            .map(|i| format!("foreign:{i}"))
            .collect(),
        board: Board {
            layers: Mutex::new(vec![vec![[Fault::Pass; 2]; config.nodes]; config.clients]),
            epochs: (0..config.clients)
                .map(|_| (0..config.nodes).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            proxies,
        },
        epochs: (0..config.nodes).map(|_| AtomicU64::new(0)).collect(),
        admin: RwLock::new(nodes),
        observer,
        checker: checker.clone(),
        config: config.clone(),
    });
    {
        let admin = env.admin.read().await;
        for i in 0..config.nodes {
            env.plant_foreign(&admin, i).await;
        }
    }

    let start = Instant::now();
    let stop_at = start + config.duration;
    checker.event(format!(
        "run starts: N={} K={} M={} seed {}, clients stop {:?} later",
        config.nodes, config.clients, config.resources, config.seed, config.duration
    ));
    let mut lanes = Vec::new();
    for lane in 0..=config.client_lanes() {
        let mine: Vec<Episode> = episodes
            .iter()
            .filter(|e| e.lane == lane)
            .cloned()
            .collect();
        lanes.push(tokio::spawn(run_lane(env.clone(), mine, start)));
    }
    let mut workers = Vec::new();
    for (id, (redlock, node_timeout)) in redlocks.into_iter().enumerate() {
        let worker = Worker {
            id,
            env: env.clone(),
            redlock,
            data: data_client(&data_node.url(0)).await?,
            rng: StdRng::seed_from_u64(stream(&config, 1_000 + id as u64)),
            stats: Stats::default(),
            stale: Vec::new(),
            private_seq: 0,
            node_timeout,
            probes: Vec::new(),
        };
        workers.push(tokio::spawn(worker.run(stop_at)));
    }
    // The scheduler probe: on a loaded machine every timer fires late by about this much.
    let probe = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        while Instant::now() < stop_at {
            let due = Instant::now() + ms(5);
            tokio::time::sleep_until(due).await;
            worst = worst.max(Instant::now().saturating_duration_since(due));
        }
        worst
    });
    tokio::time::sleep_until(stop_at).await;
    checker.event("clients stop (each finishes its operation, then releases its stale locks)");
    let timer_lateness = probe.await.unwrap_or_default();
    let mut stats = Stats::default();
    for (id, w) in workers.into_iter().enumerate() {
        match w.await {
            Ok(s) => stats.merge(&s),
            Err(e) => checker.violation(ViolationKind::Panic, format!("client {id}: {e}")),
        }
    }
    let mut faults: BTreeMap<FaultKind, (u64, Duration)> = BTreeMap::new();
    for lane in lanes {
        match lane.await {
            Ok(done) => {
                for (kind, d) in done {
                    let e = faults.entry(kind).or_default();
                    e.0 += 1;
                    e.1 += d;
                }
            }
            Err(e) => checker.violation(ViolationKind::Engine, format!("fault lane: {e}")),
        }
    }
    // Everything passes again, every node runs (defensive: the lanes already restored them).
    let all_clients: Vec<usize> = (0..config.clients).collect();
    let all_nodes: Vec<usize> = (0..config.nodes).collect();
    env.board.set(0, &all_clients, &all_nodes, Fault::Pass);
    env.board.set(1, &all_clients, &all_nodes, Fault::Pass);

    let leftover_keys = final_checks(&env).await;
    // Writes of cancelled sections may still be on their way to the data node.
    tokio::time::sleep(ms(200)).await;
    let data = data_client(&data_node.url(0)).await?;
    let mut finals = HashMap::new();
    for r in &env.resources {
        let v: Option<String> = data.get(data_key(r)).await.map_err(io_err)?;
        finals.insert(r.clone(), v);
    }
    let _ = data.quit().await;
    let check = checker.finish(&finals);
    env.observer.close().await;
    Ok(Report {
        fingerprint: fingerprint(&episodes),
        episodes: episodes.len(),
        config,
        stats,
        faults,
        check,
        wall: wall.elapsed(),
        leftover_keys,
        timer_lateness,
    })
}

/// After the run: no lock key without expiry or beyond the max TTL (S6, row 9), and every
/// foreign key intact on every node (S4). Returns how many lock keys were left (expiring).
async fn final_checks(env: &Env) -> usize {
    let mut admin = env.admin.write().await;
    for i in 0..env.config.nodes {
        if !admin.is_running(i) {
            let _ = admin.start_node(i).await;
            env.plant_foreign(&admin, i).await;
        }
        let _ = admin.resume(i);
    }
    let prefix = env.observer.key("");
    let foreign: Vec<String> = env.foreign.iter().map(|f| env.observer.key(f)).collect();
    let private = env.observer.key("private:");
    let ttl_max_ms = env.config.ttl_max.as_millis() as i64 + 1;
    let mut leftover = 0;
    for i in 0..env.config.nodes {
        let keys = match admin.keys(i, &format!("{prefix}*")).await {
            Ok(k) => k,
            Err(e) => {
                env.checker
                    .violation(ViolationKind::Engine, format!("KEYS on node {i}: {e}"));
                continue;
            }
        };
        for k in keys {
            if foreign.contains(&k) || k.starts_with(&private) {
                continue;
            }
            leftover += 1;
            env.checker.count_check("S6 leftover key TTL");
            match admin.pttl(i, &k).await {
                Ok(pttl) if pttl == -1 || pttl > ttl_max_ms => env.checker.violation(
                    ViolationKind::KeyBeyondTtl,
                    format!("node {i}: {k} has PTTL {pttl} ms (max TTL {ttl_max_ms} ms)"),
                ),
                _ => {}
            }
        }
        for key in &foreign {
            let value = admin.get(i, key).await.ok().flatten();
            let ttl = match admin.pttl(i, key).await {
                Ok(ms) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
                _ => None,
            };
            env.checker.check_foreign_value(
                "end of run",
                i,
                key,
                FOREIGN_VALUE,
                value.as_deref().map(|v| (v, ttl)),
                Duration::from_secs(30),
            );
        }
    }
    drop(admin);
    leftover
}

/// One negative control's outcome.
#[derive(Debug, Clone)]
pub struct ControlResult {
    /// What the scenario is.
    pub name: &'static str,
    /// The fault-matrix row.
    pub row: &'static str,
    /// Whether the checker must find a violation (otherwise it must find none).
    pub expect_violation: bool,
    /// Violations found.
    pub violations: usize,
    /// Their kinds.
    pub kinds: Vec<ViolationKind>,
    /// Whether the checker did what was expected (for an expected violation: an overlap was
    /// found).
    pub pass: bool,
    /// How the scenario went (placement of the locks), or why it could not run.
    pub detail: String,
}

/// Two clients straight on three fresh nodes, a data node, a checker.
struct ControlEnv {
    nodes: LocalNodes,
    _data_node: LocalNodes,
    data: Client,
    a: Redlock,
    b: Redlock,
    checker: Checker,
}

impl ControlEnv {
    async fn start() -> io::Result<ControlEnv> {
        let nodes = LocalNodes::start(3).await?;
        let data_node = LocalNodes::start(1).await?;
        let data = data_client(&data_node.url(0)).await?;
        let client = || {
            Redlock::builder()
                .nodes(nodes.urls())
                .node_timeout(Duration::from_millis(200))
                .retry(Retry::once())
                .build()
        };
        let a = client().await.map_err(io_err)?;
        let b = client().await.map_err(io_err)?;
        Ok(ControlEnv {
            nodes,
            _data_node: data_node,
            data,
            a,
            b,
            checker: Checker::new(fredlock::config::DEFAULT_DRIFT_FACTOR),
        })
    }

    async fn read(&self, resource: &str) -> io::Result<(DataValue, Instant)> {
        let at = Instant::now();
        let raw: Option<String> = self.data.get(data_key(resource)).await.map_err(io_err)?;
        let v = DataValue::parse(raw.as_deref()).ok_or_else(|| io_err("bad counter"))?;
        Ok((v, at))
    }

    async fn write(
        &self,
        grant: GrantId,
        resource: &str,
        read: (DataValue, Instant),
    ) -> io::Result<()> {
        let id = self.checker.begin_write(grant, resource, read.0, read.1);
        let _: Value = self
            .data
            .set(
                data_key(resource),
                read.0.next(id).encode(),
                None,
                None,
                false,
            )
            .await
            .map_err(io_err)?;
        self.checker.complete_write(id, Instant::now());
        Ok(())
    }

    async fn block(&self, node: usize, key: &str) -> io::Result<()> {
        expect_ok(
            self.nodes
                .command(node, &["SET", key, "blocker", "PX", "60000"])
                .await?,
        )
    }

    /// Where `token` is held, as node indices.
    async fn placement(&self, resource: &str, token: &str) -> io::Result<Vec<usize>> {
        let i = self.a.inspect(resource).await.map_err(io_err)?;
        Ok(i.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(&n.state, Ok(Some(h)) if h.token == token))
            .map(|(i, _)| i)
            .collect())
    }

    /// B retries until granted (its connection to a restarted node needs a moment).
    async fn acquire_b(&self, resource: &str, ttl: Duration) -> io::Result<(Lock, GrantId)> {
        let give_up = Instant::now() + Duration::from_secs(5);
        loop {
            match self.b.acquire(resource, ttl).await {
                Ok(lock) => {
                    let g = self
                        .checker
                        .grant(1, &lock, GrantKind::Control, Instant::now());
                    return Ok((lock, g));
                }
                Err(e) if Instant::now() >= give_up => {
                    return Err(io_err(format!("B never acquired: {e}")))
                }
                Err(_) => tokio::time::sleep(ms(50)).await,
            }
        }
    }

    /// A acquires on exactly nodes {0, 1}: node 2 holds a blocker during A's acquire.
    async fn a_on_0_1(&self, resource: &str, ttl: Duration) -> io::Result<(Lock, GrantId)> {
        let key = self.a.key(resource);
        self.block(2, &key).await?;
        let lock = self.a.acquire(resource, ttl).await.map_err(io_err)?;
        let g = self
            .checker
            .grant(0, &lock, GrantKind::Control, Instant::now());
        let at = self.placement(resource, lock.token()).await?;
        if at != [0, 1] {
            return Err(io_err(format!("set-up: A is on {at:?}, not [0, 1]")));
        }
        expect_ok_int(self.nodes.command(2, &["DEL", key.as_str()]).await?)?;
        Ok((lock, g))
    }

    async fn finish(&self, resource: &str) -> io::Result<CheckerReport> {
        let raw: Option<String> = self.data.get(data_key(resource)).await.map_err(io_err)?;
        Ok(self
            .checker
            .finish(&HashMap::from([(resource.to_string(), raw)])))
    }
}

fn expect_ok(reply: RespValue) -> io::Result<()> {
    match reply {
        RespValue::Simple(s) if s == "OK" => Ok(()),
        other => Err(io_err(format!("unexpected reply {other:?}"))),
    }
}

fn expect_ok_int(reply: RespValue) -> io::Result<()> {
    match reply {
        RespValue::Integer(_) => Ok(()),
        other => Err(io_err(format!("unexpected reply {other:?}"))),
    }
}

/// Row 11: A holds {0, 1}; node 1 restarts EMPTY (at once, or after A's TTL); B acquires.
/// A reads the counter before B's grant and writes it after B's increment.
async fn control_row11(delayed: bool) -> io::Result<(CheckerReport, String)> {
    let mut env = ControlEnv::start().await?;
    let r = "control:row11";
    let ttl = if delayed { ms(1000) } else { ms(5000) };
    let (lock_a, ga) = env.a_on_0_1(r, ttl).await?;
    let detail;
    if delayed {
        // A works inside its window and stops; node 1 comes back only after A's TTL.
        let read = env.read(r).await?;
        env.write(ga, r, read).await?;
        tokio::time::sleep_until(lock_a.acquired_at() + ttl + RESTART_MARGIN).await;
        env.nodes.restart(1).await?;
        let (lock_b, gb) = env.acquire_b(r, ms(5000)).await?;
        let at_b = env.placement(r, lock_b.token()).await?;
        let read = env.read(r).await?;
        env.write(gb, r, read).await?;
        env.checker.close(gb, Instant::now(), lock_b.deadline());
        let _ = lock_b.release().await;
        env.checker.close(ga, Instant::now(), lock_a.deadline());
        let _ = lock_a.release().await;
        detail = format!("A on [0, 1], node 1 restarted after A's TTL, B on {at_b:?}");
    } else {
        env.nodes.restart(1).await?;
        let a_read = env.read(r).await?;
        let (lock_b, gb) = env.acquire_b(r, ms(5000)).await?;
        let at_b = env.placement(r, lock_b.token()).await?;
        let read = env.read(r).await?;
        env.write(gb, r, read).await?;
        if !lock_a.is_valid() {
            return Err(io_err("set-up: A expired before its write"));
        }
        env.write(ga, r, a_read).await?;
        env.checker.close(gb, Instant::now(), lock_b.deadline());
        let _ = lock_b.release().await;
        env.checker.close(ga, Instant::now(), lock_a.deadline());
        let _ = lock_a.release().await;
        detail =
            format!("A on [0, 1], node 1 restarted empty at once, B on {at_b:?} while A valid");
    }
    Ok((env.finish(r).await?, detail))
}

/// Row 12: A holds {0, 1}; node 1's clock "jumps" (PEXPIRE 1 ms); node 2 is free; B acquires.
async fn control_row12() -> io::Result<(CheckerReport, String)> {
    let env = ControlEnv::start().await?;
    let r = "control:row12";
    let (lock_a, ga) = env.a_on_0_1(r, ms(5000)).await?;
    if !env.nodes.pexpire(1, &env.a.key(r), 1).await? {
        return Err(io_err("set-up: A's key missing on node 1"));
    }
    tokio::time::sleep(ms(10)).await;
    let a_read = env.read(r).await?;
    let (lock_b, gb) = env.acquire_b(r, ms(5000)).await?;
    let at_b = env.placement(r, lock_b.token()).await?;
    let read = env.read(r).await?;
    env.write(gb, r, read).await?;
    env.write(ga, r, a_read).await?;
    env.checker.close(gb, Instant::now(), lock_b.deadline());
    let _ = lock_b.release().await;
    env.checker.close(ga, Instant::now(), lock_a.deadline());
    let _ = lock_a.release().await;
    let detail = format!("A on [0, 1], key expired early on node 1, B on {at_b:?} while A valid");
    Ok((env.finish(r).await?, detail))
}

async fn control(
    name: &'static str,
    row: &'static str,
    expect_violation: bool,
    scenario: impl Future<Output = io::Result<(CheckerReport, String)>>,
) -> ControlResult {
    match scenario.await {
        Ok((report, detail)) => {
            let mut kinds: Vec<ViolationKind> = report.violations.iter().map(|v| v.kind).collect();
            kinds.sort();
            kinds.dedup();
            let pass = if expect_violation {
                report.count(ViolationKind::Overlap) >= 1
            } else {
                report.violations.is_empty()
            };
            ControlResult {
                name,
                row,
                expect_violation,
                violations: report.violations.len(),
                kinds,
                pass,
                detail,
            }
        }
        Err(e) => ControlResult {
            name,
            row,
            expect_violation,
            violations: 0,
            kinds: Vec::new(),
            pass: false,
            detail: format!("could not run: {e}"),
        },
    }
}

/// The negative controls: deterministic scenarios outside Redlock's assumptions where the
/// checker MUST find the overlap (a control that finds nothing means the checker is blind), and
/// the same schedule made safe by a delayed restart, where it must find nothing.
pub async fn negative_controls() -> Vec<ControlResult> {
    vec![
        control(
            "node restarted EMPTY at once, B acquires while A is valid",
            "11",
            true,
            control_row11(false),
        )
        .await,
        control(
            "same, delayed restart (after A's TTL)",
            "11",
            false,
            control_row11(true),
        )
        .await,
        control(
            "clock jump on one node (PEXPIRE 1 ms) + split",
            "12",
            true,
            control_row12(),
        )
        .await,
    ]
}

/// The report of one or more runs and the controls, as markdown: one column per run.
pub fn markdown(runs: &[Report], controls: &[ControlResult]) -> String {
    let mut out = String::new();
    if !runs.is_empty() {
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut row = |name: &str, f: &dyn Fn(&Report) -> String| {
            rows.push((name.to_string(), runs.iter().map(f).collect()));
        };
        row("nodes N / clients K / resources M (+ foreign)", &|r| {
            format!(
                "{} / {} / {} (+{})",
                r.config.nodes, r.config.clients, r.config.resources, r.config.foreign_resources
            )
        });
        row("duration (run / wall incl. set-up and checks)", &|r| {
            format!(
                "{:.0} s / {:.1} s",
                r.config.duration.as_secs_f64(),
                r.wall.as_secs_f64()
            )
        });
        row("seed", &|r| r.config.seed.to_string());
        row("schedule: episodes / fingerprint", &|r| {
            format!("{} / {:016x}", r.episodes, r.fingerprint)
        });
        row("TTL range / node timeout (patient)", &|r| {
            format!(
                "{}-{} ms / {} ms ({} ms)",
                r.config.ttl_min.as_millis(),
                r.config.ttl_max.as_millis(),
                r.config.node_timeout.as_millis(),
                r.config.patient_node_timeout.as_millis()
            )
        });
        row("acquisitions attempted", &|r| r.stats.attempted.to_string());
        row("granted", &|r| r.stats.granted.to_string());
        row("failed: Contended", &|r| r.stats.contended.to_string());
        row("failed: Unavailable", &|r| r.stats.unavailable.to_string());
        row("failed: ValidityExpired", &|r| {
            r.stats.validity_expired.to_string()
        });
        row("granted, then Lost (keep-alive / with_lock)", &|r| {
            r.stats.lost.to_string()
        });
        row("failed: other", &|r| r.stats.other.to_string());
        row("windows checked (grant x resource)", &|r| {
            r.check.windows.to_string()
        });
        row("critical sections verified (>= 1 write in window)", &|r| {
            r.check.verified_sections.to_string()
        });
        row(
            "counter writes completed / uncertain / skipped by guard",
            &|r| {
                format!(
                    "{} / {} / {}",
                    r.check.writes_completed, r.check.writes_uncertain, r.stats.writes_skipped
                )
            },
        );
        row("extends ok / attempted (live locks)", &|r| {
            format!("{} / {}", r.stats.extends_ok, r.stats.extends)
        });
        row("releases ok / not held / failed", &|r| {
            format!(
                "{} / {} / {}",
                r.stats.releases_ok, r.stats.releases_not_held, r.stats.releases_failed
            )
        });
        row("stale extends / stale releases (with a new holder)", &|r| {
            format!(
                "{} / {} ({})",
                r.stats.stale_extends,
                r.stats.stale_releases + r.stats.stale_releases_with_holder,
                r.stats.stale_releases_with_holder
            )
        });
        row("takeover / revival probes", &|r| {
            format!("{} / {}", r.stats.takeovers, r.stats.revivals)
        });
        row("foreign-resource attempts", &|r| {
            r.stats.foreign_attempts.to_string()
        });
        row("quorum inspections after grant", &|r| {
            r.stats.quorum_checks.to_string()
        });
        row("S6 clean-up probes: cancelled / failed / released", &|r| {
            let p = r.stats.cleanup_probes;
            format!("{} / {} / {}", p[0], p[1], p[2])
        });
        row("checks run", &|r| {
            r.check
                .checks
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        row("data-node errors", &|r| r.stats.data_errors.to_string());
        for kind in FaultKind::ALL {
            row(
                &format!("fault row {}: {}", kind.row(), kind.describe()),
                &move |r| match r.faults.get(&kind) {
                    Some((n, d)) => format!("{n} / {:.1} s", d.as_secs_f64()),
                    None => "0".to_string(),
                },
            );
        }
        for kind in ViolationKind::ALL {
            row(&format!("violations {}", kind.describe()), &move |r| {
                r.check.count(kind).to_string()
            });
        }
        row("**violations total**", &|r| {
            format!("**{}**", r.violations())
        });
        row("smallest safety margin", &|r| {
            r.check
                .min_margin
                .as_ref()
                .map_or("-".to_string(), |m| m.to_string())
        });
        row("max extend start lag / max lost-signal lateness", &|r| {
            format!(
                "{} / {}",
                r.check
                    .max_extend_lag
                    .map_or("-".into(), |d| format!("{:.3} ms", d.as_secs_f64() * 1e3)),
                r.check
                    .max_lost_lateness
                    .map_or("-".into(), |d| format!("{:.3} ms", d.as_secs_f64() * 1e3))
            )
        });
        row("max timer lateness (5 ms scheduler probe)", &|r| {
            format!("{:.3} ms", r.timer_lateness.as_secs_f64() * 1e3)
        });
        for kind in [
            NoteKind::LateWrite,
            NoteKind::LostUpdateOutsideAssumptions,
            NoteKind::GrantReturnedExpired,
            NoteKind::LostSignalLate,
            NoteKind::UnclosedWindow,
        ] {
            row(
                &format!("note (not a violation): {}", kind.describe()),
                &move |r| r.check.note_count(kind).to_string(),
            );
        }
        row(
            "lock keys left at the end (all expiring within TTL)",
            &|r| r.leftover_keys.to_string(),
        );
        let _ = write!(out, "| |");
        for r in runs {
            let _ = write!(out, " N={} |", r.config.nodes);
        }
        let _ = write!(out, "\n|---|");
        for _ in runs {
            let _ = write!(out, "---|");
        }
        out.push('\n');
        for (name, cells) in rows {
            let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
        }
        for r in runs {
            if !r.check.violations.is_empty() {
                let _ = writeln!(out, "\nFirst violations (N={}):", r.config.nodes);
                for v in r.check.violations.iter().take(5) {
                    let _ = writeln!(
                        out,
                        "- {} at +{:.3}s: {}",
                        v.kind,
                        v.at.as_secs_f64(),
                        v.detail
                    );
                }
            }
            let interesting: Vec<_> = r
                .check
                .notes
                .iter()
                .filter(|n| n.kind != NoteKind::GrantReturnedExpired)
                .take(3)
                .collect();
            if !interesting.is_empty() {
                let _ = writeln!(out, "\nFirst notes (N={}, not violations):", r.config.nodes);
                for n in interesting {
                    let _ = writeln!(out, "- {}: {}", n.kind.describe(), n.detail);
                }
            }
            if !r.stats.other_errors.is_empty() {
                let _ = writeln!(
                    out,
                    "\nOther errors (N={}): {:?}",
                    r.config.nodes, r.stats.other_errors
                );
            }
        }
    }
    if !controls.is_empty() {
        let _ = writeln!(
            out,
            "\n| negative control | row | expected | got | kinds | result |\n|---|---|---|---|---|---|"
        );
        for c in controls {
            let kinds: Vec<&str> = c.kinds.iter().map(|k| k.describe()).collect();
            let _ = writeln!(
                out,
                "| {} ({}) | {} | {} | {} | {} | {} |",
                c.name,
                c.detail,
                c.row,
                if c.expect_violation {
                    ">= 1 overlap"
                } else {
                    "0"
                },
                c.violations,
                if kinds.is_empty() {
                    "-".to_string()
                } else {
                    kinds.join(", ")
                },
                if c.pass { "PASS" } else { "**FAIL**" }
            );
        }
    }
    if !runs.is_empty() {
        let _ = writeln!(
            out,
            "\nReplay (same fault schedule and per-client operation sequences; timing-dependent interleavings differ):"
        );
        for r in runs {
            let _ = writeln!(
                out,
                "- N={}: `{}`",
                r.config.nodes,
                r.config.replay_command()
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_replays_from_the_seed_and_keeps_assumption_a() {
        for nodes in [3, 5] {
            let config = TortureConfig::new(nodes, 42, Duration::from_secs(60));
            let a = schedule(&config);
            assert_eq!(a, schedule(&config), "same seed, same schedule");
            let other = schedule(&TortureConfig::new(nodes, 43, Duration::from_secs(60)));
            assert_ne!(fingerprint(&a), fingerprint(&other));
            assert!(a.len() > 20, "only {} episodes", a.len());
            let mut last_end = Duration::ZERO;
            for e in a.iter().filter(|e| e.lane == 0) {
                // One node fault at a time, on a minority unless it is a majority episode.
                assert!(
                    e.start >= last_end,
                    "{e:?} overlaps the previous node fault"
                );
                last_end = e.start + e.duration + e.kind.tail();
                let minority = e.nodes.len() <= (nodes - 1) / 2;
                assert_eq!(!minority, e.kind.majority(), "{e:?}");
                if matches!(e.kind, FaultKind::KillMinority | FaultKind::KillMajority) {
                    assert!(e.duration >= config.restart_delay(), "{e:?}");
                }
            }
            for e in &a {
                assert!(e.start + e.duration + e.kind.tail() <= config.duration);
                if e.kind == FaultKind::HoldReplies {
                    assert!(e.duration > config.ttl_max);
                }
            }
            for kind in FaultKind::ALL {
                assert!(a.iter().any(|e| e.kind == kind), "no {kind:?} in 60 s");
            }
        }
    }

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
