//! The quorum read-write lock against real nodes: readers share, a writer excludes everyone,
//! a waiting writer keeps new readers out, a dead reader frees its share within its own TTL,
//! a node down changes nothing, and many concurrent readers and writers never overlap (the
//! checker's read-write property; its negative control is in `rwlock_partition.rs`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use fredlock::{Error, HeldBy, InvalidInput};
use fredlock_testkit::checker::{Checker, GrantKind, ViolationKind};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn readers_share_and_a_writer_is_alone() {
    let env = env_with(3, |b| b.fencing_tokens(true)).await;
    let rw = env.redlock.rwlock(unique("rw")).expect("rwlock");
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(
            rw.try_read(10 * SECOND)
                .await
                .expect("try_read")
                .expect("shared"),
        );
    }
    let seen = rw.inspect().await.expect("inspect");
    assert_eq!(seen.readers(), 3);
    assert!(seen.writer().is_none());
    assert!(
        rw.try_write(10 * SECOND)
            .await
            .expect("try_write")
            .is_none(),
        "a writer among readers"
    );
    // try_write removed its waiting mark: readers still get in.
    let extra = rw.try_read(10 * SECOND).await.expect("try_read");
    assert!(extra.is_some(), "a failed try_write left readers blocked");
    for r in readers.into_iter().chain(extra) {
        r.release().await.expect("release");
    }
    let w = rw
        .try_write(10 * SECOND)
        .await
        .expect("try_write")
        .expect("free");
    let first = w.fencing_token().expect("fencing");
    assert!(
        rw.try_read(10 * SECOND).await.expect("try_read").is_none(),
        "a reader with a writer"
    );
    assert!(
        rw.try_write(10 * SECOND)
            .await
            .expect("try_write")
            .is_none(),
        "two writers"
    );
    assert_eq!(
        rw.inspect()
            .await
            .expect("inspect")
            .writer()
            .map(|h| h.fingerprint.clone()),
        Some(w.fingerprint())
    );
    w.release().await.expect("release");
    let w2 = rw.write(10 * SECOND).await.expect("write");
    assert!(w2.fencing_token().expect("fencing") > first);
    w2.release().await.expect("release");
}

