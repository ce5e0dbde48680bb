//! What holding many locks with keep-alive costs: the batched renewer (the default) against a
//! task per lock (`KeepAliveOptions::batched(false)`, the path before batching), in one run.
//!
//! ```text
//! cargo run --release --example bench_keepalive [-- --locks 10000 --ttl-ms 6000 --rounds 3]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`). Each round runs
//! three children one after the other (the order alternates between rounds), each a FRESH
//! PROCESS of this example, so that one variant's freed memory cannot be reused by another and
//! the memory figures are those of a process that only did this. A keep-alive child:
//! 1. connects (a Redlock over the nodes) and notes its resident memory and live heap;
//! 2. acquires `--locks` locks (256 acquires at a time) and keeps each alive with its variant as
//!    soon as it is acquired (as README row (d) does);
//! 3. notes memory again: (after - before) / locks is the memory per held lock, as resident
//!    memory (RSS, what row (d) reports), as RSS after handing the allocator's free memory back
//!    to the OS (glibc `malloc_trim`, on both ends), and as live heap bytes (a counting
//!    allocator): RSS also holds what the acquire phase allocated and freed;
//! 4. for a window of 2 TTLs (every lock is extended about three times), measures on every node
//!    (INFO commandstats and INFO cpu, deltas over the window): the scripts the client sent
//!    (`EVALSHA` + `EVAL` calls: one per round trip), every command Redis ran (calls inside
//!    scripts included, the bench's own INFO excluded), the nodes' CPU time (user + sys) and the
//!    time the scripts ran; and its own CPU time;
//! 5. counts the locks lost (must be 0), then releases everything.
//!
//! The third child acquires the same number of locks the same way WITHOUT keep-alive and only
//! notes its memory: what a held lock costs anyway, so that the keep-alive's own share shows.
//!
//! The parent prints one markdown table: medians over rounds, the ratio before / batched, the
//! targets of issue 11 item 4, and the machine's load before and after (`/proc/loadavg`).
//! The nodes' idle CPU (their own timers, measured for 5 s before the rounds) is printed too,
//! and subtracted in the "above idle" row.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fredlock::fred::prelude::{ClientLike, Value};
use fredlock::fred::types::{ClusterHash, CustomCommand};
use fredlock::{KeepAliveOptions, Redlock};
use fredlock_testkit as testkit;
use futures::StreamExt;

/// Counts the bytes allocated and not yet freed, to report the live heap per lock beside RSS.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout, forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The two ways to keep a lock alive.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    /// A task per lock, one extend script per lock per node per renewal.
    PerLock,
    /// The Redlock's shared renewer, one script per node per batch.
    Batched,
    /// No keep-alive: the locks alone, for their memory (what a held lock costs anyway).
    Plain,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::PerLock => "per-lock",
            Variant::Batched => "batched",
            Variant::Plain => "plain",
        }
    }
    fn parse(s: &str) -> Option<Variant> {
        match s {
            "per-lock" => Some(Variant::PerLock),
            "batched" => Some(Variant::Batched),
            "plain" => Some(Variant::Plain),
            _ => None,
        }
    }
}

struct Args {
    locks: usize,
    ttl: Duration,
    rounds: usize,
    window: Option<Duration>,
    /// `--child <variant> <urls> <prefix>`: run one measurement and print its result line.
    child: Option<(Variant, Vec<String>, String)>,
}

fn parse_args() -> Args {
    let mut args = Args {
        locks: 10_000,
        ttl: Duration::from_secs(6),
        rounds: 3,
        window: None,
        child: None,
    };
    let mut it = std::env::args().skip(1);
    let usage = "usage: bench_keepalive [--locks N] [--ttl-ms MS] [--rounds R] [--window-ms MS]";
    let number = |v: Option<String>| -> u64 {
        v.and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("{usage}");
            std::process::exit(2)
        })
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--locks" => args.locks = number(it.next()) as usize,
            "--ttl-ms" => args.ttl = Duration::from_millis(number(it.next())),
            "--rounds" => args.rounds = number(it.next()).max(1) as usize,
            "--window-ms" => args.window = Some(Duration::from_millis(number(it.next()))),
            "--child" => {
                let variant = it.next().as_deref().and_then(Variant::parse);
                let urls = it
                    .next()
                    .map(|u| u.split(',').map(str::to_string).collect());
                let prefix = it.next();
                match (variant, urls, prefix) {
                    (Some(v), Some(u), Some(p)) => args.child = Some((v, u, p)),
                    _ => {
                        eprintln!("{usage}");
                        std::process::exit(2)
                    }
                }
            }
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => {
                eprintln!("bench_keepalive: unknown argument {other:?}\n{usage}");
                std::process::exit(2);
            }
        }
    }
    args
}

