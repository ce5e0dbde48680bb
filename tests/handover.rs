//! Hand-over inside one process: a release of a `Redlock` whose own waiter is in the line
//! passes the lock to that waiter as it is within the hand-over window (no command at all but
//! the waiter's leave from the line: same keys, token and deadline), after it in one round
//! (`PASS` on every node, no release, no wake-up, no acquire round), in line order across
//! processes beyond one window, and never hands anything to a waiter that left.
//!
//! The waiters here retry every 10 s: one that gets the lock within the tests' bounds was
//! handed it or woken, never timed. A probe of fredlock's own events tells when a waiter is
//! parked in line (its `waiting` event comes after its refused attempt offered its next value).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::lines::{line_has, line_members, Probe};
use common::*;
use fredlock::{Redlock, Retry};
use fredlock_testkit::LocalNodes;

const TTL: Duration = Duration::from_secs(30);
const SLOW: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_secs(10),
    jitter: Duration::ZERO,
};
/// A waiter handed the lock or woken gets it well within this.
const SOON: Duration = Duration::from_secs(5);

/// Waits until a waiter of this thread parks in line (after `before` parkings seen so far).
async fn parked(probe: &Probe, before: usize) {
    let ok = eventually(SOON, || async { probe.count("waiting") > before }).await;
    assert!(
        ok,
        "a waiter parked in line; events seen: {:?}",
        probe.counts()
    );
}

/// Node `i`'s calls of `command` since its last CONFIG RESETSTAT (inside scripts too).
async fn calls(nodes: &LocalNodes, i: usize, command: &str) -> u64 {
    command_calls(nodes, i, command).await
}

/// With no hand-over window, a holder's release hands the lock to its own Redlock's waiter in
/// one round: every node then holds the waiter's token, which no node got by a release and a new `SET` (no `DEL` on the nodes that
/// are not the gate), and the waiter left the line.
///
/// A parked waiter looks at its gate once a second (its renewal), which withdraws its offer for
/// that moment: a release landing exactly then is an ordinary one. So the scenario runs up to 3
/// times, until one release finds the waiter parked; every run must leave the same state.
#[tokio::test]
async fn a_release_hands_the_lock_to_a_waiter_of_the_same_redlock() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| {
        b.retry(SLOW).handover_window(Duration::ZERO)
    })
    .await;
    let r = unique("pass");
    let key = redlock.key(&r);
    let gate = redlock.line_node(&r).unwrap();
    let probe = Probe::default();
    let _guard = probe.install();
    let mut handed = false;
    for run in 1..=3 {
        let holder = redlock.acquire(r.as_str(), TTL).await.unwrap();
        let before = probe.count("waiting");
        let waiter = {
            let (redlock, r) = (redlock.clone(), r.clone());
            tokio::spawn(async move { redlock.acquire(r.as_str(), TTL).await })
        };
        parked(&probe, before).await;
        assert!(line_has(&nodes, &redlock, &r, 1).await);
        for i in 0..nodes.len() {
            nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
        }
        let report = holder.release().await.unwrap();
        assert!(report.votes.granted() >= 2, "{report:?}");
        let lock = tokio::time::timeout(SOON, waiter)
            .await
            .expect("the waiter got the lock")
            .unwrap()
            .unwrap();
        // Granted at a quorum: the last node's PASS may still be on its way.
        let all = vec![Some(lock.value().to_string()); nodes.len()];
        assert!(values_become(&redlock, &key, &all, SOON).await);
        let mut passed = true;
        for i in 0..nodes.len() {
            if i != gate {
                let (del, set) = (calls(&nodes, i, "del").await, calls(&nodes, i, "set").await);
                assert_eq!(set, 1, "node {i}: one SET, by PASS or by the waiter");
                passed &= del == 0;
            }
        }
        assert!(line_members(&nodes, &redlock, &r).await.is_empty());
        assert!(lock.remaining() > TTL / 2, "{:?}", lock.remaining());
        lock.release().await.unwrap();
        for i in 0..nodes.len() {
            assert_eq!(nodes.get(i, &key).await.unwrap(), None, "node {i}");
        }
        if passed {
            handed = true;
            break;
        }
        eprintln!("run {run}: the release found the waiter looking at its gate; again");
    }
    assert!(handed, "no release of 3 handed the lock over");
    redlock.close().await;
}

