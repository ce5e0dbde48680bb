//! Locks without Lua, against real servers: an ACL user without scripting
//! (`+@all -@scripting`) on Valkey 9 takes, extends, keeps alive, inspects and releases plain
//! locks through `DELIFEQ` and `SET ... IFEQ`; what needs scripts fails at once with a typed
//! error naming the node, the server's NOPERM words and the fix; on Redis 7.0 (no `DELIFEQ`)
//! such a user is never granted a lock (its keys could be neither released nor extended).
//! Also: a release on a node that may run scripts is sent with EVALSHA, not the whole script.

mod common;

use std::time::Duration;

use common::eventually;
use fredlock::{AcquireOptions, Error, LostReason, NodeErrorKind, Redlock, Retry};
use fredlock_testkit::{LocalNodes, RespValue, Server};

const PASSWORD: &str = "app-secret-1";
const TTL: Duration = Duration::from_secs(10);
/// A retry budget of about 30 s: an error "at once" comes long before it runs out.
const SLOW_RETRY: Retry = Retry {
    attempts: 60,
    delay: Duration::from_millis(500),
    jitter: Duration::ZERO,
};
/// Far below [`SLOW_RETRY`]'s budget, far above a few round trips.
const AT_ONCE: Duration = Duration::from_secs(10);

/// `app`, allowed everything but scripts, on every node.
async fn user_without_scripts(nodes: &LocalNodes, range: std::ops::Range<usize>) {
    let password = format!(">{PASSWORD}");
    for i in range {
        let args = [
            "ACL",
            "SETUSER",
            "app",
            "on",
            &password,
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ];
        let reply = nodes.command(i, &args).await.expect("ACL SETUSER");
        assert!(format!("{reply:?}").contains("OK"), "{reply:?}");
    }
}

fn app_urls(nodes: &LocalNodes) -> Vec<String> {
    (0..nodes.len())
        .map(|i| format!("redis://app:{PASSWORD}@127.0.0.1:{}", nodes.port(i)))
        .collect()
}

async fn build(urls: Vec<String>, retry: Retry) -> Result<Redlock, Error> {
    Redlock::builder()
        .nodes(urls)
        .retry(retry)
        .require_quorum(true)
        .build()
        .await
}

async fn exists(nodes: &LocalNodes, i: usize, key: &str) -> bool {
    match nodes.command(i, &["EXISTS", key]).await.expect("EXISTS") {
        RespValue::Integer(n) => n == 1,
        other => panic!("EXISTS answered {other:?}"),
    }
}

async fn pttl(nodes: &LocalNodes, i: usize, key: &str) -> i64 {
    match nodes.command(i, &["PTTL", key]).await.expect("PTTL") {
        RespValue::Integer(n) => n,
        other => panic!("PTTL answered {other:?}"),
    }
}

/// Every plain-lock operation works for a user without scripting on Valkey 9, and leaves no
/// key behind. (Before: the lock was granted, then extend and release failed with NOPERM.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_plain_locks_work_without_scripts() {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey nodes");
    user_without_scripts(&nodes, 0..3).await;
    let redlock = build(app_urls(&nodes), Retry::default())
        .await
        .expect("build");
    let key = redlock.key("plain");

    let mut lock = redlock.acquire("plain", TTL).await.expect("acquire");
    let seen = redlock.inspect("plain").await.expect("inspect");
    assert!(
        seen.holder().is_some_and(|h| h.has_token(lock.token())),
        "{seen:?}"
    );
    lock.extend(Duration::from_secs(60)).await.expect("extend");
    // The extension returns at a quorum: the last node's may land a moment later.
    for i in 0..3 {
        let extended = eventually(Duration::from_secs(5), || async {
            pttl(&nodes, i, &key).await > 30_000
        });
        assert!(extended.await, "node {i} not extended");
    }
    assert!(redlock
        .try_acquire("plain", TTL)
        .await
        .expect("try_acquire")
        .is_none());
    lock.release().await.expect("release");
    let lock = redlock
        .try_acquire("plain", TTL)
        .await
        .expect("try_acquire")
        .expect("free");
    lock.release().await.expect("release");

    // Kept alive through several extensions, then released.
    let lock = redlock
        .acquire("alive", Duration::from_millis(900))
        .await
        .expect("acquire");
    let alive = lock.keep_alive();
    let handle = alive.handle();
    while handle.extensions() < 3 {
        handle.changed().await.expect("kept alive");
    }
    alive.release().await.expect("release kept-alive");
    let out = redlock
        .with_lock("work", TTL, |h| async move { h.resources().to_vec() })
        .await
        .expect("with_lock");
    assert_eq!(out, vec!["work".to_string()]);
    assert!(redlock.inspect("plain").await.expect("inspect").is_free());
    let keys: Vec<String> = ["plain", "alive", "work"].map(|n| redlock.key(n)).into();
    // Closing waits for the releases a decided round did not wait for.
    redlock.close().await;
    for key in keys {
        for i in 0..3 {
            assert!(!exists(&nodes, i, &key).await, "{key} left on node {i}");
        }
    }
}

