//! Leases: a held lock handed to another process (here another `Redlock`, as a process would
//! build; the CLI tests hand leases between real processes). Resume checks a quorum and never
//! re-creates a lock; release by lease works from anywhere; a lease is a typed error once it
//! no longer holds.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{AcquireOptions, Error, Lease, Lock, NotHeldReason, Redlock};

const SECOND: Duration = Duration::from_secs(1);

fn not_held(e: &Error) -> Option<NotHeldReason> {
    match e {
        Error::NotHeld { reason, .. } => Some(*reason),
        _ => None,
    }
}

/// A fresh resource named after `name`, its key, and a lock on it for `ttl`, handed over as a
/// lease (nothing released).
async fn leased(env: &Env, name: &str, ttl: Duration) -> (String, String, Lease) {
    let (r, key) = resource(&env.redlock, name);
    let lease = env
        .redlock
        .acquire(r.as_str(), ttl)
        .await
        .expect("acquire")
        .into_lease();
    (r, key, lease)
}

/// Whether every node holds `key` within 5 s. An acquire returns once a quorum granted it, and
/// the last node's SET may still be on its way: another process's commands do not queue behind
/// it.
async fn held_everywhere(redlock: &Redlock, key: &str) -> bool {
    eventually(5 * SECOND, || async {
        values(redlock, key).await.iter().all(Option::is_some)
    })
    .await
}

#[tokio::test]
async fn a_lease_hands_the_lock_to_another_process() {
    let env = env_with(3, |b| b.fencing_tokens(true)).await;
    let other = build(env.nodes.urls(), |b| b.fencing_tokens(true)).await;
    let (r, key) = resource(&env.redlock, "lease");
    let lock = env
        .redlock
        .acquire(r.as_str(), 30 * SECOND)
        .await
        .expect("acquire");
    let (token, fencing) = (lock.token().to_string(), lock.fencing_token());
    let lease = lock.into_lease();
    // Nothing was released: the keys still hold the token.
    let stored = values(&env.redlock, &key).await;
    assert!(stored
        .iter()
        .all(|v| v.as_deref().is_some_and(|v| v.starts_with(&token))));
    assert_eq!(lease.fencing_token(), fencing);
    assert!(
        !format!("{lease:?}").contains(&token),
        "Debug shows the token"
    );

    let text = lease.to_string();
    let resumed: Lock = other
        .resume(text.parse::<Lease>().expect("parse"))
        .await
        .expect("resume");
    assert_eq!(resumed.token(), token);
    assert_eq!(resumed.fencing_token(), fencing);
    assert_eq!(resumed.resources(), std::slice::from_ref(&r));
    assert!(resumed.remaining() > Duration::ZERO && resumed.remaining() <= 30 * SECOND);
    // Still exclusive, and the resumed lock is a lock: extend and release work.
    assert!(env
        .redlock
        .try_acquire(r.as_str(), SECOND)
        .await
        .expect("try")
        .is_none());
    let mut resumed = resumed;
    resumed
        .extend(20 * SECOND)
        .await
        .expect("extend a resumed lock");
    resumed.release().await.expect("release a resumed lock");
    assert!(freed_within(&env.redlock, &key, 5 * SECOND).await);
}

#[tokio::test]
async fn resume_never_recreates_a_lock_that_expired_or_changed_hands() {
    let env = env(3).await;
    let (r, key, lease) = leased(&env, "lease-gone", 30 * SECOND).await;
    // Someone breaks it and takes it: the lease no longer holds.
    env.redlock.force_release(r.as_str()).await.expect("break");
    let thief = env
        .redlock
        .acquire(r.as_str(), 30 * SECOND)
        .await
        .expect("take over");
    let err = env
        .redlock
        .resume(lease.clone())
        .await
        .expect_err("taken over");
    assert_eq!(not_held(&err), Some(NotHeldReason::TokenGone), "{err}");
    let err = env
        .redlock
        .release_lease(&lease)
        .await
        .expect_err("not ours");
    assert_eq!(not_held(&err), Some(NotHeldReason::TokenGone), "{err}");
    // The new holder is untouched.
    let stored = values(&env.redlock, &key).await;
    assert!(stored
        .iter()
        .all(|v| v.as_deref().is_some_and(|v| v.starts_with(thief.token()))));
    thief.release().await.expect("release");
    // Gone altogether: resume creates nothing.
    let err = env.redlock.resume(lease.clone()).await.expect_err("gone");
    assert_eq!(not_held(&err), Some(NotHeldReason::TokenGone), "{err}");
    assert_eq!(values(&env.redlock, &key).await, vec![None, None, None]);
}

#[tokio::test]
async fn an_expired_lease_is_refused_without_a_round() {
    let env = env(3).await;
    let (_, key, lease) = leased(&env, "lease-expired", Duration::from_millis(300)).await;
    // The lease's deadline is the feature under test: wait past it.
    tokio::time::sleep(lease.remaining() + Duration::from_millis(20)).await;
    assert!(lease.is_expired());
    let err = env.redlock.resume(lease).await.expect_err("expired");
    assert_eq!(not_held(&err), Some(NotHeldReason::Expired), "{err}");
    assert!(freed_within(&env.redlock, &key, 5 * SECOND).await);
}

