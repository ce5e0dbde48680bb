//! The scheduler demo's parent at run time: the plan (a leader, a crash, a takeover, everyone
//! resigns), the worker processes, and what their report lines say, printed as a timeline.
//!
//! Owns the run's steps and the record of the leader terms. Must not print the summary nor
//! decide the verdict (that is `summary.rs`, from this record).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::super::{Line, Workers, READY};
use super::protocol::{Demo, Msg, QUIT};

/// Scheduler processes.
pub(super) const WORKERS: usize = 3;
/// The parent kills the first leader once it has started this many jobs...
pub(super) const JOBS_BEFORE_CRASH: u64 = 3;
/// ...and asks everyone to resign once the next leader has finished this many.
pub(super) const JOBS_AFTER_TAKEOVER: u64 = 3;
/// Give up when the first leader has not started its jobs this long after the start...
const FIRST_LEADER_LIMIT: Duration = Duration::from_secs(10);
/// ...or nobody took over this long after the crash...
const TAKEOVER_LIMIT: Duration = Duration::from_secs(10);
/// ...or any other step (the new leader's jobs, resigning) takes longer than this.
const STEP_LIMIT: Duration = Duration::from_secs(5);

/// How a leader term ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ended {
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
pub(super) struct TermLog {
    pub(super) worker: usize,
    pub(super) token: String,
    pub(super) start: Instant,
    /// The term's validity, on the parent's clock: arrival of the last `@leader`/`@valid` line
    /// plus the validity it reported (so, if anything, a little late: on the safe side).
    pub(super) valid_until: Instant,
    /// When that last report came, roughly when the lock was last acquired or extended.
    pub(super) renewed_at: Instant,
    pub(super) end: Option<(Instant, Ended)>,
    pub(super) jobs_started: u64,
    pub(super) jobs_done: u64,
    pub(super) first_job: Option<Instant>,
}

impl TermLog {
    /// Until when no one else may lead: the end of the term, except for a leader that crashed,
    /// whose lock stayed valid on the nodes after it died.
    pub(super) fn exclusive_until(&self, run_end: Instant) -> Instant {
        match self.end {
            Some((at, Ended::Killed | Ended::Vanished)) => at.max(self.valid_until),
            Some((at, _)) => at,
            None => run_end,
        }
    }
}

/// The parent's side of the run: the worker processes, and what their reports say. Workers are
/// numbered by their index, which is also their id.
pub(super) struct Parent {
    pub(super) demo: Demo,
    pub(super) workers: Workers,
    /// t = 0: when the workers were told to start.
    pub(super) start: Instant,
    pub(super) terms: Vec<TermLog>,
    /// Per worker: the index in `terms` of its open term, if it leads.
    pub(super) open: Vec<Option<usize>>,
    /// Per worker: stdout closed (the process ended or is about to).
    pub(super) gone: Vec<bool>,
    pub(super) resigned: Vec<bool>,
    pub(super) asked_to_quit: Vec<bool>,
    /// The worker killed, and when.
    pub(super) killed: Option<(usize, Instant)>,
    /// A timeline line to print at a given time: when the crashed leader's lock runs out.
    pub(super) expiry_notice: Option<(Instant, String)>,
    /// The run did not go as planned.
    pub(super) problems: Vec<String>,
    /// Leadership was violated (a job outside a term).
    pub(super) violations: Vec<String>,
}

impl Parent {
    pub(super) fn new(demo: Demo, workers: Workers, start: Instant) -> Parent {
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
    pub(super) async fn scenario(&mut self) -> Result<(), String> {
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
    pub(super) async fn shutdown(&mut self) {
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
    pub(super) fn line(&self, at: Instant, who: &str, what: impl fmt::Display) {
        println!("  {:<10} {who:<9} {what}", self.t(at));
    }

    pub(super) fn t(&self, at: Instant) -> String {
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
            Msg::Leader { token, valid } => self.term_started(w, at, token, valid),
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
                self.line(at, &who, format!("job {n} started (fingerprint {token}..)"));
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

    /// Worker `w` reported that it became leader at `at`, with `valid` of validity left.
    fn term_started(&mut self, w: usize, at: Instant, token: String, valid: Duration) {
        let who = format!("worker {w}");
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
            format!(
                "became LEADER (fingerprint {}..)",
                &token[..8.min(token.len())]
            ),
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
}
