//! `fredlock inspect` and `fredlock break`: who holds a lock, node by node.

use fredlock::{Holder, Inspection, Redlock, Verdict};
use serde_json::{json, Value};

use crate::duration::show;
use crate::exit;

/// A label for people: quoted, or `(no label)`.
pub fn label(label: Option<&str>) -> String {
    match label {
        Some(l) => format!("{l:?}"),
        None => "(no label)".to_string(),
    }
}

fn ttl_text(h: &Holder) -> String {
    h.ttl
        .map_or("no expiry".to_string(), |t| format!("{} left", show(t)))
}

fn holder_json(h: &Holder) -> Value {
    json!({
        "label": h.label,
        "fingerprint": h.fingerprint,
        "ttl_ms": h.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    })
}

/// The verdict as a word and the holder on a quorum. A node that did not answer is neither a
/// holder nor a split: `free` and `split` are said only when the nodes that did not answer
/// could not complete a quorum for anyone; otherwise the word is `unknown`.
fn verdict(seen: &Inspection) -> (&'static str, Option<Holder>) {
    if let Verdict::Held(h) = seen.verdict() {
        return ("held", Some(h));
    }
    let unanswered = seen.nodes.len() - answered(seen);
    let holders: Vec<&Holder> = seen
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok().and_then(Option::as_ref))
        .collect();
    let most = holders
        .iter()
        .map(|h| {
            holders
                .iter()
                .filter(|o| o.fingerprint == h.fingerprint)
                .count()
        })
        .max()
        .unwrap_or(0);
    if most + unanswered >= seen.quorum {
        ("unknown", None)
    } else if holders.is_empty() {
        ("free", None)
    } else {
        ("split", None)
    }
}

fn answered(seen: &Inspection) -> usize {
    seen.nodes.iter().filter(|n| n.state.is_ok()).count()
}

/// The nodes that did not answer, by name.
fn unanswered(seen: &Inspection) -> Vec<&str> {
    seen.nodes
        .iter()
        .filter(|n| n.state.is_err())
        .map(|n| n.node.as_str())
        .collect()
}

/// `; 127.0.0.1:7003/0 did not answer` (empty when every node answered).
fn not_answered_text(seen: &Inspection) -> String {
    match unanswered(seen).as_slice() {
        [] => String::new(),
        [one] => format!("; {one} did not answer"),
        many => format!("; {} did not answer", many.join(", ")),
    }
}

/// 0 when every node answered, 1 when some did not, 69 when too few answered for a quorum
/// (after saying so on stderr).
fn answered_code(seen: &Inspection, name: &str, what: &str) -> i32 {
    let ok = answered(seen);
    let failed: Vec<String> = seen
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().err().map(ToString::to_string))
        .collect();
    if ok < seen.quorum {
        eprintln!(
            "fredlock: only {ok} of {} nodes answered ({} needed), so {what} {name:?} is not known: {}",
            seen.nodes.len(),
            seen.quorum,
            failed.join("; ")
        );
        return exit::UNAVAILABLE;
    }
    if !failed.is_empty() {
        eprintln!(
            "fredlock: {} of {} nodes did not answer: {}",
            failed.len(),
            seen.nodes.len(),
            failed.join("; ")
        );
        return exit::DEGRADED;
    }
    exit::OK
}

fn as_json(redlock: &Redlock, seen: &Inspection) -> Value {
    let (word, holder) = verdict(seen);
    let nodes: Vec<Value> = seen
        .nodes
        .iter()
        .map(|n| match &n.state {
            Ok(None) => json!({"node": n.node, "state": "free"}),
            Ok(Some(h)) => {
                let mut v = holder_json(h);
                v["node"] = json!(n.node);
                v["state"] = json!("held");
                v
            }
            Err(e) => json!({
                "node": n.node,
                "state": "error",
                "error": e.to_string(),
                "kind": e.kind.to_string(),
            }),
        })
        .collect();
    json!({
        "resource": seen.resource,
        "key": redlock.key(&seen.resource),
        "quorum": seen.quorum,
        "answered": answered(seen),
        "unanswered": unanswered(seen),
        "verdict": word,
        "holder": holder.as_ref().map(holder_json),
        "nodes": nodes,
    })
}

