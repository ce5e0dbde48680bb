//! A critical section shared by several PROCESSES, protected by a fredlock Redlock.
//!
//! Every worker process increments ONE counter stored in Redis with a deliberately non-atomic
//! read-modify-write: `GET`, a short pause (standing in for real work, and widening the race
//! window), then `SET value + 1`. Two workers that interleave read the same value and one
//! increment is lost. Under the lock they take turns, so none is lost.
//!
//! ```text
//! cargo run --example critical_section               # with the lock
//! cargo run --example critical_section -- --no-lock  # watch updates get lost
//! cargo run --example critical_section -- --workers 8 --increments 25
//! ```
//!
//! Nodes: the URLs in `FREDLOCK_NODES` (comma-separated, e.g. the three nodes of the project's
//! `docker-compose.yml`) when set; otherwise three local `redis-server` processes started for
//! the run (the `fredlock-testkit` crate) and stopped at the end.
//!
//! How it is put together: the parent process resets the counter, starts copies of itself with
//! `--worker`, waits until every worker is connected, then releases them all at once (over
//! their stdin) so they really compete; it collects one result line from each, then checks the
//! total. Exit code: 0 when the run worked (lost updates under `--no-lock` are the point of the
//! demonstration), 1 if the LOCKED run lost an update, 2 if the run itself failed.

use std::error::Error;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Inspection, Redlock, Retry};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

type BoxError = Box<dyn Error + Send + Sync>;

/// The lock every worker takes around its read-modify-write.
const RESOURCE: &str = "demo:critical-section";
/// The shared counter, on the first node (any one node works: the lock, not the counter's
/// location, is what makes the increments safe).
const COUNTER: &str = "demo:counter";
/// Lock TTL: far longer than one critical section (about a millisecond), so a healthy holder
/// never comes close to its deadline, yet short enough that a worker killed while holding the
/// lock blocks the others for a few seconds only.
const TTL: Duration = Duration::from_secs(5);
/// How long one worker waits for the lock before giving up: longer than a TTL, so even a lock
/// left behind by a killed earlier run expires before anyone gives up.
const WAIT: Duration = Duration::from_secs(30);
/// Retry fast and often: critical sections here last about a millisecond, so the lock changes
/// hands hundreds of times per second. The jitter spreads the waiters out so they do not all
/// collide again on the next attempt. `WAIT` bounds the total, not the attempt count.
const RETRY: Retry = Retry {
    attempts: 10_000,
    delay: Duration::from_millis(2),
    jitter: Duration::from_millis(3),
};
/// Environment variable with the node URLs. The parent passes the nodes to its workers here
/// rather than on the command line, so passwords in URLs do not show up in `ps`.
const NODES_ENV: &str = "FREDLOCK_NODES";
/// Worker -> parent protocol on the worker's stdout; any other line is forwarded as-is.
const READY: &str = "@ready";
const DONE: &str = "@done";
/// Parent -> worker on the worker's stdin: start incrementing.
const GO: &str = "go";

/// What the user asked for on the command line.
#[derive(Debug, Clone)]
struct Params {
    workers: usize,
    increments: u64,
    pause: Duration,
    locked: bool,
    /// `Some(id)` in a worker process.
    worker: Option<usize>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            workers: 4,
            increments: 50,
            pause: Duration::from_millis(1),
            locked: true,
            worker: None,
        }
    }
}

const USAGE: &str = "\
usage: critical_section [--workers N] [--increments M] [--pause-ms P] [--no-lock]

  --workers N      worker processes to start (default 4)
  --increments M   increments per worker (default 50)
  --pause-ms P     pause between GET and SET, in milliseconds (default 1)
  --no-lock        skip the lock, to see updates get lost

  FREDLOCK_NODES=redis://h1:p1,redis://h2:p2,...  use these nodes instead of starting
                   three local redis-server processes";

