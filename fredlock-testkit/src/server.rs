//! Local `redis-server` processes, node control (kill / pause / restart) and a
//! tiny RESP2 client for talking to a node without going through fred.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::flavour::Server;

/// Environment variable with comma-separated `redis://` URLs of external nodes.
pub(crate) const NODES_ENV: &str = "FREDLOCK_NODES";
/// Upper bound for one node to come up (including retries on a taken port).
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Default upper bound for one [`LocalNodes::command`] round trip.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports [`LocalNodes::start`] tries per node before giving up.
const PORT_ATTEMPTS: usize = 10;

/// Distinguishes the temp dirs of several `LocalNodes` in the same process.
static INSTANCE_SEQ: AtomicU64 = AtomicU64::new(0);

/// A reply in the RESP2 protocol, as returned by [`LocalNodes::command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespValue {
    /// `+...` simple string, e.g. `OK` or `PONG`.
    Simple(String),
    /// `-...` error reply, e.g. `ERR unknown command`.
    Error(String),
    /// `:...` integer reply.
    Integer(i64),
    /// `$...` bulk string; `None` is the null bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*...` array; `None` is the null array (`*-1`).
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// Encodes a command as a RESP2 array of bulk strings, ready to write to a socket.
    pub fn encode_command(args: &[&str]) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Parses one complete RESP2 value from the start of `buf`.
    ///
    /// Returns `Ok(None)` when `buf` holds only a prefix of a value (read more
    /// bytes and call again), `Ok(Some((value, consumed)))` when a whole value
    /// was parsed, and `Err` (kind `InvalidData`) when the bytes are not RESP2.
    pub fn parse(buf: &[u8]) -> io::Result<Option<(RespValue, usize)>> {
        parse_at(buf, 0)
    }
}

/// Parses one value starting at `pos`; returns the value and the position after it.
fn parse_at(buf: &[u8], pos: usize) -> io::Result<Option<(RespValue, usize)>> {
    let Some((line, after_line)) = read_line(buf, pos) else {
        return Ok(None);
    };
    let (&kind, rest) = line
        .split_first()
        .ok_or_else(|| invalid("empty RESP line"))?;
    let text = std::str::from_utf8(rest).map_err(|_| invalid("RESP header is not UTF-8"))?;
    match kind {
        b'+' => Ok(Some((RespValue::Simple(text.to_owned()), after_line))),
        b'-' => Ok(Some((RespValue::Error(text.to_owned()), after_line))),
        b':' => Ok(Some((RespValue::Integer(parse_int(text)?), after_line))),
        b'$' => {
            let len = parse_int(text)?;
            if len == -1 {
                return Ok(Some((RespValue::Bulk(None), after_line)));
            }
            let len = usize::try_from(len).map_err(|_| invalid("negative bulk length"))?;
            let end = after_line + len;
            // The payload is followed by its own CRLF; wait until both arrived.
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            let data = buf[after_line..end].to_vec();
            Ok(Some((RespValue::Bulk(Some(data)), end + 2)))
        }
        b'*' => {
            let count = parse_int(text)?;
            if count == -1 {
                return Ok(Some((RespValue::Array(None), after_line)));
            }
            let count = usize::try_from(count).map_err(|_| invalid("negative array length"))?;
            // Do not trust `count` for the allocation: it comes off the wire.
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = after_line;
            for _ in 0..count {
                match parse_at(buf, at)? {
                    Some((item, next)) => {
                        items.push(item);
                        at = next;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((RespValue::Array(Some(items)), at)))
        }
        other => Err(invalid(&format!(
            "unknown RESP2 type byte {:?}",
            char::from(other)
        ))),
    }
}

/// Finds the CRLF-terminated line starting at `pos`; returns it (without CRLF)
/// and the position after the CRLF, or `None` if the CRLF has not arrived yet.
fn read_line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..cr], pos + cr + 2))
}

