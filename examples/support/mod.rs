//! What the bench examples share: process and machine facts, medians, and the measurements
//! that `bench` runs beside the ones of its own (`waiters`: `bench_waiters`'s contention rounds;
//! `keepalive`: `bench_keepalive`'s child processes; `fleet`: the fleet table, P child processes
//! on one lock; `etcd`: etcd 3.4, the fleet table's peer). Included by each example with
//! `#[path = "support/mod.rs"] mod support;`; each example uses only part of it.
#![allow(dead_code)]

pub mod etcd;
pub mod fleet;
pub mod keepalive;
pub mod node_redlock;
pub mod waiters;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

/// Median of a list (mean of the two middle values for an even count; NaN when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The output of a shell command, trimmed, or `unknown` (facts only; never fatal).
pub fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), or `unknown`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU time (user + system, all threads) this process used so far, from `/proc/self/stat`
/// (10 ms ticks); `None` where that does not exist (not Linux).
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// Resident memory of this process, from /proc/self/statm (Linux); `None` elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// `host:port` of a `redis://` URL, resolved.
pub async fn addr_of(url: &str) -> SocketAddr {
    let rest = url
        .split("://")
        .nth(1)
        .unwrap_or(url)
        .split(['/', '?'])
        .next()
        .unwrap_or("");
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    tokio::net::lookup_host(hostport)
        .await
        .unwrap_or_else(|e| panic!("cannot resolve {url}: {e}"))
        .next()
        .unwrap_or_else(|| panic!("{url} resolves to no address"))
}
