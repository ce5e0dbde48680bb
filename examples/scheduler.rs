//! Leader election for a scheduler, across PROCESSES: one leader at a time, and a quick but safe
//! takeover when the leader crashes.
//!
//! Three scheduler processes campaign in the same election (`Redlock::elect`). Only the leader
//! runs the nightly job, once a second, and only while `Election::is_leader()` says so: that
//! checks the term's validity on the clock, not just the last role the process heard of. A job
//! in progress is cancelled the moment leadership is lost.
//!
//! The demo lets a leader run a few jobs, then kills it with SIGKILL: a crash, so it never
//! resigns and its lock stays on the nodes until its TTL runs out. Nobody can take over before
//! that (that is the safety); a follower takes over right after (that is the liveness). The new
//! leader runs a few jobs, then everyone resigns. From the events every process reported, the
//! parent prints a timeline, the failover gap, and checks that there was never more than one
//! leader at a time.
//!
//! ```text
//! cargo run --example scheduler
//! FREDLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example scheduler
//! ```
//!
//! Nodes: the URLs in `FREDLOCK_NODES` (comma-separated, e.g. the three nodes of the project's
//! `docker-compose.yml`) when set; otherwise three local `redis-server` processes started for
//! the run (the `fredlock-testkit` crate) and stopped at the end.
//!
//! How it is put together: the parent starts copies of itself with `--worker ID`, waits until
//! every worker is connected, then starts them all at once (a `go` line on their stdin). Each
//! worker reports what happens to it as `@...` lines on its stdout (see [`Msg`]); the parent
//! timestamps every line as it arrives, on its own clock, so all events share one clock. A `quit`
//! line on a worker's stdin asks it to resign and exit.
//!
//! Exit code: 0 when everything held; 1 if two leaders overlapped (or a job ran outside a
//! term); 2 if the run itself failed (no takeover within 10 s, a worker failed, ...).

use std::error::Error;
use std::fmt;
use std::io::Write as _;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use fredlock::{Election, Inspection, Redlock, Retry, Role, Term};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

type BoxError = Box<dyn Error + Send + Sync>;

/// The election every scheduler process takes part in.
const RESOURCE: &str = "scheduler:nightly";
/// Scheduler processes.
const WORKERS: usize = 3;
/// TTL of the leader's lock. The leader extends it while it leads (when a third is left); if it
/// crashes, the lock expires at most one TTL after its last extension. That bounds how long
/// the scheduler goes without a leader after a crash, and how long a frozen leader may be
/// trusted: shorter means faster takeover, but more extension traffic.
const TTL: Duration = Duration::from_secs(1);
/// How followers campaign: one attempt, then a pause of `delay` plus up to `jitter`, again and
/// again until they win or resign. (`elect` campaigns for as long as the election lives: it uses
/// the pause, not `attempts`, which only bounds `Redlock::acquire`.)
const RETRY: Retry = Retry {
    attempts: 1,
    delay: Duration::from_millis(50),
    jitter: Duration::from_millis(50),
};
/// The leader starts a job this often...
const JOB_EVERY: Duration = Duration::from_secs(1);
/// ...and each job takes this long (a sleep, standing in for the real work).
const JOB_WORK: Duration = Duration::from_millis(400);
/// The parent kills the first leader once it has started this many jobs...
const JOBS_BEFORE_CRASH: u64 = 3;
/// ...and asks everyone to resign once the next leader has finished this many.
const JOBS_AFTER_TAKEOVER: u64 = 3;
/// Give up when the first leader has not started its jobs this long after the start...
const FIRST_LEADER_LIMIT: Duration = Duration::from_secs(10);
/// ...or nobody took over this long after the crash...
const TAKEOVER_LIMIT: Duration = Duration::from_secs(10);
/// ...or any other step (the new leader's jobs, resigning) takes longer than this.
const STEP_LIMIT: Duration = Duration::from_secs(5);
/// Environment variable with the node URLs. The parent passes the nodes to its workers here
/// rather than on the command line, so passwords in URLs do not show up in `ps`.
const NODES_ENV: &str = "FREDLOCK_NODES";
/// Parent -> worker, on the worker's stdin: start campaigning; resign and exit.
const GO: &str = "go";
const QUIT: &str = "quit";

const USAGE: &str = "\
usage: scheduler