/// Resident memory of this process, from /proc/self/statm (Linux); `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Hands the allocator's free memory back to the OS (glibc's `malloc_trim`), so that resident
/// memory shows what is live rather than what the allocator keeps for later; a no-op elsewhere.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim takes no pointer and only releases free memory.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// CPU time (user + system, all threads) this process used so far, from `/proc/self/stat`.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// What the nodes report, summed over nodes.
#[derive(Debug, Default, Clone, Copy)]
struct NodeStats {
    /// `EVALSHA` + `EVAL` calls: the scripts clients sent.
    scripts: u64,
    /// Microseconds spent in those scripts.
    script_usec: u64,
    /// Every command's calls (inside scripts included), `INFO` excluded.
    commands: u64,
    /// used_cpu_sys + used_cpu_user, seconds.
    cpu: f64,
}

impl NodeStats {
    fn minus(self, before: NodeStats) -> NodeStats {
        NodeStats {
            scripts: self.scripts - before.scripts,
            script_usec: self.script_usec - before.script_usec,
            commands: self.commands - before.commands,
            cpu: self.cpu - before.cpu,
        }
    }
}

/// INFO commandstats and INFO cpu of every node, through the Redlock's own clients.
async fn node_stats(redlock: &Redlock) -> NodeStats {
    let mut total = NodeStats::default();
    for i in 0..redlock.node_names().len() {
        let client = redlock.client(i).expect("a single-server node");
        let info: Value = client
            .custom(
                CustomCommand::new_static("INFO", ClusterHash::Random, false),
                vec!["commandstats", "cpu"],
            )
            .await
            .expect("INFO");
        let text = info.as_str().map(|s| s.into_owned()).unwrap_or_default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let field = |key: &str| -> u64 {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(key))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                let calls = field("calls=");
                if name != "info" {
                    total.commands += calls;
                }
                if name == "evalsha" || name == "eval" {
                    total.scripts += calls;
                    total.script_usec += field("usec=");
                }
            } else if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                total.cpu += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    total
}

/// One child's measurement.
#[derive(Debug, Default, Clone)]
struct Sample {
    scripts_per_s: f64,
    commands_per_s: f64,
    /// Node CPU seconds per held lock per minute.
    node_cpu: f64,
    /// Node CPU microseconds per lock extension (all nodes): the same work, whether or not a
    /// variant kept up with its renewals.
    node_cpu_per_extension: f64,
    rss_per_lock: f64,
    trimmed_rss_per_lock: f64,
    heap_per_lock: f64,
    /// Client CPU seconds per held lock per minute.
    client_cpu: f64,
    extensions_per_s: f64,
    usec_per_script: f64,
    locks_per_script: f64,
    lost: u64,
    window_s: f64,
}

impl Sample {
    fn line(&self) -> String {
        format!(
            "RESULT scripts_per_s={} commands_per_s={} node_cpu={} node_cpu_per_extension={} rss_per_lock={} trimmed_rss_per_lock={} heap_per_lock={} client_cpu={} extensions_per_s={} usec_per_script={} locks_per_script={} lost={} window_s={}",
            self.scripts_per_s,
            self.commands_per_s,
            self.node_cpu,
            self.node_cpu_per_extension,
            self.rss_per_lock,
            self.trimmed_rss_per_lock,
            self.heap_per_lock,
            self.client_cpu,
            self.extensions_per_s,
            self.usec_per_script,
            self.locks_per_script,
            self.lost,
            self.window_s
        )
    }

