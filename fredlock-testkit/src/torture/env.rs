//! What the clients and the fault lanes share ([`Env`]): the nodes under admin control, the
//! observer, the proxies' board, the node epochs and locks, the resources; its set-up before a
//! run, the checks on the nodes after it, and the data node's client.
//!
//! Owns the run's shared state and the raw node access around a run (planting foreign keys,
//! the final key checks, reading the counters). Must not inject faults (that is `faults.rs` and
//! `cluster_faults.rs`) nor run client operations (that is `worker/`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{ClientLike, Config, KeysInterface, LuaInterface, ReconnectPolicy};
use fredlock::{Redlock, Retry};
use tokio::sync::{Mutex, MutexGuard, RwLock};
use tokio::time::Instant;

use super::board::Board;
use super::config::{TortureConfig, FOREIGN_VALUE};
use super::nodes::{settle, Nodes};
use super::resources::{fenced_resource, register_keys, FENCED_RESOURCES, SEMAPHORES};
use super::schedule::ms;
use crate::checker::{Checker, ViolationKind};
use crate::FaultProxy;

/// Per-node timeout of the observer's inspections.
const OBSERVER_TIMEOUT: Duration = Duration::from_millis(100);
/// Cluster nodes: how long the run waits at its start for every client to have read every
/// node's slot table.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the clients and the fault lanes share.
pub(super) struct Env {
    pub(super) config: TortureConfig,
    pub(super) checker: Arc<Checker>,
    pub(super) observer: Redlock,
    pub(super) admin: RwLock<Nodes>,
    pub(super) board: Board,
    /// Per node, bumped whenever it is killed, restarted, paused or resumed: a check that
    /// depends on a node's keys skips nodes whose epoch moved (a frozen node can execute an old
    /// `SET` late when it resumes; a restarted one lost everything).
    pub(super) epochs: Vec<AtomicU64>,
    /// Per node, held by a fault episode that acts on it (see [`Env::hold_nodes`]).
    node_locks: Vec<Mutex<()>>,
    pub(super) resources: Vec<String>,
    pub(super) foreign: Vec<String>,
    pub(super) foreign_px: u64,
    /// Cluster nodes: the keys whose slots the migrations move: the lock keys of the contended
    /// resources, the semaphores' keys and, in fencing mode, the fenced resources' lock keys
    /// (their counters share their slots).
    pub(super) migratable: Vec<String>,
}

impl Env {
    /// Everything a run shares over `nodes`: the observer, every client's proxies (passing),
    /// the foreign keys planted on every node. Also returns each client's `Redlock` over its
    /// own proxies (on cluster nodes, straight on the clusters), with its node timeout.
    pub(super) async fn start(
        config: &TortureConfig,
        nodes: Nodes,
        checker: Arc<Checker>,
    ) -> io::Result<(Arc<Env>, Vec<ClientRedlocks>)> {
        let observer = Redlock::builder()
            .nodes(nodes.urls())
            .node_timeout(OBSERVER_TIMEOUT)
            .retry(Retry::once())
            .build()
            .await
            .map_err(io_err)?;
        let proxies = match nodes.plain() {
            Some(plain) => start_proxies(config, plain).await?,
            None => Vec::new(),
        };
        let urls: Vec<Vec<String>> = if proxies.is_empty() {
            vec![nodes.urls(); config.clients]
        } else {
            proxies
                .iter()
                .map(|mine| mine.iter().map(FaultProxy::url).collect())
                .collect()
        };
        let redlocks = client_redlocks(config, &urls).await?;
        if config.cluster_shards.is_some() {
            // Each client reads each cluster's slot table in the background: the run starts
            // once every one has, so that its first seconds are not spent unavailable.
            let all = redlocks
                .iter()
                .flat_map(|c| std::iter::once(&c.redlock).chain(c.fenced.as_ref()))
                .chain([&observer]);
            for redlock in all {
                serving_every_node(redlock).await?;
            }
        }
        let migratable = migratable_keys(config, &observer);
        let env = Arc::new(Env {
            foreign_px: (config.duration + Duration::from_secs(120)).as_millis() as u64,
            resources: (0..config.resources).map(|i| format!("res:{i}")).collect(),
            foreign: (0..config.foreign_resources.max(1))
                .map(|i| format!("foreign:{i}"))
                .collect(),
            board: Board::new(config, proxies),
            epochs: (0..config.nodes).map(|_| AtomicU64::new(0)).collect(),
            node_locks: (0..config.nodes).map(|_| Mutex::new(())).collect(),
            migratable,
            admin: RwLock::new(nodes),
            observer,
            checker,
            config: config.clone(),
        });
        {
            let admin = env.admin.read().await;
            for i in 0..config.nodes {
                env.plant_foreign(&admin, i).await;
            }
        }
        Ok((env, redlocks))
    }

    pub(super) fn epochs(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect()
    }