/// The native extension never re-creates a key that is gone (SET IFEQ on a missing key sets
/// nothing), and never touches another holder's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_native_extend_never_revives_nor_steals() {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey nodes");
    user_without_scripts(&nodes, 0..3).await;
    let redlock = build(app_urls(&nodes), Retry::once()).await.expect("build");
    let key = redlock.key("gone");
    let mut lock = redlock.acquire("gone", TTL).await.expect("acquire");
    // The acquire returns at a quorum: let the last node's SET land before deleting behind it.
    let everywhere = eventually(Duration::from_secs(5), || async {
        exists(&nodes, 0, &key).await
            && exists(&nodes, 1, &key).await
            && exists(&nodes, 2, &key).await
    });
    assert!(everywhere.await, "the lock's key never reached every node");
    nodes.command(0, &["DEL", &key]).await.expect("DEL");
    nodes.command(1, &["DEL", &key]).await.expect("DEL");
    nodes
        .command(2, &["SET", &key, "someone-else", "PX", "5000"])
        .await
        .expect("SET");
    let err = lock.extend(TTL).await.expect_err("not ours any more");
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    assert!(!exists(&nodes, 0, &key).await && !exists(&nodes, 1, &key).await);
    assert!(
        pttl(&nodes, 2, &key).await <= 5_000,
        "another holder's TTL changed"
    );
    let err = lock.release().await.expect_err("not ours");
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    let other = nodes.command(2, &["GET", &key]).await.expect("GET");
    assert_eq!(other, RespValue::Bulk(Some(b"someone-else".to_vec())));
    redlock.close().await;
}

/// A batched keep-alive without scripts: each node extends a batch with one pipeline of
/// `SET ... IFEQ`, answered per lock. A lock taken over on two nodes is lost (`TokenGone`), one
/// whose key became a list on two nodes (WRONGTYPE) is lost when its deadline passes, and the
/// other locks of the same batches stay held and extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_batched_keep_alive_without_scripts_answers_each_lock() {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey nodes");
    user_without_scripts(&nodes, 0..3).await;
    let redlock = build(app_urls(&nodes), Retry::default())
        .await
        .expect("build");
    let ttl = Duration::from_secs(2);
    let names: Vec<String> = (0..40).map(|i| format!("batch:{i}")).collect();
    let acquired =
        futures::future::join_all(names.iter().map(|n| redlock.acquire(n.as_str(), ttl)));
    let locks: Vec<_> = acquired
        .await
        .into_iter()
        .map(|l| l.expect("acquire"))
        .collect();
    let (taken, wrong) = (7, 23);
    // An acquire returns at a quorum: its third node's SET may still be on its way, and landing
    // after the DEL below it would give the lock back its quorum (seen once: a hang in
    // `lost()`). Both keys on every node first.
    for name in [&names[taken], &names[wrong]] {
        let key = redlock.key(name);
        let everywhere = eventually(Duration::from_secs(10), || async {
            exists(&nodes, 0, &key).await
                && exists(&nodes, 1, &key).await
                && exists(&nodes, 2, &key).await
        });
        assert!(everywhere.await, "{key} was not set on every node");
    }
    for i in [0, 1] {
        let key = redlock.key(&names[taken]);
        let reply = nodes
            .command(i, &["SET", &key, "someone-else"])
            .await
            .expect("SET");
        assert!(format!("{reply:?}").contains("OK"), "SET: {reply:?}");
        let key = redlock.key(&names[wrong]);
        nodes.command(i, &["DEL", &key]).await.expect("DEL");
        let reply = nodes
            .command(i, &["RPUSH", &key, "not-a-lock"])
            .await
            .expect("RPUSH");
        assert_eq!(reply, RespValue::Integer(1), "RPUSH on node {i}");
    }
    let guards: Vec<_> = locks.into_iter().map(|l| l.keep_alive()).collect();
    // Bounded, so that a lock that stays held fails the test instead of hanging it.
    let bound = Duration::from_secs(30);
    let lost = |i: usize| tokio::time::timeout(bound, guards[i].lost());
    assert_eq!(
        lost(taken).await.expect("taken lost"),
        LostReason::TokenGone
    );
    assert_eq!(lost(wrong).await.expect("wrong lost"), LostReason::Expired);
    for (i, g) in guards.iter().enumerate() {
        if i == taken || i == wrong {
            continue;
        }
        let handle = g.handle();
        while handle.extensions() < 3 {
            tokio::time::timeout(bound, handle.changed())
                .await
                .expect("extended within the bound")
                .expect("kept alive");
        }
    }
    for (i, g) in guards.into_iter().enumerate() {
        let released = g.release().await;
        assert_eq!(released.is_ok(), i != taken && i != wrong, "lock {i}");
    }
    redlock.close().await;
}

