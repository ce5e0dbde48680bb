//! Elections a fleet can see, measured with a process per participant (`make bench` runs it
//! after `bench`): 64 observer processes and candidate processes on 3 local nodes.
//!
//! - handover after a resign (a candidate process resigns; another one leads), p50/p99;
//! - observer lag: from a new term being claimed (the new leader's own clock) to each of the 64
//!   observers showing it, p50/p99/max;
//! - idle cost: every command the 3 nodes serve in 20 s while 64 observers watch one leader
//!   that extends its lock (the leader's own extensions included), per second; then the same
//!   with 64 candidate processes waiting in the election's line as well;
//! - failover after SIGKILL of the leader: until every observer stops naming it, and until the
//!   next leader leads, against the TTL;
//! - a preferred candidate (higher priority) joining: until it leads.
//!
//! Timestamps cross processes as wall-clock microseconds (one machine, one clock).
//! `cargo run --release --example bench_elect [-- --observers 64 --rounds 30]`

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fredlock::{ElectOptions, Redlock, Retry};
use fredlock_testkit::{LocalNodes, RespValue};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const NAME: &str = "bench:elect";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn redlock(urls: &str) -> Redlock {
    Redlock::builder()
        .nodes(urls.split(','))
        .retry(Retry {
            attempts: 3,
            delay: Duration::from_millis(20),
            jitter: Duration::from_millis(20),
        })
        .build()
        .await
        .expect("build")
}

