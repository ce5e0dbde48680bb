//! 16 readers and 1 writer on one name: fredlock's read-write lock against its mutex on the same
//! workload, with every client a task of one process, then every client a process of its own.
//!
//! ```text
//! cargo run --release --example bench_rwlock [-- --quick]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`). The workload:
//! each reader loops take-hold-release with a 1 ms hold (`tokio::time::sleep`, about 2 ms); the
//! writer takes the lock every 50 ms and holds it 1 ms. Waiting polls with the retry policy
//! (5 ms + up to 5 ms of jitter, never giving up). With the mutex every client takes the same
//! lock, so readers are serialized; with the read-write lock they share it and the writer,
//! once waiting, keeps new readers out. Printed per variant: reader acquisitions per second,
//! writer acquisitions, and the writer's wait (call to grant) p50, p99 and max.

use std::process::Stdio;
use std::time::Duration;

use fredlock::{Redlock, Retry};
use fredlock_testkit as testkit;
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;

const READERS: usize = 16;
const TTL: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);
const WRITE_EVERY: Duration = Duration::from_millis(50);
const RETRY: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_millis(5),
    jitter: Duration::from_millis(5),
};

/// What one client did: acquisitions, and each acquisition's wait in microseconds.
#[derive(Default)]
struct Tally {
    acquired: u64,
    waits_us: Vec<u64>,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Rw,
    Mutex,
}

async fn redlock(urls: &[String]) -> Redlock {
    Redlock::builder()
        .nodes(urls.to_vec())
        .retry(RETRY)
        .wake_on_release(false)
        .build()
        .await
        .expect("build")
}

/// One client's loop until `until`: a reader (continuous) or the writer (every 50 ms).
async fn client(redlock: &Redlock, mode: Mode, name: &str, write: bool, until: Instant) -> Tally {
    let mut t = Tally::default();
    let rw = redlock.rwlock(name).expect("rwlock");
    while Instant::now() < until {
        let asked = Instant::now();
        let lock = match (mode, write) {
            (Mode::Mutex, _) => redlock.acquire(name, TTL).await.expect("acquire"),
            (Mode::Rw, false) => rw.read(TTL).await.expect("read").into_lock(),
            (Mode::Rw, true) => rw.write(TTL).await.expect("write").into_lock(),
        };
        t.waits_us.push(asked.elapsed().as_micros() as u64);
        t.acquired += 1;
        tokio::time::sleep(HOLD).await;
        lock.release().await.expect("release");
        if write {
            tokio::time::sleep(WRITE_EVERY).await;
        }
    }
    t
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn row(label: &str, readers: &[Tally], writer: &Tally, secs: f64) {
    let reads: u64 = readers.iter().map(|t| t.acquired).sum();
    let mut w = writer.waits_us.clone();
    w.sort_unstable();
    println!(
        "| {label} | {:.0} | {} | {:.1} | {:.1} | {:.1} |",
        reads as f64 / secs,
        writer.acquired,
        percentile(&w, 0.5),
        percentile(&w, 0.99),
        percentile(&w, 1.0),
    );
}

async fn in_process(urls: &[String], mode: Mode, secs: f64) -> (Vec<Tally>, Tally) {
    let redlock = redlock(urls).await;
    let name = format!("bench:rw:{:x}", rand::random::<u64>());
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for i in 0..=READERS {
        let (redlock, name) = (redlock.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            client(&redlock, mode, &name, i == READERS, until).await
        }));
    }
    let mut tallies = Vec::new();
    for t in tasks {
        tallies.push(t.await.expect("client"));
    }
    redlock.close().await;
    let writer = tallies.pop().unwrap_or_default();
    (tallies, writer)
}

/// Every client a process of its own (this example, `--child`), started together.
async fn processes(urls: &[String], mode: Mode, secs: f64) -> (Vec<Tally>, Tally) {
    let name = format!("bench:rw:{:x}", rand::random::<u64>());
    let exe = std::env::current_exe().expect("current exe");
    // The clients start at a wall-clock instant after every process had time to connect.
    let start_at = std::time::SystemTime::now() + Duration::from_secs(2);
    let start_ms = start_at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let mut children = Vec::new();
    for i in 0..=READERS {
        let child = tokio::process::Command::new(&exe)
            .args([
                "--child",
                if i == READERS { "write" } else { "read" },
                if mode == Mode::Rw { "rw" } else { "mutex" },
                &name,
                &urls.join(","),
                &start_ms.to_string(),
                &secs.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a client process");
        children.push(child);
    }
    let mut tallies = Vec::new();
    for mut child in children {
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::io::BufReader::new(out)
            .read_line(&mut line)
            .await
            .expect("read");
        let _ = child.wait().await;
        let mut parts = line.split_whitespace();
        let acquired = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let waits_us = parts.filter_map(|n| n.parse().ok()).collect();
        tallies.push(Tally { acquired, waits_us });
    }
    let writer = tallies.pop().unwrap_or_default();
    (tallies, writer)
}

async fn child(args: &[String]) {
    let [side, mode, name, urls, start_ms, secs] = args else {
        eprintln!("bench_rwlock: bad --child arguments");
        std::process::exit(64);
    };
    let urls: Vec<String> = urls.split(',').map(str::to_string).collect();
    let mode = if mode == "rw" { Mode::Rw } else { Mode::Mutex };
    let redlock = redlock(&urls).await;
    let start = std::time::UNIX_EPOCH + Duration::from_millis(start_ms.parse().unwrap_or(0));
    let wait = start
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    let until = Instant::now() + Duration::from_secs_f64(secs.parse().unwrap_or(1.0));
    let t = client(&redlock, mode, name, side == "write", until).await;
    let waits: Vec<String> = t.waits_us.iter().map(u64::to_string).collect();
    println!("{} {}", t.acquired, waits.join(" "));
    redlock.close().await;
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let secs = if quick { 2.0 } else { 5.0 };
    if cfg!(debug_assertions) {
        eprintln!("note: a debug build; run with --release for figures worth comparing");
    }
    let nodes = testkit::from_env_or_start(3).await.expect("nodes");
    let urls = nodes.urls();
    println!(
        "16 readers (1 ms hold) + 1 writer (1 ms hold every 50 ms), {secs} s per row, N = 3, \
         polling every 5 ms + up to 5 ms"
    );
    println!();
    println!("| clients, lock | readers/s | writes | writer wait p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, procs, mode) in [
        ("17 tasks, read-write lock", false, Mode::Rw),
        ("17 tasks, mutex", false, Mode::Mutex),
        ("17 processes, read-write lock", true, Mode::Rw),
        ("17 processes, mutex", true, Mode::Mutex),
    ] {
        let (readers, writer) = if procs {
            processes(&urls, mode, secs).await
        } else {
            in_process(&urls, mode, secs).await
        };
        row(label, &readers, &writer, secs);
    }
}
