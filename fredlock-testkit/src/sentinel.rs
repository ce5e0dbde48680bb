//! [`LocalSentinel`]: one Sentinel-managed group (a primary, its replicas and the sentinels that
//! watch them) to use as ONE Redlock node, with failover on demand. The data processes are
//! [`LocalNodes`]; this file starts the sentinels (their own command line: sentinel mode needs a
//! writable configuration file) and reads the group's state from them.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::flavour::Server;
use crate::process::{kill_and_reap, lock, log_len, pick_free_ports, read_log_tail, wait_ready};
use crate::process::{Node, START_TIMEOUT};
use crate::resp::{expect_ok, resp_command, resp_pipeline, unexpected, RespValue};
use crate::server::{data_root, LocalNodes, Options};

/// The service name the sentinels monitor the group under (`sentinelServiceName` in the URL).
pub const SENTINEL_SERVICE: &str = "fredlock";
/// The key [`LocalSentinel::wait_synced`] writes on the primary to see its replicas acknowledge.
pub const SYNC_KEY: &str = "fredlock-testkit:synced";
/// `down-after-milliseconds`: how long the primary may be silent before a sentinel flags it down.
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1_000);
/// `failover-timeout` (ms): also the pause before the sentinels retry a failed failover.
const FAILOVER_TIMEOUT_MS: u64 = 4_000;
/// Upper bound for the group to settle (start, a failover, a node's return).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for one command while polling (a paused process never answers).
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two looks at the group's state.
const POLL_PAUSE: Duration = Duration::from_millis(50);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A local Sentinel-managed group on free `127.0.0.1` ports: data node 0 starts as the primary,
/// nodes `1..=replicas` replicate it, and `sentinels` sentinels monitor it under the name
/// [`SENTINEL_SERVICE`], with a quorum of a majority of them. Use it as ONE Redlock node through
/// [`url`](Self::url) (fred asks a sentinel for the primary, and asks again after every
/// reconnect).
///
/// * The sentinels flag a silent primary down after [`SENTINEL_DOWN_AFTER`], then promote the
///   replica with the most data. [`kill_primary`](Self::kill_primary) and
///   [`pause_primary`](Self::pause_primary) make that happen;
///   [`failover`](Self::failover) asks for it (`SENTINEL FAILOVER`: the old primary stays up and
///   is made a replica, and the sentinels close its clients' connections so that they look for
///   the new one).
/// * Data nodes run without persistence: a killed node started again
///   ([`start_node`](Self::start_node)) comes back EMPTY as a primary of its own, and the
///   sentinels turn it into a replica of the current primary.
/// * Replication is asynchronous: a write acknowledged by the primary may be lost by a failover
///   unless `WAIT` confirmed it on a replica.
///
/// Every process is killed and its directory removed when the value is dropped.
#[derive(Debug)]
pub struct LocalSentinel {
    data: LocalNodes,
    sentinels: Vec<Node>,
    bin: OsString,
    server: Server,
    root: PathBuf,
    quorum: usize,
}

impl LocalSentinel {
    /// Starts a group on the server `FREDLOCK_SERVER` names: a primary, `replicas` replicas
    /// (all in sync when this returns) and `sentinels` sentinels (1 or more), and waits until
    /// every sentinel sees the primary, every replica and every other sentinel (at most 30 s).
    pub async fn start(replicas: usize, sentinels: usize) -> io::Result<LocalSentinel> {
        Self::start_with(None, replicas, sentinels).await
    }

    /// As [`start`](Self::start), on the given server.
    pub async fn start_on(
        server: Server,
        replicas: usize,
        sentinels: usize,
    ) -> io::Result<LocalSentinel> {
        Self::start_with(Some(server), replicas, sentinels).await
    }

