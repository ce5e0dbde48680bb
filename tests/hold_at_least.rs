//! Hold at least: a release before the minimum leaves the keys to expire when it ends, a
//! release after it deletes them, and a minimum longer than the TTL is refused. Each test fails
//! on a plain release, which deletes the keys at once.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{AcquireOptions, Error, InvalidInput, WithLock};
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
    let report = lock
        .release()
        .await
        .expect("an early release still reports the lock as ours");
    // The report says the keys were left to expire, and for how long (the rest of the minimum).
    let left = report.left_to_expire.expect("left to expire, not deleted");
    assert!(left > Duration::ZERO && left <= 3 * SECOND, "{left:?}");
    // Still held on every node, its TTL shortened to the minimum (from 60 s). The release
    // returns once a quorum shortened the keys; the last node's may land after it.
    kept_on_every_node(&env.redlock, &key, 0, 3_000).await;
    refused_before(&env.redlock, &r, minimum_ends).await;
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
    let report = lock.release().await.expect("release");
    assert_eq!(report.left_to_expire, None, "deleted, not left to expire");
    // The release returns at its quorum; the last node's deletion may still be on its way
    // (the keys' TTL is 60 s: gone within 5 s is deleted, not expired).
    assert!(freed_within(&env.redlock, &key, 5 * SECOND).await);
}

/// An extension to a shorter TTL than the rest of the minimum does not undercut it: it is raised
/// to the rest of the minimum, so an early release after it still leaves the keys until the
/// minimum ends, on every node. (Before: the keys were left with the extension's 200 ms.)
#[tokio::test]
async fn an_extension_never_undercuts_the_minimum() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold-extend");
    let options = AcquireOptions::new().hold_at_least(10 * SECOND);
    let mut lock = env
        .redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    let acquired_at = lock.acquired_at();
    lock.extend(Duration::from_millis(200))
        .await
        .expect("extend");
    // Raised to the rest of the minimum (generous margin for a busy machine), not 200 ms.
    assert!(
        lock.ttl() > 2 * SECOND,
        "TTL after the extension: {:?}",
        lock.ttl()
    );
    let report = lock.release().await.expect("release");
    let left = report.left_to_expire.expect("left to expire, not deleted");
    assert!(left > 5 * SECOND && left <= 10 * SECOND, "{left:?}");
    // Every node holds the key for the rest of the minimum (the last node's extension and
    // shortening may land after the quorum's: waited for).
    kept_on_every_node(&env.redlock, &key, 5_000, 10_000).await;
    refused_before(&env.redlock, &r, acquired_at + 10 * SECOND).await;
}

/// Every node holds `key` with a PTTL in `(above, at_most]` ms, within 3 s: a release returns
/// once a quorum answered, the last node's command may land after it.
async fn kept_on_every_node(redlock: &fredlock::Redlock, key: &str, above: i64, at_most: i64) {
    for i in 0..3 {
        let kept = eventually(3 * SECOND, || async {
            let left = pttl(redlock, i, key).await;
            left > above && left <= at_most
        })
        .await;
        let left = pttl(redlock, i, key).await;
        assert!(kept, "node {i}: PTTL {left}");
    }
}

/// Another acquire of `r` is refused while the minimum (ending at `minimum_ends`) lasts.
async fn refused_before(redlock: &fredlock::Redlock, r: &str, minimum_ends: Instant) {
    if Instant::now() >= minimum_ends {
        return;
    }
    let other = redlock.try_acquire(r, PROBE_TTL).await.expect("try");
    // A grant answered before the minimum ended was written before it ended too.
    assert!(
        other.is_none() || Instant::now() >= minimum_ends,
        "another holder got in before the minimum"
    );
}

