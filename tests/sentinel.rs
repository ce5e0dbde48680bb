//! Redlock nodes that are Sentinel-managed groups (`LocalSentinel`: a primary, a replica and a
//! sentinel from the same server binary): a group is one node, and after a failover (asked for,
//! or a killed primary) the node serves the new primary; a lock whose key reached the replica
//! before the failover is still held there. With `confirm_replicas`, a vote counts only once
//! the replica has the key: a node whose replica lags grants nothing.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fredlock::Redlock;
use fredlock_testkit::{LocalSentinel, RespValue, Server};

const TTL: Duration = Duration::from_secs(30);
/// Far above what a failover takes here (about 1-3 s after the primary goes silent).
const WITHIN: Duration = Duration::from_secs(30);

async fn group() -> LocalSentinel {
    LocalSentinel::start(1, 1)
        .await
        .expect("start a Sentinel group")
}

async fn redlock(groups: &[&LocalSentinel]) -> Redlock {
    let urls = groups.iter().map(|g| g.url()).collect();
    common::build(urls, |b| b.connect_wait(Duration::from_secs(20))).await
}

/// Until node `i` of `redlock` answers and shows `resource` held by the token `token` (its
/// connection follows the new primary).
async fn shows_holder(redlock: &Redlock, i: usize, resource: &str, token: &str) -> bool {
    common::eventually(WITHIN, || async {
        match redlock.inspect(resource).await {
            Ok(seen) => matches!(&seen.nodes[i].state, Ok(Some(h)) if h.has_token(token)),
            Err(_) => false,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_is_one_node_that_follows_a_failover() {
    let g = group().await;
    let holder = redlock(&[&g]).await;
    let other = redlock(&[&g]).await;
    let r = common::unique("sentinel-failover");
    let mut lock = holder.acquire(&r, TTL).await.expect("acquire");
    let old = g.primary().await.expect("primary");
    assert!(
        other.try_acquire(&r, TTL).await.expect("try").is_none(),
        "held on the primary"
    );
    g.wait_synced(old, 1)
        .await
        .expect("the replica has the key");

    let new = g.failover().await.expect("failover");
    assert_ne!(new, old, "a replica was promoted");
    assert!(
        shows_holder(&other, 0, &r, lock.token()).await,
        "the new primary holds the replicated key, and the node reads it there"
    );
    assert!(
        other.try_acquire(&r, TTL).await.expect("try").is_none(),
        "still held after the failover"
    );
    lock.extend(TTL).await.expect("extend on the new primary");
    lock.release().await.expect("release on the new primary");
    let again = other.try_acquire(&r, TTL).await.expect("try");
    assert!(again.is_some(), "free once released on the new primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_comes_back_as_a_replica() {
    let mut g = group().await;
    let holder = redlock(&[&g]).await;
    let r = common::unique("sentinel-kill");
    let lock = holder.acquire(&r, TTL).await.expect("acquire");
    let old = g.primary().await.expect("primary");
    g.wait_synced(old, 1)
        .await
        .expect("the replica has the key");

    assert_eq!(g.kill_primary().await.expect("kill"), old);
    let new = g.wait_new_primary(old).await.expect("a replica promoted");
    assert!(
        shows_holder(&holder, 0, &r, lock.token()).await,
        "the node follows the new primary, where the key is"
    );
    let other = redlock(&[&g]).await;
    assert!(
        other.try_acquire(&r, TTL).await.expect("try").is_none(),
        "still held after the failover"
    );
    g.start_node(old).await.expect("the old primary back");
    assert_eq!(
        g.primary().await.expect("primary"),
        new,
        "it came back a replica"
    );
    lock.release().await.expect("release");
    assert!(other.try_acquire(&r, TTL).await.expect("try").is_some());
}

/// Three groups as three nodes, one of them failed over while locks come and go: the quorum
/// holds throughout, and no key is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_groups_keep_a_quorum_through_a_failover() {
    let (a, b, c) = tokio::join!(group(), group(), group());
    let redlock = redlock(&[&a, &b, &c]).await;
    let r = common::unique("sentinel-quorum");
    let failover = async {
        let old = b.primary().await.expect("primary");
        b.wait_synced(old, 1).await.expect("synced");
        b.failover().await.expect("failover")
    };
    let done = AtomicBool::new(false);
    let failover = async {
        let new = failover.await;
        done.store(true, Ordering::Release);
        new
    };
    // Locks come and go until the failover is over, and 20 more after it.
    let work = async {
        let (mut granted, mut after) = (0, 0);
        while after < 20 {
            if done.load(Ordering::Acquire) {
                after += 1;
            }
            let lock = redlock
                .acquire(&r, TTL)
                .await
                .expect("a quorum of 2 groups");
            granted += 1;
            lock.release().await.expect("release");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        granted
    };
    let (_, granted) = tokio::join!(failover, work);
    assert!(granted > 20, "{granted} locks granted");
    let key = redlock.key(&r);
    for (i, g) in [&a, &b, &c].into_iter().enumerate() {
        let p = g.primary().await.expect("primary");
        let left = g.data().get(p, &key).await.expect("GET");
        if i == 1 {
            // A release in flight as the sentinel closed the connections fails there (the
            // lock was released on the quorum): the key may stay, until its TTL.
            let pttl = g.data().pttl(p, &key).await.expect("PTTL");
            assert!(
                left.is_none() || pttl > 0,
                "{left:?} without a TTL ({pttl})"
            );
        } else {
            assert_eq!(left, None, "group {i} left the key");
        }
    }
}

/// A primary that stops answering without closing its connections (SIGSTOP: a frozen process,
/// or one cut off by the network) is left for the promoted replica while it is still frozen:
/// the node gives up a connection that waited past its stall bound and asks the sentinels
/// again. Fails without that bound: the node stays on the frozen primary until it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_is_left_for_the_promoted_replica() {
    let g = group().await;
    let holder = redlock(&[&g]).await;
    let r = common::unique("sentinel-frozen");
    let lock = holder.acquire(&r, TTL).await.expect("acquire");
    let old = g.primary().await.expect("primary");
    g.wait_synced(old, 1)
        .await
        .expect("the replica has the key");

    assert_eq!(g.pause_primary().await.expect("pause"), old);
    let new = g.wait_new_primary(old).await.expect("a replica promoted");
    let follows = shows_holder(&holder, 0, &r, lock.token()).await;
    g.resume(old).expect("resume");
    assert!(
        follows,
        "the node reads node {new}, the new primary, while {old} is frozen"
    );
    lock.release().await.expect("release");
}

/// `confirm_replicas(1, ..)`: a grant counts once the replica has the key, and a node whose
/// replica does not acknowledge in time fails its vote (typed, with the count) and is released.
/// The negative control: without confirmation the same acquire is granted while the replica
/// has nothing, which a failover right then would lose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_counts_once_a_replica_confirmed_it() {
    let g = group().await;
    let urls = vec![g.url()];
    let wait = Duration::from_secs(1);
    let confirmed = common::build(urls.clone(), |b| {
        b.connect_wait(Duration::from_secs(20))
            .confirm_replicas(1, wait)
    })
    .await;
    let plain = redlock(&[&g]).await;
    let primary = g.primary().await.expect("primary");
    let replica = 1 - primary;
    g.wait_synced(primary, 1)
        .await
        .expect("the replica streams");

    let r = common::unique("confirmed");
    let key = confirmed.key(&r);
    let mut lock = confirmed.acquire(&r, TTL).await.expect("confirmed");
    assert!(
        g.data().get(replica, &key).await.expect("GET").is_some(),
        "on the replica when the acquire returns"
    );
    lock.extend(TTL).await.expect("an extension confirmed");
    lock.release().await.expect("release");

    g.data().pause(replica).expect("pause the replica");
    let refused = confirmed.try_acquire(&r, TTL).await;
    let released = common::eventually(Duration::from_secs(5), || async {
        g.data().get(primary, &key).await.expect("GET").is_none()
    })
    .await;
    let unconfirmed = plain.try_acquire(&r, TTL).await;
    let replica_get = ["GET", key.as_str()];
    let on_replica = g
        .data()
        .command_timeout(replica, &replica_get, Duration::from_millis(100))
        .await;
    g.data().resume(replica).expect("resume");

    let err = refused.expect_err("no replica acknowledged: no vote");
    let text = format!("{err}");
    assert!(text.contains("0 of 1 replicas"), "{text}");
    assert!(
        text.contains("sentinel(fredlock@"),
        "names the node: {text}"
    );
    assert!(
        released,
        "the failed confirmed attempt was released on the primary"
    );
    let lock = unconfirmed
        .expect("the plain acquire")
        .expect("granted without confirmation: the key is on the primary alone");
    assert!(on_replica.is_err(), "the replica (frozen) has not answered");
    lock.release().await.expect("release");
}

/// `confirm_replicas_fsynced(1, ..)` (`WAITAOF 1 1 timeout`): with the append-only file off the
/// server refuses and no vote counts (its words in the error); on Valkey with it on, a vote
/// counts once fsynced on the primary and the replica. Redis 7.0 has no `WAITAOF`: every vote
/// fails, naming the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_on_disk_counts_once_fsynced_on_both() {
    let g = group().await;
    let primary = g.primary().await.expect("primary");
    let fsynced = common::build(vec![g.url()], |b| {
        b.connect_wait(Duration::from_secs(20))
            .confirm_replicas_fsynced(1, Duration::from_secs(1))
    })
    .await;
    let r = common::unique("fsynced");
    let refused = fsynced.try_acquire(&r, TTL).await;
    let text = format!(
        "{}",
        refused.expect_err("no vote without an append-only file")
    );
    if g.server() == Server::Redis {
        assert!(text.contains("WAITAOF"), "{text}");
        return;
    }
    assert!(text.contains("appendonly"), "the server's words: {text}");
    assert!(
        common::eventually(Duration::from_secs(5), || async {
            g.data()
                .get(primary, &fsynced.key(&r))
                .await
                .expect("GET")
                .is_none()
        })
        .await,
        "the refused attempt was released"
    );
    for i in 0..g.data().len() {
        let on = g
            .data()
            .command(i, &["CONFIG", "SET", "appendonly", "yes"])
            .await;
        assert!(matches!(on, Ok(RespValue::Simple(_))), "{on:?}");
    }
    // The file exists once the first rewrite is over.
    let written = common::eventually(Duration::from_secs(20), || async {
        let mut all = true;
        for i in 0..g.data().len() {
            let info = match g.data().command(i, &["INFO", "persistence"]).await {
                Ok(RespValue::Bulk(Some(b))) => String::from_utf8_lossy(&b).into_owned(),
                _ => String::new(),
            };
            all &= info.contains("aof_enabled:1") && info.contains("aof_rewrite_in_progress:0");
        }
        all
    })
    .await;
    assert!(written, "the append-only files are on");
    let lock = common::eventually(Duration::from_secs(10), || async {
        fsynced
            .try_acquire(&r, TTL)
            .await
            .is_ok_and(|l| l.is_some())
    })
    .await;
    assert!(
        lock,
        "fsynced on the primary and the replica: the vote counts"
    );
}
