//! One node as `fredlock health` sees it ([`NodeReport`]): round trip, version, role and
//! replicas, persistence, eviction policy, clock; the warnings its settings call for; and, over
//! every node, a server listed twice under different URLs and the clocks' spread.
//!
//! Owns the commands sent to a node and what their replies mean. Must not decide the verdict
//! nor print anything (that is `verdict.rs`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fredlock::fred::prelude::Options;
use fredlock::fred::prelude::{ClientLike, Value};
use fredlock::fred::types::{ClusterHash, CustomCommand};

use super::warnings::Warning;

/// What one configured node showed.
#[derive(Default)]
pub(super) struct NodeReport {
    pub(super) url_index: usize,
    pub(super) node: String,
    pub(super) error: Option<String>,
    /// The error was the node's answer (`NOPERM`, ...): it is up, but not usable for locks.
    pub(super) answered: bool,
    pub(super) duplicate_of: Option<usize>,
    pub(super) rtt: Option<Duration>,
    pub(super) version: Option<String>,
    pub(super) run_id: Option<String>,
    pub(super) role: Option<String>,
    pub(super) replicas: Option<u64>,
    /// The largest `lag` (seconds since its last acknowledgement) among the replicas.
    pub(super) replica_lag_s: Option<u64>,
    pub(super) aof: Option<bool>,
    pub(super) appendfsync: Option<String>,
    pub(super) save: Option<String>,
    pub(super) maxmemory_policy: Option<String>,
    /// This node's clock minus ours, in ms, at the middle of the TIME round trip.
    pub(super) clock_offset_ms: Option<f64>,
    pub(super) warnings: Vec<Warning>,
    /// Warnings accepted with `--allow`.
    pub(super) notes: Vec<Warning>,
}

impl NodeReport {
    pub(super) fn reachable(&self) -> bool {
        self.error.is_none() && self.duplicate_of.is_none()
    }
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

pub(super) async fn check_node(
    client: &fredlock::fred::clients::Client,
    timeout: Duration,
    r: &mut NodeReport,
    confirm: Option<(u32, bool)>,
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
    r.replica_lag_s = replica_lag(&info);
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
    warn(r, config_failed, confirm);
}

/// The largest `lag=` of the `slaveN:` lines of `INFO` (a primary's replicas).
fn replica_lag(info: &HashMap<String, String>) -> Option<u64> {
    info.iter()
        .filter(|(k, _)| {
            k.strip_prefix("slave")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|(_, v)| v.split(',').find_map(|f| f.strip_prefix("lag=")))
        .filter_map(|lag| lag.parse::<u64>().ok())
        .max()
}

/// The warnings a node's settings call for (`confirm`: `--confirm-replicas` and
/// `--confirm-fsync`).
fn warn(r: &mut NodeReport, config_failed: Option<String>, confirm: Option<(u32, bool)>) {
    if let (Some((_, true)), Some(false)) = (confirm, r.aof) {
        r.warnings.push(Warning::new(
            "no-aof-for-fsync",
            "appendonly is off: --confirm-fsync waits for the append-only file (WAITAOF), so this node grants no lock; set appendonly yes here and on its replicas",
        ));
    }
    let confirm = confirm.map(|(n, _)| n);
    if r.role.as_deref() == Some("slave") || r.role.as_deref() == Some("replica") {
        r.warnings.push(Warning::new(
            "replica",
            "this node is a replica: lock writes fail (READONLY); list independent primaries",
        ));
    }
    match (r.replicas, confirm) {
        (Some(n), None) if n > 0 => r.warnings.push(Warning::new("replicas-connected", format!(
            "{n} replica(s) connected: a failover to a replica can lose lock keys (replication is asynchronous); confirm votes with --confirm-replicas 1, or run independent primaries without failover"
        ))),
        (Some(n), Some(want)) if n < u64::from(want) => r.warnings.push(Warning::new("too-few-replicas", format!(
            "{n} replica(s) connected, --confirm-replicas asks for {want}: no vote of this node can be confirmed, so it grants no lock"
        ))),
        _ => {}
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
pub(super) fn find_same_run_ids(reports: &mut [NodeReport]) {
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

pub(super) fn clock_spread(reports: &[NodeReport]) -> Option<Duration> {
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

#[cfg(test)]
mod tests {
    use super::super::warnings::allowable;
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
        warn(&mut r, None, None);
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
        warn(&mut r, None, None);
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
        warn(&mut r, None, None);
        assert!(r.warnings.is_empty());
        let mut r = NodeReport {
            appendfsync: Some("no".into()),
            ..healthy()
        };
        warn(&mut r, None, None);
        assert_eq!(r.warnings.len(), 1);
        assert_eq!(r.warnings[0].id, "no-persistence");
        // Every id a warning can carry is known to --allow.
        assert!(allowable("no-persistence").is_ok());
        assert!(allowable("duplicate").is_err());
        assert!(allowable("nonsense").is_err());
    }

    #[test]
    fn replicas_against_the_confirmation_asked() {
        let with = |replicas: u64, confirm: Option<u32>| {
            let mut r = NodeReport {
                replicas: Some(replicas),
                ..healthy()
            };
            warn(&mut r, None, confirm.map(|n| (n, false)));
            r.warnings.iter().map(|w| w.id).collect::<Vec<_>>()
        };
        assert_eq!(with(1, None), ["replicas-connected"]);
        assert_eq!(with(0, Some(1)), ["too-few-replicas"]);
        assert_eq!(with(1, Some(2)), ["too-few-replicas"]);
        assert!(
            with(1, Some(1)).is_empty(),
            "confirmed: a failover keeps the keys"
        );
        assert!(with(0, None).is_empty());
        assert!(allowable("too-few-replicas").is_ok());
        // --confirm-fsync on a node without an append-only file: it could grant nothing.
        let mut r = NodeReport {
            replicas: Some(1),
            aof: Some(false),
            save: Some("3600 1".into()),
            ..healthy()
        };
        warn(&mut r, None, Some((1, true)));
        let ids: Vec<_> = r.warnings.iter().map(|w| w.id).collect();
        assert_eq!(ids, ["no-aof-for-fsync"]);
        let info = parse_info(
            "# Replication\r\nconnected_slaves:2\r\nslave0:ip=a,port=1,state=online,offset=5,lag=0\r\n\
             slave1:ip=b,port=2,state=online,offset=3,lag=3\r\nslave_read_only:1\r\n",
        );
        assert_eq!(replica_lag(&info), Some(3));
        assert_eq!(replica_lag(&HashMap::new()), None);
    }

    #[test]
    fn info_lines() {
        let info = parse_info("# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n\r\n");
        assert_eq!(
            info.get("redis_version").map(String::as_str),
            Some("7.0.15")
        );
    }
}