    async fn start_with(
        server: Option<Server>,
        replicas: usize,
        sentinels: usize,
    ) -> io::Result<LocalSentinel> {
        if sentinels == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Sentinel group needs at least one sentinel",
            ));
        }
        let options = Options {
            // A full sync starts at once (Redis waits 5 s for more replicas by default).
            extra_args: ["--repl-diskless-sync-delay", "0"]
                .map(String::from)
                .to_vec(),
            server,
            ..Options::default()
        };
        let data = LocalNodes::start_with(1 + replicas, options).await?;
        let server = data.server();
        let root = data_root(false).join(format!(
            "fredlock-sentinel-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        let mut group = LocalSentinel {
            data,
            sentinels: Vec::with_capacity(sentinels),
            bin: server.binary(),
            server,
            root,
            quorum: sentinels / 2 + 1,
        };
        let primary = group.data.port(0).to_string();
        for i in 1..=replicas {
            let reply = group
                .data
                .command(i, &["REPLICAOF", "127.0.0.1", &primary])
                .await?;
            expect_ok("REPLICAOF", reply)?;
        }
        // Replicas in sync before the sentinels start: a sentinel reads the primary's replicas
        // at once when it connects, and then only every 10 s.
        group.wait_synced(0, replicas).await?;
        for (i, port) in pick_free_ports(sentinels)?.into_iter().enumerate() {
            group.sentinels.push(Node {
                port,
                bus_port: None,
                dir: group.root.join(format!("sentinel{i}")),
                log: group.root.join(format!("sentinel{i}.log")),
                child: Mutex::new(None),
            });
            group.launch_sentinel(i).await?;
        }
        if let Some(other) = group.wait_settled(0, None).await? {
            return Err(io::Error::other(format!(
                "the sentinels promoted data node {other} before the group started"
            )));
        }
        // And streaming still, now that the sentinels watch: the group is ready for `WAIT`.
        group.wait_synced(0, replicas).await?;
        Ok(group)
    }

    /// `redis-sentinel://127.0.0.1:S0/0?sentinelServiceName=fredlock&node=127.0.0.1:S1&...`:
    /// every sentinel, in the form fred's `Config::from_url` reads (and fredlock's builder
    /// accepts as one node).
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}/0?sentinelServiceName={SENTINEL_SERVICE}",
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The data nodes (node 0 was the first primary): their addresses, commands, signals.
    pub fn data(&self) -> &LocalNodes {
        &self.data
    }

    /// The server the group runs.
    pub fn server(&self) -> Server {
        self.server
    }

    /// The address of sentinel `i`. Panics if `i` is out of range.
    pub fn sentinel_addr(&self, i: usize) -> SocketAddr {
        loopback(self.sentinels[i].port)
    }

    /// The data node the sentinels name as the primary now (the first sentinel that answers).
    pub async fn primary(&self) -> io::Result<usize> {
        let mut last = None;
        for s in &self.sentinels {
            match self.primary_as_seen_by(s.port).await {
                Ok(i) => return Ok(i),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no sentinel")))
    }

    /// Asks for a failover (`SENTINEL FAILOVER`: no agreement needed, the primary stays up and
    /// becomes a replica) and waits until the group has settled on the new primary, whose
    /// index it returns. Needs at least one replica in sync.
    pub async fn failover(&self) -> io::Result<usize> {
        let old = self.primary().await?;
        let reply = resp_command(
            self.sentinel_addr(0),
            &["SENTINEL", "FAILOVER", SENTINEL_SERVICE],
            POLL_TIMEOUT,
        )
        .await?;
        expect_ok("SENTINEL FAILOVER", reply)?;
        self.wait_new_primary(old).await
    }

    /// SIGKILLs the primary and returns its index; the sentinels promote a replica after
    /// [`SENTINEL_DOWN_AFTER`] ([`wait_new_primary`](Self::wait_new_primary) waits for it).
    pub async fn kill_primary(&mut self) -> io::Result<usize> {
        let old = self.primary().await?;
        self.data.kill(old)?;
        Ok(old)
    }

    /// SIGSTOPs the primary and returns its index: its connections stay open and unanswered.
    /// Past [`SENTINEL_DOWN_AFTER`] the sentinels promote a replica; once resumed
    /// ([`resume`](Self::resume)) the old primary is told to replicate the new one.
    pub async fn pause_primary(&self) -> io::Result<usize> {
        let old = self.primary().await?;
        self.data.pause(old)?;
        Ok(old)
    }

    /// SIGCONTs data node `i`.
    pub fn resume(&self, i: usize) -> io::Result<()> {
        self.data.resume(i)
    }

    /// Starts data node `i` again after [`kill_primary`](Self::kill_primary) (empty, on its
    /// port) and waits until the sentinels have made it a replica in sync with the primary
    /// ([`wait_rejoined`](Self::wait_rejoined)).
    pub async fn start_node(&mut self, i: usize) -> io::Result<()> {
        self.data.start_node(i).await?;
        self.wait_rejoined(i).await
    }

    /// Waits (at most 30 s) until data node `i` (a primary back after a failover: started
    /// again, or resumed) replicates the current primary with its link up and every replica
    /// has acknowledged the primary's writes.
    pub async fn wait_rejoined(&self, i: usize) -> io::Result<()> {
        let primary = self.primary().await?;
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            if self.replica_of(i, primary).await? {
                let replicas = (0..self.data.len())
                    .filter(|&r| r != primary && self.data.is_running(r))
                    .count();
                return self.wait_synced(primary, replicas).await;
            }
            if Instant::now() >= deadline {
                return Err(timed_out(format!(
                    "data node {i} was not made a replica of node {primary} within \
                     {SETTLE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// Holds replication back on the primary's replica `replica`: freezes it (SIGSTOP) and
    /// closes the primary's replication links, so that nothing written from now on reaches it
    /// (a frozen process's socket would still receive, and apply on resume, what the primary
    /// sends). Undo with [`resume`](Self::resume); the replica then resynchronises, unless its
    /// primary is gone by then.
    pub async fn hold_replication(&self, replica: usize) -> io::Result<()> {
        let primary = self.primary().await?;
        self.data.pause(replica)?;
        match self
            .data
            .command(primary, &["CLIENT", "KILL", "TYPE", "replica"])
            .await?
        {
            RespValue::Integer(_) => Ok(()),
            other => Err(unexpected("CLIENT KILL TYPE replica", other)),
        }
    }

    /// Waits (at most 30 s) until every sentinel names a primary other than data node `old`,
    /// that node says it is a primary, and every sentinel has seen it as one; returns its index.
    pub async fn wait_new_primary(&self, old: usize) -> io::Result<usize> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let mut seen = Vec::with_capacity(self.sentinels.len());
            for s in &self.sentinels {
                seen.push(self.primary_as_seen_by(s.port).await.ok());
            }
            if let Some(Some(new)) = seen.first().copied() {
                if new != old
                    && seen.iter().all(|s| *s == Some(new))
                    && self.role(new).await.as_deref() == Some("master")
                {
                    // A failover that did not finish in time (the sentinels' failover timeout,
                    // on a loaded machine) is retried with another replica: follow it.
                    if self.wait_settled(new, Some(old)).await?.is_none() {
                        return Ok(new);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(timed_out(format!(
                    "no new primary (the old: data node {old}) within {SETTLE_TIMEOUT:?}; \
                     the sentinels name {seen:?}"
                )));
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// Waits until data node `primary` has `replicas` replicas that acknowledged every write
    /// it took so far: it writes the key [`SYNC_KEY`] and asks `WAIT` on the same connection,
    /// until enough replicas confirm. (Comparing offsets is not enough: right after a full
    /// sync a replica is listed online at offset 0 while the primary has not started its
    /// command stream yet, so a `WAIT` then gets no acknowledgement for up to a second.)
    pub async fn wait_synced(&self, primary: usize, replicas: usize) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let want = replicas.to_string();
        loop {
            let commands: [&[&str]; 2] = [&["SET", SYNC_KEY, "1"], &["WAIT", &want, "100"]];
            let replies = resp_pipeline(self.data.addr(primary), &commands, POLL_TIMEOUT).await;
            let acked = match &replies {
                Ok(r) => match r.get(1) {
                    Some(RespValue::Integer(n)) => usize::try_from(*n).unwrap_or(0),
                    _ => 0,
                },
                Err(_) => 0,
            };
            if acked >= replicas {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(timed_out(format!(
                    "data node {primary}: {acked} of {replicas} replicas acknowledged its writes \
                     within {SETTLE_TIMEOUT:?} (last: {replies:?})"
                )));
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// Until every sentinel names data node `primary`, sees as many other sentinels as there
    /// are, and has read the group's running replicas (but `skip`, the old primary after a
    /// failover, frozen, dead or being turned into a replica) lately with their links up.
    /// `Some(other)`: every sentinel names `other` instead (not `skip`), and it says it is a
    /// primary: the sentinels failed over again meanwhile.
    async fn wait_settled(&self, primary: usize, skip: Option<usize>) -> io::Result<Option<usize>> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let replicas = (0..self.data.len())
            .filter(|&i| i != primary && Some(i) != skip && self.data.is_running(i))
            .count();
        loop {
            let mut problem = None;
            for (i, s) in self.sentinels.iter().enumerate() {
                if let Err(e) = self.sentinel_settled(s.port, primary, replicas).await {
                    problem = Some(format!("sentinel {i}: {e}"));
                    break;
                }
            }
            let Some(problem) = problem else {
                return Ok(None);
            };
            if let Some(other) = self.moved_from(primary, skip).await {
                return Ok(Some(other));
            }
            if Instant::now() >= deadline {
                return Err(timed_out(format!(
                    "the group did not settle within {SETTLE_TIMEOUT:?}: {problem}"
                )));
            }
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    /// The primary every sentinel names, when it is neither `primary` nor `skip` and says it is
    /// a primary.
    async fn moved_from(&self, primary: usize, skip: Option<usize>) -> Option<usize> {
        let mut named = None;
        for s in &self.sentinels {
            let seen = self.primary_as_seen_by(s.port).await.ok()?;
            if named.is_some_and(|n| n != seen) {
                return None;
            }
            named = Some(seen);
        }
        let other = named.filter(|&n| n != primary && Some(n) != skip)?;
        (self.role(other).await.as_deref() == Some("master")).then_some(other)
    }

    async fn sentinel_settled(&self, port: u16, primary: usize, replicas: usize) -> io::Result<()> {
        if self.primary_as_seen_by(port).await? != primary {
            return Err(io::Error::other("names another primary"));
        }
        let reply = resp_command(
            loopback(port),
            &["SENTINEL", "MASTER", SENTINEL_SERVICE],
            POLL_TIMEOUT,
        )
        .await?;
        let fields = pairs(reply)?;
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let flags = get("flags").cloned().unwrap_or_default();
        let slaves = get("num-slaves").and_then(|v| v.parse::<usize>().ok());
        let others = get("num-other-sentinels").and_then(|v| v.parse::<usize>().ok());
        if flags != "master" || slaves < Some(replicas) || others != Some(self.sentinels.len() - 1)
        {
            return Err(io::Error::other(format!(
                "flags {flags}, replicas {slaves:?} (want {replicas}), other sentinels {others:?}"
            )));
        }
        // A failover promotes only a replica the sentinel read lately (`INFO`, every 10 s
        // before a failover) with its link up: until then `SENTINEL FAILOVER` says NOGOODSLAVE.
        let reply = resp_command(
            loopback(port),
            &["SENTINEL", "REPLICAS", SENTINEL_SERVICE],
            POLL_TIMEOUT,
        )
        .await?;
        let RespValue::Array(Some(listed)) = reply else {
            return Err(unexpected("SENTINEL REPLICAS", reply));
        };
        let mut good = 0;
        for replica in listed {
            let fields = pairs(replica)?;
            let get = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let fresh = get("info-refresh").and_then(|v| v.parse::<u64>().ok()) < Some(5_000);
            if get("flags") == Some("slave") && get("master-link-status") == Some("ok") && fresh {
                good += 1;
            }
        }
        if good < replicas {
            return Err(io::Error::other(format!(
                "{good} of {replicas} replicas ready to be promoted"
            )));
        }
        Ok(())
    }

    async fn primary_as_seen_by(&self, port: u16) -> io::Result<usize> {
        let reply = resp_command(
            loopback(port),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE],
            POLL_TIMEOUT,
        )
        .await?;
        let addr = match &reply {
            RespValue::Array(Some(parts)) if parts.len() == 2 => match (&parts[0], &parts[1]) {
                (RespValue::Bulk(Some(_)), RespValue::Bulk(Some(p))) => {
                    String::from_utf8_lossy(p).parse::<u16>().ok()
                }
                _ => None,
            },
            _ => None,
        };
        let port = addr.ok_or_else(|| unexpected("SENTINEL GET-MASTER-ADDR-BY-NAME", reply))?;
        (0..self.data.len())
            .find(|&i| self.data.port(i) == port)
            .ok_or_else(|| io::Error::other(format!("the primary {port} is not a data node")))
    }

    /// `ROLE`'s first element on data node `i` (`master` or `slave`), `None` if it does not
    /// answer.
    async fn role(&self, i: usize) -> Option<String> {
        match self.data.command_timeout(i, &["ROLE"], POLL_TIMEOUT).await {
            Ok(RespValue::Array(Some(parts))) => match parts.first() {
                Some(RespValue::Bulk(Some(b))) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether data node `i` replicates data node `primary` with its link up.
    async fn replica_of(&self, i: usize, primary: usize) -> io::Result<bool> {
        let info = self.info(i, "replication").await.unwrap_or_default();
        let port = self.data.port(primary).to_string();
        Ok(field(&info, "role") == Some("slave")
            && field(&info, "master_port") == Some(port.as_str())
            && field(&info, "master_link_status") == Some("up"))
    }

    async fn info(&self, i: usize, section: &str) -> io::Result<String> {
        match self
            .data
            .command_timeout(i, &["INFO", section], POLL_TIMEOUT)
            .await?
        {
            RespValue::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(unexpected("INFO", other)),
        }
    }

    async fn launch_sentinel(&mut self, i: usize) -> io::Result<()> {
        let node = &self.sentinels[i];
        fs::create_dir_all(&node.dir)?;
        let config = node.dir.join("sentinel.conf");
        let name = SENTINEL_SERVICE;
        fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nloglevel warning\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {name} 1\n",
                port = node.port,
                dir = node.dir.display(),
                primary = self.data.port(0),
                quorum = self.quorum,
                down = SENTINEL_DOWN_AFTER.as_millis(),
            ),
        )?;
        let log_start = log_len(&node.log);
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let mut child = Command::new(&self.bin)
            .arg(&config)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| spawn_error(&self.bin, self.server, e))?;
        match wait_ready(&mut child, node.port, Instant::now() + START_TIMEOUT).await {
            Ok(()) => {
                *lock(&node.child) = Some(child);
                Ok(())
            }
            Err(failure) => {
                let _ = kill_and_reap(&mut child);
                let tail = read_log_tail(&node.log, log_start);
                Err(failure.into_error(node.port, &tail))
            }
        }
    }
}

impl Drop for LocalSentinel {
    fn drop(&mut self) {
        for s in &self.sentinels {
            let _ = s.kill();
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn spawn_error(bin: &OsString, server: Server, e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound {
        return io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{server} server binary {bin:?} not found: {}",
                server.install_hint()
            ),
        );
    }
    io::Error::new(e.kind(), format!("failed to spawn {bin:?}: {e}"))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

fn timed_out(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, message)
}

/// `name:value` in an `INFO` reply.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// A flat `[name, value, name, value, ...]` reply as pairs.
fn pairs(reply: RespValue) -> io::Result<Vec<(String, String)>> {
    let RespValue::Array(Some(items)) = reply else {
        return Err(unexpected("SENTINEL MASTER", reply));
    };
    let text = |v: &RespValue| match v {
        RespValue::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    Ok(items
        .chunks(2)
        .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
        .collect())
}
