//! The parent of `examples/critical_section.rs` (`make demo`): several worker processes add 1 to
//! one counter in Redis with a non-atomic read-modify-write, under the lock or (`--no-lock`)
//! without it; the total tells whether an update was lost.
//!
//! The parent resets the counter, starts the workers (copies of the example, which run its
//! worker function), waits until every one is connected, then starts them all at once so that
//! they really compete; it prints a line per worker as each finishes (from the [`Stats`] the
//! worker returns), then the total and the verdict.
//!
//! Exit code: 0 when the run worked (lost updates under `--no-lock` are the point of the
//! demonstration), 1 if the LOCKED run lost an update, 2 if the run itself failed.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Inspection, Redlock};
use tokio::time::Instant;

use super::{BoxError, Header, Workers};
use crate::TestNodes;

/// Worker -> parent, the worker's last line: its [`Stats`].
const DONE: &str = "@done";
/// How long the parent waits for a worker whose stdout has closed to exit.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

const USAGE: &str = "\
usage: critical_section [--workers N] [--increments M] [--pause-ms P] [--no-lock]

  --workers N      worker processes to start (default 4)
  --increments M   increments per worker (default 50)
  --pause-ms P     pause between GET and SET, in milliseconds (default 1)
  --no-lock        skip the lock, to see updates get lost

  FREDLOCK_NODES=redis://h1:p1,redis://h2:p2,...  use these nodes instead of starting
                   three local redis-server processes";

/// What the parent knows of the example: the names and the TTL it uses.
#[derive(Debug, Clone, Copy)]
struct Demo {
    /// The lock every worker takes.
    resource: &'static str,
    /// The counter's key, on the first node.
    counter: &'static str,
    /// The lock's TTL.
    ttl: Duration,
}

/// One worker's orders, from its command line (set by the parent) and its environment.
#[derive(Debug, Clone)]
pub struct Worker {
    /// 1, 2, ...
    pub id: usize,
    /// The nodes' URLs.
    pub nodes: Vec<String>,
    /// How many times to add 1 to the counter.
    pub increments: u64,
    /// The pause between reading and writing the counter (standing in for real work).
    pub pause: Duration,
    /// Whether to take the lock (false under `--no-lock`).
    pub locked: bool,
}

impl Worker {
    /// Tells the parent this worker is connected and waits until every worker is: they all
    /// begin at the same moment (process start-up would otherwise stagger them by tens of
    /// milliseconds, enough for a fast worker to finish before a slow one starts).
    pub async fn wait_for_start(&self) -> Result<(), BoxError> {
        super::wait_for_go().await.map(drop)
    }
}

/// What a worker reports back to the parent when it is done.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Increments written.
    pub increments: u64,
    /// Locks acquired.
    pub acquisitions: u64,
    /// Time spent waiting for the lock, in all.
    pub waited: Duration,
    /// The longest wait for the lock.
    pub longest_wait: Duration,
}

