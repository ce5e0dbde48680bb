//! A node's votes under confirmation ([`Builder::confirm_replicas`](crate::Builder::confirm_replicas)):
//! once the node granted an acquire or an extension, its replicas must acknowledge the write
//! (`confirm`'s `WAIT`) before the vote counts. Fewer is [`NodeErrorKind::Unconfirmed`]: the
//! key may be on the primary alone, so the attempt treats it as a failed node and releases
//! there as usual.
//!
//! Owns: what confirmation does to a vote, a slot or a script's reply. Must not: send the
//! `WAIT` itself (that is `confirm`) nor count votes across nodes.

use std::time::Duration;

use fred::prelude::Value;

use crate::base::error::{NodeError, Vote};
use crate::base::reply::Slot;
use crate::nodes::confirm::{unconfirmed, Confirm, Waits};
use crate::nodes::node::{Backend, Node};

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

    /// Whether enough replicas acknowledged every write this node's connection carried before
    /// the call (the caller's write, whose reply it already has, among them): `Ok`, or the
    /// node's error. Concurrent callers share one `WAIT` (see [`Waits`]). Callers box it:
    /// the acquire path's futures nest deep enough already.
    async fn wait_replicas(&self, confirm: Confirm, timeout: Duration) -> Result<(), NodeError> {
        let Backend::Server(client) = &self.backend else {
            // The builder refuses confirmation with a cluster node.
            return Err(unconfirmed(
                &self.name,
                "a Redis Cluster node cannot confirm by WAIT".into(),
            ));
        };
        Waits::ask(
            &self.waits,
            client,
            &self.state,
            &self.name,
            confirm,
            timeout,
        )
        .await
    }
}