    fn parse(line: &str) -> Option<Sample> {
        let fields: BTreeMap<&str, f64> = line
            .strip_prefix("RESULT ")?
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect();
        let get = |k: &str| fields.get(k).copied();
        Some(Sample {
            scripts_per_s: get("scripts_per_s")?,
            commands_per_s: get("commands_per_s")?,
            node_cpu: get("node_cpu")?,
            node_cpu_per_extension: get("node_cpu_per_extension")?,
            rss_per_lock: get("rss_per_lock")?,
            trimmed_rss_per_lock: get("trimmed_rss_per_lock")?,
            heap_per_lock: get("heap_per_lock")?,
            client_cpu: get("client_cpu")?,
            extensions_per_s: get("extensions_per_s")?,
            usec_per_script: get("usec_per_script")?,
            locks_per_script: get("locks_per_script")?,
            lost: get("lost")? as u64,
            window_s: get("window_s")?,
        })
    }
}

/// The child: holds `locks` kept-alive locks with `variant` and measures.
async fn child(
    variant: Variant,
    urls: Vec<String>,
    prefix: String,
    locks: usize,
    ttl: Duration,
    window: Duration,
) -> Sample {
    let redlock = Redlock::builder()
        .nodes(urls)
        .retry(fredlock::Retry {
            attempts: 20,
            delay: Duration::from_millis(10),
            jitter: Duration::from_millis(10),
        })
        .build()
        .await
        .expect("build a Redlock");
    let options = KeepAliveOptions::default().batched(variant == Variant::Batched);
    let (rss0, heap0) = (resident_bytes(), LIVE.load(Ordering::Relaxed));
    trim();
    let trimmed0 = resident_bytes();
    // Room for every guard (the caller's storage counts, as in README row (d)), or every lock.
    let (mut guards, mut plain) = match variant {
        Variant::Plain => (Vec::new(), Vec::with_capacity(locks)),
        _ => (Vec::with_capacity(locks), Vec::new()),
    };
    let mut keep = |lock: fredlock::Lock| match variant {
        Variant::Plain => plain.push(lock),
        _ => guards.push(lock.keep_alive_with(options.clone()).expect("options")),
    };
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..locks {
        let (redlock, name) = (redlock.clone(), format!("{prefix}:{i}"));
        pending.push(async move { redlock.acquire(name.as_str(), ttl).await });
        if pending.len() >= 256 {
            keep(pending.next().await.expect("one").expect("acquire"));
        }
    }
    while let Some(lock) = pending.next().await {
        keep(lock.expect("acquire"));
    }
    drop(pending);
    let (rss1, heap1) = (resident_bytes(), LIVE.load(Ordering::Relaxed));
    trim();
    let trimmed = resident_bytes();
    let per_lock = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / locks as f64,
        _ => f64::NAN,
    };
    if variant == Variant::Plain {
        // Memory only: the locks held without keep-alive, released at once.
        for lock in plain {
            let _ = lock.release().await;
        }
        redlock.close().await;
        return Sample {
            rss_per_lock: per_lock(rss0, rss1),
            trimmed_rss_per_lock: per_lock(trimmed0, trimmed),
            heap_per_lock: heap1.saturating_sub(heap0) as f64 / locks as f64,
            ..Sample::default()
        };
    }
    let extensions0: u64 = guards.iter().map(|g| u64::from(g.extensions())).sum();
    let stats0 = node_stats(&redlock).await;
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let stats = node_stats(&redlock).await.minus(stats0);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = process_cpu()
        .zip(cpu0)
        .map_or(0.0, |(b, a)| b.saturating_sub(a).as_secs_f64());
    let extensions: u64 = guards
        .iter()
        .map(|g| u64::from(g.extensions()))
        .sum::<u64>()
        - extensions0;
    let lost = guards.iter().filter(|g| g.is_lost()).count() as u64;
    let releases =
        futures::stream::iter(guards.into_iter().map(|g| g.release())).buffer_unordered(256);
    let _: Vec<_> = releases.collect().await;
    let node_count = redlock.node_names().len() as u64;
    redlock.close().await;
    let per_lock_minute = |seconds: f64| seconds / locks as f64 / elapsed * 60.0;
    Sample {
        scripts_per_s: stats.scripts as f64 / elapsed,
        commands_per_s: stats.commands as f64 / elapsed,
        node_cpu: per_lock_minute(stats.cpu),
        node_cpu_per_extension: stats.cpu * 1e6 / extensions.max(1) as f64,
        rss_per_lock: per_lock(rss0, rss1),
        trimmed_rss_per_lock: per_lock(trimmed0, trimmed),
        heap_per_lock: heap1.saturating_sub(heap0) as f64 / locks as f64,
        client_cpu: per_lock_minute(cpu),
        extensions_per_s: extensions as f64 / elapsed,
        usec_per_script: stats.script_usec as f64 / stats.scripts.max(1) as f64,
        // Each extended lock is in one script per node.
        locks_per_script: (extensions * node_count) as f64 / stats.scripts.max(1) as f64,
        lost,
        window_s: elapsed,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs one child and parses its result.
fn run_child(args: &Args, variant: Variant, urls: &[String], prefix: &str) -> Sample {
    let exe = std::env::current_exe().expect("this example's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--locks",
        &args.locks.to_string(),
        "--ttl-ms",
        &args.ttl.as_millis().to_string(),
        "--window-ms",
        &args.window.unwrap_or(args.ttl * 2).as_millis().to_string(),
        "--child",
        variant.name(),
        &urls.join(","),
        prefix,
    ]);
    let out = cmd.output().expect("run a child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "the {} child failed: {}\n{}",
            variant.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .lines()
        .find_map(Sample::parse)
        .unwrap_or_else(|| panic!("no result from the {} child: {stdout}", variant.name()))
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    if let Some((variant, urls, prefix)) = args.child.clone() {
        let window = args.window.unwrap_or(args.ttl * 2);
        let sample = child(variant, urls, prefix, args.locks, args.ttl, window).await;
        println!("{}", sample.line());
        return;
    }
    if cfg!(debug_assertions) {
        eprintln!("bench_keepalive: WARNING: a debug build; run with --release");
    }
    let load_before = loadavg();
    let nodes = testkit::from_env_or_start(3)
        .await
        .expect("start 3 local redis-server nodes (is redis-server on PATH?)");
    let urls = nodes.urls();
    // The nodes' idle CPU: what they spend with no lock at all (their own timers).
    let idle_cpu_per_s = {
        let redlock = Redlock::builder()
            .nodes(urls.clone())
            .build()
            .await
            .expect("build");
        let a = node_stats(&redlock).await;
        let t = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let d = node_stats(&redlock).await.minus(a);
        let per_s = d.cpu / t.elapsed().as_secs_f64();
        redlock.close().await;
        per_s
    };
    let run = format!("bench-keepalive:{}", std::process::id());
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [Variant::PerLock, Variant::Batched, Variant::Plain]
        } else {
            [Variant::Plain, Variant::Batched, Variant::PerLock]
        };
        for variant in order {
            let prefix = format!("{run}:{round}:{}", variant.name());
            let s = run_child(&args, variant, &urls, &prefix);
            eprintln!(
                "round {round} {:>8}: {:8.1} scripts/s, {:8.1} commands/s, node cpu {:.5} s/lock/min, {:6.0} B RSS/lock, {:6.0} B heap/lock, {} lost",
                variant.name(),
                s.scripts_per_s,
                s.commands_per_s,
                s.node_cpu,
                s.rss_per_lock,
                s.heap_per_lock,
                s.lost
            );
            samples.entry(variant.name()).or_default().push(s);
        }
    }
    let load_after = loadavg();
    let med = |v: Variant, f: &dyn Fn(&Sample) -> f64| {
        median(
            samples
                .get(v.name())
                .map_or(Vec::new(), |s| s.iter().map(f).collect()),
        )
    };
    let lost = |v: Variant| -> u64 {
        samples
            .get(v.name())
            .map_or(0, |s| s.iter().map(|x| x.lost).sum())
    };
    let idle_per_lock_minute = idle_cpu_per_s / args.locks as f64 * 60.0;
    println!();
    println!(
        "machine: nproc={}, {}, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        command_output("redis-server", &["--version"]),
        command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])
    );
    println!(
        "fredlock {} (git {})",
        env!("CARGO_PKG_VERSION"),
        command_output("git", &["describe", "--always", "--dirty"])
    );
    println!(
        "command: `cargo run --release --example bench_keepalive -- --locks {} --ttl-ms {} --rounds {}`",
        args.locks,
        args.ttl.as_millis(),
        args.rounds
    );
    println!("load average (1, 5, 15 min): before {load_before}; after {load_after}");
    println!(
        "method: {} locks kept alive, TTL {} s, renewed when 1/3 is left; window {} s per child; {} rounds, each variant in a fresh child process, order alternating; medians over rounds",
        args.locks,
        args.ttl.as_secs_f64(),
        args.window.unwrap_or(args.ttl * 2).as_secs_f64(),
        args.rounds
    );
    println!(
        "nodes' idle CPU: {:.4} s/s over 3 nodes ({:.6} s per lock per minute at {} locks)",
        idle_cpu_per_s, idle_per_lock_minute, args.locks
    );
    println!();
    println!(
        "| measurement | per-lock tasks (before) | batched | before / batched | target | met? |"
    );
    println!("|---|---:|---:|---:|---|---|");
    let row = |name: &str,
               f: &dyn Fn(&Sample) -> f64,
               digits: usize,
               target: &str,
               met: &dyn Fn(f64, f64) -> Option<bool>| {
        let (a, b) = (med(Variant::PerLock, f), med(Variant::Batched, f));
        let verdict = match met(a, b) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        println!(
            "| {name} | {a:.digits$} | {b:.digits$} | {:.2} | {target} | {verdict} |",
            a / b
        );
    };
    let none = |_: f64, _: f64| None;
    row(
        "client→node commands/s (EVALSHA + EVAL: round trips)",
        &|s| s.scripts_per_s,
        1,
        "≥ 10x fewer",
        &|a, b| Some(a / b >= 10.0),
    );
    row(
        "Redis commands/s, all nodes (calls inside scripts included)",
        &|s| s.commands_per_s,
        1,
        "—",
        &none,
    );
    row(
        "node CPU s per held lock per minute (3 nodes)",
        &|s| s.node_cpu,
        6,
        "≥ 2x less",
        &|a, b| Some(a / b >= 2.0),
    );
    row(
        "node CPU s per held lock per minute, above idle",
        &|s| s.node_cpu - idle_per_lock_minute,
        6,
        "—",
        &none,
    );
    row(
        "node CPU µs per lock extension (3 nodes)",
        &|s| s.node_cpu_per_extension,
        2,
        "—",
        &none,
    );
    row(
        "memory per held lock, RSS delta (B)",
        &|s| s.rss_per_lock,
        0,
        "≤ 1024 B (batched)",
        &|_, b| Some(b <= 1024.0),
    );
    row(
        "memory per held lock, RSS delta after malloc_trim (B)",
        &|s| s.trimmed_rss_per_lock,
        0,
        "—",
        &none,
    );
    row(
        "memory per held lock, live heap delta (B)",
        &|s| s.heap_per_lock,
        0,
        "≤ 1024 B (batched)",
        &|_, b| Some(b <= 1024.0),
    );
    let (plain_rss, plain_heap) = (
        med(Variant::Plain, &|s| s.rss_per_lock),
        med(Variant::Plain, &|s| s.heap_per_lock),
    );
    row(
        &format!("the keep-alive's own share, RSS: minus {plain_rss:.0} B for a lock without keep-alive (B)"),
        &|s| s.rss_per_lock - plain_rss,
        0,
        "—",
        &none,
    );
    row(
        &format!("the keep-alive's own share, live heap: minus {plain_heap:.0} B (B)"),
        &|s| s.heap_per_lock - plain_heap,
        0,
        "—",
        &none,
    );
    row(
        "client CPU s per held lock per minute",
        &|s| s.client_cpu,
        6,
        "—",
        &none,
    );
    row(
        "locks extended per second",
        &|s| s.extensions_per_s,
        1,
        "—",
        &none,
    );
    row(
        "locks per script call",
        &|s| s.locks_per_script,
        1,
        "—",
        &none,
    );
    row(
        "µs per script call on the node (INFO commandstats)",
        &|s| s.usec_per_script,
        1,
        "—",
        &none,
    );
    let (la, lb) = (lost(Variant::PerLock), lost(Variant::Batched));
    println!(
        "| locks lost, all rounds | {la} | {lb} | — | 0 | {} |",
        if la == 0 && lb == 0 { "yes" } else { "**no**" }
    );
}
