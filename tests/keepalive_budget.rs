//! Keep-alive options at their extremes: no value may panic the task, release the keys while the
//! handle says "held", move the published deadline backwards, or storm the nodes with rounds.
//! Each test here failed before the keep-alive task was hardened (see the comments).

mod common;

use std::time::Duration;

use common::{kept_alive, local_with, unique};
use fredlock::{Error, InvalidInput, KeepAliveOptions, LostReason};
use tokio::time::Instant;

/// `max_hold(Duration::MAX)` is how users say "no limit". It used to panic the task on
/// `Instant + Duration`; the task's lock dropped and released the keys while `is_lost()` still
/// said false, and a contender acquired the resource many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_without_a_limit_keeps_the_lock_and_excludes_others() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let r = unique("maxhold-max");
    let ttl = Duration::from_millis(300);
    let options = KeepAliveOptions::default().max_hold(Duration::MAX);
    let (guard, _) = kept_alive(&redlock, &r, ttl, options).await;
    let handle = guard.handle();
    // Contend for three TTLs, until the third extension: never granted while the holder holds.
    let mut grants_while_held = 0;
    while handle.extensions() < 3 {
        assert!(!handle.is_lost(), "lost: {:?}", handle.changed().await);
        if let Some(other) = redlock.try_acquire(r.as_str(), ttl).await.expect("try") {
            if !handle.is_lost() {
                grants_while_held += 1;
            }
            drop(other);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(grants_while_held, 0, "another client acquired a held lock");
    assert!(!guard.is_lost());
    guard.release().await.expect("still held, released");
}

/// Whatever ends the keep-alive task without handing the lock back (here: its runtime shuts
/// down) must publish "lost" before the keys can go. It used to leave `is_lost()` false until the
/// old deadline.
#[test]
fn a_task_that_ends_publishes_lost_first() {
    let nodes = {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(fredlock_testkit::LocalNodes::start(3))
            .expect("nodes")
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let handle = rt.block_on(async {
        let redlock = fredlock::Redlock::builder()
            .nodes(nodes.urls())
            .build()
            .await
            .expect("build");
        let lock = redlock
            .acquire(unique("task-ends").as_str(), Duration::from_secs(30))
            .await
            .expect("acquire");
        let guard = lock.keep_alive();
        let handle = guard.handle();
        // The guard is leaked on purpose: only the task's own end can publish anything.
        std::mem::forget(guard);
        handle
    });
    assert!(!handle.is_lost());
    drop(rt); // drops the keep-alive task mid-sleep
    assert!(handle.is_lost(), "the handle still says held");
    let reason = tokio::runtime::Runtime::new()
        .expect("rt")
        .block_on(handle.lost());
    assert_eq!(reason, LostReason::TaskEnded);
}

/// A budget of 2.5 TTLs: every published deadline is later than the one before and never past
/// `acquired_at + max_hold`; the lock is lost for the budget; and the end of the budget costs a
/// handful of rounds. It used to re-extend without a pause (hundreds of rounds) and publish a
/// deadline that moved backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_moves_the_deadline_forward_only_and_ends_quietly() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(200);
    let max_hold = ttl * 5 / 2;
    let options = KeepAliveOptions::default().max_hold(max_hold);
    let (guard, acquired_at) = kept_alive(&redlock, &unique("budget"), ttl, options).await;
    let end = acquired_at + max_hold;
    let handle = guard.handle();
    let mut last = handle.deadline();
    let reason = loop {
        match handle.changed().await {
            Ok(deadline) => {
                assert!(deadline >= last, "the deadline moved backwards");
                assert!(deadline <= end, "a deadline past the budget");
                last = deadline;
            }
            Err(reason) => break reason,
        }
    };
    assert_eq!(reason, LostReason::BudgetExhausted);
    assert!(Instant::now() <= end + Duration::from_millis(50));
    // 2.5 TTLs renewed at 2/3 of each: about 3 rounds; a storm would be hundreds.
    let rounds = handle.extensions();
    assert!((2..=5).contains(&rounds), "{rounds} extension rounds");
    let _ = guard.release().await;
}

/// A budget shorter than the TTL caps the first deadline instead of being ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_shorter_than_the_ttl_caps_the_deadline() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_secs(10);
    let max_hold = Duration::from_millis(150);
    let options = KeepAliveOptions::default().max_hold(max_hold);
    let (guard, acquired_at) = kept_alive(&redlock, &unique("short-budget"), ttl, options).await;
    let end = acquired_at + max_hold;
    assert!(guard.deadline() <= end);
    assert_eq!(
        common::bounded("lost()", guard.lost()).await,
        LostReason::BudgetExhausted
    );
    assert!(Instant::now() <= end + Duration::from_millis(50));
    assert_eq!(guard.extensions(), 0);
    let _ = guard.release().await;
}

