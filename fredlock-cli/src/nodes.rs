//! What `run` and `leader` watch besides their own lock calls, with one cheap round (an
//! inspection of the lock's key) about once a second: whether a quorum of nodes answers at all,
//! and whether our token is still on a quorum (a `break` shows within about a second, instead
//! of at the next extension).

use std::time::Duration;

use fredlock::{Inspection, NodeError, Redlock};
use tokio::time::Instant;

use crate::duration::show;

/// How often the nodes are checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The nodes that did not answer an inspection, with their causes.
pub fn failures(seen: &Inspection) -> Vec<&NodeError> {
    seen.nodes
        .iter()
        .filter_map(|n| n.state.as_ref().err())
        .collect()
}

fn answered(seen: &Inspection) -> usize {
    seen.nodes.len() - failures(seen).len()
}

/// `node: kind: cause; node: kind: cause`, in the server's or the OS's own words.
pub fn causes(failed: &[&NodeError]) -> String {
    let shown: Vec<String> = failed.iter().map(ToString::to_string).collect();
    shown.join("; ")
}

/// Says at once on stderr which nodes do not answer (down, refusing connections, refusing our
/// credentials: NOAUTH, WRONGPASS), so that a fleet that lost its fault tolerance is not
/// silent. Says nothing when no quorum answers: the lock call's own error, or the wait for a
/// quorum ([`no_quorum_for`]), says that.
pub async fn warn_at_start(redlock: &Redlock, name: &str) {
    let Ok(seen) = redlock.inspect(name).await else {
        return;
    };
    let failed = failures(&seen);
    let n = seen.nodes.len();
    let ok = answered(&seen);
    if failed.is_empty() || ok < seen.quorum {
        return;
    }
    for e in &failed {
        eprintln!(
            "fredlock: warning: node {} is not usable: {}: {}",
            e.node, e.kind, e.message
        );
    }
    eprintln!(
        "fredlock: warning: {ok} of {n} nodes usable, {} needed: {} more failure(s) and no lock can be taken",
        seen.quorum,
        ok + 1 - seen.quorum
    );
}

/// Resolves when no quorum of nodes has answered for `bound` (checked every
/// [`CHECK_EVERY`]), with the message to print; never while a quorum answers. Says on stderr
/// at once when a check finds no quorum, with each node's cause.
///
/// `connecting_since`: when fredlock began to connect, for the first call after connecting.
/// If the first check finds no quorum, the bound counts from then: `build()` has waited up to
/// its connect wait (2 s) for a quorum already, and `--no-quorum-timeout 10s` means 10 s in
/// all, not 12. `None`: from the first check that finds no quorum.
pub async fn no_quorum_for(
    redlock: &Redlock,
    name: &str,
    bound: Duration,
    connecting_since: Option<Instant>,
) -> String {
    let mut since: Option<Instant> = None;
    let mut first_check = true;
    loop {
        let checked_at = Instant::now();
        let counted_from = match connecting_since {
            Some(t) if std::mem::take(&mut first_check) => t,
            _ => checked_at,
        };
        if let Ok(seen) = redlock.inspect(name).await {
            let failed = failures(&seen);
            let ok = seen.nodes.len() - failed.len();
            if ok >= seen.quorum {
                if since.take().is_some() {
                    eprintln!("fredlock: a quorum of nodes answers again; waiting for {name:?}");
                }
            } else {
                let what = format!(
                    "{ok} of {} nodes answered, {} needed: {}",
                    seen.nodes.len(),
                    seen.quorum,
                    causes(&failed)
                );
                let newly = since.is_none();
                let first = *since.get_or_insert(counted_from);
                if checked_at.duration_since(first) >= bound {
                    return format!(
                        "no quorum of nodes answered for {} (--no-quorum-timeout): {what}",
                        show(bound)
                    );
                }
                if newly {
                    eprintln!(
                        "fredlock: cannot reach a quorum of nodes ({what}); giving up after {} without one",
                        show(bound)
                    );
                }
            }
        }
        tokio::time::sleep_until(checked_at + CHECK_EVERY).await;
    }
}

/// Resolves when a check finds that too few nodes still hold `token` for it to be on a quorum
/// (the lock was broken, or expired and was taken over): more nodes answered without it than
/// `nodes - quorum`. Nodes that do not answer count for neither side. Checks every
/// [`CHECK_EVERY`].
pub async fn token_gone(redlock: &Redlock, name: &str, token: &str) -> usize {
    loop {
        let checked_at = Instant::now();
        if let Ok(seen) = redlock.inspect(name).await {
            let without = seen
                .nodes
                .iter()
                .filter(|n| match &n.state {
                    Ok(Some(h)) => !h.has_token(token),
                    Ok(None) => true,
                    Err(_) => false,
                })
                .count();
            if without > seen.nodes.len() - seen.quorum {
                return without;
            }
        }
        tokio::time::sleep_until(checked_at + CHECK_EVERY).await;
    }
}
