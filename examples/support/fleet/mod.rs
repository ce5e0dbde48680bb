//! The FLEET table: P separate PROCESSES contend for one lock, one 4-permit semaphore or one
//! leadership, each process with its own client (one `Redlock`, or one rslock manager) and one
//! waiter, as the replicas of a service do. Every child is a fresh process of the running
//! example (`std::env::current_exe()` with [`CHILD_FLAG`]), spawned the same way for every
//! client, so the clients differ only in the code under test.
//!
//! A cell (one workload, one client, one P): the parent spawns P children; each builds its
//! client, warms it up on a key of its own (connections, scripts) and says `READY`; the parent
//! then sends every child the same wall-clock window (`GO start end`, ns since the epoch), reads
//! INFO commandstats and INFO cpu of every node at the start and at the end of the window, and
//! collects each child's result: its acquisitions (granted inside the window), its waits, its
//! CPU time. Waits are from the call to the grant; an acquire still waiting at the end of the
//! window is dropped (cancelled) there and not counted. Election cells: every leader holds its
//! term 50 ms, resigns, and campaigns again half a term later (at once, it would often win its
//! own seat back before the others' next attempt: the handover measured is to ANOTHER
//! process); the handover is the time from one leader's resign to the next leader's `leader()`
//! returning (both read from the wall clock, on one machine). Candidates campaign from `READY`
//! on: the parent reads the counters a second after the last child is ready, so that the
//! campaigns' start-up is not counted as the terms' cost.
//!
//! Submodules: `child` (what a child process does), `table` (the printed table and the fleet
//! targets with their ratios).

pub mod child;
pub mod table;

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::waiters;

/// The flag that makes a process of the bench a fleet child.
pub const CHILD_FLAG: &str = "--fleet-child";
/// Processes per cell, in the order measured.
pub const PROCESSES: [usize; 3] = [4, 16, 64];
/// The hold of every acquisition (made precise by [`precise_hold`]).
pub const HOLD: Duration = Duration::from_millis(1);
/// Permits of the semaphore cells.
pub const PERMITS: usize = 4;
/// How long a leader keeps its term before it resigns.
pub const TERM: Duration = Duration::from_millis(50);
/// TTL of every lock, permit and leadership: far longer than any hold, so nothing expires.
pub const TTL: Duration = Duration::from_secs(10);
/// How long the parent waits for P children to be ready (build, connect, warm up).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Margin between sending `GO` and the window's start, so that every child has it in time.
const START_MARGIN: Duration = Duration::from_millis(200);
/// Election cells: how long the parent waits after the last `READY` before it reads the nodes'
/// counters. Candidates campaign from `READY` on (their first terms are not counted), and the
/// start of 64 campaigns (the campaign observers' connections and first reads, the wake-up
/// subscribers) spilled into the window: a start-up cost, not a term's.
const ELECTION_SETTLE: Duration = Duration::from_secs(1);

/// Sleeps `HOLD` precisely: a thread sleep to just short of it, then a spin (tokio's timer
/// rounds a 1 ms sleep up to about 2 ms, and a plain thread sleep overshoots by its wake-up
/// latency). Runs on a blocking thread, so the runtime's workers keep serving the connections.
pub async fn precise_hold() {
    tokio::task::spawn_blocking(|| {
        let start = std::time::Instant::now();
        std::thread::sleep(HOLD.saturating_sub(Duration::from_micros(200)));
        while start.elapsed() < HOLD {
            std::hint::spin_loop();
        }
    })
    .await
    .expect("the hold");
}

