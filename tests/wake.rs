//! Waiters woken by release, not by polling (`Builder::wake_on_release`, on by default).
//!
//! Each test gives its waiters a retry pause far longer than the test's bound (a fallback timer
//! of 4 pauses longer still), so an acquire that returns within the bound was woken by the
//! release, never by its timer; where the timer is the feature (an expired holder, a lost
//! message), the bound is the fallback's, with wide margins.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use fredlock::Retry;
use fredlock_testkit::{Fault, FaultProxy, LocalNodes, RespValue};
use tokio::time::Instant;
use tracing_subscriber::layer::SubscriberExt;

const TTL: Duration = Duration::from_secs(30);
/// Far longer than any bound below: a waiter acquiring within a bound was woken.
const SLOW: Retry = Retry {
    attempts: u32::MAX,
    delay: Duration::from_secs(10),
    jitter: Duration::ZERO,
};
/// A woken waiter acquires well within this (loopback round trips, a loaded CI machine).
const WOKEN: Duration = Duration::from_secs(3);

fn calls(info: &RespValue, command: &str) -> u64 {
    let RespValue::Bulk(Some(text)) = info else {
        return 0;
    };
    let prefix = format!("cmdstat_{command}:calls=");
    String::from_utf8_lossy(text)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Calls of `command` on every node since the last CONFIG RESETSTAT (INFO commandstats).
async fn command_calls(nodes: &LocalNodes, command: &str) -> u64 {
    let mut total = 0;
    for i in 0..nodes.len() {
        total += calls(
            &nodes.command(i, &["INFO", "commandstats"]).await.unwrap(),
            command,
        );
    }
    total
}

async fn reset_stats(nodes: &LocalNodes) {
    for i in 0..nodes.len() {
        nodes.command(i, &["CONFIG", "RESETSTAT"]).await.unwrap();
    }
}

/// Subscribers of `channel` on node `i` (PUBSUB NUMSUB).
async fn numsub(nodes: &LocalNodes, i: usize, channel: &str) -> i64 {
    match nodes
        .command(i, &["PUBSUB", "NUMSUB", channel])
        .await
        .unwrap()
    {
        RespValue::Array(Some(v)) => match v.get(1) {
            Some(RespValue::Integer(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether `channel` gets exactly one subscriber on each of `on` within a few seconds.
async fn subscribed(nodes: &LocalNodes, on: &[usize], channel: &str) -> bool {
    eventually(Duration::from_secs(5), || async {
        for &i in on {
            if numsub(nodes, i, channel).await != 1 {
                return false;
            }
        }
        true
    })
    .await
}

/// Pub/sub client connections on node `i` (CLIENT LIST TYPE pubsub).
async fn pubsub_clients(nodes: &LocalNodes, i: usize) -> usize {
    match nodes
        .command(i, &["CLIENT", "LIST", "TYPE", "pubsub"])
        .await
        .unwrap()
    {
        RespValue::Bulk(Some(text)) => String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count(),
        _ => 0,
    }
}

/// A function to run on the first event with a message.
type Hook = (String, Box<dyn FnOnce() + Send>);

/// Counts fredlock's retry-loop events by message, and runs a hook on the first event with a
/// given message (synchronously, on the thread that emitted it: exactly between two steps).
#[derive(Clone, Default)]
struct Probe {
    counts: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl Probe {
    fn count(&self, message: &str) -> usize {
        self.counts
            .lock()
            .unwrap()
            .get(message)
            .copied()
            .unwrap_or(0)
    }
    fn on_first(&self, message: &str, f: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some((message.to_string(), Box::new(f)));
    }
    /// Installs the probe for this thread (use a current-thread runtime: every task runs here).
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::registry().with(self.clone());
        let guard = tracing::subscriber::set_default(subscriber);
        // Other tests of this binary may have hit fredlock's callsites first, with no
        // subscriber: make them ask again, or this probe may never see its events.
        tracing::callsite::rebuild_interest_cache();
        guard
    }
}

struct Message(Option<String>);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Probe {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("fredlock") {
            return;
        }
        let mut m = Message(None);
        event.record(&mut m);
        let Some(message) = m.0 else {
            return;
        };
        *self
            .counts
            .lock()
            .unwrap()
            .entry(message.clone())
            .or_default() += 1;
        let hook = {
            let mut hook = self.hook.lock().unwrap();
            match hook.as_ref() {
                Some((on, _)) if *on == message => hook.take(),
                _ => None,
            }
        };
        if let Some((_, f)) = hook {
            f();
        }
    }
}

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

/// A release in another process wakes a waiter through the nodes' messages, long before its
/// timer would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_elsewhere_wakes_a_waiter() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (holder, waiter) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b.retry(SLOW)).await,
    );
    let (r, key) = resource(&holder, "elsewhere");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    let t = Instant::now();
    held.release().await.unwrap();
    let lock = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < WOKEN);
    lock.release().await.unwrap();
}

/// No thundering herd: with 6 waiters of one Redlock on one key, each release makes exactly one
/// attempt (3 SETs, one per node), which gets the lock; nobody else retries. And all the waiters
/// share ONE subscriber connection per node.
#[tokio::test]
async fn each_release_wakes_exactly_one_waiter() {
    const WAITERS: usize = 6;
    let nodes = LocalNodes::start(3).await.unwrap();
    let probe = Probe::default();
    let _guard = probe.install();
    let redlock = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let (r, key) = resource(&redlock, "herd");
    let first = redlock.acquire(r.as_str(), TTL).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let (redlock, r, tx) = (redlock.clone(), r.clone(), tx.clone());
        tokio::spawn(async move {
            let lock = redlock.acquire(r.as_str(), TTL).await.unwrap();
            tx.send(lock).unwrap();
        });
    }
    // Every waiter is waiting (each says so once it stops attempting).
    assert!(
        eventually(Duration::from_secs(5), || async {
            probe.count("waiting") >= WAITERS
        })
        .await,
        "{} waiting",
        probe.count("waiting")
    );
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    for i in 0..3 {
        assert_eq!(
            pubsub_clients(&nodes, i).await,
            1,
            "one subscriber per node"
        );
    }
    reset_stats(&nodes).await;
    let failed_before = probe.count("attempt failed");
    let mut lock = first;
    for n in 1..=WAITERS {
        lock.release().await.unwrap();
        lock = tokio::time::timeout(WOKEN, rx.recv())
            .await
            .expect("a waiter woken")
            .unwrap();
        assert_eq!(
            command_calls(&nodes, "set").await,
            3 * n as u64,
            "release {n}: one attempt, on 3 nodes (events: {:?})",
            probe.counts.lock().unwrap()
        );
    }
    assert_eq!(
        probe.count("attempt failed"),
        failed_before,
        "no woken waiter lost"
    );
    lock.release().await.unwrap();
    redlock.close().await;
}

/// A holder that crashed sends no message: its key expires, and a waiter subscribed to it
/// notices within its fallback bound (4 pauses after the expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_is_noticed_within_the_fallback_bound() {
    let pause = Duration::from_millis(100);
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let waiter = build(nodes.urls(), |b| {
        b.retry(Retry {
            attempts: u32::MAX,
            delay: pause,
            jitter: Duration::ZERO,
        })
    })
    .await;
    let (r, key) = resource(&holder, "expired");
    let ttl = Duration::from_millis(500);
    let t = Instant::now();
    // A crash: never released, never extended.
    std::mem::forget(holder.acquire(r.as_str(), ttl).await.unwrap());
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    let bound = ttl + pause * fredlock::FALLBACK_FACTOR + Duration::from_secs(2);
    let lock = tokio::time::timeout(bound, task)
        .await
        .expect("noticed within the fallback bound")
        .unwrap()
        .unwrap();
    assert!(
        t.elapsed() >= ttl - Duration::from_millis(50),
        "{:?}",
        t.elapsed()
    );
    lock.release().await.unwrap();
}

