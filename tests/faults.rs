//! Node faults: a killed, paused or silent minority costs no latency; a lost majority fails
//! within its bound and leaves nothing behind; a cancelled acquire cleans up.
//! Latency bounds here are the feature itself (decide without the slow node), asserted with
//! wide margins; `make bench` measures them.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{Error, Redlock, Retry, Vote};
use fredlock_testkit::Blackhole;
use tokio::time::Instant;

/// Far above loopback latency, far below what a node timeout would cost.
const FAST: Duration = Duration::from_millis(1000);
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_killed_node_costs_no_latency() {
    let (mut nodes, redlock) = local_with(3, |b| b.node_timeout(NODE_TIMEOUT)).await;
    nodes.kill(2).unwrap();
    let r = unique("killed");
    let t = Instant::now();
    let lock = redlock
        .acquire(r.as_str(), TTL)
        .await
        .expect("acquire with 2 of 3");
    assert!(t.elapsed() < FAST, "acquire took {:?}", t.elapsed());
    let t = Instant::now();
    let report = lock.release().await.expect("release with 2 of 3");
    assert!(t.elapsed() < FAST, "release took {:?}", t.elapsed());
    assert_eq!(report.votes.granted(), 2);
    assert!(matches!(report.votes.0[2], Vote::Failed(_) | Vote::Pending));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_paused_node_costs_no_latency_and_is_cleaned_after_resume() {
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(NODE_TIMEOUT)).await;
    nodes.pause(2).unwrap();
    let r = unique("paused");
    let key = redlock.key(&r);
    let t = Instant::now();
    let lock = redlock
        .acquire(r.as_str(), TTL)
        .await
        .expect("acquire with 2 of 3");
    assert!(t.elapsed() < FAST, "acquire took {:?}", t.elapsed());
    let t = Instant::now();
    lock.release().await.expect("release with 2 of 3");
    assert!(t.elapsed() < FAST, "release took {:?}", t.elapsed());
    // The paused node got our SET and then our release, queued in that order on one connection:
    // once it runs again, the SET lands first and the release removes it.
    nodes.resume(2).unwrap();
    assert!(
        gone_within(&nodes, 2, &key, Duration::from_secs(5)).await,
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
        let t = Instant::now();
        let lock = redlock
            .acquire(unique("silent").as_str(), TTL)
            .await
            .expect("acquire");
        assert!(t.elapsed() < FAST, "acquire took {:?}", t.elapsed());
        let t = Instant::now();
        lock.release().await.expect("release");
        assert!(t.elapsed() < FAST, "release took {:?}", t.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_killed_is_unavailable_within_bound_and_leaves_nothing() {
    let retry = Retry {
        attempts: 3,
        delay: Duration::from_millis(20),
        jitter: Duration::from_millis(20),
    };
    let (mut nodes, redlock) = local_with(3, |b| {
        b.node_timeout(Duration::from_millis(300)).retry(retry)
    })
    .await;
    nodes.kill(1).unwrap();
    nodes.kill(2).unwrap();
    let r = unique("majority-killed");
    let t = Instant::now();
    let err = redlock
        .acquire(r.as_str(), TTL)
        .await
        .expect_err("no quorum");
    let bound = (Duration::from_millis(300) + Duration::from_millis(40)) * 3;
    assert!(
        t.elapsed() < bound + FAST,
        "took {:?}, bound {bound:?}",
        t.elapsed()
    );
    match err {
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
    let retry = Retry {
        attempts: 2,
        delay: Duration::from_millis(10),
        jitter: Duration::from_millis(10),
    };
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(node_timeout).retry(retry)).await;
    nodes.pause(1).unwrap();
    nodes.pause(2).unwrap();
    let r = unique("majority-paused");
    let key = redlock.key(&r);
    let t = Instant::now();
    let err = redlock
        .acquire(r.as_str(), TTL)
        .await
        .expect_err("no quorum");
    let bound = (node_timeout + Duration::from_millis(20)) * 2;
    assert!(
        t.elapsed() < bound + FAST,
        "took {:?}, bound {bound:?}",
        t.elapsed()
    );
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert_eq!(
        nodes.get(0, &key).await.unwrap(),
        None,
        "key left on the live node"
    );
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
    let r = unique("cancelled");
    let key = redlock.key(&r);
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
        eventually(Duration::from_millis(500), || async {
            nodes.get(0, &key).await.unwrap().is_none()
        })
        .await,
        "node 0 kept the key after the acquire was dropped"
    );
    println!("node 0 clean {:?} after the drop", dropped_at.elapsed());
    assert_eq!(
        nodes.get(1, &key).await.unwrap().as_deref(),
        Some("someone-else")
    );
    nodes.resume(2).unwrap();
    assert!(
        gone_within(&nodes, 2, &key, Duration::from_secs(5)).await,
        "node 2 kept the key after resuming"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_returns_during_an_outage_and_recovers() {
    let mut nodes = fredlock_testkit::LocalNodes::start(3).await.unwrap();
    nodes.kill(1).unwrap();
    nodes.kill(2).unwrap();
    let t = Instant::now();
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .retry(fast_retry())
        .build()
        .await
        .expect("build must not fail because nodes are down");
    assert!(
        t.elapsed() < FAST + Duration::from_secs(2),
        "build took {:?}",
        t.elapsed()
    );
    let r = unique("outage");
    assert!(matches!(
        redlock.acquire(r.as_str(), TTL).await,
        Err(Error::Unavailable { .. })
    ));
    // The nodes come back (empty, same ports): the connect loop picks them up.
    nodes.start_node(1).await.unwrap();
    nodes.start_node(2).await.unwrap();
    let redlock = &redlock;
    let r = &r;
    assert!(
        eventually(Duration::from_secs(10), || async {
            match redlock.acquire(r.as_str(), TTL).await {
                Ok(lock) => lock
                    .release()
                    .await
                    .map(|rep| rep.votes.granted() >= 2)
                    .unwrap_or(false),
                Err(_) => false,
            }
        })
        .await,
        "never acquired after the nodes came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_used_again() {
    let (mut nodes, redlock) = local_with(3, |b| b).await;
    nodes.restart(0).await.unwrap();
    let redlock = &redlock;
    assert!(
        eventually(Duration::from_secs(10), || async {
            match redlock.acquire(unique("restart").as_str(), TTL).await {
                Ok(lock) => lock
                    .release()
                    .await
                    .map(|rep| rep.votes.0[0] == Vote::Granted)
                    .unwrap_or(false),
                Err(_) => false,
            }
        })
        .await,
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
            eventually(Duration::from_millis(200), || async {
                nodes.get(2, &key).await.unwrap().is_none()
            })
            .await,
            "node 2 kept the key of a failed acquire"
        );
    }
}

/// Regression: a release whose first two nodes are dead must still reach the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_reaches_a_live_node_after_the_first_two_die() {
    let (mut nodes, redlock) = local_with(3, |b| b.node_timeout(Duration::from_millis(300))).await;
    let r = unique("release-after-two-died");
    let key = redlock.key(&r);
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
        eventually(Duration::from_millis(500), || async {
            nodes.get(2, &key).await.unwrap().is_none()
        })
        .await,
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
