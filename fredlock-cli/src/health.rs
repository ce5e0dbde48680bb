//! `fredlock health`: what the Redlock safety argument assumes of each node, checked.
//!
//! - reachable, round trip, server version;
//! - one server listed twice (same address, or same `run_id` behind two addresses): it would
//!   vote twice;
//! - persistence: a node that restarts empty within a TTL can grant a lock another client still
//!   holds (the Redlock restart rule); warned when neither AOF (fsync `always` or `everysec`)
//!   nor RDB snapshots are on;
//! - `maxmemory-policy`: any policy but `noeviction` may evict lock keys (a TTL key is exactly
//!   what `volatile-*` evicts first);
//! - replicas: asynchronous replication plus a failover can lose a lock key, unless votes are
//!   confirmed (`--confirm-replicas N`), and then a node with fewer than N replicas can grant
//!   nothing; the replicas' lag;
//! - the spread of the nodes' clocks (TIME): locks expire by each node's own clock.
//!
//! Reads use the Redlock's own client for each node (`Redlock::client`), one command at a time,
//! each bounded by `--timeout`.
//!
//! This file connects and runs the checks in order. Below it: `node.rs` (one node's checks and
//! the warnings its settings call for), `verdict.rs` (the verdict and its output), `warnings.rs`
//! (the warning ids and `--allow`).

use std::time::Duration;

use fredlock::{Error, InvalidInput, Redlock};
use serde_json::{json, Value as Json};

use crate::exit;

mod node;
mod verdict;
mod warnings;

pub use warnings::allowable;

use node::{check_node, clock_spread, find_same_run_ids, NodeReport};
use verdict::Fleet;
use warnings::Warning;

/// Clock spread above which a warning is given.
const CLOCK_SPREAD_WARN: Duration = Duration::from_secs(1);

/// Builds a Redlock over `urls`, leaving out entries that repeat an earlier server (each is
/// reported). Returns the Redlock, the original index of each of its nodes, and the duplicates
/// as `(index, index of the first, why)`.
async fn build(
    urls: &[String],
    prefix: &str,
    wait: Duration,
) -> Result<(Redlock, Vec<usize>, Vec<(usize, usize, String)>), Error> {
    let mut kept: Vec<usize> = (0..urls.len()).collect();
    let mut duplicates = Vec::new();
    loop {
        let built = Redlock::builder()
            .nodes(kept.iter().map(|&i| urls[i].clone()))
            .key_prefix(prefix)
            .connect_wait(wait)
            .wake_on_release(false)
            .build()
            .await;
        match built {
            Ok(redlock) => return Ok((redlock, kept, duplicates)),
            Err(Error::InvalidInput(InvalidInput::DuplicateNode {
                first,
                second,
                first_node,
                second_node,
                how,
            })) if second < kept.len() && first < kept.len() => {
                let why = format!(
                    "{second_node} is the same server as node {} ({first_node}){how}: it must not be listed twice (it would vote twice)",
                    kept[first]
                );
                duplicates.push((kept[second], kept[first], why));
                kept.remove(second);
            }
            Err(e) => return Err(e),
        }
    }
}

/// `fredlock health`. Exit 0 healthy, 1 degraded, 2 no quorum. Warnings whose id is in
/// `allow` are notes: shown, but not failing.
pub async fn health(
    urls: &[String],
    prefix: &str,
    timeout: Duration,
    json_out: bool,
    allow: &[String],
    confirm: Option<(u32, bool)>,
) -> i32 {
    let (redlock, kept, duplicates) = match build(urls, prefix, timeout).await {
        Ok(b) => b,
        Err(Error::Connect { failures, .. }) => return refused(urls.len(), &failures, json_out),
        // Too many nodes can grant no lock to this user (no scripts, no DELIFEQ).
        Err(Error::NotPermitted { failures, .. }) => {
            return refused(urls.len(), &failures, json_out)
        }
        Err(e) => return exit::fail(&e),
    };
    let configured = urls.len();
    let quorum = configured / 2 + 1;
    let mut reports: Vec<NodeReport> = (0..configured)
        .map(|i| NodeReport {
            url_index: i,
            ..NodeReport::default()
        })
        .collect();
    for (index, first, why) in &duplicates {
        if let Some(r) = reports.get_mut(*index) {
            r.node = redacted(&urls[*index]);
            r.duplicate_of = Some(*first);
            r.warnings.push(Warning::new("duplicate", why.clone()));
        }
    }
    // Which nodes are usable, with the library's own account of those that are not (waiting
    // for a node whose first connection attempt has not ended: one that never answers fails
    // after 2 s).
    let status = redlock.settled_node_status(timeout).await;
    for (pos, &index) in kept.iter().enumerate() {
        let report = &mut reports[index];
        let Some(node) = status.get(pos) else {
            continue;
        };
        report.node = node.name.clone();
        if let Some(e) = &node.cause {
            report.error = Some(format!("{}: {}", e.kind, e.message));
            report.answered = node.reachable;
            continue;
        }
        match redlock.client(pos) {
            Some(client) => check_node(client, timeout, report, confirm).await,
            None => report.warnings.push(Warning::new(
                "cluster-unchecked",
                "a Redis Cluster node: its shards are not checked here",
            )),
        }
    }
    redlock.close().await;
    find_same_run_ids(&mut reports);
    let spread = clock_spread(&reports);
    let mut fleet_warnings = Vec::new();
    if let Some(spread) = spread {
        if spread > CLOCK_SPREAD_WARN {
            fleet_warnings.push(Warning::new("clock-spread", format!(
                "the nodes' clocks are {} ms apart: locks expire by each node's own clock; check NTP on every node (a clock that jumps breaks the lock)",
                spread.as_millis()
            )));
        }
    }
    let fleet = Fleet::new(fleet_warnings, &mut reports, allow, quorum, spread);
    if json_out {
        fleet.print_json(&reports);
    } else {
        fleet.print_text(&reports);
    }
    fleet.code
}

/// `build()` failed because too few nodes accept our credentials (or connect at all): each
/// refusing node is shown as down, in the server's words. Exit 2.
fn refused(configured: usize, failures: &[fredlock::NodeError], json_out: bool) -> i32 {
    let quorum = configured / 2 + 1;
    let reachable = configured.saturating_sub(failures.len());
    if json_out {
        let nodes: Vec<Json> = failures
            .iter()
            .map(|e| json!({"node": e.node, "reachable": false, "answered": e.kind.answered(), "error": format!("{}: {}", e.kind, e.message)}))
            .collect();
        println!(
            "{}",
            json!({"status": "no-quorum", "configured": configured, "quorum": quorum, "reachable": reachable, "nodes": nodes})
        );
    } else {
        for e in failures {
            let head = if e.kind.answered() {
                "UNUSABLE (it answered)"
            } else {
                "DOWN"
            };
            println!("node {}: {head}: {}: {}", e.node, e.kind, e.message);
        }
        println!(
            "no-quorum: {reachable} of {configured} configured nodes usable, {quorum} needed for a quorum"
        );
    }
    exit::NO_QUORUM
}

/// A URL without its password, for a node the Redlock left out.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_left_out() {
        assert_eq!(redacted("redis://u:pw@h:1"), "redis://***@h:1");
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
    }
}