/// A LOST wake-up: the release publishes nothing (a client with wake-ups off): the waiter still
/// acquires, on its fallback timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_publishes_nothing_is_noticed_by_the_fallback() {
    let pause = Duration::from_millis(100);
    let nodes = LocalNodes::start(3).await.unwrap();
    let silent = build(nodes.urls(), |b| b.wake_on_release(false)).await;
    let waiter = build(nodes.urls(), |b| {
        b.retry(Retry {
            attempts: u32::MAX,
            delay: pause,
            jitter: Duration::ZERO,
        })
    })
    .await;
    let (r, key) = resource(&silent, "silent-release");
    let held = silent.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    reset_stats(&nodes).await;
    held.release().await.unwrap();
    assert_eq!(command_calls(&nodes, "publish").await, 0);
    let bound = pause * fredlock::FALLBACK_FACTOR + Duration::from_secs(2);
    let lock = tokio::time::timeout(bound, task)
        .await
        .expect("acquired on the fallback timer")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
}

/// A LOST wake-up: the subscriber connections are killed (CLIENT KILL TYPE pubsub) and the
/// release lands while they reconnect. The waiter still acquires (woken when the subscriptions
/// are back, or by its fallback timer), and the subscriptions come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_subscriber_connections_do_not_strand_waiters() {
    let pause = Duration::from_millis(200);
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let waiter = build(nodes.urls(), |b| {
        b.retry(Retry {
            attempts: u32::MAX,
            delay: pause,
            jitter: Duration::ZERO,
        })
    })
    .await;
    let (r, key) = resource(&holder, "killed-subscriber");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    for i in 0..3 {
        nodes
            .command(i, &["CLIENT", "KILL", "TYPE", "pubsub"])
            .await
            .unwrap();
    }
    held.release().await.unwrap();
    let bound = pause * fredlock::FALLBACK_FACTOR + Duration::from_secs(3);
    let lock = tokio::time::timeout(bound, task)
        .await
        .expect("acquired despite the lost message")
        .unwrap()
        .unwrap();
    // The subscriber connections came back and subscribed again (the channel lingers after
    // its last waiter left, and the holder's Redlock never subscribed).
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await, "resubscribed");
    lock.release().await.unwrap();
}

