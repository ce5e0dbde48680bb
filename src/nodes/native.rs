//! A plain lock's release, extension and inspection without Lua, on a single server that has a
//! native compare-and-delete (see `caps`):
//! - release: `DELIFEQ key token` (Valkey >= 9.0) or `DELEX key IFEQ token` (Redis >= 8.4):
//!   deletes the key only while it holds our token; answers 1 or 0 like the release script;
//! - extension: `SET key token IFEQ token PX ttl`: resets the TTL only while the key holds our
//!   token, and never creates a missing key (checked against valkey-server 9.1.2: on a missing
//!   key it answers nil and the key stays absent; on another value, nil and the TTL unchanged);
//!   answers OK or nil like `SET NX`;
//! - inspection: `GET` then `PTTL`, two commands written together (a script reads both at once;
//!   here a holder that changes between them can show the next holder's TTL, which an operator's
//!   view tolerates). Used only where scripts are denied.
//!
//! Each is one command with fredlock's options (one attempt, fred's own timeout), so a dropped
//! future behaves as for any command: once handed to fred it is written, in this node's order.
//! A keep-alive batch's extensions, where scripts are denied, are one pipeline of such commands
//! under one deadline ([`extend_many`]); where scripts may run, the batched script does them.
//! A server that turns out not to know the command (renamed, a proxy) answers an error: the
//! operation fails on this node (an unknown outcome, handled like a timeout by the caller) and
//! the node goes back to scripts from then on; nothing is resent, so per-node order holds.
//!
//! Also the errors of a node whose user may not run scripts ([`scripts_refused`]).
//!
//! Owns: the arguments of the native commands. Must not: decide when to use them (`node` and
//! `batch` ask `caps`), or decode replies into votes (`reply`).

use std::time::Duration;

use fred::clients::{Client, Pipeline};
use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::base::error::{NodeError, NodeErrorKind};
use crate::nodes::caps::{is_unknown_command, Native};
use crate::nodes::connection::{options, State};

/// One native command with fredlock's options.
async fn send(
    client: &Client,
    state: &State,
    cmd: &'static str,
    args: Vec<Value>,
    timeout: Duration,
) -> Result<Value, NodeError> {
    let command = CustomCommand::new_static(cmd, ClusterHash::Offset(0), false);
    let with = client.with_options(&options(timeout));
    let call = with.custom::<Value, Value>(command, args);
    // Boxed: fred's command futures are ~5 KB (see `node`).
    match Box::pin(call).await {
        Ok(v) => Ok(v),
        Err(e) => {
            if is_unknown_command(e.details()) {
                tracing::warn!(node = %state.name, cause = %e.details(), "fredlock: the server does not know {cmd}; using scripts on this node from now on");
                state.caps.set_native(Native::None);
            }
            Err(state.error(&e))
        }
    }
}

/// Deletes `key` if it holds `value`: `Integer(1)` deleted, `Integer(0)` not ours (as the
/// release script for one key). `None` when this node has no native compare-and-delete.
pub(crate) async fn release(
    client: &Client,
    state: &State,
    key: Value,
    value: Value,
    timeout: Duration,
) -> Option<Result<Value, NodeError>> {
    let (cmd, args) = match state.caps.native() {
        Native::None => return None,
        Native::DelIfEq => ("DELIFEQ", vec![key, value]),
        // Redis >= 8.4; untested here (no such server could be installed).
        Native::DelEx => ("DELEX", vec![key, Value::from("IFEQ"), value]),
    };
    Some(send(client, state, cmd, args, timeout).await)
}

/// Sets `key`'s TTL to `ttl_ms` if it holds `value`, never creating it: `OK` extended, nil not
/// ours (as `SET NX`'s reply). `None` when this node has no native compare-and-delete.
pub(crate) async fn extend(
    client: &Client,
    state: &State,
    key: &str,
    value: &str,
    ttl_ms: u64,
    timeout: Duration,
) -> Option<Result<Value, NodeError>> {
    if state.caps.native() == Native::None {
        return None;
    }
    let args = extend_args(key, value, ttl_ms);
    Some(send(client, state, "SET", args, timeout).await)
}