fn parse_int(text: &str) -> io::Result<i64> {
    text.parse::<i64>()
        .map_err(|_| invalid(&format!("bad RESP integer {text:?}")))
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

/// Sends one command to `addr` over a fresh connection and reads one reply,
/// bounded by `timeout` (the error kind is `TimedOut` when it expires).
///
/// This works against any RESP2 server, e.g. a node behind a
/// [`FaultProxy`](super::FaultProxy) or an external node.
pub async fn resp_command(
    addr: SocketAddr,
    args: &[&str],
    timeout: Duration,
) -> io::Result<RespValue> {
    match tokio::time::timeout(timeout, resp_round_trip(addr, args)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no reply from {addr} within {timeout:?} to {args:?}"),
        )),
    }
}

async fn resp_round_trip(addr: SocketAddr, args: &[&str]) -> io::Result<RespValue> {
    let mut replies = resp_pipeline_round_trip(addr, &[args]).await?;
    Ok(replies.remove(0))
}

/// Sends several commands to `addr` over ONE fresh connection, in order, and reads one reply
/// per command, bounded by `timeout` as a whole (error kind `TimedOut`). For commands whose
/// effect lasts only for the connection, e.g. `ASKING` before a command on a cluster shard
/// that is importing a slot.
pub async fn resp_pipeline(
    addr: SocketAddr,
    commands: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<RespValue>> {
    match tokio::time::timeout(timeout, resp_pipeline_round_trip(addr, commands)).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no replies from {addr} within {timeout:?} to {commands:?}"),
        )),
    }
}

async fn resp_pipeline_round_trip(
    addr: SocketAddr,
    commands: &[&[&str]],
) -> io::Result<Vec<RespValue>> {
    let mut stream = TcpStream::connect(addr).await?;
    let request: Vec<u8> = commands
        .iter()
        .flat_map(|args| RespValue::encode_command(args))
        .collect();
    stream.write_all(&request).await?;
    let mut buf = Vec::with_capacity(512);
    let mut replies = Vec::with_capacity(commands.len());
    while replies.len() < commands.len() {
        // Replies may arrive in several TCP segments: re-parse after each read
        // until a whole value is buffered.
        if let Some((value, used)) = RespValue::parse(&buf)? {
            buf.drain(..used);
            replies.push(value);
            continue;
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{addr} closed the connection before a full reply"),
            ));
        }
    }
    Ok(replies)
}

/// One redis-server process slot. The slot (port, data dir) outlives the
/// process so a killed node can come back on the same address.
#[derive(Debug)]
struct Node {
    port: u16,
    /// Cluster-bus port (`--cluster-port`), in cluster mode only.
    bus_port: Option<u16>,
    /// Data dir handed to `--dir`; wiped before every (re)start (in cluster mode, a restart
    /// keeps its `nodes.conf`).
    dir: PathBuf,
    /// stdout/stderr of every run of this node, appended.
    log: PathBuf,
    /// `None` once killed and reaped. A `Mutex` so `&self` methods
    /// (`pause`, `is_running`) can call `try_wait`/read the pid.
    child: Mutex<Option<Child>>,
}

impl Node {
    /// Sends `sig` to the process, failing if it is not running. The lock is
    /// held across the check and the signal so no concurrent `try_wait` can
    /// reap the child in between (after which its pid could be recycled).
    fn signal(&self, sig: libc::c_int) -> io::Result<()> {
        let mut guard = lock(&self.child);
        let child = guard.as_mut().ok_or_else(|| not_running(self.port))?;
        if child.try_wait()?.is_some() {
            return Err(not_running(self.port));
        }
        let pid =
            libc::pid_t::try_from(child.id()).map_err(|_| io::Error::other("pid out of range"))?;
        signal(pid, sig)
    }

