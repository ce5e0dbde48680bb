//! Every Redlock node a local Redis Cluster (`LocalCluster`, real `redis-server` processes in
//! cluster mode): every operation routes to the shard that owns its key, multi-resource locks
//! span slots, a dead shard fails only its own slots, and a slot migrating (ASK, then MOVED)
//! while locks come and go leaves no key behind and never grants twice.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::{Error, InvalidInput, KeepAliveOptions, Redlock, Vote};
use fredlock_testkit::{LocalCluster, RespValue};

const TTL: Duration = Duration::from_secs(10);
const PREFIX: &str = "fredlock:";

/// `n` clusters of `shards` shards each, started side by side.
async fn clusters(n: usize, shards: usize) -> Vec<LocalCluster> {
    let started = futures::future::join_all((0..n).map(|_| LocalCluster::start(shards))).await;
    started
        .into_iter()
        .map(|c| c.expect("start a local cluster"))
        .collect()
}

async fn redlock(clusters: &[LocalCluster], fencing: bool) -> Redlock {
    let urls: Vec<String> = clusters.iter().map(LocalCluster::url).collect();
    let redlock = common::build(urls, |b| {
        b.fencing_tokens(fencing)
            .connect_wait(Duration::from_secs(20))
    })
    .await;
    // Every node (not only a quorum) has read its slot table.
    let up = common::eventually(Duration::from_secs(20), || async {
        let seen = redlock.inspect("probe").await.expect("inspect");
        seen.nodes.iter().all(|n| n.state.is_ok())
    })
    .await;
    assert!(up, "every cluster node up");
    redlock
}

/// A resource whose lock key lives on shard `shard` of `cluster`.
async fn resource_on(cluster: &LocalCluster, shard: usize, tag: &str) -> String {
    let key = cluster
        .key_on_shard(shard, &format!("{PREFIX}{}-{tag}-", rand::random::<u32>()))
        .await
        .expect("a key on the shard");
    key.strip_prefix(PREFIX).expect("prefix").to_string()
}

/// Every key on every shard of every cluster matching `pattern`.
async fn keys(clusters: &[LocalCluster], pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    for c in clusters {
        for s in 0..c.shards() {
            if !c.is_running(s) {
                continue;
            }
            match c
                .nodes()
                .command(s, &["KEYS", pattern])
                .await
                .expect("KEYS")
            {
                RespValue::Array(Some(found)) => {
                    for k in found {
                        if let RespValue::Bulk(Some(k)) = k {
                            out.push(String::from_utf8_lossy(&k).into_owned());
                        }
                    }
                }
                other => panic!("KEYS answered {other:?}"),
            }
        }
    }
    out
}

/// Lock keys (not fencing counters, not semaphore metadata) left anywhere.
async fn lock_keys_left(clusters: &[LocalCluster]) -> Vec<String> {
    keys(clusters, &format!("{PREFIX}*"))
        .await
        .into_iter()
        // Fencing counters and election records persist by design (they count only beside a
        // live lock key).
        .filter(|k| !k.contains("~fence:") && !k.contains("~elect:") && !k.ends_with(":permits"))
        .collect()
}

/// A release that no node refused or failed (`Pending`: decided before that node answered; its
/// release finishes in the background).
fn clean(report: &fredlock::ReleaseReport) -> bool {
    report
        .votes
        .0
        .iter()
        .all(|v| matches!(v, Vote::Granted | Vote::Pending))
}

/// No lock key left on any shard of any node, within 5 s (background releases finishing).
async fn nothing_left(clusters: &[LocalCluster]) -> bool {
    common::eventually(Duration::from_secs(5), || async {
        lock_keys_left(clusters).await.is_empty()
    })
    .await
}

/// Fails the test, naming the keys, unless no lock key is left (see [`nothing_left`]).
async fn assert_nothing_left(clusters: &[LocalCluster]) {
    assert!(
        nothing_left(clusters).await,
        "{:?}",
        lock_keys_left(clusters).await
    );
}