    pub(super) fn bump(&self, node: usize) {
        self.epochs[node].fetch_add(1, Ordering::SeqCst);
    }

    /// Holds `nodes` for a fault episode that acts on them, so that two lanes never act on one
    /// node at once (a migration must not meet a frozen or dead shard; a connection kill must
    /// not cut a migration's admin commands). Locks in ascending order: no two episodes can wait
    /// for each other.
    pub(super) async fn hold_nodes(&self, nodes: &[usize]) -> Vec<MutexGuard<'_, ()>> {
        let mut sorted = nodes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut held = Vec::with_capacity(sorted.len());
        for n in sorted {
            if let Some(lock) = self.node_locks.get(n) {
                held.push(lock.lock().await);
            }
        }
        held
    }

    /// Holds those of `nodes` that no other episode holds, at once; returns them (ascending)
    /// and their guards.
    pub(super) fn hold_free_nodes(&self, nodes: &[usize]) -> (Vec<usize>, Vec<MutexGuard<'_, ()>>) {
        let mut sorted = nodes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut held = (Vec::new(), Vec::new());
        for n in sorted {
            if let Some(guard) = self.node_locks.get(n).and_then(|l| l.try_lock().ok()) {
                held.0.push(n);
                held.1.push(guard);
            }
        }
        held
    }

    pub(super) async fn plant_foreign(&self, admin: &Nodes, node: usize) {
        let px = self.foreign_px.to_string();
        for f in &self.foreign {
            let key = self.observer.key(f);
            let args = ["SET", key.as_str(), FOREIGN_VALUE, "PX", px.as_str()];
            let reply = admin
                .command(node, &key, &args, Duration::from_secs(2))
                .await;
            if !matches!(reply, Ok(crate::RespValue::Simple(ref ok)) if ok == "OK") {
                self.checker.violation(
                    ViolationKind::Engine,
                    format!("could not plant {key} on node {node}"),
                );
            }
        }
    }
}

/// Cluster nodes: the keys whose slots the migrations move (see [`Env::migratable`]).
fn migratable_keys(config: &TortureConfig, observer: &Redlock) -> Vec<String> {
    if config.cluster_shards.is_none() {
        return Vec::new();
    }
    let mut keys: Vec<String> = (0..config.resources)
        .map(|i| observer.key(&format!("res:{i}")))
        .collect();
    // A semaphore's keys all hash on its name (`~sem:{name}:..`).
    keys.extend(
        SEMAPHORES
            .iter()
            .map(|(name, _)| observer.key(&format!("~sem:{{{name}}}:permits"))),
    );
    if config.fencing {
        keys.extend((0..FENCED_RESOURCES).map(|i| observer.key(&fenced_resource(i))));
    }
    keys
}

/// Waits (at most [`CLUSTER_READY_TIMEOUT`]) until `redlock` gets an answer from every node
/// (a client reads each cluster's slot table in the background, after `build`).
pub(super) async fn serving_every_node(redlock: &Redlock) -> io::Result<()> {
    let give_up = Instant::now() + CLUSTER_READY_TIMEOUT;
    loop {
        let seen = redlock.inspect("ready-probe").await.map_err(io_err)?;
        if seen.nodes.iter().all(|n| n.state.is_ok()) {
            return Ok(());
        }
        if Instant::now() >= give_up {
            return Err(io_err(format!(
                "a client did not reach every cluster node within {CLUSTER_READY_TIMEOUT:?}: {:?}",
                seen.nodes.iter().map(|n| &n.state).collect::<Vec<_>>()
            )));
        }
        // No event tells when a slot table has been read: look again shortly.
        tokio::time::sleep(ms(50)).await;
    }
}

/// Every client's own proxy in front of every node.
async fn start_proxies(
    config: &TortureConfig,
    nodes: &crate::LocalNodes,
) -> io::Result<Vec<Vec<FaultProxy>>> {
    let mut proxies = Vec::new();
    for _ in 0..config.clients {
        let mut mine = Vec::new();
        for i in 0..config.nodes {
            mine.push(FaultProxy::start(nodes.addr(i)).await?);
        }
        proxies.push(mine);
    }
    Ok(proxies)
}

/// One client's `Redlock`s over its own proxies (on cluster nodes, over the clusters).
pub(super) struct ClientRedlocks {
    pub(super) redlock: Redlock,
    /// Fencing mode: a second `Redlock` with fencing tokens, over the same proxies.
    pub(super) fenced: Option<Redlock>,
    pub(super) node_timeout: Duration,
}

