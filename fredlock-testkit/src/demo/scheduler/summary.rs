//! The end of the scheduler demo: the leader terms, the safety check over them, the failover
//! against its bound, the lock's state after the run, and the verdict with its exit code.
//!
//! Owns the summary and the verdict. Must not drive the run (that is `parent.rs`): it reads
//! only what the parent recorded.

use std::process::ExitCode;
use std::time::Duration;

use fredlock::Inspection;
use tokio::time::Instant;

use super::parent::{Ended, Parent, TermLog};

impl Parent {
    /// The summary, the verdict and the exit code.
    pub(super) fn report(mut self, after: &Inspection) -> ExitCode {
        let run_end = Instant::now();
        self.print_terms();
        let mut sorted: Vec<&TermLog> = self.terms.iter().collect();
        sorted.sort_by_key(|t| t.start);
        let overlaps = self.overlaps(&sorted, run_end);
        let takeover = self.print_failover(&sorted);
        self.violations.extend(overlaps);
        print_lock_after(after);
        self.verdict(takeover)
    }

    fn print_terms(&self) {
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
    }

    /// Safety: every term starts after every earlier one ended, counting a crashed leader's
    /// term until its lock's validity ran out. `sorted`: the terms by start.
    fn overlaps(&self, sorted: &[&TermLog], run_end: Instant) -> Vec<String> {
        let mut found = Vec::new();
        for (i, b) in sorted.iter().enumerate() {
            for a in &sorted[..i] {
                let until = a.exclusive_until(run_end);
                if b.start < until {
                    found.push(format!(
                        "worker {} became leader at {} while worker {}'s term lasted until {}",
                        b.worker,
                        self.t(b.start),
                        a.worker,
                        self.t(until)
                    ));
                }
            }
        }
        found
    }

    /// The failover after the crash: who took over, how long after the kill, against the
    /// bound (TTL + the longest retry pause). Returns the time to the heir's election.
    fn print_failover(&self, sorted: &[&TermLog]) -> Option<Duration> {
        let (victim, killed_at) = self.killed?;
        let heir = sorted
            .iter()
            .find(|t| t.worker != victim && t.start >= killed_at);
        println!();
        println!(
            "failover after the crash of worker {victim} at {}",
            self.t(killed_at)
        );
        let Some(heir) = heir else {
            println!("  nobody took over");
            return None;
        };
        let elected = heir.start - killed_at;
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
        self.print_bound(elected);
        let crashed = self
            .terms
            .iter()
            .find(|t| t.worker == victim && t.end.is_some_and(|e| e.1 == Ended::Killed));
        if let Some(crashed) = crashed {
            self.explain_wait(crashed, heir, killed_at);
        }
        Some(elected)
    }

    /// The failover's bound: the TTL plus the longest pause between two campaign attempts.
    fn print_bound(&self, elected: Duration) {
        let (ttl, retry) = (self.demo.ttl, self.demo.retry);
        let bound = ttl + retry.delay + retry.jitter;
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
    }

    /// Why the heir was not elected sooner: the crashed leader's lock had validity left.
    fn explain_wait(&self, crashed: &TermLog, heir: &TermLog, killed_at: Instant) {
        let retry = self.demo.retry;
        println!();
        print_wrapped(&format!(
            "Why not sooner? The crashed leader's lock expired after its TTL; nobody could \
             take over earlier: that is the safety. Its last extension was at {}, so at the \
             kill the lock still had {:.3} s of validity (until {}). Worker {} won {:.3} s \
             after that, at its next campaign attempt (followers try every {}-{} ms). A \
             leader that resigns releases its lock instead, and the next attempt wins at once.",
            self.t(crashed.renewed_at),
            crashed
                .valid_until
                .saturating_duration_since(killed_at)
                .as_secs_f64(),
            self.t(crashed.valid_until),
            heir.worker,
            heir.start
                .saturating_duration_since(crashed.valid_until)
                .as_secs_f64(),
            retry.delay.as_millis(),
            (retry.delay + retry.jitter).as_millis()
        ));
    }

    /// Exit 1 on a violation, 2 when the run did not go as planned, else 0.
    fn verdict(&self, takeover: Option<Duration>) -> ExitCode {
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

/// Whether the election's lock is still on any node after the run.
fn print_lock_after(after: &Inspection) {
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
