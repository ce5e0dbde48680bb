//! [`Redlock::force_release`]: an operator breaks a lock, whoever holds it.
//!
//! Owns: the break round and its report. Must not: be used by any lock path (a holder releases
//! with its token; breaking ignores it, which is the point and the danger).

use crate::base::error::Result;
use crate::ops::inspect::Inspection;
use crate::rounds::redlock::Redlock;

impl Redlock {
    /// Deletes `resource`'s lock key on every node WHOEVER holds it, and reports what each node
    /// held before (owner label, token fingerprint, TTL left) as an [`Inspection`] of the moment
    /// of deletion: [`Inspection::holder`] is whose lock was broken. The head of the key's wait
    /// line is then woken, so that waiters retry at once.
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
        let broken = self
            .holders_round(resource, |node, key, timeout| {
                node.force_delete(key, timeout)
            })
            .await?;
        tracing::warn!(resource, "fredlock: lock broken by force (force_release)");
        // Whoever waits in the key's line: the head's turn now.
        let key = self.key(resource);
        if let Some(gate) = self.inner.gate_of(&key) {
            let line = crate::base::slots::line_key(&self.inner.key_prefix, &key);
            self.inner.leave_line(gate, vec![key], line, String::new());
        }
        Ok(broken)
    }
}
