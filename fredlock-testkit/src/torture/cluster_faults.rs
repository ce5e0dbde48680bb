//! The faults of cluster nodes that act below the node: one shard killed (and started again,
//! empty, only after the max TTL + margin) or frozen, every client's connections to one shard
//! reset (`CLIENT KILL`), and the slot of a contended resource's keys migrated on some nodes,
//! held half-way (`ASK`), then finished (`MOVED`).
//!
//! Owns these actions on the nodes' [`LocalCluster`](crate::LocalCluster)s and the epochs they
//! bump. Must not decide what to inject or when (that is `schedule.rs`), nor act on whole nodes
//! or on proxies (that is `faults.rs`, which also holds the episode's nodes while it runs).

use std::io;
use std::time::Duration;

use tokio::time::Instant;

use super::env::Env;
use super::nodes::{settle, Nodes};
use super::schedule::Episode;
use crate::checker::ViolationKind;
use crate::RespValue;

/// How often a connection-kill episode resets the connections again while it lasts.
const CONN_KILL_EVERY: Duration = Duration::from_millis(15);
/// Upper bound of one `CLIENT KILL` (the shard is neither frozen nor dead: its node is held).
const CONN_KILL_TIMEOUT: Duration = Duration::from_secs(1);

fn engine(env: &Env, what: String) {
    env.checker.violation(ViolationKind::Engine, what);
}

/// The (node, shard) pairs an episode hits.
fn hits(ep: &Episode) -> Vec<(usize, usize)> {
    ep.nodes
        .iter()
        .copied()
        .zip(ep.shards.iter().copied())
        .collect()
}

/// Row 2 on cluster nodes: kill -9 one shard of each node; after the episode's duration (longer
/// than the max TTL + margin, so every key it held has expired everywhere) start it again,
/// empty but with its slots, wait until its cluster serves it, and plant the foreign keys again.
/// The node's other shards serve their slots all along.
pub(super) async fn shard_kill(env: &Env, ep: &Episode) {
    let hits = hits(ep);
    {
        let mut admin = env.admin.write().await;
        for &(node, shard) in &hits {
            env.bump(node);
            if let Err(e) = admin.cluster_mut(node).and_then(|c| c.kill_shard(shard)) {
                engine(env, format!("kill node {node} shard {shard}: {e}"));
            }
        }
    }
    tokio::time::sleep(ep.duration).await;
    let mut admin = env.admin.write().await;
    for &(node, shard) in &hits {
        let started = match admin.cluster_mut(node) {
            Ok(cluster) => cluster.start_shard(shard).await,
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            engine(env, format!("restart node {node} shard {shard}: {e}"));
        }
        env.bump(node);
    }
    drop(admin);
    // The restarted shard refuses keys for Redis' 2 s writable delay, until its peers agree the
    // cluster is healthy.
    for &(node, shard) in &hits {
        if let Err(e) = settle(&env.admin, node).await {
            engine(env, format!("restart node {node} shard {shard}: {e}"));
        }
        // The shard came back empty: the foreign owner takes its keys again (the keys of the
        // other shards are still there; setting them again changes nothing).
        env.plant_foreign(&*env.admin.read().await, node).await;
    }
}

/// Row 4 on cluster nodes: SIGSTOP one shard of each node, then SIGCONT, then wait until its
/// cluster is healthy (a freeze past the cluster's node timeout flags the shard failing).
pub(super) async fn shard_pause(env: &Env, ep: &Episode) {
    let hits = hits(ep);
    {
        let admin = env.admin.read().await;
        for &(node, shard) in &hits {
            env.bump(node);
            if let Err(e) = admin.cluster(node).and_then(|c| c.pause_shard(shard)) {
                engine(env, format!("pause node {node} shard {shard}: {e}"));
            }
        }
    }
    tokio::time::sleep(ep.duration).await;
    {
        let admin = env.admin.read().await;
        for &(node, shard) in &hits {
            if let Err(e) = admin.cluster(node).and_then(|c| c.resume_shard(shard)) {
                engine(env, format!("resume node {node} shard {shard}: {e}"));
            }
            env.bump(node);
        }
    }
    for &(node, shard) in &hits {
        if let Err(e) = settle(&env.admin, node).await {
            engine(env, format!("resume node {node} shard {shard}: {e}"));
        }
    }
}