/// A child: an observer, printing `seen TERM US` on every change (TERM 0: no leader).
async fn observer_child(urls: String) {
    let r = redlock(&urls).await;
    let observer = r.observe(NAME).await.expect("observe");
    let mut rx = observer.watch();
    let mut out = tokio::io::stdout();
    out.write_all(b"ready\n").await.expect("stdout");
    loop {
        let term = rx.borrow_and_update().as_ref().map_or(0, |l| l.term);
        let line = format!("seen {term} {}\n", now_us());
        if out.write_all(line.as_bytes()).await.is_err() {
            return;
        }
        let _ = out.flush().await;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// A child: a candidate. Prints `joined US`, `lead TERM US`; with a cycle, holds that long,
/// prints `resign TERM US`, resigns and campaigns again; otherwise holds until killed.
async fn candidate_child(urls: String, ttl: Duration, priority: u32, cycle: Option<Duration>) {
    let r = redlock(&urls).await;
    let mut out = tokio::io::stdout();
    loop {
        let options = ElectOptions::default()
            .value(format!("pid {}", std::process::id()))
            .priority(priority);
        let e = r.elect_with_options(NAME, ttl, options).expect("elect");
        let _ = out
            .write_all(format!("joined {}\n", now_us()).as_bytes())
            .await;
        let term = e.leader().await;
        let _ = out
            .write_all(format!("lead {} {}\n", term.number(), now_us()).as_bytes())
            .await;
        let _ = out.flush().await;
        let Some(cycle) = cycle else {
            e.term_ended(&term).await;
            let _ = out
                .write_all(format!("ended {} {}\n", term.number(), now_us()).as_bytes())
                .await;
            std::future::pending::<()>().await;
            return;
        };
        tokio::time::sleep(cycle).await;
        let _ = out
            .write_all(format!("resign {} {}\n", term.number(), now_us()).as_bytes())
            .await;
        let _ = out.flush().await;
        e.resign().await;
        // Let the other candidate take it.
        tokio::time::sleep(cycle / 2).await;
    }
}

/// Lines from children: `(child id, line)`.
struct Fleet {
    children: HashMap<usize, Child>,
    tx: mpsc::UnboundedSender<(usize, String)>,
    rx: mpsc::UnboundedReceiver<(usize, String)>,
    next: usize,
    urls: String,
}

impl Fleet {
    fn new(urls: String) -> Fleet {
        let (tx, rx) = mpsc::unbounded_channel();
        Fleet {
            children: HashMap::new(),
            tx,
            rx,
            next: 0,
            urls,
        }
    }

    fn spawn(&mut self, args: &[&str]) -> usize {
        let id = self.next;
        self.next += 1;
        let mut child = Command::new(std::env::current_exe().expect("exe"))
            .args(args)
            .args(["--urls", &self.urls])
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn child");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((id, line)).is_err() {
                    return;
                }
            }
        });
        self.children.insert(id, child);
        id
    }

    /// The next line, within `within`.
    async fn line(&mut self, within: Duration) -> Option<(usize, String)> {
        tokio::time::timeout(within, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    async fn kill(&mut self, id: usize) {
        if let Some(mut c) = self.children.remove(&id) {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

fn field(line: &str, i: usize) -> u64 {
    line.split_whitespace()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn show(name: &str, v: &[f64]) {
    println!(
        "{name}: n={} p50={:.1} ms p99={:.1} ms max={:.1} ms",
        v.len(),
        pct(v.to_vec(), 0.5),
        pct(v.to_vec(), 0.99),
        pct(v.to_vec(), 1.0)
    );
}

/// Commands the nodes served so far: `(client, all)`. `all` counts the commands scripts run
/// too (INFO commandstats counts both): the figure the targets speak of. `client` leaves out
/// the commands fredlock sends from inside its scripts in an election (EVAL/EVALSHA,
/// SUBSCRIBE, PING and the like), and so also a waiter's plain `SET` renewing its place.
/// `INFO` and `CONFIG` (ours) are left out of both.
async fn commands(nodes: &LocalNodes) -> (u64, u64) {
    const INNER: [&str; 19] = [
        "get", "set", "del", "exists", "hget", "hmget", "hset", "hdel", "pttl", "pexpire",
        "expire", "publish", "zadd", "zrange", "zrem", "zrank", "zcard", "zscore", "incr",
    ];
    let (mut client, mut all) = (0, 0);
    for (name, calls) in breakdown(nodes).await {
        let name = name.trim_start_matches("cmdstat_");
        if name == "info" || name.starts_with("config") {
            continue;
        }
        all += calls;
        if !INNER.contains(&name) {
            client += calls;
        }
    }
    (client, all)
}

/// Calls per command, summed over the nodes.
async fn breakdown(nodes: &LocalNodes) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for i in 0..nodes.len() {
        let RespValue::Bulk(Some(info)) = nodes
            .command(i, &["INFO", "commandstats"])
            .await
            .expect("INFO")
        else {
            continue;
        };
        for line in String::from_utf8_lossy(&info).lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            if let Some(calls) = rest
                .split("calls=")
                .nth(1)
                .and_then(|s| s.split(',').next())
            {
                *out.entry(name.to_string()).or_insert(0) += calls.parse::<u64>().unwrap_or(0);
            }
        }
    }
    out
}

/// Waits until `n` observers printed `ready`.
async fn wait_ready(fleet: &mut Fleet, n: usize) {
    let mut ready = 0;
    while ready < n {
        let (_, line) = fleet
            .line(Duration::from_secs(60))
            .await
            .expect("observers start");
        if line == "ready" {
            ready += 1;
        }
    }
}

async fn handovers(fleet: &mut Fleet, observers: &[usize], rounds: usize) {
    let a = fleet.spawn(&["--candidate", "--ttl-ms", "10000", "--cycle-ms", "300"]);
    let b = fleet.spawn(&["--candidate", "--ttl-ms", "10000", "--cycle-ms", "300"]);
    let mut lead_at: HashMap<u64, u64> = HashMap::new();
    let mut resign_at: HashMap<u64, u64> = HashMap::new();
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let is_observer: std::collections::HashSet<usize> = observers.iter().copied().collect();
    while lead_at.len() < rounds + 2 {
        let Some((id, line)) = fleet.line(Duration::from_secs(30)).await else {
            break;
        };
        if line.starts_with("lead ") {
            lead_at.insert(field(&line, 1), field(&line, 2));
        } else if line.starts_with("resign ") {
            resign_at.insert(field(&line, 1), field(&line, 2));
        } else if line.starts_with("seen ") && is_observer.contains(&id) {
            seen.push((field(&line, 1), field(&line, 2)));
        }
    }
    fleet.kill(a).await;
    fleet.kill(b).await;
    // Drain what the observers printed meanwhile.
    while let Some((id, line)) = fleet.line(Duration::from_millis(500)).await {
        if line.starts_with("seen ") && is_observer.contains(&id) {
            seen.push((field(&line, 1), field(&line, 2)));
        }
    }
    let mut terms: Vec<u64> = lead_at.keys().copied().collect();
    terms.sort_unstable();
    let mut handover = Vec::new();
    for pair in terms.windows(2) {
        if let (Some(r), Some(l)) = (resign_at.get(&pair[0]), lead_at.get(&pair[1])) {
            handover.push(l.saturating_sub(*r) as f64 / 1000.0);
        }
    }
    let lag: Vec<f64> = seen
        .iter()
        .filter(|(t, _)| *t != 0)
        .filter_map(|(t, at)| {
            lead_at
                .get(t)
                .map(|l| at.saturating_sub(*l) as f64 / 1000.0)
        })
        .collect();
    show("handover after a resign (candidate processes)", &handover);
    show(
        &format!(
            "observer lag, new term shown ({} observer processes)",
            observers.len()
        ),
        &lag,
    );
}

/// With `BENCH_ELECT_BREAKDOWN` set: the calls of each command between two [`breakdown`]s.
fn show_breakdown(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) {
    if std::env::var_os("BENCH_ELECT_BREAKDOWN").is_none() {
        return;
    }
    for (k, v) in after {
        let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
        if d > 0 {
            println!("  {k}: {d}");
        }
    }
}

/// Client and all commands per second over `window` (see [`commands`]).
async fn idle_window(nodes: &LocalNodes, window: Duration) -> (f64, f64) {
    let (before, stats_before) = (commands(nodes).await, breakdown(nodes).await);
    tokio::time::sleep(window).await;
    let (after, stats_after) = (commands(nodes).await, breakdown(nodes).await);
    show_breakdown(&stats_before, &stats_after);
    let s = window.as_secs_f64();
    (
        after.0.saturating_sub(before.0) as f64 / s,
        after.1.saturating_sub(before.1) as f64 / s,
    )
}

async fn idle(fleet: &mut Fleet, nodes: &LocalNodes, observers: usize, window: Duration) {
    let leader = fleet.spawn(&["--candidate", "--ttl-ms", "10000"]);
    loop {
        let (_, line) = fleet.line(Duration::from_secs(30)).await.expect("a leader");
        if line.starts_with("lead ") {
            break;
        }
    }
    // Let the observers' reads of the new term finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (per_s, all_s) = idle_window(nodes, window).await;
    println!(
        "idle: {all_s:.1} commands/s on the nodes in all (the commands scripts run counted; {per_s:.1} calls of scripts, SUBSCRIBE and the like; {observers} observers + 1 leader with TTL 10 s, {}s window), {:.2} per observer",
        window.as_secs(),
        all_s / observers as f64
    );
    // The same with as many candidates waiting in the election's line behind the leader.
    let waiting: Vec<usize> = (0..observers)
        .map(|_| fleet.spawn(&["--candidate", "--ttl-ms", "10000"]))
        .collect();
    let mut joined = 0;
    while joined < waiting.len() {
        let (_, line) = fleet.line(Duration::from_secs(60)).await.expect("joined");
        joined += usize::from(line.starts_with("joined "));
    }
    // Let their first attempts (refused, into the line) finish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (per_s, all_s) = idle_window(nodes, window).await;
    println!(
        "idle with {} candidates waiting too: {all_s:.1} commands/s on the nodes in all (the commands scripts run counted; {per_s:.1} calls of scripts, SUBSCRIBE and the like, leaving out the waiters' one-command renewals; {}s window), {:.2} per participant",
        waiting.len(),
        window.as_secs(),
        all_s / (observers + waiting.len()) as f64
    );
    for id in waiting {
        fleet.kill(id).await;
    }
    fleet.kill(leader).await;
}

async fn failover(fleet: &mut Fleet, observers: &[usize], rounds: usize) {
    let ttl = Duration::from_secs(2);
    let is_observer: std::collections::HashSet<usize> = observers.iter().copied().collect();
    let mut gone = Vec::new();
    let mut next_leads = Vec::new();
    let spawn = |f: &mut Fleet| f.spawn(&["--candidate", "--ttl-ms", "2000"]);
    let mut standby = spawn(fleet);
    let mut leader: Option<(usize, u64)> = None;
    for _ in 0..rounds {
        // Until one of them leads.
        let (lid, term) = match leader.take() {
            Some(l) => l,
            None => loop {
                let (id, line) = fleet.line(Duration::from_secs(30)).await.expect("a leader");
                if line.starts_with("lead ") {
                    break (id, field(&line, 1));
                }
            },
        };
        if lid == standby {
            standby = spawn(fleet);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Drain.
        while fleet.line(Duration::from_millis(1)).await.is_some() {}
        let killed = now_us();
        fleet.kill(lid).await;
        let mut cleared: std::collections::HashSet<usize> = std::collections::HashSet::new();
        let mut next = None;
        let until = tokio::time::Instant::now() + ttl * 4;
        while (cleared.len() < observers.len() || next.is_none())
            && tokio::time::Instant::now() < until
        {
            let Some((id, line)) = fleet.line(ttl * 4).await else {
                break;
            };
            if line.starts_with("seen ") && is_observer.contains(&id) && field(&line, 1) != term {
                if cleared.insert(id) && cleared.len() == observers.len() {
                    gone.push(field(&line, 2).saturating_sub(killed) as f64 / 1000.0);
                }
            } else if line.starts_with("lead ") && next.is_none() {
                next_leads.push(field(&line, 2).saturating_sub(killed) as f64 / 1000.0);
                next = Some((id, field(&line, 1)));
            }
        }
        leader = next;
    }
    println!(
        "failover after SIGKILL of the leader, TTL {} ms:",
        ttl.as_millis()
    );
    show("  killed leader gone from every observer", &gone);
    show("  next leader leads", &next_leads);
    fleet.kill(standby).await;
    if let Some((id, _)) = leader {
        fleet.kill(id).await;
    }
}

async fn preferred(fleet: &mut Fleet, rounds: usize) {
    let mut leads = Vec::new();
    let mut prio = 0u32;
    let mut current = fleet.spawn(&["--candidate", "--ttl-ms", "10000", "--priority", "0"]);
    loop {
        let (_, line) = fleet.line(Duration::from_secs(30)).await.expect("a leader");
        if line.starts_with("lead ") {
            break;
        }
    }
    for _ in 0..rounds {
        prio += 1;
        let p = prio.to_string();
        let new = fleet.spawn(&["--candidate", "--ttl-ms", "10000", "--priority", &p]);
        let mut joined = None;
        loop {
            let Some((id, line)) = fleet.line(Duration::from_secs(10)).await else {
                break;
            };
            if id != new {
                continue;
            }
            if line.starts_with("joined ") && joined.is_none() {
                joined = Some(field(&line, 1));
            } else if line.starts_with("lead ") {
                if let Some(j) = joined {
                    leads.push(field(&line, 2).saturating_sub(j) as f64 / 1000.0);
                }
                break;
            }
        }
        // The old version goes away, as in a rolling deploy.
        fleet.kill(current).await;
        current = new;
    }
    show(
        "preferred candidate leads after joining (rolling deploy, one step per round)",
        &leads,
    );
    fleet.kill(current).await;
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(urls) = arg(&args, "--urls") {
        if args.iter().any(|a| a == "--observer") {
            return observer_child(urls).await;
        }
        let ttl = Duration::from_millis(
            arg(&args, "--ttl-ms")
                .and_then(|s| s.parse().ok())
                .unwrap_or(10_000),
        );
        let priority = arg(&args, "--priority")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let cycle = arg(&args, "--cycle-ms")
            .and_then(|s| s.parse().ok())
            .map(Duration::from_millis);
        return candidate_child(urls, ttl, priority, cycle).await;
    }
    let observers: usize = arg(&args, "--observers")
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let rounds: usize = arg(&args, "--rounds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let nodes = LocalNodes::start(3).await.expect("redis-server nodes");
    println!(
        "bench_elect: 3 local nodes, {observers} observer processes, {rounds} rounds; load {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut fleet = Fleet::new(nodes.urls().join(","));
    let ids: Vec<usize> = (0..observers)
        .map(|_| fleet.spawn(&["--observer"]))
        .collect();
    wait_ready(&mut fleet, observers).await;
    // `--only idle` (or handover, failover, preferred): one part of the run.
    let only = arg(&args, "--only");
    let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if part("handover") {
        handovers(&mut fleet, &ids, rounds).await;
    }
    if part("idle") {
        idle(&mut fleet, &nodes, observers, Duration::from_secs(20)).await;
    }
    if part("failover") {
        failover(&mut fleet, &ids, rounds.min(8)).await;
    }
    if part("preferred") {
        preferred(&mut fleet, rounds.min(8)).await;
    }
    for id in ids {
        fleet.kill(id).await;
    }
}
