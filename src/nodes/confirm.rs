//! Votes confirmed by replicas ([`Builder::confirm_replicas`](crate::Builder::confirm_replicas)):
//! once a node granted an acquire or an extension, `WAIT n timeout` on the same connection;
//! the vote counts only when at least `n` replicas acknowledged every write of that connection
//! so far (the grant's among them). Fewer is [`NodeErrorKind::Unconfirmed`]: the key may be on
//! the primary alone, so the attempt treats it as a failed node and releases there as usual.
//!
//! Owns: the `WAIT` and what its reply means for a vote. Must not: choose which calls need it
//! (the `node_*` files do) nor count votes across nodes.

use std::time::Duration;

use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::base::error::{NodeError, NodeErrorKind, Vote};
use crate::base::reply::Slot;
use crate::nodes::connection::options;
use crate::nodes::node::{Backend, Node};

/// How many replicas must acknowledge a node's vote, and how long the primary waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Confirm {
    /// At least 1.
    pub(crate) replicas: u32,
    /// `WAIT`'s own timeout: more than zero (zero would block the connection until enough
    /// replicas answer).
    pub(crate) timeout: Duration,
}

impl Confirm {
    /// `WAIT`'s timeout argument in ms: at least 1 (a sub-millisecond timeout rounds up).
    fn wait_ms(&self) -> i64 {
        i64::try_from(self.timeout.as_millis().max(1)).unwrap_or(i64::MAX)
    }
}

impl Node {
    /// `vote` as it counts under this node's confirmation: a grant stands once `WAIT`
    /// confirmed it; anything else is returned as it is, and without confirmation nothing is
    /// sent.
    pub(crate) async fn confirmed(&self, vote: Vote, timeout: Duration) -> Vote {
        match (vote, self.confirm) {
            (Vote::Granted, Some(confirm)) => {
                match Box::pin(self.wait_replicas(confirm, timeout)).await {
                    Ok(()) => Vote::Granted,
                    Err(e) => Vote::Failed(e),
                }
            }
            (vote, _) => vote,
        }
    }

    /// As [`confirmed`](Self::confirmed), for a semaphore's slot.
    pub(crate) async fn confirmed_slot(&self, slot: Slot, timeout: Duration) -> Slot {
        match (slot, self.confirm) {
            (slot @ Slot::Took { .. }, Some(confirm)) => {
                match Box::pin(self.wait_replicas(confirm, timeout)).await {
                    Ok(()) => slot,
                    Err(e) => Slot::Failed(e),
                }
            }
            (slot, _) => slot,
        }
    }

    /// As [`confirmed`](Self::confirmed), for a script's reply (a read-write lock's acquire):
    /// confirmed whatever it says (a refusal wrote nothing, and `WAIT` then costs a round trip).
    pub(crate) async fn confirmed_reply(
        &self,
        reply: Result<Value, NodeError>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        match (reply, self.confirm) {
            (Ok(value), Some(confirm)) => {
                Box::pin(self.wait_replicas(confirm, timeout)).await?;
                Ok(value)
            }
            (reply, _) => reply,
        }
    }

    /// `WAIT replicas timeout` on this node's connection (after the write it confirms, whose
    /// reply the caller already has): `Ok` when enough replicas acknowledged. Callers box it:
    /// fred's futures are deep, and the acquire path's futures nest deep enough already.
    async fn wait_replicas(&self, confirm: Confirm, timeout: Duration) -> Result<(), NodeError> {
        let Backend::Server(client) = &self.backend else {
            // The builder refuses confirmation with a cluster node.
            return Err(self.unconfirmed("a Redis Cluster node cannot confirm by WAIT".into()));
        };
        let wait = CustomCommand::new_static("WAIT", ClusterHash::Random, false);
        let args = vec![
            Value::Integer(i64::from(confirm.replicas)),
            Value::Integer(confirm.wait_ms()),
        ];
        let reply = client
            .with_options(&options(timeout.saturating_add(confirm.timeout)))
            .custom::<Value, Value>(wait, args)
            .await
            .map_err(|e| self.state.error(&e))?;
        match reply {
            Value::Integer(n) if n >= i64::from(confirm.replicas) => Ok(()),
            Value::Integer(n) => Err(self.unconfirmed(format!(
                "WAIT: {n} of {} replicas acknowledged the write within {:?}",
                confirm.replicas, confirm.timeout
            ))),
            other => Err(NodeError {
                node: self.name.clone(),
                kind: NodeErrorKind::UnexpectedReply,
                message: format!("WAIT answered {other:?}, not an integer"),
            }),
        }
    }

    fn unconfirmed(&self, message: String) -> NodeError {
        NodeError {
            node: self.name.clone(),
            kind: NodeErrorKind::Unconfirmed,
            message,
        }
    }
}
