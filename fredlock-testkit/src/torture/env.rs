//! What the clients and the fault lanes share ([`Env`]): the nodes under admin control, the
//! observer, the proxies' board, the node epochs, the resources; its set-up before a run, the
//! checks on the nodes after it, and the data node's client.
//!
//! Owns the run's shared state and the raw node access around a run (planting foreign keys,
//! the final key checks, reading the counters). Must not inject faults (that is `faults.rs`) nor
//! run client operations (that is `worker/`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{ClientLike, Config, KeysInterface, LuaInterface, ReconnectPolicy};
use fredlock::{Redlock, Retry};
use tokio::sync::RwLock;

use super::faults::Board;
use super::worker::{fenced_resource, register_keys, FENCED_RESOURCES};
use super::{TortureConfig, FOREIGN_VALUE};
use crate::checker::{Checker, ViolationKind};
use crate::{FaultProxy, LocalNodes};

/// Per-node timeout of the observer's inspections.
const OBSERVER_TIMEOUT: Duration = Duration::from_millis(100);

/// What the clients and the fault lanes share.
pub(super) struct Env {
    pub(super) config: TortureConfig,
    pub(super) checker: Arc<Checker>,
    pub(super) observer: Redlock,
    pub(super) admin: RwLock<LocalNodes>,
    pub(super) board: Board,
    /// Per node, bumped whenever it is killed, restarted, paused or resumed: a check that
    /// depends on a node's keys skips nodes whose epoch moved (a frozen node can execute an old
    /// `SET` late when it resumes; a restarted one lost everything).
    pub(super) epochs: Vec<AtomicU64>,
    pub(super) resources: Vec<String>,
    pub(super) foreign: Vec<String>,
    pub(super) foreign_px: u64,
}

impl Env {
    /// Everything a run shares over `nodes`: the observer, every client's proxies (passing),
    /// the foreign keys planted on every node. Also returns each client's `Redlock` over its
    /// own proxies, with its node timeout.
    pub(super) async fn start(
        config: &TortureConfig,
        nodes: LocalNodes,
        checker: Arc<Checker>,
    ) -> io::Result<(Arc<Env>, Vec<ClientRedlocks>)> {
        let observer = Redlock::builder()
            .nodes(nodes.urls())
            .node_timeout(OBSERVER_TIMEOUT)
            .retry(Retry::once())
            .build()
            .await
            .map_err(io_err)?;
        let proxies = start_proxies(config, &nodes).await?;
        let redlocks = client_redlocks(config, &proxies).await?;
        let env = Arc::new(Env {
            foreign_px: (config.duration + Duration::from_secs(120)).as_millis() as u64,
            resources: (0..config.resources).map(|i| format!("res:{i}")).collect(),
            foreign: (0..config.foreign_resources.max(1))
                .map(|i| format!("foreign:{i}"))
                .collect(),
            board: Board::new(config, proxies),
            epochs: (0..config.nodes).map(|_| AtomicU64::new(0)).collect(),
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

    pub(super) async fn plant_foreign(&self, admin: &LocalNodes, node: usize) {
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

/// Every client's own proxy in front of every node.
async fn start_proxies(
    config: &TortureConfig,
    nodes: &LocalNodes,
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

/// One client's `Redlock`s over its own proxies.
pub(super) struct ClientRedlocks {
    pub(super) redlock: Redlock,
    /// Fencing mode: a second `Redlock` with fencing tokens, over the same proxies.
    pub(super) fenced: Option<Redlock>,
    pub(super) node_timeout: Duration,
}

/// Each client's `Redlock` over its own proxies, with its node timeout (longer for the patient
/// clients), and in fencing mode its fencing `Redlock`.
async fn client_redlocks(
    config: &TortureConfig,
    proxies: &[Vec<FaultProxy>],
) -> io::Result<Vec<ClientRedlocks>> {
    let mut redlocks = Vec::new();
    for (c, mine) in proxies.iter().enumerate() {
        let timeout = if config.patient(c) {
            config.patient_node_timeout
        } else {
            config.node_timeout
        };
        let build = |fencing: bool| {
            Redlock::builder()
                .nodes(mine.iter().map(|p| p.url()))
                .node_timeout(timeout)
                .retry(config.retry)
                .drift_factor(config.drift_factor)
                .fencing_tokens(fencing)
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
    let (fence, sem) = (env.observer.key("~fence:"), env.observer.key("~sem:"));
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
            // Fencing counters and a semaphore's permits record never expire by design.
            let durable = k.starts_with(&fence) || (k.starts_with(&sem) && k.ends_with(":permits"));
            if foreign.contains(&k) || k.starts_with(&private) || durable {
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