    fn is_running(&self) -> bool {
        let mut guard = lock(&self.child);
        guard
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// SIGKILLs and reaps the process, if any. Idempotent.
    fn kill(&self) -> io::Result<()> {
        let mut guard = lock(&self.child);
        if let Some(mut child) = guard.take() {
            kill_and_reap(&mut child)?;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave `Option<Child>` inconsistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn not_running(port: u16) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!("redis-server on port {port} is not running"),
    )
}

fn signal(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a child we
    // spawned and have not reaped yet, so it cannot have been recycled.
    if unsafe { libc::kill(pid, sig) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn kill_and_reap(child: &mut Child) -> io::Result<()> {
    if child.try_wait()?.is_none() {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SIGKILL also ends a SIGSTOPped process; SIGCONT is just belt and braces.
            let _ = signal(pid, libc::SIGCONT);
            signal(pid, libc::SIGKILL)?;
        }
    }
    // Reaping is what frees the pid and guarantees the listening socket is
    // closed, so the port can be reused right away by a restart.
    child.wait()?;
    Ok(())
}

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

/// How [`LocalNodes`] runs its servers. Crate-internal: [`LocalCluster`](crate::LocalCluster)
/// uses the cluster settings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// Append-only file with `fsync` on every write; restarts keep the data.
    pub(crate) durable: bool,
    /// Cluster mode (`--cluster-enabled yes`): every node also gets a free cluster-bus port, and
    /// a restart keeps the node's `nodes.conf` (its identity, its peers and its slots) while its
    /// data is still dropped, as a shard without persistence that crashes and restarts.
    pub(crate) cluster: bool,
    /// Appended to every node's command line (e.g. cluster timeouts).
    pub(crate) extra_args: Vec<String>,
    /// The server to run; `None`: the one `FREDLOCK_SERVER` names.
    pub(crate) server: Option<Server>,
}

/// The cluster configuration file of a node in cluster mode, inside its data dir.
const CLUSTER_CONFIG_FILE: &str = "nodes.conf";

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
    /// them across a crash). Every write costs an `fsync`: expect about 10,000 writes/s.
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
        let root = std::env::temp_dir().join(format!(
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

fn expect_ok(what: &str, reply: RespValue) -> io::Result<()> {
    match reply {
        RespValue::Simple(s) if s == "OK" => Ok(()),
        other => Err(unexpected(what, other)),
    }
}

/// An error for a reply that is not what `what` should answer (the server's own words when it
/// is an error reply).
pub(crate) fn unexpected(what: &str, reply: RespValue) -> io::Error {
    match reply {
        RespValue::Error(e) => io::Error::other(format!("{what} failed: {e}")),
        other => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply to {what}: {other:?}"),
        ),
    }
}

/// Asks the kernel for `n` distinct free ports. All listeners stay bound
/// until every port is picked, so the same port cannot be handed out twice;
/// they are closed before returning, which leaves a small race with other
/// processes that [`LocalNodes::launch`] handles by retrying.
fn pick_free_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Removes everything in `dir` except the file `keep` (a missing `dir` is fine).
fn remove_all_but(dir: &Path, keep: &str) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name() == keep {
            continue;
        }
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn spawn_server(
    bin: &OsString,
    server: Server,
    node: &Node,
    options: &Options,
) -> io::Result<Child> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&node.log)?;
    let err = out.try_clone()?;
    let aof: &[&str] = if options.durable {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no"]
    };
    let mut cluster = Vec::new();
    if options.cluster {
        cluster.extend(["--cluster-enabled", "yes", "--cluster-config-file"].map(String::from));
        cluster.push(CLUSTER_CONFIG_FILE.to_owned());
        if let Some(bus) = node.bus_port {
            cluster.extend(["--cluster-port".to_owned(), bus.to_string()]);
        }
    }
    Command::new(bin)
        .arg("--port")
        .arg(node.port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(aof)
        .args(["--daemonize", "no"])
        .args(["--protected-mode", "no"])
        .args(["--enable-debug-command", "local"])
        .args(["--loglevel", "warning"])
        .arg("--dir")
        .arg(&node.dir)
        .args(&cluster)
        .args(&options.extra_args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{server} server binary {bin:?} not found: {}",
                        server.install_hint()
                    ),
                )
            } else {
                io::Error::new(e.kind(), format!("failed to spawn {bin:?}: {e}"))
            }
        })
}