fn print_nodes(seen: &Inspection, held_word: &str) {
    let width = seen.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
    for n in &seen.nodes {
        let what = match &n.state {
            Ok(None) => "free".to_string(),
            Ok(Some(h)) => format!(
                "{held_word} {}  fingerprint {}  {}",
                label(h.label.as_deref()),
                h.fingerprint,
                ttl_text(h)
            ),
            Err(e) => format!("ERROR {}: {}", e.kind, e.message),
        };
        println!("  {:width$}  {what}", n.node);
    }
}

/// `fredlock inspect NAME`.
pub async fn inspect(redlock: &Redlock, name: &str, json: bool) -> i32 {
    let seen = match redlock.inspect(name).await {
        Ok(seen) => seen,
        Err(e) => return exit::fail(&e),
    };
    let (election_line, election) = crate::elect::inspect_election(redlock, name).await;
    if json {
        let mut out = as_json(redlock, &seen);
        out["election"] = election;
        println!("{out}");
    } else {
        let (word, holder) = verdict(&seen);
        let (ok, n) = (answered(&seen), seen.nodes.len());
        let on = if ok < n {
            format!(" on {ok} of {n} nodes")
        } else {
            String::new()
        };
        let head = match (word, &holder) {
            ("held", Some(h)) => format!(
                "held on a quorum by {} (fingerprint {}), {}",
                label(h.label.as_deref()),
                h.fingerprint,
                seen.remaining(&h.fingerprint)
                    .map_or("no expiry".to_string(), |t| format!("{} left", show(t)))
            ),
            ("free", _) => format!("free{on}"),
            ("split", _) => format!(
                "split: no holder on a quorum ({} of {n} nodes needed){on}",
                seen.quorum
            ),
            _ => format!(
                "unknown: {ok} of {n} nodes answered, and those that did not could complete a quorum ({} needed)",
                seen.quorum
            ),
        };
        println!("{name}: {head}{}", not_answered_text(&seen));
        if let Some(line) = election_line {
            println!("  {line}");
        }
        print_nodes(&seen, "held by");
    }
    answered_code(&seen, name, "who holds")
}

/// `fredlock break NAME --yes`.
pub async fn force_break(redlock: &Redlock, name: &str, json: bool) -> i32 {
    let broken = match redlock.force_release(name).await {
        Ok(b) => b,
        Err(e) => return exit::fail(&e),
    };
    if json {
        println!("{}", as_json(redlock, &broken));
    } else {
        let deleted = broken
            .nodes
            .iter()
            .filter(|n| matches!(n.state, Ok(Some(_))))
            .count();
        let head = match broken.holder() {
            Some(h) => format!(
                "broke the lock of {} (fingerprint {}), deleted on {deleted} of {} nodes",
                label(h.label.as_deref()),
                h.fingerprint,
                broken.nodes.len()
            ),
            None if deleted == 0 => format!(
                "nothing to break: no node {}held it",
                if answered(&broken) < broken.nodes.len() {
                    "that answered "
                } else {
                    ""
                }
            ),
            None => format!(
                "deleted on {deleted} of {} nodes (no holder on a quorum)",
                broken.nodes.len()
            ),
        };
        println!("{name}: {head}{}", not_answered_text(&broken));
        print_nodes(&broken, "deleted");
    }
    let code = answered_code(&broken, name, "whether anyone still holds");
    if code != exit::OK {
        eprintln!(
            "fredlock: the nodes that did not answer may still hold {name:?}: run `fredlock break {name} --yes` again once they are back"
        );
    }
    code
}
