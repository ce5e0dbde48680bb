//! The order of a wait line under faults: a waiter's place is kept only by what reached the
//! gate. (That a release wakes the head is `tests/wake.rs`; what an uncontended cycle sends is
//! `tests/line_handover.rs`.)

mod common;

use std::time::Duration;

use common::lines::{line_key, line_members, Probe};
use common::*;
use fredlock::Retry;
use fredlock_testkit::{Fault, LocalNodes};

const TTL: Duration = Duration::from_secs(30);

/// A waiter whose attempts never reached the gate (every connection there reset) is not put at
/// the FRONT of the line by its attempts' clean-up, ahead of another process's waiter that was
/// there all along: a clean-up puts back only a waiter that held a place (its lease in the
/// line: a head whose granted turn failed on the other nodes). Before, the clean-up's retry,
/// landing once the gate was back, joined the waiter at the front.
#[tokio::test]
async fn a_clean_up_puts_back_only_a_waiter_that_held_a_place() {
    let nodes = LocalNodes::start(3).await.unwrap();
    // Attempts 4 s apart: the clean-up's retries (every 250 ms at most) land long before the
    // waiter's next attempt joins the line, at its back.
    let slow = Retry {
        attempts: u32::MAX,
        delay: Duration::from_secs(4),
        jitter: Duration::ZERO,
    };
    let (proxies, waiter) = behind_proxies(&nodes, |b| {
        b.retry(slow).node_timeout(Duration::from_millis(300))
    })
    .await;
    let r = unique("put-back");
    let (key, line) = (waiter.key(&r), line_key(&waiter, &r));
    let gate = waiter.line_node(&r).unwrap();
    for i in 0..3 {
        nodes
            .command(i, &["SET", &key, "someone-else", "PX", "60000"])
            .await
            .unwrap();
    }
    // Another process's waiter, in line with a live lease.
    let other = "0badc0de:1";
    for args in [
        vec!["ZADD", &line, "0", other],
        vec!["PEXPIRE", &line, "60000"],
    ] {
        nodes.command(gate, &args).await.unwrap();
    }
    let lease = format!("{line}|{other}");
    nodes
        .command(gate, &["SET", &lease, "1", "PX", "60000"])
        .await
        .unwrap();
    proxies[gate].set(Fault::Reset);
    let probe = Probe::default();
    let _guard = probe.install();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    // Two failed attempts: the second carried the waiter's place (made at its first refusal),
    // and its clean-up on the gate failed with the connection.
    let failed = eventually(Duration::from_secs(15), || async {
        probe.count("attempt failed") >= 2
    });
    assert!(failed.await, "attempts: {:?}", probe.counts());
    proxies[gate].set(Fault::Pass);
    // The waiter joins the line: by its next attempt (at the back), or by a clean-up.
    let joined = eventually(Duration::from_secs(15), || async {
        line_members(&nodes, &waiter, &r).await.len() == 2
    });
    assert!(joined.await, "the waiter never joined the line");
    let members = line_members(&nodes, &waiter, &r).await;
    assert_eq!(
        members[0], other,
        "a waiter that never reached the gate went ahead of the line: {members:?}"
    );
    task.abort();
    waiter.close().await;
}