/// Whether every node shows `token` at `resource` within 5 s (a lock is granted once a quorum
/// answered; the last node's `SET` may still be on its way).
async fn held_everywhere(redlock: &Redlock, resource: &str, token: &str) -> bool {
    common::eventually(Duration::from_secs(5), || async {
        let seen = redlock.inspect(resource).await.expect("inspect");
        seen.nodes
            .iter()
            .all(|n| matches!(&n.state, Ok(Some(h)) if h.has_token(token)))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_routes_to_the_shard_that_owns_the_key() {
    let clusters = clusters(3, 3).await;
    let redlock = redlock(&clusters, true).await;

    // One resource per shard of node 0 (the others place them wherever their slots say).
    let mut resources = Vec::new();
    for shard in 0..3 {
        resources.push(resource_on(&clusters[0], shard, "op").await);
    }
    for r in &resources {
        let mut lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
        let fence = lock.fencing_token().expect("a fencing token");
        assert!(held_everywhere(&redlock, r, lock.token()).await, "{r}");
        lock.extend(TTL).await.expect("extend on every shard");
        let report = lock.release().await.expect("release");
        assert!(clean(&report), "{r}: {:?}", report.votes);
        // The next holder gets a larger token: the counter is in the lock's slot.
        let again = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
        assert!(again.fencing_token().expect("token") > fence);
        again.release().await.expect("release");
    }
    assert_nothing_left(&clusters).await;

    // A multi-resource lock across three slots: one script per slot, granted on every node.
    let lock = redlock
        .acquire(resources.clone(), TTL)
        .await
        .expect("acquire across slots");
    assert_eq!(lock.fencing_tokens().map(<[u64]>::len), Some(3));
    for r in &resources {
        assert!(held_everywhere(&redlock, r, lock.token()).await, "{r}");
    }
    // A contender for one of them is refused everywhere.
    let contender = redlock
        .try_acquire(resources[1].as_str(), TTL)
        .await
        .expect("try");
    assert!(contender.is_none());
    let report = lock.release().await.expect("release");
    assert!(clean(&report), "{report:?}");
    assert_nothing_left(&clusters).await;

    // Re-locking at once after a release: the release reaches each shard ahead of the next
    // acquire's SET, so no node is missing from the next lock (a release that was spawned
    // before being sent let the SET overtake it: about 3% of cycles lost a node).
    let mut refused = 0;
    for _ in 0..300 {
        let lock = redlock
            .acquire(resources[0].as_str(), TTL)
            .await
            .expect("acquire");
        let report = lock.release().await.expect("release");
        refused += report
            .votes
            .0
            .iter()
            .filter(|v| **v == Vote::Refused)
            .count();
    }
    assert_eq!(refused, 0, "releases refused while re-locking");

    // Keep-alive: several renewals land on the shard of the key.
    let short = Duration::from_millis(300);
    let kept = redlock
        .acquire(resources[2].as_str(), short)
        .await
        .expect("acquire")
        .keep_alive_with(KeepAliveOptions::default())
        .expect("keep-alive");
    let handle = kept.handle();
    let renewed = tokio::time::timeout(Duration::from_secs(10), async {
        while handle.extensions() < 3 {
            handle.changed().await.expect("not lost");
        }
    })
    .await;
    assert!(renewed.is_ok(), "three renewals in 10 s");
    kept.release().await.expect("release");

    // Election: a leader, then the key is gone once it resigns.
    let election = redlock.elect(resources[0].as_str(), short).expect("elect");
    let mut role = election.watch();
    tokio::time::timeout(Duration::from_secs(10), role.wait_for(|r| r.is_leader()))
        .await
        .expect("a leader in time")
        .expect("watch");
    drop(role);
    drop(election);

    // Semaphore: at most 2 permits, all of its keys in one slot.
    let semaphore = redlock
        .semaphore(format!("api-{}", rand::random::<u32>()), 2)
        .expect("semaphore");
    let a = semaphore
        .try_acquire(TTL)
        .await
        .expect("try")
        .expect("permit 1");
    let b = semaphore
        .try_acquire(TTL)
        .await
        .expect("try")
        .expect("permit 2");
    assert!(semaphore.try_acquire(TTL).await.expect("try").is_none());
    a.release().await.expect("release");
    b.release().await.expect("release");
    assert_nothing_left(&clusters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shard_fails_only_the_keys_of_its_slots() {
    let mut clusters = clusters(3, 3).await;
    let redlock = redlock(&clusters, false).await;
    let alive = resource_on(&clusters[0], 0, "alive").await;
    let dead = resource_on(&clusters[0], 1, "dead").await;
    let dead_port = clusters[0].port(1);
    clusters[0].kill_shard(1).expect("kill");

    // Node 0 still votes for keys on its live shards.
    let lock = redlock.acquire(alive.as_str(), TTL).await.expect("acquire");
    assert!(held_everywhere(&redlock, &alive, lock.token()).await);
    let report = lock.release().await.expect("release");
    assert!(clean(&report), "{report:?}");

    // For a key of the dead shard, node 0 fails and names the shard; the lock still has its
    // quorum on nodes 1 and 2.
    let lock = redlock.acquire(dead.as_str(), TTL).await.expect("acquire");
    let seen = redlock.inspect(&dead).await.expect("inspect");
    let Err(e) = &seen.nodes[0].state else {
        panic!("node 0 answered for a dead shard: {seen:?}");
    };
    assert!(e.message.contains(&dead_port.to_string()), "{e}");
    let report = lock.release().await.expect("release");
    // Failed, or Pending when the other two answered first; never a grant from a dead shard.
    assert!(
        matches!(report.votes.0[0], Vote::Failed(_) | Vote::Pending),
        "{report:?}"
    );

    // A lock across a live and the dead shard: node 0's live part is cleaned up, not leaked.
    let lock = redlock
        .acquire(vec![alive.clone(), dead.clone()], TTL)
        .await
        .expect("acquire");
    lock.release().await.expect("release");
    assert_nothing_left(&clusters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_leaks_nothing_and_never_grants_twice() {
    let mut clusters = clusters(3, 3).await;
    // Without fencing: a fencing counter left on the source with its lock key absent makes the
    // fenced script a multi-key request across a half-moved slot, which Redis refuses
    // (TRYAGAIN) until the counter has moved: that node's vote fails for the attempt
    // (docs/operations.md, "Redis Cluster nodes").
    let redlock = redlock(&clusters, false).await;
    let r = resource_on(&clusters[0], 0, "moving").await;
    let key = format!("{PREFIX}{r}");
    // The slot migrates on every node at once: every vote goes through ASK.
    for c in clusters.iter_mut() {
        let slot = c.slot_of_key(&key).await.expect("slot");
        let from = c.shard_of_key(&key).await.expect("shard");
        c.begin_migration(slot, (from + 1) % 3)
            .await
            .expect("begin");
    }

    // Absent keys of a migrating slot are created on the target (ASK), found there, released.
    for _ in 0..5 {
        let lock = redlock
            .acquire(r.as_str(), TTL)
            .await
            .expect("acquire during migration");
        assert!(held_everywhere(&redlock, &r, lock.token()).await);
        let report = lock.release().await.expect("release");
        assert!(clean(&report), "{report:?}");
        // The next holder must find every node free (a release may finish in the background).
        assert!(nothing_left(&clusters).await);
    }

    // Contenders while the slot migrates: one holder at a time.
    let inside = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicUsize::new(0));
    let workers = (0..4).map(|_| {
        let (redlock, r) = (redlock.clone(), r.clone());
        let (inside, granted) = (inside.clone(), granted.clone());
        tokio::spawn(async move {
            for _ in 0..10 {
                let Ok(Some(lock)) = redlock.try_acquire(r.as_str(), TTL).await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                granted.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                lock.release().await.expect("release");
            }
        })
    });
    for w in futures::future::join_all(workers).await {
        w.expect("worker");
    }
    assert!(granted.load(Ordering::SeqCst) > 0);

    // A lock held while its key migrates: extend and release follow it (ASK, then MOVED).
    // Nothing the contenders took is left (a denied attempt's clean-up follows the redirect).
    assert_nothing_left(&clusters).await;
    let mut lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    for c in &clusters {
        let slot = c.slot_of_key(&key).await.expect("slot");
        c.migrate_keys(slot, 100).await.expect("migrate keys");
    }
    lock.extend(TTL)
        .await
        .expect("extend after the key moved (ASK)");
    assert!(held_everywhere(&redlock, &r, lock.token()).await);
    for c in clusters.iter_mut() {
        let slot = c.slot_of_key(&key).await.expect("slot");
        c.finish_migration(slot).await.expect("finish");
    }
    lock.extend(TTL)
        .await
        .expect("extend after the slot moved (MOVED)");
    let report = lock.release().await.expect("release");
    assert!(clean(&report), "{report:?}");
    assert_nothing_left(&clusters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_share_a_slot_are_refused_up_front() {
    let clusters = clusters(1, 1).await;
    let urls = vec![clusters[0].url()];
    let redlock = common::build(urls, |b| b.fencing_tokens(true).key_prefix("odd{")).await;
    // With the prefix's unclosed `{`, the lock key and its counter hash differently.
    match redlock.acquire("x", TTL).await {
        Err(Error::InvalidInput(InvalidInput::CrossSlot { keys })) => {
            assert_eq!(keys.len(), 2, "{keys:?}");
        }
        other => panic!("expected CrossSlot, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_shard_times_out_only_the_keys_of_its_slots() {
    let clusters = clusters(3, 3).await;
    let urls: Vec<String> = clusters.iter().map(LocalCluster::url).collect();
    let redlock = common::build(urls, |b| {
        b.node_timeout(Duration::from_millis(200))
            .connect_wait(Duration::from_secs(20))
    })
    .await;
    let frozen = resource_on(&clusters[1], 2, "frozen").await;
    let awake = resource_on(&clusters[1], 0, "awake").await;
    assert!(
        common::eventually(Duration::from_secs(20), || async {
            let seen = redlock.inspect(&awake).await.expect("inspect");
            seen.nodes.iter().all(|n| n.state.is_ok())
        })
        .await,
        "every node up"
    );
    clusters[1].pause_shard(2).expect("pause");

    // Keys on the other shards of node 1 still get node 1's vote.
    let lock = redlock.acquire(awake.as_str(), TTL).await.expect("acquire");
    assert!(held_everywhere(&redlock, &awake, lock.token()).await);
    lock.release().await.expect("release");

    // A key on the frozen shard: node 1 times out, the lock holds on nodes 0 and 2.
    let lock = redlock
        .acquire(frozen.as_str(), TTL)
        .await
        .expect("acquire");
    let seen = redlock.inspect(&frozen).await.expect("inspect");
    // A timeout, or the connection fred dropped after one; named by the frozen shard.
    let port = clusters[1].port(2).to_string();
    assert!(
        matches!(&seen.nodes[1].state, Err(e) if e.message.contains(&port)),
        "{seen:?}"
    );
    assert!(seen.nodes[0].state.as_ref().is_ok_and(Option::is_some));
    assert!(seen.nodes[2].state.as_ref().is_ok_and(Option::is_some));
    lock.release().await.expect("release");

    // Once the shard wakes, whatever it executed late is cleaned up by the release retries.
    clusters[1].resume_shard(2).expect("resume");
    assert_nothing_left(&clusters).await;
}

/// Healing on cluster nodes: a two-resource lock whose keys live on two shards of node 2
/// loses one of them there (deleted, as a restarted shard would); the next extension re-sets it
/// on that shard alone (one repair call per slot), and the release leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_regains_a_lost_key_on_a_cluster_node() {
    let clusters = clusters(3, 3).await;
    let redlock = redlock(&clusters, false).await;
    let a = resource_on(&clusters[2], 0, "heal-a").await;
    let b = resource_on(&clusters[2], 1, "heal-b").await;
    let mut lock = redlock
        .acquire([a.as_str(), b.as_str()], TTL)
        .await
        .expect("acquire");
    let token = lock.token().to_string();
    assert!(held_everywhere(&redlock, &b, &token).await);
    let key = format!("{PREFIX}{b}");
    clusters[2]
        .nodes()
        .command(1, &["DEL", &key])
        .await
        .expect("DEL");
    lock.extend(TTL).await.expect("a quorum holds both keys");
    assert!(
        held_everywhere(&redlock, &b, &token).await,
        "the key never came back on node 2"
    );
    assert!(held_everywhere(&redlock, &a, &token).await);
    assert!(common::eventually(Duration::from_secs(5), || async { lock.repairs() == 1 }).await);
    lock.release().await.expect("release");
    assert_nothing_left(&clusters).await;
}

/// One plain node and two one-shard clusters, and a Redlock over the three (the plain node
/// first).
async fn plain_and_clusters() -> (fredlock_testkit::LocalNodes, Vec<LocalCluster>, Redlock) {
    let plain = fredlock_testkit::LocalNodes::start(1)
        .await
        .expect("a plain node");
    let clusters = clusters(2, 1).await;
    let mut urls = plain.urls();
    urls.extend(clusters.iter().map(LocalCluster::url));
    let redlock = common::build(urls, |b| b.connect_wait(Duration::from_secs(20))).await;
    (plain, clusters, redlock)
}

/// Cluster nodes send an observer no views (no subscriber there): with two of them among three
/// nodes, the plain node's message alone could never name a leader, so the observer reads
/// every node on it, and shows the new term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_with_cluster_nodes_reads_on_each_message() {
    let (_plain, _clusters, redlock) = plain_and_clusters().await;
    let resource = format!("observed-{}", rand::random::<u32>());
    let observer = redlock.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let election = redlock
        .elect_with_options(
            resource.as_str(),
            Duration::from_secs(60),
            fredlock::ElectOptions::default().value("a"),
        )
        .expect("elect");
    let term = election.leader().await;
    let shown = tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|l| l.as_ref().is_some_and(|l| l.value == "a")),
    );
    assert!(
        shown.await.is_ok_and(|r| r.is_ok()),
        "the new term never shown"
    );
    assert_eq!(observer.current().map(|l| l.term), Some(term.number()));
    election.resign().await;
    observer.close().await;
}

/// A term live on the plain node only when its message comes (its claim is still on its way
/// to the cluster nodes, which send no views): the observer's read on that message names no
/// leader, and no message will say when the claim lands there, so it reads again until it
/// does. Fails when the observer waits for a message that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_with_cluster_nodes_reads_again_a_term_live_on_too_few_nodes() {
    let (plain, clusters, redlock) = plain_and_clusters().await;
    let resource = format!("settling-{}", rand::random::<u32>());
    let (key, record) = (redlock.key(&resource), redlock.election_key(&resource));
    let observer = redlock.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    // Term 1, value "a", written as a claim leaves it (lock key, then the record).
    let claim: [&[&str]; 2] = [
        &["SET", &key, "tok", "PX", "60000"],
        &[
            "HSET", &record, "v", "tok", "t", "1", "val", "a", "p", "0", "s", "1",
        ],
    ];
    for args in claim {
        plain
            .command(0, args)
            .await
            .expect("claim on the plain node");
    }
    // Its announcement: live, term 1, priority 0, version 1, TTL 60 s, no yield, value "a".
    let view = "view1:1:1:0:1:60000:-2:1:0:a";
    let reads = || common::script_calls(clusters[0].nodes(), 0);
    let before = reads().await;
    plain
        .command(0, &["PUBLISH", &record, view])
        .await
        .expect("PUBLISH");
    // The read on that message finds the term on one node of three: no leader yet.
    let read = common::eventually(Duration::from_secs(5), || async { reads().await > before });
    assert!(read.await, "the observer did not read on the message");
    assert!(observer.current().is_none(), "a leader named from one node");
    for args in claim {
        clusters[0]
            .nodes()
            .command(0, args)
            .await
            .expect("claim on a cluster node");
    }
    let shown = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|l| l.as_ref().is_some_and(|l| l.value == "a" && l.term == 1)),
    );
    assert!(
        shown.await.is_ok_and(|r| r.is_ok()),
        "the term that reached a quorum without a message was never shown"
    );
    observer.close().await;
}
