//! Waiting in line: each contended resource's wait line on its gate node, the head woken by the
//! release that frees the lock (`Builder::wake_on_release`, on by default), one wake-up per
//! release across every `Redlock` (each standing in for a process), and the failure cases: a
//! dead head, a lost message, a partitioned node, a subscriber reconnect, mixed settings.
//!
//! Each test gives its waiters a retry pause far longer than the test's bound, so an acquire
//! that returns within the bound was woken, never timed; where a timer is the feature (an
//! expired holder, a lost message, a dead head's lease), the bound is that timer's, with wide
//! margins.

mod common;

use std::time::Duration;

use common::lines::{line_has, line_key, line_members, Probe};
use common::*;
use fredlock::Retry;
use fredlock_testkit::{LocalNodes, RespValue};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// Far longer than any bound below: a waiter acquiring within a bound was woken.
const SLOW: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_secs(10),
    jitter: Duration::ZERO,
};
/// A woken waiter acquires well within this (loopback round trips, a loaded CI machine).
const WOKEN: Duration = Duration::from_secs(3);

/// A lock holder in a thread and runtime of its own (another process, as far as the waiter's
/// Redlock can tell): holds `resource` until `release()` is called, which returns once the
/// release round has answered.
struct RemoteHolder {
    release: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
}

impl RemoteHolder {
    fn start(urls: Vec<String>, resource: String) -> RemoteHolder {
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let redlock = build(urls, |b| b).await;
                let lock = redlock.acquire(resource.as_str(), TTL).await.unwrap();
                held_tx.send(()).unwrap();
                let release_rx = tokio::task::spawn_blocking(move || {
                    let _ = release_rx.recv();
                })
                .await;
                let _ = release_rx;
                lock.release().await.unwrap();
                redlock.close().await;
                let _ = done_tx.send(());
            });
        });
        held_rx.recv().expect("the holder acquired");
        RemoteHolder {
            release: release_tx,
            done: done_rx,
        }
    }

    /// Releases, and returns once the release was answered (blocks the calling thread).
    fn release(&self) {
        self.release.send(()).unwrap();
        self.done.recv().expect("the holder released");
    }
}

/// The classic bug (Redisson and several Python locks had it): a waiter whose attempt failed,
/// and that subscribes only afterwards, misses a release landing in between and sleeps a full
/// timeout. Here the release lands exactly there: the probe runs it synchronously when the
/// waiter reports its failed attempt, before the waiter registers or subscribes. The waiter must
/// notice (it attempts again once subscribed) instead of sleeping 4 x 10 s.
#[tokio::test]
async fn a_release_between_the_failed_attempt_and_the_wait_is_not_missed() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let r = unique("classic");
    let holder = RemoteHolder::start(nodes.urls(), r.clone());
    let probe = Probe::default();
    let _guard = probe.install();
    probe.on_first("attempt failed", move || holder.release());
    let waiter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let t = Instant::now();
    let lock = tokio::time::timeout(WOKEN, waiter.acquire(r.as_str(), TTL))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the release between the failed attempt and the wait was missed: still waiting \
                 after {WOKEN:?} (failed attempts: {})",
                probe.count("attempt failed")
            )
        })
        .unwrap();
    assert_eq!(
        probe.count("attempt failed"),
        1,
        "one failed attempt, then the lock"
    );
    assert!(t.elapsed() < WOKEN);
    lock.release().await.unwrap();
    waiter.close().await;
}

/// A release in another process wakes the head of the line, long before its timer would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_elsewhere_wakes_the_head() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (holder, waiter) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b.retry(SLOW)).await,
    );
    let r = unique("elsewhere");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(
        line_has(&nodes, &waiter, &r, 1).await,
        "the waiter joined the line"
    );
    // Its subscription to its own channel is up on the gate.
    let gate = waiter.line_node(&r).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            pubsub_clients(&nodes, gate).await == 1
        })
        .await
    );
    let t = Instant::now();
    held.release().await.unwrap();
    let lock = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < WOKEN);
    // The head took the lock: it left the line with the grant.
    assert!(line_members(&nodes, &waiter, &r).await.is_empty());
    lock.release().await.unwrap();
}

