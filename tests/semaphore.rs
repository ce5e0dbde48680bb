//! The quorum semaphore: never more holders than permits (and without it, more), one round when
//! slots are free, the API's edge cases, and a permit's keep-alive and lost signal.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{local_with, retry, unique};
use fredlock::{Error, InvalidInput, KeepAliveOptions, LostReason};

/// 12 tasks, 3 permits, each holding for a while: the number of concurrent holders, counted on
/// the client side, never exceeds 3; and without the semaphore it does (the test can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_holders_than_permits() {
    let (_nodes, redlock) = local_with(3, |b| b.retry(retry(1000, 2, 3))).await;
    let sem = redlock.semaphore(unique("pool"), 3).expect("semaphore");
    let run = |guarded: bool| {
        let sem = sem.clone();
        async move {
            let inside = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..12)
                .map(|_| {
                    let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
                    tokio::spawn(async move {
                        for _ in 0..4 {
                            let permit = if guarded {
                                Some(sem.acquire(Duration::from_secs(5)).await.expect("permit"))
                            } else {
                                None
                            };
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            if let Some(p) = permit {
                                p.release().await.expect("release");
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            most.load(Ordering::SeqCst)
        }
    };
    let with = run(true).await;
    assert!(with <= 3, "{with} holders of 3 permits");
    assert!(with >= 2, "the permits were never shared ({with})");
    let without = run(false).await;
    assert!(
        without > 3,
        "the unguarded run never exceeded 3 ({without}): the test is blind"
    );
}

/// One permit: a mutex. All permits taken: try_acquire is None. count() sees the holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_count_and_run_out() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_secs(5);
    let mutex = redlock.semaphore(unique("one"), 1).expect("semaphore");
    let held = mutex.acquire(ttl).await.expect("first");
    assert_eq!(held.slot(), 0);
    assert!(mutex.try_acquire(ttl).await.expect("try").is_none());
    held.release().await.expect("release");
    assert!(mutex.try_acquire(ttl).await.expect("try").is_some());

    let sem = redlock.semaphore(unique("four"), 4).expect("semaphore");
    let mut permits = Vec::new();
    for _ in 0..4 {
        permits.push(
            sem.try_acquire(ttl)
                .await
                .expect("try")
                .expect("a free slot"),
        );
    }
    let mut slots: Vec<usize> = permits.iter().map(|p| p.slot()).collect();
    slots.sort();
    assert_eq!(slots, [0, 1, 2, 3]);
    assert!(sem.try_acquire(ttl).await.expect("try").is_none());
    assert_eq!(sem.count().await.expect("count"), 4);
    let view = sem.inspect().await.expect("inspect");
    assert_eq!(view.slots.len(), 4);
    assert_eq!(view.held(), 4);
    permits
        .pop()
        .expect("one")
        .release()
        .await
        .expect("release");
    assert_eq!(sem.count().await.expect("count"), 3);
}

/// With free slots, an acquire is one round: one script call per node, decided at the first
/// quorum, plus at most one clean-up call (not waited for) for each node whose answer was not
/// needed (its outcome is unknown, so our token is dropped from the other slots there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_slot_takes_one_round() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let sem = redlock.semaphore(unique("round"), 8).expect("semaphore");
    let before = common::calls_on_all(&nodes, "eval").await;
    let permit = sem.acquire(Duration::from_secs(5)).await.expect("permit");
    // The acquire returns at its quorum: the third node's call may still be on its way.
    let landed = common::eventually(Duration::from_secs(5), || async {
        common::calls_on_all(&nodes, "eval").await - before >= 3
    })
    .await;
    let calls = common::calls_on_all(&nodes, "eval").await - before;
    assert!(
        landed && calls <= 4,
        "{calls} EVALs for one acquire on 3 nodes"
    );
    permit.release().await.expect("release");
}

/// 0 permits, an empty name, a reserved name, too many permits: InvalidInput. A name used with
/// another number of permits: PermitsMismatch, not a silent second semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_semaphores_are_rejected() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    assert!(matches!(
        redlock.semaphore("x", 0),
        Err(Error::InvalidInput(InvalidInput::ZeroPermits))
    ));
    assert!(matches!(
        redlock.semaphore("", 2),
        Err(Error::InvalidInput(InvalidInput::EmptyResource))
    ));
    assert!(matches!(
        redlock.semaphore("~x", 2),
        Err(Error::InvalidInput(InvalidInput::ReservedResource(_)))
    ));
    assert!(matches!(
        redlock.semaphore("x", usize::MAX),
        Err(Error::InvalidInput(InvalidInput::TooManyPermits { .. }))
    ));
    let name = unique("resize");
    let two = redlock.semaphore(name.clone(), 2).expect("semaphore");
    two.acquire(Duration::from_secs(5))
        .await
        .expect("permit")
        .release()
        .await
        .expect("release");
    let three = redlock.semaphore(name, 3).expect("semaphore");
    let err = three
        .acquire(Duration::from_secs(5))
        .await
        .expect_err("another number of permits");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::PermitsMismatch { asked: 3, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("2 permits"), "{err}");
}

/// A permit released after it expired and was taken by another: NotHeld, and the other
/// holder's permit is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_permit_cannot_release_the_next_holder() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let sem = redlock.semaphore(unique("stale"), 1).expect("semaphore");
    let old = sem.acquire(Duration::from_millis(100)).await.expect("old");
    tokio::time::sleep_until(old.deadline() + Duration::from_millis(10)).await;
    let new = sem
        .acquire_with(Duration::from_secs(5), Duration::from_secs(2))
        .await
        .expect("new");
    assert!(matches!(old.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(sem.count().await.expect("count"), 1);
    new.release().await.expect("the new holder still holds");
}

/// A kept-alive permit has the lock's lost signal: when its slot is taken from it, lost() says
/// TokenGone before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_says_so() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let sem = redlock.semaphore(unique("lost"), 2).expect("semaphore");
    let permit = sem
        .acquire(Duration::from_millis(600))
        .await
        .expect("permit");
    let key = redlock.key(&sem.slot_resource(permit.slot()));
    let guard = permit
        .keep_alive_with(KeepAliveOptions::default())
        .expect("options");
    let deadline = guard.deadline();
    for i in 0..3 {
        common::del(&redlock, i, &key).await;
    }
    let reason = common::bounded("lost()", guard.lost()).await;
    assert_eq!(reason, LostReason::TokenGone);
    assert!(tokio::time::Instant::now() <= deadline);
}