/// Healing without Lua: after `SET ... IFEQ` answered nil on a node that lost the key, and the
/// extension won on the others, that node gets `SET NX` and holds our token again; a node
/// holding another value keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_without_scripts_heals_a_node_that_lost_the_key() {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey nodes");
    user_without_scripts(&nodes, 0..3).await;
    let redlock = build(app_urls(&nodes), Retry::once()).await.expect("build");
    let key = redlock.key("heal");
    let mut lock = redlock.acquire("heal", TTL).await.expect("acquire");
    let ours = RespValue::Bulk(Some(lock.value().as_bytes().to_vec()));
    nodes.command(2, &["DEL", &key]).await.expect("DEL");
    lock.extend(TTL).await.expect("nodes 0 and 1 hold it");
    let mut healed = false;
    for _ in 0..250 {
        if nodes.command(2, &["GET", &key]).await.expect("GET") == ours {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(healed, "node 2 never got the key back");

    nodes
        .command(2, &["SET", &key, "someone-else", "PX", "30000"])
        .await
        .expect("SET");
    lock.extend(TTL).await.expect("nodes 0 and 1 hold it");
    lock.release().await.expect("release");
    let other = nodes.command(2, &["GET", &key]).await.expect("GET");
    assert_eq!(other, RespValue::Bulk(Some(b"someone-else".to_vec())));
    assert!(pttl(&nodes, 2, &key).await > 20_000, "its TTL was touched");
    redlock.close().await;
}

/// What needs scripts fails at once, typed, with the node, the server's words and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_what_needs_scripts_fails_at_once() {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey nodes");
    user_without_scripts(&nodes, 0..3).await;
    let redlock = build(app_urls(&nodes), SLOW_RETRY).await.expect("build");
    let check = |what: &str, result: Result<(), Error>| {
        let err = result.expect_err(what);
        let shown = err.to_string();
        assert!(matches!(err, Error::NotPermitted { .. }), "{what}: {err:?}");
        if let Error::NotPermitted { failures, .. } = &err {
            assert_eq!(failures.len(), 3, "{what}: {shown}");
            assert!(failures.iter().all(|f| f.kind == NodeErrorKind::Permission));
        }
        assert!(
            shown.contains(&nodes.port(0).to_string()),
            "{what}: {shown}"
        );
        assert!(shown.contains("NOPERM"), "{what}: {shown}");
        assert!(shown.contains("+@scripting"), "{what}: {shown}");
        assert!(!shown.contains("reachable"), "{what}: {shown}");
    };
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let r = tokio::time::timeout(AT_ONCE, sem.acquire(TTL)).await;
    check("semaphore", r.expect("at once").map(drop));
    let r = tokio::time::timeout(AT_ONCE, redlock.acquire(["a", "b"], TTL)).await;
    check("two resources", r.expect("at once").map(drop));
    let rw = redlock.rwlock("doc").expect("rwlock");
    let r = tokio::time::timeout(AT_ONCE, rw.read(TTL)).await;
    check("read lock", r.expect("at once").map(drop));
    redlock.close().await;

    let fenced = Redlock::builder()
        .nodes(app_urls(&nodes))
        .retry(SLOW_RETRY)
        .fencing_tokens(true)
        .build()
        .await
        .expect("build");
    let r = tokio::time::timeout(AT_ONCE, fenced.acquire("f", TTL)).await;
    check("fencing", r.expect("at once").map(drop));
    fenced.close().await;
    // Nothing was left behind (the admin user set nothing either).
    for i in 0..3 {
        let keys = nodes.command(i, &["KEYS", "*"]).await.expect("KEYS");
        assert_eq!(keys, RespValue::Array(Some(Vec::new())), "node {i}");
    }
}