/// A release sent in a batch (its node busy with 63 other releases of the same process) takes
/// the batch's short form of the gate's release, which does not wake anyone itself: the line
/// the holder did not know of is noticed there and its head woken all the same. The head is a
/// member of another process that never renews (so only the release can have woken it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_batched_on_the_gate_wakes_the_head() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let r = unique("batched");
    let others: Vec<String> = (0..63).map(|i| format!("{r}:other:{i}")).collect();
    // Warm-up: the gate knows its release script once it ran it (sent whole until then, alone).
    let gate = holder.line_node(&r).unwrap();
    let warm = others.iter().find(|o| holder.line_node(o) == Some(gate));
    let lock = holder.acquire(warm.unwrap().as_str(), TTL).await.unwrap();
    lock.release().await.unwrap();
    let mut locks = Vec::new();
    for name in &others {
        locks.push(holder.acquire(name.as_str(), TTL).await.unwrap());
    }
    // Last: its release queues behind the others' on every node.
    locks.push(holder.acquire(r.as_str(), TTL).await.unwrap());
    // A waiter of another process joined the line meanwhile (as GATE_ACQUIRE's join does).
    let head = "0123456789abcdef0123456789abcdef:7";
    join_line(&nodes, &holder, &r, &[(head, true)]).await;
    let reports = futures::future::join_all(locks.into_iter().map(|l| l.release())).await;
    assert!(reports.iter().all(|r| r.is_ok()), "{reports:?}");
    assert!(
        woke_one(&nodes, gate).await,
        "the release woke the head: one message"
    );
}

/// A lone release on the gate of a key this process knows no line for sends only the short
/// release (the compare-and-delete and a read of the line's flag): a line that formed meanwhile,
/// which the holder did not know of, is noticed by the flag and its head woken all the same, by
/// one more call. The head is a member of another process that never renews (so only the
/// release can have woken it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_release_on_the_gate_wakes_a_head_it_did_not_know_of() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let r = unique("lone");
    let gate = holder.line_node(&r).unwrap();
    // Warm-up: the gate's connection has run its scripts once.
    holder
        .acquire(r.as_str(), TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let lock = holder.acquire(r.as_str(), TTL).await.unwrap();
    let head = "0123456789abcdef0123456789abcdef:7";
    join_line(&nodes, &holder, &r, &[(head, true)]).await;
    lock.release().await.unwrap();
    assert!(
        woke_one(&nodes, gate).await,
        "the release woke the head: one message"
    );
    let key = holder.key(&r);
    let gone = nodes
        .command(gate, &["EXISTS", key.as_str()])
        .await
        .unwrap();
    assert_eq!(gone, RespValue::Integer(0), "released");
}

/// A head whose lease is gone (its process died) is passed over: the release wakes the member
/// behind it and takes the dead one out of the line. Both are members of other processes,
/// injected while the lock is held; the holder knew of no line, so its release finds the flag
/// and wakes through the line's own release script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_passes_over_a_dead_head() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let r = unique("dead-head");
    let gate = holder.line_node(&r).unwrap();
    let lock = holder.acquire(r.as_str(), TTL).await.unwrap();
    let dead = "0123456789abcdef0123456789abcdef:1";
    let live = "fedcba9876543210fedcba9876543210:2";
    join_line(&nodes, &holder, &r, &[(dead, false), (live, true)]).await;
    lock.release().await.unwrap();
    assert!(woke_one(&nodes, gate).await, "the release woke one member");
    assert_eq!(
        line_members(&nodes, &holder, &r).await,
        vec![live.to_string()],
        "the dead head left the line; the live member, woken, is its head"
    );
}

