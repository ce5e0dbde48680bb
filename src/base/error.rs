//! One error type whose variants a caller can act on.
//!
//! The split that matters in production: *someone else holds it* ([`Error::Contended`], retry
//! later), *the Redis fleet is in trouble* ([`Error::Unavailable`], page someone), *the network is
//! too slow for this TTL* ([`Error::ValidityExpired`], raise the TTL), *your lock is gone*
//! ([`Error::NotHeld`], stop the work), and *you passed something wrong* ([`Error::InvalidInput`]).
//!
//! Owns: every error type but [`InvalidInput`] (in `invalid`, below), and the plain value types
//! other layers share (`Votes`, `NodeError`, `LostReason`, `Names`). Must not: import anything
//! of this crate but `invalid`.

use std::fmt;
use std::time::Duration;

pub use crate::base::invalid::InvalidInput;

/// What one node answered to one command, when it did not simply do what was asked.
///
/// Shown with the node's address (`host:port/db`), never with credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeError {
    /// The node, as `host:port/db` (no user name or password).
    pub node: String,
    /// What kind of failure this was.
    pub kind: NodeErrorKind,
    /// Details from the client or the server (never credentials).
    pub message: String,
}

/// The kinds of per-node failure, coarse enough to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// The per-node timeout elapsed. The command may still run on the node later: its outcome is
    /// unknown, so fredlock treats it as possibly applied and releases there too.
    Timeout,
    /// The connection is down, was refused, reset or is reconnecting.
    Connection,
    /// The server answered with an error (`WRONGTYPE`, `NOSCRIPT` after a retry, `OOM`, ...).
    Server,
    /// The server answered with something of the wrong shape for the command sent.
    UnexpectedReply,
    /// Authentication failed (`NOAUTH`, `WRONGPASS`, an unknown ACL user). Check the user name
    /// and password in the node's URL.
    Auth,
    /// The TLS handshake failed (certificate not trusted, wrong host name, server without TLS).
    Tls,
    /// The client refused the command (queue full, client shutting down, ...).
    Client,
    /// This entry reaches the same server as an earlier one (same `run_id`), so it is not counted:
    /// one server must never vote twice.
    Duplicate,
    /// The server refused the command to this ACL user (`NOPERM`): a command the user may not
    /// run (a Lua script for a user without `+@scripting`), or a key outside the user's
    /// patterns. The message has the server's words and the fix. Retrying cannot help.
    Permission,
    /// The node granted, but fewer of its replicas than
    /// [`Builder::confirm_replicas`](crate::Builder::confirm_replicas) asks for acknowledged
    /// the write in time (`WAIT`): a failover could lose it, so the vote does not count (and
    /// the key is released there). The message gives the count.
    Unconfirmed,
}

impl NodeErrorKind {
    /// Whether the node answered (with an error): it is reachable, whatever it said. A refusal
    /// of the credentials (`WRONGPASS`) and a reply that is not the Redis protocol are answers.
    pub fn answered(self) -> bool {
        matches!(
            self,
            NodeErrorKind::Server
                | NodeErrorKind::UnexpectedReply
                | NodeErrorKind::Permission
                | NodeErrorKind::Auth
                | NodeErrorKind::Unconfirmed
        )
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.node, self.kind, self.message)
    }
}

impl fmt::Display for NodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeErrorKind::Timeout => "timeout",
            NodeErrorKind::Connection => "connection",
            NodeErrorKind::Server => "server error",
            NodeErrorKind::UnexpectedReply => "unexpected reply",
            NodeErrorKind::Auth => "authentication",
            NodeErrorKind::Tls => "TLS",
            NodeErrorKind::Client => "client",
            NodeErrorKind::Duplicate => "duplicate server",
            NodeErrorKind::Permission => "permission",
            NodeErrorKind::Unconfirmed => "not confirmed by replicas",
        })
    }
}

impl std::error::Error for NodeError {}

/// How each configured node voted in one attempt (acquire or extend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vote {
    /// The node did what was asked (set, extended or released our keys).
    Granted,
    /// The node refused: another value is at (one of) the keys, or, for extend and release, our
    /// token is no longer there.
    Refused,
    /// The node failed or did not answer in time; its outcome is unknown.
    Failed(NodeError),
    /// No answer was needed: the outcome was decided before this node replied. The command was
    /// still sent and is finished in the background.
    Pending,
}

/// Per-node votes of one attempt, in the order the nodes were configured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Votes(pub Vec<Vote>);

