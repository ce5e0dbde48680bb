//! Fencing tokens across the quorum: strictly increasing across successive holders even when
//! each grant comes from a different majority; untouched by extend and release; one per
//! resource and per semaphore slot; a fenced register rejects a paused holder's stale write; and
//! the documented limit: a node that restarts empty can make a token repeat.

mod common;

use std::time::Duration;

use common::{eventually, local_with, unique};
use fredlock::Redlock;
use fredlock_testkit::LocalNodes;

const TTL: Duration = Duration::from_secs(5);

async fn fenced(n: usize) -> (LocalNodes, Redlock) {
    local_with(n, |b| {
        b.fencing_tokens(true)
            .node_timeout(Duration::from_millis(100))
    })
    .await
}

/// The last fencing token seen: each holder's must be higher.
#[derive(Default)]
struct Rising(u64);

impl Rising {
    fn next(&mut self, token: Option<u64>, holder: usize) {
        let token = token.expect("fencing on: a token");
        assert!(token > self.0, "holder {holder}: {token} after {}", self.0);
        self.0 = token;
    }
}

/// Also: a fenced acquire of one key checks the key with its `SET NX`, with no `EXISTS`
/// before it (fails with the several-keys path: one `EXISTS` per node and acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_holders() {
    let (nodes, redlock) = fenced(3).await;
    let r = unique("seq");
    let mut last = Rising::default();
    let exists = |i| common::command_calls(&nodes, i, "exists");
    let before = [exists(0).await, exists(1).await, exists(2).await];
    for holder in 0..20 {
        let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
        last.next(lock.fencing_token(), holder);
        lock.release().await.expect("release");
    }
    let after = [exists(0).await, exists(1).await, exists(2).await];
    assert_eq!(before, after, "EXISTS calls per node");
    // Without fencing: no token.
    let (_n2, plain) = local_with(3, |b| b).await;
    let lock = plain.acquire(r.as_str(), TTL).await.expect("acquire");
    assert_eq!(lock.fencing_token(), None);
}

