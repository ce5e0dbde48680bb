//! The fault schedule: which faults a run injects, on which nodes and clients, when and for how
//! long, all drawn before anything runs from the seed alone; plus the seeded random helpers the
//! rest of the run draws with.
//!
//! Owns the episodes and their generation, and how the schedule places each fault kind (its
//! lanes, weight and tail). Assumption A is kept here: one node fault at a time, on a minority
//! except the majority rows, restarts delayed past the max TTL; on cluster nodes, slot
//! migrations and connection kills on lanes of their own. Must not apply a fault (that is
//! `faults.rs` and `cluster_faults.rs`) nor depend on anything that happens at run time: a seed
//! must replay the same schedule.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::config::{TortureConfig, CLUSTER_RESTART, RESET_HOLD, RESTART_MARGIN};
use super::fault_kind::FaultKind;
use crate::Fault;

/// How an episode holds the nodes it acts on (see [`FaultKind::hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// It acts on proxies only.
    None,
    /// It waits until every one of its nodes is free (lane 0: its faults are the point of the
    /// run, and one at a time is the schedule's promise).
    Wait,
    /// It acts only on those of its nodes that are free and leaves out the others, so that its
    /// lane keeps to its schedule (the cluster lanes 1 and 2, whose episodes are many and short).
    IfFree,
}

/// Which lanes of the schedule a kind runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneGroup {
    /// Lane 0: node faults, one at a time.
    Node,
    /// Plain nodes, lanes 1 and up: per-client network faults on the proxies.
    Client,
    /// Cluster nodes, lane 1: slot migrations.
    Migration,
    /// Cluster nodes, lane 2: connection kills.
    Connection,
}

/// How the schedule places each kind of fault.
impl FaultKind {
    /// The lanes the kind runs on.
    fn group(self) -> LaneGroup {
        match self {
            FaultKind::HoldReplies
            | FaultKind::Latency
            | FaultKind::DropReplies
            | FaultKind::Reset => LaneGroup::Client,
            FaultKind::SlotMigration => LaneGroup::Migration,
            FaultKind::ShardConnKill => LaneGroup::Connection,
            _ => LaneGroup::Node,
        }
    }

    /// How an episode of this kind holds the nodes it hits, so that two lanes never act on one
    /// node at once.
    pub(super) fn hold(self) -> Hold {
        match self.group() {
            LaneGroup::Node => Hold::Wait,
            LaneGroup::Migration | LaneGroup::Connection => Hold::IfFree,
            LaneGroup::Client => Hold::None,
        }
    }

    /// Faults that take a majority (everything is unavailable meanwhile).
    pub(super) fn majority(self) -> bool {
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
            FaultKind::ShardKill | FaultKind::ShardPause => 3,
            // Alone on their lanes.
            FaultKind::ShardConnKill | FaultKind::SlotMigration => 1,
        }
    }

    /// Time the episode occupies after its nominal duration: the reset before passing again;
    /// on cluster nodes, a restart until the node serves keys again.
    fn tail(self, clusters: bool) -> Duration {
        match self {
            FaultKind::PartitionMinority
            | FaultKind::PartitionMajority
            | FaultKind::DropReplies => RESET_HOLD,
            FaultKind::KillMinority | FaultKind::KillMajority | FaultKind::ShardKill
                if clusters =>
            {
                CLUSTER_RESTART
            }
            _ => Duration::ZERO,
        }
    }
}

/// One fault episode of the schedule.
#[derive(Clone, PartialEq)]
pub struct Episode {
    /// 0: node faults; plain nodes, 1 and up: per-client network faults (see
    /// [`TortureConfig::client_lanes`]); cluster nodes, 1: slot migrations, 2: connection kills.
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
    /// Cluster faults on single shards: the shard hit on each of `nodes`, in the same order;
    /// for a slot migration, how far from the slot's owner its target is (1 to shards - 1).
    /// Empty otherwise.
    pub shards: Vec<usize>,
    /// A slot migration: which slot moves, and how far before the hold.
    pub slot_move: Option<SlotMove>,
}

/// Which slot a [`FaultKind::SlotMigration`] moves and how many of its keys move before the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMove {
    /// Picks the key whose slot moves among the contended resources' keys (lock keys, the
    /// semaphores' keys, the fenced resources' keys): the one at this index, modulo their number.
    pub pick: usize,
    /// Keys of the slot moved before the hold (the rest move when it finishes): with a fenced
    /// resource's lock key and counter in one slot, moving one of two splits them.
    pub keys_first: usize,
}

