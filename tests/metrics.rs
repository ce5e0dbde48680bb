//! The `metrics` feature: each documented counter, histogram and gauge moves when its event
//! happens against real nodes (a grant, contention, an outage, extensions, a lost kept-alive
//! lock, a waiter, a node failure, a usable node), read back through a debugging recorder.
//!
//! One test: the recorder is process-wide.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{del, eventually, local_with, resource, retry};
use fredlock::{Lock, LostReason, Redlock};
use fredlock_testkit::LocalNodes;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

const TTL: Duration = Duration::from_secs(10);

/// Reads the recorder. Counters and gauges are read as they are; histograms are drained by each
/// snapshot (every series seen so far is in every snapshot), so their sample counts are added
/// up here.
struct Reader {
    snapshotter: Snapshotter,
    samples: Mutex<HashMap<String, f64>>,
}

impl Reader {
    /// The value of metric `name` with the label `label` (or any labels when `None`), summed
    /// over the matching series: counters and gauges as numbers, histograms as sample counts.
    fn value(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        let mut samples = self.samples.lock().unwrap();
        let mut current: HashMap<String, f64> = HashMap::new();
        let mut matching = Vec::new();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let id = format!("{key:?}");
            let v = match (key.kind(), value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => n as f64,
                (MetricKind::Gauge, DebugValue::Gauge(g)) => g.into_inner(),
                (MetricKind::Histogram, DebugValue::Histogram(xs)) => {
                    let total = samples.entry(id.clone()).or_default();
                    *total += xs.len() as f64;
                    *total
                }
                (kind, value) => panic!("{name}: unexpected {kind:?} {value:?}"),
            };
            current.insert(id.clone(), v);
            let named = key.key().name() == name;
            let labelled = label
                .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v));
            if named && labelled {
                matching.push(id);
            }
        }
        matching.iter().map(|id| current[id]).sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_metric_moves_with_its_event() {
    let recorder = DebuggingRecorder::new();
    let reader = Reader {
        snapshotter: recorder.snapshotter(),
        samples: Mutex::default(),
    };
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let (mut nodes, redlock) = local_with(3, |b| {
        b.retry(retry(3, 5, 5))
            .node_timeout(Duration::from_millis(200))
    })
    .await;
    let (next, key) = grant_contention_and_a_waiter(&reader, &redlock).await;
    a_lost_lock(&reader, &redlock, next, &key).await;
    let r2 = two_nodes_down(&reader, &mut nodes, &redlock).await;
    refused_credentials(&reader).await;
    // Invalid input is its own outcome.
    redlock
        .acquire(r2.as_str(), Duration::ZERO)
        .await
        .expect_err("a zero TTL");
    assert_eq!(
        reader.value("fredlock_acquire_total", Some(("outcome", "invalid"))),
        1.0
    );
}

/// A grant, an extension, contention, a waiter that acquires once the lock is released:
/// attempts, outcomes, latency, hold time, the waiters' gauge. Returns the waiter's lock and
/// the resource's key.
async fn grant_contention_and_a_waiter(reader: &Reader, redlock: &Redlock) -> (Lock, String) {
    let m = |name: &str, label: Option<(&str, &str)>| reader.value(name, label);
    let (r, key) = resource(redlock, "metrics");
    let mut lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    assert_eq!(
        m("fredlock_acquire_total", Some(("outcome", "granted"))),
        1.0
    );
    assert_eq!(
        m("fredlock_acquire_seconds", Some(("outcome", "granted"))),
        1.0
    );
    assert_eq!(m("fredlock_acquire_attempts_total", None), 1.0);
    lock.extend(TTL).await.expect("extend");
    assert_eq!(m("fredlock_extensions_total", Some(("outcome", "ok"))), 1.0);
    // A node that lost the key gets it back at the next extension (healing).
    del(redlock, 2, &key).await;
    lock.extend(TTL).await.expect("extend");
    let repaired = eventually(Duration::from_secs(5), || async {
        m("fredlock_repairs_total", Some(("outcome", "set"))) == 1.0
    })
    .await;
    assert!(repaired, "no repair counted");

    // Contention: a try_acquire meets the holder.
    assert!(redlock
        .try_acquire(r.as_str(), TTL)
        .await
        .expect("try")
        .is_none());
    assert_eq!(
        m("fredlock_acquire_total", Some(("outcome", "contended"))),
        1.0
    );

    // A waiter shows in the gauge while it waits, and leaves it when it acquires.
    let waiter = tokio::spawn({
        let redlock = redlock.clone();
        let r = r.clone();
        async move {
            redlock
                .acquire_with(r.as_str(), TTL, Duration::from_secs(10))
                .await
        }
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            m("fredlock_waiters", None) >= 1.0
        })
        .await,
        "no waiter counted"
    );
    assert_eq!(m("fredlock_hold_seconds", None), 0.0);
    lock.release().await.expect("release");
    assert_eq!(m("fredlock_hold_seconds", None), 1.0);
    let next = waiter.await.expect("task").expect("the waiter acquires");
    assert_eq!(m("fredlock_waiters", None), 0.0);
    assert!(m("fredlock_acquire_attempts_total", None) >= 3.0);
    (next, key)
}

