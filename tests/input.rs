//! Hostile input and hostile replies: every bad input gets its typed error before anything is
//! sent; a key of the wrong type is never taken for a grant.

mod common;

use std::time::Duration;

use common::*;
use fredlock::fred::prelude::{Builder as FredBuilder, Config, Value};
use fredlock::{Error, InvalidInput, NodeErrorKind, Redlock, Retry, Vote};

fn invalid(res: Result<impl std::fmt::Debug, Error>) -> InvalidInput {
    match res {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_input_has_its_error() {
    let env = env(3).await;
    let r = &env.redlock;
    let ttl = Duration::from_secs(1);
    assert_eq!(
        invalid(r.acquire("", ttl).await),
        InvalidInput::EmptyResource
    );
    assert_eq!(
        invalid(r.acquire(["ok", ""], ttl).await),
        InvalidInput::EmptyResource
    );
    assert_eq!(
        invalid(r.acquire(Vec::<String>::new(), ttl).await),
        InvalidInput::NoResources
    );
    assert_eq!(
        invalid(r.try_acquire("x", Duration::ZERO).await),
        InvalidInput::ZeroTtl
    );
    assert!(matches!(
        invalid(r.acquire("x", Duration::MAX).await),
        InvalidInput::TtlTooLarge(_)
    ));
    assert!(matches!(
        invalid(r.acquire("x", Duration::from_millis(2)).await),
        InvalidInput::TtlTooShort { .. }
    ));
    assert_eq!(invalid(r.inspect("").await), InvalidInput::EmptyResource);
    // Nothing was written by any of them.
    for key in ["x", "ok"] {
        assert_eq!(values(r, &r.key(key)).await, vec![None; 3]);
    }

    let mut lock = r.acquire(unique("valid").as_str(), ttl).await.unwrap();
    assert_eq!(
        invalid(lock.extend(Duration::ZERO).await),
        InvalidInput::ZeroTtl
    );
    assert!(
        lock.is_valid(),
        "a rejected extend must leave the lock alone"
    );
    lock.release().await.unwrap();
}

/// A name over `MAX_RESOURCE_LEN` bytes is refused before anything is sent, by every primitive;
/// a name of exactly the limit is a lock like any other. Before, a 1 MB name was accepted (and
/// each acquire took tens of milliseconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_over_the_size_limit_is_refused() {
    let env = env(3).await;
    let r = &env.redlock;
    let ttl = Duration::from_secs(1);
    let at_limit = unique("big");
    let at_limit = format!(
        "{at_limit}{}",
        "x".repeat(fredlock::MAX_RESOURCE_LEN - at_limit.len())
    );
    let lock = r
        .acquire(at_limit.as_str(), ttl)
        .await
        .expect("a name of the limit");
    lock.release().await.expect("release");
    for len in [fredlock::MAX_RESOURCE_LEN + 1, 1 << 20] {
        // A two-byte character across the cut: the error's excerpt must not split it.
        let name = format!("{}{}", "é".repeat(30), "y".repeat(len - 60));
        let too_long = |e: InvalidInput| match e {
            InvalidInput::ResourceTooLong {
                start,
                len: got,
                max,
            } => {
                assert_eq!((got, max), (len, fredlock::MAX_RESOURCE_LEN));
                assert!(name.starts_with(&start) && start.len() <= 40, "{start:?}");
            }
            other => panic!("{len} bytes: expected ResourceTooLong, got {other:?}"),
        };
        too_long(invalid(r.acquire(name.as_str(), ttl).await));
        too_long(invalid(r.acquire(["ok", name.as_str()], ttl).await));
        too_long(invalid(r.try_acquire(name.as_str(), ttl).await));
        too_long(invalid(r.inspect(&name).await));
        too_long(invalid(r.semaphore(name.as_str(), 2)));
        too_long(invalid(r.rwlock(name.as_str())));
        too_long(invalid(r.elect(name.as_str(), ttl)));
        too_long(invalid(r.leader_of(&name).await));
        let shown = invalid(r.acquire(name.as_str(), ttl).await).to_string();
        assert!(shown.contains("hash"), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_configuration_has_its_error() {
    let urls = vec![
        "redis://127.0.0.1:1".to_string(),
        "redis://127.0.0.1:2".into(),
        "redis://127.0.0.1:3".into(),
    ];
    let b = || {
        Redlock::builder()
            .nodes(urls.clone())
            .connect_wait(Duration::from_millis(50))
    };
    assert_eq!(
        invalid(Redlock::builder().build().await),
        InvalidInput::NoNodes
    );
    for bad in [-0.1, 0.5, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            invalid(b().drift_factor(bad).build().await),
            InvalidInput::DriftFactor(_)
        ));
    }
    assert_eq!(
        invalid(
            b().retry(Retry {
                attempts: 0,
                delay: Duration::ZERO,
                jitter: Duration::ZERO
            })
            .build()
            .await
        ),
        InvalidInput::ZeroAttempts
    );
    assert_eq!(
        invalid(
            b().retry(Retry {
                attempts: 1,
                delay: Duration::MAX,
                jitter: Duration::from_secs(1)
            })
            .build()
            .await
        ),
        InvalidInput::RetryTooLarge
    );
    assert_eq!(
        invalid(b().node_timeout(Duration::ZERO).build().await),
        InvalidInput::ZeroNodeTimeout
    );
    // The same server twice (however it is spelled) would fake a majority.
    let dup = Redlock::builder()
        .nodes([
            "redis://127.0.0.1:7001",
            "redis://localhost:7001/0",
            "redis://127.0.0.1:7003",
        ])
        .build()
        .await;
    assert!(matches!(
        invalid(dup),
        InvalidInput::DuplicateNode {
            first: 0,
            second: 1,
            ..
        }
    ));
    // A bad URL says which entry, and never echoes the password.
    let bad = Redlock::builder()
        .nodes([
            "redis://127.0.0.1:7001",
            "redis://u:hunter2@127.0.0.1:notaport",
        ])
        .build()
        .await;
    let e = invalid(bad);
    assert!(matches!(e, InvalidInput::InvalidUrl { index: 1, .. }));
    assert!(
        !e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"),
        "{e:?}"
    );
    // A fred client without a reconnect policy would hang forever after one dropped connection.
    let bare = FredBuilder::from_config(Config::from_url("redis://127.0.0.1:7001").unwrap())
        .build()
        .unwrap();
    assert_eq!(
        invalid(Redlock::builder().clients([bare]).build().await),
        InvalidInput::NoReconnectPolicy { index: 0 }
    );
}

/// Confirmation by replicas: 0 replicas, a WAIT that would block forever or past an hour, and a
/// cluster node (whose writes one connection's WAIT cannot confirm) are refused before any node
/// is asked; 0 replicas with fsync (the primary's own) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_that_cannot_confirm_is_refused() {
    let b = || {
        Redlock::builder()
            .nodes([
                "redis://127.0.0.1:1",
                "redis://127.0.0.1:2",
                "redis://127.0.0.1:3",
            ])
            .connect_wait(Duration::ZERO)
    };
    let long = Duration::from_secs(3601);
    for (replicas, timeout, says) in [
        (0, Duration::from_millis(100), "0 replicas"),
        (1, Duration::ZERO, "zero"),
        (1, long, "too large"),
        (u32::MAX, Duration::MAX, "too large"),
    ] {
        match invalid(b().confirm_replicas(replicas, timeout).build().await) {
            InvalidInput::ConfirmReplicas { reason } => assert!(reason.contains(says), "{reason}"),
            other => panic!("{replicas} {timeout:?}: {other:?}"),
        }
    }
    let local = b()
        .confirm_replicas_fsynced(0, Duration::from_millis(100))
        .build()
        .await;
    assert!(local.is_ok(), "the primary's own fsync: {local:?}");
    let cluster = Redlock::builder()
        .nodes(["redis-cluster://127.0.0.1:7001"])
        .confirm_replicas(1, Duration::from_millis(100))
        .build()
        .await;
    match invalid(cluster) {
        InvalidInput::ConfirmReplicas { reason } => assert!(reason.contains("Cluster"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_never_a_grant() {
    let env = env(3).await;
    let r = &env.redlock;
    let res = unique("wrongtype");
    let key = r.key(&res);
    for i in 0..3 {
        raw(r, i, &["LPUSH", &key, "x"]).await;
    }
    // Acquire: the key exists, so it is held (by something that is not a lock).
    assert!(r
        .try_acquire(res.as_str(), Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
    let other = unique("wrongtype-multi");
    assert!(r
        .try_acquire([res.as_str(), other.as_str()], Duration::from_secs(1))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        values(r, &r.key(&other)).await,
        vec![None; 3],
        "all-or-nothing broken"
    );
    // Inspect: each node reports the server's WRONGTYPE error.
    let seen = r.inspect(&res).await.unwrap();
    assert_eq!(seen.holder(), None);
    for node in &seen.nodes {
        let err = node.state.as_ref().expect_err("WRONGTYPE");
        assert_eq!(err.kind, NodeErrorKind::Server, "{err}");
    }
    // Release and extend of a lock whose key was replaced by a list on a majority: failures, not
    // grants, and the list survives.
    let res2 = unique("replaced");
    let key2 = r.key(&res2);
    let mut lock = r
        .acquire(res2.as_str(), Duration::from_secs(5))
        .await
        .unwrap();
    for i in 0..2 {
        del(r, i, &key2).await;
        raw(r, i, &["LPUSH", &key2, "x"]).await;
    }
    match lock.extend(Duration::from_secs(5)).await {
        Err(Error::Unavailable { votes, .. }) => {
            // Two WRONGTYPE failures decide it; node 2 may still be pending then.
            assert_eq!(votes.failed(), 2, "{votes}");
            assert!(
                matches!(votes.0[2], Vote::Granted | Vote::Pending),
                "{votes}"
            );
            assert!(votes.failures().all(|e| e.kind == NodeErrorKind::Server));
        }
        other => panic!("expected Unavailable (two nodes answered WRONGTYPE), got {other:?}"),
    }
    match lock.release().await {
        Err(Error::Unavailable { votes, .. }) => {
            assert!(matches!(votes.0[0], Vote::Failed(_)));
            assert!(matches!(votes.0[1], Vote::Failed(_)));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    for i in 0..2 {
        assert_eq!(
            raw(r, i, &["LLEN", &key2]).await,
            Value::Integer(1),
            "the list at node {i} was touched"
        );
    }
}
