//! Synthetic histories for the checker's unit tests, which sit beside the code they test.
//!
//! The checker must not be blind: each kind of violation, planted in a synthetic history,
//! is found; a clean history has none.
//!
//! Owns test helpers only (compiled for tests). Must not hold tests or checker logic.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use fredlock::Inspection;
use fredlock::{Holder, NodeView};
use fredlock::{NodeError, NodeErrorKind};

use super::{Checker, DataValue, GrantId, GrantKind, GrantRecord};

pub(super) const TTL: Duration = Duration::from_millis(500);

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn grant(
    c: &Checker,
    client: usize,
    token: &str,
    t0: Instant,
    granted: Duration,
) -> GrantId {
    c.record_grant(GrantRecord {
        client,
        kind: GrantKind::Acquire,
        token: token.into(),
        resources: vec!["r".into()],
        ttl: TTL,
        t0: Some(t0),
        granted_at: t0.checked_add(granted).expect("a test's small offset"),
        deadline: t0.checked_add(c.validity(TTL)).expect("a test's small TTL"),
    })
}

pub(super) fn write(
    c: &Checker,
    g: GrantId,
    read: DataValue,
    at: Instant,
    done: Instant,
) -> DataValue {
    let id = c.begin_write(g, "r", read, at);
    c.complete_write(id, done);
    read.next(id)
}

pub(super) fn finals(v: DataValue) -> HashMap<String, Option<String>> {
    HashMap::from([("r".to_string(), Some(v.encode()))])
}

pub(super) fn inspection(states: Vec<Result<Option<&str>, ()>>) -> Inspection {
    Inspection {
        resource: "r".into(),
        quorum: states.len() / 2 + 1,
        nodes: states
            .into_iter()
            .enumerate()
            .map(|(i, s)| NodeView {
                node: format!("n{i}"),
                state: match s {
                    Ok(t) => Ok(t.map(|t| Holder::from_value(t, 100))),
                    Err(()) => Err(NodeError {
                        node: format!("n{i}"),
                        kind: NodeErrorKind::Timeout,
                        message: String::new(),
                    }),
                },
            })
            .collect(),
    }
}