fn parse_args(args: &[String]) -> Result<Params, String> {
    fn value<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
    }
    let mut p = Params::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--workers" => p.workers = value(arg, it.next())?,
            "--increments" => p.increments = value(arg, it.next())?,
            "--pause-ms" => p.pause = Duration::from_millis(value(arg, it.next())?),
            "--no-lock" => p.locked = false,
            // Not in USAGE: the parent passes it to the copies of itself it starts.
            "--worker" => p.worker = Some(value(arg, it.next())?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if p.workers == 0 || p.increments == 0 {
        return Err("--workers and --increments must be at least 1".into());
    }
    Ok(p)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let params = match parse_args(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match params.worker {
        Some(id) => match worker(&params).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // The parent inherits our stderr: this reaches the user as-is.
                eprintln!("worker {id}: FAILED: {e}");
                ExitCode::FAILURE
            }
        },
        None => {
            // Ctrl-C: return instead of dying on the signal, so the local redis-server nodes
            // and the workers are stopped by their destructors.
            tokio::select! {
                code = parent(&params) => code,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("\ninterrupted");
                    ExitCode::from(130)
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker: one process, `increments` times { lock; GET; pause; SET + 1; unlock }.

/// What a worker reports back to the parent on its last line.
#[derive(Debug, Default, Clone)]
struct Stats {
    increments: u64,
    acquisitions: u64,
    /// Time spent waiting in `acquire_with`, in total and at worst.
    waited: Duration,
    longest_wait: Duration,
}

impl Stats {
    fn encode(&self) -> String {
        format!(
            "{DONE} increments={} acquisitions={} waited_us={} longest_wait_us={}",
            self.increments,
            self.acquisitions,
            self.waited.as_micros(),
            self.longest_wait.as_micros()
        )
    }

    fn decode(line: &str) -> Option<Stats> {
        let mut s = Stats::default();
        for field in line.strip_prefix(DONE)?.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "increments" => s.increments = v,
                "acquisitions" => s.acquisitions = v,
                "waited_us" => s.waited = Duration::from_micros(v),
                "longest_wait_us" => s.longest_wait = Duration::from_micros(v),
                _ => return None,
            }
        }
        Some(s)
    }
}

async fn worker(p: &Params) -> Result<(), BoxError> {
    let urls = fredlock_testkit::env_nodes()
        .ok_or("FREDLOCK_NODES is not set (workers are started by the parent)")?;
    let redlock = Redlock::builder().nodes(urls).retry(RETRY).build().await?;
    let client = redlock.client(0).ok_or("no node configured")?;
    // Connected: tell the parent, then wait for the starting signal so every worker begins at
    // the same moment (process start-up would otherwise stagger them by tens of milliseconds,
    // enough for a fast worker to finish before a slow one starts).
    println!("{READY}");
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await?;
    if line.trim() != GO {
        return Err("the parent went away before the start".into());
    }

    let mut stats = Stats::default();
    for n in 1..=p.increments {
        let lock = if p.locked {
            let asked = Instant::now();
            let lock = redlock
                .acquire_with(RESOURCE, TTL, WAIT)
                .await
                .map_err(|e| format!("acquire for increment {n}: {e}"))?;
            let waited = asked.elapsed();
            stats.acquisitions += 1;
            stats.waited += waited;
            stats.longest_wait = stats.longest_wait.max(waited);
            Some(lock)
        } else {
            None
        };

        // The critical section: read, "work", write. Not atomic on purpose.
        let value: Option<i64> = client
            .get(COUNTER)
            .await
            .map_err(|e| format!("GET {COUNTER}: {e}"))?;
        tokio::time::sleep(p.pause).await;
        if let Some(lock) = &lock {
            // Never write once the lock may have passed to someone else. (This check and the
            // SET are still two steps: a holder that stalls between them needs a fencing token
            // checked by the store itself. With a 5 s TTL and a 1 ms section it does not happen
            // here.)
            if !lock.is_valid() {
                return Err(format!(
                    "the lock's deadline passed before the write of increment {n}"
                )
                .into());
            }
        }
        let _: () = client
            .set(COUNTER, value.unwrap_or(0) + 1, None, None, false)
            .await
            .map_err(|e| format!("SET {COUNTER}: {e}"))?;
        stats.increments += 1;

        if let Some(lock) = lock {
            // An error here means a quorum no longer held our token when we released: the
            // increment above may not have been exclusive. That is a failure, not a detail.
            lock.release()
                .await
                .map_err(|e| format!("release after increment {n}: {e}"))?;
        }
    }
    println!("{}", stats.encode());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The parent: nodes, header, workers, verdict.

async fn parent(p: &Params) -> ExitCode {
    match run(p).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(p: &Params) -> Result<ExitCode, BoxError> {
    // Keep `local` alive until the end: dropping it stops the local redis-server processes.
    let (urls, local) = match fredlock_testkit::env_nodes() {
        Some(urls) => (urls, None),
        None => {
            let nodes = fredlock_testkit::LocalNodes::start(3)
                .await
                .map_err(|e| format!("starting local redis-server nodes: {e}"))?;
            (nodes.urls(), Some(nodes))
        }
    };
    let redlock = Redlock::builder().nodes(urls.clone()).build().await?;
    // One look at every node before starting: which ones answer, and is the lock free?
    let before = redlock.inspect(RESOURCE).await?;
    print_header(p, &redlock, &before, local.is_some());
    check_nodes(p, &redlock, &before)?;

    let client = redlock.client(0).ok_or("no node configured")?;
    let _: () = client.set(COUNTER, 0, None, None, false).await?;

    let mut workers = Workers::spawn(p, &urls)?;
    println!("starting {} workers...", p.workers);
    workers.start().await?;
    println!("all {} connected; go!", p.workers);
    let run = workers.finish(p).await?;

    let got: Option<i64> = client.get(COUNTER).await?;
    report(p, &redlock, &run, got.unwrap_or(0)).await
}

fn print_header(p: &Params, redlock: &Redlock, before: &Inspection, local: bool) {
    let how = if p.locked {
        "under a Redlock"
    } else {
        "WITHOUT a lock"
    };
    println!(
        "fredlock demo: {} processes add 1 to one shared counter, {} times each, {how}",
        p.workers, p.increments
    );
    println!();
    let nodes: Vec<String> = before
        .nodes
        .iter()
        .map(|n| match n.state {
            Ok(_) => n.node.clone(),
            Err(_) => format!("{} (NOT ANSWERING)", n.node),
        })
        .collect();
    println!("  nodes    {}", nodes.join("  "));
    if local {
        println!(
            "           {} local redis-server processes started for this run (set {NODES_ENV} to use yours)",
            nodes.len()
        );
    } else {
        println!("           from {NODES_ENV}");
    }
    if p.locked {
        println!(
            "  lock     resource {RESOURCE:?} = key {:?} on every node;",
            redlock.key(RESOURCE)
        );
        println!(
            "           granted when {} of {} nodes agree; TTL {} s",
            redlock.quorum(),
            nodes.len(),
            TTL.as_secs()
        );
    } else {
        println!("  lock     none (--no-lock): expect lost updates");
    }
    println!(
        "  counter  key {COUNTER:?} on {}, reset to 0",
        before.nodes[0].node
    );
    let (acquire, release) = if p.locked {
        ("acquire, ", ", release")
    } else {
        ("", "")
    };
    println!(
        "  each     {acquire}GET counter, pause {} ms, SET counter = value + 1{release}",
        p.pause.as_millis()
    );
    println!("           (GET..SET is not atomic: two workers that interleave lose an increment)");
    println!();
}

/// Fails early, with a hint, when the nodes cannot run the demo; mentions a lock left held.
fn check_nodes(p: &Params, redlock: &Redlock, before: &Inspection) -> Result<(), BoxError> {
    const HINT: &str =
        "is Redis running there? (`docker compose up -d` starts the project's three nodes)";
    if let Some(first) = before.nodes.first().filter(|n| n.state.is_err()) {
        return Err(format!(
            "{} holds the counter but does not answer: {HINT}",
            first.node
        )
        .into());
    }
    let answering = before.nodes.iter().filter(|n| n.state.is_ok()).count();
    if answering < redlock.quorum() {
        return Err(format!(
            "only {answering} of {} nodes answer, fewer than the {} a lock needs: {HINT}",
            before.nodes.len(),
            redlock.quorum()
        )
        .into());
    }
    if let Some(token) = before.holder().filter(|_| p.locked) {
        // Typically left by an earlier run that was killed while holding it.
        let left = before.remaining(token).unwrap_or(TTL);
        println!(
            "note: the lock is held right now (by an earlier run?); the workers will wait up to {:.1} s for it to expire\n",
            left.as_secs_f64()
        );
    }
    Ok(())
}

/// Messages from the tasks that read the workers' stdout.
enum Event {
    Ready,
    Done(usize, Stats),
    Closed(usize),
}

/// The worker processes, and what their stdout says.
struct Workers {
    children: Vec<(Child, Option<ChildStdin>)>,
    events: mpsc::UnboundedReceiver<Event>,
    started: Instant,
}

/// How a run went, as far as the workers are concerned.
struct Run {
    /// Per worker (index = id - 1): its report, if it finished.
    results: Vec<Option<Stats>>,
    /// Workers that failed, with their exit status.
    failed: Vec<String>,
    /// From the start signal to the last worker's report.
    elapsed: Duration,
}

impl Workers {
    /// Starts the workers: copies of this program, with the nodes in their environment.
    fn spawn(p: &Params, urls: &[String]) -> Result<Workers, BoxError> {
        let exe = std::env::current_exe()?;
        let (tx, events) = mpsc::unbounded_channel();
        let mut children = Vec::with_capacity(p.workers);
        for id in 1..=p.workers {
            let mut cmd = Command::new(&exe);
            cmd.arg("--worker")
                .arg(id.to_string())
                .args(["--increments", &p.increments.to_string()])
                .args(["--pause-ms", &p.pause.as_millis().to_string()])
                .env(NODES_ENV, urls.join(","))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                // If we return early (an error, Ctrl-C), no worker is left running.
                .kill_on_drop(true);
            if !p.locked {
                cmd.arg("--no-lock");
            }
            let mut child = cmd.spawn()?;
            let stdin = child.stdin.take();
            let stdout = child.stdout.take().ok_or("worker stdout not captured")?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == READY {
                        let _ = tx.send(Event::Ready);
                    } else if let Some(stats) = Stats::decode(&line) {
                        let _ = tx.send(Event::Done(id, stats));
                    } else {
                        println!("  [worker {id}] {line}");
                    }
                }
                let _ = tx.send(Event::Closed(id));
            });
            children.push((child, stdin));
        }
        Ok(Workers {
            children,
            events,
            started: Instant::now(),
        })
    }

    /// Waits until every worker is connected, then starts them all at once.
    async fn start(&mut self) -> Result<(), BoxError> {
        let mut ready = 0;
        while ready < self.children.len() {
            match tokio::time::timeout(Duration::from_secs(30), self.events.recv()).await {
                Ok(Some(Event::Ready)) => ready += 1,
                Ok(Some(Event::Closed(id) | Event::Done(id, _))) => {
                    return Err(format!("worker {id} exited before the start").into())
                }
                Ok(None) => return Err("every worker went away".into()),
                Err(_) => return Err("workers not connected after 30 s".into()),
            }
        }
        self.started = Instant::now();
        for (_, stdin) in &mut self.children {
            if let Some(mut stdin) = stdin.take() {
                stdin.write_all(format!("{GO}\n").as_bytes()).await?;
                // Dropping stdin closes it: the worker reads just this one line.
            }
        }
        Ok(())
    }

    /// Prints a line per worker as each finishes; waits for them all.
    async fn finish(mut self, p: &Params) -> Result<Run, BoxError> {
        let mut results: Vec<Option<Stats>> = vec![None; self.children.len()];
        let mut finished = self.started;
        while let Some(event) = self.events.recv().await {
            match event {
                Event::Done(id, stats) => {
                    finished = Instant::now();
                    let lock_part = if p.locked {
                        format!(
                            "{} locks acquired, waited {:.2} s in all for the lock (longest {} ms)",
                            stats.acquisitions,
                            stats.waited.as_secs_f64(),
                            stats.longest_wait.as_millis()
                        )
                    } else {
                        "no lock taken".to_string()
                    };
                    println!(
                        "  worker {id} done after {:.2} s: {} increments, {lock_part}",
                        finished.duration_since(self.started).as_secs_f64(),
                        stats.increments,
                    );
                    results[id - 1] = Some(stats);
                }
                Event::Closed(id) if results[id - 1].is_none() => {
                    println!("  worker {id} stopped before finishing");
                }
                Event::Closed(_) | Event::Ready => {}
            }
        }
        let mut failed = Vec::new();
        for (i, (child, _)) in self.children.iter_mut().enumerate() {
            let status = child.wait().await?;
            if !status.success() || results[i].is_none() {
                failed.push(format!("worker {} ({status})", i + 1));
            }
        }
        Ok(Run {
            results,
            failed,
            elapsed: finished.duration_since(self.started),
        })
    }
}