/// The client under test in a child.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Client {
    /// fredlock with its default wake-ups (released locks wake waiters).
    Default,
    /// fredlock with `wake_on_release(false)`: waiters poll.
    Polling,
    /// rslock 0.10 (polls after a random pause in `[0, 10 ms)`; mutex cells only).
    Rslock,
    /// fredlock default, elections only: one `Election` per child for the whole window, its
    /// leader ending each term with `step_down` (campaigning again at the back of the line)
    /// instead of resigning and making a new `Election`.
    StepDown,
    /// etcd 3.4 (one member on tmpfs, through its JSON gateway; see `support::etcd`): its lock
    /// service for the mutex, its election service for elections; each child one lease and
    /// one connection. Measured only when the bench could start etcd.
    Etcd,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Default => "fredlock default",
            Client::Polling => "fredlock polling",
            Client::Rslock => "rslock 0.10",
            Client::StepDown => "fredlock step down",
            Client::Etcd => "etcd 3.4",
        }
    }
    fn arg(self) -> &'static str {
        match self {
            Client::Default => "default",
            Client::Polling => "polling",
            Client::Rslock => "rslock",
            Client::StepDown => "stepdown",
            Client::Etcd => "etcd",
        }
    }
    fn parse(s: &str) -> Option<Client> {
        [
            Client::Default,
            Client::Polling,
            Client::Rslock,
            Client::StepDown,
            Client::Etcd,
        ]
        .into_iter()
        .find(|c| c.arg() == s)
    }
}

/// What the children contend for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Work {
    /// One key: acquire, hold 1 ms, release.
    Mutex,
    /// A semaphore of [`PERMITS`] permits: acquire, hold 1 ms, release.
    Semaphore,
    /// One leadership: campaign, hold the term [`TERM`], resign, campaign again (or step
    /// down, with [`Client::StepDown`]).
    Election,
}

impl Work {
    pub const ALL: [Work; 3] = [Work::Mutex, Work::Semaphore, Work::Election];

    pub fn name(self) -> &'static str {
        match self {
            Work::Mutex => "mutex",
            Work::Semaphore => "semaphore",
            Work::Election => "election",
        }
    }
    pub fn parse(s: &str) -> Option<Work> {
        Work::ALL.into_iter().find(|w| w.name() == s)
    }
    /// The clients measured for this workload (rslock has no semaphore and no election; etcd
    /// has no semaphore and is left out when it could not be started).
    pub fn clients(self) -> &'static [Client] {
        match self {
            Work::Mutex => &[
                Client::Default,
                Client::Polling,
                Client::Rslock,
                Client::Etcd,
            ],
            Work::Semaphore => &[Client::Default, Client::Polling],
            Work::Election => &[
                Client::Default,
                Client::Polling,
                Client::StepDown,
                Client::Etcd,
            ],
        }
    }
}

/// What one child reports.
#[derive(Debug, Default, Clone)]
pub struct ChildResult {
    /// Acquisitions (terms, for an election) granted inside the window.
    pub acquired: u64,
    /// Waits of those acquisitions, µs (elections: none).
    pub waits_us: Vec<u64>,
    /// Elections: each term as (start, resign), ns since the epoch.
    pub terms: Vec<(u64, u64)>,
    /// The child's CPU time over the window, ms (10 ms ticks).
    pub cpu_ms: u64,
}

impl ChildResult {
    /// The child's result lines.
    pub fn lines(&self) -> String {
        let waits: Vec<String> = self.waits_us.iter().map(u64::to_string).collect();
        let terms: Vec<String> = self.terms.iter().map(|(s, r)| format!("{s}:{r}")).collect();
        format!(
            "RESULT {} {}\nWAITS {}\nTERMS {}\nDONE",
            self.acquired,
            self.cpu_ms,
            waits.join(","),
            terms.join(",")
        )
    }

    /// Folds one line of a child's output in; false for a line that is not part of a result.
    fn read(&mut self, line: &str) -> bool {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        let numbers =
            |s: &str| -> Vec<u64> { s.split(',').filter_map(|v| v.parse().ok()).collect() };
        match tag {
            "RESULT" => {
                let v: Vec<u64> = rest.split(' ').filter_map(|v| v.parse().ok()).collect();
                self.acquired = v.first().copied().unwrap_or(0);
                self.cpu_ms = v.get(1).copied().unwrap_or(0);
            }
            "WAITS" => self.waits_us = numbers(rest),
            "TERMS" => {
                self.terms = rest
                    .split(',')
                    .filter_map(|t| t.split_once(':'))
                    .filter_map(|(s, r)| Some((s.parse().ok()?, r.parse().ok()?)))
                    .collect()
            }
            _ => return false,
        }
        true
    }
}

