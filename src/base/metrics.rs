//! Counters and histograms through the [`metrics`](https://docs.rs/metrics) facade, with the
//! `metrics` feature; without it every function here is an empty inline function. Names and
//! labels (all label values are fixed words, except `node`, which is the node's name without
//! credentials, as in errors):
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `fredlock_acquire_attempts_total` | counter | | attempts (rounds of `SET`s), retries included |
//! | `fredlock_acquire_total` | counter | `outcome` | acquire calls (locks and semaphore permits) by outcome: `granted`, `contended`, `unavailable`, `expired` (validity used up), `invalid` (rejected input), `closed` (ended by `Redlock::close`) |
//! | `fredlock_acquire_seconds` | histogram | `outcome` | time from the call to its outcome, retries and waiting included |
//! | `fredlock_hold_seconds` | histogram | | from the grant to the release (`release()`, or a drop) |
//! | `fredlock_extensions_total` | counter | `outcome` | extensions (by hand and keep-alive): `ok`, `failed` |
//! | `fredlock_repairs_total` | counter | `outcome` | keys of a held lock re-set on a node that had lost them, after an extension won on a quorum: `set`, `refused` (another value there), `failed` |
//! | `fredlock_lost_total` | counter | `reason` | kept-alive locks lost: `token_gone`, `expired`, `budget_exhausted`, `task_ended` |
//! | `fredlock_node_failures_total` | counter | `node`, `kind` | per-node failures in lock rounds: `timeout`, `connection`, `server`, `unexpected_reply`, `auth`, `tls`, `client` (a duplicate server is not a failure and not counted) |
//! | `fredlock_waiters` | gauge | | acquires of this process waiting for their turn in a wait line |
//! | `fredlock_node_usable` | gauge | `node` | 1 while the node's votes count (connected, identified, accepting our credentials), 0 while they do not (down, refusing connections or credentials, or the same server as another entry); sum it for the usable nodes |
//! | `fredlock_election_leader` | gauge | `election` | 1 while this process leads the election, else 0 |
//! | `fredlock_election_terms_total` | counter | `election` | terms this process began (became leader) |
//! | `fredlock_election_term_ends_total` | counter | `election`, `reason` | terms of this process that ended: `resigned`, `stepped_down` (`Election::step_down`), `yielded` (to a preferred candidate), `lost` |
//! | `fredlock_election_handover_seconds` | histogram | `election` | from the start of the attempt that won this process its term (for a candidate woken in line, its wake-up: the leader's release) to the term beginning |
//!
//! Owns: the names and labels. Must not: decide anything (it only observes).

use std::time::Duration;

use crate::base::error::{LostReason, NodeErrorKind, Vote};

/// One acquire attempt started.
#[inline]
pub(crate) fn attempt() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fredlock_acquire_attempts_total").increment(1);
}

/// An acquire call ended with `outcome` after `elapsed`.
#[inline]
pub(crate) fn acquired(outcome: &'static str, elapsed: Duration) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!("fredlock_acquire_total", "outcome" => outcome).increment(1);
        ::metrics::histogram!("fredlock_acquire_seconds", "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, elapsed);
}

/// A lock was released (or dropped) `held` after its grant.
#[inline]
pub(crate) fn held(held: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("fredlock_hold_seconds").record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = held;
}

/// An extension ended.
#[inline]
pub(crate) fn extension(ok: bool) {
    #[cfg(feature = "metrics")]
    {
        let outcome = if ok { "ok" } else { "failed" };
        ::metrics::counter!("fredlock_extensions_total", "outcome" => outcome).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = ok;
}

/// A held lock's repair on one node ended with `vote`.
#[inline]
pub(crate) fn repair(vote: &Vote) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match vote {
            Vote::Granted => "set",
            Vote::Refused => "refused",
            Vote::Failed(_) | Vote::Pending => "failed",
        };
        ::metrics::counter!("fredlock_repairs_total", "outcome" => outcome).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = vote;
}

/// A kept-alive lock was lost (a release on purpose is not counted).
#[inline]
pub(crate) fn lost(reason: LostReason) {
    let reason = match reason {
        LostReason::TokenGone => "token_gone",
        LostReason::Expired => "expired",
        LostReason::BudgetExhausted => "budget_exhausted",
        LostReason::TaskEnded => "task_ended",
        LostReason::Released | LostReason::Closed => return,
    };
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fredlock_lost_total", "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// The failed votes of one round, by node and kind.
#[inline]
pub(crate) fn failures(votes: &[Vote]) {
    #[cfg(feature = "metrics")]
    for vote in votes {
        if let Vote::Failed(e) = vote {
            if let Some(kind) = kind_label(e.kind) {
                ::metrics::counter!("fredlock_node_failures_total", "node" => e.node.clone(), "kind" => kind)
                    .increment(1);
            }
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = votes;
}

/// The `kind` label of a node failure; `None` for a duplicate (not a failure).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind_label(kind: NodeErrorKind) -> Option<&'static str> {
    Some(match kind {
        NodeErrorKind::Timeout => "timeout",
        NodeErrorKind::Connection => "connection",
        NodeErrorKind::Server => "server",
        NodeErrorKind::UnexpectedReply => "unexpected_reply",
        NodeErrorKind::Auth => "auth",
        NodeErrorKind::Tls => "tls",
        NodeErrorKind::Client => "client",
        NodeErrorKind::Permission => "permission",
        NodeErrorKind::Unconfirmed => "unconfirmed",
        NodeErrorKind::Duplicate => return None,
    })
}

/// The number of waiting acquires changed by `delta`.
#[inline]
pub(crate) fn waiters(delta: f64) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("fredlock_waiters").increment(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = delta;
}

/// Whether node `node`'s votes count now (set once per change).
#[inline]
pub(crate) fn node_usable(node: &str, usable: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!("fredlock_node_usable", "node" => node.to_string()).set(if usable {
        1.0
    } else {
        0.0
    });
    #[cfg(not(feature = "metrics"))]
    let _ = (node, usable);
}

/// This process began (`true`) or ended a term of `election`.
#[inline]
pub(crate) fn leading(election: &str, leads: bool) {
    #[cfg(feature = "metrics")]
    {
        let e = election.to_string();
        ::metrics::gauge!("fredlock_election_leader", "election" => e.clone()).set(if leads {
            1.0
        } else {
            0.0
        });
        if leads {
            ::metrics::counter!("fredlock_election_terms_total", "election" => e).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (election, leads);
}

/// A term of `election` of this process ended, for `reason` (`resigned`, `stepped_down`, `yielded`, `lost`).
#[inline]
pub(crate) fn term_ended(election: &str, reason: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("fredlock_election_term_ends_total", "election" => election.to_string(), "reason" => reason)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (election, reason);
}

/// This process took over `election` `elapsed` after it saw no leader.
#[inline]
pub(crate) fn handover(election: &str, elapsed: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("fredlock_election_handover_seconds", "election" => election.to_string())
        .record(elapsed.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (election, elapsed);
}