/// A kept-alive lock whose keys vanish: lost, with its reason.
async fn a_lost_lock(reader: &Reader, redlock: &Redlock, next: Lock, key: &str) {
    let m = |name: &str, label: Option<(&str, &str)>| reader.value(name, label);
    let guard = next.keep_alive();
    for i in 0..3 {
        del(redlock, i, key).await;
    }
    let reason = tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("lost within a TTL");
    assert_eq!(reason, LostReason::TokenGone);
    assert_eq!(
        m("fredlock_lost_total", Some(("reason", "token_gone"))),
        1.0
    );
    assert!(m("fredlock_extensions_total", Some(("outcome", "failed"))) >= 1.0);
    drop(guard);
}

/// Two nodes down: unavailable, and each dead node's failures are counted by node and kind;
/// usable nodes are counted while they are up. Returns a resource name to use next.
async fn two_nodes_down(reader: &Reader, nodes: &mut LocalNodes, redlock: &Redlock) -> String {
    let m = |name: &str, label: Option<(&str, &str)>| reader.value(name, label);
    nodes.kill(1).expect("kill");
    nodes.kill(2).expect("kill");
    let (r2, _) = resource(redlock, "metrics-down");
    redlock
        .acquire(r2.as_str(), TTL)
        .await
        .expect_err("no quorum");
    assert_eq!(
        m("fredlock_acquire_total", Some(("outcome", "unavailable"))),
        1.0
    );
    let names = redlock.node_names();
    for dead in [&names[1], &names[2]] {
        assert!(
            m("fredlock_node_failures_total", Some(("node", dead))) >= 1.0,
            "{dead}: no failure counted"
        );
    }
    assert_eq!(
        m("fredlock_node_failures_total", Some(("node", &names[0]))),
        0.0
    );
    // Usable nodes: every node counted while it was up; the two killed ones stop counting.
    assert_eq!(m("fredlock_node_usable", Some(("node", &names[0]))), 1.0);
    for dead in [&names[1], &names[2]] {
        assert!(
            eventually(Duration::from_secs(5), || async {
                m("fredlock_node_usable", Some(("node", dead))) == 0.0
            })
            .await,
            "{dead}: still counted as usable"
        );
    }
    r2
}

/// A node that refuses our credentials never counts as usable.
async fn refused_credentials(reader: &Reader) {
    let m = |name: &str, label: Option<(&str, &str)>| reader.value(name, label);
    let fleet = LocalNodes::start(3).await.expect("nodes");
    fleet
        .command(2, &["CONFIG", "SET", "requirepass", "metrics-secret"])
        .await
        .expect("requirepass");
    let other = common::build(fleet.urls(), |b| b).await;
    let on = other.node_names();
    assert!(
        eventually(Duration::from_secs(5), || async {
            m("fredlock_node_usable", Some(("node", &on[0]))) == 1.0
                && m("fredlock_node_usable", Some(("node", &on[1]))) == 1.0
                && m("fredlock_node_usable", Some(("node", &on[2]))) == 0.0
        })
        .await,
        "usable: {} {} {}",
        m("fredlock_node_usable", Some(("node", &on[0]))),
        m("fredlock_node_usable", Some(("node", &on[1]))),
        m("fredlock_node_usable", Some(("node", &on[2])))
    );
    other.close().await;
}
