//! What every end-to-end test of the `fredlock` binary needs: the binary with a clean
//! environment, its output, unique names, scratch files, bounded waits, signals, and a library
//! client on the same nodes. Each test file (`mod support;`) uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use fredlock::Redlock;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The binary, with `nodes` as FREDLOCK_NODES and no other fredlock variable.
pub fn fredlock(nodes: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fredlock"));
    cmd.env("FREDLOCK_NODES", nodes.join(","))
        .env_remove("FREDLOCK_PREFIX")
        .env_remove("FREDLOCK_LABEL")
        .env_remove("FREDLOCK_CONFIRM_REPLICAS")
        .env_remove("FREDLOCK_CONFIRM_TIMEOUT")
        .env_remove("FREDLOCK_CONFIRM_FSYNC")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd` to the end (at most 60 s) with its stdout and stderr captured.
pub async fn output(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("fredlock finished within 60 s")
        .expect("fredlock ran")
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("an exit code")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A lock, election or file name no other test (nor an earlier run) uses.
pub fn unique(name: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    // Every RandomState has keys of its own: the hash of one value differs from call to call.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("cli-{name}-{:016x}", h.finish())
}

/// A scratch directory, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(unique(name));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file's text; empty while it does not exist.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Polls until `check` holds or `within` passes.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The exit code of `child`, which must exit within `within`.
pub async fn wait_exit(child: &mut Child, within: Duration) -> i32 {
    let status = tokio::time::timeout(within, child.wait())
        .await
        .expect("exited in time")
        .expect("wait");
    status.code().expect("an exit code")
}

pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

/// Sends `sig` to process `pid` (a child of this test).
pub fn signal(pid: u32, sig: i32) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on a child of this test.
    let rc = unsafe { libc_kill(pid as i32, sig) };
    assert_eq!(rc, 0, "kill {pid} {sig}");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A library client on the same nodes, with `label` as its owner label.
pub async fn redlock(nodes: &[String], label: &str) -> Redlock {
    Redlock::builder()
        .nodes(nodes.to_vec())
        .owner_label(label)
        .build()
        .await
        .expect("build")
}

/// A port that answers like an HTTP server (one 400 reply per connection), served by the
/// test's runtime.
pub async fn http_port() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
                let reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
                let _ = socket.write_all(reply).await;
            });
        }
    });
    port
}

/// A port that accepts connections and never answers, served by the test's runtime.
pub async fn silent_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    port
}