/// A LOST wake-up: every connection of the waiter (commands and subscriber) goes through a proxy
/// that resets them while the release lands. The waiter reconnects and still acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_resetting_the_waiter_during_the_release_does_not_strand_it() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let (proxies, waiter) = behind_proxies(&nodes, |b| {
        b.retry(Retry {
            attempts: u32::MAX,
            delay: Duration::from_millis(200),
            jitter: Duration::ZERO,
        })
    })
    .await;
    let (r, key) = resource(&holder, "proxy-reset");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1, 2], &key).await);
    for p in &proxies {
        p.set(Fault::Reset);
    }
    held.release().await.unwrap();
    for p in &proxies {
        p.set(Fault::Pass);
    }
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("acquired after the reset")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
}

/// A node partitioned from the waiter (its commands and its subscriber connection reset) blocks
/// nothing: the other two nodes' messages wake it, and their votes make the quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_does_not_block_wake_ups() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let proxy = FaultProxy::start(nodes.addr(2)).await.unwrap();
    proxy.set(Fault::Reset);
    let mut urls = nodes.urls();
    urls[2] = proxy.url();
    let waiter = build(urls, |b| b.retry(SLOW)).await;
    let (r, key) = resource(&holder, "partitioned");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(subscribed(&nodes, &[0, 1], &key).await);
    held.release().await.unwrap();
    let lock = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken although node 2 is partitioned")
        .unwrap()
        .unwrap();
    assert_eq!(lock.redlock().quorum(), 2);
    lock.release().await.ok();
}

