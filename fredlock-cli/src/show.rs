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

/// The verdict as a word and the holder on a quorum.
fn verdict(seen: &Inspection) -> (&'static str, Option<Holder>) {
    match seen.verdict() {
        Verdict::Free => ("free", None),
        Verdict::Held(h) => ("held", Some(h)),
        _ => ("split", None),
    }
}

fn answered(seen: &Inspection) -> usize {
    seen.nodes.iter().filter(|n| n.state.is_ok()).count()
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
        Err(e) => return crate::fail(&e),
    };
    let (election_line, election) = crate::elect::inspect_election(redlock, name).await;
    if json {
        let mut out = as_json(redlock, &seen);
        out["election"] = election;
        println!("{out}");
    } else {
        let (word, holder) = verdict(&seen);
        let head = match (word, &holder) {
            ("held", Some(h)) => format!(
                "held on a quorum by {} (fingerprint {}), {}",
                label(h.label.as_deref()),
                h.fingerprint,
                seen.remaining(&h.fingerprint)
                    .map_or("no expiry".to_string(), |t| format!("{} left", show(t)))
            ),
            ("free", _) => "free".to_string(),
            _ => format!(
                "split: no holder on a quorum ({} of {} nodes needed)",
                seen.quorum,
                seen.nodes.len()
            ),
        };
        println!("{name}: {head}");
        if let Some(line) = election_line {
            println!("  {line}");
        }
        print_nodes(&seen, "held by");
    }
    if answered(&seen) < seen.quorum {
        eprintln!(
            "fredlock: only {} of {} nodes answered ({} needed): the verdict may be wrong",
            answered(&seen),
            seen.nodes.len(),
            seen.quorum
        );
        return exit::UNAVAILABLE;
    }
    exit::OK
}

/// `fredlock break NAME --yes`.
pub async fn force_break(redlock: &Redlock, name: &str, json: bool) -> i32 {
    let broken = match redlock.force_release(name).await {
        Ok(b) => b,
        Err(e) => return crate::fail(&e),
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
            None if deleted == 0 => "nothing to break: no node held it".to_string(),
            None => format!(
                "deleted on {deleted} of {} nodes (no holder on a quorum)",
                broken.nodes.len()
            ),
        };
        println!("{name}: {head}");
        print_nodes(&broken, "deleted");
    }
    let failed = broken.nodes.len() - answered(&broken);
    if failed > 0 {
        eprintln!(
            "fredlock: {failed} node(s) did not answer and may still hold {name:?}: run `fredlock break {name} --yes` again once they are back"
        );
        return exit::DEGRADED;
    }
    exit::OK
}