/// No herd, fleet-wide: 8 `Redlock`s (as 8 processes) each wait once for one key. Every release
/// publishes exactly one message (to the head's own channel), the head takes the lock with one
/// SET per node, and nobody else attempts: per acquisition a bounded number of commands.
/// (Before wait lines, every release woke one waiter in EVERY process: 8 messages, 8 attempts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_one_waiter_fleet_wide() {
    const FLEET: usize = 8;
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let r = unique("fleet");
    let first = holder.acquire(r.as_str(), TTL).await.unwrap();
    let mut fleet = Vec::new();
    for _ in 0..FLEET {
        fleet.push(build(nodes.urls(), |b| b.retry(SLOW)).await);
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, redlock) in fleet.iter().enumerate() {
        let (redlock, name, tx) = (redlock.clone(), r.clone(), tx.clone());
        tokio::spawn(async move {
            let lock = redlock.acquire(name.as_str(), TTL).await.unwrap();
            tx.send(i).unwrap();
            // Hold it briefly, then hand it on.
            tokio::time::sleep(Duration::from_millis(20)).await;
            lock.release().await.unwrap();
        });
        // One at a time, so the line's order is the spawn order.
        assert!(
            line_has(&nodes, &holder, &r, i + 1).await,
            "waiter {i} in line"
        );
    }
    for i in 0..3 {
        nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
    }
    let t = Instant::now();
    first.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..FLEET {
        let i = tokio::time::timeout(WOKEN, rx.recv())
            .await
            .expect("handed on in time")
            .unwrap();
        order.push(i);
    }
    let handing_on = t.elapsed();
    assert!(handing_on < WOKEN * 2, "{handing_on:?}");
    assert_eq!(
        order,
        (0..FLEET).collect::<Vec<_>>(),
        "first come, first served"
    );
    // Let the last release land.
    assert!(freed_within(&holder, &holder.key(&r), Duration::from_secs(5)).await);
    let publishes = calls_on_all(&nodes, "publish").await;
    let sets = calls_on_all(&nodes, "set").await;
    assert_eq!(
        publishes, FLEET as u64,
        "one wake-up per release that had a waiter"
    );
    // Per acquisition: the gate's SET and one per other node (3), and the lease SET of the one
    // look each waiter takes at its gate when its subscription first comes up: nobody else
    // attempts.
    // (A herd, one waiter per process woken by every release, costs 8 attempts of 3 SETs per
    // release here: 192.) A woken head whose SET overtakes the previous release on a node
    // retries: some slack. And every waiter renews its place once a second (the gate's script
    // with its lease SET; the head also sends a SET to each other node), which a loaded machine
    // can make happen during the hand-overs: FLEET + 2 SETs per second they lasted.
    let renewals = (FLEET as u64 + 2) * handing_on.as_secs().saturating_add(1);
    assert!(
        sets <= (FLEET * 6) as u64 + renewals,
        "{sets} SETs for {FLEET} acquisitions in {handing_on:?}"
    );
}

/// A waiter whose process died at the head of the line (its lease still alive) delays the
/// next one by at most the lease, never longer: the next one takes the lock then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_drops_out_within_its_lease() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (holder, waiter) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b.retry(SLOW)).await,
    );
    let r = unique("deadhead");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    // A member of a process that is gone, at the head, its lease renewed just now (3 s).
    let gate = holder.line_node(&r).unwrap();
    let line = line_key(&holder, &r);
    let dead = "0123456789abcdef0123456789abcdef:7";
    nodes
        .command(gate, &["ZADD", &line, "-100", dead])
        .await
        .unwrap();
    nodes
        .command(gate, &["SET", &format!("{line}|{dead}"), "1", "PX", "3000"])
        .await
        .unwrap();
    let t = Instant::now();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &holder, &r, 2).await);
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(8), task)
        .await
        .expect("the next waiter took over once the dead head's lease ran out")
        .unwrap()
        .unwrap();
    // Not before the lease ran out (the gate grants the head only), and not long after it
    // (the waiter renews its own place every second, which is when it notices).
    assert!(
        t.elapsed() >= Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    lock.release().await.unwrap();
    assert!(!line_members(&nodes, &holder, &r)
        .await
        .contains(&dead.to_string()));
}

/// A release that publishes nothing (a client of an earlier version, a lost message, a key
/// deleted by hand) is noticed by the head on its next renewal, within about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wake_up_is_noticed_at_the_next_renewal() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let waiter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("lost");
    let key = waiter.key(&r);
    for i in 0..3 {
        nodes.set(i, &key, "someone-else").await.unwrap();
    }
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 1).await);
    let t = Instant::now();
    for i in 0..3 {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let lock = tokio::time::timeout(Duration::from_secs(4), task)
        .await
        .expect("noticed by the renewal (RENEW = 1 s), not the 10 s retry pause")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(4));
    lock.release().await.unwrap();
}

