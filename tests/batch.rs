//! The coalesced hot path (`batch`): concurrent single-key acquires and releases to one node
//! share script calls, and every fault that can cut a batch leaves no key behind: a batch
//! whose connection is reset, scripts flushed between batches, acquires dropped while their
//! `SET`s wait in a node's queue.

mod common;

use std::time::Duration;

use common::*;
use fredlock::fred::prelude::ClientLike;
use fredlock::{Lock, Redlock};
use fredlock_testkit::{Fault, LocalNodes};
use futures::future::join_all;
use futures::FutureExt;

const TTL: Duration = Duration::from_secs(30);
/// Locks taken at once: far more than one round trip's worth.
const MANY: usize = 64;

fn names(prefix: &str) -> Vec<String> {
    let base = unique(prefix);
    (0..MANY).map(|i| format!("{base}:{i}")).collect()
}

/// Every name's key is gone from every node within 5 s (releases and clean-ups landing).
async fn all_freed(redlock: &Redlock, names: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for r in names {
        if !freed_within(redlock, &redlock.key(r), Duration::from_secs(5)).await {
            left.push(r.clone());
        }
    }
    left
}

async fn acquire_all(redlock: &Redlock, names: &[String]) -> Vec<Lock> {
    join_all(names.iter().map(|r| redlock.acquire(r.as_str(), TTL)))
        .await
        .into_iter()
        .map(|l| l.expect("acquire"))
        .collect()
}

/// 64 locks released at once: each node gets far fewer script calls than releases (the
/// releases share calls, on the keys' gates too), and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locks_share_calls_and_leave_nothing() {
    // Node timeout far above the pause below.
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(Duration::from_secs(10))).await;
    // Warm-up: a release on each node's gate, once, so that each knows the gate's script
    // (until then it is sent whole, alone).
    let warm = names("warm");
    for i in 0..3 {
        let r = warm.iter().find(|r| redlock.line_node(r) == Some(i));
        let r = r.expect("a resource gated on each node");
        let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
        lock.release().await.expect("release");
    }
    let all = names("shared");
    let locks = acquire_all(&redlock, &all).await;
    for i in 0..3 {
        nodes
            .command(i, &["CONFIG", "RESETSTAT"])
            .await
            .expect("reset");
    }
    // Each node holds its answers for a moment (well within the node timeout), so that every
    // release is queued, however slowly this machine issues them, before the first batch is
    // answered: what shares a call then depends on the batcher alone, not on timing.
    for i in 0..3 {
        nodes
            .command(i, &["CLIENT", "PAUSE", "1500", "ALL"])
            .await
            .expect("pause");
    }
    let reports = join_all(locks.into_iter().map(|l| l.release())).await;
    assert!(reports.iter().all(|r| r.is_ok()), "{reports:?}");
    assert!(all_freed(&redlock, &all).await.is_empty());
    let mut calls = Vec::new();
    for i in 0..3 {
        let eval = command_calls(&nodes, i, "eval").await;
        calls.push((eval, command_calls(&nodes, i, "evalsha").await));
    }
    assert!(
        calls.iter().all(|(e, s)| e + s < MANY as u64 / 4),
        "(EVAL, EVALSHA) calls per node for {MANY} releases: {calls:?}: not batched"
    );
}

/// Node 0 holds its replies, so its first SETs are in flight there while the acquires are
/// granted by nodes 1 and 2 and then released; the other SETs and every release queue behind
/// them. The connection is then reset (what was in flight fails, its outcome unknown): the
/// SETs that were written must still be released once the node is reachable again, and the
/// queued ones never land after their release: nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_by_a_reset_leaves_no_key() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, redlock) =
        behind_proxies(&nodes, |b| b.node_timeout(Duration::from_secs(2))).await;
    // The batched path: locks whose wait line is on node 0 send their acquire and release there
    // as one script call each, outside the batch.
    let all: Vec<String> = names("reset")
        .into_iter()
        .filter(|r| redlock.line_node(r) != Some(0))
        .collect();
    proxies[0].set(Fault::HoldReplies);
    let locks = acquire_all(&redlock, &all).await;
    let reports = join_all(locks.into_iter().map(|l| l.release())).await;
    assert!(reports.iter().all(|r| r.is_ok()), "{reports:?}");
    // The first SETs reached node 0 (replies held, requests relayed); the rest wait in its
    // queue behind them, and the releases behind those.
    let mut on_0 = 0;
    for r in &all {
        on_0 += usize::from(nodes.get(0, &redlock.key(r)).await.expect("GET").is_some());
    }
    assert!(on_0 > 0, "node 0 never saw a SET");
    // Reset, and keep resetting until the client itself fails a command there: what was queued
    // behind the cut batch is sent while the node is unreachable, and fails at once.
    proxies[0].set(Fault::Reset);
    let client = redlock.client(0).expect("node 0").clone();
    let failing = eventually(Duration::from_secs(10), || {
        let client = client.clone();
        async move { client.ping::<String>(None).await.is_err() }
    });
    assert!(
        failing.await,
        "node 0 kept answering through a resetting proxy"
    );
    proxies[0].set(Fault::Pass);
    let mut left = Vec::new();
    for r in &all {
        if !gone_within(&nodes, 0, &redlock.key(r), Duration::from_secs(15)).await {
            left.push(r.clone());
        }
    }
    assert!(left.is_empty(), "keys left on node 0: {left:?}");
    assert!(all_freed(&redlock, &all).await.is_empty());
}

