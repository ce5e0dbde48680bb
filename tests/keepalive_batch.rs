//! The batched keep-alive: the Redlock's shared renewer extends the locks due together with one
//! script call per node, and every lock is still decided on its own. Faults that hit a batch
//! must hit only the locks they concern: a connection reset in the middle of a batch, one lock
//! of a batch taken over or holding a key of the wrong type, a release racing a batch, scripts
//! flushed; budgets stay per lock; a renewer that dies publishes "lost" first and is replaced.

mod common;

use std::time::Duration;

use common::*;
use fredlock::{KeepAlive, KeepAliveOptions, LostReason, Redlock};
use fredlock_testkit::{Fault, LocalCluster, LocalNodes, RespValue};
use futures::StreamExt;

/// Acquires `names` (64 at a time) for `ttl` and keeps each alive with `options`.
async fn keep_all(
    redlock: &Redlock,
    names: &[String],
    ttl: Duration,
    options: KeepAliveOptions,
) -> Vec<KeepAlive> {
    let acquired: Vec<_> = futures::stream::iter(names.iter().map(|n| {
        let redlock = redlock.clone();
        let n = n.clone();
        async move { redlock.acquire(n.as_str(), ttl).await }
    }))
    .buffered(64)
    .collect()
    .await;
    acquired
        .into_iter()
        .map(|l| {
            l.expect("acquire")
                .keep_alive_with(options.clone())
                .expect("options")
        })
        .collect()
}

/// Waits until every node holds the key of each of `names`: an acquire returns at a quorum,
/// and its last node's `SET` landing after a test's `DEL` there would give the lock its quorum
/// back (a lost() that never fires).
async fn on_every_node(nodes: &LocalNodes, redlock: &Redlock, names: &[String]) {
    for name in names {
        let key = redlock.key(name);
        let everywhere = eventually(Duration::from_secs(10), || async {
            for i in 0..nodes.len() {
                let reply = nodes.command(i, &["EXISTS", &key]).await.expect("EXISTS");
                if reply != RespValue::Integer(1) {
                    return false;
                }
            }
            true
        });
        assert!(everywhere.await, "{key} never reached every node");
    }
}