// By hand, so that the cluster fields show only when set: a plain run's debug form, and so its
// fingerprint, stays what it was before cluster nodes existed.
impl fmt::Debug for Episode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Episode");
        d.field("lane", &self.lane)
            .field("start", &self.start)
            .field("duration", &self.duration)
            .field("kind", &self.kind)
            .field("nodes", &self.nodes)
            .field("clients", &self.clients)
            .field("fault", &self.fault);
        if !self.shards.is_empty() {
            d.field("shards", &self.shards);
        }
        if let Some(m) = &self.slot_move {
            d.field("slot_move", m);
        }
        d.finish()
    }
}

/// The random stream `tag` of a run: N = 3 and N = 5 runs of one seed get different streams,
/// and so do runs on clusters (a plain run's streams are those it had before clusters existed).
pub(super) fn stream(config: &TortureConfig, tag: u64) -> u64 {
    let shards = config.cluster_shards.unwrap_or(0) as u64;
    mix(
        config.seed,
        tag ^ ((config.nodes as u64) << 40) ^ (shards << 48),
    )
}

/// splitmix64: independent streams from one seed.
pub(super) fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn rand_dur(rng: &mut StdRng, lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (lo.as_micros() as u64, hi.max(lo).as_micros() as u64);
    Duration::from_micros(rng.random_range(lo..=hi))
}

pub(super) fn pick_weighted<T: Copy>(rng: &mut StdRng, items: &[(T, u32)]) -> T {
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

/// Every lane picks kinds this way: first every kind it has once, in a seeded order, then by
/// weight.
fn deck(rng: &mut StdRng, kinds: &[(FaultKind, u32)]) -> Vec<FaultKind> {
    let mut d: Vec<FaultKind> = kinds.iter().map(|k| k.0).collect();
    d.shuffle(rng);
    d
}

/// The fault schedule of a run, generated from its seed alone (the same config gives the same
/// schedule). Every episode ends before `duration`.
pub fn schedule(config: &TortureConfig) -> Vec<Episode> {
    let mut rng = StdRng::seed_from_u64(stream(config, 1));
    let n = config.nodes;
    let plan = Plan {
        config,
        n,
        minority: (n.saturating_sub(1)) / 2,
        quorum: config.quorum(),
        end: config.duration.saturating_sub(ms(200)),
        unit: config.ttl_max,
        shards: config.cluster_shards.unwrap_or(0),
    };
    let mut out = Vec::new();
    // Lane 0: node faults, one at a time.
    plan.node_lane(&mut rng, &mut out);
    if plan.shards > 0 {
        // Lanes 1 and 2: slot migrations and connection kills.
        plan.cluster_lanes(&mut rng, &mut out);
    } else {
        // Lanes 1.. : per-client network faults, each lane on its own clients.
        plan.client_lanes(&mut rng, &mut out);
    }
    out
}

/// What the lanes of one schedule draw from.
struct Plan<'a> {
    config: &'a TortureConfig,
    n: usize,
    minority: usize,
    quorum: usize,
    /// Every episode ends before this.
    end: Duration,
    /// Every length is a multiple of the longest TTL: long enough for a fault to catch holders
    /// (and its minimum, where a row needs one, is set by the TTL), no longer than that, so the
    /// run spends its time on many episodes rather than on a few long ones.
    unit: Duration,
    /// Shards per cluster node; 0 for plain nodes.
    shards: usize,
}

/// One episode's draws, before its lane places it in time.
struct Draft {
    duration: Duration,
    nodes: Vec<usize>,
    clients: Vec<usize>,
    fault: Option<Fault>,
    shards: Vec<usize>,
    slot_move: Option<SlotMove>,
}

impl Draft {
    fn new(duration: Duration, nodes: Vec<usize>) -> Draft {
        Draft {
            duration,
            nodes,
            clients: Vec::new(),
            fault: None,
            shards: Vec::new(),
            slot_move: None,
        }
    }
}

