//! A wait line shared with holders it cannot see (a client that ignores lines, another
//! process's key left on the gate alone): a head may be granted by the other nodes while its
//! gate refuses it, and a key may be freed without a wake-up. What a lock sends its gate lands
//! in the order it was sent, and the waiter that becomes the head learns it at once.

mod common;

use std::time::Duration;

use common::lines::{line_has, line_key, line_members, sent_commands};
use common::*;
use fredlock::Retry;
use fredlock_testkit::{LocalNodes, RespValue};

const TTL: Duration = Duration::from_secs(30);
/// Far longer than any bound below: a waiter that acts within a bound was woken.
const SLOW: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_secs(10),
    jitter: Duration::ZERO,
};

/// A head woken for its turn takes the lock with the other two nodes when the gate still holds
/// another process's key (as the algorithm allows), and may release it before its turn on the
/// gate is over. That turn takes three round trips when it finds the key held (the pop and the
/// `SET`, the put-back, the line script's look), and the look sets the key if it is free by
/// then. The release must land after the look: before, it was sent at once, landed between the
/// put-back and the look, and the look then left the key of a released lock on the gate for a
/// whole TTL (the gate refusing every waiter meanwhile; seen as rounds of `tests/wake.rs`'s
/// mixed fleets that stalled for 30 s). The gate here holds every write for a while, so that
/// the release and the other process's `DEL` are both queued there before the turn's second
/// round trip: without the fix the gate ends up holding the released lock's key.
#[tokio::test]
async fn a_release_lands_after_a_turn_it_was_granted_without() {
    let (nodes, waiter) = local_with(3, |b| {
        b.retry(retry(u32::MAX, 2000, 0))
            .node_timeout(Duration::from_secs(4))
    })
    .await;
    let r = unique("turn-then-release");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).unwrap();
    let other = (gate + 1) % 3;
    for i in 0..3 {
        nodes
            .command(i, &["SET", &key, "someone-else", "PX", "60000"])
            .await
            .unwrap();
    }
    let looks = command_calls(&nodes, gate, "pttl").await;
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 1).await, "the waiter joined");
    // Its wake-ups came up: it looked at the gate again (each look reads the key's PTTL).
    let subscribed = eventually(Duration::from_secs(5), || async {
        command_calls(&nodes, gate, "pttl").await >= looks + 3
    });
    assert!(subscribed.await, "the waiter never looked again");
    let me = line_members(&nodes, &waiter, &r).await.remove(0);
    // The other process left every node but the gate.
    for i in (0..3).filter(|&i| i != gate) {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let put_backs = command_calls(&nodes, gate, "zadd").await;
    // From now on the gate holds every write (scripts and PUBLISH included) for 1.5 s.
    nodes
        .command(gate, &["CLIENT", "PAUSE", "1500", "WRITE"])
        .await
        .unwrap();
    // The waiter's own wake-up, as a release publishes it: its turn. Sent to another node,
    // which the waiter also listens to (the gate holds it).
    let (instance, seq) = me.split_once(':').expect("<instance>:<seq>");
    let channel = format!("{}~wake:{instance}", waiter.key(""));
    nodes
        .command(other, &["PUBLISH", &channel, &format!("{seq}|test")])
        .await
        .unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the turn was taken")
        .unwrap()
        .expect("granted by the two other nodes");
    let value = lock.value().to_string();
    lock.release().await.unwrap();
    // The other process leaves the gate too (queued there until the pause ends).
    nodes.command(gate, &["DEL", &key]).await.unwrap();
    // The turn put the waiter back (its SET found the key held), then looked, which took it out
    // of the line (granted: the key was free by then).
    let put_back = eventually(Duration::from_secs(5), || async {
        command_calls(&nodes, gate, "zadd").await > put_backs
    });
    assert!(put_back.await, "the turn never put the waiter back");
    assert!(line_has(&nodes, &waiter, &r, 0).await, "the look never ran");
    let gone = eventually(Duration::from_secs(5), || async {
        get(&waiter, gate, &key).await.as_deref() != Some(value.as_str())
    });
    assert!(gone.await, "the gate kept the key of a released lock");
    waiter.close().await;
}