/// `lost()`, bounded: a lock that stays held fails the test instead of hanging it.
async fn lost_within(guard: &KeepAlive, bound: Duration) -> LostReason {
    tokio::time::timeout(bound, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{:?} not lost within {bound:?}", guard.resources()))
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    let prefix = unique(prefix);
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// Waits until every guard was extended at least `n` times; panics on a lost one.
async fn extended_at_least(guards: &[&KeepAlive], n: u32, within: Duration) {
    let ok = eventually(within, || async {
        for g in guards {
            assert!(!g.is_lost(), "a lock was lost: {:?}", g.resources());
        }
        guards.iter().all(|g| g.extensions() >= n)
    })
    .await;
    let least = guards.iter().map(|g| g.extensions()).min();
    assert!(
        ok,
        "not every lock extended {n} times in {within:?} (least: {least:?})"
    );
}

async fn release_all(guards: Vec<KeepAlive>) {
    for g in guards {
        g.release().await.expect("still held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_due_together_share_one_call_per_node() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(1500);
    let guards = keep_all(
        &redlock,
        &names("share", 300),
        ttl,
        KeepAliveOptions::default(),
    )
    .await;
    let before = script_calls(&nodes, 0).await;
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    extended_at_least(&refs, 3, ttl * 6).await;
    let calls = script_calls(&nodes, 0).await - before;
    let extensions: u32 = guards.iter().map(|g| g.extensions()).sum();
    println!("{extensions} extensions in {calls} script calls on node 0");
    // Per lock, that would be one call per extension; batches carry up to 128 locks, and locks
    // acquired within ttl / 20 of each other share them.
    assert!(
        calls * 20 <= u64::from(extensions),
        "{calls} calls for {extensions} extensions"
    );
    release_all(guards).await;
}

/// The calls node `i` served that could carry an extension: `SET` (Valkey's native
/// `SET ... IFEQ`) and the scripts (`EVALSHA`, `EVAL`). (Not every command: the server also
/// counts the `GET`s and `PEXPIRE`s a script runs inside.)
async fn extension_calls(nodes: &LocalNodes, i: usize) -> u64 {
    command_calls(nodes, i, "set").await + script_calls(nodes, i).await
}

/// Whatever the server, a batch renewal is one call per node, not one command per lock: on
/// Valkey too, whose `SET ... IFEQ` could extend each lock natively where scripts may run (one
/// command per lock and node: 30,000 a round for 10,000 locks, which on a busy machine timed
/// out and lost locks). Counted on each node while every lock was extended three more times,
/// after the acquires' last commands landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_is_one_call_per_node_on_every_server() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(1500);
    let guards = keep_all(
        &redlock,
        &names("calls", 300),
        ttl,
        KeepAliveOptions::default(),
    )
    .await;
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    let extensions = || {
        guards
            .iter()
            .map(|g| u64::from(g.extensions()))
            .sum::<u64>()
    };
    extended_at_least(&refs, 1, ttl * 6).await;
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(extension_calls(&nodes, i).await);
    }
    let first = extensions();
    let least = guards.iter().map(|g| g.extensions()).min().unwrap_or(0);
    extended_at_least(&refs, least + 3, ttl * 8).await;
    let extended = extensions() - first;
    for (i, before) in before.into_iter().enumerate() {
        let calls = extension_calls(&nodes, i).await - before;
        println!("node {i}: {calls} calls for {extended} extensions");
        // Batches carry up to 128 locks; locks due within ttl / 20 of each other share them.
        assert!(
            calls * 10 <= extended,
            "node {i}: {calls} calls for {extended} extensions"
        );
    }
    release_all(guards).await;
}

/// A batch in flight on one node is cut by a connection reset. The locks a quorum still holds
/// stay held (those the other two nodes hold at once, those that need the reset node once it is
/// back); the locks whose token is gone from a majority are lost, with `TokenGone`, and only they.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_by_a_reset_loses_only_the_locks_a_quorum_lost() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, redlock) =
        behind_proxies(&nodes, |b| b.node_timeout(Duration::from_millis(500))).await;
    let ttl = Duration::from_secs(3);
    let all = names("reset", 36);
    let guards = keep_all(&redlock, &all, ttl, KeepAliveOptions::default()).await;
    on_every_node(&nodes, &redlock, &all).await;
    // Thirds: intact; gone from node 1 only (nodes 0 and 2 still a quorum, but node 0 is
    // needed); gone from nodes 1 and 2 (a majority lost it).
    for (i, r) in all.iter().enumerate() {
        let key = redlock.key(r);
        match i % 3 {
            1 => {
                nodes.command(1, &["DEL", &key]).await.expect("DEL");
            }
            2 => {
                nodes.command(1, &["DEL", &key]).await.expect("DEL");
                nodes.command(2, &["DEL", &key]).await.expect("DEL");
            }
            _ => {}
        }
    }
    // Node 0 answers 300 ms late, so a batch is in flight there for that long; the reset comes
    // 100 ms after the first renewal is due (a batch starts at most ttl / 20 = 150 ms early).
    proxies[0].set(Fault::Latency(Duration::from_millis(300)));
    let due = guards[0].deadline() - ttl / 3;
    tokio::time::sleep_until(due + Duration::from_millis(100)).await;
    proxies[0].set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxies[0].set(Fault::Pass);
    let lost: Vec<&KeepAlive> = guards.iter().skip(2).step_by(3).collect();
    let kept: Vec<&KeepAlive> = guards
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 2)
        .map(|(_, g)| g)
        .collect();
    for g in &lost {
        let reason = lost_within(g, Duration::from_secs(30)).await;
        assert_eq!(reason, LostReason::TokenGone, "{:?}", g.resources());
    }
    extended_at_least(&kept, 3, ttl * 4).await;
    for (i, g) in guards.into_iter().enumerate() {
        match i % 3 {
            2 => assert!(g.release().await.is_err(), "lost, not released"),
            _ => {
                g.release().await.expect("still held");
            }
        }
    }
}