/// One cell's figures.
#[derive(Debug, Clone)]
pub struct Cell {
    pub work: Work,
    pub client: Client,
    pub processes: usize,
    /// Acquisitions (terms) per second over the window.
    pub per_second: f64,
    /// Redis commands (all nodes, calls inside scripts included) per acquisition (per term).
    pub commands_per_acquisition: f64,
    /// Waits (elections: handovers), µs.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Fewest and most acquisitions (terms) of one process.
    pub fewest: u64,
    pub most: u64,
    /// CPU cores busy over the window: all children together, all nodes together.
    pub client_cores: f64,
    pub server_cores: f64,
    /// Elections: consecutive terms that overlapped (a new leader before the old resigned).
    pub overlaps: u64,
    /// Commands per acquisition (per term) by node and command (`"<node>:<command>"`), the
    /// largest first, those of at least 0.05.
    pub by_command: Vec<(String, f64)>,
}

/// Nanoseconds since the epoch, now.
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Runs one cell: `processes` children of `client` on `work`, for `window`, each given
/// `child_urls` (the Redis nodes' URLs, or etcd's), the counters read from the Redis nodes of
/// `urls`.
pub async fn run_cell(
    urls: &[String],
    child_urls: &[String],
    key: &str,
    work: Work,
    client: Client,
    processes: usize,
    window: Duration,
) -> Cell {
    let addrs = addrs(urls).await;
    let mut children = Vec::with_capacity(processes);
    for index in 0..processes {
        children.push(spawn_child(child_urls, key, work, client, index));
    }
    let mut outputs = Vec::with_capacity(processes);
    for child in &mut children {
        outputs.push(wait_ready(child, work, client).await);
    }
    if work == Work::Election {
        tokio::time::sleep(ELECTION_SETTLE).await;
    }
    let (commands0, cpu0) = (
        waiters::commands_by_name(&addrs).await,
        waiters::server_cpu(&addrs).await,
    );
    let start = unix_ns() + START_MARGIN.as_nanos() as u64;
    let end = start + window.as_nanos() as u64;
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("a piped stdin");
        stdin
            .write_all(format!("GO {start} {end}\n").as_bytes())
            .await
            .expect("tell a child to go");
    }
    tokio::time::sleep(Duration::from_nanos(end.saturating_sub(unix_ns()))).await;
    let (commands, cpu) = (
        waiters::commands_by_name(&addrs).await,
        waiters::server_cpu(&addrs).await,
    );
    let spent: std::collections::BTreeMap<String, u64> = commands
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(commands0.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    let mut results = Vec::with_capacity(processes);
    for (child, lines) in children.iter_mut().zip(outputs) {
        results.push(collect(child, lines, work, client).await);
    }
    summarise(
        work,
        client,
        processes,
        window,
        &results,
        &spent,
        cpu - cpu0,
    )
}

/// The nodes' addresses, for INFO.
async fn addrs(urls: &[String]) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::new();
    for u in urls {
        out.push(super::addr_of(u).await);
    }
    out
}