/// `renew_when_left(0.999)` asks to extend right after every extension. It used to run
/// thousands of rounds a second; two rounds now start at least ttl / 10 apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_almost_at_once_is_paced() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(500);
    let options = KeepAliveOptions::default().renew_when_left(0.999);
    let (guard, _) = kept_alive(&redlock, &unique("storm"), ttl, options).await;
    let handle = guard.handle();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        handle.changed().await.expect("still held");
    }
    // At most one round per ttl / 10 = 50 ms: about 20 in a second.
    let rounds = handle.extensions();
    assert!(rounds <= 24, "{rounds} rounds in one second");
    assert!(rounds >= 5, "{rounds} rounds: the pacing is far too slow");
    guard.release().await.expect("release");
}

/// A keep-alive TTL is validated exactly like an acquire's: 2^60 s used to be accepted and fail
/// every round later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_ttl_is_validated_like_an_acquire_ttl() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let r = unique("ka-ttl");
    let lock = redlock
        .acquire(r.as_str(), Duration::from_secs(5))
        .await
        .expect("acquire");
    let huge = Duration::from_secs(1 << 60);
    let rejected = lock
        .keep_alive_with(KeepAliveOptions::default().ttl(huge))
        .expect_err("a TTL of 2^60 s");
    assert!(
        matches!(
            rejected.error,
            Error::InvalidInput(InvalidInput::TtlTooLarge(_))
        ),
        "{:?}",
        rejected.error
    );
    let lock = rejected.lock;
    let rejected = lock
        .keep_alive_with(KeepAliveOptions::default().ttl(Duration::from_millis(1)))
        .expect_err("a TTL shorter than the drift");
    assert!(
        matches!(
            rejected.error,
            Error::InvalidInput(InvalidInput::TtlTooShort { .. })
        ),
        "{:?}",
        rejected.error
    );
    // The same check guards with_lock before anything is acquired.
    let err = redlock
        .with_lock_using(
            r.as_str(),
            Duration::from_secs(5),
            fredlock::WithLock {
                keep_alive: KeepAliveOptions::default().ttl(huge),
                ..Default::default()
            },
            |_| async {},
        )
        .await
        .expect_err("rejected");
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    rejected.lock.release().await.expect("release");
}

/// Refused options are an ordinary error: `?` converts them into `Box<dyn Error>` (and so
/// into anyhow's error), with a message that names the lock and what was wrong, and the
/// source is the library error. Before, `Rejected` had no `Display` and was no
/// `std::error::Error`, so this did not compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_options_are_a_std_error() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let r = unique("rejected-error");
    let lock = redlock
        .acquire(r.as_str(), Duration::from_secs(5))
        .await
        .expect("acquire");
    fn keep(
        lock: fredlock::Lock,
    ) -> Result<fredlock::KeepAlive, Box<dyn std::error::Error + Send + Sync>> {
        Ok(lock.keep_alive_with(KeepAliveOptions::default().ttl(Duration::from_millis(1)))?)
    }
    let err = keep(lock).expect_err("a TTL shorter than the drift");
    let shown = err.to_string();
    assert!(shown.contains(&r), "{shown}");
    assert!(shown.contains("TTL"), "{shown}");
    let source = std::error::Error::source(&*err)
        .expect("a source")
        .to_string();
    assert!(source.contains("invalid input"), "{source}");
    // The lock went with the error: dropping the error releases it in the background.
    drop(err);
    assert!(
        common::freed_within(&redlock, &redlock.key(&r), Duration::from_secs(5)).await,
        "the dropped lock was not released"
    );
}