/// One lock of a batch is taken over (a foreign value on two nodes of three) and another's key
/// is replaced by a list on two nodes (WRONGTYPE inside the batch script): each is lost alone,
/// and the other locks of the same batches stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_lock_in_a_batch_is_lost_alone() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(1200);
    let all = names("alone", 40);
    let guards = keep_all(&redlock, &all, ttl, KeepAliveOptions::default()).await;
    let (taken, wrong) = (7, 23);
    on_every_node(&nodes, &redlock, &[all[taken].clone(), all[wrong].clone()]).await;
    for i in [0, 1] {
        let key = redlock.key(&all[taken]);
        nodes.set(i, &key, "someone-else").await.expect("SET");
        let key = redlock.key(&all[wrong]);
        nodes.command(i, &["DEL", &key]).await.expect("DEL");
        let reply = nodes
            .command(i, &["RPUSH", &key, "not-a-lock"])
            .await
            .expect("RPUSH");
        assert_eq!(reply, RespValue::Integer(1), "RPUSH on node {i}");
    }
    let before = script_calls(&nodes, 2).await;
    let bound = Duration::from_secs(30);
    assert_eq!(
        lost_within(&guards[taken], bound).await,
        LostReason::TokenGone
    );
    // Failed on two nodes: no quorum, retried until the deadline, then lost.
    assert_eq!(
        lost_within(&guards[wrong], bound).await,
        LostReason::Expired
    );
    let others: Vec<&KeepAlive> = guards
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != taken && *i != wrong)
        .map(|(_, g)| g)
        .collect();
    extended_at_least(&others, 3, ttl * 5).await;
    // They shared batches with the bad locks: a few calls, not one per lock and round.
    let calls = script_calls(&nodes, 2).await - before;
    assert!(calls < 40, "{calls} script calls on node 2");
    for (i, g) in guards.into_iter().enumerate() {
        let released = g.release().await;
        assert_eq!(released.is_ok(), i != taken && i != wrong, "lock {i}");
    }
}

/// Releases racing batches in flight (every reply 40 ms late, renewals every ttl / 10): the
/// released locks leave no key, no extension is counted for them after the release, and the
/// locks of the same batches that were not released stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_racing_a_batch_leave_nothing_and_spare_the_rest() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, redlock) =
        behind_proxies(&nodes, |b| b.node_timeout(Duration::from_millis(500))).await;
    for p in &proxies {
        p.set(Fault::Latency(Duration::from_millis(40)));
    }
    let ttl = Duration::from_secs(2);
    let all = names("race", 30);
    let options = KeepAliveOptions::default().renew_when_left(0.99);
    let mut guards = keep_all(&redlock, &all, ttl, options).await;
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    extended_at_least(&refs, 3, ttl * 3).await;
    let released: Vec<KeepAlive> = guards.drain(..15).collect();
    let handles: Vec<_> = released.iter().map(|g| g.handle()).collect();
    let keys: Vec<String> = released
        .iter()
        .map(|g| redlock.key(&g.resources()[0]))
        .collect();
    let results = futures::future::join_all(released.into_iter().map(|g| g.release())).await;
    for r in results {
        r.expect("release");
    }
    let counts: Vec<u32> = handles.iter().map(|h| h.extensions()).collect();
    let gone = eventually(Duration::from_secs(2), || async {
        for key in &keys {
            for i in 0..3 {
                if nodes.get(i, key).await.expect("GET").is_some() {
                    return false;
                }
            }
        }
        true
    })
    .await;
    assert!(gone, "a released key is still there");
    tokio::time::sleep(Duration::from_millis(300)).await; // longer than any reply in flight
    for key in &keys {
        for i in 0..3 {
            assert_eq!(
                nodes.get(i, key).await.expect("GET"),
                None,
                "{key} came back"
            );
        }
    }
    for (h, before) in handles.iter().zip(counts) {
        assert_eq!(
            common::bounded("lost()", h.lost()).await,
            LostReason::Released
        );
        assert_eq!(h.extensions(), before, "an extension counted after release");
    }
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    let floor = refs.iter().map(|g| g.extensions()).max().unwrap_or(0) + 3;
    extended_at_least(&refs, floor, ttl * 3).await;
    release_all(guards).await;
}