impl Votes {
    /// How many nodes granted.
    pub fn granted(&self) -> usize {
        self.0.iter().filter(|v| matches!(v, Vote::Granted)).count()
    }
    /// How many nodes refused (held by another value).
    pub fn refused(&self) -> usize {
        self.0.iter().filter(|v| matches!(v, Vote::Refused)).count()
    }
    /// The per-node failures (errors and timeouts).
    pub fn failures(&self) -> impl Iterator<Item = &NodeError> {
        self.0.iter().filter_map(|v| match v {
            Vote::Failed(e) => Some(e),
            _ => None,
        })
    }
    /// How many nodes failed or timed out.
    pub fn failed(&self) -> usize {
        self.failures().count()
    }
    /// How many nodes answered: granted, refused, or answered with an error (a node that
    /// answered `NOPERM` is reachable).
    pub fn answered(&self) -> usize {
        self.granted() + self.refused() + self.failures().filter(|e| e.kind.answered()).count()
    }
}

impl fmt::Display for Votes {
    /// `2 granted, 0 refused, 1 failed, 0 pending`, then each failed node and its cause:
    /// `; 127.0.0.1:7003/0: connection: Connection refused (os error 111)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} granted, {} refused, {} failed, {} pending",
            self.granted(),
            self.refused(),
            self.failed(),
            self.0.iter().filter(|v| matches!(v, Vote::Pending)).count()
        )?;
        for e in self.failures() {
            write!(f, "; {e}")?;
        }
        Ok(())
    }
}

/// The resource names an error is about, joined for messages: `orders:42` or `a, b`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names(pub Vec<String>);

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

impl From<&[String]> for Names {
    fn from(names: &[String]) -> Self {
        Names(names.to_vec())
    }
}

/// Everything that can go wrong, split by what the caller should do about it.
///
/// Every error about a lock names its resources, and every per-node failure names the node and
/// carries the server's or the operating system's own words (`WRONGPASS ...`, `Connection
/// refused`), never a password.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another holder kept (enough of) the keys through every attempt. Retry later, or give up.
    #[error("lock {resources}: held by {held_by} after {attempts} attempt(s) ({votes})")]
    Contended {
        /// The resources asked for.
        resources: Names,
        /// Who was in the way, as far as the refusals tell: another holder, or, for a
        /// read-write lock, a writer or readers.
        held_by: HeldBy,
        /// Attempts made (each attempt counts, 1 = a single try).
        attempts: u32,
        /// Per-node votes of the last attempt.
        votes: Votes,
    },
    /// Too few nodes answered to ever form a quorum. The fleet, or the path to it, is unhealthy:
    /// the message lists each failed node and its cause. After an extend or a release (see
    /// `round`) it says where the keys were extended or deleted and which nodes did not answer,
    /// and why: an extension that was not confirmed leaves the lock valid until its current
    /// deadline; a release that was not confirmed cannot tell whether someone else held the
    /// lock meanwhile (keys left behind expire with their TTL).
    #[error("{}", unavailable_text(*.round, .resources, *.attempts, (*.nodes, *.quorum, *.reachable), .votes))]
    Unavailable {
        /// The round that failed: an acquire, an extension or a release.
        round: Round,
        /// The resources asked for.
        resources: Names,
        /// Attempts made.
        attempts: u32,
        /// Configured nodes.
        nodes: usize,
        /// The quorum, `nodes / 2 + 1`.
        quorum: usize,
        /// Nodes that answered in the last attempt.
        reachable: usize,
        /// Per-node votes of the last attempt, with each node's error.
        votes: Votes,
    },
    /// A quorum granted, but the time it took left no validity (the TTL is too short for the
    /// network). Everything was released again.
    #[error("lock {resources}: validity used up during acquisition: {elapsed:?} elapsed of a {ttl:?} TTL, after {attempts} attempt(s); raise the TTL")]
    ValidityExpired {
        /// The resources asked for.
        resources: Names,
        /// Attempts made.
        attempts: u32,
        /// Time the last attempt took.
        elapsed: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The lock is no longer held: it expired or was taken over before this extend or release.
    #[error("lock {resources}: no longer held: {reason}{}", held_text(.votes))]
    NotHeld {
        /// The resources of the lock.
        resources: Names,
        /// Why fredlock concluded this.
        reason: NotHeldReason,
        /// Per-node votes of the extend or release.
        votes: Votes,
    },
    /// A kept-alive lock was lost while work ran under it (see [`crate::Redlock::with_lock`]).
    #[error("lock {resources}: lost: {reason}")]
    Lost {
        /// The resources of the lock.
        resources: Names,
        /// Why.
        reason: LostReason,
    },
    /// `build()` in strict mode ([`crate::Builder::require_quorum`]): fewer than a quorum of
    /// nodes connected within `connect_wait`; or, in any mode, so many nodes refused the
    /// credentials (`NOAUTH`, `WRONGPASS`) that no quorum accepts them. Lists each node that
    /// did not connect, with its cause.
    #[error("{connected} of {nodes} nodes connected within {waited:?}, {quorum} needed: {}", join(.failures))]
    Connect {
        /// Configured nodes.
        nodes: usize,
        /// The quorum.
        quorum: usize,
        /// Nodes connected when `build()` gave up.
        connected: usize,
        /// How long `build()` waited.
        waited: Duration,
        /// Each node that did not connect, with its latest cause.
        failures: Vec<NodeError>,
    },
    /// An election participant was asked to act as leader (for example
    /// [`Election::proclaim`](crate::Election::proclaim)) but does not lead: it is a follower,
    /// its term ended, or a later term exists. Wait for [`Election::leader`](crate::Election::leader).
    #[error("election {resource}: this participant does not lead (follower, term ended, or a later term exists); wait until it leads again")]
    NotLeader {
        /// The election.
        resource: String,
    },
    /// So many nodes refuse what this needs to this ACL user ([`NodeErrorKind::Permission`]:
    /// `NOPERM`) that no quorum can ever grant it; returned at once, never retried. Each failure
    /// names the node, has the server's words and the fix: for example a semaphore on nodes
    /// whose user may not run Lua scripts (grant `+@scripting`), or, from `build()`, nodes where
    /// no lock can be taken at all because the user may not run scripts and the server has no
    /// `DELIFEQ` (grant `+@scripting`, or use Valkey >= 9.0 / Redis >= 8.4). Nothing was left
    /// behind on the nodes.
    #[error("{subject}: refused by {} of {nodes} nodes, so no quorum of {quorum} can grant it: {}", .failures.len(), join(.failures))]
    NotPermitted {
        /// What was refused: `lock orders:42`, or `locks` (from `build()`).
        subject: String,
        /// Configured nodes.
        nodes: usize,
        /// The quorum.
        quorum: usize,
        /// Each node that refused, with the server's words and the fix.
        failures: Vec<NodeError>,
    },
    /// The `Redlock` was closed ([`Redlock::close`](crate::Redlock::close), or a shutdown
    /// signal given to [`Redlock::shutdown_on`](crate::Redlock::shutdown_on)): an acquire that
    /// was waiting or asked afterwards is refused, and a lock that `close()` released is not
    /// this handle's to release or extend any more. Nothing is left held: build a new `Redlock`
    /// to lock again.
    #[error("lock {resources}: the Redlock was closed (close() released what it held; build a new Redlock to lock again)")]
    Closed {
        /// The resources asked for or held.
        resources: Names,
    },
    /// The input or configuration was rejected before anything was sent.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
}

