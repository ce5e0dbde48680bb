//! Votes confirmed by replicas ([`Builder::confirm_replicas`](crate::Builder::confirm_replicas)):
//! how a node asks (`WAIT n timeout`, or `WAITAOF 1 n timeout`) on the connection that carried
//! its writes, one request at a time per node, each answering every vote queued before it
//! ([`Waits`]), and what the reply means. Which votes ask, and what a failed confirmation does
//! to them, is `node_confirm`'s.
//!
//! Owns: the `WAIT`s and their task. Must not: know a vote or a node.

use std::time::Duration;

use std::sync::Arc;

use fred::clients::Client;
use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{mpsc, oneshot};

use crate::base::error::{NodeError, NodeErrorKind};
use crate::nodes::connection::{options, State};

/// How many replicas must acknowledge a node's vote, and how long the primary waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Confirm {
    /// At least 1 (`WAIT`); with `fsync`, 0 or more.
    pub(crate) replicas: u32,
    /// `WAIT`'s own timeout: more than zero (zero would block the connection until enough
    /// replicas answer).
    pub(crate) timeout: Duration,
    /// `WAITAOF 1 replicas timeout` instead: the write fsynced to the append-only file of the
    /// primary and of `replicas` replicas.
    pub(crate) fsync: bool,
}

impl Confirm {
    /// `WAIT`'s timeout argument in ms: at least 1 (a sub-millisecond timeout rounds up).
    fn wait_ms(&self) -> i64 {
        i64::try_from(self.timeout.as_millis().max(1)).unwrap_or(i64::MAX)
    }
}

pub(crate) fn unconfirmed(node: &str, message: String) -> NodeError {
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
    /// Whether enough replicas acknowledged every write `client`'s connection carried before
    /// the call: `Ok`, or `node`'s error. Starts the task at the first call.
    pub(crate) async fn ask(
        cell: &std::sync::OnceLock<Waits>,
        client: &Client,
        state: &Arc<State>,
        node: &str,
        confirm: Confirm,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let waits = cell
            .get_or_init(|| Waits::start(client.clone(), state.clone(), node.to_string(), confirm));
        let stopped = || unconfirmed(node, "the node's WAIT task has stopped".into());
        let (reply, answer) = oneshot::channel();
        if waits.requests.send((timeout, reply)).is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

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

/// `WAIT replicas timeout` (or `WAITAOF 1 replicas timeout`) on `client`'s connection: `Ok`
/// when enough replicas acknowledged (and, for `WAITAOF`, the primary fsynced).
async fn wait(
    client: &Client,
    state: &State,
    node: &str,
    confirm: Confirm,
    timeout: Duration,
) -> Result<(), NodeError> {
    let (name, mut args) = match confirm.fsync {
        true => ("WAITAOF", vec![Value::Integer(1)]),
        false => ("WAIT", Vec::new()),
    };
    args.push(Value::Integer(i64::from(confirm.replicas)));
    args.push(Value::Integer(confirm.wait_ms()));
    let reply = client
        .with_options(&options(timeout.saturating_add(confirm.timeout)))
        .custom::<Value, Value>(
            CustomCommand::new_static(name, ClusterHash::Random, false),
            args,
        )
        .await
        .map_err(|e| state.error(&e))?;
    let want = i64::from(confirm.replicas);
    let (local, replicas) = match (&reply, confirm.fsync) {
        (Value::Integer(n), false) => (1, *n),
        (Value::Array(parts), true) => match parts.as_slice() {
            [Value::Integer(l), Value::Integer(r)] => (*l, *r),
            _ => (-1, -1),
        },
        _ => (-1, -1),
    };
    if local < 0 {
        return Err(NodeError {
            node: node.to_string(),
            kind: NodeErrorKind::UnexpectedReply,
            message: format!("{name} answered {reply:?}"),
        });
    }
    if local >= 1 && replicas >= want {
        return Ok(());
    }
    let fsynced = match confirm.fsync {
        true => format!(" (fsynced here: {})", if local >= 1 { "yes" } else { "no" }),
        false => String::new(),
    };
    Err(unconfirmed(
        node,
        format!(
            "{name}: {replicas} of {want} replicas acknowledged the write within {:?}{fsynced}",
            confirm.timeout
        ),
    ))
}