/// A waiter in a thread and runtime of its own (another process, as far as the Redlock under
/// test can tell): acquires, reports its value, and releases when told.
struct RemoteWaiter {
    got: std::sync::mpsc::Receiver<String>,
    release: std::sync::mpsc::Sender<()>,
}

impl RemoteWaiter {
    fn start(urls: Vec<String>, resource: String) -> RemoteWaiter {
        let (got_tx, got) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // A subscriber here too: with only the test thread's, tracing decides a callsite's
            // interest by the thread that hits it first, and this thread would turn fredlock's
            // events off for the test's probe.
            let _events = Probe::default().install();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let redlock = build(urls, |b| b.retry(SLOW)).await;
                let lock = redlock.acquire(resource.as_str(), TTL).await.unwrap();
                got_tx.send(lock.value().to_string()).unwrap();
                let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                lock.release().await.unwrap();
                redlock.close().await;
            });
        });
        RemoteWaiter { got, release }
    }
}

/// The order across processes is the line's: a release that asks the line (past the hand-over
/// window) does not pass the lock to its own waiter while another process's waiter is ahead
/// of it. That waiter gets it (woken by the
/// gate), then ours.
#[tokio::test]
async fn a_waiter_of_another_process_ahead_in_line_goes_first() {
    let nodes = LocalNodes::start(3).await.unwrap();
    // No window: the holder's release takes the round that looks at the line.
    let redlock = build(nodes.urls(), |b| {
        b.retry(SLOW).handover_window(Duration::ZERO)
    })
    .await;
    let r = unique("order");
    let key = redlock.key(&r);
    let probe = Probe::default();
    let _guard = probe.install();
    let holder = redlock.acquire(r.as_str(), TTL).await.unwrap();
    let remote = RemoteWaiter::start(nodes.urls(), r.clone());
    assert!(
        line_has(&nodes, &redlock, &r, 1).await,
        "the remote waiter is in line"
    );
    let ours = {
        let (redlock, r) = (redlock.clone(), r.clone());
        tokio::spawn(async move { redlock.acquire(r.as_str(), TTL).await })
    };
    parked(&probe, 0).await;
    assert!(line_has(&nodes, &redlock, &r, 2).await);
    holder.release().await.unwrap();
    let remote_value = tokio::task::spawn_blocking(move || {
        let value = remote
            .got
            .recv_timeout(SOON * 2)
            .expect("the remote waiter got it");
        (remote, value)
    })
    .await
    .unwrap();
    let (remote, value) = remote_value;
    assert!(!ours.is_finished(), "ours waits behind the remote waiter");
    // A quorum holds its token (a node our release had not reached yet may have refused it:
    // the ordinary race between a release and the next process's acquire).
    let theirs = values(&redlock, &key).await;
    let held = theirs
        .iter()
        .filter(|v| v.as_deref() == Some(value.as_str()))
        .count();
    assert!(
        held >= 2,
        "the remote waiter's token {value} on a quorum: {theirs:?}"
    );
    remote.release.send(()).unwrap();
    let lock = tokio::time::timeout(SOON * 2, ours)
        .await
        .expect("ours got it next")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
    redlock.close().await;
}

