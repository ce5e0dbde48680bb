//! The `redis-server` processes behind [`LocalNodes`](crate::LocalNodes): one node's slot and
//! child process ([`Node`]: signal, kill and reap), the command line a node runs with
//! ([`Options`], [`spawn_server`]), free ports, and waiting until a fresh process answers (or
//! explaining from its log why it did not). Owns single processes: it must not keep the list of
//! nodes nor decide when one restarts.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::flavour::Server;
use crate::resp::{resp_command, RespValue};

/// Upper bound for one node to come up (including retries on a taken port).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Each node also listens on a Unix socket in its data dir ([`Node::socket`]).
    pub(crate) unix_socket: bool,
}

/// The cluster configuration file of a node in cluster mode, inside its data dir.
pub(crate) const CLUSTER_CONFIG_FILE: &str = "nodes.conf";

impl Node {
    /// The Unix socket a node started with [`Options::unix_socket`] listens on.
    pub(crate) fn socket(&self) -> std::path::PathBuf {
        self.dir.join("redis.sock")
    }
}

/// One redis-server process slot. The slot (port, data dir) outlives the
/// process so a killed node can come back on the same address.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) port: u16,
    /// Cluster-bus port (`--cluster-port`), in cluster mode only.
    pub(crate) bus_port: Option<u16>,
    /// Data dir handed to `--dir`; wiped before every (re)start (in cluster mode, a restart
    /// keeps its `nodes.conf`).
    pub(crate) dir: PathBuf,
    /// stdout/stderr of every run of this node, appended.
    pub(crate) log: PathBuf,
    /// `None` once killed and reaped. A `Mutex` so `&self` methods
    /// (`pause`, `is_running`) can call `try_wait`/read the pid.
    pub(crate) child: Mutex<Option<Child>>,
}

impl Node {
    /// Sends `sig` to the process, failing if it is not running. The lock is
    /// held across the check and the signal so no concurrent `try_wait` can
    /// reap the child in between (after which its pid could be recycled).
    pub(crate) fn signal(&self, sig: libc::c_int) -> io::Result<()> {
        let mut guard = lock(&self.child);
        let child = guard.as_mut().ok_or_else(|| not_running(self.port))?;
        if child.try_wait()?.is_some() {
            return Err(not_running(self.port));
        }
        let pid =
            libc::pid_t::try_from(child.id()).map_err(|_| io::Error::other("pid out of range"))?;
        signal(pid, sig)
    }

    pub(crate) fn is_running(&self) -> bool {
        let mut guard = lock(&self.child);
        guard
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// SIGKILLs and reaps the process, if any. Idempotent.
    pub(crate) fn kill(&self) -> io::Result<()> {
        let mut guard = lock(&self.child);
        if let Some(mut child) = guard.take() {
            kill_and_reap(&mut child)?;
        }
        Ok(())
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

/// Sends `SIGTERM` to the process `pid`, a child of the caller that it has not waited for (so
/// that the pid cannot have been reused): what a supervisor sends to stop a service. Without a
/// `kill` process in between, so that a measured hand-over starts at the signal.
pub fn terminate(pid: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid}")))?;
    signal(pid, libc::SIGTERM)
}

pub(crate) fn kill_and_reap(child: &mut Child) -> io::Result<()> {
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
/// Asks the kernel for `n` distinct free ports. All listeners stay bound
/// until every port is picked, so the same port cannot be handed out twice;
/// they are closed before returning, which leaves a small race with other
/// processes that [`LocalNodes::launch`] handles by retrying.
pub(crate) fn pick_free_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Removes everything in `dir` except the file `keep` (a missing `dir` is fine).
pub(crate) fn remove_all_but(dir: &Path, keep: &str) -> io::Result<()> {
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

pub(crate) fn spawn_server(
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
    let mut args = Vec::new();
    if options.unix_socket {
        args.extend([
            "--unixsocket".to_owned(),
            node.socket().display().to_string(),
        ]);
        args.extend(["--unixsocketperm", "700"].map(String::from));
    }
    if options.cluster {
        args.extend(["--cluster-enabled", "yes", "--cluster-config-file"].map(String::from));
        args.push(CLUSTER_CONFIG_FILE.to_owned());
        if let Some(bus) = node.bus_port {
            args.extend(["--cluster-port".to_owned(), bus.to_string()]);
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
        .args(&args)
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

/// Why a fresh process did not come up.
pub(crate) enum StartFailure {
    /// The process exited before answering (bad flag, port in use, ...).
    Exited(std::process::ExitStatus),
    /// Something answered on the port, but it is not our process: another
    /// server grabbed the port between picking and binding.
    ForeignServer,
    TimedOut,
    /// Waiting failed (`try_wait`).
    Io(io::Error),
}

impl StartFailure {
    pub(crate) fn into_error(self, port: u16, log_tail: &str) -> io::Error {
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
pub(crate) async fn wait_ready(
    child: &mut Child,
    port: u16,
    deadline: Instant,
) -> Result<(), StartFailure> {
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

pub(crate) fn log_len(log: &Path) -> u64 {
    fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// The part of the node's log written since `from` (at most the last 4 KiB),
/// to explain a failed start.
pub(crate) fn read_log_tail(log: &Path, from: u64) -> String {
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