#[tokio::test]
async fn a_resumed_deadline_follows_the_nodes_ttl() {
    let env = env(3).await;
    let (_, key, lease) = leased(&env, "lease-ttl", 60 * SECOND).await;
    // The nodes say 2 s left: the resumed lock may not count on the lease's 60 s.
    for i in 0..3 {
        let _ = raw(&env.redlock, i, &["PEXPIRE", &key, "2000"]).await;
    }
    let resumed = env.redlock.resume(lease).await.expect("resume");
    assert!(
        resumed.remaining() <= 2 * SECOND,
        "{:?}",
        resumed.remaining()
    );
    resumed.release().await.expect("release");
}

#[tokio::test]
async fn a_quorum_decides_resume_and_release() {
    let (mut nodes, redlock) = local_with(3, |b| b).await;
    let (r, _) = resource(&redlock, "lease-nodes");
    let lock = redlock
        .acquire(r.as_str(), 30 * SECOND)
        .await
        .expect("acquire");
    let kept = lock.keep_alive();
    let lease = kept
        .into_lease()
        .await
        .expect("into_lease of a kept-alive lock");
    nodes.kill(2).expect("kill");
    let resumed = redlock
        .resume(lease.clone())
        .await
        .expect("two of three still hold it");
    drop(resumed.into_lease());
    nodes.kill(1).expect("kill");
    let err = redlock
        .resume(lease.clone())
        .await
        .expect_err("one node is no quorum");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let err = redlock
        .release_lease(&lease)
        .await
        .expect_err("one node is no quorum");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn release_by_lease_from_another_process() {
    let env = env(3).await;
    let other = build(env.nodes.urls(), |b| b).await;
    let (_, key, lease) = leased(&env, "lease-release", 30 * SECOND).await;
    // The release below comes through other connections, which a SET still on its way from
    // `env.redlock` would overtake: that node would keep the key for its TTL.
    assert!(
        held_everywhere(&env.redlock, &key).await,
        "{:?}",
        values(&env.redlock, &key).await
    );
    let report = other.release_lease(&lease).await.expect("release by lease");
    assert!(report.votes.granted() >= 2, "{}", report.votes);
    let freed = freed_within(&env.redlock, &key, 5 * SECOND).await;
    let mut left = Vec::new();
    for i in 0..3 {
        left.push((
            get(&env.redlock, i, &key).await.is_some(),
            pttl(&env.redlock, i, &key).await,
        ));
    }
    assert!(
        freed,
        "(held, PTTL) per node: {left:?}; votes {}",
        report.votes
    );
    let err = other
        .release_lease(&lease)
        .await
        .expect_err("already released");
    assert_eq!(not_held(&err), Some(NotHeldReason::TokenGone), "{err}");
}

#[cfg(feature = "serde")]
#[tokio::test]
async fn a_lease_through_serde_is_its_text() {
    let env = env(3).await;
    let (_, _, lease) = leased(&env, "lease-serde", 30 * SECOND).await;
    let json = serde_json::to_string(&lease).expect("serialize");
    assert_eq!(json, format!("\"{lease}\""));
    let back: Lease = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, lease);
    assert!(serde_json::from_str::<Lease>("\"fredlock-lease:1:x\"").is_err());
    env.redlock.release_lease(&back).await.expect("release");
}

/// A lock held for a minimum (`hold_at_least`) keeps it through a lease: released by the
/// lease, or resumed (by another `Redlock`, as another process) and released, before the
/// minimum, the keys stay on every node until it. (Before: the lease had no minimum, and both
/// releases deleted the keys at once.)
#[tokio::test]
async fn a_lease_keeps_the_minimum_of_its_lock() {
    let env = env(3).await;
    let other = build(env.nodes.urls(), |b| b).await;
    for resume in [false, true] {
        let (r, key) = resource(&env.redlock, "lease-minimum");
        let options = AcquireOptions::new().hold_at_least(10 * SECOND);
        let lock = env
            .redlock
            .acquire_using(r.as_str(), 60 * SECOND, &options)
            .await
            .expect("acquire");
        let text = lock.into_lease().to_string();
        let lease: Lease = text.parse().expect("parse");
        assert!(lease.minimum_ends().is_some(), "{lease:?}");
        let report = match resume {
            false => other.release_lease(&lease).await,
            true => {
                let lock = other.resume(lease).await.expect("resume");
                assert!(lock.hold_at_least().is_some_and(|d| d > 5 * SECOND));
                lock.release().await
            }
        }
        .expect("release");
        let left = report.left_to_expire.expect("left to expire, not deleted");
        // Up to 2 ms over the minimum: the lease rounds its end up to the next millisecond of
        // the wall clock, and the release rounds what is left up to whole milliseconds (seen:
        // 10.001 s in a release build, where all of this runs within a millisecond).
        let most = 10 * SECOND + Duration::from_millis(2);
        assert!(left > 5 * SECOND && left <= most, "{left:?}");
        for i in 0..3 {
            let kept = eventually(3 * SECOND, || async {
                let left = pttl(&env.redlock, i, &key).await;
                left > 5_000 && left <= 10_000
            })
            .await;
            let left = pttl(&env.redlock, i, &key).await;
            assert!(kept, "resume {resume}, node {i}: PTTL {left}");
        }
    }
}
