//! The read-write property under a partition, with its negative control. A reader reaches only
//! node 2 and a writer only nodes 0 and 1: the strawman that counts readers per node without a
//! quorum admits both at once, and the checker reports it (the control: the check can see a
//! violation). fredlock's read-write lock under the same views, and under views where a reader
//! and a writer share a node, never admits both.

mod common;

use std::time::Duration;

use common::unique;
use fredlock::Redlock;
use fredlock_testkit::checker::{Checker, GrantKind, GrantRecord, ViolationKind};
use fredlock_testkit::strawman::NaiveRwLock;
use fredlock_testkit::{FaultProxy, LocalNodes};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

/// Records a grant the caller got at `granted_at`, valid for TTL, as a read or the write.
fn record(checker: &Checker, client: usize, name: &str, write: bool, granted_at: Instant) -> u64 {
    let id = checker.record_grant(GrantRecord {
        client,
        kind: if write {
            GrantKind::Write
        } else {
            GrantKind::Read
        },
        token: format!("{name}-{client}"),
        resources: vec![format!("{name}:{client}")],
        ttl: TTL,
        t0: Some(granted_at),
        granted_at,
        deadline: granted_at + checker.validity(TTL),
    });
    checker.rw_grant(id, name, write);
    id
}

async fn partitioned(nodes: &LocalNodes, view: &[usize], proxies: &mut Vec<FaultProxy>) -> Redlock {
    let mine = FaultProxy::partition(nodes, view).await.expect("proxies");
    let urls: Vec<String> = mine.iter().map(FaultProxy::url).collect();
    proxies.extend(mine);
    Redlock::builder()
        .nodes(urls)
        .retry(common::retry(3, 5, 5))
        .connect_wait(Duration::from_millis(300))
        .build()
        .await
        .expect("build")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_reader_counts_let_a_writer_in_and_quorum_readers_do_not() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let direct = Redlock::builder()
        .nodes(nodes.urls())
        .build()
        .await
        .expect("build");
    let clients = |view: &[usize]| -> Vec<_> {
        view.iter()
            .map(|&i| direct.client(i).expect("node").clone())
            .collect()
    };

    // The control: the strawman admits a reader (node 2) and a writer (nodes 0, 1) at once.
    let control = Checker::new(0.01);
    let name = unique("naive-rw");
    let naive = NaiveRwLock::new(&name, TTL);
    assert!(
        naive.read(&clients(&[2]), "reader").await,
        "the reader is counted on node 2"
    );
    let r = record(&control, 0, &name, false, Instant::now());
    assert!(
        naive.write(&clients(&[0, 1]), 3, "writer").await,
        "nodes 0 and 1 count no reader"
    );
    let w = record(&control, 1, &name, true, Instant::now());
    let end = Instant::now();
    control.close(r, end, end + TTL);
    control.close(w, end, end + TTL);
    let report = control.finish(&Default::default());
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::RwOverlap),
        "the checker missed the strawman's overlap: {:#?}",
        report.violations
    );

    // fredlock, same views: the reader cannot get a quorum, the writer can.
    let checker = Checker::new(0.01);
    let name = unique("rw");
    let mut proxies = Vec::new();
    let reader_view = partitioned(&nodes, &[2], &mut proxies).await;
    let writer_view = partitioned(&nodes, &[0, 1], &mut proxies).await;
    let mut held = Vec::new();
    if let Ok(r) = reader_view
        .rwlock(name.clone())
        .expect("rwlock")
        .read(TTL)
        .await
    {
        let id = record(&checker, 0, &name, false, Instant::now());
        held.push((id, r.into_lock()));
    }
    if let Ok(w) = writer_view
        .rwlock(name.clone())
        .expect("rwlock")
        .write(TTL)
        .await
    {
        let id = record(&checker, 1, &name, true, Instant::now());
        held.push((id, w.into_lock()));
    }
    assert_eq!(held.len(), 1, "exactly the writer gets in");
    for (id, lock) in held.drain(..) {
        checker.close(id, Instant::now(), lock.deadline());
        lock.release().await.expect("release");
    }

    // Views that share node 1: a reader on {1, 2} first, then a writer on {0, 1}.
    let name = unique("rw-shared");
    let reader_view = partitioned(&nodes, &[1, 2], &mut proxies).await;
    let r = reader_view
        .rwlock(name.clone())
        .expect("rwlock")
        .read(TTL)
        .await
        .expect("read");
    let rid = record(&checker, 2, &name, false, Instant::now());
    let writer = writer_view
        .rwlock(name.clone())
        .expect("rwlock")
        .write(TTL)
        .await;
    assert!(
        writer.is_err(),
        "a writer got in beside a reader it shares node 1 with"
    );
    checker.close(rid, Instant::now(), r.deadline());
    r.release().await.expect("release");
    let report = checker.finish(&Default::default());
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}
