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
//! A server that turns out not to know the command (renamed, a proxy) answers an error: the
//! operation fails on this node (an unknown outcome, handled like a timeout by the caller) and
//! the node goes back to scripts from then on; nothing is resent, so per-node order holds.
//!
//! Also the errors of a node whose user may not run scripts ([`scripts_refused`]).
//!
//! Owns: the arguments of the native commands. Must not: decide when to use them (`node` and
//! `batch` ask `caps`), or decode replies into votes (`reply`).

use std::time::Duration;

use fred::clients::Client;
use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};

use crate::base::error::{NodeError, NodeErrorKind};
use crate::nodes::caps::Native;
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
            if crate::nodes::caps::is_unknown_command(e.details()) {
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
    key: &str,
    value: &str,
    timeout: Duration,
) -> Option<Result<Value, NodeError>> {
    let (cmd, args) = match state.caps.native() {
        Native::None => return None,
        Native::DelIfEq => ("DELIFEQ", vec![Value::from(key), Value::from(value)]),
        // Redis >= 8.4; untested here (no such server could be installed).
        Native::DelEx => (
            "DELEX",
            vec![Value::from(key), Value::from("IFEQ"), Value::from(value)],
        ),
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
    let args = vec![
        Value::from(key),
        Value::from(value),
        Value::from("IFEQ"),
        Value::from(value),
        Value::from("PX"),
        Value::Integer(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    ];
    Some(send(client, state, "SET", args, timeout).await)
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

/// Per lock of `items` (keys, value, TTL), what [`extend`] answers, all written together;
/// `None` when this node has no native commands or a lock has several keys (the batched
/// script does those).
pub(crate) async fn extend_many<'a>(
    client: &Client,
    state: &State,
    items: impl Iterator<Item = (&'a [String], &'a str, u64)> + Clone,
    timeout: Duration,
) -> Option<Vec<Result<Value, NodeError>>> {
    if state.caps.native() == Native::None || items.clone().any(|(keys, _, _)| keys.len() != 1) {
        return None;
    }
    let calls = items.map(|(keys, value, ttl_ms)| async move {
        let key = keys.first().map_or("", String::as_str);
        match extend(client, state, key, value, ttl_ms, timeout).await {
            Some(reply) => reply,
            // The node went back to scripts meanwhile (an unknown command): not extended.
            None => Err(NodeError {
                node: state.name.clone(),
                kind: NodeErrorKind::Client,
                message: "the node stopped offering SET IFEQ; retried with a script".into(),
            }),
        }
    });
    Some(futures::future::join_all(calls).await)
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
