//! The Node Redlocks as peers in `bench`'s serial rows: node-redlock (npm `redlock` 5) and
//! redlock-universal 0.8 (which advertises the lowest latency of the Node libraries), both on
//! `ioredis` 5. Each runs in a child `node` process of its own that runs blocks of serial
//! acquire+release cycles when asked and times each one itself (`process.hrtime`), so its
//! figures carry no cost of this process.
//!
//! The packages are installed once with `npm install` into `~/.cache/fredlock/node-redlock`
//! (`$XDG_CACHE_HOME` when set); without `node` (18 or newer) or `npm`, or when the install
//! fails, the rows say so and show no figure for them.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The packages, pinned: `redlock`'s `latest` tag is still 4.2.0; 5 is published as a beta.
const PACKAGES: [&str; 3] = [
    "redlock@5.0.0-beta.2",
    "redlock-universal@0.8.5",
    "ioredis@5",
];

/// Which Node library a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeLib {
    /// npm `redlock` 5.0.0-beta.2.
    Redlock,
    /// npm `redlock-universal` 0.8.5.
    Universal,
}

impl NodeLib {
    /// The name the driver takes, and the one the tables print.
    pub fn name(self) -> &'static str {
        match self {
            NodeLib::Redlock => "node-redlock 5",
            NodeLib::Universal => "redlock-universal 0.8",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            NodeLib::Redlock => "redlock",
            NodeLib::Universal => "universal",
        }
    }
}

/// The child: runs the library its first argument names (`redlock` or `universal`) on the
/// nodes given as the other arguments, prints `ready`, then for every line `run N KEY` runs N
/// acquire+release cycles of KEY (TTL 10 s, as the Rust rows) and prints their durations in
/// nanoseconds on one line; for `tput TASKS MS PREFIX`, TASKS concurrent loops (the event
/// loop's concurrency, as a Node service has it), each cycling its own key `PREFIX:i` until MS
/// ms have passed, then prints the cycles completed and the nanoseconds taken. redlock-
/// universal's lock object (one per key) is made once and reused, as its documentation shows.
const DRIVER: &str = r#"
import Redis from "ioredis";
import Redlock from "redlock";
import { createRedlock, IoredisAdapter } from "redlock-universal";
import { createInterface } from "node:readline";

const lib = process.argv[2];
const clients = process.argv.slice(3).map((url) => new Redis(url, { maxRetriesPerRequest: 1 }));
const redlock = new Redlock(clients, { driftFactor: 0.01, retryCount: 3, retryDelay: 5, retryJitter: 5 });
const adapters = clients.map((c) => new IoredisAdapter(c));
const universal = new Map();
const cycle = lib === "universal"
  ? async (key) => {
      let lock = universal.get(key);
      if (!lock) {
        lock = createRedlock({ adapters, key, ttl: 10000, retryAttempts: 3, retryDelay: 5, clockDriftFactor: 0.01 });
        universal.set(key, lock);
      }
      const handle = await lock.acquire();
      await lock.release(handle);
    }
  : async (key) => {
      const lock = await redlock.acquire([key], 10000);
      await lock.release();
    };
await Promise.all(clients.map((c) => c.ping()));
process.stdout.write("ready\n");
for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, n, key, prefix] = line.split(" ");
  if (cmd === "tput") {
    const start = process.hrtime.bigint();
    const end = Date.now() + Number(key);
    let done = 0;
    await Promise.all(Array.from({ length: Number(n) }, async (_, i) => {
      while (Date.now() < end) {
        await cycle(`${prefix}:${i}`);
        done++;
      }
    }));
    process.stdout.write(`${done} ${process.hrtime.bigint() - start}\n`);
    continue;
  }
  if (cmd !== "run") break;
  const out = [];
  for (let i = 0; i < Number(n); i++) {
    const start = process.hrtime.bigint();
    await cycle(key);
    out.push(String(process.hrtime.bigint() - start));
  }
  process.stdout.write(out.join(" ") + "\n");
}
await Promise.all(clients.map((c) => c.quit()));
"#;

/// A running node-redlock child.
pub struct NodeRedlock {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// `node --version`.
    pub version: String,
}

fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fredlock").join("node-redlock")
}

/// `node --version` when it is 18 or newer, the reason to skip otherwise.
fn node_version() -> Result<String, String> {
    let out = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("no `node` on PATH ({e})"))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 18 {
        return Err(format!("node {version} is older than 18"));
    }
    Ok(version)
}

/// Installs the packages into the cache directory when missing.
fn install(dir: &PathBuf) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let installed = ["redlock", "redlock-universal", "ioredis"].iter().all(|p| {
        dir.join("node_modules")
            .join(p)
            .join("package.json")
            .exists()
    });
    if installed {
        return Ok(());
    }
    eprintln!(
        "bench: installing the Node Redlocks into {} (npm install {})",
        dir.display(),
        PACKAGES.join(" ")
    );
    let status = std::process::Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent"])
        .args(PACKAGES)
        .current_dir(dir)
        .status()
        .map_err(|e| format!("no `npm` on PATH ({e})"))?;
    if !status.success() {
        return Err(format!(
            "`npm install {}` failed ({status})",
            PACKAGES.join(" ")
        ));
    }
    Ok(())
}

impl NodeRedlock {
    /// Installs (when needed) and starts a child running `lib` on `urls`; `Err` says why it is
    /// skipped.
    pub async fn start(urls: &[String], lib: NodeLib) -> Result<NodeRedlock, String> {
        let version = node_version()?;
        let dir = cache_dir();
        install(&dir)?;
        let script = dir.join("bench-driver.mjs");
        std::fs::write(&script, DRIVER)
            .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
        let mut child = Command::new("node")
            .arg(&script)
            .arg(lib.arg())
            .args(urls)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start node: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("node's pipes are missing".into());
        };
        let mut lines = BufReader::new(stdout).lines();
        match lines.next_line().await {
            Ok(Some(l)) if l == "ready" => {}
            other => {
                return Err(format!(
                    "the {} driver did not start: {other:?}",
                    lib.name()
                ))
            }
        }
        Ok(NodeRedlock {
            child,
            stdin,
            lines,
            version,
        })
    }

    /// `cycles` serial acquire+release cycles of `key`: each one's duration in nanoseconds.
    pub async fn block(&mut self, cycles: usize, key: &str) -> Vec<u64> {
        self.ask(&format!("run {cycles} {key}\n"))
            .await
            .split_whitespace()
            .map(|n| n.parse().expect("a duration in ns from node-redlock"))
            .collect()
    }

    /// `tasks` concurrent loops on their own keys (`prefix:i`) for `window`: cycles per second.
    pub async fn throughput(
        &mut self,
        tasks: usize,
        window: std::time::Duration,
        prefix: &str,
    ) -> f64 {
        let line = format!("tput {tasks} {} {prefix}\n", window.as_millis());
        let reply = self.ask(&line).await;
        let mut parts = reply.split_whitespace().map(|n| {
            n.parse::<f64>()
                .expect("a count and a duration from node-redlock")
        });
        let (done, ns) = (parts.next().unwrap_or(0.0), parts.next().unwrap_or(1.0));
        done / (ns / 1e9)
    }

    /// Sends the driver one command line and returns its one-line answer.
    async fn ask(&mut self, line: &str) -> String {
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the node-redlock driver");
        self.lines
            .next_line()
            .await
            .expect("read from the node-redlock driver")
            .expect("the node-redlock driver ended (see its error above)")
    }

    /// Ends the child (it quits its connections when its input closes).
    pub async fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait().await;
    }
}
