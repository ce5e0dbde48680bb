//! A critical section shared by several PROCESSES, protected by a fredlock Redlock.
//!
//! Every worker process increments ONE counter stored in Redis with a deliberately non-atomic
//! read-modify-write: `GET`, a short pause (standing in for real work, and widening the race
//! window), then `SET value + 1`. Two workers that interleave read the same value and one
//! increment is lost. Under the lock they take turns, so none is lost.
//!
//! ```text
//! cargo run --example critical_section               # with the lock
//! cargo run --example critical_section -- --no-lock  # watch updates get lost
//! cargo run --example critical_section -- --workers 8 --increments 25
//! ```
//!
//! The part to copy is [`worker`] and the settings above it. The rest of the demonstration
//! (the nodes, starting the worker processes all at once, the header, the total and the
//! verdict) is test machinery in `fredlock_testkit::demo::critical_section`. Nodes: the URLs in
//! `FREDLOCK_NODES` (comma-separated, e.g. the three nodes of the project's
//! `docker-compose.yml`) when set; otherwise three local `redis-server` processes started for the
//! run and stopped at the end.

use std::process::ExitCode;
use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Redlock, Retry};
use fredlock_testkit::demo::critical_section::{self as demo, Stats, Worker};
use fredlock_testkit::demo::BoxError;
use tokio::time::Instant;

/// The lock every worker takes around its read-modify-write.
const RESOURCE: &str = "demo:critical-section";
/// The shared counter, on the first node (any one node works: the lock, not the counter's
/// location, is what makes the increments safe).
const COUNTER: &str = "demo:counter";
/// Lock TTL: far longer than one critical section (about a millisecond), so a healthy holder
/// never comes close to its deadline, yet short enough that a worker killed while holding the
/// lock blocks the others for a few seconds only.
const TTL: Duration = Duration::from_secs(5);
/// How long one worker waits for the lock before giving up: longer than a TTL, so even a lock
/// left behind by a killed earlier run expires before anyone gives up.
const WAIT: Duration = Duration::from_secs(30);
/// Retry fast and often: critical sections here last about a millisecond, so the lock changes
/// hands hundreds of times per second. The jitter spreads the waiters out so they do not all
/// collide again on the next attempt. `WAIT` bounds the total, not the attempt count.
const RETRY: Retry = Retry {
    attempts: 10_000,
    delay: Duration::from_millis(2),
    jitter: Duration::from_millis(3),
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Without arguments: the parent (the testkit), which starts copies of this program that
    // each run `worker`.
    demo::main(RESOURCE, COUNTER, TTL, worker).await
}

/// One worker process: `w.increments` times { lock; GET; pause; SET + 1; unlock }.
async fn worker(w: Worker) -> Result<Stats, BoxError> {
    let redlock = Redlock::builder()
        .nodes(w.nodes.clone())
        .retry(RETRY)
        .build()
        .await?;
    let client = redlock.client(0).ok_or("no node configured")?;
    w.wait_for_start().await?; // connected; every worker begins at the same moment

    let mut stats = Stats::default();
    for n in 1..=w.increments {
        let lock = if w.locked {
            let asked = Instant::now();
            let lock = redlock
                .acquire_with(RESOURCE, TTL, WAIT)
                .await
                .map_err(|e| format!("acquire for increment {n}: {e}"))?;
            stats.acquired(asked.elapsed());
            Some(lock)
        } else {
            None // --no-lock
        };

        // The critical section: read, "work", write. Not atomic on purpose.
        let value: Option<i64> = client.get(COUNTER).await?;
        tokio::time::sleep(w.pause).await;
        // Never write once the lock may have passed to someone else. (This check and the SET are
        // still two steps: a holder that stalls between them needs a fencing token checked by
        // the store itself. With a 5 s TTL and a 1 ms section it does not happen here.)
        if lock.as_ref().is_some_and(|lock| !lock.is_valid()) {
            return Err(
                format!("the lock's deadline passed before the write of increment {n}").into(),
            );
        }
        let _: () = client
            .set(COUNTER, value.unwrap_or(0) + 1, None, None, false)
            .await?;
        stats.increments += 1;

        if let Some(lock) = lock {
            // An error here means a quorum no longer held our token when we released: the
            // increment above may not have been exclusive. That is a failure, not a detail.
            lock.release()
                .await
                .map_err(|e| format!("release after increment {n}: {e}"))?;
        }
    }
    Ok(stats)
}