/// Who kept an acquire out ([`Error::Contended`]), as far as the nodes' refusals tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldBy {
    /// Another holder of the same lock (a lock, a semaphore's permits, an election's term).
    SomeoneElse,
    /// A read-write lock's write: a writer holds the write lock (readers may hold shares too).
    Writer,
    /// A read-write lock's write: readers hold shares, and no writer. The writer waits for the
    /// shares to be released (or to expire); meanwhile its mark keeps new readers out.
    Readers,
    /// A read-write lock's read share: a writer holds the write lock, or waits for it (new
    /// readers wait behind a waiting writer).
    WriterHoldsOrWaits,
}

impl fmt::Display for HeldBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeldBy::SomeoneElse => "someone else",
            HeldBy::Writer => "a writer",
            HeldBy::Readers => {
                "readers (read shares, no writer: a write waits until they are released or expire)"
            }
            HeldBy::WriterHoldsOrWaits => {
                "a writer, or a writer waiting for it (new readers wait behind a waiting writer)"
            }
        })
    }
}

/// Which round of a lock an [`Error::Unavailable`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Round {
    /// An acquire (or a semaphore permit's).
    Acquire,
    /// An extension (by hand or by the keep-alive).
    Extend,
    /// A release.
    Release,
}

fn unavailable_text(
    round: Round,
    resources: &Names,
    attempts: u32,
    (nodes, quorum, reachable): (usize, usize, usize),
    votes: &Votes,
) -> String {
    match round {
        Round::Acquire => {
            let errors = votes.failures().filter(|e| e.kind.answered()).count();
            let head = if errors == 0 {
                "not enough nodes reachable"
            } else {
                "no quorum"
            };
            format!(
                "lock {resources}: {head}: {reachable} of {nodes} nodes answered, {quorum} {} needed ({}), after {attempts} attempt(s){}",
                if quorum == 1 { "grant" } else { "grants" },
                breakdown(votes, errors),
                causes(votes)
            )
        }
        Round::Extend => format!(
            "lock {resources}: extension not confirmed: {}; {quorum} needed (the lock stays valid until its current deadline: retry, or stop the work by then)",
            tally(votes, "extended", "our token gone")
        ),
        Round::Release => format!(
            "lock {resources}: release not confirmed: {}; {quorum} needed to know that no one else held it meanwhile (keys left behind expire with their TTL)",
            tally(votes, "deleted", "our token gone")
        ),
    }
}