enum StartFailure {
    /// The process exited before answering (bad flag, port in use, ...).
    Exited(std::process::ExitStatus),
    /// Something answered on the port, but it is not our process: another
    /// server grabbed the port between picking and binding.
    ForeignServer,
    TimedOut,
    Io(io::Error),
}

impl StartFailure {
    fn into_error(self, port: u16, log_tail: &str) -> io::Error {
        let (kind, what) = match self {
            StartFailure::Exited(status) => {
                (io::ErrorKind::Other, format!("exited early ({status})"))
            }
            StartFailure::ForeignServer => (
                io::ErrorKind::AddrInUse,
                "port is taken by another server".to_owned(),
            ),
            StartFailure::TimedOut => (
                io::ErrorKind::TimedOut,
                format!("did not answer PING within {START_TIMEOUT:?}"),
            ),
            StartFailure::Io(e) => (e.kind(), e.to_string()),
        };
        io::Error::new(
            kind,
            format!("redis-server on port {port} {what}; log:\n{log_tail}"),
        )
    }
}

/// Polls until the server answers `PING` and proves (via `INFO server`'s
/// `process_id`) that the answer came from `child`, not from some other
/// process that took the port.
async fn wait_ready(child: &mut Child, port: u16, deadline: Instant) -> Result<(), StartFailure> {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    loop {
        if let Some(status) = child.try_wait().map_err(StartFailure::Io)? {
            return Err(StartFailure::Exited(status));
        }
        if Instant::now() >= deadline {
            return Err(StartFailure::TimedOut);
        }
        // Anything short of a PONG and an INFO reply means "not up yet" (or
        // a transient hiccup): poll again.
        if let Ok(true) = ping(addr).await {
            let info = resp_command(addr, &["INFO", "server"], Duration::from_secs(1)).await;
            if let Ok(RespValue::Bulk(Some(info))) = info {
                let info = String::from_utf8_lossy(&info);
                let pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok());
                if pid == Some(child.id()) {
                    return Ok(());
                }
                return Err(StartFailure::ForeignServer);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Raw `PING` as the brief's readiness probe: `*1\r\n$4\r\nPING\r\n` -> `+PONG`.
async fn ping(addr: SocketAddr) -> io::Result<bool> {
    let probe = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
        let mut buf = Vec::with_capacity(16);
        while !buf.ends_with(b"\r\n") {
            if stream.read_buf(&mut buf).await? == 0 {
                break;
            }
        }
        Ok::<_, io::Error>(buf.starts_with(b"+PONG"))
    };
    tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .unwrap_or(Ok(false))
}

fn log_len(log: &Path) -> u64 {
    fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// The part of the node's log written since `from` (at most the last 4 KiB),
/// to explain a failed start.
fn read_log_tail(log: &Path, from: u64) -> String {
    let read = || -> io::Result<String> {
        let mut f = File::open(log)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(from.max(len.saturating_sub(4096))))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_default()
}

/// Nodes for a test: local redis-server processes, or external nodes named by
/// the `FREDLOCK_NODES` environment variable.
#[derive(Debug)]
pub enum TestNodes {
    /// Processes started by [`LocalNodes::start`]; node control is available.
    Local(LocalNodes),
    /// `redis://` URLs from `FREDLOCK_NODES`; no node control.
    External(Vec<String>),
}

impl TestNodes {
    /// URLs of the nodes, in order.
    pub fn urls(&self) -> Vec<String> {
        match self {
            TestNodes::Local(nodes) => nodes.urls(),
            TestNodes::External(urls) => urls.clone(),
        }
    }

    /// The local nodes, if these are local (tests that kill or pause nodes
    /// should skip when this is `None`).
    pub fn local(&self) -> Option<&LocalNodes> {
        match self {
            TestNodes::Local(nodes) => Some(nodes),
            TestNodes::External(_) => None,
        }
    }

    /// Mutable access to the local nodes, if these are local.
    pub fn local_mut(&mut self) -> Option<&mut LocalNodes> {
        match self {
            TestNodes::Local(nodes) => Some(nodes),
            TestNodes::External(_) => None,
        }
    }
}

/// Uses the first `n` URLs of `FREDLOCK_NODES` (comma-separated `redis://`
/// URLs) when it names at least `n` nodes; otherwise starts `n` local nodes.
pub async fn from_env_or_start(n: usize) -> io::Result<TestNodes> {
    if let Some(urls) = std::env::var(NODES_ENV)
        .ok()
        .and_then(|list| external_urls(&list, n))
    {
        return Ok(TestNodes::External(urls));
    }
    LocalNodes::start(n).await.map(TestNodes::Local)
}

/// Every URL named by `FREDLOCK_NODES`, if it names any (for programs that use exactly the
/// nodes listed, however many).
pub fn env_nodes() -> Option<Vec<String>> {
    let urls = parse_list(&std::env::var(NODES_ENV).ok()?);
    (!urls.is_empty()).then_some(urls)
}

/// The URLs of a comma-separated list, trimmed, empty entries skipped.
fn parse_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The first `n` URLs of a comma-separated list, if it has at least `n`.
fn external_urls(list: &str, n: usize) -> Option<Vec<String>> {
    let urls = parse_list(list);
    (urls.len() >= n).then(|| urls.into_iter().take(n).collect())
}

#[cfg(test)]
mod tests {
    use super::RespValue;

    #[test]
    fn parses_every_type_and_partial_input() {
        let wire = b"*5\r\n+OK\r\n-ERR bad\r\n:-42\r\n$3\r\na\r\n\r\n*2\r\n$-1\r\n*-1\r\n";
        let expected = RespValue::Array(Some(vec![
            RespValue::Simple("OK".into()),
            RespValue::Error("ERR bad".into()),
            RespValue::Integer(-42),
            RespValue::Bulk(Some(b"a\r\n".to_vec())),
            RespValue::Array(Some(vec![RespValue::Bulk(None), RespValue::Array(None)])),
        ]));
        // Every strict prefix is incomplete, never an error.
        for cut in 0..wire.len() {
            assert_eq!(RespValue::parse(&wire[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(
            RespValue::parse(wire).unwrap(),
            Some((expected, wire.len()))
        );
        // Trailing bytes are left for the next value.
        let (v, used) = RespValue::parse(b":1\r\n:2\r\n").unwrap().unwrap();
        assert_eq!((v, used), (RespValue::Integer(1), 4));
    }

    #[test]
    fn rejects_garbage() {
        assert!(RespValue::parse(b"?x\r\n").is_err());
        assert!(RespValue::parse(b":abc\r\n").is_err());
        assert!(RespValue::parse(b"$1\r\nab\r\n").is_err());
    }

    #[test]
    fn external_urls_need_enough_nodes() {
        let list = " redis://a:1 , redis://b:2,,redis://c:3";
        assert_eq!(
            super::external_urls(list, 2),
            Some(vec!["redis://a:1".to_owned(), "redis://b:2".to_owned()])
        );
        assert_eq!(super::external_urls(list, 3).map(|u| u.len()), Some(3));
        assert_eq!(super::external_urls(list, 4), None);
        assert_eq!(super::external_urls("", 1), None);
    }

    #[test]
    fn encodes_commands() {
        assert_eq!(
            RespValue::encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
    }
}