/// A minimum longer than the TTL could not be kept (the keys expire with the TTL): it is
/// refused before anything is sent, rather than cut to the TTL or lengthening it; a minimum of
/// exactly the TTL is kept; zero is no minimum.
#[tokio::test]
async fn a_minimum_longer_than_the_ttl_is_refused() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "hold-long");
    for at_least in [60 * SECOND, Duration::MAX] {
        let options = AcquireOptions::new().hold_at_least(at_least);
        match env
            .redlock
            .acquire_using(r.as_str(), 10 * SECOND, &options)
            .await
        {
            Err(Error::InvalidInput(InvalidInput::HoldLongerThanTtl { hold_at_least, ttl })) => {
                assert_eq!((hold_at_least, ttl), (at_least, 10 * SECOND));
            }
            other => panic!("{at_least:?} with a 10 s TTL: {other:?}"),
        }
        assert_eq!(values(&env.redlock, &key).await, vec![None, None, None]);
    }
    let refused = env
        .redlock
        .with_lock_using(
            r.as_str(),
            10 * SECOND,
            WithLock::default().hold_at_least(60 * SECOND),
            |_| async { 7 },
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput(InvalidInput::HoldLongerThanTtl { .. }))
        ),
        "{refused:?}"
    );

    // Exactly the TTL: accepted, and an early release leaves the keys to expire.
    let equal = AcquireOptions::new().hold_at_least(2 * SECOND);
    let lock = env
        .redlock
        .acquire_using(r.as_str(), 2 * SECOND, &equal)
        .await
        .expect("a minimum of the TTL itself");
    let report = lock.release().await.expect("release");
    assert!(report.left_to_expire.is_some(), "{report:?}");
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
    let report = lock.release().await.expect("release");
    assert_eq!(report.left_to_expire, None);
    // Deleted (the TTL is 60 s), the last node's deletion perhaps after the quorum's answer.
    assert!(freed_within(&env.redlock, &key2, 5 * SECOND).await);
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

/// Node 2 answers late (paused) and its script cache is empty: the release is decided by nodes 0
/// and 1, and node 2's shortening, answered `NOSCRIPT` after that, must still be resent there
/// (else node 2 keeps the key for its full TTL).
#[tokio::test]
async fn a_late_node_without_the_script_still_shortens() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let (r, key) = resource(&redlock, "hold-noscript");
    let options = AcquireOptions::new().hold_at_least(3 * SECOND);
    let lock = redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    for i in 0..3 {
        nodes.script_flush(i).await.expect("SCRIPT FLUSH");
    }
    nodes.client_pause(2, 300).await.expect("CLIENT PAUSE");
    lock.release().await.expect("release");
    let shortened = eventually(10 * SECOND, || async {
        let left = nodes.pttl(2, &key).await.expect("PTTL");
        left <= 3_000
    })
    .await;
    assert!(
        shortened,
        "node 2 kept the full TTL: the late NOSCRIPT was never resent"
    );
}

/// Node 2 is busy (paused, with another lock's `SET` in flight and a batch behind it) when our
/// lock is granted by nodes 0 and 1, so our `SET` still waits in node 2's batcher queue when the
/// early release shortens the key: the shortening must leave after that `SET`, not overtake it
/// (node 2 would then keep the full 60 s TTL). The resource is one whose wait line is not on
/// node 2 (a gate node takes the line script, not the queue).
#[tokio::test]
async fn a_shortening_never_overtakes_the_set_still_queued_on_a_node() {
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(2 * SECOND)).await;
    let mut names = (0..)
        .map(|_| resource(&redlock, "hold-queued"))
        .filter(|(r, _)| redlock.line_node(r) != Some(2));
    let (r, key) = names.next().expect("a resource gated elsewhere");
    nodes.client_pause(2, 300).await.expect("CLIENT PAUSE");
    // Two other locks: the first one's SET goes to node 2 at once, the second's in a batch
    // behind it, so node 2's batcher waits for an answer when our SET is queued.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let (redlock, (other, _)) = (redlock.clone(), names.next().expect("another"));
        busy.push(tokio::spawn(async move {
            redlock.try_acquire(other.as_str(), 10 * SECOND).await
        }));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
    }
    let options = AcquireOptions::new().hold_at_least(3 * SECOND);
    let lock = redlock
        .acquire_using(r.as_str(), 60 * SECOND, &options)
        .await
        .expect("acquire");
    lock.release().await.expect("release");
    for task in busy {
        let _ = task.await;
    }
    // Node 2 gets the key (our SET) and then its shortening: the key must be seen shortened
    // (with the order broken, it stays at the full TTL).
    let shortened = eventually(10 * SECOND, || async {
        let left = nodes.pttl(2, &key).await.expect("PTTL");
        (1..=3_000).contains(&left)
    })
    .await;
    let left = nodes.pttl(2, &key).await.expect("PTTL");
    assert!(
        shortened,
        "node 2: PTTL {left} ms: the shortening overtook the SET queued there"
    );
}