/// A waiter that left (its acquire dropped) is handed nothing: once the holder releases, no
/// node keeps a key and the line is empty.
#[tokio::test]
async fn a_waiter_that_left_is_handed_nothing() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("left");
    let key = redlock.key(&r);
    let probe = Probe::default();
    let _guard = probe.install();
    let holder = redlock.acquire(r.as_str(), TTL).await.unwrap();
    let waiter = {
        let (redlock, r) = (redlock.clone(), r.clone());
        tokio::spawn(async move { redlock.acquire(r.as_str(), TTL).await })
    };
    parked(&probe, 0).await;
    waiter.abort();
    let _ = waiter.await;
    holder.release().await.unwrap();
    assert!(
        freed_within(&redlock, &key, SOON).await,
        "{:?}",
        values(&redlock, &key).await
    );
    assert!(
        eventually(SOON, || async {
            line_members(&nodes, &redlock, &r).await.is_empty()
        })
        .await
    );
    redlock.close().await;
}

/// Many waiters of one Redlock and of another, the lock passing inside each process and
/// across: never two holders at once, and every acquire served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_keep_the_lock_exclusive() {
    const TASKS: usize = 6;
    const ROUNDS: usize = 15;
    let nodes = LocalNodes::start(3).await.unwrap();
    let fast = Retry {
        attempts: u32::MAX,
        delay: Duration::from_millis(20),
        jitter: Duration::from_millis(20),
    };
    let a = build(nodes.urls(), |b| b.retry(fast)).await;
    let b = build(nodes.urls(), |b| b.retry(fast)).await;
    let r = unique("exclusive");
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let redlock: Redlock = if t % 3 == 0 { b.clone() } else { a.clone() };
        let (r, inside, done) = (r.clone(), inside.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lock.release().await.unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), TASKS * ROUNDS);
    let key = a.key(&r);
    assert!(freed_within(&a, &key, SOON).await);
    a.close().await;
    b.close().await;
}

/// Within the hand-over window (here longer than the test, with a TTL long enough not to cap
/// it), a release hands the lock to its own Redlock's waiter as it is (up to 3 runs, as above:
/// a release that finds the waiter looking at its gate is an ordinary one): the nodes other
/// than the gate get no `DEL` or script, the gate the waiter's leave from the line; the
/// waiter's lock has the holder's token and deadline, and its release frees every node.
#[tokio::test]
async fn within_the_window_a_release_hands_the_lock_over_as_it_is() {
    const LONG: Duration = Duration::from_secs(600);
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| {
        b.retry(SLOW).handover_window(Duration::from_secs(60))
    })
    .await;
    let r = unique("as-is");
    let key = redlock.key(&r);
    let gate = redlock.line_node(&r).unwrap();
    let probe = Probe::default();
    let _guard = probe.install();
    let mut handed = false;
    for run in 1..=3 {
        let holder = redlock.acquire(r.as_str(), LONG).await.unwrap();
        let (token, deadline) = (holder.token().to_string(), holder.deadline());
        let before = probe.count("waiting");
        let waiter = {
            let (redlock, r) = (redlock.clone(), r.clone());
            tokio::spawn(async move { redlock.acquire(r.as_str(), LONG).await })
        };
        parked(&probe, before).await;
        for i in 0..nodes.len() {
            nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
        }
        let released_at = tokio::time::Instant::now();
        let report = holder.release().await.unwrap();
        let lock = tokio::time::timeout(SOON, waiter)
            .await
            .expect("the waiter got the lock")
            .unwrap()
            .unwrap();
        assert!(
            eventually(SOON, || async {
                line_members(&nodes, &redlock, &r).await.is_empty()
            })
            .await
        );
        if lock.token() == token {
            // Nothing was sent for the holder: its keys are the waiter's now, everywhere.
            assert_eq!(report.votes.granted(), nodes.len(), "{report:?}");
            // No release, PASS or clean-up reached the other nodes (a waiter's own look at
            // its gate may add the line's commands there, and a head's look a refused SET
            // everywhere: neither is counted).
            for i in (0..nodes.len()).filter(|&i| i != gate) {
                for command in ["del", "eval", "evalsha"] {
                    assert_eq!(calls(&nodes, i, command).await, 0, "node {i}: {command}");
                }
            }
            assert!(
                calls(&nodes, gate, "zrem").await >= 1,
                "the waiter left the line"
            );
            assert_eq!(lock.deadline(), deadline, "the holder's deadline");
            assert!(
                lock.acquired_at() >= released_at,
                "acquired when handed over"
            );
            let all = vec![Some(lock.value().to_string()); nodes.len()];
            assert_eq!(values(&redlock, &key).await, all);
            handed = true;
        } else {
            // The waiter was looking at its gate (its renewal, or every waiter's look when the
            // Redlock's first subscriber connection comes up): an ordinary release.
            assert!(report.votes.granted() >= 2, "{report:?}");
            eprintln!("run {run}: the release found the waiter looking at its gate; again");
        }
        lock.release().await.unwrap();
        for i in 0..nodes.len() {
            assert_eq!(nodes.get(i, &key).await.unwrap(), None, "node {i}");
        }
        if handed {
            break;
        }
    }
    assert!(handed, "no release of 3 handed the lock over as it is");
    redlock.close().await;
}