/// A refused acquire says who was in the way: a writer refused by readers says readers hold
/// the lock (it used to say only "held by someone else"), a writer refused by a writer says a
/// writer, a reader says a writer holds or waits for it.
#[tokio::test]
async fn a_refusal_says_whether_readers_or_a_writer_hold_it() {
    let env = env(3).await;
    let rw = env.redlock.rwlock(unique("rw-who")).expect("rwlock");
    let held_by = |r: Result<_, Error>| match r {
        Err(Error::Contended { held_by, .. }) => Some(held_by),
        _ => None,
    };
    let reader = rw.read(10 * SECOND).await.expect("read");
    let refused = rw.write_with(10 * SECOND, Duration::ZERO).await.map(drop);
    let text = refused.as_ref().map_err(ToString::to_string).err();
    assert_eq!(held_by(refused), Some(HeldBy::Readers), "{text:?}");
    assert!(
        text.as_ref().is_some_and(|t| t.contains("held by readers")),
        "{text:?}"
    );
    reader.release().await.expect("release");

    let writer = rw.write(10 * SECOND).await.expect("write");
    let refused = rw.write_with(10 * SECOND, Duration::ZERO).await.map(drop);
    assert_eq!(held_by(refused), Some(HeldBy::Writer));
    let refused = rw.read_with(10 * SECOND, Duration::ZERO).await.map(drop);
    assert_eq!(held_by(refused), Some(HeldBy::WriterHoldsOrWaits));
    writer.release().await.expect("release");

    // A plain lock says someone else.
    let r = unique("plain-who");
    let held = env
        .redlock
        .acquire(r.as_str(), 10 * SECOND)
        .await
        .expect("acquire");
    let refused = env
        .redlock
        .acquire_with(r.as_str(), 10 * SECOND, Duration::ZERO)
        .await
        .map(drop);
    assert_eq!(held_by(refused), Some(HeldBy::SomeoneElse));
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_waiting_writer_keeps_new_readers_out() {
    let env = env_with(3, |b| b.retry(retry(1000, 5, 5))).await;
    let rw = env.redlock.rwlock(unique("rw-pref")).expect("rwlock");
    let reader = rw.read(30 * SECOND).await.expect("read");
    let writer = {
        let rw = rw.clone();
        tokio::spawn(async move { rw.write_with(30 * SECOND, 30 * SECOND).await })
    };
    // The writer's mark appears on a quorum of nodes...
    let marked = eventually(10 * SECOND, || async {
        let seen = rw.inspect().await.expect("inspect");
        seen.nodes
            .iter()
            .filter(|n| n.state.as_ref().is_ok_and(|s| s.writer_waiting))
            .count()
            >= 2
    })
    .await;
    assert!(marked, "the waiting writer left no mark");
    // ...and a new reader is refused although only readers hold the lock.
    assert!(
        rw.try_read(SECOND).await.expect("try_read").is_none(),
        "a reader overtook a waiting writer"
    );
    reader.release().await.expect("release");
    let w = writer
        .await
        .expect("task")
        .expect("the writer gets in once the reader left");
    w.release().await.expect("release");
    // The mark went with it: readers get in at once.
    let r = rw
        .try_read(SECOND)
        .await
        .expect("try_read")
        .expect("free after the writer");
    r.release().await.expect("release");
}

#[tokio::test]
async fn a_dead_reader_frees_its_share_within_its_own_ttl() {
    let env = env_with(3, |b| b.retry(retry(1000, 10, 10))).await;
    let rw = env.redlock.rwlock(unique("rw-dead")).expect("rwlock");
    // A reader that dies (its share is handed to nobody: nothing is released)...
    let dead = rw.read(Duration::from_millis(600)).await.expect("read");
    let died_at = Instant::now();
    drop(dead.into_lock().into_lease());
    // ...while another reader stays, extending its own share.
    let alive = rw.read(2 * SECOND).await.expect("read").keep_alive();
    let gone = eventually(10 * SECOND, || async {
        rw.inspect().await.expect("inspect").readers() == 1
    })
    .await;
    assert!(gone, "the dead reader's share outlived its TTL");
    assert!(
        died_at.elapsed() >= Duration::from_millis(500),
        "gone before its TTL"
    );
    alive.release().await.expect("release");
    let w = rw
        .write_with(10 * SECOND, 10 * SECOND)
        .await
        .expect("write after both readers");
    w.release().await.expect("release");
}

#[tokio::test]
async fn one_node_down_is_no_matter_and_two_are() {
    let (mut nodes, redlock) = local_with(3, |b| b.retry(retry(3, 5, 5))).await;
    let rw = redlock.rwlock(unique("rw-down")).expect("rwlock");
    nodes.kill(2).expect("kill");
    let r = rw.read(10 * SECOND).await.expect("read with two of three");
    r.release().await.expect("release");
    let w = rw
        .write(10 * SECOND)
        .await
        .expect("write with two of three");
    w.release().await.expect("release");
    nodes.kill(1).expect("kill");
    let err = rw.read(10 * SECOND).await.expect_err("one of three");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let err = rw.write(10 * SECOND).await.expect_err("one of three");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn bad_names_are_typed_errors() {
    let env = env(3).await;
    assert!(matches!(
        env.redlock.rwlock(""),
        Err(Error::InvalidInput(InvalidInput::EmptyResource))
    ));
    assert!(matches!(
        env.redlock.rwlock("~x"),
        Err(Error::InvalidInput(InvalidInput::ReservedResource(_)))
    ));
    let rw = env.redlock.rwlock(unique("rw-ttl")).expect("rwlock");
    assert!(matches!(
        rw.read(Duration::ZERO).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        rw.write(Duration::MAX).await,
        Err(Error::InvalidInput(_))
    ));
}

/// 12 readers and 2 writers hammer one lock; every window goes to the checker, which finds
/// no writer overlapping anyone, while readers did overlap each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_and_writers_never_overlap() {
    let env = env_with(3, |b| b.retry(retry(100_000, 2, 3))).await;
    let rw = env.redlock.rwlock(unique("rw-many")).expect("rwlock");
    let checker = Arc::new(Checker::new(0.01));
    // Readers in at once, and the most seen: readers must really share.
    let inside = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for client in 0..14 {
        let (rw, checker, inside) = (rw.clone(), checker.clone(), inside.clone());
        let write = client < 2;
        tasks.push(tokio::spawn(async move {
            for _ in 0..if write { 5 } else { 10 } {
                let wait = 60 * SECOND;
                let lock = if write {
                    rw.write_with(2 * SECOND, wait)
                        .await
                        .expect("write")
                        .into_lock()
                } else {
                    rw.read_with(2 * SECOND, wait)
                        .await
                        .expect("read")
                        .into_lock()
                };
                let kind = if write {
                    GrantKind::Write
                } else {
                    GrantKind::Read
                };
                let id = checker.grant(client, &lock, kind, Instant::now());
                checker.rw_grant(id, rw.name(), write);
                if !write {
                    let now = inside.0.fetch_add(1, Ordering::SeqCst) + 1;
                    inside.1.fetch_max(now, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(if write { 5 } else { 20 })).await;
                if !write {
                    inside.0.fetch_sub(1, Ordering::SeqCst);
                }
                checker.close(id, Instant::now(), lock.deadline());
                lock.release().await.expect("release while held");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let report = checker.finish(&Default::default());
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.grants, 2 * 5 + 12 * 10);
    assert!(
        !report
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::RwOverlap),
        "read-write property"
    );
    assert!(
        inside.1.load(Ordering::SeqCst) > 1,
        "readers never shared the lock"
    );
}

#[tokio::test]
async fn a_writer_downgrades_to_a_reader_without_a_gap() {
    let env = env(3).await;
    let rw = env.redlock.rwlock(unique("rw-down")).expect("rwlock");
    let w = rw.write(10 * SECOND).await.expect("write");
    let r = w.downgrade(10 * SECOND).await.expect("downgrade");
    let seen = rw.inspect().await.expect("inspect");
    assert!(seen.writer().is_none(), "the writer key is gone");
    assert_eq!(seen.readers(), 1, "the downgraded share is there");
    // A share, not a write lock: readers join, writers wait.
    let other = rw
        .try_read(10 * SECOND)
        .await
        .expect("try_read")
        .expect("readers join");
    assert!(
        rw.try_write(SECOND).await.expect("try_write").is_none(),
        "a writer beside readers"
    );
    other.release().await.expect("release");
    r.release().await.expect("release the downgraded share");
    let w = rw
        .try_write(SECOND)
        .await
        .expect("try_write")
        .expect("free again");
    // A writer that lost its lock cannot downgrade: nothing is left behind.
    let key = env.redlock.key(&w.lock().resources()[0]);
    for i in 0..3 {
        del(&env.redlock, i, &key).await;
    }
    let err = w.downgrade(10 * SECOND).await.expect_err("not held");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    assert_eq!(rw.inspect().await.expect("inspect").readers(), 0);
}
