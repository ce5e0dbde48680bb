//! A rolling deploy's hand-over: a holder process stops while a waiter in another process is in
//! line for its lock; how long from the stop to the waiter's grant. Three ways to stop:
//!
//! - `release()`, then exit: the holder releases by itself (the floor: the same hand-over,
//!   with no signal on the way);
//! - `SIGTERM` to a holder that called `Redlock::close_on_terminate`: close() releases it;
//! - `SIGTERM` to a holder without it (what a plain tokio service does): the key stays until its
//!   TTL (2 s here), the control.
//!
//! ```text
//! cargo run --release --example bench_shutdown [-- --quick]
//! ```
//!
//! Starts 3 local `redis-server` nodes (or uses `FREDLOCK_NODES=url,url,url`). Each round starts
//! a holder process (this example, `--holder`), which takes the lock and says so; the waiter
//! here then asks for it (and joins its wait line), and the holder is stopped. Printed per way:
//! rounds, the hand-over's p50, p99 and max, and p50 against the floor's.

use std::process::Stdio;
use std::time::Duration;

use fredlock::Redlock;
use fredlock_testkit as testkit;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

/// The TTL of every lock: how long the control's waiter waits.
const TTL: Duration = Duration::from_secs(2);
/// What the holder prints once it holds the lock.
const HELD: &str = "held";

#[derive(Clone, Copy, PartialEq)]
enum Stop {
    Release,
    Graceful,
    Killed,
}

impl Stop {
    fn arg(self) -> &'static str {
        match self {
            Stop::Release => "release",
            Stop::Graceful => "graceful",
            Stop::Killed => "killed",
        }
    }
}

/// The holder process: takes `name`, says so, then holds it until stdin says `go` (release,
/// exit) or a signal ends the process.
async fn holder(args: &[String]) {
    let [stop, name, urls] = args else {
        eprintln!("bench_shutdown: bad --holder arguments");
        std::process::exit(64);
    };
    let redlock = Redlock::builder()
        .nodes(urls.split(','))
        .build()
        .await
        .expect("build");
    if stop == "graceful" {
        redlock.close_on_terminate().expect("signal handler");
    }
    let lock = redlock.acquire(name.as_str(), TTL).await.expect("acquire");
    println!("{HELD}");
    if stop != "release" {
        // The signal ends the process while it holds the lock here.
        return std::future::pending().await;
    }
    let _ = BufReader::new(tokio::io::stdin()).lines().next_line().await;
    lock.release().await.expect("release");
    redlock.close().await;
}

/// One round: the hand-over's time from the stop to the waiter's grant.
async fn round(waiter: &Redlock, urls: &str, stop: Stop) -> Duration {
    let name = format!("bench:shutdown:{:x}", rand::random::<u64>());
    let exe = std::env::current_exe().expect("current exe");
    let mut child = tokio::process::Command::new(exe)
        .args(["--holder", stop.arg(), &name, urls])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the holder");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Some(line) = out.next_line().await.expect("read") {
        if line == HELD {
            break;
        }
    }
    let asked = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            let lock = waiter
                .acquire_with(name.as_str(), TTL, Duration::from_secs(30))
                .await;
            (Instant::now(), lock.expect("the waiter's lock"))
        })
    };
    // Time for the waiter's first attempt to be refused and join the line (a bench, not a test:
    // the figure is the same whether it joined 200 ms or 300 ms before the stop).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = Instant::now();
    match stop {
        Stop::Release => {
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(b"go\n").await.expect("write");
        }
        Stop::Graceful | Stop::Killed => {
            testkit::terminate(child.id().expect("pid")).expect("SIGTERM");
        }
    }
    let (got, lock) = asked.await.expect("waiter");
    let took = got.saturating_duration_since(stopped);
    lock.release().await.expect("release");
    let _ = child.wait().await;
    took
}

fn ms(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--holder") {
        return holder(&args[1..]).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = if quick { 10 } else { 40 };
    if cfg!(debug_assertions) {
        eprintln!("note: a debug build; run with --release for figures worth comparing");
    }
    let nodes = testkit::from_env_or_start(3).await.expect("nodes");
    let urls = nodes.urls().join(",");
    let waiter = Redlock::builder()
        .nodes(nodes.urls())
        .build()
        .await
        .expect("build");
    println!(
        "A holder process stops while a waiter in another process is in line (N = 3, TTL {TTL:?})"
    );
    println!();
    println!("| the holder stops by | rounds | hand-over p50 ms | p99 ms | max ms | p50 / floor |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut floor = f64::NAN;
    for (label, stop, n) in [
        ("release(), then exit (floor)", Stop::Release, rounds),
        ("SIGTERM, close_on_terminate()", Stop::Graceful, rounds),
        ("SIGTERM, no handler (control)", Stop::Killed, 3),
    ] {
        let mut took = Vec::with_capacity(n);
        for _ in 0..n {
            took.push(round(&waiter, &urls, stop).await);
        }
        took.sort_unstable();
        let p50 = ms(&took, 0.5);
        if stop == Stop::Release {
            floor = p50;
        }
        println!(
            "| {label} | {n} | {p50:.1} | {:.1} | {:.1} | {:.2}x |",
            ms(&took, 0.99),
            ms(&took, 1.0),
            p50 / floor
        );
    }
    waiter.close().await;
}