/// A waiter that holds for a minimum is never handed a lock as it is (its minimum would count
/// from the hand-over, beyond what the holder's keys were set for): it gets a token of its own.
#[tokio::test]
async fn a_waiter_holding_for_a_minimum_gets_a_token_of_its_own() {
    const LONG: Duration = Duration::from_secs(600);
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| {
        b.retry(SLOW).handover_window(Duration::from_secs(60))
    })
    .await;
    let r = unique("minimum");
    let probe = Probe::default();
    let _guard = probe.install();
    let holder = redlock.acquire(r.as_str(), LONG).await.unwrap();
    let token = holder.token().to_string();
    let waiter = {
        let (redlock, r) = (redlock.clone(), r.clone());
        let options = fredlock::AcquireOptions::new().hold_at_least(Duration::from_millis(1));
        tokio::spawn(async move { redlock.acquire_using(r.as_str(), LONG, &options).await })
    };
    parked(&probe, 0).await;
    holder.release().await.unwrap();
    let lock = tokio::time::timeout(SOON, waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    assert_ne!(lock.token(), token);
    lock.release().await.unwrap();
    redlock.close().await;
}

/// Local tasks of one Redlock churning on a key (each acquire, a 1 ms hold, release) while a
/// waiter of another process (a Redlock on a runtime of its own) asks for it: how long that
/// waiter waits, or `None` if it was still waiting when the churn ended after `churn`.
async fn foreign_wait(window: Duration, churn: Duration) -> Option<Duration> {
    const TASKS: usize = 4;
    const TTL_LONG: Duration = Duration::from_secs(600);
    let nodes = LocalNodes::start(3).await.unwrap();
    let fast = Retry {
        attempts: u32::MAX,
        delay: Duration::from_secs(10),
        jitter: Duration::ZERO,
    };
    let redlock = build(nodes.urls(), |b| b.retry(fast).handover_window(window)).await;
    let r = unique("foreign");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let turns = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (redlock, r, stop, turns) = (redlock.clone(), r.clone(), stop.clone(), turns.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let lock = redlock.acquire(r.as_str(), TTL_LONG).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                lock.release().await.unwrap();
                turns.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // The churn is under way before the foreign waiter asks.
    assert!(eventually(SOON, || async { turns.load(Ordering::SeqCst) >= 20 }).await);
    let asked = std::time::Instant::now();
    let remote = RemoteWaiter::start(nodes.urls(), r.clone());
    let got = tokio::task::spawn_blocking(move || {
        let got = remote.got.recv_timeout(churn).ok();
        let _ = remote.release.send(());
        got.map(|_| asked.elapsed())
    })
    .await
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    redlock.close().await;
    got
}

/// The window bounds how long one process keeps a lock among its own waiters: a waiter of
/// another process is served while the local churn goes on (within seconds, against a 50 ms
/// window and 1 ms holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_process_is_served_during_local_hand_overs() {
    let waited = foreign_wait(fredlock::config::DEFAULT_HANDOVER_WINDOW, SOON * 2).await;
    assert!(waited.is_some(), "the other process's waiter starved");
}