/// Each grant from another majority (one node frozen each time, never the same): the write-back
/// to a quorum is what carries the count from one majority to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_when_every_grant_has_another_majority() {
    let (nodes, redlock) = fenced(3).await;
    let r = unique("majorities");
    let mut last = Rising::default();
    for round in 0..6 {
        let frozen = round % 3;
        nodes.pause(frozen).expect("pause");
        let lock = redlock.acquire(r.as_str(), TTL).await;
        nodes.resume(frozen).expect("resume");
        let lock = lock.expect("a majority is up");
        last.next(lock.fencing_token(), round);
        lock.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_release_leave_the_counters_alone() {
    let (nodes, redlock) = fenced(3).await;
    let r = unique("untouched");
    let mut lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    let token = lock.fencing_token().expect("token").to_string();
    let key = redlock.fence_key(&r);
    let counters = || async {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(nodes.get(i, &key).await.expect("GET"));
        }
        v
    };
    // The write-back is decided by a quorum; a late node's lands just after: wait for it.
    let everywhere = eventually(Duration::from_secs(10), || async {
        let token = Some(token.clone());
        counters().await.iter().all(|c| *c == token)
    })
    .await;
    assert!(everywhere, "the write-back reached every node");
    let before = counters().await;
    assert!(
        before
            .iter()
            .filter(|c| c.as_deref() == Some(token.as_str()))
            .count()
            >= 2
    );
    lock.extend(TTL).await.expect("extend");
    lock.release().await.expect("release");
    assert_eq!(counters().await, before);
    // Counters never expire (on each node the write-back reached: a quorum, not always node 0).
    for (i, counter) in before.iter().enumerate() {
        if counter.is_some() {
            assert_eq!(nodes.pttl(i, &key).await.expect("PTTL"), -1, "node {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_per_resource_and_per_slot() {
    let (_nodes, redlock) = fenced(3).await;
    let (a, b) = (unique("a"), unique("b"));
    redlock
        .acquire(a.as_str(), TTL)
        .await
        .expect("a")
        .release()
        .await
        .expect("release");
    let both = redlock
        .acquire([a.as_str(), b.as_str()], TTL)
        .await
        .expect("both");
    let tokens = both.fencing_tokens().expect("tokens").to_vec();
    let by_name: Vec<(&str, u64)> = both
        .resources()
        .iter()
        .map(String::as_str)
        .zip(tokens.iter().copied())
        .collect();
    assert!(by_name.contains(&(a.as_str(), 2)), "{by_name:?}");
    assert!(by_name.contains(&(b.as_str(), 1)), "{by_name:?}");
    both.release().await.expect("release");

    let sem = redlock.semaphore(unique("sem"), 1).expect("semaphore");
    let mut last = Rising::default();
    for holder in 0..5 {
        let permit = sem.acquire(TTL).await.expect("permit");
        last.next(permit.fencing_token(), holder);
        permit.release().await.expect("release");
    }
}

/// The reason fencing exists: holder A pauses past its deadline, B takes the lock and writes;
/// A wakes and writes with its older token; the fenced register (a Redis key updated only by a
/// higher token) rejects A's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_register_rejects_a_paused_holder() {
    let (nodes, redlock) = fenced(3).await;
    let r = unique("register");
    let a = redlock
        .acquire(r.as_str(), Duration::from_millis(200))
        .await
        .expect("A");
    let token_a = a.fencing_token().expect("token");
    // A "pauses": it does nothing until well past its deadline.
    tokio::time::sleep_until(a.deadline() + Duration::from_millis(50)).await;
    let b = redlock.acquire(r.as_str(), TTL).await.expect("B");
    let token_b = b.fencing_token().expect("token");
    assert!(token_b > token_a);
    let write = |token: u64, value: &'static str| {
        let nodes = &nodes;
        async move {
            let reply = nodes
                .command(
                    0,
                    &[
                        "EVAL",
                        FENCED_WRITE,
                        "2",
                        "data",
                        "data:token",
                        value,
                        &token.to_string(),
                    ],
                )
                .await
                .expect("EVAL");
            reply == fredlock_testkit::RespValue::Integer(1)
        }
    };
    assert!(write(token_b, "from B").await, "B's write is accepted");
    assert!(
        !write(token_a, "from A").await,
        "A's stale write is rejected"
    );
    assert_eq!(
        nodes.get(0, "data").await.expect("GET").as_deref(),
        Some("from B")
    );
    drop(a);
    b.release().await.expect("release");
}

/// Write `ARGV[1]` to `KEYS[1]` only if the token `ARGV[2]` is higher than the last one seen
/// (kept in `KEYS[2]`). Reply 1 written, 0 rejected.
const FENCED_WRITE: &str = "local last = tonumber(redis.call('GET', KEYS[2]) or '0') \
    if tonumber(ARGV[2]) <= last then return 0 end \
    redis.call('SET', KEYS[2], ARGV[2]) redis.call('SET', KEYS[1], ARGV[1]) return 1";

/// The documented limit, shown: the token t is written back to nodes {0, 1} only (node 2
/// down: it never sees t, not even late); node 0 restarts EMPTY; node 1 freezes; the next
/// grant's majority {0, 2} has never seen t, and the token repeats. Hence: counters need
/// `appendfsync always`, or a node that lost its data must stay out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarting_empty_can_repeat_a_token() {
    // A node timeout far above a loaded machine's delays: a write-back that timed out on one
    // node of {0, 2} would fail that grant and leave the other node's counter raised, so the
    // next grant would go higher and not show the repeat.
    let tweak = |b: fredlock::Builder| b.fencing_tokens(true).node_timeout(Duration::from_secs(2));
    let (mut nodes, first_client) = local_with(3, tweak).await;
    let r = unique("repeat");
    nodes.kill(2).expect("kill");
    let first = first_client
        .acquire(r.as_str(), TTL)
        .await
        .expect("on {0, 1}");
    let t = first.fencing_token().expect("token");
    first.release().await.expect("release");
    // Node 2 must never see t: the write-back still waiting for it (every write-back is
    // finished, even late) goes with this client's connections.
    first_client.close().await;
    drop(first_client);
    nodes.start_node(2).await.expect("start");
    let redlock = common::build(nodes.urls(), tweak).await;
    nodes.restart(0).await.expect("restart empty");
    nodes.pause(1).expect("pause");
    // Node 0 reconnects after its restart; the first grant on {0, 2} carries the token.
    let mut repeated = None;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while repeated.is_none() && tokio::time::Instant::now() < until {
        match redlock.try_acquire(r.as_str(), TTL).await {
            Ok(Some(lock)) => {
                repeated = lock.fencing_token();
                let _ = lock.release().await;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    nodes.resume(1).expect("resume");
    assert_eq!(
        repeated,
        Some(t),
        "the token did not repeat: the scenario is not what it claims"
    );
}

/// Where most users hold locks (`with_lock`'s handle, a `KeepAlive`) the fencing token is
/// there too, the same as the lock's and rising across holders; `None` without fencing.
/// Before, `LockHandle` and `KeepAlive` had no fencing token at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_and_guards_carry_the_fencing_token() {
    let (_nodes, redlock) = fenced(3).await;
    let r = unique("handles");
    let mut last = Rising::default();
    for holder in 0..3 {
        let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
        let token = lock.fencing_token();
        let guard = lock.keep_alive();
        assert_eq!(guard.fencing_token(), token);
        assert_eq!(guard.handle().fencing_token(), token);
        assert_eq!(guard.fencing_tokens().map(<[u64]>::len), Some(1));
        last.next(guard.fencing_token(), holder);
        guard.release().await.expect("release");
    }
    for holder in 3..6 {
        let seen = redlock
            .with_lock(
                r.as_str(),
                TTL,
                |handle| async move { handle.fencing_token() },
            )
            .await
            .expect("with_lock");
        last.next(seen, holder);
    }
    let (_n2, plain) = local_with(3, |b| b).await;
    let seen = plain
        .with_lock(
            r.as_str(),
            TTL,
            |handle| async move { handle.fencing_token() },
        )
        .await
        .expect("with_lock");
    assert_eq!(seen, None);
}

/// Node 2 answers late (paused) and its script cache is empty: the token's write-back is decided
/// by nodes 0 and 1, and node 2's, answered `NOSCRIPT` after that, must still be resent there
/// (else its counter stays behind the token handed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_node_without_the_script_still_raises_its_counter() {
    // A node timeout far above the pause: node 2's write-back must be late, never timed out.
    let (nodes, redlock) = local_with(3, |b| {
        b.fencing_tokens(true).node_timeout(Duration::from_secs(5))
    })
    .await;
    let r = unique("fence-noscript");
    let key = redlock.fence_key(&r);
    // A first holder puts the counters on every node.
    let first = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    first.release().await.expect("release");
    for i in 0..3 {
        nodes.script_flush(i).await.expect("SCRIPT FLUSH");
    }
    nodes.client_pause(2, 200).await.expect("CLIENT PAUSE");
    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    let token = lock.fencing_token().expect("token").to_string();
    let raised = eventually(Duration::from_secs(10), || async {
        nodes.get(2, &key).await.expect("GET").as_deref() == Some(token.as_str())
    })
    .await;
    assert!(
        raised,
        "node 2's counter {:?}, the token {token}: the late NOSCRIPT was never resent",
        nodes.get(2, &key).await.expect("GET")
    );
    lock.release().await.expect("release");
}