/// Every release path wakes a waiter: a dropped `Lock` (background release), a kept-alive
/// lock's release, and a semaphore permit's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_kept_alive_and_permit_releases_wake_waiters() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    let waiter = build(nodes.urls(), |b| b.retry(SLOW)).await;
    let (r, key) = resource(&holder, "paths");
    // Spawns a waiter and returns it once it is subscribed.
    let wait_for = |key: String| {
        let (waiter, r) = (waiter.clone(), r.clone());
        let nodes = &nodes;
        async move {
            let task = tokio::spawn(async move { waiter.acquire(r.as_str(), TTL).await });
            assert!(subscribed(nodes, &[0, 1, 2], &key).await);
            Some(task)
        }
    };
    // Dropped without release().
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = wait_for(key.clone()).await.unwrap();
    drop(held);
    let lock = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken by the drop's release")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
    // Kept alive, then released.
    let guard = holder.acquire(r.as_str(), TTL).await.unwrap().keep_alive();
    let task = wait_for(key.clone()).await.unwrap();
    guard.release().await.unwrap();
    let lock = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken by the keep-alive's release")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
    // A semaphore of 2 permits, both taken: releasing one wakes a semaphore waiter.
    let name = unique("sem");
    let sem = holder.semaphore(name.as_str(), 2).unwrap();
    let a = sem.acquire(TTL).await.unwrap();
    let b = sem.acquire(TTL).await.unwrap();
    let waiting = waiter.semaphore(name.as_str(), 2).unwrap();
    let task = tokio::spawn(async move { waiting.acquire(TTL).await });
    let slot0 = holder.key(&sem.slot_resource(0));
    assert!(subscribed(&nodes, &[0, 1, 2], &slot0).await);
    a.release().await.unwrap();
    let permit = tokio::time::timeout(WOKEN, task)
        .await
        .expect("woken by the permit's release")
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
    b.release().await.unwrap();
}

/// Wake-ups off: releases publish nothing, no subscriber connection is opened, waiters poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_off_is_plain_polling() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let redlock = build(nodes.urls(), |b| b.wake_on_release(false)).await;
    let r = unique("off");
    reset_stats(&nodes).await;
    let held = redlock.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (redlock, r) = (redlock.clone(), r.clone());
        async move {
            redlock
                .acquire_with(r.as_str(), TTL, Duration::from_secs(5))
                .await
        }
    });
    let polled = Arc::new(AtomicUsize::new(0));
    assert!(
        eventually(Duration::from_secs(5), || {
            let polled = polled.clone();
            let nodes = &nodes;
            async move {
                polled.store(command_calls(nodes, "set").await as usize, Ordering::SeqCst);
                polled.load(Ordering::SeqCst) >= 6
            }
        })
        .await,
        "the waiter polls"
    );
    held.release().await.unwrap();
    task.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(command_calls(&nodes, "publish").await, 0);
    for i in 0..3 {
        assert_eq!(pubsub_clients(&nodes, i).await, 0);
    }
}

/// With wake-ups, `attempts` is a budget of waiting time: `attempts - 1` pauses, as with
/// polling, not `attempts - 1` fallback timers (4 pauses each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempts_budget_is_the_polling_schedule_s_time() {
    let pause = Duration::from_millis(100);
    let env = env_with(3, |b| {
        b.retry(Retry {
            attempts: 4,
            delay: pause,
            jitter: Duration::ZERO,
        })
    })
    .await;
    let r = unique("budget");
    let held = env.redlock.acquire(r.as_str(), TTL).await.unwrap();
    let t = Instant::now();
    let err = env.redlock.acquire(r.as_str(), TTL).await.unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, fredlock::Error::Contended { .. }), "{err:?}");
    assert!(took >= pause * 3, "{took:?}");
    assert!(took < pause * 3 + Duration::from_secs(2), "{took:?}");
    held.release().await.unwrap();
}

/// The subscriber keeps each node's configuration (password included) to connect with: a
/// Redlock's `Debug` still shows no credentials.
#[tokio::test]
async fn debug_output_shows_no_credentials() {
    let redlock = fredlock::Redlock::builder()
        .nodes(["redis://user:hunter2@127.0.0.1:1"])
        .connect_wait(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let shown = format!("{redlock:?}");
    assert!(shown.contains("Subscribers"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}
