//! The servers' side of a measurement: INFO counters (commands, CPU, memory) read over raw RESP
//! ([`Server`], [`Snapshot`], [`Work`]) and rounds metered with them. Must not print.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fredlock::fred::prelude::{ClientLike, Value};
use fredlock::Redlock;
use fredlock_testkit::{self as testkit, LocalNodes, RespValue};

use crate::rounds::{throughput_round, Throughput};
use crate::targets::Target;

/// INFO `section` of node `i`, through the Redlock's own fred client (single-server nodes).
pub(crate) async fn node_info(redlock: &Redlock, i: usize, section: &'static str) -> String {
    use fredlock::fred::types::{ClusterHash, CustomCommand};
    let client = redlock
        .client(i)
        .expect("a single-server node has a client");
    let info: Value = client
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec![section],
        )
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.as_str().map(|s| s.into_owned()).unwrap_or_default()
}

/// The number after `field:` in an INFO text.
pub(crate) fn info_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `total_commands_processed` (INFO stats) of each node, through fredlock's clients.
pub(crate) async fn commands_per_node(redlock: &Redlock) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..redlock.node_names().len() {
        let stats = node_info(redlock, i, "stats").await;
        out.push(info_field(&stats, "total_commands_processed").unwrap_or(0));
    }
    out
}

/// Sum of `total_commands_processed` over the nodes (INFO stats), through fredlock's clients.
pub(crate) async fn commands_processed(redlock: &Redlock) -> u64 {
    commands_per_node(redlock).await.iter().sum()
}

/// Upper bound for one counter read or reset on a local server.
pub(crate) const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Commands the bench sends itself to read and reset the counters: left out of every count.
pub(crate) const OWN_COMMANDS: [&str; 2] = ["info", "config"];

/// A local redis-server process, read directly (not through fred): its command counters, its
/// CPU time and its memory, from INFO. For the cluster shards, which fredlock reaches through
/// clients of its own (`Redlock::client` has none to lend for a cluster node).
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
}

impl Server {
    /// Every process of `nodes`, in index order.
    pub(crate) fn all(nodes: &LocalNodes) -> Vec<Server> {
        (0..nodes.len())
            .map(|i| Server {
                addr: nodes.addr(i),
            })
            .collect()
    }

    pub(crate) async fn command(&self, args: &[&str]) -> RespValue {
        testkit::resp_command(self.addr, args, ADMIN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", self.addr))
    }

    /// INFO of the given sections (several at once: Redis 7).
    pub(crate) async fn info(&self, sections: &[&str]) -> String {
        let args: Vec<&str> = std::iter::once("INFO")
            .chain(sections.iter().copied())
            .collect();
        match self.command(&args).await {
            RespValue::Bulk(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
            other => panic!("INFO {sections:?} on {}: {other:?}", self.addr),
        }
    }

    /// Calls per command since the last CONFIG RESETSTAT (INFO commandstats, which counts the
    /// calls scripts make too), without the bench's own INFO and CONFIG.
    pub(crate) async fn calls(&self) -> BTreeMap<String, u64> {
        calls(&self.info(&["commandstats"]).await)
    }

    /// [`calls`](Self::calls) and the CPU time the process used so far (INFO cpu: user + system,
    /// all threads, to the microsecond), read at the same moment.
    pub(crate) async fn counters(&self) -> (BTreeMap<String, u64>, Duration) {
        let text = self.info(&["commandstats", "cpu"]).await;
        let seconds = |field| {
            text.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("INFO cpu on {}: no {field}", self.addr))
        };
        let cpu = seconds("used_cpu_user") + seconds("used_cpu_sys");
        (calls(&text), Duration::from_secs_f64(cpu))
    }

    pub(crate) async fn reset_stats(&self) {
        match self.command(&["CONFIG", "RESETSTAT"]).await {
            RespValue::Simple(ok) if ok == "OK" => {}
            other => panic!("CONFIG RESETSTAT on {}: {other:?}", self.addr),
        }
    }

    /// Memory the data takes: `used_memory` without the clients' buffers (`mem_clients_normal`),
    /// which swell and shrink with the traffic of the moment.
    pub(crate) async fn data_memory(&self) -> u64 {
        data_memory(&self.info(&["memory"]).await)
    }
}

/// `used_memory - mem_clients_normal` of an INFO memory text.
pub(crate) fn data_memory(info: &str) -> u64 {
    let used = info_field(info, "used_memory").unwrap_or(0);
    used.saturating_sub(info_field(info, "mem_clients_normal").unwrap_or(0))
}

/// Calls per command of an INFO commandstats text, without the bench's own INFO and CONFIG.
pub(crate) fn calls(text: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        // cmdstat_set:calls=12,usec=30,... (subcommands as cmdstat_config|resetstat)
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if OWN_COMMANDS.contains(&name.split('|').next().unwrap_or(name)) {
            continue;
        }
        let n = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        calls.insert(name.to_string(), n);
    }
    calls
}

/// The counters of some servers at one moment.
pub(crate) struct Snapshot {
    pub(crate) calls: Vec<BTreeMap<String, u64>>,
    pub(crate) cpu: Vec<Duration>,
    pub(crate) at: Instant,
}

