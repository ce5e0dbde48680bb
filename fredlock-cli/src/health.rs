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
//! - replicas: asynchronous replication plus a failover can lose a lock key;
//! - the spread of the nodes' clocks (TIME): locks expire by each node's own clock.
//!
//! Reads use the Redlock's own client for each node (`Redlock::client`), one command at a time,
//! each bounded by `--timeout`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fredlock::fred::prelude::Options;
use fredlock::fred::prelude::{ClientLike, Value};
use fredlock::fred::types::{ClusterHash, CustomCommand};
use fredlock::{Error, InvalidInput, Redlock};
use serde_json::{json, Value as Json};

use crate::exit;

/// Clock spread above which a warning is given.
const CLOCK_SPREAD_WARN: Duration = Duration::from_secs(1);

/// A warning's stable id (the `id` in `--json`, what `--allow` takes) and its text.
struct Warning {
    id: &'static str,
    message: String,
}

impl Warning {
    fn new(id: &'static str, message: impl Into<String>) -> Warning {
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

fn warning_json(w: &Warning) -> Json {
    json!({"id": w.id, "message": w.message})
}

/// What one configured node showed.
#[derive(Default)]
struct NodeReport {
    url_index: usize,
    node: String,
    error: Option<String>,
    /// The error was the node's answer (`NOPERM`, ...): it is up, but not usable for locks.
    answered: bool,
    duplicate_of: Option<usize>,
    rtt: Option<Duration>,
    version: Option<String>,
    run_id: Option<String>,
    role: Option<String>,
    replicas: Option<u64>,
    aof: Option<bool>,
    appendfsync: Option<String>,
    save: Option<String>,
    maxmemory_policy: Option<String>,
    /// This node's clock minus ours, in ms, at the middle of the TIME round trip.
    clock_offset_ms: Option<f64>,
    warnings: Vec<Warning>,
    /// Warnings accepted with `--allow`.
    notes: Vec<Warning>,
}

impl NodeReport {
    fn reachable(&self) -> bool {
        self.error.is_none() && self.duplicate_of.is_none()
    }
}

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
) -> i32 {
    let (redlock, kept, duplicates) = match build(urls, prefix, timeout).await {
        Ok(b) => b,
        Err(Error::Connect { failures, .. }) => return refused(urls.len(), &failures, json_out),
        // Too many nodes can grant no lock to this user (no scripts, no DELIFEQ).
        Err(Error::NotPermitted { failures, .. }) => {
            return refused(urls.len(), &failures, json_out)
        }
        Err(e) => return crate::fail(&e),
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
    // Which nodes answer, with the library's own account of those that do not.
    let probe = redlock.inspect("health-probe").await;
    let names = redlock.node_names();
    for (pos, &index) in kept.iter().enumerate() {
        let report = &mut reports[index];
        report.node = names.get(pos).cloned().unwrap_or_default();
        if let Ok(seen) = &probe {
            if let Some(Err(e)) = seen.nodes.get(pos).map(|n| &n.state) {
                report.error = Some(format!("{}: {}", e.kind, e.message));
                report.answered = e.kind.answered();
                continue;
            }
        }
        match redlock.client(pos) {
            Some(client) => check_node(client, timeout, report).await,
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

/// The verdict over every node, with the fleet's own warnings and notes.
struct Fleet {
    status: &'static str,
    code: i32,
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
    fn new(
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

    fn print_json(&self, reports: &[NodeReport]) {
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

    fn print_text(&self, reports: &[NodeReport]) {
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
        format!(
            "ok  rtt {}  {}  role {}  persistence {persistence}  maxmemory-policy {}",
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

/// One command on `client`, bounded by `timeout`, one attempt.
async fn command(
    client: &fredlock::fred::clients::Client,
    timeout: Duration,
    args: &[&str],
) -> Result<Value, String> {
    let Some((name, rest)) = args.split_first() else {
        return Err("empty command".into());
    };
    let cmd = CustomCommand::new(name.to_string(), ClusterHash::Random, false);
    let options = Options {
        timeout: Some(timeout),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
    };
    let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
    client
        .with_options(&options)
        .custom::<Value, String>(cmd, rest)
        .await
        .map_err(|e| format!("{name}: {}", e.details()))
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(|s| s.into_owned())
}

/// `CONFIG GET name`'s value (`[name, value]` or a map).
fn config_value(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(map) => map.clone().inner().values().next().and_then(text),
        _ => None,
    }
}

async fn check_node(
    client: &fredlock::fred::clients::Client,
    timeout: Duration,
    r: &mut NodeReport,
) {
    // Round trip: the best of three PINGs.
    let mut best: Option<Duration> = None;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        match command(client, timeout, &["PING"]).await {
            Ok(_) => {
                let rtt = start.elapsed();
                best = Some(best.map_or(rtt, |b| b.min(rtt)));
            }
            Err(e) => {
                r.error = Some(e);
                return;
            }
        }
    }
    r.rtt = best;
    let info: HashMap<String, String> = match command(client, timeout, &["INFO"]).await {
        Ok(v) => text(&v).map(|t| parse_info(&t)).unwrap_or_default(),
        Err(e) => {
            r.warnings.push(Warning::new(
                "info-failed",
                format!("INFO failed ({e}): cannot check this node"),
            ));
            HashMap::new()
        }
    };
    r.version = info
        .get("valkey_version")
        .map(|v| format!("valkey {v}"))
        .or_else(|| info.get("redis_version").map(|v| format!("redis {v}")));
    r.run_id = info.get("run_id").cloned();
    r.role = info.get("role").cloned();
    r.replicas = info.get("connected_slaves").and_then(|v| v.parse().ok());
    r.aof = info.get("aof_enabled").map(|v| v == "1");
    r.maxmemory_policy = info.get("maxmemory_policy").cloned();
    // CONFIG may be renamed or forbidden (managed services): then what INFO says is all.
    let mut config_failed = None;
    for (param, slot) in [
        ("appendfsync", &mut r.appendfsync),
        ("save", &mut r.save),
        ("maxmemory-policy", &mut r.maxmemory_policy),
    ] {
        match command(client, timeout, &["CONFIG", "GET", param]).await {
            Ok(v) => {
                if let Some(value) = config_value(&v) {
                    *slot = Some(value);
                }
            }
            Err(e) => config_failed = Some(e),
        }
    }
    let now_before = SystemTime::now();
    let started = std::time::Instant::now();
    if let Ok(Value::Array(parts)) = command(client, timeout, &["TIME"]).await {
        let half = started.elapsed() / 2;
        let field = |i: usize| -> Option<f64> {
            parts
                .get(i)
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse::<f64>().ok())
        };
        if let (Some(secs), Some(micros), Ok(local)) = (
            field(0),
            field(1),
            (now_before + half).duration_since(UNIX_EPOCH),
        ) {
            let node_ms = secs * 1000.0 + micros / 1000.0;
            r.clock_offset_ms = Some(node_ms - local.as_secs_f64() * 1000.0);
        }
    }
    warn(r, config_failed);
}

/// The warnings a node's settings call for.
fn warn(r: &mut NodeReport, config_failed: Option<String>) {
    if r.role.as_deref() == Some("slave") || r.role.as_deref() == Some("replica") {
        r.warnings.push(Warning::new(
            "replica",
            "this node is a replica: lock writes fail (READONLY); list independent primaries",
        ));
    }
    if let Some(n) = r.replicas.filter(|&n| n > 0) {
        r.warnings.push(Warning::new("replicas-connected", format!(
            "{n} replica(s) connected: a failover to a replica can lose lock keys (replication is asynchronous); Redlock wants independent primaries without failover"
        )));
    }
    match r.maxmemory_policy.as_deref() {
        Some("noeviction") => {}
        Some(policy) => r.warnings.push(Warning::new("eviction", format!(
            "maxmemory-policy is {policy}: under memory pressure Redis may evict lock keys and grant a held lock again; set maxmemory-policy noeviction"
        ))),
        None => r.warnings.push(Warning::new(
            "maxmemory-policy-unknown",
            "maxmemory-policy unknown (INFO and CONFIG GET did not say)",
        )),
    }
    let aof_syncs = r.aof == Some(true)
        && matches!(
            r.appendfsync.as_deref(),
            Some("always") | Some("everysec") | None
        );
    let rdb = r.save.as_deref().is_some_and(|s| !s.trim().is_empty());
    match (r.aof, &r.save, config_failed) {
        (None, None, Some(e)) => r.warnings.push(Warning::new("persistence-unknown", format!(
            "persistence unknown ({e}): if this node restarts empty it can grant a lock someone still holds"
        ))),
        _ if !aof_syncs && !rdb => r.warnings.push(Warning::new(
            "no-persistence",
            "no persistence (no AOF with fsync always/everysec, no RDB): a restart loses every lock; keep a restarted node out for longer than the longest TTL (the Redlock restart rule), or set appendonly yes and appendfsync always",
        )),
        _ => {}
    }
}

/// Marks entries whose server (run_id) was already seen: built from different URLs, the
/// library found none of them at build, but they may have connected since.
fn find_same_run_ids(reports: &mut [NodeReport]) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, report) in reports.iter_mut().enumerate() {
        if !report.reachable() {
            continue;
        }
        let Some(run_id) = report.run_id.clone() else {
            continue;
        };
        match seen.get(&run_id) {
            Some(&first) => {
                report.duplicate_of = Some(first);
                report.warnings.push(Warning::new("duplicate", format!(
                    "the same server as node {first} (run_id {run_id}): it must not be listed twice (it would vote twice)"
                )));
            }
            None => {
                seen.insert(run_id, i);
            }
        }
    }
}

fn clock_spread(reports: &[NodeReport]) -> Option<Duration> {
    let offsets: Vec<f64> = reports
        .iter()
        .filter(|r| r.reachable())
        .filter_map(|r| r.clock_offset_ms)
        .collect();
    if offsets.len() < 2 {
        return None;
    }
    let max = offsets.iter().cloned().fold(f64::MIN, f64::max);
    let min = offsets.iter().cloned().fold(f64::MAX, f64::min);
    Duration::try_from_secs_f64(((max - min) / 1000.0).max(0.0)).ok()
}

/// `INFO`'s `key:value` lines.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
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

    fn healthy() -> NodeReport {
        NodeReport {
            role: Some("master".into()),
            replicas: Some(0),
            aof: Some(true),
            appendfsync: Some("always".into()),
            save: Some(String::new()),
            maxmemory_policy: Some("noeviction".into()),
            ..NodeReport::default()
        }
    }

    #[test]
    fn a_durable_primary_with_noeviction_has_no_warning() {
        let mut r = healthy();
        warn(&mut r, None);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn each_risk_is_named() {
        let mut r = NodeReport {
            aof: Some(false),
            maxmemory_policy: Some("allkeys-lru".into()),
            replicas: Some(1),
            ..healthy()
        };
        warn(&mut r, None);
        let all: Vec<String> = r
            .warnings
            .iter()
            .map(|w| format!("{} {}", w.id, w.message))
            .collect();
        let all = all.join("\n");
        for says in ["allkeys-lru", "no persistence", "replica(s) connected"] {
            assert!(all.contains(says), "{says}: {all}");
        }
        // RDB alone counts as persistence; AOF with fsync no does not.
        let mut r = NodeReport {
            aof: Some(true),
            appendfsync: Some("no".into()),
            save: Some("3600 1".into()),
            ..healthy()
        };
        warn(&mut r, None);
        assert!(r.warnings.is_empty());
        let mut r = NodeReport {
            appendfsync: Some("no".into()),
            ..healthy()
        };
        warn(&mut r, None);
        assert_eq!(r.warnings.len(), 1);
        assert_eq!(r.warnings[0].id, "no-persistence");
        // Every id a warning can carry is known to --allow.
        assert!(allowable("no-persistence").is_ok());
        assert!(allowable("duplicate").is_err());
        assert!(allowable("nonsense").is_err());
    }

    #[test]
    fn info_lines_and_passwords() {
        let info = parse_info("# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n\r\n");
        assert_eq!(
            info.get("redis_version").map(String::as_str),
            Some("7.0.15")
        );
        assert_eq!(redacted("redis://u:pw@h:1"), "redis://***@h:1");
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
    }
}
