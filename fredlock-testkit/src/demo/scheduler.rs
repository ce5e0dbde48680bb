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

use std::fmt;
use std::future::Future;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use fredlock::{Inspection, Redlock, Retry};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{BoxError, Header, Line, Workers, READY};
use crate::TestNodes;

/// Scheduler processes.
const WORKERS: usize = 3;
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
/// Parent -> worker, on the worker's stdin: resign and exit.
const QUIT: &str = "quit";

const USAGE: &str = "\
usage: scheduler

Three scheduler processes elect one leader; only the leader runs the nightly job, once a
second. The demo kills the leader (SIGKILL), shows another process take over once the
crashed leader's lock has expired, and checks that there was never more than one leader.

  FREDLOCK_NODES=redis://h1:p1,redis://h2:p2,...  use these nodes instead of starting
                   three local redis-server processes";

/// What the parent needs to know of the example: its election and its timings.
#[derive(Debug, Clone, Copy)]
pub struct Demo {
    /// The election's resource.
    pub resource: &'static str,
    /// The leader's lock TTL.
    pub ttl: Duration,
    /// The workers' retry policy (how often followers campaign).
    pub retry: Retry,
    /// How often the leader starts a job.
    pub job_every: Duration,
    /// How long a job takes.
    pub job_work: Duration,
}

/// A worker's report to the parent, one line on its stdout ([`say`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// Became leader: the term's lock token, and how much validity the term has left.
    Leader {
        /// The term's lock token.
        token: String,
        /// Validity left.
        valid: Duration,
    },
    /// The term was extended: validity left now. (Not shown; the parent uses it to know until
    /// when a crashed leader's lock stayed valid.)
    Valid(Duration),
    /// Job `n` of this term started, under the term whose token starts with `token`.
    Job {
        /// The job's number in this term.
        n: u64,
        /// The first characters of the term's token.
        token: String,
    },
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

/// Reports `msg` to the parent: one line, flushed at once (the parent timestamps lines as they
/// arrive). A parent that went away is not an error here (stdin closing says to stop).
pub fn say(msg: Msg) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{msg}").and_then(|()| out.flush());
}

/// A worker's orders.
#[derive(Debug, Clone)]
pub struct Worker {
    /// 0, 1, 2.
    pub id: usize,
    /// The nodes' URLs.
    pub nodes: Vec<String>,
}

impl Worker {
    /// Tells the parent this worker is connected and waits until every worker is, so that all
    /// campaign from the same moment. From then on, [`Quit`] says when the parent asks this
    /// worker to resign (or goes away).
    pub async fn wait_for_start(&self) -> Result<Quit, BoxError> {
        let mut stdin = super::wait_for_go().await?;
        let (quit_tx, quit) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdin.next_line().await {
                if line.trim() == QUIT {
                    break;
                }
            }
            let _ = quit_tx.send(true);
        });
        Ok(Quit(quit))
    }
}

/// The parent's request to resign.
#[derive(Debug, Clone)]
pub struct Quit(watch::Receiver<bool>);

impl Quit {
    /// Resolves once the parent asked this worker to resign (or went away). Cancel-safe.
    pub async fn requested(&mut self) {
        let _ = self.0.wait_for(|&q| q).await;
    }
}

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

async fn run(demo: &Demo) -> Result<ExitCode, BoxError> {
    // Keep `nodes` until the end: dropping it stops local redis-server processes.
    let nodes = super::nodes().await?;
    let urls = nodes.urls();
    // The parent takes no part in the election: it only looks at the nodes.
    let redlock = Redlock::builder().nodes(urls.clone()).build().await?;
    let before = redlock.inspect(demo.resource).await?;
    print_header(demo, &redlock, &before, &nodes);
    check_nodes(demo, &redlock, &before)?;

    let mut workers = Workers::spawn(0..WORKERS, &urls, &[])?;
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

/// The parent's side of the run: the worker processes, and what their reports say. Workers are
/// numbered by their index, which is also their id.
struct Parent {
    demo: Demo,
    workers: Workers,
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
    fn new(demo: Demo, workers: Workers, start: Instant) -> Parent {
        Parent {
            demo,
            workers,
            start,
            terms: Vec::new(),
            open: vec![None; WORKERS],
            gone: vec![false; WORKERS],
            resigned: vec![false; WORKERS],
            asked_to_quit: vec![false; WORKERS],
            killed: None,
            expiry_notice: None,
            problems: Vec::new(),
            violations: Vec::new(),
        }
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
        self.workers
            .kill(w)
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
        // Reap it. Its last lines, and then the end of its stdout, still come through `next`.
        let _ = self.workers.wait(w, STEP_LIMIT).await;
        Ok(at)
    }

    /// Asks the remaining workers to resign and waits until they have exited: followers first,
    /// so that leadership does not hop to one of them during the shutdown, then the leader.
    async fn shutdown(&mut self) {
        let leader = self.leader().map(|t| t.worker);
        let remaining: Vec<usize> = (0..WORKERS)
            .filter(|&w| !self.gone[w] && self.killed.map(|k| k.0) != Some(w))
            .collect();
        let (leaders, followers): (Vec<usize>, Vec<usize>) =
            remaining.into_iter().partition(|&w| Some(w) == leader);
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
                self.workers.tell_and_close(w, QUIT).await;
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
            match self.workers.wait(w, STEP_LIMIT).await {
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
                line = self.workers.next() => match line {
                    Some(line) => self.apply(line),
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

    /// Updates what we know from one worker line, and prints it.
    fn apply(&mut self, line: Line) {
        let (w, at) = (line.worker, line.at);
        self.print_notice(at);
        let who = format!("worker {w}");
        let Some(text) = line.text else {
            return self.closed(w, at);
        };
        let Some(msg) = Msg::parse(&text) else {
            if text != READY {
                self.line(at, &who, format!("| {text}"));
            }
            return;
        };
        match msg {
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
        let (ttl, retry) = (self.demo.ttl, self.demo.retry);
        let bound = ttl + retry.delay + retry.jitter;
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
                        ttl.as_secs_f64(),
                        (retry.delay + retry.jitter).as_secs_f64(),
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
                            retry.delay.as_millis(),
                            (retry.delay + retry.jitter).as_millis()
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
