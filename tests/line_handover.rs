//! The wait lines cost nothing while nobody waits: an uncontended acquire+release sends each
//! node what a plain Redlock sends (`SET NX PX`, then one compare-and-delete), with no script
//! body after warm-up, and leaves nothing of a line behind. (That a release while someone waits
//! wakes the head is `tests/wake.rs`.)

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::lines::line_key;
use common::*;
use fredlock_testkit::{LocalNodes, RespValue};

const TTL: Duration = Duration::from_secs(30);
const CYCLES: u64 = 20;

/// Every command node `i` served since its last CONFIG RESETSTAT, by name (INFO commandstats;
/// calls inside scripts included), without the test's own INFO and CONFIG.
async fn calls(nodes: &LocalNodes, i: usize) -> HashMap<String, u64> {
    let info = nodes.command(i, &["INFO", "commandstats"]).await.unwrap();
    let RespValue::Bulk(Some(text)) = info else {
        panic!("INFO commandstats: {info:?}");
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let n = rest.split(',').next()?.parse().ok()?;
            Some((name.to_string(), n))
        })
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

fn count(calls: &HashMap<String, u64>, name: &str) -> u64 {
    calls.get(name).copied().unwrap_or(0)
}

/// The raw floor's cycle on one node is `SET NX PX`, then EVALSHA of a GET-compare-DEL
/// script: 4 commands as INFO counts them (or 2 with a native compare-and-delete). fredlock's
/// cycle must send no more, to the lock's gate node as to the others, and no EVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_sends_each_node_what_a_plain_redlock_sends() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| b).await;
    let r = unique("plain");
    assert!(redlock.line_node(&r).is_some(), "the resource has a gate");
    // Warm-up: a connection's release sends the script's body (EVAL) until the server's answer
    // to the first one is in, so on a loaded machine the release after a late one sends it too.
    // Cycles until one whole cycle, every node's release landed, sent no EVAL anywhere (an
    // EVALSHA is sent only once its connection knows the server has the script).
    let mut warm = false;
    for _ in 0..20 {
        for i in 0..nodes.len() {
            nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
        }
        let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
        lock.release().await.unwrap();
        let mut no_eval = true;
        for i in 0..nodes.len() {
            let landed = eventually(Duration::from_secs(5), || async {
                let c = calls(&nodes, i).await;
                count(&c, "evalsha") + count(&c, "delifeq") + count(&c, "eval") >= 1
            })
            .await;
            assert!(landed, "node {i}: the warm-up's release never landed");
            no_eval &= count(&calls(&nodes, i).await, "eval") == 0;
        }
        if no_eval {
            warm = true;
            break;
        }
    }
    assert!(
        warm,
        "20 warm-up cycles, each sending a script body somewhere"
    );
    for i in 0..nodes.len() {
        nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
    }
    // A release returns at its quorum: the last node's may still be on its way. Each cycle
    // waits for it, so that a node slowed by a busy machine does not have several cycles' commands
    // queued at once (they would then share a batched call, which is a different path).
    let released = |c: &HashMap<String, u64>| count(c, "evalsha") + count(c, "delifeq");
    for k in 1..=CYCLES {
        let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
        lock.release().await.unwrap();
        for i in 0..nodes.len() {
            eventually(Duration::from_secs(5), || async {
                released(&calls(&nodes, i).await) >= k
            })
            .await;
        }
    }
    for i in 0..nodes.len() {
        assert!(
            eventually(Duration::from_secs(5), || async {
                released(&calls(&nodes, i).await) >= CYCLES
            })
            .await,
            "node {i}: {:?}",
            calls(&nodes, i).await
        );
        let c = calls(&nodes, i).await;
        let total: u64 = c.values().sum();
        assert_eq!(count(&c, "set"), CYCLES, "node {i}: {c:?}");
        assert_eq!(released(&c), CYCLES, "node {i}: {c:?}");
        assert_eq!(count(&c, "eval"), 0, "node {i}: {c:?}");
        assert!(total <= 4 * CYCLES, "node {i}: {total} commands: {c:?}");
    }
    redlock.close().await;
}

/// With nobody in line the release deletes the key and leaves nothing behind: no reservation,
/// and a line's flag is removed once its line is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_nobody_in_line_leaves_nothing() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| b).await;
    let r = unique("empty-line");
    let key = redlock.key(&r);
    let gate = redlock.line_node(&r).unwrap();
    let flag = format!("{}!", line_key(&redlock, &r));
    // A line whose last member left: only its flag is left.
    nodes
        .command(gate, &["SET", &flag, "1", "PX", "20000"])
        .await
        .unwrap();
    let held = redlock.acquire(r.as_str(), TTL).await.unwrap();
    held.release().await.unwrap();
    // The release returns at its quorum: the last node's may still be on its way.
    for i in 0..nodes.len() {
        let gone = eventually(Duration::from_secs(5), || async {
            nodes.get(i, &key).await.unwrap().is_none()
        })
        .await;
        assert!(gone, "node {i}: {:?}", nodes.get(i, &key).await.unwrap());
    }
    let flag_gone = eventually(Duration::from_secs(5), || async {
        nodes.get(gate, &flag).await.unwrap().is_none()
    })
    .await;
    assert!(flag_gone, "the line's flag is left on the gate");
    redlock.close().await;
}
