//! A local Redis Cluster of N primaries (no replicas) that plays ONE Redlock node: shard
//! control (kill, pause, restart) and slot migrations held half-way, so that clients meet
//! `MOVED` and `ASK` redirects.
//!
//! The processes are [`LocalNodes`] in cluster mode; this file only forms the cluster and keeps
//! its slot table.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster_reply::{bulk_text, invalid_data, parse_cluster_slots, unexpected};
use crate::{resp::resp_pipeline, resp::RespValue, server::LocalNodes, server::Options};

/// Number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// `cluster-node-timeout`: how long a shard may be silent before its peers flag it as failing.
const NODE_TIMEOUT_MS: u64 = 1_000;
/// Upper bound for the cluster to agree on a healthy state (formation, a shard's rejoin).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for one command to a shard while polling its state (a paused shard never answers).
const POLL_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Upper bound for the administrative commands sent to running shards.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys moved per `MIGRATE` call.
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s own timeout (ms) for one batch.
const MIGRATE_TIMEOUT_MS: u64 = 5_000;

/// A slot being moved between two shards, held half-way until
/// [`finish_migration`](LocalCluster::finish_migration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The shard that owns the slot (`MIGRATING` there).
    pub from: usize,
    /// The shard that receives it (`IMPORTING` there).
    pub to: usize,
}

/// A local Redis Cluster of `shards` primaries on free loopback ports, to use as ONE Redlock node
/// (`redlock` nodes are independent; the shards of one node are not).
///
/// * Formed like `redis-cli --cluster create` without replicas: the 16384 slots are split into
///   `shards` contiguous ranges (shard `i` owns the `i`-th), the shards meet, and
///   [`start`](Self::start) returns once every shard reports `cluster_state:ok` and sees every
///   slot at its owner.
/// * Each shard runs with `cluster-node-timeout 1000` and `cluster-require-full-coverage no`: a
///   shard that is down makes only ITS slots fail; the others keep serving theirs (and answer
///   `MOVED` to the dead shard for its slots). That needs a majority of the primaries up: with 1
///   or 2 shards, a shard down leaves the rest in the minority, and after the node timeout they
///   refuse every key (`CLUSTERDOWN`). Use 3 or more shards to test a shard down.
/// * No persistence: [`restart_shard`](Self::restart_shard) brings a shard back EMPTY but with
///   its identity and its slots (its `nodes.conf` is kept), as a shard without persistence that
///   crashes and restarts. That is exactly the case that breaks a lock (keys gone within their
///   TTL).
/// * [`begin_migration`](Self::begin_migration) leaves a slot `MIGRATING` on its owner and
///   `IMPORTING` on another shard: the owner serves the slot's keys it still holds and answers
///   `-ASK slot host:port` for every other key of the slot (moved already, or absent), and the
///   target serves the slot only after `ASKING` (`MOVED` back to the owner otherwise).
///   [`migrate_keys`](Self::migrate_keys) moves keys part of the way;
///   [`finish_migration`](Self::finish_migration) moves the rest and hands the slot over, after
///   which the old owner answers `MOVED`.
///
/// Every process is killed and its directory removed when the value is dropped.
///
/// Methods taking a shard index return an `InvalidInput` error (or panic, for the infallible
/// accessors) when it is out of range.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use fredlock_testkit::LocalCluster;
///
/// let mut cluster = LocalCluster::start(3).await?;
/// let url = cluster.url(); // redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&node=127.0.0.1:P2
/// let key = cluster.key_on_shard(1, "fredlock:job-").await?; // a key whose slot shard 1 owns
/// cluster.kill_shard(1)?; // that key fails; keys of shards 0 and 2 still work
/// cluster.restart_shard(1).await?; // back, empty, with its slots
/// let slot = cluster.slot_of_key(&key).await?;
/// cluster.begin_migration(slot, 2).await?; // ASK redirects for the slot's absent keys
/// cluster.finish_migration(slot).await?; // shard 2 owns the slot
/// # let _ = url;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LocalCluster {
    nodes: LocalNodes,
    /// `CLUSTER MYID` of each shard; kept across restarts (their `nodes.conf` is kept).
    ids: Vec<String>,
    /// The owner of each slot, as configured by this value (`CLUSTER SETSLOT .. NODE`).
    owners: Vec<usize>,
    /// Slots held half-way between two shards.
    migrations: BTreeMap<u16, Migration>,
    /// Shards frozen by [`pause_shard`](Self::pause_shard) (to skip them when asking "any shard").
    paused: Vec<std::sync::atomic::AtomicBool>,
}