Three scheduler processes elect one leader; only the leader runs the nightly job, once a
second. The demo kills the leader (SIGKILL), shows another process take over once the
crashed leader's lock has expired, and checks that there was never more than one leader.

  FREDLOCK_NODES=redis://h1:p1,redis://h2:p2,...  use these nodes instead of starting
                   three local redis-server processes";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => {
            // Ctrl-C: return instead of dying on the signal, so the local redis-server nodes
            // and the workers are stopped by their destructors.
            tokio::select! {
                code = parent() => code,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("\ninterrupted");
                    ExitCode::from(130)
                }
            }
        }
        // Not in USAGE: the parent passes it to the copies of itself it starts.
        ["--worker", id] => match worker(id).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // The parent inherits our stderr: this reaches the user as-is.
                eprintln!("worker {id}: FAILED: {e}");
                ExitCode::FAILURE
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

// ---------------------------------------------------------------------------------------------
// The protocol: what a worker tells the parent, one line each on its stdout.

/// A worker's report. Written with `Display`, read back with [`Msg::parse`].
#[derive(Debug, Clone, PartialEq)]
enum Msg {
    /// Connected to the nodes; waiting for `go`.
    Ready,
    /// Became leader: the term's lock token, and how much validity the term has left.
    Leader { token: String, valid: Duration },
    /// The term was extended: validity left now. (Not shown; the parent uses it to know until
    /// when a crashed leader's lock stayed valid.)
    Valid(Duration),
    /// Job `n` of this term started, under the term whose token starts with `token`.
    Job { n: u64, token: String },
    /// Job `n` finished.
    Done(u64),
    /// Job `n` was cancelled because leadership was lost.
    Aborted(u64),
    /// Stopped acting as leader (leadership lost, or about to resign).
    Follower,
    /// Resigned: stopped campaigning, and released the lock if it held it. Exits next.
    Resigned,
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Ready => write!(f, "@ready"),
            Msg::Leader { token, valid } => write!(f, "@leader {token} {}", valid.as_micros()),
            Msg::Valid(valid) => write!(f, "@valid {}", valid.as_micros()),
            Msg::Job { n, token } => write!(f, "@job {n} {token}"),
            Msg::Done(n) => write!(f, "@done {n}"),
            Msg::Aborted(n) => write!(f, "@aborted {n}"),
            Msg::Follower => write!(f, "@follower"),
            Msg::Resigned => write!(f, "@resigned"),
        }
    }
}

impl Msg {
    fn parse(line: &str) -> Option<Msg> {
        fn micros(s: Option<&str>) -> Option<Duration> {
            s?.parse().ok().map(Duration::from_micros)
        }
        let mut f = line.split_whitespace();
        let msg = match f.next()? {
            "@ready" => Msg::Ready,
            "@leader" => Msg::Leader {
                token: f.next()?.to_string(),
                valid: micros(f.next())?,
            },
            "@valid" => Msg::Valid(micros(f.next())?),
            "@job" => Msg::Job {
                n: f.next()?.parse().ok()?,
                token: f.next()?.to_string(),
            },
            "@done" => Msg::Done(f.next()?.parse().ok()?),
            "@aborted" => Msg::Aborted(f.next()?.parse().ok()?),
            "@follower" => Msg::Follower,
            "@resigned" => Msg::Resigned,
            _ => return None,
        };
        f.next().is_none().then_some(msg)
    }
}

// ---------------------------------------------------------------------------------------------
// The worker: one scheduler process.

/// Writes one protocol line and flushes it at once: the parent timestamps lines as they arrive.
/// A parent that went away is not an error here (stdin closing tells us to stop).
fn say(msg: Msg) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{msg}").and_then(|()| out.flush());
}

/// Validity left before `until`, as the worker sees it now.
fn left(until: Instant) -> Duration {
    until.saturating_duration_since(Instant::now())
}

/// Why a worker stopped leading.
#[derive(Debug, PartialEq)]
enum Stop {
    /// Leadership lost (the lock could not be extended in time): campaign again.
    Lost,
    /// The parent asked us to resign.
    Quit,
}

async fn worker(id: &str) -> Result<(), BoxError> {
    let _: usize = id.parse().map_err(|_| format!("bad worker id {id:?}"))?;
    let urls = fredlock_testkit::env_nodes()
        .ok_or("FREDLOCK_NODES is not set (workers are started by the parent)")?;
    let redlock = Redlock::builder().nodes(urls).retry(RETRY).build().await?;

    // Connected: tell the parent, then wait for the starting signal, so that every worker
    // campaigns from the same moment.
    say(Msg::Ready);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    if stdin.next_line().await?.as_deref().map(str::trim) != Some(GO) {
        return Err("the parent went away before the start".into());
    }
    // From now on, `quit` on stdin (or stdin closing: the parent is gone) means resign and exit.
    let (quit_tx, mut quit) = watch::channel(false);
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdin.next_line().await {
            if line.trim() == QUIT {
                break;
            }
        }
        let _ = quit_tx.send(true);
    });

    // Campaign in the background from now until resign (or drop).
    let election = redlock.elect(RESOURCE, TTL)?;
    loop {
        // Follower: wait until we win (or are asked to quit).
        let term = tokio::select! {
            biased;
            _ = quit.wait_for(|&q| q) => break,
            term = election.leader() => term,
        };
        say(Msg::Leader {
            token: term.token.clone(),
            valid: left(term.valid_until),
        });
        let stop = lead(&election, &term, &mut quit).await;
        // Whatever the reason, we stop acting as leader NOW, before anything else happens (on
        // quit, before the release lets another process win).
        say(Msg::Follower);
        if stop == Stop::Quit {
            break;
        }
    }
    // Stops campaigning and, if we still hold the lock, releases it (awaited), so that the next
    // leader does not have to wait for a TTL.
    election.resign().await;
    say(Msg::Resigned);
    redlock.close().await;
    Ok(())
}