/// A head that leaves its line while the key is held (it gave up or was cancelled, or the other
/// nodes granted it while its gate refused) wakes the waiter behind it to look at the gate, which
/// tells it that it is the head now. Otherwise that waiter, told when it joined that two were
/// ahead of it, would learn it only when it next asks its place (every 4 s), and meanwhile miss
/// the key freed by a client that ignores lines (which wakes nobody), while the gate refuses
/// every other waiter for it (seen as 4 s stalls of `tests/wake.rs`'s mixed fleets). Fails
/// without the leave's wake-up: the next waiter sends no script within the bound.
#[tokio::test]
async fn a_head_that_leaves_tells_the_next_waiter_it_is_the_head() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let leaver = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let next = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("head-leaves");
    let key = leaver.key(&r);
    let line = line_key(&leaver, &r);
    let gate = leaver.line_node(&r).unwrap();
    for i in 0..3 {
        nodes
            .command(i, &["SET", &key, "someone-else", "PX", "60000"])
            .await
            .unwrap();
    }
    // Both listen for wake-ups before anyone waits here (a subscription coming up makes every
    // waiter look): each waited on another key first.
    for redlock in [&leaver, &next] {
        let other = unique("warm-up");
        for i in 0..3 {
            let k = redlock.key(&other);
            nodes
                .command(i, &["SET", &k, "someone-else", "PX", "60000"])
                .await
                .unwrap();
        }
        let waited = redlock
            .acquire_with(other.as_str(), TTL, Duration::from_millis(300))
            .await;
        assert!(waited.is_err(), "the warm-up key is held");
    }
    let subscribed = eventually(Duration::from_secs(5), || async {
        pubsub_clients(&nodes, gate).await == 2
    });
    assert!(subscribed.await, "the subscribers never came up");
    let first = tokio::spawn({
        let (leaver, r) = (leaver.clone(), r.clone());
        async move { leaver.acquire(r.as_str(), TTL).await }
    });
    assert!(
        line_has(&nodes, &leaver, &r, 1).await,
        "the first waiter joined"
    );
    // Another process's waiter behind it, so that the next one joins two places back.
    let score = head_score(&nodes, gate, &line).await + 1;
    let between = "someone-else-waits:1";
    nodes
        .command(gate, &["ZADD", &line, &score.to_string(), between])
        .await
        .unwrap();
    let lease = format!("{line}|{between}");
    nodes
        .command(gate, &["SET", &lease, "1", "PX", "60000"])
        .await
        .unwrap();
    let second = tokio::spawn({
        let (next, r) = (next.clone(), r.clone());
        async move { next.acquire(r.as_str(), TTL).await }
    });
    assert!(
        line_has(&nodes, &leaver, &r, 3).await,
        "the next waiter joined"
    );
    let me = line_members(&nodes, &leaver, &r).await.remove(2);
    // The one between them goes without a word (its process died, say).
    nodes
        .command(gate, &["ZREM", &line, between])
        .await
        .unwrap();
    nodes.command(gate, &["DEL", &lease]).await.unwrap();
    for args in [
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"][..],
        &["CONFIG", "SET", "slowlog-max-len", "1024"],
        &["SLOWLOG", "RESET"],
    ] {
        nodes.command(gate, args).await.unwrap();
    }
    // The head is cancelled: it leaves the line, and the key is still held.
    first.abort();
    let looked = eventually(Duration::from_millis(1500), || async {
        sent_commands(&nodes, gate)
            .await
            .iter()
            .any(|c| c[0].starts_with("EVAL") && c.contains(&me))
    });
    let looked = looked.await;
    nodes
        .command(gate, &["CONFIG", "SET", "slowlog-log-slower-than", "10000"])
        .await
        .unwrap();
    assert!(looked, "the next waiter never looked at the gate");
    assert_eq!(line_members(&nodes, &leaver, &r).await, [me]);
    second.abort();
    leaver.close().await;
    next.close().await;
}

/// The score of the first member of `line` on node `i`.
async fn head_score(nodes: &LocalNodes, i: usize, line: &str) -> i64 {
    let reply = nodes
        .command(i, &["ZRANGE", line, "0", "0", "WITHSCORES"])
        .await
        .unwrap();
    match reply {
        RespValue::Array(Some(v)) => match v.get(1) {
            Some(RespValue::Bulk(Some(b))) => String::from_utf8_lossy(b).parse().unwrap(),
            other => panic!("a score: {other:?}"),
        },
        other => panic!("ZRANGE: {other:?}"),
    }
}