/// Each client's `Redlock` over its own node URLs (its proxies, or the clusters), with its node
/// timeout (longer for the patient clients), and in fencing mode its fencing `Redlock`.
async fn client_redlocks(
    config: &TortureConfig,
    urls: &[Vec<String>],
) -> io::Result<Vec<ClientRedlocks>> {
    let mut redlocks = Vec::new();
    for (c, mine) in urls.iter().enumerate() {
        let timeout = if config.patient(c) {
            config.patient_node_timeout
        } else {
            config.node_timeout
        };
        let build = |fencing: bool| {
            Redlock::builder()
                .nodes(mine.iter().cloned())
                .node_timeout(timeout)
                .retry(config.retry)
                .drift_factor(config.drift_factor)
                .fencing_tokens(fencing)
                .wake_on_release(config.wake_on_release)
                .build()
        };
        let redlock = build(false).await.map_err(io_err)?;
        let fenced = if config.fencing {
            Some(build(true).await.map_err(io_err)?)
        } else {
            None
        };
        redlocks.push(ClientRedlocks {
            redlock,
            fenced,
            node_timeout: timeout,
        });
    }
    Ok(redlocks)
}

pub(super) fn same(a: &[u64], b: &[u64]) -> Vec<bool> {
    a.iter().zip(b).map(|(x, y)| x == y).collect()
}

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A fred client to the data node (never faulted): one attempt per command (a write is never
/// replayed behind our back), a 2 s timeout as a safety net.
pub(super) async fn data_client(url: &str) -> io::Result<Client> {
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

pub(super) fn data_key(resource: &str) -> String {
    format!("data:{resource}")
}

/// After the run: no lock key without expiry or beyond the max TTL (S6, row 9), and every
/// foreign key intact on every node (S4). Returns how many lock keys were left (expiring).
pub(super) async fn final_checks(env: &Env) -> usize {
    let mut restarted = Vec::new();
    {
        let mut admin = env.admin.write().await;
        for i in 0..env.config.nodes {
            let _ = admin.resume(i);
            if !admin.is_running(i) {
                let _ = admin.start_node(i).await;
                restarted.push(i);
            }
        }
    }
    for &i in &restarted {
        if let Err(e) = settle(&env.admin, i).await {
            env.checker.violation(
                ViolationKind::Engine,
                format!("node {i} not serving at the end: {e}"),
            );
        }
    }
    let admin = env.admin.read().await;
    for &i in &restarted {
        env.plant_foreign(&admin, i).await;
    }
    let prefix = env.observer.key("");
    let foreign: Vec<String> = env.foreign.iter().map(|f| env.observer.key(f)).collect();
    let private = env.observer.key("private:");
    let (fence, sem) = (env.observer.key("~fence:"), env.observer.key("~sem:"));
    let rw = env.observer.key("~rw:");
    let line = env.observer.key("~line:");
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
            // Fencing counters, a semaphore's permits record and a read-write lock's readers
            // set never expire by design (the set empties, and so goes, with its readers).
            let durable = k.starts_with(&fence)
                || (k.starts_with(&sem) && k.ends_with(":permits"))
                || (k.starts_with(&rw) && k.ends_with(":r"));
            if foreign.contains(&k) || k.starts_with(&private) || durable {
                continue;
            }
            leftover += 1;
            env.checker.count_check("S6 leftover key TTL");
            // A wait line and its waiters' leases are no locks: they live up to 4 leases of
            // 3 s (the line) and one lease (a waiter's), and must expire.
            let bound = if k.starts_with(&line) {
                12_001
            } else {
                ttl_max_ms
            };
            match admin.pttl(i, &k).await {
                Ok(pttl) if pttl == -1 || pttl > bound => env.checker.violation(
                    ViolationKind::KeyBeyondTtl,
                    format!("node {i}: {k} has PTTL {pttl} ms (max TTL {bound} ms)"),
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

/// Fencing mode: hands every fenced register's log (the tokens it accepted, in order) to the
/// checker.
pub(super) async fn read_registers(env: &Env, data_url: &str) -> io::Result<()> {
    if !env.config.fencing {
        return Ok(());
    }
    let data = data_client(data_url).await?;
    for i in 0..FENCED_RESOURCES {
        let resource = fenced_resource(i);
        let (_, log) = register_keys(&resource);
        let raw: Vec<String> = data
            .eval(
                "return redis.call('LRANGE', KEYS[1], 0, -1)",
                vec![log],
                Vec::<String>::new(),
            )
            .await
            .map_err(io_err)?;
        let accepted = raw
            .iter()
            .map(|t| t.parse::<u64>())
            .collect::<Result<Vec<u64>, _>>()
            .map_err(io_err)?;
        env.checker.register_log(&resource, accepted);
    }
    let _ = data.quit().await;
    Ok(())
}

/// The counters' final values on the data node.
pub(super) async fn read_finals(
    env: &Env,
    data_url: &str,
) -> io::Result<HashMap<String, Option<String>>> {
    let data = data_client(data_url).await?;
    let mut finals = HashMap::new();
    for r in &env.resources {
        let v: Option<String> = data.get(data_key(r)).await.map_err(io_err)?;
        finals.insert(r.clone(), v);
    }
    let _ = data.quit().await;
    Ok(finals)
}