/// The summary and the verdict; the exit code.
async fn report(p: &Params, redlock: &Redlock, run: &Run, got: i64) -> Result<ExitCode, BoxError> {
    let secs = run.elapsed.as_secs_f64();
    println!();
    if p.locked {
        let acquisitions: u64 = run.results.iter().flatten().map(|s| s.acquisitions).sum();
        let rate = acquisitions as f64 / secs.max(1e-3);
        println!("finished in {secs:.2} s: {acquisitions} lock acquisitions (about {rate:.0} per second)");

        // Every worker released its last lock: the key should be gone from every node.
        // (release() returns once a quorum answered; a node still busy finishes in the
        // background, and if the worker exited first that node keeps the key until its TTL.)
        let after = redlock.inspect(RESOURCE).await?;
        let held: Vec<&str> = after
            .nodes
            .iter()
            .filter(|n| matches!(n.state, Ok(Some(_))))
            .map(|n| n.node.as_str())
            .collect();
        let answering = after.nodes.iter().filter(|n| n.state.is_ok()).count();
        if !held.is_empty() {
            println!(
                "note: the lock key is still on {} until its TTL runs out",
                held.join(", ")
            );
        } else if answering == after.nodes.len() {
            println!("the lock is free again on all {answering} nodes");
        } else {
            println!("the lock is free again on the {answering} nodes that answer");
        }
    } else {
        println!("finished in {secs:.2} s, without any lock");
    }

    let expected = i64::try_from(p.workers as u64 * p.increments)?;
    if !run.failed.is_empty() {
        println!(
            "expected {expected}, got {got}; the run FAILED: {}",
            run.failed.join(", ")
        );
        return Ok(ExitCode::from(2));
    }
    let lost = expected - got;
    if lost == 0 {
        println!("expected {expected}, got {got}: no lost update");
        if !p.locked {
            println!("(the workers never interleaved this time; try a longer --pause-ms)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let what = if lost > 0 {
        format!("{lost} updates lost")
    } else {
        // Only possible if something else writes the counter during the run.
        format!(
            "{} more than expected: is someone else writing {COUNTER:?}?",
            -lost
        )
    };
    if p.locked {
        println!(
            "expected {expected}, got {got}: {what} UNDER THE LOCK: mutual exclusion was violated"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("expected {expected}, got {got}: {what}");
    println!("(workers read the same value and overwrote each other's increments;");
    println!(" run without --no-lock to see the lock prevent it)");
    Ok(ExitCode::SUCCESS)
}