/// Each node counted once: `0 granted, 0 refused, 1 answered with an error, 1 did not
/// answer, 1 not waited for` (the last three only when not zero). The nodes that answered are
/// the granted, the refused and the `errors` that answered with an error.
fn breakdown(votes: &Votes, errors: usize) -> String {
    let mut parts = vec![
        format!("{} granted", votes.granted()),
        format!("{} refused", votes.refused()),
    ];
    let silent = votes.failed() - errors;
    let pending = votes
        .0
        .iter()
        .filter(|v| matches!(v, Vote::Pending))
        .count();
    for (n, what) in [
        (errors, "answered with an error"),
        (silent, "did not answer"),
        (pending, "not waited for"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    parts.join(", ")
}

/// `: node: kind: cause; node: kind: cause` for the failed nodes; empty without one.
fn causes(votes: &Votes) -> String {
    let failed: Vec<String> = votes.failures().map(ToString::to_string).collect();
    if failed.is_empty() {
        return String::new();
    }
    format!(": {}", failed.join("; "))
}

/// ` (our token on 0 of 3 nodes, gone on 3)` for a lock that is no longer held; empty when
/// nothing was sent.
fn held_text(votes: &Votes) -> String {
    if votes.0.is_empty() {
        return String::new();
    }
    format!(" ({})", tally(votes, "our token found", "gone"))
}

/// Where a round on a held lock did what it was asked (`did`), where our token was gone
/// (`gone`), which nodes failed and why, and how many were not waited for.
fn tally(votes: &Votes, did: &str, gone: &str) -> String {
    let mut parts = vec![format!(
        "{did} on {} of {} nodes",
        votes.granted(),
        votes.0.len()
    )];
    if votes.refused() > 0 {
        parts.push(format!("{gone} on {}", votes.refused()));
    }
    let failed: Vec<String> = votes.failures().map(ToString::to_string).collect();
    if !failed.is_empty() {
        parts.push(format!(
            "failed on {} ({})",
            failed.len(),
            failed.join("; ")
        ));
    }
    let pending = votes
        .0
        .iter()
        .filter(|v| matches!(v, Vote::Pending))
        .count();
    if pending > 0 {
        parts.push(format!("{pending} not waited for"));
    }
    parts.join(", ")
}

fn join(failures: &[NodeError]) -> String {
    let v: Vec<String> = failures.iter().map(ToString::to_string).collect();
    v.join("; ")
}

/// [`Error::NotPermitted`] for `subject` when the nodes that refused with
/// [`NodeErrorKind::Permission`] leave fewer than `quorum` of the `votes`' nodes: no retry can
/// succeed.
pub(crate) fn not_permitted(subject: String, votes: &Votes, quorum: usize) -> Option<Error> {
    let failures: Vec<NodeError> = votes
        .failures()
        .filter(|e| e.kind == NodeErrorKind::Permission)
        .cloned()
        .collect();
    let nodes = votes.0.len();
    (nodes.saturating_sub(failures.len()) < quorum).then_some(Error::NotPermitted {
        subject,
        nodes,
        quorum,
        failures,
    })
}

/// Why a kept-alive lock stopped being held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// A quorum of nodes no longer holds our token (it expired there, or someone took it over).
    TokenGone,
    /// The deadline passed without a successful extension (too few nodes reachable in time).
    Expired,
    /// The budget (maximum hold time or number of extensions) ran out, so the lock was left to
    /// expire at its last deadline.
    BudgetExhausted,
    /// The lock was released (or the guard dropped) on purpose; not a failure.
    Released,
    /// The keep-alive task stopped without handing the lock back (it panicked, or the tokio
    /// runtime shut down): the lock is released or left to expire, and counts as lost.
    TaskEnded,
    /// The `Redlock` was closed ([`Redlock::close`](crate::Redlock::close), for example on a
    /// shutdown signal): `close()` released the lock, so the work under it must stop.
    Closed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::TokenGone => "a quorum no longer holds the token",
            LostReason::Expired => "the deadline passed without a successful extension",
            LostReason::BudgetExhausted => "the keep-alive budget ran out",
            LostReason::Released => "released",
            LostReason::TaskEnded => "the keep-alive task ended (panic or runtime shutdown)",
            LostReason::Closed => "the Redlock was closed (shutdown): close() released it",
        })
    }
}

/// Why a lock is considered lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The validity deadline passed before the operation could complete.
    Expired,
    /// Too few nodes still hold our token: it expired there or another holder took it.
    TokenGone,
    /// Too few nodes answered to confirm the operation before the deadline.
    Unconfirmed,
}

impl fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotHeldReason::Expired => "its validity deadline passed",
            NotHeldReason::TokenGone => "a quorum of nodes no longer holds its token",
            NotHeldReason::Unconfirmed => "too few nodes confirmed it in time",
        })
    }
}

/// `Result` with fredlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
