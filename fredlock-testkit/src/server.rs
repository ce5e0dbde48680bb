//! [`LocalNodes`]: the list of local `redis-server` nodes of a test and their control (start,
//! kill / pause / resume, restart on the same port, a few commands). Owns the nodes as a set and
//! when one (re)starts; one process's command line, signals and readiness are `process`'s job,
//! the wire format `resp`'s.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::flavour::Server;
pub(crate) use crate::process::Options;
use crate::process::{
    kill_and_reap, lock, log_len, pick_free_ports, read_log_tail, remove_all_but, spawn_server,
    wait_ready, Node, StartFailure, CLUSTER_CONFIG_FILE, START_TIMEOUT,
};
pub(crate) use crate::resp::unexpected;
use crate::resp::{expect_ok, invalid, resp_command, RespValue};

/// Default upper bound for one [`LocalNodes::command`] round trip.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports [`LocalNodes::start`] tries per node before giving up.
const PORT_ATTEMPTS: usize = 10;

/// Distinguishes the temp dirs of several `LocalNodes` in the same process.
static INSTANCE_SEQ: AtomicU64 = AtomicU64::new(0);

/// N independent `redis-server` processes on free loopback ports, for tests.
///
/// Each node runs without persistence (`--save "" --appendonly no`) in its own
/// temporary directory, so a restarted node always comes back empty. Every
/// process is SIGKILLed and reaped when the value is dropped, and the
/// temporary directories are removed.
///
/// Methods taking a node index `i` return an `InvalidInput` error (or panic,
/// for the infallible accessors) when `i >= len()`.
#[derive(Debug)]
pub struct LocalNodes {
    bin: OsString,
    server: Server,
    /// Root temp dir holding every node's data dir and log.
    root: PathBuf,
    nodes: Vec<Node>,
    options: Options,
}
impl LocalNodes {
    /// Starts `n` redis-server processes on free `127.0.0.1` ports and waits
    /// (at most 10 s per node) until each answers `PING`.
    ///
    /// The binary is `redis-server` from `PATH`, or the path in the
    /// `FREDLOCK_REDIS_SERVER` environment variable.
    pub async fn start(n: usize) -> io::Result<LocalNodes> {
        Self::start_with(n, Options::default()).await
    }

    /// As [`start`](Self::start), but every node persists each write before answering
    /// (`--appendonly yes --appendfsync always`), and [`restart`](Self::restart),
    /// [`start_node`](Self::start_node) bring a killed node back WITH its data: the
    /// configuration fencing counters need (they never expire, so only durability protects
    /// them across a crash). Their files live in RAM when the machine has `/dev/shm` (set
    /// `FREDLOCK_TESTKIT_DIR` to choose).
    pub async fn start_durable(n: usize) -> io::Result<LocalNodes> {
        let options = Options {
            durable: true,
            ..Options::default()
        };
        Self::start_with(n, options).await
    }

    /// As [`start`](Self::start), on the server named rather than the one `FREDLOCK_SERVER`
    /// names: for tests of one server's own features.
    pub async fn start_on(server: Server, n: usize) -> io::Result<LocalNodes> {
        let options = Options {
            server: Some(server),
            ..Options::default()
        };
        Self::start_with(n, options).await
    }

    /// As [`start_durable`](Self::start_durable), on the server named.
    pub async fn start_durable_on(server: Server, n: usize) -> io::Result<LocalNodes> {
        let options = Options {
            durable: true,
            server: Some(server),
            ..Options::default()
        };
        Self::start_with(n, options).await
    }

    /// As [`start`](Self::start), and every node also listens on a Unix domain socket (see
    /// [`unix_url`](Self::unix_url)).
    pub async fn start_with_unix_sockets(n: usize) -> io::Result<LocalNodes> {
        let options = Options {
            unix_socket: true,
            ..Options::default()
        };
        Self::start_with(n, options).await
    }

    /// `redis+unix:///PATH` URL of node `i`'s Unix socket (nodes started by
    /// [`start_with_unix_sockets`](Self::start_with_unix_sockets)). Panics if `i >= len()`.
    pub fn unix_url(&self, i: usize) -> String {
        format!("redis+unix://{}", self.nodes[i].socket().display())
    }

