//! Hold at least: a release before the minimum leaves the keys to expire when it ends (never
//! later than their TTL), a release after it deletes them. Each test fails on a plain release,
//! which deletes the keys at once.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{AcquireOptions, WithLock};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);
/// The TTL of the probes that check whether another client gets in. Long only for its node
/// timeout (TTL / 20, so 500 ms): a 1 s probe's 50 ms timed out on two nodes of a machine with
/// every core busy (`make test-stress`), an `Unavailable` that says nothing about the lock.
const PROBE_TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn an_early_release_keeps_others_out_until_the_minimum() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold");
    let options = AcquireOptions::new().hold_at_least(3 * SECOND);
    let lock = env
        .redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    assert_eq!(lock.hold_at_least(), Some(3 * SECOND));
    let minimum_ends = lock.acquired_at() + 3 * SECOND;
    lock.release()
        .await
        .expect("an early release still reports the lock as ours");
    // Still held on every node, its TTL shortened to the minimum (from 60 s). The release
    // returns once a quorum shortened the keys; the last node's may land after it.
    for i in 0..3 {
        let shortened = eventually(3 * SECOND, || async {
            let left = pttl(&env.redlock, i, &key).await;
            left > 0 && left <= 3_000
        })
        .await;
        let left = pttl(&env.redlock, i, &key).await;
        assert!(shortened, "node {i}: PTTL {left}");
    }
    if Instant::now() < minimum_ends {
        let other = env
            .redlock
            .try_acquire(r.as_str(), PROBE_TTL)
            .await
            .expect("try");
        // A grant answered before the minimum ended was written before it ended too.
        assert!(
            other.is_none() || Instant::now() >= minimum_ends,
            "another holder got in before the minimum"
        );
    }
    // Gone once the minimum is over (generous margin for a busy machine).
    assert!(freed_within(&env.redlock, &key, 10 * SECOND).await);
    let after = env
        .redlock
        .try_acquire(r.as_str(), PROBE_TTL)
        .await
        .expect("try");
    assert!(after.is_some(), "free after the minimum");
}

#[tokio::test]
async fn a_release_after_the_minimum_deletes_at_once() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold-late");
    let options = AcquireOptions::new().hold_at_least(Duration::from_millis(50));
    let lock = env
        .redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    // The minimum itself is what is tested: wait for it to pass.
    tokio::time::sleep_until(lock.acquired_at() + Duration::from_millis(60)).await;
    lock.release().await.expect("release");
    assert_eq!(values(&env.redlock, &key).await, vec![None, None, None]);
}

#[tokio::test]
async fn the_minimum_never_lengthens_the_ttl() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold-long");
    let options = AcquireOptions::new().hold_at_least(Duration::MAX);
    let lock = env
        .redlock
        .acquire_using(r.as_str(), 2 * SECOND, &options)
        .await
        .expect("acquire");
    lock.release().await.expect("release");
    // As above: the last node's shortening (or SET) may land after the release returned.
    for i in 0..3 {
        let kept = eventually(SECOND, || async {
            let left = pttl(&env.redlock, i, &key).await;
            left > 0 && left <= 2_000
        })
        .await;
        let left = pttl(&env.redlock, i, &key).await;
        assert!(kept, "node {i}: PTTL {left}");
    }
    // Zero is no minimum.
    let (r2, key2) = resource(&env.redlock, "hold-zero");
    let zero = AcquireOptions::new().hold_at_least(Duration::ZERO);
    let lock = env
        .redlock
        .acquire_using(r2.as_str(), 2 * SECOND, &zero)
        .await
        .expect("acquire");
    assert_eq!(lock.hold_at_least(), None);
    lock.release().await.expect("release");
    assert_eq!(values(&env.redlock, &key2).await, vec![None, None, None]);
}

#[tokio::test]
async fn a_dropped_lock_and_with_lock_keep_the_minimum_too() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold-drop");
    let options = AcquireOptions::new().hold_at_least(30 * SECOND);
    let lock = env
        .redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    drop(lock);
    // The shortening lands in the background: the TTL drops to 30 s or less, the key stays.
    let shortened = eventually(10 * SECOND, || async {
        let left = pttl(&env.redlock, 0, &key).await;
        left > 0 && left <= 30_000
    })
    .await;
    assert!(
        shortened,
        "a dropped lock's keys are shortened, not deleted"
    );
    // The acquire returned at a quorum: the last node's SET may still be on its way.
    let everywhere = eventually(5 * SECOND, || async {
        values(&env.redlock, &key).await.iter().all(Option::is_some)
    })
    .await;
    assert!(everywhere, "{:?}", values(&env.redlock, &key).await);

    let (r, key) = resource(&env.redlock, "hold-with");
    let ran = env
        .redlock
        .with_lock_using(
            r.as_str(),
            60 * SECOND,
            WithLock::default().hold_at_least(30 * SECOND),
            |_| async { 7 },
        )
        .await
        .expect("with_lock");
    assert_eq!(ran, 7);
    // The release returns once a quorum shortened the keys; the last node's lands after it.
    for i in 0..3 {
        let shortened = eventually(10 * SECOND, || async {
            let left = pttl(&env.redlock, i, &key).await;
            left > 0 && left <= 30_000
        })
        .await;
        let left = pttl(&env.redlock, i, &key).await;
        assert!(shortened, "node {i}: PTTL {left}");
    }
}