/// `SCRIPT FLUSH` on every node while locks are kept alive: the batch is resent with EVAL on
/// NOSCRIPT, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_resent() {
    let (nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(800);
    let guards = keep_all(
        &redlock,
        &names("flush", 50),
        ttl,
        KeepAliveOptions::default(),
    )
    .await;
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    extended_at_least(&refs, 1, ttl * 3).await;
    for i in 0..3 {
        nodes.script_flush(i).await.expect("SCRIPT FLUSH");
    }
    let floor = refs.iter().map(|g| g.extensions()).max().unwrap_or(0) + 3;
    extended_at_least(&refs, floor, ttl * 6).await;
    release_all(guards).await;
}

/// Locks acquired together with different budgets and TTLs share the renewer: each keeps its
/// own budget, and locks of another TTL go in their own script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lock_of_a_batch_keeps_its_own_budget() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(400);
    let plain = KeepAliveOptions::default();
    let once = KeepAliveOptions::default().max_extensions(1);
    let budget = KeepAliveOptions::default().max_hold(ttl * 5 / 2);
    let longer = KeepAliveOptions::default().ttl(ttl * 2);
    let mut guards = Vec::new();
    let mut acquired_at = Vec::new();
    for (i, options) in [&plain, &once, &budget, &longer]
        .into_iter()
        .cycle()
        .take(16)
        .enumerate()
    {
        let (g, at) = kept_alive(
            &redlock,
            &format!("{}:{i}", unique("budgets")),
            ttl,
            options.clone(),
        )
        .await;
        guards.push(g);
        acquired_at.push(at);
    }
    tokio::time::sleep(ttl * 5).await;
    for (i, g) in guards.iter().enumerate() {
        match i % 4 {
            0 | 3 => {
                assert!(!g.is_lost(), "lock {i} lost");
                assert!(g.extensions() >= 3, "lock {i}: {}", g.extensions());
            }
            1 => {
                assert_eq!(
                    common::bounded("lost()", g.lost()).await,
                    LostReason::BudgetExhausted
                );
                assert_eq!(g.extensions(), 1);
            }
            _ => {
                assert_eq!(
                    common::bounded("lost()", g.lost()).await,
                    LostReason::BudgetExhausted
                );
                assert!(g.deadline() <= acquired_at[i] + ttl * 5 / 2);
            }
        }
    }
    for (i, g) in guards.into_iter().enumerate() {
        let released = g.release().await;
        assert_eq!(released.is_ok(), i % 4 == 0 || i % 4 == 3, "lock {i}");
    }
}

