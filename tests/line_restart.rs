//! Wait lines on nodes that keep their data across a restart (append-only file, as fencing
//! needs): a waiter that gives up while its gate is down must still leave the gate's line once
//! the gate is back, or the line comes back with the waiter at its head and the gate refuses
//! every other acquire of the key until that place's lease runs out (each refused acquire that
//! gives up the same way extends the blockade). Linux: the test reads /proc/net/tcp.

mod common;

use std::time::Duration;

use common::{build, eventually, pubsub_clients, retry, unique};
use fredlock::Redlock;
use fredlock_testkit::{LocalNodes, RespValue};

const TTL: Duration = Duration::from_secs(30);
/// At least the size of the leave (EVALSHA, its sha, the lock and line keys, the member and the
/// channel prefix: about 250 bytes); more than anything else the waiter sends the gate then.
const LEAVE_BYTES: u64 = 200;

/// The members of `resource`'s wait line on node `gate`, head first.
async fn line_members(
    nodes: &LocalNodes,
    redlock: &Redlock,
    gate: usize,
    resource: &str,
) -> Vec<String> {
    let line = format!("{}~line:{{{}}}", redlock.key(""), redlock.key(resource));
    match nodes.command(gate, &["ZRANGE", &line, "0", "-1"]).await {
        Ok(RespValue::Array(Some(v))) => v
            .into_iter()
            .filter_map(|m| match m {
                RespValue::Bulk(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Bytes received but not yet read by the server on loopback port `port` (its accepted
/// connections' receive queues, from /proc/net/tcp): commands written to a frozen node.
fn unread_bytes(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, queues) = (f.get(1)?, f.get(4)?);
            let rx = queues.split(':').nth(1)?;
            addr.ends_with(&local)
                .then(|| u64::from_str_radix(rx, 16).ok())
                .flatten()
        })
        .sum()
}

/// A waiter is in line on the gate; the gate freezes; the waiter is cancelled and its leave
/// reaches the frozen gate's socket unread; the gate is killed (the leave is lost with it) and
/// comes back with its data, line included; the key is free. The waiter's place must go (its
/// leave retried once the gate answers), and a newcomer with a short retry budget must get the
/// lock. Before, the one leave was lost: the place stayed at the head of the line, alive for its
/// lease (3 s), the member in the line for the line's life (12 s), and every other acquire of
/// the key was refused at the gate while the lease lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_lost_with_a_crashed_gate_is_retried_once_it_is_back() {
    let mut nodes = LocalNodes::start_durable(3).await.expect("durable nodes");
    // Long pauses: the waiter sends nothing of its own while the test watches the gate's socket.
    let waiter = build(nodes.urls(), |b| b.retry(retry(u32::MAX, 10_000, 0))).await;
    let r = unique("crashed-gate");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).expect("a gate");
    // Someone else holds the key everywhere: the waiter waits in line at the gate.
    for i in 0..nodes.len() {
        nodes
            .command(i, &["SET", &key, "someone-else", "PX", "30000"])
            .await
            .expect("SET");
    }
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            line_members(&nodes, &waiter, gate, &r).await.len() == 1
        })
        .await,
        "the waiter joined the line on node {gate}"
    );
    // Its attempt is over (only a refused attempt starts the wake-up subscriber): it waits.
    assert!(
        eventually(Duration::from_secs(5), || async {
            pubsub_clients(&nodes, gate).await == 1
        })
        .await,
        "the waiter subscribed to its wake-ups on the gate"
    );
    nodes.pause(gate).expect("freeze the gate");
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    assert!(
        eventually(Duration::from_secs(5), || async {
            unread_bytes(nodes.port(gate)) >= LEAVE_BYTES
        })
        .await,
        "the leave reached the frozen gate"
    );
    nodes.kill(gate).expect("kill the gate");
    nodes.start_node(gate).await.expect("the gate is back");
    // Back with its data (the line too; a retried leave may already have removed it).
    assert_eq!(
        nodes.get(gate, &key).await.expect("GET").as_deref(),
        Some("someone-else"),
        "the gate came back empty: the scenario is not what it claims"
    );
    for i in 0..nodes.len() {
        nodes.command(i, &["DEL", &key]).await.expect("DEL");
    }
    // Well within the place's lease (3 s) and the line's own expiry (12 s).
    assert!(
        eventually(Duration::from_secs(2), || async {
            line_members(&nodes, &waiter, gate, &r).await.is_empty()
        })
        .await,
        "the cancelled waiter is still in line: {:?}",
        line_members(&nodes, &waiter, gate, &r).await
    );
    let newcomer = build(nodes.urls(), |b| b.retry(retry(3, 5, 5))).await;
    let lock = newcomer
        .acquire(r.as_str(), TTL)
        .await
        .expect("the key is free and nobody waits");
    lock.release().await.expect("release");
}