/// `key value IFEQ value PX ttl_ms`: the arguments of an extension's `SET`.
fn extend_args(key: &str, value: &str, ttl_ms: u64) -> Vec<Value> {
    vec![
        Value::from(key),
        Value::from(value),
        Value::from("IFEQ"),
        Value::from(value),
        Value::from("PX"),
        Value::Integer(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    ]
}

/// `[value or nil, pttl]` of `key`, as the inspect script answers.
pub(crate) async fn inspect(
    client: &Client,
    state: &State,
    key: &str,
    timeout: Duration,
) -> Result<Value, NodeError> {
    let (value, pttl) = futures::join!(
        send(client, state, "GET", vec![Value::from(key)], timeout),
        send(client, state, "PTTL", vec![Value::from(key)], timeout),
    );
    Ok(Value::Array(vec![value?, pttl?]))
}

/// Per lock of `items` (keys, value, TTL), what [`extend`] answers; `None` when this node has
/// no native commands or a lock has several keys (the batched script does those).
///
/// The whole batch is ONE pipeline: a single message to this node's connection, written
/// together, under one deadline (`timeout`), its answers read back per lock. Not one command
/// per lock: each of those is its own message, timer and wake-up, and a keep-alive of
/// thousands of locks then sent thousands per node per round, which on a busy machine queued
/// long enough (measured: batches of 128 taking 1 to 5 s, over 2,000 commands waiting in one
/// node's queue) for extensions and the acquires behind them to time out, and locks to be lost.
///
/// A pipeline still waiting in fred's queue when its deadline passes is written all the same
/// (fred skips only single commands): it is still in this node's order, before anything sent
/// after it, and `SET ... IFEQ` only ever extends keys that still hold their lock's token.
pub(crate) async fn extend_many<'a>(
    client: &Client,
    state: &State,
    items: impl Iterator<Item = (&'a [String], &'a str, u64)> + Clone,
    timeout: Duration,
) -> Option<Vec<Result<Value, NodeError>>> {
    if state.caps.native() == Native::None || items.clone().any(|(keys, _, _)| keys.len() != 1) {
        return None;
    }
    let count = items.clone().count();
    let pipeline = Pipeline::from(client.with_options(&options(timeout)));
    for (keys, value, ttl_ms) in items {
        let key = keys.first().map_or("", String::as_str);
        let command = CustomCommand::new_static("SET", ClusterHash::Offset(0), false);
        // Only buffered here (answered at once); sent by `try_all` below.
        if let Err(e) = pipeline
            .custom::<Value, Value>(command, extend_args(key, value, ttl_ms))
            .await
        {
            return Some(vec![Err(state.error(&e)); count]);
        }
    }
    // Boxed: fred's command futures are large (see `node`).
    let replies = Box::pin(pipeline.try_all::<Value>()).await;
    let unknown = replies
        .iter()
        .find_map(|r| r.as_ref().err().filter(|e| is_unknown_command(e.details())));
    if let Some(e) = unknown {
        tracing::warn!(node = %state.name, cause = %e.details(), "fredlock: the server does not know SET IFEQ; using scripts on this node from now on");
        state.caps.set_native(Native::None);
    }
    // A pipeline that failed as a whole (a timeout, a reset connection) answers one error.
    if replies.len() != count {
        let e = match replies.into_iter().find_map(Result::err) {
            Some(e) => state.error(&e),
            None => NodeError {
                node: state.name.clone(),
                kind: NodeErrorKind::UnexpectedReply,
                message: format!("a pipeline of {count} SET IFEQ answered another count"),
            },
        };
        return Some(vec![Err(e); count]);
    }
    Some(
        replies
            .into_iter()
            .map(|r| r.map_err(|e| state.error(&e)))
            .collect(),
    )
}

/// Why no script may be sent to this node (its user may not run scripts), as the error every
/// script call then answers at once, without sending anything.
pub(crate) fn scripts_refused(state: &State) -> Option<NodeError> {
    state.caps.no_script().map(|message| NodeError {
        node: state.name.clone(),
        kind: NodeErrorKind::Permission,
        message,
    })
}

/// A script's reply: a `NOPERM` for the script command itself marks scripts denied here
/// (learnt at run time, e.g. after an ACL change) and says what to do.
pub(crate) fn scripted(state: &State, reply: Result<Value, NodeError>) -> Result<Value, NodeError> {
    match reply {
        Err(e) if e.kind == NodeErrorKind::Permission && e.message.contains("to run the") => {
            state.caps.deny_scripts(&e.message);
            Err(scripts_refused(state).unwrap_or(e))
        }
        other => other,
    }
}