    /// The server these nodes run.
    pub fn server(&self) -> Server {
        self.server
    }

    pub(crate) async fn start_with(n: usize, options: Options) -> io::Result<LocalNodes> {
        let server = match options.server {
            Some(server) => server,
            None => Server::from_env()?,
        };
        let bin = server.binary();
        let root = data_root(options.durable).join(format!(
            "fredlock-testkit-{}-{}",
            std::process::id(),
            INSTANCE_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        // A leftover from an earlier process with the same pid is just stale.
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        // From here on, `Drop` cleans up the dir and any started process,
        // including when a later node fails to start.
        let mut nodes = LocalNodes {
            bin,
            server,
            root,
            nodes: Vec::with_capacity(n),
            options,
        };
        // In cluster mode, a second port per node for the cluster bus: the default (port +
        // 10000) is past 65535 for most ephemeral ports.
        let mut ports = pick_free_ports(if nodes.options.cluster { 2 * n } else { n })?;
        let bus_ports = ports.split_off(n);
        for (i, port) in ports.into_iter().enumerate() {
            let node = Node {
                port,
                bus_port: bus_ports.get(i).copied(),
                dir: nodes.root.join(format!("node{i}")),
                log: nodes.root.join(format!("node{i}.log")),
                child: Mutex::new(None),
            };
            nodes.nodes.push(node);
            nodes.launch(i, true).await?;
        }
        Ok(nodes)
    }

    /// `redis://127.0.0.1:PORT` URLs of all nodes, in index order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// `redis://127.0.0.1:PORT` URL of node `i`. Panics if `i >= len()`.
    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.port(i))
    }

    /// TCP port of node `i`. Panics if `i >= len()`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// Cluster-bus port of node `i` in cluster mode. Panics if `i >= len()`.
    pub(crate) fn bus_port(&self, i: usize) -> Option<u16> {
        self.nodes[i].bus_port
    }