impl Snapshot {
    pub(crate) async fn take(servers: &[Server]) -> Snapshot {
        let mut snapshot = Snapshot {
            calls: Vec::with_capacity(servers.len()),
            cpu: Vec::with_capacity(servers.len()),
            at: Instant::now(),
        };
        for server in servers {
            let (calls, cpu) = server.counters().await;
            snapshot.calls.push(calls);
            snapshot.cpu.push(cpu);
        }
        snapshot
    }
}

/// What some servers did between two snapshots.
#[derive(Default, Clone)]
pub(crate) struct Work {
    /// Commands per server.
    pub(crate) per_server: Vec<u64>,
    /// Calls per command, all servers together.
    pub(crate) per_command: BTreeMap<String, u64>,
    /// CPU time of all the servers together.
    pub(crate) cpu: Duration,
    /// Wall time between the snapshots.
    pub(crate) elapsed: Duration,
}

impl Work {
    pub(crate) fn between(before: &Snapshot, after: &Snapshot) -> Work {
        let mut work = Work {
            elapsed: after.at.saturating_duration_since(before.at),
            ..Work::default()
        };
        for (b, a) in before.calls.iter().zip(&after.calls) {
            let mut total = 0;
            for (name, n) in a {
                let d = n.saturating_sub(b.get(name).copied().unwrap_or(0));
                total += d;
                *work.per_command.entry(name.clone()).or_default() += d;
            }
            work.per_server.push(total);
        }
        for (b, a) in before.cpu.iter().zip(&after.cpu) {
            work.cpu += a.saturating_sub(*b);
        }
        work
    }

    pub(crate) fn commands(&self) -> u64 {
        self.per_server.iter().sum()
    }

    pub(crate) fn add(&mut self, other: &Work) {
        if self.per_server.is_empty() {
            *self = other.clone();
            return;
        }
        for (mine, theirs) in self.per_server.iter_mut().zip(&other.per_server) {
            *mine += theirs;
        }
        for (name, n) in &other.per_command {
            *self.per_command.entry(name.clone()).or_default() += n;
        }
        self.cpu += other.cpu;
        self.elapsed += other.elapsed;
    }

    /// Server CPU per command, µs.
    pub(crate) fn cpu_per_command_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.commands().max(1) as f64
    }

    /// Server CPU per command, µs, without what the servers burn when idle (`idle`: CPU
    /// seconds per second, all of them together; [`idle_rate`]).
    pub(crate) fn net_cpu_per_command_us(&self, idle: f64) -> f64 {
        let net = self.cpu.as_secs_f64() - idle * self.elapsed.as_secs_f64();
        net.max(0.0) * 1e6 / self.commands().max(1) as f64
    }
}

/// CPU seconds per second that `servers` use together while nobody sends them anything
/// (serverCron; for cluster shards also the cluster bus), over `window`.
pub(crate) async fn idle_rate(servers: &[Server], window: Duration) -> f64 {
    let before = Snapshot::take(servers).await;
    tokio::time::sleep(window).await;
    let after = Snapshot::take(servers).await;
    let work = Work::between(&before, &after);
    work.cpu.as_secs_f64() / work.elapsed.as_secs_f64()
}

/// A throughput round ([`throughput_round`]) with what the servers did during it.
pub(crate) struct Metered {
    pub(crate) round: Throughput,
    pub(crate) work: Work,
}

/// [`throughput_round`], with the servers' counters read before and after. Replies the early
/// decision left in flight land within the short pause before the second reading.
pub(crate) async fn metered_round(
    target: &Target,
    prefix: &str,
    duration: Duration,
    servers: &[Server],
) -> Metered {
    let before = Snapshot::take(servers).await;
    let round = throughput_round(target, prefix, duration, true).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = Snapshot::take(servers).await;
    Metered {
        round,
        work: Work::between(&before, &after),
    }
}

/// Where the Redis-side counters of a keep-alive measurement come from.
pub(crate) enum Meter<'a> {
    /// INFO through the Redlock's own fred clients, one per node (single servers, local or
    /// from FREDLOCK_NODES).
    Clients,
    /// INFO from each local process directly (the cluster shards).
    Servers(&'a [Server]),
}

impl Meter<'_> {
    /// Commands per server (per node for `Clients`) so far.
    pub(crate) async fn commands(&self, redlock: &Redlock) -> Vec<u64> {
        match self {
            Meter::Clients => commands_per_node(redlock).await,
            Meter::Servers(servers) => {
                let mut out = Vec::new();
                for server in *servers {
                    out.push(server.calls().await.values().sum());
                }
                out
            }
        }
    }

    /// [`data_memory`] of all the servers together.
    pub(crate) async fn data_memory(&self, redlock: &Redlock) -> u64 {
        let mut total = 0;
        match self {
            Meter::Clients => {
                for i in 0..redlock.node_names().len() {
                    let text = node_info(redlock, i, "memory").await;
                    total += data_memory(&text);
                }
            }
            Meter::Servers(servers) => {
                for server in *servers {
                    total += server.data_memory().await;
                }
            }
        }
        total
    }
}