/// Row 9 on cluster nodes: `CLIENT KILL TYPE normal` on one shard of each node, again every
/// [`CONN_KILL_EVERY`] while the episode lasts: every client's connections to the shard reset,
/// with commands in flight or idle. The links' epochs move before and after each kill, so that
/// an S6 probe whose acquire may have met one does not count that node.
pub(super) async fn conn_kill(env: &Env, ep: &Episode) {
    let hits = hits(ep);
    let until = Instant::now() + ep.duration;
    loop {
        env.board.bump_links(&ep.nodes);
        {
            let admin = env.admin.read().await;
            for &(node, shard) in &hits {
                let killed = match admin.cluster(node) {
                    Ok(cluster) => {
                        let args = ["CLIENT", "KILL", "TYPE", "normal"];
                        cluster
                            .nodes()
                            .command_timeout(shard, &args, CONN_KILL_TIMEOUT)
                            .await
                    }
                    Err(e) => Err(e),
                };
                if !matches!(killed, Ok(RespValue::Integer(_))) {
                    engine(
                        env,
                        format!("CLIENT KILL on node {node} shard {shard}: {killed:?}"),
                    );
                }
            }
        }
        env.board.bump_links(&ep.nodes);
        let now = Instant::now();
        if now >= until {
            break;
        }
        tokio::time::sleep(CONN_KILL_EVERY.min(until - now)).await;
    }
}

/// On cluster nodes, a slot migration: the slot of one of the contended resources' keys starts
/// moving to another shard on each node (`IMPORTING` on the target, `MIGRATING` on the owner),
/// some of its keys move, and it is held so for the episode's duration (the owner answers `ASK`
/// for the keys it no longer has, so new keys are created on the target); then the rest move
/// and the slot is handed over (`MOVED` from then on). Not a fault of the node: every key stays
/// where a redirect finds it, with its TTL.
pub(super) async fn slot_migration(env: &Env, ep: &Episode) {
    let Some(m) = ep.slot_move else {
        return;
    };
    let Some(key) = env.migratable.get(m.pick % env.migratable.len().max(1)) else {
        return;
    };
    let mut moving: Vec<(usize, u16)> = Vec::new();
    {
        let mut admin = env.admin.write().await;
        for (&node, &offset) in ep.nodes.iter().zip(&ep.shards) {
            match begin(&mut admin, node, key, offset).await {
                Ok(slot) => moving.push((node, slot)),
                Err(e) => engine(
                    env,
                    format!("node {node}: begin moving the slot of {key}: {e}"),
                ),
            }
        }
    }
    let mut moved = 0;
    {
        let admin = env.admin.read().await;
        for &(node, slot) in &moving {
            let done = match admin.cluster(node) {
                Ok(cluster) => cluster.migrate_keys(slot, m.keys_first).await,
                Err(e) => Err(e),
            };
            match done {
                Ok(n) => moved += n,
                Err(e) => engine(env, format!("node {node}: move keys of slot {slot}: {e}")),
            }
        }
    }
    env.checker.event(format!(
        "slot of {key} held half-way on (node, slot) {moving:?}, {moved} key(s) moved"
    ));
    tokio::time::sleep(ep.duration).await;
    let mut admin = env.admin.write().await;
    for &(node, slot) in &moving {
        let finished = match admin.cluster_mut(node) {
            Ok(cluster) => cluster.finish_migration(slot).await,
            Err(e) => Err(e),
        };
        if let Err(e) = finished {
            engine(env, format!("node {node}: finish moving slot {slot}: {e}"));
        }
    }
}

/// Starts moving `key`'s slot on node `node` to the shard `offset` after its owner; returns
/// the slot.
async fn begin(admin: &mut Nodes, node: usize, key: &str, offset: usize) -> io::Result<u16> {
    let cluster = admin.cluster_mut(node)?;
    let slot = cluster.slot_of_key(key).await?;
    let to = (cluster.shard_of_slot(slot) + offset) % cluster.shards();
    cluster.begin_migration(slot, to).await?;
    Ok(slot)
}
