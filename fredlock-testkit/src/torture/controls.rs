//! The negative controls: deterministic scenarios outside Redlock's assumptions (rows 11 and 12)
//! where the checker MUST find the overlap, and the same made safe, where it must find nothing;
//! row 11 again on cluster nodes, where the process that restarts empty is one shard.
//!
//! Owns the controls' own small set-up (three fresh nodes or clusters, two clients, a data node)
//! and their list, with the mode controls of `mode_controls.rs` (each judged by `verdict.rs`).
//! Must not use the torture run's schedule, fault lanes or workers (only its data-node client
//! and its node control): a control is a fixed script, so that its outcome says something about
//! the checker alone.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{KeysInterface, Value};
use fredlock::{Lock, Redlock, Retry};
use tokio::time::Instant;

use super::config::RESTART_MARGIN;
use super::env::{data_client, data_key, io_err, serving_every_node};
use super::nodes::Nodes;
use super::schedule::ms;
use super::verdict::{control, ControlResult};
use crate::checker::{Checker, CheckerReport, DataValue, GrantId, GrantKind, ViolationKind};
use crate::{LocalNodes, RespValue};

/// Upper bound of one raw command of a control's set-up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Two clients straight on three fresh nodes (or clusters), a data node, a checker.
struct ControlEnv {
    nodes: Nodes,
    _data_node: LocalNodes,
    data: Client,
    a: Redlock,
    b: Redlock,
    checker: Checker,
}

impl ControlEnv {
    /// Three plain nodes, or (`Some(shards)`) three clusters of `shards` shards.
    async fn start(cluster_shards: Option<usize>) -> io::Result<ControlEnv> {
        let nodes = match cluster_shards {
            Some(shards) => Nodes::start_clusters(3, shards, false).await?,
            None => Nodes::Plain(LocalNodes::start(3).await?),
        };
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
        if cluster_shards.is_some() {
            // A placement on exactly [0, 1] needs every node's slot table read first.
            serving_every_node(&a).await?;
            serving_every_node(&b).await?;
        }
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
        let args = ["SET", key, "blocker", "PX", "60000"];
        expect_ok(self.nodes.command(node, key, &args, SETUP_TIMEOUT).await?)
    }

    /// Where `token` is held, as node indices.
    async fn placement(&self, resource: &str, token: &str) -> io::Result<Vec<usize>> {
        let i = self.a.inspect(resource).await.map_err(io_err)?;
        Ok(i.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(&n.state, Ok(Some(h)) if h.has_token(token)))
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
        let del = ["DEL", key.as_str()];
        expect_ok_int(self.nodes.command(2, &key, &del, SETUP_TIMEOUT).await?)?;
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
/// A reads the counter before B's grant and writes it after B's increment. On cluster nodes
/// (`Some(shards)`), what restarts is the shard of node 1 that holds A's key.
async fn control_row11(
    delayed: bool,
    cluster_shards: Option<usize>,
) -> io::Result<(CheckerReport, String)> {
    let mut env = ControlEnv::start(cluster_shards).await?;
    let r = "control:row11";
    // A must outlive a cluster shard's restart (Redis' 2 s writable delay) and B's acquire.
    let ttl = match (delayed, cluster_shards) {
        (true, _) => ms(1000),
        (false, None) => ms(5000),
        (false, Some(_)) => ms(10_000),
    };
    let (lock_a, ga) = env.a_on_0_1(r, ttl).await?;
    let key_a = env.a.key(r);
    let what = match cluster_shards {
        Some(_) => "node 1's shard holding A's key",
        None => "node 1",
    };
    let detail;
    if delayed {
        // A works inside its window and stops; node 1 comes back only after A's TTL.
        let read = env.read(r).await?;
        env.write(ga, r, read).await?;
        tokio::time::sleep_until(lock_a.acquired_at() + ttl + RESTART_MARGIN).await;
        env.nodes.restart_holding(1, &key_a).await?;
        let (lock_b, gb) = env.acquire_b(r, ms(5000)).await?;
        let at_b = env.placement(r, lock_b.token()).await?;
        let read = env.read(r).await?;
        env.write(gb, r, read).await?;
        env.checker.close(gb, Instant::now(), lock_b.deadline());
        let _ = lock_b.release().await;
        env.checker.close(ga, Instant::now(), lock_a.deadline());
        let _ = lock_a.release().await;
        detail = format!("A on [0, 1], {what} restarted after A's TTL, B on {at_b:?}");
    } else {
        env.nodes.restart_holding(1, &key_a).await?;
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
            format!("A on [0, 1], {what} restarted empty at once, B on {at_b:?} while A valid");
    }
    Ok((env.finish(r).await?, detail))
}

/// Row 12: A holds {0, 1}; node 1's clock "jumps" (PEXPIRE 1 ms); node 2 is free; B acquires.
async fn control_row12() -> io::Result<(CheckerReport, String)> {
    let env = ControlEnv::start(None).await?;
    let r = "control:row12";
    let (lock_a, ga) = env.a_on_0_1(r, ms(5000)).await?;
    let key = env.a.key(r);
    let pexpire = ["PEXPIRE", key.as_str(), "1"];
    if env.nodes.command(1, &key, &pexpire, SETUP_TIMEOUT).await? != RespValue::Integer(1) {
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

/// The negative controls: deterministic scenarios outside Redlock's assumptions where the
/// checker MUST find the overlap (a control that finds nothing means the checker is blind), and
/// the same schedule made safe by a delayed restart, where it must find nothing.
///
/// Then the semaphore and fencing controls (see `mode_controls.rs`): per-node counting admits
/// more holders than permits, max-of-INCR repeats a fencing token, and a node restarting empty
/// repeats one even with fredlock's write-back; fredlock under the same schedules (and with a
/// durable node) must show nothing.
pub async fn negative_controls() -> Vec<ControlResult> {
    let mut controls = vec![
        control(
            "node restarted EMPTY at once, B acquires while A is valid",
            "11",
            Some(ViolationKind::Overlap),
            control_row11(false, None),
        )
        .await,
        control(
            "same, delayed restart (after A's TTL)",
            "11",
            None,
            control_row11(true, None),
        )
        .await,
        control(
            "clock jump on one node (PEXPIRE 1 ms) + split",
            "12",
            Some(ViolationKind::Overlap),
            control_row12(),
        )
        .await,
    ];
    controls.extend(super::mode_controls::mode_controls().await);
    controls
}

/// Row 11 on cluster nodes (three clusters of `shards` shards, 3 or more): A holds {0, 1}; the
/// ONE shard of node 1 that holds A's key restarts EMPTY at once (the other shards of the node
/// keep their keys), B acquires while A is valid; the checker MUST find the overlap. Then the
/// same with the restart delayed past A's TTL, where it must find nothing. This is the restart
/// rule Redlock needs, and the cluster torture run keeps it (its shard kills restart only after
/// the max TTL).
pub async fn cluster_controls(shards: usize) -> Vec<ControlResult> {
    vec![
        control(
            "cluster nodes: the shard holding A's key restarted EMPTY at once, B acquires while A is valid",
            "11",
            Some(ViolationKind::Overlap),
            control_row11(false, Some(shards)),
        )
        .await,
        control(
            "same on cluster nodes, delayed restart (after A's TTL)",
            "11",
            None,
            control_row11(true, Some(shards)),
        )
        .await,
    ]
}
