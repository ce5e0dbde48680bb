//! What the scheduler demo's workers and its parent share: the example's figures ([`Demo`]),
//! the report lines a worker prints ([`Msg`], [`say`]), a worker's orders ([`Worker`]) and the
//! parent's request to resign ([`Quit`]).
//!
//! Owns the line protocol between the processes. Must not drive the run (that is `parent.rs`)
//! nor judge it (`summary.rs`).

use std::fmt;
use std::io::Write as _;
use std::time::Duration;

use fredlock::Retry;
use tokio::sync::watch;

use super::super::BoxError;

/// Parent -> worker, on the worker's stdin: resign and exit.
pub(super) const QUIT: &str = "quit";

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
    /// Became leader: the term's lock token fingerprint, and how much validity the term has
    /// left.
    Leader {
        /// The fingerprint of the term's lock token (never the token: it is a secret).
        token: String,
        /// Validity left.
        valid: Duration,
    },
    /// The term was extended: validity left now. (Not shown; the parent uses it to know until
    /// when a crashed leader's lock stayed valid.)
    Valid(Duration),
    /// Job `n` of this term started, under the term whose fingerprint starts with `token`.
    Job {
        /// The job's number in this term.
        n: u64,
        /// The first characters of the term's token fingerprint.
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
    pub(super) fn parse(line: &str) -> Option<Msg> {
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
        let mut stdin = super::super::wait_for_go().await?;
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