impl Plan<'_> {
    /// The configured kinds of one lane group, with their weights.
    fn weighted(&self, group: LaneGroup) -> Vec<(FaultKind, u32)> {
        self.config
            .fault_kinds()
            .iter()
            .filter(|k| self.config.faults.contains(k) && k.group() == group)
            .filter(|k| self.minority > 0 || k.majority() || k.group() != LaneGroup::Node)
            // A slot needs another shard to move to.
            .filter(|k| **k != FaultKind::SlotMigration || self.shards >= 2)
            .map(|&k| (k, k.weight()))
            .collect()
    }

    fn long(&self, rng: &mut StdRng, min: Duration) -> Duration {
        rand_dur(rng, min, min + self.unit / 2)
    }

    fn short(&self, rng: &mut StdRng) -> Duration {
        rand_dur(rng, ms(50), ms(50).max(self.unit * 2))
    }

    fn gap(&self, rng: &mut StdRng) -> Duration {
        rand_dur(rng, self.unit / 8, self.unit * 5 / 4)
    }

    /// Lane 0: node faults, one at a time.
    fn node_lane(&self, rng: &mut StdRng, out: &mut Vec<Episode>) {
        let kinds = self.weighted(LaneGroup::Node);
        if !kinds.is_empty() {
            self.fill_lane(rng, 0, &kinds, out, |rng, kind| {
                self.node_episode(rng, kind)
            });
        }
    }

    fn node_episode(&self, rng: &mut StdRng, kind: FaultKind) -> Draft {
        let count = if kind.majority() {
            rng.random_range(self.quorum..=self.n)
        } else if kind == FaultKind::ScriptFlush {
            1
        } else {
            rng.random_range(1..=self.minority.max(1))
        };
        let nodes = pick_nodes(rng, self.n, count);
        let duration = match kind {
            // Down for longer than any key lives: the restart is safe (row 2).
            FaultKind::KillMinority | FaultKind::KillMajority | FaultKind::ShardKill => {
                self.long(rng, self.config.restart_delay())
            }
            FaultKind::PauseMajority => self.long(rng, self.config.ttl_max + RESTART_MARGIN),
            FaultKind::ScriptFlush => Duration::ZERO,
            _ => self.short(rng),
        };
        let mut draft = Draft::new(duration, nodes);
        if matches!(kind, FaultKind::ShardKill | FaultKind::ShardPause) {
            draft.shards = self.pick_shards(rng, draft.nodes.len());
        }
        draft
    }

    /// A shard of each of `count` nodes.
    fn pick_shards(&self, rng: &mut StdRng, count: usize) -> Vec<usize> {
        (0..count)
            .map(|_| rng.random_range(0..self.shards.max(1)))
            .collect()
    }

    /// Cluster nodes, lane 1: slot migrations; lane 2: connection kills. Neither makes a node
    /// faulty (a slot moving is the cluster's normal work; a reset is a network fault), so
    /// each may hit every node at once.
    fn cluster_lanes(&self, rng: &mut StdRng, out: &mut Vec<Episode>) {
        for (lane, group) in [(1, LaneGroup::Migration), (2, LaneGroup::Connection)] {
            let kinds = self.weighted(group);
            if kinds.is_empty() {
                continue;
            }
            self.fill_lane(rng, lane, &kinds, out, |rng, kind| {
                let count = rng.random_range(1..=self.n);
                let nodes = pick_nodes(rng, self.n, count);
                if kind == FaultKind::SlotMigration {
                    let mut draft = Draft::new(self.short(rng), nodes);
                    draft.shards = (0..count)
                        .map(|_| rng.random_range(1..self.shards.max(2)))
                        .collect();
                    draft.slot_move = Some(SlotMove {
                        pick: rng.random_range(0..1_000),
                        keys_first: rng.random_range(0..=2),
                    });
                    draft
                } else {
                    let d = rand_dur(rng, ms(50), ms(50).max(self.unit * 3 / 8));
                    let mut draft = Draft::new(d, nodes);
                    draft.shards = self.pick_shards(rng, count);
                    draft
                }
            });
        }
    }

    /// Lanes 1.. : per-client network faults, each lane on its own clients.
    fn client_lanes(&self, rng: &mut StdRng, out: &mut Vec<Episode>) {
        let kinds = self.weighted(LaneGroup::Client);
        let lanes = self.config.client_lanes();
        for lane in 0..lanes {
            if kinds.is_empty() {
                break;
            }
            let mine: Vec<usize> = (0..self.config.clients)
                .filter(|c| c % lanes == lane)
                .collect();
            self.fill_lane(rng, lane + 1, &kinds, out, |rng, kind| {
                self.client_episode(rng, kind, &mine)
            });
        }
    }

    fn client_episode(&self, rng: &mut StdRng, kind: FaultKind, mine: &[usize]) -> Draft {
        let everyone = rng.random_bool(0.3);
        let one = mine[rng.random_range(0..mine.len())];
        let clients = if kind == FaultKind::Latency && everyone {
            mine.to_vec()
        } else {
            vec![one]
        };
        let count = rng.random_range(1..=self.n);
        let nodes = pick_nodes(rng, self.n, count);
        let ttl = rand_dur(rng, self.config.ttl_min, self.config.ttl_max);
        let factor = rng.random_range(0.3..=1.1);
        let (duration, fault) = match kind {
            FaultKind::HoldReplies => (
                self.long(rng, self.config.ttl_max + ms(50)),
                Fault::HoldReplies,
            ),
            FaultKind::Latency => (self.short(rng), Fault::Latency(ttl.mul_f64(factor))),
            FaultKind::DropReplies => (self.short(rng), Fault::DropReplies),
            _ => (
                rand_dur(rng, ms(50), ms(50).max(self.unit * 3 / 8)),
                Fault::Reset,
            ),
        };
        Draft {
            clients,
            fault: Some(fault),
            ..Draft::new(duration, nodes)
        }
    }

    /// Places one lane's episodes one after another, each followed by a gap, until eight in a
    /// row no longer fit before the end. Each lane first deals every kind it has once, in a
    /// seeded order, then picks by weight: even a short run covers every row.
    fn fill_lane(
        &self,
        rng: &mut StdRng,
        lane: usize,
        kinds: &[(FaultKind, u32)],
        out: &mut Vec<Episode>,
        mut draw: impl FnMut(&mut StdRng, FaultKind) -> Draft,
    ) {
        let mut t = self.gap(rng);
        let mut misses = 0;
        let mut dealt = deck(rng, kinds);
        while misses < 8 {
            let kind = match dealt.pop() {
                Some(k) => k,
                None => pick_weighted(rng, kinds),
            };
            let draft = draw(rng, kind);
            let busy = draft.duration + kind.tail(self.shards > 0);
            let gap = self.gap(rng);
            if t + busy > self.end {
                misses += 1;
                continue;
            }
            out.push(Episode {
                lane,
                start: t,
                duration: draft.duration,
                kind,
                nodes: draft.nodes,
                clients: draft.clients,
                fault: draft.fault,
                shards: draft.shards,
                slot_move: draft.slot_move,
            });
            t += busy + gap;
        }
    }
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
                last_end = e.start + e.duration + e.kind.tail(false);
                let minority = e.nodes.len() <= (nodes - 1) / 2;
                assert_eq!(!minority, e.kind.majority(), "{e:?}");
                if matches!(e.kind, FaultKind::KillMinority | FaultKind::KillMajority) {
                    assert!(e.duration >= config.restart_delay(), "{e:?}");
                }
            }
            for e in &a {
                assert!(e.start + e.duration + e.kind.tail(false) <= config.duration);
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
    fn a_cluster_schedule_keeps_its_lanes_apart_and_covers_every_cluster_fault() {
        let config = TortureConfig::new(3, 42, Duration::from_secs(60)).on_clusters(3);
        let a = schedule(&config);
        assert_eq!(a, schedule(&config), "same seed, same schedule");
        let plain = schedule(&TortureConfig::new(3, 42, Duration::from_secs(60)));
        assert_ne!(
            fingerprint(&a),
            fingerprint(&plain),
            "clusters get streams of their own"
        );
        let mut last_end = Duration::ZERO;
        for e in &a {
            assert!(
                e.start + e.duration + e.kind.tail(true) <= config.duration,
                "{e:?}"
            );
            assert!(config.fault_kinds().contains(&e.kind), "{e:?}");
            assert!(e.clients.is_empty() && e.fault.is_none(), "{e:?}");
            match e.lane {
                0 => {
                    assert!(
                        e.start >= last_end,
                        "{e:?} overlaps the previous node fault"
                    );
                    last_end = e.start + e.duration + e.kind.tail(true);
                    assert_eq!(e.nodes.len() > 1, e.kind.majority(), "{e:?}");
                    if matches!(e.kind, FaultKind::KillMinority | FaultKind::ShardKill) {
                        assert!(e.duration >= config.restart_delay(), "{e:?}");
                        assert_eq!(e.kind.tail(true), CLUSTER_RESTART);
                    }
                    let one_shard = matches!(e.kind, FaultKind::ShardKill | FaultKind::ShardPause);
                    let want = if one_shard { e.nodes.len() } else { 0 };
                    assert_eq!(e.shards.len(), want, "{e:?}");
                    assert!(e.shards.iter().all(|&s| s < 3), "{e:?}");
                }
                1 => {
                    assert_eq!(e.kind, FaultKind::SlotMigration);
                    assert!(e.slot_move.is_some_and(|m| m.keys_first <= 2), "{e:?}");
                    assert_eq!(e.shards.len(), e.nodes.len(), "{e:?}");
                    assert!(e.shards.iter().all(|&s| (1..3).contains(&s)), "{e:?}");
                }
                2 => {
                    assert_eq!(e.kind, FaultKind::ShardConnKill);
                    assert_eq!(e.shards.len(), e.nodes.len(), "{e:?}");
                }
                other => panic!("lane {other} on cluster nodes: {e:?}"),
            }
        }
        for kind in FaultKind::CLUSTER {
            assert!(a.iter().any(|e| e.kind == kind), "no {kind:?} in 60 s");
        }
    }

    #[test]
    fn a_plain_schedule_is_the_one_it_was_before_cluster_nodes() {
        // The fingerprint the torture example printed for this schedule before cluster nodes
        // (commit b6f0b9f, `--secs 10 --seed 42 --nodes 3 --clients 4 --mode plain`): a plain
        // run of an old seed replays the same faults.
        let config = TortureConfig::new(3, 42, Duration::from_secs(10));
        let printed = format!("{:016x}", fingerprint(&schedule(&config)));
        assert_eq!(printed, "4eeede8e2f3f2784");
    }
}
