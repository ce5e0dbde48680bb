//! The verdict of `fredlock health` over every node (healthy, degraded, no quorum, with the
//! warnings `--allow` turns into notes), printed as text or JSON.
//!
//! Owns the verdict and its output. Must not talk to a node (that is `node.rs`).

use std::time::Duration;

use serde_json::{json, Value as Json};

use super::node::NodeReport;
use super::warnings::{warning_json, Warning};
use crate::exit;

/// The verdict over every node, with the fleet's own warnings and notes.
pub(super) struct Fleet {
    status: &'static str,
    pub(super) code: i32,
    quorum: usize,
    reachable: usize,
    spread: Option<Duration>,
    warnings: Vec<Warning>,
    notes: Vec<Warning>,
    /// Warnings and notes of the fleet and every node.
    warning_count: usize,
    note_count: usize,
}

impl Fleet {
    /// Turns the warnings whose id is in `allow` into notes (the fleet's and each node's),
    /// then decides: no quorum, degraded (a node down or a warning left), or healthy.
    pub(super) fn new(
        warnings: Vec<Warning>,
        reports: &mut [NodeReport],
        allow: &[String],
        quorum: usize,
        spread: Option<Duration>,
    ) -> Fleet {
        let allowed = |w: &Warning| allow.iter().any(|a| a == w.id);
        let (notes, warnings): (Vec<Warning>, Vec<Warning>) =
            warnings.into_iter().partition(allowed);
        for r in reports.iter_mut() {
            let (notes, warnings) = std::mem::take(&mut r.warnings)
                .into_iter()
                .partition(allowed);
            r.notes = notes;
            r.warnings = warnings;
        }
        let note_count = notes.len() + reports.iter().map(|r| r.notes.len()).sum::<usize>();
        let warning_count =
            warnings.len() + reports.iter().map(|r| r.warnings.len()).sum::<usize>();
        let reachable = reports.iter().filter(|r| r.reachable()).count();
        let down = reports
            .iter()
            .filter(|r| r.error.is_some() && r.duplicate_of.is_none())
            .count();
        let (status, code) = if reachable < quorum {
            ("no-quorum", exit::NO_QUORUM)
        } else if down > 0 || warning_count > 0 {
            ("degraded", exit::DEGRADED)
        } else {
            ("healthy", exit::OK)
        };
        Fleet {
            status,
            code,
            quorum,
            reachable,
            spread,
            warnings,
            notes,
            warning_count,
            note_count,
        }
    }

    pub(super) fn print_json(&self, reports: &[NodeReport]) {
        let nodes: Vec<Json> = reports.iter().map(node_json).collect();
        println!(
            "{}",
            json!({
                "status": self.status,
                "configured": reports.len(),
                "quorum": self.quorum,
                "reachable": self.reachable,
                "clock_spread_ms": self.spread.map(|s| s.as_secs_f64() * 1000.0),
                "warnings": self.warnings.iter().map(warning_json).collect::<Vec<_>>(),
                "notes": self.notes.iter().map(warning_json).collect::<Vec<_>>(),
                "nodes": nodes,
            })
        );
    }

    pub(super) fn print_text(&self, reports: &[NodeReport]) {
        for r in reports {
            print_node(r);
        }
        if let Some(spread) = self.spread {
            println!(
                "clock spread: {:.1} ms across reachable nodes",
                spread.as_secs_f64() * 1000.0
            );
        }
        for w in &self.warnings {
            println!("  WARNING: {} [{}]", w.message, w.id);
        }
        for w in &self.notes {
            println!("  note (allowed): {} [{}]", w.message, w.id);
        }
        let allowed = match self.note_count {
            0 => String::new(),
            n => format!(", {n} allowed"),
        };
        println!(
            "{}: {} of {} configured nodes reachable as distinct servers, {} needed for a quorum; {} warning(s){allowed}",
            self.status,
            self.reachable,
            reports.len(),
            self.quorum,
            self.warning_count
        );
    }
}

fn node_json(r: &NodeReport) -> Json {
    json!({
        "index": r.url_index,
        "node": r.node,
        "reachable": r.reachable(),
        "error": r.error,
        "answered": r.answered,
        "duplicate_of": r.duplicate_of,
        "rtt_ms": r.rtt.map(|d| d.as_secs_f64() * 1000.0),
        "version": r.version,
        "run_id": r.run_id,
        "role": r.role,
        "replicas": r.replicas,
        "replica_lag_s": r.replica_lag_s,
        "aof": r.aof,
        "appendfsync": r.appendfsync,
        "save": r.save,
        "maxmemory_policy": r.maxmemory_policy,
        "clock_offset_ms": r.clock_offset_ms,
        "warnings": r.warnings.iter().map(warning_json).collect::<Vec<_>>(),
        "notes": r.notes.iter().map(warning_json).collect::<Vec<_>>(),
    })
}

fn print_node(r: &NodeReport) {
    let head = if let Some(first) = r.duplicate_of {
        format!("DUPLICATE of node {first}")
    } else if let Some(e) = &r.error {
        match r.answered {
            // Up, but its answer rules it out (a NOPERM): never worded as down.
            true => format!("UNUSABLE (it answered): {e}"),
            false => format!("DOWN: {e}"),
        }
    } else {
        let persistence = match (r.aof, r.save.as_deref()) {
            (Some(true), _) => format!(
                "aof (fsync {})",
                r.appendfsync.as_deref().unwrap_or("unknown")
            ),
            (_, Some(save)) if !save.trim().is_empty() => format!("rdb ({save})"),
            (Some(false), Some(_)) => "none".to_string(),
            _ => "unknown".to_string(),
        };
        let replicas = match (r.replicas, r.replica_lag_s) {
            (Some(n), Some(lag)) if n > 0 => format!("  replicas {n} (lag {lag}s)"),
            (Some(n), _) if n > 0 => format!("  replicas {n}"),
            _ => String::new(),
        };
        format!(
            "ok  rtt {}  {}  role {}{replicas}  persistence {persistence}  maxmemory-policy {}",
            r.rtt
                .map_or("?".into(), |d| format!("{:.2}ms", d.as_secs_f64() * 1000.0)),
            r.version.as_deref().unwrap_or("version unknown"),
            r.role.as_deref().unwrap_or("?"),
            r.maxmemory_policy.as_deref().unwrap_or("?"),
        )
    };
    println!("node {} {}: {head}", r.url_index, r.node);
    for w in &r.warnings {
        println!("  WARNING: {} [{}]", w.message, w.id);
    }
    for w in &r.notes {
        println!("  note (allowed): {} [{}]", w.message, w.id);
    }
}