/// The control of the test above: with a window longer than the churn, local hand-overs keep
/// the lock in the process and the other process's waiter is not served (so the test above
/// can fail). Ignored in `make test`: the chain breaks whenever a release finds none of the
/// local waiters parked (all three between attempts), which a machine busy with the other
/// tests' nodes makes happen now and then (once in the Valkey pass of a `make test`: served
/// after 0.58 s). Run it alone: `cargo test --test handover -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a demonstration that the window bounds the churn; probabilistic under load"]
async fn a_window_longer_than_the_churn_keeps_the_lock_in_the_process() {
    let waited = foreign_wait(Duration::from_secs(3600), Duration::from_secs(3)).await;
    assert_eq!(
        waited, None,
        "served although the window outlasted the churn"
    );
}

/// Waiters of one Redlock queue in the process: 8 tasks cycling on one key (acquire, a 1 ms
/// hold, release) run the gate's scripts a fraction of a time per acquisition, not a line round
/// trip each (a refused attempt that joins the line, then the leave): a waiter that finds
/// another of its Redlock with a place in the line waits behind it in the process, sending
/// nothing, and is handed the lock from there. Never two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_redlock_queue_in_the_process() {
    const TASKS: usize = 8;
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let r = unique("in-process");
    let inside = Arc::new(AtomicUsize::new(0));
    let cycle = |rounds: usize| {
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (redlock, r, inside) = (redlock.clone(), r.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release().await.unwrap();
                }
            }));
        }
        async move {
            for t in tasks {
                t.await.unwrap();
            }
        }
    };
    // Warm-up: connections, scripts, the key marked contended.
    cycle(5).await;
    for i in 0..3 {
        nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
    }
    const ROUNDS: usize = 40;
    cycle(ROUNDS).await;
    let scripts = (0..3).map(|i| script_calls(&nodes, i));
    let scripts: u64 = futures::future::join_all(scripts).await.into_iter().sum();
    let per = scripts as f64 / (TASKS * ROUNDS) as f64;
    // Measured: about 0.5 (a waiter joining the line and leaving it once per turn of the
    // eight, a PASS round per hand-over window); 2.1 with every waiter in the line.
    assert!(
        per < 1.0,
        "{scripts} scripts for {} acquisitions",
        TASKS * ROUNDS
    );
    let key = redlock.key(&r);
    assert!(freed_within(&redlock, &key, SOON).await);
    redlock.close().await;
}

/// A waiter queued in the process behind the one with the place is not stranded when that one
/// gives up: it asks the gate itself, joins the line, and is woken by the holder's release (here
/// a holder of another `Redlock`, standing in for another process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_in_the_process_outlives_the_one_with_the_place() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (holder, ours) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b.retry(SLOW)).await,
    );
    let r = unique("stranded");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let briefly = fredlock::AcquireOptions::new().wait(Duration::from_millis(800));
    let first = tokio::spawn({
        let (ours, r) = (ours.clone(), r.clone());
        async move { ours.acquire_using(r.as_str(), TTL, &briefly).await }
    });
    assert!(
        line_has(&nodes, &ours, &r, 1).await,
        "the first waiter has a place"
    );
    let second = tokio::spawn({
        let (ours, r) = (ours.clone(), r.clone());
        async move { ours.acquire(r.as_str(), TTL).await }
    });
    let gave_up = first.await.unwrap();
    assert!(gave_up.is_err(), "the first waiter gives up: {gave_up:?}");
    assert!(
        line_has(&nodes, &ours, &r, 1).await,
        "the second waiter took a place of its own: {:?}",
        line_members(&nodes, &ours, &r).await
    );
    held.release().await.unwrap();
    let lock = tokio::time::timeout(SOON, second)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
    holder.close().await;
    ours.close().await;
}
