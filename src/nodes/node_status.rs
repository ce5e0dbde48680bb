//! What a caller can learn of one node without asking it: [`NodeStatus`], read from what the
//! connect loop already knows (the link, the server's identity, the latest cause of failure,
//! what the user may do there).
//!
//! Why: a node that refuses our credentials, or that is not a Redis server at all, leaves
//! `build()` and every acquire succeeding on the other nodes; the fleet has lost fault tolerance
//! and only a WARN log and a metrics gauge say so. This is the call that lets a program (or
//! `fredlock health`) say it.
//!
//! Owns: the status of a node, and waiting for a node's first connection attempt to end.
//! Must not: send anything to a node, or count nodes against a quorum.

use std::time::Duration;

use crate::base::error::{NodeError, NodeErrorKind};
use crate::nodes::connection::{Link, State};

/// One configured node as fredlock sees it now, from [`Redlock::node_status`].
///
/// A node counts toward the quorum only when `usable`; otherwise `cause` says why, in the
/// server's or the operating system's own words with what to check. Nothing is sent to the
/// node to find this out: it is what the connection already knows (the connection loop
/// reconnects in the background, and a change shows here at once).
///
/// | state | `reachable` | `usable` | `cause` |
/// |---|---|---|---|
/// | connected and identified | true | true | `None` |
/// | first connection attempt not ended yet (`connecting`) | false | false | `Connection`: not connected yet |
/// | refused, reset, unknown host, no answer | false | false | `Connection`, `Timeout`, `Tls` |
/// | the server refuses the credentials | true | false | `Auth`: `WRONGPASS ...` |
/// | the server answers but not in the Redis protocol (an HTTP server) | true | false | `UnexpectedReply` |
/// | no lock can be taken there (no scripts, no `DELIFEQ`) | true | false | `Permission` |
/// | the same server as another entry | true | false | `Duplicate` |
///
/// [`Redlock::node_status`]: crate::Redlock::node_status
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node as `host:port/db` (no credentials), as in
    /// [`Redlock::node_names`](crate::Redlock::node_names).
    pub name: String,
    /// A server answers at this address: connected, or its latest answer was a refusal
    /// (credentials, permissions, a reply that is not Redis's). False while it cannot be
    /// reached at all, and while the first connection attempt has not ended.
    pub reachable: bool,
    /// Its votes count toward the quorum now.
    pub usable: bool,
    /// The first connection attempt has not ended yet (nothing is known; see
    /// [`Redlock::settled_node_status`](crate::Redlock::settled_node_status)).
    pub connecting: bool,
    /// Why the node is not usable (`None` when it is), with its kind and the server's or the
    /// operating system's own words.
    pub cause: Option<NodeError>,
}

/// The status of the node whose connection `state` follows.
pub(crate) fn status(state: &State) -> NodeStatus {
    // Connected but not identified yet (one `INFO`) still counts as the first attempt.
    let connecting = *state.link.borrow() == Link::Connecting && state.cause().is_none();
    let cause = if state.is_closed() {
        Some(NodeError {
            node: state.name.clone(),
            kind: NodeErrorKind::Client,
            message: "closed (Redlock::close was called)".into(),
        })
    } else {
        // Identified once, a node whose connection dropped since does not count either.
        state
            .counts()
            .and_then(|()| state.cause().map_or(Ok(()), Err))
            .err()
            .or_else(|| {
                state.caps.no_lock().map(|message| NodeError {
                    node: state.name.clone(),
                    kind: NodeErrorKind::Permission,
                    message,
                })
            })
    };
    let reachable = match &cause {
        None => true,
        Some(e) => e.kind.answered() || e.kind == NodeErrorKind::Duplicate,
    };
    NodeStatus {
        name: state.name.clone(),
        reachable,
        usable: cause.is_none(),
        connecting: connecting && !state.is_closed(),
        cause,
    }
}

/// Resolves `true` once the node is up, `false` once it refuses our credentials (`NOAUTH`,
/// `WRONGPASS`): retrying does not change that answer, so `build()` need not wait it out.
/// Never resolves while the node is unreachable for any other reason (the caller bounds it).
pub(crate) async fn up_or_refused(state: &State) -> bool {
    let mut link = state.link.subscribe();
    let mut cause = state.cause_changes();
    loop {
        if *link.borrow_and_update() == Link::Up {
            return true;
        }
        if matches!(&*cause.borrow_and_update(), Some((NodeErrorKind::Auth, _))) {
            return false;
        }
        let changed = tokio::select! {
            r = link.changed() => r,
            r = cause.changed() => r,
        };
        if changed.is_err() {
            // The connection is gone: no answer will come.
            return std::future::pending().await;
        }
    }
}

/// Resolves once the node's first connection attempt has ended (connected, or failed with a
/// cause), or at once when it has, or the Redlock is closed; never later than `wait` from now
/// (`Duration::MAX`: no limit).
pub(crate) async fn settled(state: &State, wait: Duration) {
    let mut link = state.link.subscribe();
    let mut cause = state.cause_changes();
    let ended = async {
        loop {
            if !status(state).connecting || state.is_closed() {
                return;
            }
            tokio::select! {
                r = link.changed() => if r.is_err() { return },
                r = cause.changed() => if r.is_err() { return },
                () = state.closed() => return,
            }
        }
    };
    match tokio::time::Instant::now().checked_add(wait) {
        Some(until) => {
            let _ = tokio::time::timeout_at(until, ended).await;
        }
        None => ended.await,
    }
}
