//! Mutual exclusion, measured: 32 tasks do a non-atomic read-modify-write of one counter.
//! Under the lock no update is lost and no two holders' windows overlap; without it, updates
//! are lost (which proves the test can fail).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use fredlock::fred::prelude::KeysInterface;
use fredlock::Redlock;
use tokio::time::Instant;

const TASKS: usize = 32;
const ROUNDS: usize = 8;

/// GET, yield (so another task can interleave), SET + 1: deliberately not atomic.
async fn increment(redlock: &Redlock, counter: &str) {
    let client = redlock.client(0).expect("node 0");
    let v: Option<i64> = client.get(counter).await.expect("GET");
    tokio::time::sleep(Duration::from_micros(200)).await;
    let _: () = client
        .set(counter, v.unwrap_or(0) + 1, None, None, false)
        .await
        .expect("SET");
}

async fn run(locked: bool) -> (i64, Vec<(Instant, Instant)>) {
    let env = env_with(3, |b| b.retry(retry(100_000, 1, 3))).await;
    let resource = unique("mutex");
    let counter = unique("counter");
    let windows = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (redlock, resource, counter, windows) = (
            env.redlock.clone(),
            resource.clone(),
            counter.clone(),
            windows.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                if locked {
                    let lock = redlock
                        .acquire_with(
                            resource.as_str(),
                            Duration::from_secs(2),
                            Duration::from_secs(60),
                        )
                        .await
                        .expect("acquire");
                    // The holder acts from here until min(release, deadline).
                    let start = Instant::now();
                    increment(&redlock, &counter).await;
                    let end = Instant::now().min(lock.deadline());
                    windows.lock().unwrap().push((start, end));
                    lock.release().await.expect("release while still held");
                } else {
                    increment(&redlock, &counter).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let total: Option<i64> = env.redlock.client(0).unwrap().get(&counter).await.unwrap();
    let windows = windows.lock().unwrap().clone();
    (total.unwrap_or(0), windows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_update_under_the_lock() {
    let (total, mut windows) = run(true).await;
    assert_eq!(
        total,
        (TASKS * ROUNDS) as i64,
        "lost updates under the lock"
    );
    assert_eq!(windows.len(), TASKS * ROUNDS);
    windows.sort();
    for pair in windows.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "two holders' windows overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_updates_are_lost() {
    let (total, _) = run(false).await;
    assert!(
        total < (TASKS * ROUNDS) as i64,
        "expected lost updates without the lock, got all {total}"
    );
}
