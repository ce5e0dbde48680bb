//! [`Redlock::force_release`]: an operator breaks a lock, whoever holds it.
//!
//! Owns: the break round and its report. Must not: be used by any lock path (a holder releases
//! with its token; breaking ignores it, which is the point and the danger).

use std::time::Duration;

use crate::error::{InvalidInput, NodeError, NodeErrorKind, Result};
use crate::inspect::{Holder, Inspection, NodeView};
use crate::quorum::{fan_out, Late};
use crate::redlock::Redlock;

impl Redlock {
    /// Deletes `resource`'s lock key on every node WHOEVER holds it, and reports what each node
    /// held before (owner label, token fingerprint, TTL left) as an [`Inspection`] of the moment
    /// of deletion: [`Inspection::holder`] is whose lock was broken. With wake-ups, each
    /// deletion publishes like a release, so that waiters retry at once.
    ///
    /// **This breaks mutual exclusion on purpose**: a holder that is still alive keeps working
    /// until its next extension fails (a kept-alive lock then reports
    /// [`LostReason::TokenGone`](crate::LostReason::TokenGone)), while someone else may already
    /// hold the lock. Use it for a holder known to be dead whose TTL is too long to wait for, or
    /// a key without expiry. Keys of another type than a string are not locks and are left
    /// alone (that node reports a server error).
    ///
    /// Waits for every node, each bounded by the per-node timeout (default 500 ms here). A node
    /// that failed or did not answer may still hold the key: run it again once it is back.
    ///
    /// Cancellation: a deletion already handed to a node's connection still runs.
    pub async fn force_release(&self, resource: &str) -> Result<Inspection> {
        if resource.is_empty() {
            return Err(InvalidInput::EmptyResource.into());
        }
        let key = self.key(resource);
        let timeout = self
            .inner
            .node_timeout
            .unwrap_or(Duration::from_millis(500));
        let calls = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().force_delete(key.clone(), timeout)));
        let answers = fan_out(self.inner.nodes.len(), calls, None, Late::Drop, |_| false).await;
        let nodes = answers
            .into_iter()
            .zip(&self.inner.nodes)
            .map(|(answer, node)| NodeView {
                node: node.name.clone(),
                state: match answer {
                    Some(Ok(found)) => {
                        Ok(found.map(|(value, pttl)| Holder::from_value(&value, pttl)))
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(NodeError {
                        node: node.name.clone(),
                        kind: NodeErrorKind::Timeout,
                        message: "no answer".into(),
                    }),
                },
            })
            .collect();
        tracing::warn!(resource, "fredlock: lock broken by force (force_release)");
        Ok(Inspection {
            resource: resource.to_string(),
            quorum: self.inner.quorum,
            nodes,
        })
    }
}
