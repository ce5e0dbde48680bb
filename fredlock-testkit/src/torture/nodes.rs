//! The lock nodes of a run under admin control ([`Nodes`]): plain redis-servers, or one
//! [`LocalCluster`] per node; and the raw commands by node index that the fault lanes, the probes
//! and the final checks send, each to the process that holds its key.
//!
//! Owns the start of the nodes and the routing of a raw command to a plain node or to the shard
//! of a cluster that owns its key. Must not decide when to fault a node (that is `schedule.rs`,
//! `faults.rs` and `cluster_faults.rs`) nor judge what a command answers (the callers record it
//! with the checker).

use std::io;
use std::time::Duration;

use tokio::sync::RwLock;
use tokio::time::Instant;

use super::config::TortureConfig;
use crate::server::unexpected;
use crate::{LocalCluster, LocalNodes, RespValue};

/// Upper bound of one raw command of the checks.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound for a cluster node to serve keys again after a restart or a freeze.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two looks at a cluster's health (no event tells when it is healthy).
const SETTLE_POLL: Duration = Duration::from_millis(50);

/// The lock nodes of a run.
#[derive(Debug)]
pub(super) enum Nodes {
    /// One redis-server a node.
    Plain(LocalNodes),
    /// One Redis Cluster a node.
    Clusters(Vec<LocalCluster>),
}

impl Nodes {
    /// The nodes `config` asks for: plain or clusters, durable in fencing mode.
    pub(super) async fn start(config: &TortureConfig) -> io::Result<Nodes> {
        match config.cluster_shards {
            Some(shards) => Nodes::start_clusters(config.nodes, shards, config.fencing).await,
            None if config.fencing => {
                Ok(Nodes::Plain(LocalNodes::start_durable(config.nodes).await?))
            }
            None => Ok(Nodes::Plain(LocalNodes::start(config.nodes).await?)),
        }
    }

    /// `n` clusters of `shards` shards, started side by side (durable: every write persisted
    /// before it is answered, so a restarted shard keeps its data).
    pub(super) async fn start_clusters(
        n: usize,
        shards: usize,
        durable: bool,
    ) -> io::Result<Nodes> {
        let starting: Vec<_> = (0..n)
            .map(|_| {
                tokio::spawn(async move {
                    if durable {
                        LocalCluster::start_durable(shards).await
                    } else {
                        LocalCluster::start(shards).await
                    }
                })
            })
            .collect();
        let mut clusters = Vec::with_capacity(n);
        for started in starting {
            // A cluster already started is stopped when dropped, on an early return too.
            clusters.push(started.await.map_err(io::Error::other)??);
        }
        Ok(Nodes::Clusters(clusters))
    }

    /// The URL of every node: `redis://` of a plain node, `redis-cluster://` of a cluster.
    pub(super) fn urls(&self) -> Vec<String> {
        match self {
            Nodes::Plain(nodes) => nodes.urls(),
            Nodes::Clusters(clusters) => clusters.iter().map(LocalCluster::url).collect(),
        }
    }

    /// The plain nodes, for their proxies; `None` on clusters.
    pub(super) fn plain(&self) -> Option<&LocalNodes> {
        match self {
            Nodes::Plain(nodes) => Some(nodes),
            Nodes::Clusters(_) => None,
        }
    }

    /// Node `node`'s cluster; an error on plain nodes or out of range.
    pub(super) fn cluster(&self, node: usize) -> io::Result<&LocalCluster> {
        match self {
            Nodes::Clusters(clusters) => clusters.get(node).ok_or_else(|| out_of_range(node)),
            Nodes::Plain(_) => Err(not_a_cluster(node)),
        }
    }

    /// Node `node`'s cluster, to change it; an error on plain nodes or out of range.
    pub(super) fn cluster_mut(&mut self, node: usize) -> io::Result<&mut LocalCluster> {
        match self {
            Nodes::Clusters(clusters) => clusters.get_mut(node).ok_or_else(|| out_of_range(node)),
            Nodes::Plain(_) => Err(not_a_cluster(node)),
        }
    }

    /// One command about `key` (among `args`) on node `node`: on a cluster, to the shard that
    /// owns the key's slot, following one `ASK` or `MOVED`.
    pub(super) async fn command(
        &self,
        node: usize,
        key: &str,
        args: &[&str],
        timeout: Duration,
    ) -> io::Result<RespValue> {
        match self {
            Nodes::Plain(nodes) => nodes.command_timeout(node, args, timeout).await,
            Nodes::Clusters(_) => {
                self.cluster(node)?
                    .command_for_key(key, args, timeout)
                    .await
            }
        }
    }