/// A key left on the gate alone (a clean-up that did not reach the gate, a node back from its
/// append-only file) does not hold the head back until it expires: the head's next look (its
/// renewal, once a second) asks every node, and it takes the other two nodes' quorum, as a
/// newcomer could. (Before, the head asked the gate alone at every renewal, refused each time,
/// for the key's whole TTL, while newcomers took the lock ahead of the whole line.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_on_the_gate_alone_does_not_hold_the_head_back() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let waiter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("gate-alone");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).unwrap();
    for i in 0..3 {
        nodes.set(i, &key, "someone-else").await.unwrap();
    }
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 1).await);
    // The holder's keys go, but not the gate's, which somebody else keeps for 20 s (and no
    // release publishes anything: only the head's renewal can notice).
    nodes
        .command(gate, &["SET", &key, "stale", "PX", "20000"])
        .await
        .unwrap();
    for i in (0..3).filter(|&i| i != gate) {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("taken at a renewal (1 s) from the other nodes' quorum, not when the gate's key expired (20 s)")
        .unwrap()
        .unwrap();
    let pttl = nodes.command(gate, &["PTTL", &key]).await.unwrap();
    assert!(
        matches!(pttl, RespValue::Integer(ms) if ms > 0),
        "the gate's key was still there when the head got the lock: {pttl:?}"
    );
    assert_eq!(
        nodes.get(gate, &key).await.unwrap().as_deref(),
        Some("stale"),
        "the gate's key is left alone"
    );
    lock.release().await.unwrap();
}

/// A holder that crashed (its key never released) is noticed when the key expires on the
/// gate: the head times its look by the key's TTL there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_is_noticed_at_its_expiry() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let waiter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("expired");
    let key = waiter.key(&r);
    for i in 0..3 {
        nodes
            .command(i, &["SET", &key, "crashed", "PX", "1500"])
            .await
            .unwrap();
    }
    let t = Instant::now();
    let lock = tokio::time::timeout(Duration::from_secs(5), waiter.acquire(r.as_str(), TTL))
        .await
        .expect("the expiry was noticed")
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(1500 + 1500),
        "{:?}",
        t.elapsed()
    );
    lock.release().await.unwrap();
}

/// The waiters' subscriber connections are killed while they wait and the release lands
/// before they are back: once resubscribed, every waiter looks again, and the head acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reconnect_loses_no_turn() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (holder, waiter) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b.retry(SLOW)).await,
    );
    let r = unique("reconnect");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 1).await);
    let gate = waiter.line_node(&r).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            pubsub_clients(&nodes, gate).await == 1
        })
        .await
    );
    for i in 0..3 {
        nodes
            .command(i, &["CLIENT", "KILL", "TYPE", "pubsub"])
            .await
            .unwrap();
    }
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter looked again once resubscribed")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
}

/// A paused node that is not the gate does not hold up the hand-over; a paused gate leaves
/// the waiters polling at the retry pace (the quorum of the other two still decides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_slows_nothing_and_a_partitioned_gate_means_polling() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let fast = retry(u32::MAX, 50, 10);
    let (holder, waiter) = (
        build(nodes.urls(), |b| b.node_timeout(Duration::from_millis(300))).await,
        build(nodes.urls(), |b| {
            b.retry(SLOW).node_timeout(Duration::from_millis(300))
        })
        .await,
    );
    for (name, paused_gate) in [("other", false), ("gate", true)] {
        let r = unique(name);
        let gate = waiter.line_node(&r).unwrap();
        let paused = if paused_gate { gate } else { (gate + 1) % 3 };
        // A holder on every node: on a loaded machine a grant at the first two answers can
        // leave the third node's SET skipped at its 300 ms timeout, and the release below, with
        // one of the two paused, would then find no quorum.
        let key = holder.key(&r);
        let mut held = holder.acquire(r.as_str(), TTL).await.unwrap();
        for _ in 0..3 {
            let everywhere = eventually(Duration::from_secs(2), || async {
                for i in 0..3 {
                    if nodes.get(i, &key).await.unwrap().is_none() {
                        return false;
                    }
                }
                true
            })
            .await;
            if everywhere {
                break;
            }
            held.release().await.unwrap();
            held = holder.acquire(r.as_str(), TTL).await.unwrap();
        }
        let w = if paused_gate {
            build(nodes.urls(), |b| {
                b.retry(fast).node_timeout(Duration::from_millis(300))
            })
            .await
        } else {
            waiter.clone()
        };
        let task = tokio::spawn({
            let (w, r) = (w.clone(), r.clone());
            async move { w.acquire(r.as_str(), TTL).await }
        });
        assert!(line_has(&nodes, &waiter, &r, 1).await);
        nodes.pause(paused).unwrap();
        held.release().await.unwrap();
        let got = tokio::time::timeout(WOKEN, task).await;
        nodes.resume(paused).unwrap();
        let lock = got
            .unwrap_or_else(|_| panic!("{name} paused: the waiter did not get the lock"))
            .unwrap()
            .unwrap();
        lock.release().await.unwrap();
    }
}

