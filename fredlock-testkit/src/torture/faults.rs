//! Fault actions: the lanes of the schedule applied to the nodes (kill and delayed restart,
//! SIGSTOP, SCRIPT FLUSH; on cluster nodes, to every shard of a node) and to the clients'
//! proxies (partitions, held or dropped replies, latency, resets), with the outages they imply
//! recorded for the checker; the cluster-only faults are handed to `cluster_faults.rs`.
//!
//! Owns the lanes' tasks and the application of each [`Episode`] (through the proxies'
//! [`Board`](super::board::Board)).
//! Must not decide what to inject or when (that is the seeded `schedule.rs`) nor check anything
//! beyond reporting engine failures and outages to the checker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cluster_faults;
use super::config::RESET_HOLD;
use super::env::Env;
use super::fault_kind::FaultKind;
use super::nodes::settle;
use super::schedule::{ms, Episode, Hold};
use crate::checker::{Checker, ViolationKind};
use crate::Fault;

/// What one lane did: each episode's kind and how long it took; and how many of its episodes it
/// skipped.
#[derive(Default)]
pub(super) struct LaneLog {
    done: Vec<(FaultKind, Duration)>,
    skipped: usize,
}

/// What the lanes did: faults injected, count and total time held, by kind; and the episodes
/// skipped (their nodes busy with another lane's episode, or the lane too late to start them
/// before the clients stopped).
#[derive(Default)]
pub(super) struct Injected {
    pub(super) faults: BTreeMap<FaultKind, (u64, Duration)>,
    pub(super) skipped: usize,
}

/// Runs each lane of the schedule in a task of its own, from `start`.
pub(super) fn spawn_lanes(
    env: &Arc<Env>,
    episodes: &[Episode],
    start: Instant,
) -> Vec<JoinHandle<LaneLog>> {
    let mut lanes = Vec::new();
    for lane in 0..env.config.lanes() {
        let mine: Vec<Episode> = episodes
            .iter()
            .filter(|e| e.lane == lane)
            .cloned()
            .collect();
        lanes.push(tokio::spawn(run_lane(env.clone(), mine, start)));
    }
    lanes
}

/// Waits for every lane: what they injected and skipped.
pub(super) async fn join_lanes(checker: &Checker, lanes: Vec<JoinHandle<LaneLog>>) -> Injected {
    let mut injected = Injected::default();
    for lane in lanes {
        match lane.await {
            Ok(log) => {
                for (kind, d) in log.done {
                    let e = injected.faults.entry(kind).or_default();
                    e.0 += 1;
                    e.1 += d;
                }
                injected.skipped += log.skipped;
            }
            Err(e) => checker.violation(ViolationKind::Engine, format!("fault lane: {e}")),
        }
    }
    injected
}

/// Runs one lane of the schedule.
async fn run_lane(env: Arc<Env>, episodes: Vec<Episode>, start: Instant) -> LaneLog {
    let all_clients: Vec<usize> = (0..env.config.clients).collect();
    let mut log = LaneLog::default();
    let clients_stop = start + env.config.duration;
    let count = episodes.len();
    for (i, ep) in episodes.into_iter().enumerate() {
        if Instant::now() >= clients_stop {
            // A lane held up (by a slow restart, or another lane on its nodes) past the end:
            // the rest of its schedule would test nothing.
            env.checker.event(format!(
                "lane of {} ends late: its episodes from +{:?} are skipped",
                ep.kind.describe(),
                ep.start
            ));
            log.skipped += count - i;
            break;
        }
        tokio::time::sleep_until(start + ep.start).await;
        // The nodes this episode acts on are its own until it ends (the time held counts once
        // they are).
        let (ep, _held) = match ep.kind.hold() {
            Hold::None => (ep, Vec::new()),
            Hold::Wait => {
                let held = env.hold_nodes(&ep.nodes).await;
                (ep, held)
            }
            Hold::IfFree => {
                let (free, held) = env.hold_free_nodes(&ep.nodes);
                if free.is_empty() {
                    env.checker.event(format!(
                        "{} {:?} skipped: its nodes are busy",
                        ep.kind.describe(),
                        ep.nodes
                    ));
                    log.skipped += 1;
                    continue;
                }
                (only_on(ep, &free), held)
            }
        };
        let began = Instant::now();
        let label = format!("{} {:?}", ep.kind.describe(), ep.nodes);
        env.checker.event(format!(
            "fault begins: {label} clients {:?} {:?}",
            ep.clients, ep.fault
        ));
        match ep.kind {
            FaultKind::KillMinority | FaultKind::KillMajority => {
                kill(&env, &ep, &all_clients, label).await
            }
            FaultKind::PauseMinority | FaultKind::PauseMajority => pause(&env, &ep, label).await,
            FaultKind::PartitionMinority | FaultKind::PartitionMajority => {
                partition(&env, &ep, &all_clients, label).await
            }
            FaultKind::ScriptFlush => script_flush(&env, &ep).await,
            FaultKind::HoldReplies
            | FaultKind::Latency
            | FaultKind::DropReplies
            | FaultKind::Reset => client_fault(&env, &ep).await,
            FaultKind::ShardKill => cluster_faults::shard_kill(&env, &ep).await,
            FaultKind::ShardPause => cluster_faults::shard_pause(&env, &ep).await,
            FaultKind::ShardConnKill => cluster_faults::conn_kill(&env, &ep).await,
            FaultKind::SlotMigration => cluster_faults::slot_migration(&env, &ep).await,
        }
        env.checker.event(format!(
            "fault ends: {} {:?} clients {:?}",
            ep.kind.describe(),
            ep.nodes,
            ep.clients
        ));
        log.done.push((ep.kind, began.elapsed()));
    }
    log
}