/// Leads one term: a job every `JOB_EVERY`, only while this term is valid. Returns as soon as the
/// term ends (even in the middle of a job), or between jobs when asked to quit.
async fn lead(election: &Election, term: &Term, quit: &mut watch::Receiver<bool>) -> Stop {
    let token = term.token.as_str();
    let mut role = election.watch();
    // The validity the parent knows of (sent with `@leader`); each extension moves it.
    let mut reported = term.valid_until;
    let mut next_job = Instant::now();
    for n in 1.. {
        // Idle until the next job is due.
        tokio::select! {
            biased;
            () = term_ended(&mut role, token, &mut reported) => return Stop::Lost,
            _ = quit.wait_for(|&q| q) => return Stop::Quit,
            () = tokio::time::sleep_until(next_job) => {}
        }
        // Right before acting, ask again, on the clock: `is_leader()` is false once the term's
        // validity has passed, even if no one told us yet that it was lost.
        if !leading(election, token) {
            return Stop::Lost;
        }
        say(Msg::Job {
            n,
            token: token[..8].to_string(),
        });
        // The job, cancelled at once (at its next `.await`) if the term ends. A quit request
        // lets it finish: resigning is graceful.
        tokio::select! {
            biased;
            () = term_ended(&mut role, token, &mut reported) => {
                say(Msg::Aborted(n));
                return Stop::Lost;
            }
            () = nightly_job() => say(Msg::Done(n)),
        }
        next_job += JOB_EVERY;
    }
    unreachable!("jobs are numbered until u64::MAX")
}

/// The work itself. A real job should also check `leading()` before each side effect, or better,
/// pass the term's token along as a fencing token that the system it writes to checks: a
/// process that freezes (GC, SIGSTOP) between a check and a write could otherwise write late.
async fn nightly_job() {
    tokio::time::sleep(JOB_WORK).await;
}

/// Whether the term with this token is ours right now, within its validity.
fn leading(election: &Election, token: &str) -> bool {
    let role = election.role();
    // `Role::is_leader` (like `Election::is_leader`) checks the clock against the validity.
    role.is_leader() && role.term().is_some_and(|t| t.token == token)
}