impl LocalCluster {
    /// Starts `shards` redis-server processes in cluster mode on free `127.0.0.1` ports, gives
    /// shard `i` the `i`-th of `shards` even, contiguous slot ranges, joins them into one cluster
    /// and waits (at most 30 s) until every shard reports `cluster_state:ok` and sees all 16384
    /// slots at their owners. `shards` must be 1 to 16384.
    pub async fn start(shards: usize) -> io::Result<LocalCluster> {
        Self::start_with(shards, false).await
    }

    /// As [`start`](Self::start), but every shard persists each write before answering
    /// (`--appendonly yes --appendfsync always`), so that [`restart_shard`](Self::restart_shard)
    /// and [`start_shard`](Self::start_shard) bring a shard back WITH every acknowledged write:
    /// the configuration fencing counters need (they never expire, so only durability protects
    /// them across a crash).
    pub async fn start_durable(shards: usize) -> io::Result<LocalCluster> {
        Self::start_with(shards, true).await
    }

    async fn start_with(shards: usize, durable: bool) -> io::Result<LocalCluster> {
        if shards == 0 || shards > usize::from(CLUSTER_SLOTS) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a cluster needs 1 to {CLUSTER_SLOTS} shards, not {shards}"),
            ));
        }
        let options = Options {
            cluster: true,
            extra_args: [
                "--cluster-node-timeout",
                &NODE_TIMEOUT_MS.to_string(),
                // A shard down fails only its own slots.
                "--cluster-require-full-coverage",
                "no",
            ]
            .map(String::from)
            .to_vec(),
            durable,
            server: None,
            unix_socket: false,
        };
        let nodes = LocalNodes::start_with(shards, options).await?;
        let mut ids = Vec::with_capacity(shards);
        for i in 0..shards {
            ids.push(bulk_text(
                "CLUSTER MYID",
                nodes.command(i, &["CLUSTER", "MYID"]).await?,
            )?);
        }
        // Shard `i` starts at round(i * 16384 / shards), as `redis-cli --cluster create` splits
        // (3 shards: 0-5460, 5461-10922, 10923-16383).
        let total = usize::from(CLUSTER_SLOTS);
        let first = |i: usize| (2 * i * total + shards) / (2 * shards);
        let owners: Vec<usize> = (0..shards)
            .flat_map(|i| std::iter::repeat_n(i, first(i + 1) - first(i)))
            .collect();
        let cluster = LocalCluster {
            nodes,
            ids,
            owners,
            migrations: BTreeMap::new(),
            paused: (0..shards).map(|_| Default::default()).collect(),
        };
        for i in 0..shards {
            // Distinct epochs from the start (as `redis-cli --cluster create` does), so the
            // shards need no epoch-collision rounds to agree.
            let epoch = (i + 1).to_string();
            cluster
                .admin(i, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch])
                .await?;
            for range in cluster.slot_ranges(i) {
                let (first, last) = (range.start().to_string(), range.end().to_string());
                cluster
                    .admin(i, &["CLUSTER", "ADDSLOTSRANGE", &first, &last])
                    .await?;
            }
        }
        for i in 1..shards {
            // The bus port is not port + 10000 here, so MEET names it.
            let port = cluster.nodes.port(i).to_string();
            let bus = cluster.bus_port(i).to_string();
            cluster
                .admin(0, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus])
                .await?;
        }
        cluster.wait_ok().await?;
        Ok(cluster)
    }

    /// Number of shards (running or not).
    pub fn shards(&self) -> usize {
        self.nodes.len()
    }

    /// `redis-cluster://127.0.0.1:P0?node=127.0.0.1:P1&node=...`: every shard as a seed, in the
    /// form fred's `Config::from_url` reads as a clustered config (and fredlock's builder accepts
    /// as one node).
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes.port(0));
        for i in 1..self.shards() {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", self.nodes.port(i)));
        }
        url
    }

    /// `redis://127.0.0.1:PORT` of each shard, in index order (to talk to one shard directly).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.urls()
    }

    /// The shard processes, for direct access to one shard: [`LocalNodes::command`],
    /// [`LocalNodes::get`], [`LocalNodes::keys`], [`LocalNodes::addr`], [`LocalNodes::pid`], ...
    /// (a shard answers `MOVED` for keys of slots it does not own).
    pub fn nodes(&self) -> &LocalNodes {
        &self.nodes
    }

    /// Socket address of shard `i`. Panics if `i >= shards()`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes.addr(i)
    }

    /// TCP port of shard `i` (the one in its `MOVED`/`ASK` redirects). Panics if `i >= shards()`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes.port(i)
    }

    /// Cluster-bus port of shard `i`. Panics if `i >= shards()`.
    pub fn bus_port(&self, i: usize) -> u16 {
        self.nodes
            .bus_port(i)
            .expect("LocalCluster's nodes run in cluster mode")
    }

    /// Cluster node id of shard `i` (`CLUSTER MYID`; kept across restarts). Panics if
    /// `i >= shards()`.
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The shard that owns `slot` (during a migration: the source, which still owns it). Panics
    /// if `slot >= 16384`.
    pub fn shard_of_slot(&self, slot: u16) -> usize {
        self.owners[usize::from(slot)]
    }

    /// The slots shard `i` owns, as ascending contiguous ranges (one range at start; more after
    /// migrations).
    pub fn slot_ranges(&self, i: usize) -> Vec<RangeInclusive<u16>> {
        let mut ranges: Vec<RangeInclusive<u16>> = Vec::new();
        for slot in (0..CLUSTER_SLOTS).filter(|&s| self.shard_of_slot(s) == i) {
            match ranges.last_mut() {
                Some(last) if *last.end() + 1 == slot => *last = *last.start()..=slot,
                _ => ranges.push(slot..=slot),
            }
        }
        ranges
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of the first shard that is running and
    /// not paused; hash tags `{...}` count as Redis counts them).
    pub async fn slot_of_key(&self, key: &str) -> io::Result<u16> {
        let i = self.any_live_shard()?;
        match self.admin_reply(i, &["CLUSTER", "KEYSLOT", key]).await? {
            RespValue::Integer(slot) => u16::try_from(slot)
                .ok()
                .filter(|&s| s < CLUSTER_SLOTS)
                .ok_or_else(|| invalid_data(format!("CLUSTER KEYSLOT answered {slot}"))),
            other => Err(unexpected("CLUSTER KEYSLOT", other)),
        }
    }

    /// The shard that owns `key`'s slot.
    pub async fn shard_of_key(&self, key: &str) -> io::Result<usize> {
        Ok(self.shard_of_slot(self.slot_of_key(key).await?))
    }

    /// The first of `{prefix}0`, `{prefix}1`, ... whose slot shard `i` owns: a key (or, without a
    /// key prefix such as fredlock's `fredlock:`, a resource name) that lands on that shard.
    pub async fn key_on_shard(&self, i: usize, prefix: &str) -> io::Result<String> {
        self.check(i)?;
        // Shard `i` owns about 1/shards() of the slots: this ends long before the bound.
        for n in 0..100_000u32 {
            let key = format!("{prefix}{n}");
            if self.shard_of_key(&key).await? == i {
                return Ok(key);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no key {prefix}N lands on shard {i} (does it own any slot?)"),
        ))
    }

    /// Kills shard `i` with SIGKILL and reaps it. The other shards flag it as failing after the
    /// node timeout (1 s) and keep serving their own slots (with 3 or more shards); its slots fail
    /// (connection refused there, `MOVED` to it elsewhere). Does nothing if it is already down.
    pub fn kill_shard(&mut self, i: usize) -> io::Result<()> {
        self.nodes.kill(i)?;
        self.paused[i].store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Freezes shard `i` with SIGSTOP: connections to it are accepted and never answered until
    /// [`resume_shard`](Self::resume_shard). Past the node timeout (1 s) its peers flag it as
    /// failing, as for a killed shard.
    pub fn pause_shard(&self, i: usize) -> io::Result<()> {
        self.nodes.pause(i)?;
        self.paused[i].store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Resumes shard `i` (SIGCONT) after [`pause_shard`](Self::pause_shard). Returns at once; if
    /// it was paused past the node timeout, [`wait_ok`](Self::wait_ok) waits until its peers
    /// serve it again.
    pub fn resume_shard(&self, i: usize) -> io::Result<()> {
        self.nodes.resume(i)?;
        self.paused[i].store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Kills shard `i` (if running) and starts it again on the same ports, EMPTY but with its
    /// cluster configuration (node id, peers, slots), then waits (at most 30 s) until the whole
    /// cluster is healthy again ([`wait_ok`](Self::wait_ok)). Every other shard must be running.
    /// A shard of a [`start_durable`](Self::start_durable) cluster comes back with its data.
    pub async fn restart_shard(&mut self, i: usize) -> io::Result<()> {
        self.kill_shard(i)?;
        self.nodes.start_node(i).await?;
        self.wait_ok().await
    }

    /// Starts shard `i` again after [`kill_shard`](Self::kill_shard) (empty, or with its data if
    /// durable; with its cluster configuration) and returns once it answers `PING`, WITHOUT
    /// waiting for the cluster to be healthy: to bring back several shards killed together,
    /// start each, then [`wait_ok`](Self::wait_ok). Does nothing if it is running.
    pub async fn start_shard(&mut self, i: usize) -> io::Result<()> {
        self.check(i)?;
        self.nodes.start_node(i).await
    }

    /// Sends one command about `key` (`args` is the whole command, `key` among them) to the shard
    /// that owns `key`'s slot in this value's table, over a fresh connection, and follows one
    /// redirect: `-ASK` (a migration in progress, the key not on the source: `ASKING` and the
    /// command on one connection to the target) or `-MOVED`. Any other reply, error replies
    /// included, is returned as it is. `timeout` bounds each round trip.
    pub async fn command_for_key(
        &self,
        key: &str,
        args: &[&str],
        timeout: Duration,
    ) -> io::Result<RespValue> {
        let shard = self.shard_of_key(key).await?;
        let reply = self.nodes.command_timeout(shard, args, timeout).await?;
        let RespValue::Error(e) = &reply else {
            return Ok(reply);
        };
        let mut parts = e.split_whitespace();
        let (kind, _slot, addr) = (parts.next(), parts.next(), parts.next());
        let Some(to) = addr
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, port)| port.parse::<u16>().ok())
            .and_then(|port| (0..self.shards()).find(|&s| self.port(s) == port))
        else {
            return Ok(reply);
        };
        match kind {
            Some("ASK") => {
                let mut replies =
                    resp_pipeline(self.addr(to), &[&["ASKING"], args], timeout).await?;
                replies
                    .pop()
                    .ok_or_else(|| invalid_data("no reply after ASKING".to_string()))
            }
            Some("MOVED") => self.nodes.command_timeout(to, args, timeout).await,
            _ => Ok(reply),
        }
    }

    /// Whether shard `i`'s process is alive (a paused shard counts as running).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.is_running(i)
    }

    /// Waits (at most 30 s) until every shard is reachable and reports `cluster_state:ok`,
    /// `cluster_slots_ok:16384` (no slot on a shard flagged as failing), knows every other shard,
    /// and maps every slot to the owner this value configured. Fails with `TimedOut` and each
    /// shard's last state otherwise (a killed or paused shard never gets there).
    pub async fn wait_ok(&self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let problems = self.problems().await;
            if problems.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "cluster not healthy within {READY_TIMEOUT:?}:\n{}",
                        problems.join("\n")
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One look at every shard: `Ok` when [`wait_ok`](Self::wait_ok) would return at once, an
    /// error naming each shard's problem otherwise. For a caller that waits in its own way (for
    /// example without holding a lock on this value between two looks).
    pub async fn check_ok(&self) -> io::Result<()> {
        let problems = self.problems().await;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "cluster not healthy:\n{}",
                problems.join("\n")
            )))
        }
    }

    /// What keeps each shard from [`shard_ok`](Self::shard_ok), one line a shard.
    async fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for i in 0..self.shards() {
            if let Err(problem) = self.shard_ok(i).await {
                problems.push(format!("shard {i} (port {}): {problem}", self.port(i)));
            }
        }
        problems
    }

    /// Starts moving `slot` from its owner to shard `to`, and stops half-way: `IMPORTING` on
    /// `to`, then `MIGRATING` on the owner (the order `redis-cli --cluster reshard` uses). Until
    /// [`finish_migration`](Self::finish_migration), the owner answers `-ASK slot
    /// 127.0.0.1:port(to)` for keys of the slot it does not hold. Returns the migration.
    pub async fn begin_migration(&mut self, slot: u16, to: usize) -> io::Result<Migration> {
        self.check(to)?;
        check_slot(slot)?;
        if let Some(m) = self.migrations.get(&slot) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "slot {slot} is already migrating from shard {} to {}",
                    m.from, m.to
                ),
            ));
        }
        let from = self.shard_of_slot(slot);
        if from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is already on shard {to}"),
            ));
        }
        let slot_arg = slot.to_string();
        self.admin(
            to,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_arg,
                "IMPORTING",
                &self.ids[from],
            ],
        )
        .await?;
        self.admin(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.ids[to]],
        )
        .await?;
        let migration = Migration { from, to };
        self.migrations.insert(slot, migration);
        Ok(migration)
    }

    /// The migration in progress for `slot`, if any.
    pub fn migration(&self, slot: u16) -> Option<Migration> {
        self.migrations.get(&slot).copied()
    }

    /// Moves at most `max` of `slot`'s keys from the source to the target of its migration
    /// (`CLUSTER GETKEYSINSLOT` + `MIGRATE ... KEYS`, TTLs kept); returns how many moved. A moved
    /// key is then answered with `ASK` on the source.
    pub async fn migrate_keys(&self, slot: u16, max: usize) -> io::Result<usize> {
        let m = self.migration(slot).ok_or_else(|| not_migrating(slot))?;
        let mut moved = 0;
        while moved < max {
            let batch = (max - moved).min(MIGRATE_BATCH);
            let keys = self.keys_in_slot(m.from, slot, batch).await?;
            if keys.is_empty() {
                break;
            }
            let port = self.port(m.to).to_string();
            let timeout = MIGRATE_TIMEOUT_MS.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", &timeout, "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            match self.admin_reply(m.from, &args).await? {
                RespValue::Simple(s) if s == "OK" => moved += keys.len(),
                // Every key listed expired before it could move: nothing left to move.
                RespValue::Simple(s) if s == "NOKEY" => {}
                other => return Err(unexpected("MIGRATE", other)),
            }
        }
        Ok(moved)
    }

    /// Moves every key left in `slot` to the target and hands the slot over (`CLUSTER SETSLOT
    /// slot NODE target` on the target, the source, then every other shard), then waits until
    /// the cluster is healthy ([`wait_ok`](Self::wait_ok)). The old owner then answers `MOVED`.
    pub async fn finish_migration(&mut self, slot: u16) -> io::Result<()> {
        let m = self.migration(slot).ok_or_else(|| not_migrating(slot))?;
        // New keys of a migrating slot go to the target (ASK), so the source only shrinks.
        while self.migrate_keys(slot, usize::MAX).await? > 0 {}
        let slot_arg = slot.to_string();
        let target = self.ids[m.to].clone();
        let order = [m.to, m.from]
            .into_iter()
            .chain((0..self.shards()).filter(|&i| i != m.to && i != m.from));
        for i in order {
            self.admin(i, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target])
                .await?;
        }
        self.owners[usize::from(slot)] = m.to;
        self.migrations.remove(&slot);
        self.wait_ok().await
    }

    /// `CLUSTER GETKEYSINSLOT slot count` on shard `i`.
    async fn keys_in_slot(&self, i: usize, slot: u16, count: usize) -> io::Result<Vec<String>> {
        let (slot, count) = (slot.to_string(), count.to_string());
        match self
            .admin_reply(i, &["CLUSTER", "GETKEYSINSLOT", &slot, &count])
            .await?
        {
            RespValue::Array(Some(items)) => items
                .into_iter()
                .map(|item| bulk_text("CLUSTER GETKEYSINSLOT", item))
                .collect(),
            other => Err(unexpected("CLUSTER GETKEYSINSLOT", other)),
        }
    }

    /// Whether shard `i` is healthy and agrees with this value's slot table; the reason if not.
    async fn shard_ok(&self, i: usize) -> Result<(), String> {
        let command = |args: &'static [&'static str]| {
            self.nodes.command_timeout(i, args, POLL_COMMAND_TIMEOUT)
        };
        let info = match command(&["CLUSTER", "INFO"]).await {
            Ok(RespValue::Bulk(Some(info))) => String::from_utf8_lossy(&info).into_owned(),
            Ok(other) => return Err(format!("CLUSTER INFO answered {other:?}")),
            Err(e) => return Err(e.to_string()),
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or("?")
                .to_owned()
        };
        let state = field("cluster_state");
        let slots_ok = field("cluster_slots_ok");
        let known = field("cluster_known_nodes");
        if state != "ok"
            || slots_ok != CLUSTER_SLOTS.to_string()
            || known != self.shards().to_string()
        {
            return Err(format!(
                "cluster_state:{state} cluster_slots_ok:{slots_ok} cluster_known_nodes:{known}"
            ));
        }
        let slots = match command(&["CLUSTER", "SLOTS"]).await {
            Ok(reply) => parse_cluster_slots(&reply)?,
            Err(e) => return Err(e.to_string()),
        };
        let mut seen = vec![None; usize::from(CLUSTER_SLOTS)];
        for (range, port) in slots {
            for slot in range {
                seen[usize::from(slot)] = Some(port);
            }
        }
        for (slot, &owner) in self.owners.iter().enumerate() {
            if seen[slot] != Some(self.port(owner)) {
                return Err(format!(
                    "sees slot {slot} at port {:?}, expected shard {owner} (port {})",
                    seen[slot],
                    self.port(owner)
                ));
            }
        }
        Ok(())
    }

    /// The first shard that is running and not paused.
    fn any_live_shard(&self) -> io::Result<usize> {
        (0..self.shards())
            .find(|&i| {
                self.is_running(i) && !self.paused[i].load(std::sync::atomic::Ordering::Relaxed)
            })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    "no shard is running and unpaused",
                )
            })
    }

    fn check(&self, i: usize) -> io::Result<()> {
        if i < self.shards() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shard index {i} out of range (have {})", self.shards()),
            ))
        }
    }

    /// An administrative command on shard `i` that must answer `+OK`.
    async fn admin(&self, i: usize, args: &[&str]) -> io::Result<()> {
        match self.admin_reply(i, args).await? {
            RespValue::Simple(s) if s == "OK" => Ok(()),
            other => Err(unexpected(&args.join(" "), other)),
        }
    }

    async fn admin_reply(&self, i: usize, args: &[&str]) -> io::Result<RespValue> {
        self.nodes.command_timeout(i, args, ADMIN_TIMEOUT).await
    }
}

fn check_slot(slot: u16) -> io::Result<()> {
    if slot < CLUSTER_SLOTS {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("slot {slot} out of range (0 to {})", CLUSTER_SLOTS - 1),
        ))
    }
}

fn not_migrating(slot: u16) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("slot {slot} is not migrating (call begin_migration first)"),
    )
}
