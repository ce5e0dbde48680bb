//! One error type whose variants a caller can act on.
//!
//! The split that matters in production: *someone else holds it* ([`Error::Contended`], retry
//! later), *the Redis fleet is in trouble* ([`Error::Unavailable`], page someone), *the network is
//! too slow for this TTL* ([`Error::ValidityExpired`], raise the TTL), *your lock is gone*
//! ([`Error::NotHeld`], stop the work), and *you passed something wrong* ([`Error::InvalidInput`]).

use std::fmt;
use std::time::Duration;

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
    /// Authentication failed (`NOAUTH`, `WRONGPASS`).
    Auth,
    /// The client refused the command (queue full, client shutting down, ...).
    Client,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}: {}", self.node, self.kind, self.message)
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
}

impl fmt::Display for Votes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} granted, {} refused, {} failed, {} pending",
            self.granted(),
            self.refused(),
            self.failed(),
            self.0.iter().filter(|v| matches!(v, Vote::Pending)).count()
        )
    }
}

/// A caller's input or configuration that fredlock rejects before talking to Redis.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// `build()` was called without any node.
    #[error("no nodes configured")]
    NoNodes,
    /// Two entries point at the same server and database; they would fake a majority.
    #[error("nodes {first} and {second} are the same server ({node}); they would fake a majority")]
    DuplicateNode {
        /// Index of the first entry.
        first: usize,
        /// Index of the repeated entry.
        second: usize,
        /// The node, as `host:port/db`.
        node: String,
    },
    /// A node URL could not be parsed. The URL itself is not repeated (it may hold a password).
    #[error("node {index}: invalid URL: {reason}")]
    InvalidUrl {
        /// Index of the entry.
        index: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// A client passed to `clients()` has no reconnect policy: after one dropped connection every
    /// command on it would hang or fail forever.
    #[error(
        "node {index}: the fred client has no reconnect policy (set one with Builder::set_policy)"
    )]
    NoReconnectPolicy {
        /// Index of the entry.
        index: usize,
    },
    /// An acquire named no resource.
    #[error("no resource given")]
    NoResources,
    /// A resource name was empty.
    #[error("empty resource name")]
    EmptyResource,
    /// A TTL of zero.
    #[error("TTL must be greater than zero")]
    ZeroTtl,
    /// A TTL too large for Redis (milliseconds must fit in a signed 64-bit integer) or for the
    /// monotonic clock.
    #[error("TTL {0:?} is too large")]
    TtlTooLarge(Duration),
    /// A TTL so short that the clock-drift allowance leaves no validity at all.
    #[error("TTL {ttl:?} leaves no validity after the drift allowance {drift:?}")]
    TtlTooShort {
        /// The TTL asked for.
        ttl: Duration,
        /// The drift allowance subtracted from it.
        drift: Duration,
    },
    /// The drift factor must be in `[0, 0.5)` and finite.
    #[error("drift factor {0} is outside [0, 0.5)")]
    DriftFactor(f64),
    /// `Retry::attempts` must be at least 1 (1 = a single try).
    #[error("retry attempts must be at least 1")]
    ZeroAttempts,
    /// Retry delay plus jitter overflowed.
    #[error("retry delay plus jitter is too large")]
    RetryTooLarge,
    /// A per-node timeout of zero.
    #[error("node timeout must be greater than zero")]
    ZeroNodeTimeout,
    /// A keep-alive setting that cannot work (for example an extension interval of zero).
    #[error("invalid keep-alive setting: {0}")]
    KeepAlive(&'static str),
}

/// Everything that can go wrong, split by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another holder kept (enough of) the keys through every attempt. Retry later, or give up.
    #[error("held by someone else after {attempts} attempt(s) ({votes})")]
    Contended {
        /// Attempts made (each attempt counts, 1 = a single try).
        attempts: u32,
        /// Per-node votes of the last attempt.
        votes: Votes,
    },
    /// Too few nodes answered to ever form a quorum. The fleet, or the path to it, is unhealthy.
    #[error("not enough nodes reachable: {reachable} of {nodes} answered, {quorum} needed, after {attempts} attempt(s) ({votes})")]
    Unavailable {
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
    #[error("validity used up during acquisition: {elapsed:?} elapsed of a {ttl:?} TTL, after {attempts} attempt(s)")]
    ValidityExpired {
        /// Attempts made.
        attempts: u32,
        /// Time the last attempt took.
        elapsed: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The lock is no longer held: it expired or was taken over before this extend or release.
    #[error("lock no longer held: {reason}")]
    NotHeld {
        /// Why fredlock concluded this.
        reason: NotHeldReason,
        /// Per-node votes of the extend or release.
        votes: Votes,
    },
    /// A kept-alive lock was lost while work ran under it (see [`crate::Redlock::with_lock`]).
    #[error("lock lost: {reason}")]
    Lost {
        /// Why.
        reason: crate::keepalive::LostReason,
    },
    /// The input or configuration was rejected before anything was sent.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The underlying Redis client failed outside any per-node vote (for example while building).
    #[error("redis: {0}")]
    Redis(NodeError),
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
