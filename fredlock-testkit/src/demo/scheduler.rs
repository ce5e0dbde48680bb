//! The parent of `examples/scheduler.rs` (`make scheduler`): three scheduler processes campaign
//! in one election; the leader is killed; another takes over; never two leaders at once.
//!
//! The parent starts the workers (copies of the example, which run its worker function), waits
//! until every one is connected, then starts them all at once. Each worker reports what happens
//! to it as [`Msg`] lines on its stdout ([`say`]); the parent timestamps every line as it
//! arrives, on its own clock, so all events share one clock. It lets the first leader start a
//! few jobs, kills it with SIGKILL (a crash: it never resigns, and its lock stays on the nodes
//! until its TTL runs out), waits for another to take over and run a few jobs, then asks
//! everyone to resign (a `quit` line on their stdin: [`Quit`]). It prints a timeline as events
//! arrive, then the leader terms, the failover gap against its bound, and checks that there was
//! never more than one leader at a time, counting the crashed leader's term until its lock ran
//! out.
//!
//! Exit code: 0 when everything held; 1 if two leaders overlapped (or a job ran outside a
//! term); 2 if the run itself failed (no takeover within 10 s, a worker failed, ...).

//!
//! The files below: `protocol.rs` (the lines between the processes), `parent.rs` (the run),
//! `summary.rs` (the summary and the verdict).

use std::future::Future;
use std::process::ExitCode;

use fredlock::{Inspection, Redlock};
use tokio::time::Instant;

use super::{BoxError, Header};
use crate::TestNodes;

mod parent;
mod protocol;
mod summary;

pub use protocol::{say, Demo, Msg, Quit, Worker};

use parent::{Parent, JOBS_AFTER_TAKEOVER, JOBS_BEFORE_CRASH, WORKERS};

const USAGE: &str = "\
usage: scheduler

Three scheduler processes elect one leader; only the leader runs the nightly job, once a
second. The demo kills the leader (SIGKILL), shows another process take over once the
crashed leader's lock has expired, and checks that there was never more than one leader.

  FREDLOCK_NODES=redis://h1:p1,redis://h2:p2,...  use these nodes instead of starting
                   three local redis-server processes";

/// The whole program: as the parent (no arguments), runs the demonstration; as a worker
/// (`--worker ID`), runs `worker`.
pub async fn main<F, Fut>(demo: Demo, worker: F) -> ExitCode
where
    F: FnOnce(Worker) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => super::parent(run(&demo)).await,
        // Not in USAGE: the parent passes it to the copies of itself it starts.
        ["--worker", id] => match id.parse() {
            Ok(id) => {
                super::worker(id, async {
                    let nodes = super::worker_nodes()?;
                    worker(Worker { id, nodes }).await
                })
                .await
            }
            Err(_) => {
                eprintln!("error: bad worker id {id:?}");
                ExitCode::from(2)
            }
        },
        ["-h" | "--help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("error: unexpected arguments {args:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

async fn run(demo: &Demo) -> Result<ExitCode, BoxError> {
    // Keep `nodes` until the end: dropping it stops local redis-server processes.
    let nodes = super::nodes().await?;
    let urls = nodes.urls();
    // The parent takes no part in the election: it only looks at the nodes.
    let redlock = Redlock::builder().nodes(urls.clone()).build().await?;
    let before = redlock.inspect(demo.resource).await?;
    print_header(demo, &redlock, &before, &nodes);
    check_nodes(demo, &redlock, &before)?;

    let mut workers = super::Workers::spawn(0..WORKERS, &urls, &[])?;
    println!("starting {WORKERS} scheduler processes...");
    let start = workers.start().await?;
    println!("all {WORKERS} connected; go! (t = time since this moment, on the parent's clock)");
    println!();
    let mut p = Parent::new(*demo, workers, start);
    if let Err(problem) = p.scenario().await {
        p.line(Instant::now(), "parent", format!("GIVING UP: {problem}"));
        p.problems.push(problem);
    }
    p.shutdown().await;

    let after = redlock.inspect(demo.resource).await?;
    Ok(p.report(&after))
}

fn print_header(demo: &Demo, redlock: &Redlock, before: &Inspection, nodes: &TestNodes) {
    println!(
        "fredlock demo: leader election for a scheduler, {WORKERS} processes, one leader at a time"
    );
    println!();
    let h = Header { width: 10 };
    h.nodes(before, nodes);
    h.row(
        "election",
        format_args!(
            "resource {:?} = key {:?} on every node",
            demo.resource,
            redlock.key(demo.resource)
        ),
    );
    h.more(format_args!(
        "the leader holds a lock of TTL {:.1} s (granted by {} of {} nodes), kept alive while it leads",
        demo.ttl.as_secs_f64(),
        redlock.quorum(),
        before.nodes.len(),
    ));
    h.more(format_args!(
        "followers try again every {}-{} ms",
        demo.retry.delay.as_millis(),
        (demo.retry.delay + demo.retry.jitter).as_millis()
    ));
    h.row(
        "leader",
        format_args!(
            "starts a job every {:.0} s (each takes {:.1} s), only while election.is_leader()",
            demo.job_every.as_secs_f64(),
            demo.job_work.as_secs_f64()
        ),
    );
    h.row(
        "plan",
        format_args!("1. let the first leader start {JOBS_BEFORE_CRASH} jobs"),
    );
    h.more("2. kill it with SIGKILL: a crash, it cannot resign, its lock stays until its TTL ends");
    h.more(format_args!(
        "3. let another process take over and finish {JOBS_AFTER_TAKEOVER} jobs"
    ));
    h.more("4. ask everyone to resign; check that there was never more than one leader");
    println!();
}

/// Fails early, with a hint, when the nodes cannot run the demo; mentions a lock left held.
fn check_nodes(demo: &Demo, redlock: &Redlock, before: &Inspection) -> Result<(), BoxError> {
    super::check_quorum(redlock, before, "an election")?;
    if let Some(token) = before.holder() {
        // Typically left by an earlier run whose leader was killed.
        let left = before.remaining(&token.fingerprint).unwrap_or(demo.ttl);
        println!(
            "note: the election's lock is held right now (by an earlier run?); nobody can lead for \
             the {:.1} s it has left\n",
            left.as_secs_f64()
        );
    }
    Ok(())
}