/// Mixed settings and a client that ignores lines altogether (plain SET NX on every node, as
/// an earlier version or another library would): exclusion holds (no update lost), and every
/// client gets its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fleets_stay_exclusive() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let r = unique("mixed");
    let counter = format!("{r}:counter");
    let quick = retry(u32::MAX, 2, 3);
    let clients = [
        build(nodes.urls(), |b| b.retry(quick)).await,
        build(nodes.urls(), |b| b.retry(quick)).await,
        build(nodes.urls(), |b| b.retry(quick).wake_on_release(false)).await,
        build(nodes.urls(), |b| b.retry(quick).wake_on_release(false)).await,
    ];
    const ROUNDS: usize = 25;
    let mut tasks = Vec::new();
    for redlock in clients.clone() {
        let (r, counter) = (r.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
                let v: i64 = get(&redlock, 0, &counter)
                    .await
                    .map_or(0, |v| v.parse().unwrap());
                tokio::task::yield_now().await;
                raw(&redlock, 0, &["SET", &counter, &(v + 1).to_string()]).await;
                lock.release().await.unwrap();
            }
        }));
    }
    // The line-ignoring client: SET NX on every node, a quorum or nothing.
    let legacy = {
        let (urls, r, counter) = (nodes.urls(), r.clone(), counter.clone());
        let probe = clients[0].clone();
        tokio::spawn(async move {
            let key = probe.key(&r);
            let mut done = 0;
            while done < ROUNDS {
                let token = format!("legacy-{done}");
                let mut won = 0;
                for i in 0..urls.len() {
                    if let fredlock::fred::prelude::Value::String(_) =
                        raw(&probe, i, &["SET", &key, &token, "NX", "PX", "30000"]).await
                    {
                        won += 1;
                    }
                }
                if won >= 2 {
                    let v: i64 = get(&probe, 0, &counter)
                        .await
                        .map_or(0, |v| v.parse().unwrap());
                    raw(&probe, 0, &["SET", &counter, &(v + 1).to_string()]).await;
                    done += 1;
                }
                for i in 0..urls.len() {
                    if get(&probe, i, &key).await.as_deref() == Some(token.as_str()) {
                        raw(&probe, i, &["DEL", &key]).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every client finished")
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(60), legacy)
        .await
        .expect("the legacy client finished")
        .unwrap();
    let total: usize = get(&clients[0], 0, &counter)
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, ROUNDS * 5, "no update lost");
}

/// A waiter that gives up (its `wait` ran out) or is cancelled leaves the line at once, so the
/// next release goes to the one behind it, not to a member nobody is waiting for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_or_is_cancelled_leaves_the_line() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let quitter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let cancelled = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let patient = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("leave");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let quits = tokio::spawn({
        let (q, r) = (quitter.clone(), r.clone());
        async move {
            q.acquire_with(r.as_str(), TTL, Duration::from_millis(1500))
                .await
        }
    });
    assert!(line_has(&nodes, &holder, &r, 1).await);
    let cancel = tokio::spawn({
        let (c, r) = (cancelled.clone(), r.clone());
        async move { c.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &holder, &r, 2).await);
    let waits = tokio::spawn({
        let (p, r) = (patient.clone(), r.clone());
        async move { p.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &holder, &r, 3).await);
    cancel.abort();
    assert!(quits.await.unwrap().is_err(), "the quitter gave up");
    assert!(
        line_has(&nodes, &holder, &r, 1).await,
        "both left: {:?}",
        line_members(&nodes, &holder, &r).await
    );
    let t = Instant::now();
    held.release().await.unwrap();
    let lock = tokio::time::timeout(WOKEN, waits)
        .await
        .expect("the patient one was woken")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < WOKEN);
    lock.release().await.unwrap();
}

/// Wake-ups off: no subscriber connection, waiters still wait in line and poll their gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_off_polls_in_line() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| {
        b.wake_on_release(false).retry(retry(u32::MAX, 20, 5))
    })
    .await;
    // The holder is another process (a release of the waiter's own Redlock would hand the
    // lock over inside the process, with no message).
    let holder = build(nodes.urls(), |b| b.wake_on_release(false)).await;
    let r = unique("off");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (redlock, r) = (redlock.clone(), r.clone());
        async move {
            redlock
                .acquire_with(r.as_str(), TTL, Duration::from_secs(5))
                .await
        }
    });
    assert!(line_has(&nodes, &redlock, &r, 1).await);
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
    for i in 0..3 {
        assert_eq!(
            pubsub_clients(&nodes, i).await,
            0,
            "node {i}: no subscriber"
        );
    }
    // The release still wakes the head (a process with wake-ups may be waiting too): one
    // message per release that had a waiter, whoever listens.
    assert_eq!(calls_on_all(&nodes, "publish").await, 1);
}

