//! Quorum rules against real nodes: every mask of pre-held nodes, multi-resource all-or-nothing,
//! inspect.

mod common;

use std::time::Duration;

use common::*;
use fredlock::Error;

const TTL: Duration = Duration::from_secs(5);

/// For every subset of nodes holding a foreign value: granted exactly when a quorum of the
/// configured nodes is free; a failed attempt leaves no token of ours anywhere; a release never
/// touches the foreign values.
async fn every_mask(n: usize) {
    let env = env(n).await;
    let q = n / 2 + 1;
    assert_eq!(env.redlock.quorum(), q);
    for mask in 0u32..(1 << n) {
        let resource = unique(&format!("mask{n}-{mask:b}"));
        let key = env.redlock.key(&resource);
        for i in 0..n {
            if mask & (1 << i) != 0 {
                set_foreign(&env.redlock, i, &key).await;
            }
        }
        let free = n - mask.count_ones() as usize;
        let got = env
            .redlock
            .try_acquire(resource.as_str(), TTL)
            .await
            .expect("try_acquire");
        assert_eq!(got.is_some(), free >= q, "n={n} mask={mask:0n$b}");
        let token = got.as_ref().map(|l| l.token().to_string());
        if let Some(lock) = got {
            lock.release().await.expect("release");
        }
        // Foreign values intact, our token gone everywhere (the failed attempt cleaned up, or
        // the release did). Late releases can still be in flight on the free nodes: wait for them.
        let want: Vec<Option<String>> = (0..n)
            .map(|i| (mask & (1 << i) != 0).then(|| "someone-else".to_string()))
            .collect();
        let ok = values_become(&env.redlock, &key, &want, Duration::from_secs(2)).await;
        assert!(
            ok,
            "n={n} mask={mask:b}: {:?} (our token {token:?})",
            values(&env.redlock, &key).await
        );
        for i in 0..n {
            del(&env.redlock, i, &key).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mask_of_three_nodes() {
    every_mask(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mask_of_five_nodes() {
    every_mask(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_after_retries_is_contended_with_votes() {
    let env = env(3).await;
    let r = unique("contended");
    let held = env.redlock.acquire(r.as_str(), TTL).await.expect("first");
    match env.redlock.acquire(r.as_str(), TTL).await {
        Err(Error::Contended {
            attempts, votes, ..
        }) => {
            // At least the budget; a wake-up (the waiter's subscription coming up) adds
            // an attempt on top.
            assert!(attempts >= 3, "{attempts} attempts");
            assert_eq!(
                votes.refused()
                    + votes
                        .0
                        .iter()
                        .filter(|v| **v == fredlock::Vote::Pending)
                        .count(),
                3,
                "{votes}"
            );
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_resources_are_all_or_nothing() {
    let env = env(3).await;
    let (a, b, c) = (unique("a"), unique("b"), unique("c"));
    let both = env
        .redlock
        .acquire([a.as_str(), b.as_str()], TTL)
        .await
        .expect("a+b");
    let mut sorted = vec![a.clone(), b.clone()];
    sorted.sort();
    assert_eq!(both.resources(), sorted.as_slice());
    for key in [env.redlock.key(&a), env.redlock.key(&b)] {
        // acquire returns at quorum; the last node's SET may still be on its way.
        let want = vec![Some(both.value().to_string()); 3];
        assert!(values_become(&env.redlock, &key, &want, Duration::from_secs(2)).await);
    }
    // Overlapping sets conflict; disjoint ones do not.
    assert!(env
        .redlock
        .try_acquire([b.as_str(), c.as_str()], TTL)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        values(&env.redlock, &env.redlock.key(&c)).await,
        vec![None; 3],
        "c set although b was held"
    );
    let only_c = env
        .redlock
        .try_acquire(vec![c.clone()], TTL)
        .await
        .unwrap()
        .expect("c is free");
    only_c.release().await.unwrap();
    both.release().await.expect("release both");
    for key in [env.redlock.key(&a), env.redlock.key(&b)] {
        assert!(freed_within(&env.redlock, &key, Duration::from_secs(2)).await);
    }
    // Duplicates collapse.
    let dup = env
        .redlock
        .acquire([a.as_str(), a.as_str()], TTL)
        .await
        .unwrap();
    assert_eq!(dup.resources(), std::slice::from_ref(&a));
    dup.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_holder_and_ttl_per_node() {
    let env = env(3).await;
    let r = unique("inspect");
    let before = env.redlock.inspect(&r).await.unwrap();
    assert!(before.is_free(), "{before:?}");
    assert_eq!(before.holder(), None);
    let lock = env.redlock.acquire(r.as_str(), TTL).await.unwrap();
    let seen = env.redlock.inspect(&r).await.unwrap();
    assert!(seen.holder().is_some_and(|h| h.has_token(lock.token())));
    assert_eq!(seen.nodes.len(), 3);
    for node in &seen.nodes {
        let holder = node
            .state
            .as_ref()
            .expect("answered")
            .as_ref()
            .expect("held");
        let ttl = holder.ttl.expect("has a TTL");
        assert!(ttl <= TTL && ttl > TTL / 2, "{ttl:?}");
    }
    lock.release().await.unwrap();
    // release() returns at quorum; the last node's DEL may still be on its way.
    let redlock = &env.redlock;
    assert!(
        eventually(Duration::from_secs(2), || async {
            redlock.inspect(&r).await.unwrap().is_free()
        })
        .await
    );
}