impl Stats {
    /// Counts one acquisition that waited `waited` for the lock.
    pub fn acquired(&mut self, waited: Duration) {
        self.acquisitions += 1;
        self.waited += waited;
        self.longest_wait = self.longest_wait.max(waited);
    }

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

fn parse_args(args: &[String]) -> Result<Params, String> {
    fn value<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
    }
    let mut p = Params {
        workers: 4,
        increments: 50,
        pause: Duration::from_millis(1),
        locked: true,
        worker: None,
    };
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

/// The whole program: as the parent (no `--worker`), runs the demonstration; as a worker, runs
/// `worker` and reports its [`Stats`] to the parent. `resource` is the lock the workers take,
/// `counter` the key they increment (on the first node), `ttl` the lock's TTL (for the header).
pub async fn main<F, Fut>(
    resource: &'static str,
    counter: &'static str,
    ttl: Duration,
    worker: F,
) -> ExitCode
where
    F: FnOnce(Worker) -> Fut,
    Fut: Future<Output = Result<Stats, BoxError>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let p = match parse_args(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Some(id) = p.worker else {
        let demo = Demo {
            resource,
            counter,
            ttl,
        };
        return super::parent(run(&demo, &p)).await;
    };
    super::worker(id, async {
        let orders = Worker {
            id,
            nodes: super::worker_nodes()?,
            increments: p.increments,
            pause: p.pause,
            locked: p.locked,
        };
        let stats = worker(orders).await?;
        println!("{}", stats.encode());
        Ok(())
    })
    .await
}

async fn run(demo: &Demo, p: &Params) -> Result<ExitCode, BoxError> {
    // Keep `nodes` until the end: dropping it stops local redis-server processes.
    let nodes = super::nodes().await?;
    let urls = nodes.urls();
    let redlock = Redlock::builder().nodes(urls.clone()).build().await?;
    // One look at every node before starting: which ones answer, and is the lock free?
    let before = redlock.inspect(demo.resource).await?;
    print_header(demo, p, &redlock, &before, &nodes);
    check_nodes(demo, p, &redlock, &before)?;

    let client = redlock.client(0).ok_or("no node configured")?;
    let _: () = client.set(demo.counter, 0, None, None, false).await?;

    let mut args = vec![
        "--increments".to_string(),
        p.increments.to_string(),
        "--pause-ms".to_string(),
        p.pause.as_millis().to_string(),
    ];
    if !p.locked {
        args.push("--no-lock".to_string());
    }
    let mut workers = Workers::spawn(1..=p.workers, &urls, &args)?;
    println!("starting {} workers...", p.workers);
    let started = workers.start().await?;
    println!("all {} connected; go!", p.workers);
    let run = finish(p, &mut workers, started).await?;

    let got: Option<i64> = client.get(demo.counter).await?;
    report(demo, p, &redlock, &run, got.unwrap_or(0)).await
}

fn print_header(
    demo: &Demo,
    p: &Params,
    redlock: &Redlock,
    before: &Inspection,
    nodes: &TestNodes,
) {
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
    let h = Header { width: 9 };
    h.nodes(before, nodes);
    if p.locked {
        h.row(
            "lock",
            format_args!(
                "resource {:?} = key {:?} on every node;",
                demo.resource,
                redlock.key(demo.resource)
            ),
        );
        h.more(format_args!(
            "granted when {} of {} nodes agree; TTL {} s",
            redlock.quorum(),
            before.nodes.len(),
            demo.ttl.as_secs()
        ));
    } else {
        h.row("lock", "none (--no-lock): expect lost updates");
    }
    h.row(
        "counter",
        format_args!(
            "key {:?} on {}, reset to 0",
            demo.counter, before.nodes[0].node
        ),
    );
    let (acquire, release) = if p.locked {
        ("acquire, ", ", release")
    } else {
        ("", "")
    };
    h.row(
        "each",
        format_args!(
            "{acquire}GET counter, pause {} ms, SET counter = value + 1{release}",
            p.pause.as_millis()
        ),
    );
    h.more("(GET..SET is not atomic: two workers that interleave lose an increment)");
    println!();
}

/// Fails early, with a hint, when the nodes cannot run the demo; mentions a lock left held.
fn check_nodes(
    demo: &Demo,
    p: &Params,
    redlock: &Redlock,
    before: &Inspection,
) -> Result<(), BoxError> {
    super::check_first_node(before, "the counter")?;
    super::check_quorum(redlock, before, "a lock")?;
    if let Some(token) = before.holder().filter(|_| p.locked) {
        // Typically left by an earlier run that was killed while holding it.
        let left = before.remaining(&token.fingerprint).unwrap_or(demo.ttl);
        println!(
            "note: the lock is held right now (by an earlier run?); the workers will wait up to {:.1} s for it to expire\n",
            left.as_secs_f64()
        );
    }
    Ok(())
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

/// Prints a line per worker as each finishes; waits for them all.
async fn finish(p: &Params, workers: &mut Workers, started: Instant) -> Result<Run, BoxError> {
    let mut results: Vec<Option<Stats>> = vec![None; workers.len()];
    let mut finished = started;
    while let Some(line) = workers.next().await {
        let (w, id) = (line.worker, workers.id(line.worker));
        let Some(text) = line.text else {
            if results[w].is_none() {
                println!("  worker {id} stopped before finishing");
            }
            continue;
        };
        let Some(stats) = Stats::decode(&text) else {
            println!("  [worker {id}] {text}");
            continue;
        };
        finished = line.at;
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
            finished.duration_since(started).as_secs_f64(),
            stats.increments,
        );
        results[w] = Some(stats);
    }
    let mut failed = Vec::new();
    for (w, result) in results.iter().enumerate() {
        let status = workers.wait(w, EXIT_LIMIT).await?;
        if !status.success() || result.is_none() {
            failed.push(format!("worker {} ({status})", workers.id(w)));
        }
    }
    Ok(Run {
        results,
        failed,
        elapsed: finished.duration_since(started),
    })
}

/// The summary and the verdict; the exit code.
async fn report(
    demo: &Demo,
    p: &Params,
    redlock: &Redlock,
    run: &Run,
    got: i64,
) -> Result<ExitCode, BoxError> {
    let secs = run.elapsed.as_secs_f64();
    println!();
    if p.locked {
        let acquisitions: u64 = run.results.iter().flatten().map(|s| s.acquisitions).sum();
        let rate = acquisitions as f64 / secs.max(1e-3);
        println!("finished in {secs:.2} s: {acquisitions} lock acquisitions (about {rate:.0} per second)");

        // Every worker released its last lock: the key should be gone from every node.
        // (release() returns once a quorum answered; a node still busy finishes in the
        // background, and if the worker exited first that node keeps the key until its TTL.)
        let after = redlock.inspect(demo.resource).await?;
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
            "{} more than expected: is someone else writing {:?}?",
            -lost, demo.counter
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