/// The renewer lives in the runtime of the first keep-alive. When that runtime shuts down,
/// every lock it renewed is marked lost before its keys can go; a keep-alive started later (on
/// the runtime the Redlock's connections live on) gets a fresh renewer that works.
#[test]
fn a_renewer_that_dies_marks_all_its_locks_lost_and_is_replaced() {
    let main = tokio::runtime::Runtime::new().expect("rt");
    let (_nodes, redlock) = main.block_on(local_with(3, |b| b));
    let short_lived = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let handles = short_lived.block_on(async {
        let guards = keep_all(
            &redlock,
            &names("dies", 20),
            Duration::from_secs(30),
            KeepAliveOptions::default(),
        )
        .await;
        let handles: Vec<_> = guards.iter().map(|g| g.handle()).collect();
        // Leaked on purpose: only the renewer's end can publish anything.
        std::mem::forget(guards);
        handles
    });
    assert!(handles.iter().all(|h| !h.is_lost()));
    drop(short_lived); // drops the renewer mid-sleep
    assert!(
        handles.iter().all(|h| h.is_lost()),
        "a handle still says held"
    );
    main.block_on(async {
        for h in &handles {
            assert_eq!(
                common::bounded("lost()", h.lost()).await,
                LostReason::TaskEnded
            );
        }
        let ttl = Duration::from_millis(400);
        let guards = keep_all(
            &redlock,
            &names("again", 10),
            ttl,
            KeepAliveOptions::default(),
        )
        .await;
        let refs: Vec<&KeepAlive> = guards.iter().collect();
        extended_at_least(&refs, 2, ttl * 5).await;
        release_all(guards).await;
    });
}

/// `batched(false)`: a task per lock, the path before batching, still keeps locks alive and
/// releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_can_keep_a_task_of_its_own() {
    let (_nodes, redlock) = local_with(3, |b| b).await;
    let ttl = Duration::from_millis(300);
    let options = KeepAliveOptions::default().batched(false);
    let guards = keep_all(&redlock, &names("alone-task", 5), ttl, options).await;
    let refs: Vec<&KeepAlive> = guards.iter().collect();
    extended_at_least(&refs, 3, ttl * 5).await;
    release_all(guards).await;
}

/// Every node a 3-shard Redis Cluster: a batch splits per hash slot (and a lock across slots is
/// granted only when every slot granted); a lock taken over on two clusters is lost alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_cluster_nodes_split_per_slot() {
    let clusters: Vec<LocalCluster> =
        futures::future::join_all((0..3).map(|_| LocalCluster::start(3)))
            .await
            .into_iter()
            .map(|c| c.expect("a local cluster"))
            .collect();
    let urls: Vec<String> = clusters.iter().map(LocalCluster::url).collect();
    let redlock = build(urls, |b| b.connect_wait(Duration::from_secs(20))).await;
    let up = eventually(Duration::from_secs(20), || async {
        let seen = redlock.inspect("probe").await.expect("inspect");
        seen.nodes.iter().all(|n| n.state.is_ok())
    })
    .await;
    assert!(up, "every cluster node up");
    let ttl = Duration::from_millis(1000);
    // Single keys all over the slot space, two locks of one shared tag, and one lock across two
    // tags (two slots).
    let tag = unique("t");
    let mut all = names("cluster", 12);
    all.push(format!("{{{tag}}}:a"));
    all.push(format!("{{{tag}}}:b"));
    let mut guards = keep_all(&redlock, &all, ttl, KeepAliveOptions::default()).await;
    let across = [format!("{{{tag}-x}}:1"), format!("{{{tag}-y}}:2")];
    guards.push(
        redlock
            .acquire(across.clone(), ttl)
            .await
            .expect("acquire across slots")
            .keep_alive(),
    );
    // Take over the second lock on clusters 0 and 1.
    let key = redlock.key(&all[1]);
    for c in &clusters[..2] {
        let shard = c.shard_of_key(&key).await.expect("shard");
        c.nodes()
            .set(shard, &key, "someone-else")
            .await
            .expect("SET");
    }
    assert_eq!(
        common::bounded("lost()", guards[1].lost()).await,
        LostReason::TokenGone
    );
    let others: Vec<&KeepAlive> = guards
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, g)| g)
        .collect();
    extended_at_least(&others, 3, ttl * 5).await;
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.release().await.is_ok(), i != 1, "lock {i}");
    }
}
