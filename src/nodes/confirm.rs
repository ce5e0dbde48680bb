//! Votes confirmed by replicas ([`Builder::confirm_replicas`](crate::Builder::confirm_replicas)):
//! once a node granted an acquire or an extension, `WAIT n timeout` on the same connection;
//! the vote counts only when at least `n` replicas acknowledged every write of that connection
//! so far (the grant's among them). Fewer is [`NodeErrorKind::Unconfirmed`]: the key may be on
//! the primary alone, so the attempt treats it as a failed node and releases there as usual.
//!
//! Owns: the `WAIT`s (one at a time per node, shared by the votes waiting for one: [`Waits`])
//! and what a reply means for a vote. Must not: choose which calls need it
//! (the `node_*` files do) nor count votes across nodes.

use std::time::Duration;

use std::sync::Arc;

use fred::clients::Client;
use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{mpsc, oneshot};

use crate::base::error::{NodeError, NodeErrorKind, Vote};
use crate::base::reply::Slot;
use crate::nodes::connection::{options, State};
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

    /// Whether enough replicas acknowledged every write this node's connection carried before
    /// the call (the caller's write, whose reply it already has, among them): `Ok`, or the
    /// node's error. Concurrent callers share one `WAIT` (see [`Waits`]). Callers box it:
    /// the acquire path's futures nest deep enough already.
    async fn wait_replicas(&self, confirm: Confirm, timeout: Duration) -> Result<(), NodeError> {
        let Backend::Server(client) = &self.backend else {
            // The builder refuses confirmation with a cluster node.
            return Err(self.unconfirmed("a Redis Cluster node cannot confirm by WAIT".into()));
        };
        let waits = self.waits.get_or_init(|| {
            Waits::start(
                client.clone(),
                self.state.clone(),
                self.name.clone(),
                confirm,
            )
        });
        let (reply, answer) = oneshot::channel();
        if waits.requests.send((timeout, reply)).is_err() {
            return Err(self.unconfirmed("the node's WAIT task has stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(self.unconfirmed("the node's WAIT task has stopped".into())))
    }

    fn unconfirmed(&self, message: String) -> NodeError {
        unconfirmed(&self.name, message)
    }
}

fn unconfirmed(node: &str, message: String) -> NodeError {
    NodeError {
        node: node.to_string(),
        kind: NodeErrorKind::Unconfirmed,
        message,
    }
}

/// One asker of a `WAIT`: its timeout and where its answer goes.
type Request = (Duration, oneshot::Sender<Result<(), NodeError>>);

/// A node's `WAIT`s, one at a time, by a task of their own (started at the node's first
/// confirmation, ended when the node is dropped): it takes every request queued, sends one
/// `WAIT`, and answers them all with its reply. Every request was queued after its write's
/// reply arrived, so a `WAIT` sent after taking it confirms that write. Measured before: one
/// `WAIT` per vote blocked the connection for every other command once per vote (a blocked
/// client's next commands wait on the server), and 64 tasks ran at 0.34x the throughput
/// without confirmation. A caller that gives up drops its answer; the others are unaffected.
pub(crate) struct Waits {
    requests: mpsc::UnboundedSender<Request>,
}

impl Waits {
    fn start(client: Client, state: Arc<State>, node: String, confirm: Confirm) -> Waits {
        let (requests, mut queue) = mpsc::unbounded_channel::<Request>();
        tokio::spawn(async move {
            while let Some(first) = queue.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = queue.try_recv() {
                    batch.push(more);
                }
                let timeout = batch.iter().map(|(t, _)| *t).max().unwrap_or_default();
                let result = wait(&client, &state, &node, confirm, timeout).await;
                for (_, reply) in batch {
                    let _ = reply.send(result.clone());
                }
            }
        });
        Waits { requests }
    }
}

/// `WAIT replicas timeout` on `client`'s connection: `Ok` when enough replicas acknowledged.
async fn wait(
    client: &Client,
    state: &State,
    node: &str,
    confirm: Confirm,
    timeout: Duration,
) -> Result<(), NodeError> {
    let wait = CustomCommand::new_static("WAIT", ClusterHash::Random, false);
    let args = vec![
        Value::Integer(i64::from(confirm.replicas)),
        Value::Integer(confirm.wait_ms()),
    ];
    let reply = client
        .with_options(&options(timeout.saturating_add(confirm.timeout)))
        .custom::<Value, Value>(wait, args)
        .await
        .map_err(|e| state.error(&e))?;
    match reply {
        Value::Integer(n) if n >= i64::from(confirm.replicas) => Ok(()),
        Value::Integer(n) => Err(unconfirmed(
            node,
            format!(
                "WAIT: {n} of {} replicas acknowledged the write within {:?}",
                confirm.replicas, confirm.timeout
            ),
        )),
        other => Err(NodeError {
            node: node.to_string(),
            kind: NodeErrorKind::UnexpectedReply,
            message: format!("WAIT answered {other:?}, not an integer"),
        }),
    }
}