    /// Socket address of node `i` (e.g. the upstream of a
    /// [`FaultProxy`](super::FaultProxy)). Panics if `i >= len()`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port(i)))
    }

    /// Number of nodes (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `true` when there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether node `i`'s process is alive. A paused (SIGSTOPped) node counts
    /// as running. Returns `false` for an out-of-range index.
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(Node::is_running)
    }

    /// Process id of node `i`, if it is running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        let node = self.nodes.get(i)?;
        let mut guard = lock(&node.child);
        let child = guard.as_mut()?;
        match child.try_wait() {
            Ok(None) => Some(child.id()),
            _ => None,
        }
    }

    /// Kills node `i` with SIGKILL (no shutdown, no save) and reaps it, so its
    /// port is free and connections see "connection refused". Does nothing
    /// if the node is already down.
    pub fn kill(&mut self, i: usize) -> io::Result<()> {
        self.node(i)?.kill()
    }

    /// Freezes node `i` with SIGSTOP: its sockets stay open and the kernel
    /// still accepts connections, but nothing is answered until
    /// [`resume`](Self::resume). Models a stalled process (GC pause, VM freeze).
    pub fn pause(&self, i: usize) -> io::Result<()> {
        self.node(i)?.signal(libc::SIGSTOP)
    }

    /// Resumes a node frozen by [`pause`](Self::pause) with SIGCONT.
    pub fn resume(&self, i: usize) -> io::Result<()> {
        self.node(i)?.signal(libc::SIGCONT)
    }

    /// Kills node `i` (if running) and starts a fresh, EMPTY redis-server on
    /// the same port, waiting until it answers `PING`. Models a crash and
    /// restart of a node without persistence (of a durable node, from
    /// [`start_durable`](Self::start_durable): back with every acknowledged write).
    pub async fn restart(&mut self, i: usize) -> io::Result<()> {
        self.kill(i)?;
        self.launch(i, false).await
    }

    /// Starts node `i` again on its original port after [`kill`](Self::kill).
    /// Does nothing if it is already running. The node comes back empty (durable nodes: with
    /// their data).
    pub async fn start_node(&mut self, i: usize) -> io::Result<()> {
        if self.is_running(i) {
            return Ok(());
        }
        // Reap a process that died on its own, so `launch` starts from a clean slot.
        self.kill(i)?;
        self.launch(i, false).await
    }

    /// Opens a TLS port on node `i` (beside its plain port) with the PEM certificate and key in
    /// `cert` and `key`, clients not asked for certificates; returns the TLS port. The node's
    /// plain port keeps working (the tests' own commands use it). The server must be built with
    /// TLS: the valkey-server `make valkey-server` fetches is not (and crashes on it).
    pub async fn enable_tls(&self, i: usize, cert: &Path, key: &Path) -> io::Result<u16> {
        let port = pick_free_ports(1)?[0];
        let text = |p: &Path| {
            p.to_str().map(str::to_string).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{p:?} is not UTF-8"))
            })
        };
        let (cert, key, port_text) = (text(cert)?, text(key)?, port.to_string());
        let args = [
            "CONFIG",
            "SET",
            "tls-cert-file",
            &cert,
            "tls-key-file",
            &key,
            "tls-auth-clients",
            "no",
            "tls-port",
            &port_text,
        ];
        match self.command(i, &args).await? {
            RespValue::Simple(ok) if ok == "OK" => Ok(port),
            other => Err(io::Error::other(format!(
                "node {i}: enabling TLS answered {other:?} (is redis-server built with TLS?)"
            ))),
        }
    }

    /// Sends one command to node `i` over a fresh connection and returns the
    /// reply. Server errors come back as `Ok(RespValue::Error(..))`. Bounded
    /// by a 5 s timeout (error kind `TimedOut`).
    pub async fn command(&self, i: usize, args: &[&str]) -> io::Result<RespValue> {
        self.command_timeout(i, args, COMMAND_TIMEOUT).await
    }

    /// Like [`command`](Self::command) with a caller-chosen timeout, e.g. a
    /// short one to observe that a paused node does not answer.
    pub async fn command_timeout(
        &self,
        i: usize,
        args: &[&str],
        timeout: Duration,
    ) -> io::Result<RespValue> {
        self.node(i)?;
        resp_command(self.addr(i), args, timeout).await
    }

    /// `GET key` on node `i`; `None` if the key does not exist.
    pub async fn get(&self, i: usize, key: &str) -> io::Result<Option<String>> {
        match self.command(i, &["GET", key]).await? {
            RespValue::Bulk(None) => Ok(None),
            RespValue::Bulk(Some(bytes)) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| invalid("GET value is not UTF-8")),
            other => Err(unexpected("GET", other)),
        }
    }

    /// `SET key value` on node `i`.
    pub async fn set(&self, i: usize, key: &str, value: &str) -> io::Result<()> {
        expect_ok("SET", self.command(i, &["SET", key, value]).await?)
    }

    /// `PTTL key` on node `i`: milliseconds left, `-1` without expiry, `-2` if
    /// the key does not exist.
    pub async fn pttl(&self, i: usize, key: &str) -> io::Result<i64> {
        match self.command(i, &["PTTL", key]).await? {
            RespValue::Integer(ms) => Ok(ms),
            other => Err(unexpected("PTTL", other)),
        }
    }

    /// `PEXPIRE key ms` on node `i`; `true` if the timeout was set (the key exists).
    pub async fn pexpire(&self, i: usize, key: &str, ms: u64) -> io::Result<bool> {
        match self.command(i, &["PEXPIRE", key, &ms.to_string()]).await? {
            RespValue::Integer(n) => Ok(n == 1),
            other => Err(unexpected("PEXPIRE", other)),
        }
    }

    /// `KEYS pattern` on node `i`.
    pub async fn keys(&self, i: usize, pattern: &str) -> io::Result<Vec<String>> {
        match self.command(i, &["KEYS", pattern]).await? {
            RespValue::Array(Some(items)) => items
                .into_iter()
                .map(|item| match item {
                    RespValue::Bulk(Some(bytes)) => {
                        String::from_utf8(bytes).map_err(|_| invalid("key is not UTF-8"))
                    }
                    other => Err(unexpected("KEYS", other)),
                })
                .collect(),
            other => Err(unexpected("KEYS", other)),
        }
    }

    /// `SCRIPT FLUSH` on node `i`: forgets cached Lua scripts, so the next
    /// `EVALSHA` gets `NOSCRIPT`.
    pub async fn script_flush(&self, i: usize) -> io::Result<()> {
        expect_ok("SCRIPT FLUSH", self.command(i, &["SCRIPT", "FLUSH"]).await?)
    }

    /// `CLIENT PAUSE ms ALL` on node `i`: the server keeps accepting
    /// connections but answers no client for `ms` milliseconds.
    pub async fn client_pause(&self, i: usize, ms: u64) -> io::Result<()> {
        let ms = ms.to_string();
        expect_ok(
            "CLIENT PAUSE",
            self.command(i, &["CLIENT", "PAUSE", &ms, "ALL"]).await?,
        )
    }

    /// `FLUSHALL` on node `i`.
    pub async fn flushall(&self, i: usize) -> io::Result<()> {
        expect_ok("FLUSHALL", self.command(i, &["FLUSHALL"]).await?)
    }

    fn node(&self, i: usize) -> io::Result<&Node> {
        self.nodes.get(i).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node index {i} out of range (have {})", self.nodes.len()),
            )
        })
    }

    /// Spawns node `i` and waits until it answers. With `may_move`, a port
    /// taken by someone else is replaced by a fresh one (only at first start:
    /// afterwards the port is the node's identity, as clients hold its URL).
    async fn launch(&mut self, i: usize, may_move: bool) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let node = &self.nodes[i];
            // Fresh data dir, unless a durable node restarts: whatever a previous run left
            // must not come back. A cluster node restarting keeps only its `nodes.conf`.
            if may_move {
                let _ = fs::remove_dir_all(&node.dir);
            } else if self.options.cluster && !self.options.durable {
                remove_all_but(&node.dir, CLUSTER_CONFIG_FILE)?;
            } else if !self.options.durable {
                let _ = fs::remove_dir_all(&node.dir);
            }
            fs::create_dir_all(&node.dir)?;
            let log_start = log_len(&node.log);
            let mut child = spawn_server(&self.bin, self.server, node, &self.options)?;
            match wait_ready(&mut child, node.port, deadline).await {
                Ok(()) => {
                    *lock(&node.child) = Some(child);
                    return Ok(());
                }
                Err(failure) => {
                    let _ = kill_and_reap(&mut child);
                    let log_tail = read_log_tail(&node.log, log_start);
                    let port_taken = matches!(failure, StartFailure::ForeignServer)
                        || log_tail.contains("Address already in use");
                    if port_taken && Instant::now() < deadline {
                        if may_move && attempts < PORT_ATTEMPTS {
                            // Lost the race for the port (or the bus port) between picking and
                            // binding.
                            let fresh = pick_free_ports(2)?;
                            let node = &mut self.nodes[i];
                            node.port = fresh[0];
                            node.bus_port = node.bus_port.map(|_| fresh[1]);
                            continue;
                        }
                        if !may_move {
                            // Same port required: give the other holder a moment.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                    return Err(failure.into_error(self.nodes[i].port, &log_tail));
                }
            }
        }
    }
}

