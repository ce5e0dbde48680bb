//! What holding many locks with keep-alive costs, measured in a child process per variant:
//! the batched renewer (the default), a task per lock (`KeepAliveOptions::batched(false)`),
//! and locks held without keep-alive (for what a held lock costs anyway). Used by
//! `bench_keepalive` (its full table) and `bench` (a summary row).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fredlock::fred::prelude::{ClientLike, Value};
use fredlock::fred::types::{ClusterHash, CustomCommand};
use fredlock::{KeepAliveOptions, Redlock};
use futures::StreamExt;

use super::{process_cpu, resident_bytes};

/// Counts the bytes allocated and not yet freed, to report the live heap per lock beside RSS;
/// only in a keep-alive child (`COUNTING`), so that it costs the other measurements nothing but
/// a read of a flag that never changes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same layout, forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The two ways to keep a lock alive.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Variant {
    /// A task per lock, one extend script per lock per node per renewal.
    PerLock,
    /// The Redlock's shared renewer, one script per node per batch.
    Batched,
    /// No keep-alive: the locks alone, for their memory (what a held lock costs anyway).
    Plain,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::PerLock => "per-lock",
            Variant::Batched => "batched",
            Variant::Plain => "plain",
        }
    }
    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "per-lock" => Some(Variant::PerLock),
            "batched" => Some(Variant::Batched),
            "plain" => Some(Variant::Plain),
            _ => None,
        }
    }
}

/// Hands the allocator's free memory back to the OS (glibc's `malloc_trim`), so that resident
/// memory shows what is live rather than what the allocator keeps for later; a no-op elsewhere.
pub fn trim() {
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

/// What the nodes report, summed over nodes.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeStats {
    /// `EVALSHA` + `EVAL` calls: the scripts clients sent.
    pub scripts: u64,
    /// Microseconds spent in those scripts.
    pub script_usec: u64,
    /// Every command's calls (inside scripts included), `INFO` excluded.
    pub commands: u64,
    /// used_cpu_sys + used_cpu_user, seconds.
    pub cpu: f64,
}

impl NodeStats {
    pub fn minus(self, before: NodeStats) -> NodeStats {
        NodeStats {
            scripts: self.scripts - before.scripts,
            script_usec: self.script_usec - before.script_usec,
            commands: self.commands - before.commands,
            cpu: self.cpu - before.cpu,
        }
    }
}

/// INFO commandstats and INFO cpu of every node, through the Redlock's own clients.
pub async fn node_stats(redlock: &Redlock) -> NodeStats {
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
pub struct Sample {
    pub scripts_per_s: f64,
    pub commands_per_s: f64,
    /// Node CPU seconds per held lock per minute.
    pub node_cpu: f64,
    /// Node CPU microseconds per lock extension (all nodes): the same work, whether or not a
    /// variant kept up with its renewals.
    pub node_cpu_per_extension: f64,
    pub rss_per_lock: f64,
    pub trimmed_rss_per_lock: f64,
    pub heap_per_lock: f64,
    /// Client CPU seconds per held lock per minute.
    pub client_cpu: f64,
    pub extensions_per_s: f64,
    pub usec_per_script: f64,
    pub locks_per_script: f64,
    pub lost: u64,
    pub window_s: f64,
}

impl Sample {
    pub fn line(&self) -> String {
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
pub async fn child(
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
    // Room for every guard (the caller's storage counts, as in row (d) of `make bench`), or
    // every lock.
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

/// Where a child's measurement goes: what `run_child` passes to a fresh process of the same
/// example, which `run_if_child` recognises.
pub struct ChildSpec<'a> {
    pub variant: Variant,
    pub urls: &'a [String],
    pub prefix: &'a str,
    pub locks: usize,
    pub ttl: Duration,
    pub window: Duration,
}

/// The flag that makes a process of this example a keep-alive child.
const CHILD_FLAG: &str = "--keepalive-child";

/// Runs one child (a fresh process of the running example) and parses its result.
pub fn run_child(spec: &ChildSpec) -> Sample {
    let exe = std::env::current_exe().expect("this example's path");
    let out = Command::new(exe)
        .args([
            CHILD_FLAG,
            spec.variant.name(),
            &spec.urls.join(","),
            spec.prefix,
            &spec.locks.to_string(),
            &spec.ttl.as_millis().to_string(),
            &spec.window.as_millis().to_string(),
        ])
        .output()
        .expect("run a child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "the {} child failed: {}\n{}",
            spec.variant.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .lines()
        .find_map(Sample::parse)
        .unwrap_or_else(|| panic!("no result from the {} child: {stdout}", spec.variant.name()))
}

/// When this process was started by [`run_child`]: measures, prints the result line and
/// returns true (the caller then exits); false otherwise.
pub async fn run_if_child() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [flag, variant, urls, prefix, locks, ttl_ms, window_ms] = args.as_slice() else {
        return false;
    };
    if flag != CHILD_FLAG {
        return false;
    }
    COUNTING.store(true, Ordering::Relaxed);
    let number = |s: &str| -> u64 { s.parse().expect("a number from the parent") };
    let variant = Variant::parse(variant).expect("a variant from the parent");
    let urls = urls.split(',').map(str::to_string).collect();
    let sample = child(
        variant,
        urls,
        prefix.clone(),
        number(locks) as usize,
        Duration::from_millis(number(ttl_ms)),
        Duration::from_millis(number(window_ms)),
    )
    .await;
    println!("{}", sample.line());
    true
}