/// `ep` on those of its nodes that are in `nodes` only (with their shards).
fn only_on(mut ep: Episode, nodes: &[usize]) -> Episode {
    let keep: Vec<bool> = ep.nodes.iter().map(|n| nodes.contains(n)).collect();
    let mut kept = keep.iter();
    ep.nodes.retain(|_| kept.next().copied().unwrap_or(false));
    if !ep.shards.is_empty() {
        let mut kept = keep.iter();
        ep.shards.retain(|_| kept.next().copied().unwrap_or(false));
    }
    ep
}

/// Rows 2 and 3: kill -9, then a restart (empty) delayed by the episode's duration.
async fn kill(env: &Env, ep: &Episode, all_clients: &[usize], label: String) {
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
    env.board.set(0, all_clients, &ep.nodes, Fault::Reset);
    let mut admin = env.admin.write().await;
    for &i in &ep.nodes {
        if let Err(err) = admin.start_node(i).await {
            env.checker
                .violation(ViolationKind::Engine, format!("restart {i}: {err}"));
        }
        env.bump(i);
    }
    drop(admin);
    for &i in &ep.nodes {
        // A cluster serves keys only once its shards agree it is healthy again (a restarted
        // shard refuses them for Redis' 2 s writable delay).
        if let Err(err) = settle(&env.admin, i).await {
            env.checker
                .violation(ViolationKind::Engine, format!("restart {i}: {err}"));
        }
        // The node came back empty: the foreign owner takes its keys again.
        env.plant_foreign(&*env.admin.read().await, i).await;
    }
    env.board.set(0, all_clients, &ep.nodes, Fault::Pass);
    if ep.kind.majority() {
        env.checker.outage(s, e, label);
    }
}

/// Rows 4 and 5: SIGSTOP, then SIGCONT.
async fn pause(env: &Env, ep: &Episode, label: String) {
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
    {
        let admin = env.admin.read().await;
        for &i in &ep.nodes {
            let _ = admin.resume(i);
            env.bump(i);
        }
    }
    // A cluster frozen past its node timeout flags its shards failing until they answer again.
    for &i in &ep.nodes {
        if let Err(err) = settle(&env.admin, i).await {
            env.checker
                .violation(ViolationKind::Engine, format!("resume {i}: {err}"));
        }
    }
    if ep.kind.majority() {
        env.checker.outage(s, e, label);
    }
}

/// Row 2's network form and row 3: every client cut from some nodes, then a reset, then pass.
async fn partition(env: &Env, ep: &Episode, all_clients: &[usize], label: String) {
    env.board.set(0, all_clients, &ep.nodes, Fault::Blackhole);
    let s = Instant::now();
    tokio::time::sleep(ep.duration).await;
    let e = Instant::now();
    env.board.set(0, all_clients, &ep.nodes, Fault::Reset);
    tokio::time::sleep(RESET_HOLD).await;
    env.board.set(0, all_clients, &ep.nodes, Fault::Pass);
    if ep.kind.majority() {
        env.checker.outage(s, e, label);
    }
}

/// Row 15: SCRIPT FLUSH.
async fn script_flush(env: &Env, ep: &Episode) {
    let admin = env.admin.read().await;
    for &i in &ep.nodes {
        let _ = admin.script_flush(i).await;
    }
}

/// Rows 6 to 9: one lane's fault on some clients' proxies (a swallowing one ends with a reset).
async fn client_fault(env: &Env, ep: &Episode) {
    let fault = ep.fault.unwrap_or(Fault::Reset);
    env.board.set(1, &ep.clients, &ep.nodes, fault);
    tokio::time::sleep(ep.duration).await;
    if matches!(fault, Fault::DropReplies | Fault::Blackhole) {
        env.board.set(1, &ep.clients, &ep.nodes, Fault::Reset);
        tokio::time::sleep(RESET_HOLD).await;
    }
    env.board.set(1, &ep.clients, &ep.nodes, Fault::Pass);
}