/// Resolves when the term with this token ends: the role turns Follower (or a new term), or the
/// term's validity passes before an extension arrives. Reports each extension to the parent
/// (`reported`: the validity it knows of). Cancellation: safe (it only observes).
async fn term_ended(role: &mut watch::Receiver<Role>, token: &str, reported: &mut Instant) {
    loop {
        let valid_until = {
            let r = role.borrow_and_update();
            match r.term() {
                Some(t) if t.token == token && r.is_leader() => t.valid_until,
                _ => return,
            }
        };
        if valid_until != *reported {
            *reported = valid_until;
            say(Msg::Valid(left(valid_until)));
        }
        tokio::select! {
            () = tokio::time::sleep_until(valid_until) => {}
            changed = role.changed() => {
                if changed.is_err() {
                    return; // the campaign ended
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent: nodes, header, workers, the scenario, the verdict.

/// Prints a paragraph indented by two spaces, wrapped at 96 columns.
fn print_wrapped(text: &str) {
    let mut line = String::from(" ");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 96 {
            println!("{line}");
            line = String::from(" ");
        }
        line.push(' ');
        line.push_str(word);
    }
    println!("{line}");
}

async fn parent() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<ExitCode, BoxError> {
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
    // The parent takes no part in the election: it only looks at the nodes.
    let redlock = Redlock::builder().nodes(urls.clone()).build().await?;
    let before = redlock.inspect(RESOURCE).await?;
    print_header(&redlock, &before, local.is_some());
    check_nodes(&redlock, &before)?;

    let mut p = Parent::spawn(&urls)?;
    println!("starting {WORKERS} scheduler processes...");
    p.start().await?;
    println!("all {WORKERS} connected; go! (t = time since this moment, on the parent's clock)");
    println!();
    if let Err(problem) = p.scenario().await {
        p.line(Instant::now(), "parent", format!("GIVING UP: {problem}"));
        p.problems.push(problem);
    }
    p.shutdown().await;

    let after = redlock.inspect(RESOURCE).await?;
    Ok(p.report(&after))
}

fn print_header(redlock: &Redlock, before: &Inspection, local: bool) {
    println!(
        "fredlock demo: leader election for a scheduler, {WORKERS} processes, one leader at a time"
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
    println!("  nodes     {}", nodes.join("  "));
    if local {
        println!(
            "            {} local redis-server processes started for this run (set {NODES_ENV} to use yours)",
            nodes.len()
        );
    } else {
        println!("            from {NODES_ENV}");
    }
    println!(
        "  election  resource {RESOURCE:?} = key {:?} on every node",
        redlock.key(RESOURCE)
    );
    println!(
        "            the leader holds a lock of TTL {:.1} s (granted by {} of {} nodes), kept alive while it leads",
        TTL.as_secs_f64(),
        redlock.quorum(),
        nodes.len(),
    );
    println!(
        "            followers try again every {}-{} ms",
        RETRY.delay.as_millis(),
        (RETRY.delay + RETRY.jitter).as_millis()
    );
    println!(
        "  leader    starts a job every {:.0} s (each takes {:.1} s), only while election.is_leader()",
        JOB_EVERY.as_secs_f64(),
        JOB_WORK.as_secs_f64()
    );
    println!("  plan      1. let the first leader start {JOBS_BEFORE_CRASH} jobs");
    println!("            2. kill it with SIGKILL: a crash, it cannot resign, its lock stays until its TTL ends");
    println!("            3. let another process take over and finish {JOBS_AFTER_TAKEOVER} jobs");
    println!(
        "            4. ask everyone to resign; check that there was never more than one leader"
    );
    println!();
}

/// Fails early, with a hint, when the nodes cannot run the demo; mentions a lock left held.
fn check_nodes(redlock: &Redlock, before: &Inspection) -> Result<(), BoxError> {
    let answering = before.nodes.iter().filter(|n| n.state.is_ok()).count();
    if answering < redlock.quorum() {
        return Err(format!(
            "only {answering} of {} nodes answer, fewer than the {} an election needs: is Redis \
             running there? (`docker compose up -d` starts the project's three nodes)",
            before.nodes.len(),
            redlock.quorum()
        )
        .into());
    }
    if let Some(token) = before.holder() {
        // Typically left by an earlier run whose leader was killed.
        let left = before.remaining(token).unwrap_or(TTL);
        println!(
            "note: the election's lock is held right now (by an earlier run?); nobody can lead for \
             the {:.1} s it has left\n",
            left.as_secs_f64()
        );
    }
    Ok(())
}

/// A line from a worker, or the end of its stdout.
enum Event {
    Msg(Msg),
    Other(String),
    Closed,
}

/// An event, with when the parent received it.
struct Received {
    at: Instant,
    worker: usize,
    event: Event,
}

/// How a leader term ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    /// Leadership lost while running.
    Lost,
    /// Stepped down to resign, when asked.
    Resigned,
    /// Killed by the parent (SIGKILL).
    Killed,
    /// The process went away on its own.
    Vanished,
}

/// One leader term, as the parent saw it.
struct TermLog {
    worker: usize,
    token: String,
    start: Instant,
    /// The term's validity, on the parent's clock: arrival of the last `@leader`/`@valid` line
    /// plus the validity it reported (so, if anything, a little late: on the safe side).
    valid_until: Instant,
    /// When that last report came, roughly when the lock was last acquired or extended.
    renewed_at: Instant,
    end: Option<(Instant, Ended)>,
    jobs_started: u64,
    jobs_done: u64,
    first_job: Option<Instant>,
}

impl TermLog {
    /// Until when no one else may lead: the end of the term, except for a leader that crashed,
    /// whose lock stayed valid on the nodes after it died.
    fn exclusive_until(&self, run_end: Instant) -> Instant {
        match self.end {
            Some((at, Ended::Killed | Ended::Vanished)) => at.max(self.valid_until),
            Some((at, _)) => at,
            None => run_end,
        }
    }
}

/// The parent's side of the run: the worker processes, and what their reports say.
struct Parent {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    events: mpsc::UnboundedReceiver<Received>,
    /// t = 0: when the workers were told to start.
    start: Instant,
    terms: Vec<TermLog>,
    /// Per worker: the index in `terms` of its open term, if it leads.
    open: Vec<Option<usize>>,
    /// Per worker: stdout closed (the process ended or is about to).
    gone: Vec<bool>,
    resigned: Vec<bool>,
    asked_to_quit: Vec<bool>,
    /// The worker killed, and when.
    killed: Option<(usize, Instant)>,
    /// A timeline line to print at a given time: when the crashed leader's lock runs out.
    expiry_notice: Option<(Instant, String)>,
    /// The run did not go as planned.
    problems: Vec<String>,
    /// Leadership was violated (a job outside a term).
    violations: Vec<String>,
}

impl Parent {
    /// Starts the workers: copies of this program, with the nodes in their environment.
    fn spawn(urls: &[String]) -> Result<Parent, BoxError> {
        let exe = std::env::current_exe()?;
        let (tx, events) = mpsc::unbounded_channel();
        let mut children = Vec::with_capacity(WORKERS);
        let mut stdins = Vec::with_capacity(WORKERS);
        for id in 0..WORKERS {
            let mut child = Command::new(&exe)
                .arg("--worker")
                .arg(id.to_string())
                .env(NODES_ENV, urls.join(","))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                // If we return early (an error, Ctrl-C), no worker is left running.
                .kill_on_drop(true)
                .spawn()?;
            stdins.push(child.stdin.take());
            let stdout = child.stdout.take().ok_or("worker stdout not captured")?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    // The timestamp is taken here, as the line arrives: one clock for all.
                    let at = Instant::now();
                    let event = Msg::parse(&line).map_or(Event::Other(line), Event::Msg);
                    let _ = tx.send(Received {
                        at,
                        worker: id,
                        event,
                    });
                }
                let at = Instant::now();
                let _ = tx.send(Received {
                    at,
                    worker: id,
                    event: Event::Closed,
                });
            });
            children.push(child);
        }
        Ok(Parent {
            children,
            stdins,
            events,
            start: Instant::now(),
            terms: Vec::new(),
            open: vec![None; WORKERS],
            gone: vec![false; WORKERS],
            resigned: vec![false; WORKERS],
            asked_to_quit: vec![false; WORKERS],
            killed: None,
            expiry_notice: None,
            problems: Vec::new(),
            violations: Vec::new(),
        })
    }

    /// Waits until every worker is connected, then starts them all at once.
    async fn start(&mut self) -> Result<(), BoxError> {
        let limit = Instant::now() + Duration::from_secs(30);
        let mut ready = 0;
        while ready < WORKERS {
            match tokio::time::timeout_at(limit, self.events.recv()).await {
                Ok(Some(Received {
                    event: Event::Msg(Msg::Ready),
                    ..
                })) => ready += 1,
                Ok(Some(Received {
                    worker,
                    event: Event::Other(line),
                    ..
                })) => println!("  [worker {worker}] {line}"),
                Ok(Some(Received { worker, .. })) => {
                    return Err(format!("worker {worker} failed before the start").into())
                }
                Ok(None) => return Err("every worker went away".into()),
                Err(_) => return Err("workers not connected after 30 s".into()),
            }
        }
        self.start = Instant::now();
        for stdin in self.stdins.iter_mut().flatten() {
            stdin.write_all(format!("{GO}\n").as_bytes()).await?;
        }
        Ok(())
    }

    /// The plan: a leader, a crash, a takeover.
    async fn scenario(&mut self) -> Result<(), String> {
        let limit = self.start + FIRST_LEADER_LIMIT;
        let first_jobs = |p: &Parent| {
            p.leader()
                .is_some_and(|t| t.jobs_started >= JOBS_BEFORE_CRASH)
        };
        if !self.until(limit, first_jobs).await {
            return Err(format!(
                "no leader started {JOBS_BEFORE_CRASH} jobs within {} s",
                FIRST_LEADER_LIMIT.as_secs()
            ));
        }
        let victim = self.leader().map(|t| t.worker).expect("a leader");
        let killed_at = self.crash(victim).await?;

        let taken_over = |p: &Parent| p.leader().is_some_and(|t| t.worker != victim);
        if !self.until(killed_at + TAKEOVER_LIMIT, taken_over).await {
            return Err(format!(
                "nobody took over within {} s of the crash",
                TAKEOVER_LIMIT.as_secs()
            ));
        }
        let jobs_done = |p: &Parent| {
            p.leader()
                .is_some_and(|t| t.jobs_done >= JOBS_AFTER_TAKEOVER)
        };
        if !self.until(Instant::now() + STEP_LIMIT, jobs_done).await {
            return Err(format!(
                "the new leader did not finish {JOBS_AFTER_TAKEOVER} jobs within {} s",
                STEP_LIMIT.as_secs()
            ));
        }
        Ok(())
    }

    /// Kills worker `w` with SIGKILL: no signal handler, no destructor, no resign runs in it.
    async fn crash(&mut self, w: usize) -> Result<Instant, String> {
        // tokio's `start_kill` is `std::process::Child::kill`: SIGKILL on Unix.
        self.children[w]
            .start_kill()
            .map_err(|e| format!("killing worker {w}: {e}"))?;
        let at = Instant::now();
        self.killed = Some((w, at));
        let during = self.open[w]
            .map(|i| &self.terms[i])
            .filter(|t| t.jobs_started > t.jobs_done)
            .map(|t| format!(" during job {}", t.jobs_started))
            .unwrap_or_default();
        self.line(
            at,
            "parent",
            format!("KILLED worker {w} (SIGKILL){during}: a crash, no resign, its lock stays on the nodes"),
        );
        // Reap it. Its last lines, and then the end of its stdout, still come through `events`.
        let _ = self.children[w].wait().await;
        Ok(at)
    }

    /// Asks the remaining workers to resign and waits until they have exited: followers first,
    /// so that leadership does not hop to one of them during the shutdown, then the leader.
    async fn shutdown(&mut self) {
        let leader = self.leader().map(|t| t.worker);
        let remaining: Vec<usize> = (0..WORKERS)
            .filter(|&w| !self.gone[w] && self.killed.map(|k| k.0) != Some(w))
            .collect();
        let followers: Vec<usize> = remaining
            .iter()
            .copied()
            .filter(|&w| Some(w) != leader)
            .collect();
        let leaders: Vec<usize> = remaining
            .iter()
            .copied()
            .filter(|&w| Some(w) == leader)
            .collect();
        for (group, what) in [(followers, "follower"), (leaders, "leader")] {
            if group.is_empty() {
                continue;
            }
            let names: Vec<String> = group.iter().map(|w| format!("worker {w}")).collect();
            let whom = format!(
                "{} ({what}{})",
                names.join(" and "),
                if group.len() > 1 { "s" } else { "" }
            );
            self.line(
                Instant::now(),
                "parent",
                format!("asked {whom} to resign (\"{QUIT}\" on stdin)"),
            );
            for &w in &group {
                self.asked_to_quit[w] = true;
                if let Some(mut stdin) = self.stdins[w].take() {
                    // An error means it is gone already; its end of stdout tells us the rest.
                    let _ = stdin.write_all(format!("{QUIT}\n").as_bytes()).await;
                    // Dropping stdin closes it.
                }
            }
            let all_gone = |p: &Parent| group.iter().all(|&w| p.gone[w]);
            if !self.until(Instant::now() + STEP_LIMIT, all_gone).await {
                self.problems.push(format!(
                    "{whom} did not exit within {} s of being asked to resign",
                    STEP_LIMIT.as_secs()
                ));
            }
        }
        // Collect exit statuses (killing anyone still running). Any events left are applied.
        for w in 0..WORKERS {
            if self.killed.map(|k| k.0) == Some(w) {
                continue;
            }
            let child = &mut self.children[w];
            let status = match tokio::time::timeout(STEP_LIMIT, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => self.problems.push(format!("worker {w} exited with {s}")),
                Err(e) => self.problems.push(format!("worker {w}: {e}")),
            }
        }
        let limit = Instant::now() + STEP_LIMIT;
        let drained = |p: &Parent| p.gone.iter().all(|&g| g);
        self.until(limit, drained).await;
    }

    /// The open term of a live worker: the current leader, as far as the reports go.
    fn leader(&self) -> Option<&TermLog> {
        (0..WORKERS)
            .filter(|&w| self.killed.map(|k| k.0) != Some(w))
            .filter_map(|w| self.open[w].map(|i| &self.terms[i]))
            .max_by_key(|t| t.start)
    }

    /// Handles events until `done` is true (returns true) or `limit` passes (returns false).
    async fn until(&mut self, limit: Instant, done: impl Fn(&Parent) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            let notice_at = self.expiry_notice.as_ref().map(|n| n.0);
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(event) => self.apply(event),
                    None => return done(self),
                },
                () = tokio::time::sleep_until(notice_at.unwrap_or(limit)), if notice_at.is_some() => {
                    self.print_notice(Instant::now());
                }
                () = tokio::time::sleep_until(limit) => return false,
            }
        }
    }

    /// Prints the pending notice if its time has come by `now`.
    fn print_notice(&mut self, now: Instant) {
        if let Some((at, text)) = self.expiry_notice.take_if(|n| n.0 <= now) {
            self.line(at, "lock", text);
        }
    }

    /// One timeline line.
    fn line(&self, at: Instant, who: &str, what: impl fmt::Display) {
        println!("  {:<10} {who:<9} {what}", self.t(at));
    }

    fn t(&self, at: Instant) -> String {
        format!(
            "t=+{:.3}s",
            at.saturating_duration_since(self.start).as_secs_f64()
        )
    }

    /// Updates what we know from one worker report, and prints it.
    fn apply(&mut self, r: Received) {
        let (w, at) = (r.worker, r.at);
        self.print_notice(at);
        let who = format!("worker {w}");
        let msg = match r.event {
            Event::Msg(msg) => msg,
            Event::Other(line) => return self.line(at, &who, format!("| {line}")),
            Event::Closed => return self.closed(w, at),
        };
        match msg {
            Msg::Ready => {}
            Msg::Leader { token, valid } => {
                if let Some(i) = self.open[w] {
                    // Should not happen: the worker reports Follower first.
                    self.problems.push(format!(
                        "worker {w} reported a new term without ending its last"
                    ));
                    self.terms[i].end = Some((at, Ended::Lost));
                }
                self.line(
                    at,
                    &who,
                    format!("became LEADER (token {}..)", &token[..8.min(token.len())]),
                );
                // The full check comes at the end; flag an overlap right away too.
                for t in &self.terms {
                    if t.worker != w && (t.end.is_none() || t.exclusive_until(at) > at) {
                        let what = format!("!! while worker {} is still leader", t.worker);
                        self.line(at, &who, what);
                    }
                }
                self.open[w] = Some(self.terms.len());
                self.terms.push(TermLog {
                    worker: w,
                    token,
                    start: at,
                    valid_until: at + valid,
                    renewed_at: at,
                    end: None,
                    jobs_started: 0,
                    jobs_done: 0,
                    first_job: None,
                });
            }
            Msg::Valid(valid) => {
                if let Some(i) = self.open[w] {
                    self.terms[i].valid_until = at + valid;
                    self.terms[i].renewed_at = at;
                }
            }
            Msg::Job { n, token } => {
                match self.open[w].map(|i| &mut self.terms[i]) {
                    Some(t) if t.token.starts_with(&token) => {
                        t.jobs_started += 1;
                        t.first_job.get_or_insert(at);
                    }
                    _ => self.violations.push(format!(
                        "worker {w} started job {n} at {} outside a term it had reported",
                        self.t(at)
                    )),
                }
                self.line(at, &who, format!("job {n} started (token {token}..)"));
            }
            Msg::Done(n) => {
                if let Some(i) = self.open[w] {
                    self.terms[i].jobs_done += 1;
                }
                self.line(at, &who, format!("job {n} done"));
            }
            Msg::Aborted(n) => self.line(at, &who, format!("job {n} CANCELLED: leadership lost")),
            Msg::Follower => {
                let how = if self.asked_to_quit[w] {
                    Ended::Resigned
                } else {
                    Ended::Lost
                };
                if let Some(i) = self.open[w].take() {
                    self.terms[i].end = Some((at, how));
                }
                let what = match how {
                    Ended::Resigned => "steps down, to resign",
                    _ => "LOST leadership: stopped acting as leader",
                };
                self.line(at, &who, what);
            }
            Msg::Resigned => {
                self.resigned[w] = true;
                self.line(at, &who, "resigned and exits");
            }
        }
    }

    /// The end of a worker's stdout: it exited (or was killed).
    fn closed(&mut self, w: usize, at: Instant) {
        self.gone[w] = true;
        let term = self.open[w].take();
        match self.killed {
            Some((k, killed_at)) if k == w => {
                // Its term ends at the kill; its lock lives on until its validity runs out.
                if let Some(i) = term {
                    self.terms[i].end = Some((killed_at, Ended::Killed));
                    let (renewed_at, valid_until) =
                        (self.terms[i].renewed_at, self.terms[i].valid_until);
                    let text = format!(
                        "worker {w}'s lock runs out: one TTL after its last extension at {}, less the drift margin",
                        self.t(renewed_at)
                    );
                    self.expiry_notice = Some((valid_until, text));
                }
            }
            _ if !self.resigned[w] => {
                if let Some(i) = term {
                    self.terms[i].end = Some((at, Ended::Vanished));
                }
                self.problems
                    .push(format!("worker {w} exited without resigning"));
                self.line(at, &format!("worker {w}"), "EXITED without resigning");
            }
            _ => {}
        }
    }

    /// The summary, the verdict and the exit code.
    fn report(mut self, after: &Inspection) -> ExitCode {
        let run_end = Instant::now();
        println!();
        println!("leader terms (on the parent's clock)");
        for t in &self.terms {
            let (end, how) = match t.end {
                Some((at, Ended::Killed)) => (
                    self.t(at),
                    format!(
                        "killed; its lock stayed valid until {}",
                        self.t(t.valid_until)
                    ),
                ),
                Some((at, Ended::Resigned)) => (self.t(at), "resigned".to_string()),
                Some((at, Ended::Lost)) => (self.t(at), "lost leadership".to_string()),
                Some((at, Ended::Vanished)) => (self.t(at), "the process vanished".to_string()),
                None => (
                    "(no end)".to_string(),
                    "never reported stepping down".to_string(),
                ),
            };
            println!(
                "  worker {}  {} .. {end:<10}  jobs: {} started, {} done;  {how}",
                t.worker,
                self.t(t.start),
                t.jobs_started,
                t.jobs_done
            );
        }

        // Safety: every term starts after every earlier one ended, counting a crashed leader's
        // term until its lock's validity ran out.
        let mut sorted: Vec<&TermLog> = self.terms.iter().collect();
        sorted.sort_by_key(|t| t.start);
        for (i, b) in sorted.iter().enumerate() {
            for a in &sorted[..i] {
                let until = a.exclusive_until(run_end);
                if b.start < until {
                    self.violations.push(format!(
                        "worker {} became leader at {} while worker {}'s term lasted until {}",
                        b.worker,
                        self.t(b.start),
                        a.worker,
                        self.t(until)
                    ));
                }
            }
        }

        // The failover.
        let bound = TTL + RETRY.delay + RETRY.jitter;
        let mut takeover = None;
        if let Some((victim, killed_at)) = self.killed {
            let crashed = self
                .terms
                .iter()
                .find(|t| t.worker == victim && t.end.is_some_and(|e| e.1 == Ended::Killed));
            let heir = sorted
                .iter()
                .find(|t| t.worker != victim && t.start >= killed_at);
            println!();
            println!(
                "failover after the crash of worker {victim} at {}",
                self.t(killed_at)
            );
            match heir {
                Some(heir) => {
                    let elected = heir.start - killed_at;
                    takeover = Some(elected);
                    println!(
                        "  {:<28}{:.3} s",
                        format!("kill -> worker {} elected", heir.worker),
                        elected.as_secs_f64()
                    );
                    if let Some(first) = heir.first_job {
                        println!(
                            "  {:<28}{:.3} s",
                            "kill -> its first job",
                            (first - killed_at).as_secs_f64()
                        );
                    }
                    let verdict = if elected <= bound {
                        "within it".to_string()
                    } else {
                        format!(
                            "{} ms over it (a busy machine?)",
                            (elected - bound).as_millis()
                        )
                    };
                    println!(
                        "  {:<28}{:.3} s = TTL {:.3} s + longest retry pause {:.3} s: {verdict}",
                        "bound",
                        bound.as_secs_f64(),
                        TTL.as_secs_f64(),
                        (RETRY.delay + RETRY.jitter).as_secs_f64(),
                    );
                    if let Some(c) = crashed {
                        println!();
                        print_wrapped(&format!(
                            "Why not sooner? The crashed leader's lock expired after its TTL; nobody could \
                             take over earlier: that is the safety. Its last extension was at {}, so at the \
                             kill the lock still had {:.3} s of validity (until {}). Worker {} won {:.3} s \
                             after that, at its next campaign attempt (followers try every {}-{} ms). A \
                             leader that resigns releases its lock instead, and the next attempt wins at once.",
                            self.t(c.renewed_at),
                            c.valid_until.saturating_duration_since(killed_at).as_secs_f64(),
                            self.t(c.valid_until),
                            heir.worker,
                            heir.start.saturating_duration_since(c.valid_until).as_secs_f64(),
                            RETRY.delay.as_millis(),
                            (RETRY.delay + RETRY.jitter).as_millis()
                        ));
                    }
                }
                None => println!("  nobody took over"),
            }
        }

        println!();
        let holders = after
            .nodes
            .iter()
            .filter(|n| matches!(n.state, Ok(Some(_))))
            .count();
        if holders == 0 {
            println!("after the run: the election's lock is free on every node that answers");
        } else {
            println!("after the run: the election's lock is still on {holders} node(s), until its TTL runs out");
        }

        if !self.violations.is_empty() {
            for v in &self.violations {
                println!("VIOLATION: {v}");
            }
            println!("verdict: FAILED: more than one leader at a time");
            return ExitCode::FAILURE;
        }
        if !self.problems.is_empty() {
            println!("verdict: the run FAILED: {}", self.problems.join("; "));
            return ExitCode::from(2);
        }
        let takeover = takeover.map_or(String::new(), |d| {
            format!("; takeover {:.2} s after the crash", d.as_secs_f64())
        });
        println!(
            "verdict: OK: never two leaders at once ({} terms, no overlap, the crashed one counted \
             until its lock ran out){takeover}",
            self.terms.len()
        );
        ExitCode::SUCCESS
    }
}