fn spawn_child(urls: &[String], key: &str, work: Work, client: Client, index: usize) -> Child {
    let exe = std::env::current_exe().expect("this example's path");
    Command::new(exe)
        .args([
            CHILD_FLAG,
            work.name(),
            client.arg(),
            &urls.join(","),
            key,
            &index.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a fleet child")
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// Waits for a child's `READY`; returns its remaining output.
async fn wait_ready(child: &mut Child, work: Work, client: Client) -> Lines {
    let stdout = child.stdout.take().expect("a piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(READY_TIMEOUT, async {
        while let Some(line) = lines.next_line().await.expect("read a child") {
            if line == "READY" {
                return true;
            }
        }
        false
    });
    match ready.await {
        Ok(true) => lines,
        Ok(false) => panic!(
            "a {} {} child exited before it was ready",
            client.name(),
            work.name()
        ),
        Err(_) => panic!(
            "a {} {} child was not ready in {READY_TIMEOUT:?}",
            client.name(),
            work.name()
        ),
    }
}

/// A child's result, once it has exited.
async fn collect(child: &mut Child, mut lines: Lines, work: Work, client: Client) -> ChildResult {
    let mut result = ChildResult::default();
    while let Some(line) = lines.next_line().await.expect("read a child") {
        if line == "DONE" {
            break;
        }
        result.read(&line);
    }
    let status = child.wait().await.expect("wait for a child");
    if !status.success() {
        panic!("a {} {} child failed: {status}", client.name(), work.name());
    }
    result
}

/// A cell's figures from its children's results and the nodes' counters.
fn summarise(
    work: Work,
    client: Client,
    processes: usize,
    window: Duration,
    results: &[ChildResult],
    spent: &std::collections::BTreeMap<String, u64>,
    server_cpu_s: f64,
) -> Cell {
    let commands: u64 = spent.values().sum();
    let mut waits = Histogram::<u64>::new(3).expect("a histogram");
    for r in results {
        for &w in &r.waits_us {
            let _ = waits.record(w);
        }
    }
    let mut overlaps = 0;
    if work == Work::Election {
        let mut terms: Vec<(u64, u64)> = results.iter().flat_map(|r| r.terms.clone()).collect();
        terms.sort_unstable();
        for pair in terms.windows(2) {
            let (resigned, began) = (pair[0].1, pair[1].0);
            match began.checked_sub(resigned) {
                Some(ns) => {
                    let _ = waits.record(ns / 1_000);
                }
                None => overlaps += 1,
            }
        }
    }
    let acquired: u64 = results.iter().map(|r| r.acquired).sum();
    let per = |n: u64| n as f64 / acquired.max(1) as f64;
    let mut by_command: Vec<(String, f64)> = spent
        .iter()
        .map(|(k, &n)| (k.clone(), per(n)))
        .filter(|(_, c)| *c >= 0.05)
        .collect();
    by_command.sort_by(|a, b| b.1.total_cmp(&a.1));
    let secs = window.as_secs_f64();
    let client_cpu: u64 = results.iter().map(|r| r.cpu_ms).sum();
    Cell {
        work,
        client,
        processes,
        per_second: acquired as f64 / secs,
        commands_per_acquisition: per(commands),
        p50_us: waits.value_at_quantile(0.5) as f64,
        p99_us: waits.value_at_quantile(0.99) as f64,
        max_us: waits.max() as f64,
        fewest: results.iter().map(|r| r.acquired).min().unwrap_or(0),
        most: results.iter().map(|r| r.acquired).max().unwrap_or(0),
        client_cores: client_cpu as f64 / 1e3 / secs,
        server_cores: server_cpu_s / secs,
        overlaps,
        by_command,
    }
}

/// If this process was started as a fleet child: runs it on a runtime of ONE thread (64 of
/// them share the machine's cores; every client gets the same runtime), prints its result and
/// returns true; false otherwise (nothing done).
pub fn run_if_child() -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [flag, work, client, urls, key, index] = args.as_slice() else {
        return false;
    };
    if flag != CHILD_FLAG {
        return false;
    }
    let work = Work::parse(work).expect("a workload from the parent");
    let client = Client::parse(client).expect("a client from the parent");
    let urls: Vec<String> = urls.split(',').map(str::to_string).collect();
    let index: usize = index.parse().expect("an index from the parent");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = runtime.block_on(child::run(work, client, &urls, key, index));
    println!("{}", result.lines());
    true
}