/// Redis 7.0 has no DELIFEQ: a user without scripts could set a key it can never release, so
/// `build()` says so when no quorum is left, and a node in that state is never sent a SET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis7_without_scripts_never_grants() {
    let nodes = LocalNodes::start_on(Server::Redis, 3)
        .await
        .expect("redis nodes");
    user_without_scripts(&nodes, 0..3).await;
    let err = build(app_urls(&nodes), Retry::once())
        .await
        .expect_err("no node can release a lock");
    let shown = err.to_string();
    assert!(matches!(err, Error::NotPermitted { .. }), "{err:?}");
    assert!(shown.contains("NOPERM"), "{shown}");
    assert!(shown.contains("has no DELIFEQ"), "{shown}");
    assert!(shown.contains("Redis 7."), "{shown}");
    assert!(shown.contains("grant +@scripting, or use Valkey >= 9.0 / Redis >= 8.4"));
    assert!(shown.contains(&nodes.port(2).to_string()), "{shown}");

    // One such node of three: locks are granted by the two others; nothing is set on it.
    let nodes = LocalNodes::start_on(Server::Redis, 3)
        .await
        .expect("redis nodes");
    user_without_scripts(&nodes, 0..3).await;
    let mut urls = nodes.urls();
    urls[0] = app_urls(&nodes)[0].clone();
    let redlock = build(urls, Retry::once()).await.expect("build");
    let key = redlock.key("one-bad");
    let mut lock = redlock
        .acquire_using("one-bad", TTL, &AcquireOptions::new())
        .await
        .expect("two nodes grant");
    assert!(
        !exists(&nodes, 0, &key).await,
        "SET sent to a node that cannot release"
    );
    lock.extend(TTL).await.expect("extend on two");
    lock.release().await.expect("release on two");
    for i in 0..3 {
        assert!(!exists(&nodes, i, &key).await, "key left on {i}");
    }
    redlock.close().await;
}

fn eval_calls(stats: &RespValue, name: &str) -> u64 {
    let RespValue::Bulk(Some(text)) = stats else {
        panic!("INFO answered {stats:?}");
    };
    let text = String::from_utf8_lossy(text);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

/// Where scripts are used, releases go by EVALSHA: the whole script is sent once per script
/// cache (the first NOSCRIPT, and after a SCRIPT FLUSH), not on every release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_releases_by_evalsha() {
    let nodes = LocalNodes::start_on(Server::Redis, 3)
        .await
        .expect("redis nodes");
    let redlock = build(nodes.urls(), Retry::once()).await.expect("build");
    // The gate node of the resource's wait line takes its line scripts (EVAL) instead.
    let gate = redlock.line_node("sha");
    let key = redlock.key("sha");
    for i in 0..20 {
        if i == 10 {
            for n in 0..3 {
                nodes.command(n, &["SCRIPT", "FLUSH"]).await.expect("flush");
            }
        }
        let lock = redlock.acquire("sha", TTL).await.expect("acquire");
        lock.release().await.expect("release");
        // A release returns at its quorum: the last node's may still be on its way. Each cycle
        // waits until every node's landed, so that a node slowed by a busy machine does not get
        // several cycles' releases at once, sent before the first's answer marked the script
        // cached (they would go by EVAL, or share a batched call).
        for n in 0..3 {
            let gone = eventually(Duration::from_secs(5), || async {
                !exists(&nodes, n, &key).await
            });
            assert!(gone.await, "cycle {i}: the key stayed on node {n}");
        }
    }
    redlock.close().await;
    for n in (0..3).filter(|&n| Some(n) != gate) {
        let stats = nodes
            .command(n, &["INFO", "commandstats"])
            .await
            .expect("INFO");
        let (eval, sha) = (eval_calls(&stats, "eval"), eval_calls(&stats, "evalsha"));
        // EVAL: the first release and the one after the flush (whose EVALSHA met NOSCRIPT),
        // with room for a release sent in the instant between the server's run of an EVAL and
        // this process reading its answer; the old code sent all 20 with EVAL and none by
        // EVALSHA.
        assert!(eval <= 4, "node {n}: {eval} EVAL, {sha} EVALSHA");
        assert!(sha >= 15, "node {n}: {eval} EVAL, {sha} EVALSHA");
        assert!(!exists(&nodes, n, &key).await);
    }
}