/// A one-permit semaphore shared by two tasks of one process, each taking it 10 times for
/// 50 ms: about a second in all, each release waking the other at once. (An earlier release
/// marked the granted permit's own token as a quiet clean-up, so its releases woke nobody and
/// the other task waited for its fallback timer: 37 s, or gave up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_permit_semaphore_hands_over_at_once() {
    let nodes = LocalNodes::start(3).await.unwrap();
    // The library's default settings (the tests' helper retries faster).
    let redlock = build(nodes.urls(), |b| b.retry(Retry::default())).await;
    let sem = redlock.semaphore(unique("onepermit"), 1).unwrap();
    let t = Instant::now();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    let permit = sem
                        .acquire(TTL)
                        .await
                        .expect("permit with default settings");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    permit.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // 20 holds of 50 ms: 1 s of holding; a hand-over that waited for a timer would take
    // 200-300 ms (the default retry pause) or 1 s (a renewal) each.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// The subscriber keeps each node's configuration (password included) to connect with: a
/// Redlock's `Debug` (short: the nodes by name, never its internals) still shows no credentials.
#[tokio::test]
async fn debug_output_shows_no_credentials() {
    let redlock = fredlock::Redlock::builder()
        .nodes(["redis://user:hunter2@127.0.0.1:1"])
        .connect_wait(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let shown = format!("{redlock:?}");
    assert!(shown.contains("127.0.0.1:1"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// Puts members of other processes in `resource`'s line on its gate, in this order, as
/// GATE_ACQUIRE's join does (with a 30 s lease each when `true`; none, as for a dead process,
/// when `false`), sets the line's flag, and resets the gate's command counts.
async fn join_line(
    nodes: &LocalNodes,
    redlock: &fredlock::Redlock,
    resource: &str,
    members: &[(&str, bool)],
) {
    let gate = redlock.line_node(resource).unwrap();
    let line = line_key(redlock, resource);
    for (score, (member, leased)) in members.iter().enumerate() {
        let score = score.to_string();
        let mut cmds = vec![vec![
            "ZADD".to_string(),
            line.clone(),
            score,
            member.to_string(),
        ]];
        if *leased {
            cmds.push(
                ["SET", &format!("{line}|{member}"), "1", "PX", "30000"]
                    .map(String::from)
                    .to_vec(),
            );
        }
        for cmd in cmds {
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            nodes.command(gate, &cmd).await.unwrap();
        }
    }
    let flag = format!("{line}!");
    for cmd in [
        vec!["SET", flag.as_str(), "1", "PX", "30000"],
        vec!["CONFIG", "RESETSTAT"],
    ] {
        nodes.command(gate, &cmd).await.unwrap();
    }
}

/// Whether exactly one wake-up message is published on `gate` (waits up to `WOKEN`).
async fn woke_one(nodes: &LocalNodes, gate: usize) -> bool {
    eventually(WOKEN, || async {
        command_calls(nodes, gate, "publish").await == 1
    })
    .await
}