/// SCRIPT FLUSH between batches (and between the acquires and their releases) changes
/// nothing: batches are sent whole (EVAL), never as a hash a node could have forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_change_nothing() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    for round in 0..3 {
        let all = names(&format!("flush{round}"));
        let locks = acquire_all(&redlock, &all).await;
        for i in 0..3 {
            nodes.command(i, &["SCRIPT", "FLUSH"]).await.expect("flush");
        }
        let reports = join_all(locks.into_iter().map(|l| l.release())).await;
        assert!(reports.iter().all(|r| r.is_ok()), "{reports:?}");
        assert!(all_freed(&redlock, &all).await.is_empty());
    }
}

/// 64 acquires polled once (every SET handed to its node: one sent, the rest queued behind it,
/// with replies held on two nodes so that none can decide) and then dropped: their clean-up
/// releases queue behind the SETs, and no key is left on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_dropped_mid_batch_leave_no_key() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, redlock) =
        behind_proxies(&nodes, |b| b.node_timeout(Duration::from_secs(2))).await;
    let all = names("dropped");
    proxies[0].set(Fault::HoldReplies);
    proxies[1].set(Fault::HoldReplies);
    let polled_once = join_all(all.iter().map(|r| redlock.acquire(r.as_str(), TTL))).now_or_never();
    assert!(polled_once.is_none(), "the acquires finished in one poll");
    proxies[0].set(Fault::Pass);
    proxies[1].set(Fault::Pass);
    let left = all_freed(&redlock, &all).await;
    assert!(left.is_empty(), "keys left: {left:?}");
}

/// Node 2 is busy (paused, another lock's `SET` in flight and a batch behind it) when a lock is
/// released: the release is decided by nodes 0 and 1 while node 2's still waits in its queue.
/// `close()` must wait for it before it quits the connections (else the release is sent on a
/// closed client and node 2 keeps the key for its TTL).
#[tokio::test]
async fn close_waits_for_a_release_still_queued_on_a_busy_node() {
    // Without wake-ups: their subscribers' closing would wait for node 2 (paused) first.
    let tweak = |b: fredlock::Builder| {
        b.node_timeout(Duration::from_secs(2))
            .wake_on_release(false)
    };
    let (nodes, redlock) = local_with(3, tweak).await;
    let mut names = (0..)
        .map(|_| resource(&redlock, "close-queued"))
        .filter(|(r, _)| redlock.line_node(r) != Some(2));
    let (r, key) = names.next().expect("a resource gated elsewhere");
    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    nodes.client_pause(2, 300).await.expect("CLIENT PAUSE");
    // Two other locks: the first one's SET goes to node 2 at once, the second's in a batch
    // behind it, so node 2's batcher waits for an answer when the release is queued.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let (redlock, (other, _)) = (redlock.clone(), names.next().expect("another"));
        busy.push(tokio::spawn(async move {
            redlock.try_acquire(other.as_str(), TTL).await
        }));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
    }
    lock.release().await.expect("release");
    // Held through close(): their releases would otherwise make close() wait for node 2.
    let mut held = Vec::new();
    for task in busy {
        held.push(task.await);
    }
    redlock.close().await;
    let left = nodes.pttl(2, &key).await.expect("PTTL");
    assert_eq!(
        left, -2,
        "node 2 kept the key (PTTL {left} ms) after close()"
    );
}
