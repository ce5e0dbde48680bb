//! The warnings of `fredlock health`: each has a stable id (the `id` in `--json`, what
//! `--allow` takes) and a text; a server listed twice can never be allowed.
//!
//! Owns the ids and `--allow`'s parser. Must not check a node (that is `node.rs`).

use serde_json::{json, Value as Json};

/// A warning's stable id (the `id` in `--json`, what `--allow` takes) and its text.
pub(super) struct Warning {
    pub(super) id: &'static str,
    pub(super) message: String,
}

impl Warning {
    pub(super) fn new(id: &'static str, message: impl Into<String>) -> Warning {
        Warning {
            id,
            message: message.into(),
        }
    }
}

/// Every warning id, and whether `--allow` may accept it. A server listed twice is never
/// acceptable: it votes twice, and the quorum is fake.
const WARNINGS: &[(&str, bool)] = &[
    ("duplicate", false),
    ("replica", true),
    ("replicas-connected", true),
    ("too-few-replicas", true),
    ("no-aof-for-fsync", true),
    ("eviction", true),
    ("maxmemory-policy-unknown", true),
    ("no-persistence", true),
    ("persistence-unknown", true),
    ("info-failed", true),
    ("cluster-unchecked", true),
    ("clock-spread", true),
];

/// `--allow`'s parser: a known warning id that may be accepted.
pub fn allowable(id: &str) -> Result<String, String> {
    match WARNINGS.iter().find(|(known, _)| *known == id) {
        Some((_, true)) => Ok(id.to_string()),
        Some((_, false)) => Err(format!(
            "the warning {id:?} cannot be allowed: a server listed twice votes twice; list each server once"
        )),
        None => {
            let known: Vec<&str> = WARNINGS
                .iter()
                .filter(|(_, ok)| *ok)
                .map(|(id, _)| *id)
                .collect();
            Err(format!(
                "unknown warning id {id:?}; one of: {}",
                known.join(", ")
            ))
        }
    }
}

pub(super) fn warning_json(w: &Warning) -> Json {
    json!({"id": w.id, "message": w.message})
}
