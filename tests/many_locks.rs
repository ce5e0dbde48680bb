//! Ten thousand locks kept alive at once from one process (its own test binary, so that its
//! load does not disturb the timing of other tests).

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_kept_alive_locks() {
    // Bursts of 256 acquires on a loaded 2-core machine can meet a node timeout: retry.
    let env = env_with(3, |b| b.retry(retry(10, 10, 10))).await;
    // 10 s: renewing 10,000 locks every ~6.7 s is ~1,500 extension rounds/s, within what a debug
    // build on a busy 2-core machine sustains (a 3 s TTL needed 5,000/s and lost most locks there).
    let ttl = Duration::from_secs(10);
    let prefix = unique("many");
    let started = Instant::now();
    let mut guards = Vec::with_capacity(10_000);
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..10_000 {
        let (redlock, name) = (env.redlock.clone(), format!("{prefix}:{i}"));
        pending.push(async move { redlock.acquire(name.as_str(), ttl).await });
        if pending.len() >= 256 {
            guards.push(pending.next().await.unwrap().expect("acquire").keep_alive());
        }
    }
    while let Some(lock) = pending.next().await {
        guards.push(lock.expect("acquire").keep_alive());
    }
    println!("10,000 locks acquired in {:?}", started.elapsed());
    // Every lock gets extended once (about 2/3 of a TTL after its acquire) and none is lost.
    let all_extended = eventually(ttl * 2, || async {
        guards.iter().all(|g| g.extensions() >= 1)
    })
    .await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let unextended = guards.iter().filter(|g| g.extensions() == 0).count();
    println!(
        "after {:?}: {lost} lost, {unextended} not extended",
        started.elapsed()
    );
    assert!(all_extended);
    assert_eq!(lost, 0);
    // Releasing 10,000 locks 256 at a time on a loaded 2-core machine can meet the release
    // timeout on some nodes; the library then retries those releases in the background. What
    // must hold is that no lock is left behind: every key gone from every node, well before
    // the keys' own TTL would have removed them.
    let released_at = Instant::now();
    let mut releases =
        futures::stream::iter(guards.into_iter().map(|g| g.release())).buffer_unordered(256);
    let mut failed = 0;
    while let Some(r) = releases.next().await {
        failed += usize::from(r.is_err());
    }
    println!("releases answered with an error (retried in the background): {failed}");
    let pattern = format!("{}*", env.redlock.key(&format!("{prefix}:")));
    let left = || async {
        let mut left = 0;
        for i in 0..3 {
            if let fredlock::fred::prelude::Value::Array(keys) =
                raw(&env.redlock, i, &["KEYS", pattern.as_str()]).await
            {
                left += keys.len();
            }
        }
        left
    };
    let all_gone = eventually(ttl / 2, || async { left().await == 0 }).await;
    assert!(
        all_gone,
        "{} keys left {:?} after the releases",
        left().await,
        released_at.elapsed()
    );
}