impl Drop for LocalNodes {
    fn drop(&mut self) {
        for node in &self.nodes {
            // Best effort: a failure to kill one node must not stop the others.
            let _ = node.kill();
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Where nodes keep their files: `FREDLOCK_TESTKIT_DIR` when set; for durable nodes, else
/// `/dev/shm` when it is a writable directory (Linux's RAM filesystem); else the system's
/// temporary directory.
///
/// Why RAM for durable nodes: the faults these nodes face are process faults (`kill -9`, a
/// restart, `SIGSTOP`), never a power cut. Redis writes the append-only file before it answers
/// a write, so after a `kill -9` the kernel still has every acknowledged write, in RAM or on a
/// disk alike. What a disk adds is its `fsync` latency, which on a shared VM disk was 0.2 to
/// several ms per write under load: the torture run's fencing modes measured the disk, not the
/// lock (N=5 fencing, 30 s, one seed: 1,055 grants on the disk, 2,656 in RAM).
pub(crate) fn data_root(durable: bool) -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("FREDLOCK_TESTKIT_DIR") {
        return dir.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    if durable && shm.is_dir() {
        let probe = shm.join(format!("fredlock-testkit-probe-{}", std::process::id()));
        if fs::create_dir_all(&probe).is_ok() {
            let _ = fs::remove_dir(&probe);
            return shm.to_path_buf();
        }
    }
    std::env::temp_dir()
}
