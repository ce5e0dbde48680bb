//! A lock's life: expiry frees a crashed holder, a stale release or extend never touches the next
//! holder, extend never revives, SCRIPT FLUSH does not stop release or extend.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{Error, NotHeldReason};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_frees_a_crashed_holder() {
    let env = env_with(3, |b| b.retry(retry(1000, 5, 5))).await;
    let r = unique("crash");
    let ttl = Duration::from_millis(500);
    let first = env.redlock.acquire(r.as_str(), ttl).await.unwrap();
    let first_deadline = first.deadline();
    // A crash: the holder never releases (no Drop, no background release).
    std::mem::forget(first);
    assert!(env
        .redlock
        .try_acquire(r.as_str(), ttl)
        .await
        .unwrap()
        .is_none());
    let started = Instant::now();
    let second = env
        .redlock
        .acquire(r.as_str(), ttl)
        .await
        .expect("acquired after expiry");
    // L1: within TTL + retry delay of the crash; S3: its window starts after the first's ended.
    assert!(
        started.elapsed() < ttl + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(second.acquired_at() >= first_deadline, "windows overlap");
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_and_extend_leave_the_next_holder_alone() {
    let env = env(3).await;
    let redlock = &env.redlock;
    let (r, key) = resource(redlock, "stolen");
    let mut old = redlock
        .acquire(r.as_str(), Duration::from_millis(200))
        .await
        .unwrap();
    // Wait until the keys are really gone everywhere (expiry is the event; poll for it).
    assert!(freed_within(redlock, &key, Duration::from_secs(3)).await);
    let new = redlock
        .acquire(r.as_str(), Duration::from_secs(10))
        .await
        .expect("new holder");
    let held_by_new = vec![Some(new.value().to_string()); 3];
    assert!(values_become(redlock, &key, &held_by_new, Duration::from_secs(2)).await);

    // Stale extend: expired locally, so nothing is even sent.
    match old.extend(Duration::from_secs(10)).await {
        Err(Error::NotHeld {
            reason: NotHeldReason::Expired,
            ..
        }) => {}
        other => panic!("expected NotHeld(Expired), got {other:?}"),
    }
    // Stale release: sent everywhere, deletes nothing of the new holder's.
    match old.release().await {
        Err(Error::NotHeld {
            reason: NotHeldReason::TokenGone,
            votes,
            ..
        }) => assert_eq!(votes.granted(), 0),
        other => panic!("expected NotHeld(TokenGone), got {other:?}"),
    }
    assert_eq!(values(redlock, &key).await, held_by_new);
    let inspection = redlock.inspect(&r).await.unwrap();
    assert!(inspection
        .holder()
        .is_some_and(|h| h.has_token(new.token())));
    new.release().await.expect("the new holder still holds it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_the_deadline_and_never_revives() {
    let env = env(3).await;
    let redlock = &env.redlock;
    let (r, key) = resource(redlock, "extend");
    let mut lock = redlock
        .acquire(r.as_str(), Duration::from_secs(2))
        .await
        .unwrap();
    let before = lock.deadline();
    let started = Instant::now();
    lock.extend(Duration::from_secs(20)).await.expect("extend");
    let finished = Instant::now();
    assert!(lock.deadline() > before);
    // New deadline = the extend's start + ttl - drift (drift = 1% + 2 ms = 202 ms).
    let validity = Duration::from_secs(20) - Duration::from_millis(202);
    assert!(lock.deadline() >= started + validity && lock.deadline() <= finished + validity);
    assert_eq!(lock.ttl(), Duration::from_secs(20));
    // Every node (the round decides at a quorum; the last node's extension, resent after a
    // NOSCRIPT, may land a moment later).
    for i in 0..3 {
        let extended = eventually(Duration::from_secs(2), || async {
            let pttl = pttl(redlock, i, &key).await;
            pttl > 10_000 && pttl <= 20_000
        })
        .await;
        assert!(extended, "node {i}: pttl {}", pttl(redlock, i, &key).await);
    }

    // Keys gone behind our back (expired on the nodes while we think we are valid): extend must
    // report it and must not re-create them.
    for i in 0..3 {
        del(redlock, i, &key).await;
    }
    match lock.extend(Duration::from_secs(20)).await {
        Err(Error::NotHeld {
            reason: NotHeldReason::TokenGone,
            votes,
            ..
        }) => assert_eq!(votes.granted(), 0),
        other => panic!("expected NotHeld(TokenGone), got {other:?}"),
    }
    assert_eq!(
        values(redlock, &key).await,
        vec![None; 3],
        "extend revived an expired key"
    );

    // A foreign value at the key (another owner): extend leaves it and its TTL alone.
    for i in 0..3 {
        set_foreign(redlock, i, &key).await;
    }
    assert!(lock.extend(Duration::from_secs(60)).await.is_err());
    for i in 0..3 {
        let pttl = pttl(redlock, i, &key).await;
        assert!(pttl <= 30_000, "foreign key's TTL was extended: {pttl}");
    }
    assert!(matches!(lock.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        values(redlock, &key).await,
        vec![Some("someone-else".to_string()); 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_does_not_stop_release_or_extend() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let single = unique("flush1");
    let (a, b) = (unique("flush-a"), unique("flush-b"));
    let mut one = redlock
        .acquire(single.as_str(), Duration::from_secs(10))
        .await
        .unwrap();
    let mut two = redlock
        .acquire([a.as_str(), b.as_str()], Duration::from_secs(10))
        .await
        .unwrap();
    one.extend(Duration::from_secs(10)).await.unwrap();
    for i in 0..3 {
        nodes.script_flush(i).await.unwrap();
    }
    one.extend(Duration::from_secs(10))
        .await
        .expect("extend after SCRIPT FLUSH");
    two.extend(Duration::from_secs(10))
        .await
        .expect("multi extend after SCRIPT FLUSH");
    for i in 0..3 {
        nodes.script_flush(i).await.unwrap();
    }
    let report = one.release().await.expect("release after SCRIPT FLUSH");
    assert!(report.votes.granted() >= 2);
    two.release()
        .await
        .expect("multi release after SCRIPT FLUSH");
    for i in 0..3 {
        nodes.script_flush(i).await.unwrap();
    }
    // Acquiring several keys uses a script too.
    let three = redlock
        .acquire([a.as_str(), b.as_str()], Duration::from_secs(10))
        .await
        .expect("multi acquire after flush");
    three.release().await.unwrap();
    for key in [redlock.key(&single), redlock.key(&a), redlock.key(&b)] {
        assert!(
            freed_within(&redlock, &key, Duration::from_secs(2)).await,
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_lock_releases_it_in_the_background() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "drop");
    let lock = env
        .redlock
        .acquire(r.as_str(), Duration::from_secs(30))
        .await
        .unwrap();
    drop(lock);
    assert!(freed_within(&env.redlock, &key, Duration::from_secs(2)).await);
    assert!(env
        .redlock
        .try_acquire(r.as_str(), Duration::from_secs(1))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_waits_for_the_wait_not_the_attempt_count() {
    let env = env_with(3, |b| b.retry(retry(1, 20, 10))).await;
    let r = unique("wait");
    let held = env
        .redlock
        .acquire(r.as_str(), Duration::from_secs(10))
        .await
        .unwrap();
    let wait = Duration::from_millis(300);
    let t = Instant::now();
    match env
        .redlock
        .acquire_with(r.as_str(), Duration::from_secs(1), wait)
        .await
    {
        // More than the policy's single attempt. (Waiting in line, nothing wakes it here: it
        // looks at its gate again when its subscription comes up, then once a second.)
        Err(Error::Contended { attempts, .. }) => assert!(attempts >= 2, "{attempts} attempts"),
        other => panic!("expected Contended, got {other:?}"),
    }
    let took = t.elapsed();
    // No attempt starts after the wait; the last one is bounded by the node timeout (10 ms).
    assert!(
        took >= wait - Duration::from_millis(30) && took < wait + Duration::from_millis(500),
        "{took:?}"
    );
    // A zero wait is exactly one attempt.
    match env
        .redlock
        .acquire_with(r.as_str(), Duration::from_secs(1), Duration::ZERO)
        .await
    {
        Err(Error::Contended { attempts: 1, .. }) => {}
        other => panic!("expected one attempt, got {other:?}"),
    }
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_background_releases() {
    let env = env(3).await;
    let (r, key) = resource(&env.redlock, "close");
    for _ in 0..20 {
        let lock = env
            .redlock
            .acquire(r.as_str(), Duration::from_secs(30))
            .await
            .unwrap();
        lock.release().await.unwrap();
    }
    let lock = env
        .redlock
        .acquire(r.as_str(), Duration::from_secs(30))
        .await
        .unwrap();
    drop(lock); // released in the background
    env.redlock.close().await;
    // Checked once, no polling: close() returned after every queued release was answered.
    let fresh = fredlock::Redlock::builder()
        .nodes(env.nodes.urls())
        .build()
        .await
        .unwrap();
    assert_eq!(values(&fresh, &key).await, vec![None; 3]);
    assert!(matches!(
        env.redlock
            .try_acquire(r.as_str(), Duration::from_secs(1))
            .await,
        Err(Error::Closed { .. })
    ));
}

/// An extend to a SHORTER TTL that fails (only one node answers in time) may still have
/// shortened the keys on the nodes that did not answer: the lock's deadline must drop to what
/// that extension would set, or another client acquires while this one believes it holds.
/// Before, a failed extend left the old (5 s) deadline while two nodes' keys expired at 200 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shortening_extend_lowers_the_deadline() {
    let nodes = fredlock_testkit::LocalNodes::start(3).await.expect("nodes");
    let (proxies, a) = common::behind_proxies(&nodes, |b| {
        b.node_timeout(Duration::from_millis(50))
            .retry(fredlock::Retry::once())
    })
    .await;
    let r = common::unique("shorten");
    let mut lock = a
        .acquire(r.as_str(), Duration::from_secs(5))
        .await
        .expect("acquire");
    // Load the extend script everywhere first (the first EVALSHA meets NOSCRIPT), and wait
    // until it ran on every node: the extend returns at a quorum, and a late node's resend
    // after NOSCRIPT would otherwise still be pending when its replies are held below.
    lock.extend(Duration::from_secs(8)).await.expect("extend");
    let key = a.key(&r);
    for i in 0..3 {
        let (nodes, key) = (&nodes, &key);
        let extended = common::eventually(Duration::from_secs(5), || async move {
            nodes.pttl(i, key).await.is_ok_and(|ms| ms > 5_500)
        })
        .await;
        assert!(extended, "node {i}: the 8 s extension never landed");
    }
    // Nodes 1 and 2 get the extension but their answers are held: the extend fails.
    proxies[1].set(fredlock_testkit::Fault::HoldReplies);
    proxies[2].set(fredlock_testkit::Fault::HoldReplies);
    let started = tokio::time::Instant::now();
    let short = Duration::from_millis(200);
    assert!(lock.extend(short).await.is_err(), "only one node answered");
    assert!(
        lock.deadline() <= started + short,
        "the deadline stayed {:?} away while the keys may expire in {short:?}",
        lock.deadline().saturating_duration_since(started)
    );
    // Indeed: nodes 1 and 2 now expire the key within the short TTL.
    assert!(common::gone_within(&nodes, 1, &a.key(&r), Duration::from_secs(2)).await);
    for p in &proxies {
        p.set(fredlock_testkit::Fault::Pass);
    }
}

/// Acquire scripts (a fenced acquire here: it creates the key) go whole once per connection,
/// then by hash; after a SCRIPT FLUSH, the flushed nodes refuse one attempt (the script did not
/// run, and it is never resent) and the next attempt sends the body again: an acquire with
/// retries succeeds, and every key is released. Before, every acquire sent the whole body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_scripts_go_by_hash_after_their_first_use() {
    let (nodes, redlock) = local_with(3, |b| b.fencing_tokens(true)).await;
    let r = unique("by-hash");
    let key = redlock.key(&r);
    // The gate node of the resource's wait line runs its line scripts as well: left out.
    let gate = redlock.line_node(&r);
    let others: Vec<usize> = (0..3).filter(|&n| Some(n) != gate).collect();
    // One acquire and release, each followed by a wait until nothing is in flight (the calls
    // after a quorum answered: otherwise the next commands could share a batch with them, and
    // a batch is always sent whole).
    let all = [0, 1, 2];
    let cycle = || async {
        let lock = redlock.acquire(r.as_str(), Duration::from_secs(10)).await;
        let lock = lock.expect("acquire");
        settled(&nodes, &all, &["eval", "evalsha"]).await;
        lock.release().await.expect("release");
        settled(&nodes, &all, &["eval", "evalsha"]).await;
        for n in all {
            let gone = nodes.command(n, &["EXISTS", key.as_str()]).await.ok();
            assert_eq!(
                gone,
                Some(fredlock_testkit::RespValue::Integer(0)),
                "node {n}"
            );
        }
    };
    // Warm-up: the first cycles send each script's body once per connection.
    for _ in 0..2 {
        cycle().await;
    }
    let before = settled(&nodes, &others, &["eval"]).await;
    for _ in 0..5 {
        cycle().await;
    }
    assert_eq!(
        settled(&nodes, &others, &["eval"]).await,
        before,
        "a body was sent again"
    );
    for n in 0..3 {
        nodes.script_flush(n).await.unwrap();
    }
    // Each node sends each script whole once more, at its next use there (which may come some
    // cycles later: after a refused attempt the key counts as contended for 2 s, and an
    // attempt asks the gate first, then the other nodes only until a quorum answered); then
    // only by hash again.
    for _ in 0..8 {
        cycle().await;
    }
    let after = settled(&nodes, &others, &["eval"]).await;
    for (b, a) in before.iter().zip(&after) {
        assert!((1..=6).contains(&(a - b)), "{before:?} -> {after:?}");
    }
    for _ in 0..5 {
        cycle().await;
    }
    assert_eq!(
        settled(&nodes, &others, &["eval"]).await,
        after,
        "a body was sent again"
    );
}

/// The calls of `commands` on each of `ns` (summed per node) once they stop changing for
/// 300 ms.
async fn settled(
    nodes: &fredlock_testkit::LocalNodes,
    ns: &[usize],
    commands: &[&str],
) -> Vec<u64> {
    let read = || async {
        let mut out = Vec::new();
        for &n in ns {
            let mut calls = 0;
            for c in commands {
                calls += command_calls(nodes, n, c).await;
            }
            out.push(calls);
        }
        out
    };
    let mut last = read().await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = read().await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// `close()` waits for the late answers of a round decided without them: an extension that
/// two nodes granted while the third was frozen, whose third `EVALSHA` then comes back
/// `NOSCRIPT`, is resent as `EVAL` before the connection is closed (a short-lived process, such
/// as `fredlock extend`, exits right after `close()`; without the wait its third node kept the
/// old TTL). On a server with a native extension (Valkey 9) there is no resend to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_a_late_extension_resent_after_noscript() {
    let (nodes, redlock) = local_with(3, |b| b.node_timeout(Duration::from_secs(10))).await;
    let (r, key) = resource(&redlock, "close-late");
    let mut lock = redlock
        .acquire(r.as_str(), Duration::from_secs(60))
        .await
        .unwrap();
    for i in 0..3 {
        nodes.script_flush(i).await.expect("SCRIPT FLUSH");
    }
    nodes.pause(0).expect("SIGSTOP");
    let extended = lock.extend(Duration::from_secs(600)).await;
    nodes.resume(0).expect("SIGCONT");
    extended.expect("extended by the two running nodes");
    // Handed on, as `fredlock extend` does: close() leaves a lease's keys for its next holder.
    let _lease = lock.into_lease();
    redlock.close().await;
    // Checked once: close() returned after node 0's late extension was answered.
    let ttl = nodes.pttl(0, &key).await.expect("PTTL");
    assert!(ttl > 60_000, "node 0 kept the old TTL: PTTL {ttl}");
}

/// Nodes on Unix domain sockets (feature `unix-sockets`): `redis+unix://` and `unix://` URLs
/// grant, extend and release like TCP ones, and the key is on the server behind the socket.
/// Before, both schemes were refused ("unsupported scheme").
#[cfg(feature = "unix-sockets")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_unix_sockets_grant_and_release() {
    let nodes = fredlock_testkit::LocalNodes::start_with_unix_sockets(3)
        .await
        .expect("nodes");
    let mut urls: Vec<String> = (0..3).map(|i| nodes.unix_url(i)).collect();
    urls[2] = urls[2].replacen("redis+unix://", "unix://", 1);
    let redlock = fredlock::Redlock::builder()
        .nodes(urls)
        .require_quorum(true)
        .build()
        .await
        .expect("build on Unix sockets");
    for name in redlock.node_names() {
        assert!(
            name.starts_with("unix:/") && name.ends_with("redis.sock/0"),
            "{name}"
        );
    }
    let (r, key) = resource(&redlock, "unix");
    let mut lock = redlock
        .acquire(r.as_str(), Duration::from_secs(10))
        .await
        .expect("acquire");
    lock.extend(Duration::from_secs(20)).await.expect("extend");
    // The nodes that voted for the grant (a quorum) hold it; the third may still be answering.
    let mut holding = 0;
    for i in 0..3 {
        let value = nodes.get(i, &key).await.expect("GET over TCP");
        holding += usize::from(value.as_deref() == Some(lock.value()));
    }
    assert!(holding >= 2, "{holding} of 3 nodes hold the lock");
    lock.release().await.expect("release");
    // close() waits for the late answers: then no node holds the key.
    redlock.close().await;
    for i in 0..3 {
        assert_eq!(nodes.get(i, &key).await.expect("GET"), None, "node {i}");
    }
}