    /// `GET key` on node `node`; `None` if the key does not exist.
    pub(super) async fn get(&self, node: usize, key: &str) -> io::Result<Option<String>> {
        match self
            .command(node, key, &["GET", key], COMMAND_TIMEOUT)
            .await?
        {
            RespValue::Bulk(None) => Ok(None),
            RespValue::Bulk(Some(bytes)) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "GET: not UTF-8")),
            other => Err(unexpected("GET", other)),
        }
    }

    /// `PTTL key` on node `node`: milliseconds left, `-1` without expiry, `-2` if absent.
    pub(super) async fn pttl(&self, node: usize, key: &str) -> io::Result<i64> {
        match self
            .command(node, key, &["PTTL", key], COMMAND_TIMEOUT)
            .await?
        {
            RespValue::Integer(ms) => Ok(ms),
            other => Err(unexpected("PTTL", other)),
        }
    }

    /// `KEYS pattern` on node `node` (on a cluster, on every shard).
    pub(super) async fn keys(&self, node: usize, pattern: &str) -> io::Result<Vec<String>> {
        match self {
            Nodes::Plain(nodes) => nodes.keys(node, pattern).await,
            Nodes::Clusters(_) => {
                let shards = self.cluster(node)?.nodes();
                let mut keys = Vec::new();
                for shard in 0..shards.len() {
                    keys.extend(shards.keys(shard, pattern).await?);
                }
                Ok(keys)
            }
        }
    }

    /// `SCRIPT FLUSH` on node `node` (on a cluster, on every shard).
    pub(super) async fn script_flush(&self, node: usize) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.script_flush(node).await,
            Nodes::Clusters(_) => {
                let shards = self.cluster(node)?.nodes();
                for shard in 0..shards.len() {
                    shards.script_flush(shard).await?;
                }
                Ok(())
            }
        }
    }

    /// Kills node `node` with SIGKILL (on a cluster, every shard).
    pub(super) fn kill(&mut self, node: usize) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.kill(node),
            Nodes::Clusters(_) => {
                let cluster = self.cluster_mut(node)?;
                for shard in 0..cluster.shards() {
                    cluster.kill_shard(shard)?;
                }
                Ok(())
            }
        }
    }

    /// Starts what is down of node `node` (on a cluster, every shard that is down), empty (or
    /// with its data if durable), and returns once each process answers `PING`. A cluster may
    /// still refuse keys then: [`settle`] waits until it serves them.
    pub(super) async fn start_node(&mut self, node: usize) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.start_node(node).await,
            Nodes::Clusters(_) => {
                let cluster = self.cluster_mut(node)?;
                for shard in 0..cluster.shards() {
                    if !cluster.is_running(shard) {
                        cluster.start_shard(shard).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Whether node `node` runs (on a cluster, every shard; a paused process counts).
    pub(super) fn is_running(&self, node: usize) -> bool {
        match self {
            Nodes::Plain(nodes) => nodes.is_running(node),
            Nodes::Clusters(clusters) => clusters
                .get(node)
                .is_some_and(|c| (0..c.shards()).all(|s| c.is_running(s))),
        }
    }

    /// Freezes node `node` with SIGSTOP (on a cluster, every shard).
    pub(super) fn pause(&self, node: usize) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.pause(node),
            Nodes::Clusters(_) => {
                let cluster = self.cluster(node)?;
                (0..cluster.shards()).try_for_each(|s| cluster.pause_shard(s))
            }
        }
    }

    /// Resumes node `node` with SIGCONT (on a cluster, every shard; each shard is tried even
    /// when one fails, the first error is returned).
    pub(super) fn resume(&self, node: usize) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.resume(node),
            Nodes::Clusters(_) => {
                let cluster = self.cluster(node)?;
                let mut first = Ok(());
                for shard in 0..cluster.shards() {
                    let resumed = cluster.resume_shard(shard);
                    if first.is_ok() {
                        first = resumed;
                    }
                }
                first
            }
        }
    }

    /// Kills the process that holds `key` on node `node` (the node, or the shard that owns
    /// the key's slot) and starts it again at once, EMPTY (unless durable), waiting until the
    /// node serves keys again: a crash and restart without the delay Redlock needs (row 11).
    pub(super) async fn restart_holding(&mut self, node: usize, key: &str) -> io::Result<()> {
        match self {
            Nodes::Plain(nodes) => nodes.restart(node).await,
            Nodes::Clusters(_) => {
                let cluster = self.cluster_mut(node)?;
                let shard = cluster.shard_of_key(key).await?;
                cluster.restart_shard(shard).await
            }
        }
    }
}

/// Waits (at most 30 s) until node `node` serves every key again: on a cluster, until every
/// shard agrees the cluster is healthy (after a restart, a shard refuses keys for Redis' 2 s
/// writable delay); nothing to wait for on a plain node. Holds `admin` only during each look,
/// so that the other lanes go on meanwhile.
pub(super) async fn settle(admin: &RwLock<Nodes>, node: usize) -> io::Result<()> {
    let give_up = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let health = match &*admin.read().await {
            Nodes::Plain(_) => return Ok(()),
            nodes => nodes.cluster(node)?.check_ok().await,
        };
        match health {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= give_up => return Err(e),
            Err(_) => tokio::time::sleep(SETTLE_POLL).await,
        }
    }
}

fn out_of_range(node: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("node index {node} out of range"),
    )
}

fn not_a_cluster(node: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("node {node} is a plain node, not a cluster"),
    )
}
