//! Node faults: a killed, paused or silent minority costs no latency; a lost majority fails
//! within its bound and leaves nothing behind; a cancelled acquire cleans up.
//! Latency bounds here are the feature itself (decide without the slow node), asserted with
//! wide margins; `make bench` measures them.

mod common;

use std::time::Duration;

use common::*;
use fredlock::fred::prelude::KeysInterface;
use fredlock::{Error, Redlock, ReleaseReport, Retry, Vote};
use fredlock_testkit::{Blackhole, LocalNodes};
use tokio::time::Instant;

/// Far above loopback latency, far below what a node timeout would cost.
const FAST: Duration = Duration::from_millis(1000);
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_killed_node_costs_no_latency() {
    let (mut nodes, redlock) = local_with(3, |b| b.node_timeout(NODE_TIMEOUT)).await;
    nodes.kill(2).unwrap();
    let report = cycle_fast(&redlock, &unique("killed")).await;
    assert_eq!(report.votes.granted(), 2);
    assert!(matches!(report.votes.0[2], Vote::Failed(_) | Vote::Pending));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_paused_node_costs_no_latency_and_is_cleaned_after_resume() {
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(NODE_TIMEOUT)).await;
    nodes.pause(2).unwrap();
    let (r, key) = resource(&redlock, "paused");
    cycle_fast(&redlock, &r).await;
    // The paused node got our SET and then our release, queued in that order on one connection:
    // once it runs again, the SET lands first and the release removes it.
    assert!(
        cleaned_after_resume(&nodes, 2, &key).await,
        "the paused node kept the key after resuming"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_costs_no_latency() {
    let nodes = fredlock_testkit::LocalNodes::start(2).await.unwrap();
    let silent = Blackhole::start().await.unwrap();
    let mut urls = nodes.urls();
    urls.push(silent.url());
    let t = Instant::now();
    let redlock = Redlock::builder()
        .nodes(urls)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .await
        .unwrap();
    assert!(
        t.elapsed() < FAST,
        "build waited {:?} for a silent node",
        t.elapsed()
    );
    for _ in 0..5 {
        cycle_fast(&redlock, &unique("silent")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_killed_is_unavailable_within_bound_and_leaves_nothing() {
    let node_timeout = Duration::from_millis(300);
    let (mut nodes, redlock) =
        local_with(3, |b| b.node_timeout(node_timeout).retry(retry(3, 20, 20))).await;
    nodes.kill(1).unwrap();
    nodes.kill(2).unwrap();
    let r = unique("majority-killed");
    let bound = (node_timeout + Duration::from_millis(40)) * 3;
    match fails_within(&redlock, &r, bound).await {
        Error::Unavailable {
            attempts,
            nodes: 3,
            quorum: 2,
            reachable,
            votes,
            ..
        } => {
            assert_eq!(attempts, 3);
            assert!(reachable <= 1);
            assert_eq!(votes.failed(), 2, "{votes}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The dead nodes fail at once, so the round can be decided before node 0 answered its SET;
    // the clean-up release is queued right behind that SET and lands within a round trip.
    assert!(
        gone_within(&nodes, 0, &redlock.key(&r), Duration::from_millis(500)).await,
        "key left on the live node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_paused_is_unavailable_within_bound_and_cleaned_after_resume() {
    let node_timeout = Duration::from_millis(200);
    let (nodes, redlock) =
        local_with(3, |b| b.node_timeout(node_timeout).retry(retry(2, 10, 10))).await;
    nodes.pause(1).unwrap();
    nodes.pause(2).unwrap();
    let (r, key) = resource(&redlock, "majority-paused");
    let err = fails_within(&redlock, &r, (node_timeout + Duration::from_millis(20)) * 2).await;
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // The clean-up is handed to node 0's connection before the call returns, not awaited: a
    // command sent after it on the same connection sees the key gone (a separate connection may
    // read before the release lands).
    let left: Option<String> = redlock
        .client(0)
        .expect("node 0 is a single server")
        .get(&key)
        .await
        .unwrap();
    assert_eq!(left, None, "key left on the live node");
    // The SETs that timed out may still run when the nodes wake up: the releases queued behind
    // them must remove them.
    nodes.resume(1).unwrap();
    nodes.resume(2).unwrap();
    for i in 1..3 {
        assert!(
            gone_within(&nodes, i, &key, Duration::from_secs(5)).await,
            "node {i} kept a key after resuming"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_leaves_no_key() {
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(NODE_TIMEOUT)).await;
    let (r, key) = resource(&redlock, "cancelled");
    // Node 1 is held by someone else and node 2 is paused: node 0 grants, then the attempt has to
    // wait for node 2. We drop it while it waits.
    set_foreign(&redlock, 1, &key).await;
    nodes.pause(2).unwrap();
    // Boxed so that drop() really drops the future (a stack-pinned one lives to the scope's end).
    let mut acquire = Box::pin(redlock.acquire(r.as_str(), TTL));
    let granted_on_0 = async {
        loop {
            if nodes.get(0, &key).await.unwrap().is_some() {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        res = &mut acquire => panic!("acquire finished early: {res:?}"),
        () = granted_on_0 => {}
    }
    let dropped_at = Instant::now();
    drop(acquire);
    assert!(
        gone_within(&nodes, 0, &key, Duration::from_millis(500)).await,
        "node 0 kept the key after the acquire was dropped"
    );
    println!("node 0 clean {:?} after the drop", dropped_at.elapsed());
    assert_eq!(
        nodes.get(1, &key).await.unwrap().as_deref(),
        Some("someone-else")
    );
    assert!(
        cleaned_after_resume(&nodes, 2, &key).await,
        "node 2 kept the key after resuming"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_returns_during_an_outage_and_recovers() {
    let mut nodes = fredlock_testkit::LocalNodes::start(3).await.unwrap();
    nodes.kill(1).unwrap();
    nodes.kill(2).unwrap();
    let t = Instant::now();
    let redlock = build(nodes.urls(), |b| b).await; // must not fail because nodes are down
    assert!(
        t.elapsed() < FAST + Duration::from_secs(2),
        "build took {:?}",
        t.elapsed()
    );
    assert!(matches!(
        redlock.acquire(unique("outage").as_str(), TTL).await,
        Err(Error::Unavailable { .. })
    ));
    // The nodes come back (empty, same ports): the connect loop picks them up.
    nodes.start_node(1).await.unwrap();
    nodes.start_node(2).await.unwrap();
    assert!(
        cycles_again(&redlock, "outage", |rep| rep.votes.granted() >= 2).await,
        "never acquired after the nodes came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_used_again() {
    let (mut nodes, redlock) = local_with(3, |b| b).await;
    nodes.restart(0).await.unwrap();
    assert!(
        cycles_again(&redlock, "restart", |rep| rep.votes.0[0] == Vote::Granted).await,
        "node 0 never granted again after its restart"
    );
}

/// Regression (found by the torture run's S6 probe): when the FIRST nodes in configuration order
/// fail synchronously (fail-fast on a dead connection), the round used to be decided before the
/// live node's future was ever polled, so its clean-up release was never sent, or its SET was
/// sent after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acquire_leaves_no_key_on_a_live_node_after_the_dead_ones() {
    let (mut nodes, redlock) = local_with(3, |b| {
        b.node_timeout(Duration::from_millis(300))
            .retry(Retry::once())
    })
    .await;
    nodes.kill(0).unwrap();
    nodes.kill(1).unwrap();
    // Wait until fred knows both connections are gone (commands to them then fail at once).
    let rl = &redlock;
    assert!(eventually(Duration::from_secs(5), || first_two_down(rl)).await);
    for _ in 0..10 {
        let r = unique("majority-dead-first");
        assert!(matches!(
            redlock.acquire(r.as_str(), TTL).await,
            Err(Error::Unavailable { .. })
        ));
        // Checked at once: the clean-up release was sent right behind the SET on node 2.
        let key = redlock.key(&r);
        assert!(
            gone_within(&nodes, 2, &key, Duration::from_millis(200)).await,
            "node 2 kept the key of a failed acquire"
        );
    }
}

/// Regression: a release whose first two nodes are dead must still reach the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_reaches_a_live_node_after_the_first_two_die() {
    let (mut nodes, redlock) = local_with(3, |b| b.node_timeout(Duration::from_millis(300))).await;
    let (r, key) = resource(&redlock, "release-after-two-died");
    let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
    nodes.kill(0).unwrap();
    nodes.kill(1).unwrap();
    let rl = &redlock;
    assert!(eventually(Duration::from_secs(5), || first_two_down(rl)).await);
    assert!(matches!(
        lock.release().await,
        Err(Error::Unavailable { .. })
    ));
    assert!(
        gone_within(&nodes, 2, &key, Duration::from_millis(500)).await,
        "the live node kept the key after release"
    );
}

/// Whether nodes 0 and 1 fail an inspect right now (fred noticed their connections are gone).
async fn first_two_down(redlock: &Redlock) -> bool {
    match redlock.inspect("probe").await {
        Ok(seen) => seen.nodes[0].state.is_err() && seen.nodes[1].state.is_err(),
        Err(_) => false,
    }
}

/// Acquires and releases `r`, each well within [`FAST`]: a slow or dead minority node must cost
/// no latency.
async fn cycle_fast(redlock: &Redlock, r: &str) -> ReleaseReport {
    let t = Instant::now();
    let lock = redlock.acquire(r, TTL).await.expect("acquire");
    assert!(t.elapsed() < FAST, "acquire took {:?}", t.elapsed());
    let t = Instant::now();
    let report = lock.release().await.expect("release");
    assert!(t.elapsed() < FAST, "release took {:?}", t.elapsed());
    report
}

/// The error of an acquire of `r` that cannot reach a quorum, which must come within `bound`
/// (plus the [`FAST`] margin).
async fn fails_within(redlock: &Redlock, r: &str, bound: Duration) -> Error {
    let t = Instant::now();
    let err = redlock.acquire(r, TTL).await.expect_err("no quorum");
    assert!(
        t.elapsed() < bound + FAST,
        "took {:?}, bound {bound:?}",
        t.elapsed()
    );
    err
}

/// Whether, within 10 s (nodes coming back), an acquire of a fresh resource named after `name`
/// succeeds and its release report satisfies `check`.
async fn cycles_again(
    redlock: &Redlock,
    name: &str,
    check: impl Fn(&ReleaseReport) -> bool,
) -> bool {
    eventually(Duration::from_secs(10), || async {
        match redlock.acquire(unique(name).as_str(), TTL).await {
            Ok(lock) => lock.release().await.is_ok_and(|rep| check(&rep)),
            Err(_) => false,
        }
    })
    .await
}

/// Resumes paused node `i` and says whether `key` is gone from it within 5 s: whatever was
/// queued behind a SET on that node's connection (the release) must land after it.
async fn cleaned_after_resume(nodes: &LocalNodes, i: usize, key: &str) -> bool {
    nodes.resume(i).unwrap();
    gone_within(nodes, i, key, Duration::from_secs(5)).await
}

/// A cancelled acquire whose SET waits in the client's queue behind a slow write (here a 64 MB
/// value on the same connection; in production, a large reply or a reconnect) must leave no key:
/// either the SET is skipped when its node timeout passes, or the clean-up release that follows
/// it lands. Found by the torture run's S6 probe (a key left for its full TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_queued_behind_a_slow_write_leaves_no_key() {
    use futures::FutureExt;
    let (_nodes, redlock) = local_with(1, |b| b.node_timeout(Duration::from_millis(50))).await;
    let client = redlock.client(0).expect("node 0").clone();
    let mut left = Vec::new();
    for round in 0..3 {
        let (r, key) = resource(&redlock, "behind-a-slow-write");
        let (big_key, big) = (format!("{key}:big"), "x".repeat(64 << 20));
        let writer = client.clone();
        let slow = tokio::spawn(async move {
            let _: Result<(), _> = writer.set(big_key, big, None, None, false).await;
        });
        // The big write is queued first; the acquire's SET goes in behind it.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let polled_once = redlock.acquire(r.as_str(), TTL).now_or_never();
        assert!(polled_once.is_none(), "the acquire finished in one poll");
        slow.await.expect("the writer task");
        if !freed_within(&redlock, &key, Duration::from_secs(2)).await {
            left.push(round);
        }
        del(&redlock, 0, &format!("{key}:big")).await;
    }
    assert!(
        left.is_empty(),
        "rounds {left:?} left the cancelled acquire's key"
    );
}

/// A failed attempt's clean-up release that fails AFTER it was handed to the connection (here it
/// times out into a blackhole, then the connection is reset) while the attempt's SET had already
/// created the key: the release's late answer is read and the release retried on the new
/// connection. Dropping that answer left the key for its full TTL (the torture run's S6 probe
/// found it on a Redis Cluster node, where a shard move fails a release late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_release_that_fails_late_is_retried() {
    use fredlock_testkit::Fault;
    let nodes = LocalNodes::start(3).await.unwrap();
    let node_timeout = Duration::from_millis(300);
    let (proxies, redlock) = behind_proxies(&nodes, |b| {
        b.node_timeout(node_timeout).retry(retry(1, 0, 0))
    })
    .await;
    let (r, key) = resource(&redlock, "late-failed-clean-up");
    // Node 1 is held by someone else; node 2 holds its replies, so the attempt cannot decide
    // before its node timeout; node 0 grants (its reply held too, so the SET is still running).
    set_foreign(&redlock, 1, &key).await;
    proxies[0].set(Fault::HoldReplies);
    proxies[2].set(Fault::HoldReplies);
    let acquire = tokio::spawn({
        let redlock = redlock.clone();
        let r = r.clone();
        async move { redlock.acquire(r.as_str(), TTL).await }
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            nodes.get(0, &key).await.unwrap().is_some()
        })
        .await,
        "the SET never reached node 0"
    );
    // From now on nothing reaches node 0: the clean-up release will time out.
    proxies[0].set(Fault::Blackhole);
    let err = acquire.await.unwrap().unwrap_err();
    assert!(
        matches!(err, Error::Contended { .. } | Error::Unavailable { .. }),
        "{err:?}"
    );
    // Cut the connection (the release fails late, with the key still there); fred reconnects,
    // and only a retry of the release can remove the key now.
    let accepted = proxies[0].connections();
    proxies[0].set(Fault::Reset);
    assert!(
        eventually(Duration::from_secs(5), || async {
            proxies[0].connections() > accepted
        })
        .await,
        "fred never reconnected"
    );
    proxies[0].set(Fault::Pass);
    proxies[2].set(Fault::Pass);
    assert!(
        gone_within(&nodes, 0, &key, Duration::from_secs(10)).await,
        "node 0 kept the failed attempt's key (TTL {TTL:?})"
    );
}
