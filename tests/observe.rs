//! Observers: who leads, pushed by the nodes (not polled), right again after a subscriber
//! reconnect and after a lost message, and silent while nothing changes. Against real nodes.

mod common;

use std::time::Duration;

use fredlock::{ElectOptions, Leader, Observer, Redlock, Retry};
use fredlock_testkit::{Fault, LocalNodes};
use tokio::sync::watch;
use tokio::time::Instant;

const RETRY: Retry = common::retry(3, 20, 20);
/// Long enough that an observer's read at the term's expiry cannot explain a change it shows
/// within the bounds of the tests that rely on messages.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Waits up to `within` for the observer to show a leader satisfying `want`.
async fn shows(
    rx: &mut watch::Receiver<Option<Leader>>,
    within: Duration,
    want: impl Fn(&Option<Leader>) -> bool,
) -> bool {
    tokio::time::timeout(within, rx.wait_for(|l| want(l)))
        .await
        .is_ok_and(|r| r.is_ok())
}

fn value_is(v: &'static str) -> impl Fn(&Option<Leader>) -> bool {
    move |l| l.as_ref().is_some_and(|l| l.value == v)
}

/// A first term, "a", then a proclaim of `proclaimed`: the observer shows both, the term with
/// its number. Returns the leader's election.
async fn first_term_shown(
    redlock: &Redlock,
    resource: &str,
    observer: &Observer,
    rx: &mut watch::Receiver<Option<Leader>>,
    proclaimed: &'static str,
) -> fredlock::Election {
    let a = redlock
        .elect_with_options(resource, LONG_TTL, ElectOptions::default().value("a"))
        .expect("elect");
    let term_a = a.leader().await;
    assert!(
        shows(rx, Duration::from_secs(5), value_is("a")).await,
        "new term not shown"
    );
    assert_eq!(observer.current().map(|l| l.term), Some(term_a.number()));
    a.proclaim(proclaimed).await.expect("proclaim");
    assert!(
        shows(rx, Duration::from_secs(5), value_is(proclaimed)).await,
        "proclaim not shown"
    );
    a
}

/// A next term, "b": the observer shows it with its number; then it resigns and the observer
/// closes.
async fn next_term_shown(
    redlock: &Redlock,
    resource: &str,
    observer: Observer,
    mut rx: watch::Receiver<Option<Leader>>,
) {
    let b = redlock
        .elect_with_options(resource, LONG_TTL, ElectOptions::default().value("b"))
        .expect("elect");
    let term_b = b.leader().await;
    assert!(
        shows(&mut rx, Duration::from_secs(5), value_is("b")).await,
        "next term not shown"
    );
    assert_eq!(observer.current().map(|l| l.term), Some(term_b.number()));
    b.resign().await;
    observer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_pushed_and_an_idle_observer_sends_nothing() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("pushed");
    let observer: Observer = watcher.observe(&resource).await.expect("observe");
    assert_eq!(observer.current(), None);
    let mut rx = observer.watch();
    let a = first_term_shown(&redlock, &resource, &observer, &mut rx, "a2").await;

    // Idle: nothing changes, so nobody sends a script (the leader extends only after 40 s).
    // First let the reads that the change's messages (one per node) set off finish.
    let calls = || futures::future::join_all((0..3).map(|i| common::script_calls(&nodes, i)));
    let mut before = calls().await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = calls().await;
        if now == before {
            break;
        }
        before = now;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = calls().await;
    assert_eq!(before, after, "scripts were sent while nothing changed");

    a.resign().await;
    assert!(
        shows(&mut rx, Duration::from_secs(5), Option::is_none).await,
        "resign not shown"
    );
    next_term_shown(&redlock, &resource, observer, rx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_disappears_within_its_ttl() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, leader) = common::behind_proxies(&nodes, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("killed");
    let ttl = Duration::from_secs(2);
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let a = leader
        .elect_with_options(resource.as_str(), ttl, ElectOptions::default().value("a"))
        .expect("elect");
    a.leader().await;
    assert!(shows(&mut rx, Duration::from_secs(5), value_is("a")).await);
    // As good as killed: nothing it sends arrives, so nothing is published.
    for p in &proxies {
        p.set(Fault::Blackhole);
    }
    let cut = Instant::now();
    // The bound is the feature: gone from the observer within its TTL (+ 700 ms).
    assert!(
        shows(&mut rx, ttl + Duration::from_millis(700), Option::is_none).await,
        "a dead leader was still shown {:?} after it was cut off",
        cut.elapsed()
    );
    println!(
        "dead leader gone from the observer {:?} after the cut",
        cut.elapsed()
    );
    for p in &proxies {
        p.set(Fault::Reset);
        p.set(Fault::Pass);
    }
    a.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_again_after_a_subscriber_reconnect() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let redlock = common::build(nodes.urls(), |b| b.retry(RETRY)).await;
    let (proxies, watcher) = common::behind_proxies(&nodes, |b| b).await;
    let resource = common::unique("reconnect");
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let a = redlock
        .elect_with_options(
            resource.as_str(),
            LONG_TTL,
            ElectOptions::default().value("a"),
        )
        .expect("elect");
    a.leader().await;
    assert!(shows(&mut rx, Duration::from_secs(5), value_is("a")).await);
    // The observer's connections swallow everything: the proclaim's messages are lost.
    for p in &proxies {
        p.set(Fault::Blackhole);
    }
    a.proclaim("b").await.expect("proclaim");
    // Still the old value (it cannot have heard), then the connections drop and come back.
    assert_eq!(observer.current().map(|l| l.value), Some("a".to_string()));
    for p in &proxies {
        p.set(Fault::Reset);
    }
    for p in &proxies {
        p.set(Fault::Pass);
    }
    // Right again after the reconnect, long before the term's expiry read (60 s).
    assert!(
        shows(&mut rx, Duration::from_secs(10), value_is("b")).await,
        "the observer missed the change made while it was disconnected"
    );
    a.resign().await;
    assert!(shows(&mut rx, Duration::from_secs(5), Option::is_none).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_again_after_a_lost_message() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("lost");
    let ttl = Duration::from_secs(2);
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let a = redlock
        .elect_with_options(resource.as_str(), ttl, ElectOptions::default().value("a"))
        .expect("elect");
    a.leader().await;
    assert!(shows(&mut rx, Duration::from_secs(5), value_is("a")).await);
    // A change whose message never comes: written straight into every node's record.
    let record = redlock.election_key(&resource);
    for i in 0..3 {
        common::raw(&redlock, i, &["HSET", &record, "val", "silent", "s", "99"]).await;
    }
    let changed = Instant::now();
    // Read again at the term's expiry time (it is extended meanwhile): within one TTL.
    assert!(
        shows(
            &mut rx,
            ttl + Duration::from_millis(700),
            value_is("silent")
        )
        .await,
        "a change without a message was never picked up"
    );
    println!(
        "silent change seen {:?} after it was made",
        changed.elapsed()
    );
    a.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_and_observers_agree_through_handovers() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("agree");
    let mut observers = Vec::new();
    for _ in 0..4 {
        let r: Redlock = common::build(nodes.urls(), |b| b).await;
        observers.push((r.observe(&resource).await.expect("observe"), r));
    }
    for round in 0..5 {
        let value = format!("node-{round}");
        let e = redlock
            .elect_with_options(
                resource.as_str(),
                LONG_TTL,
                ElectOptions::default().value(value.clone()),
            )
            .expect("elect");
        let term = e.leader().await;
        for (o, _) in &observers {
            let mut rx = o.watch();
            let want = term.number();
            assert!(
                shows(&mut rx, Duration::from_secs(5), move |l| l
                    .as_ref()
                    .is_some_and(|l| l.term == want))
                .await,
                "observer never showed term {want}"
            );
        }
        e.resign().await;
    }
}

/// An observer started while a leader leads: `watch()` hands a receiver that has seen the
/// current leader, so its first `changed()` is the next change, not the value `borrow()`
/// already shows (it used to resolve at once with the same leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_change_is_a_change() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("first-change");
    let a = redlock
        .elect_with_options(
            resource.as_str(),
            LONG_TTL,
            ElectOptions::default().value("a"),
        )
        .expect("elect");
    a.leader().await;
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    assert!(value_is("a")(&rx.borrow()), "{:?}", *rx.borrow());
    assert!(
        !rx.has_changed().expect("observer running"),
        "the first change repeats the leader borrow() shows"
    );
    a.proclaim("a2").await.expect("proclaim");
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("proclaim shown")
        .expect("observer running");
    assert!(value_is("a2")(&rx.borrow_and_update()));
    a.resign().await;
    observer.close().await;
}

/// Each node's message carries its view, so an observer follows claims, proclaims and resigns
/// without reading: here its user may no longer run scripts (every read fails with NOPERM) once
/// it has started, and it still shows every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_reach_observers_without_a_read() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let acl = |rule: &'static str| {
        let nodes = &nodes;
        async move {
            for i in 0..3 {
                let args = [
                    "ACL", "SETUSER", "watcher", "on", ">pw", "~*", "&*", "+@all", rule,
                ];
                let reply = nodes.command(i, &args).await.expect("ACL SETUSER");
                assert!(format!("{reply:?}").contains("OK"), "{reply:?}");
            }
        }
    };
    acl("+@scripting").await;
    let urls = (0..3)
        .map(|i| format!("redis://watcher:pw@127.0.0.1:{}", nodes.port(i)))
        .collect();
    let watcher = common::build(urls, |b| b).await;
    let resource = common::unique("told");
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    acl("-@scripting").await;
    let err = watcher
        .leader_of(&resource)
        .await
        .expect_err("reads refused");
    assert!(err.to_string().contains("NOPERM"), "{err}");

    let a = first_term_shown(&redlock, &resource, &observer, &mut rx, "a:2 ü").await;
    a.resign().await;
    assert!(
        shows(&mut rx, Duration::from_secs(5), Option::is_none).await,
        "resign not shown"
    );
    next_term_shown(&redlock, &resource, observer, rx).await;
}

/// Calls of `command` summed over the nodes, once they stop changing (no call for 300 ms).
async fn settled_calls(nodes: &LocalNodes, command: &str) -> u64 {
    let mut before = common::calls_on_all(nodes, command).await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = common::calls_on_all(nodes, command).await;
        if now == before {
            return now;
        }
        before = now;
    }
}

/// A new observer subscribes once on each node and reads each node once. Before, fred's
/// announcement of the first connection (as a reconnection) made every new observer
/// subscribe again and read everything twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_observer_subscribes_and_reads_once() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("once");
    let a = redlock.elect(resource.as_str(), LONG_TTL).expect("elect");
    a.leader().await;
    let subscribes = settled_calls(&nodes, "subscribe").await;
    // A read of the election runs one HMGET per node (nothing else does while it is idle).
    let reads = settled_calls(&nodes, "hmget").await;
    let observer = watcher.observe(&resource).await.expect("observe");
    assert!(observer.current().is_some(), "the leader is shown");
    assert_eq!(settled_calls(&nodes, "subscribe").await - subscribes, 3);
    assert_eq!(settled_calls(&nodes, "hmget").await - reads, 3);
    observer.close().await;
    a.resign().await;
}

/// Nobody reads while the leader extends: candidates of one priority (their observers only use
/// the leader's priority and requests to yield, which messages bring) and observers alike,
/// because each extension announces the new TTL; the observer's leader stays valid past the
/// first term's TTL all the same. A read of a live term reads its lock's `PTTL` on every node
/// (the extension passes its TTL instead; on the line's gate the head candidate's looks read
/// it too, so the gate is left out): the control is the observer's first read, which moves
/// that count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_reads_while_the_leader_extends() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let other = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("quiet");
    let gate = redlock.line_node(&resource).expect("a gate");
    let reads = || async {
        let mut n = 0;
        for i in (0..3).filter(|&i| i != gate) {
            n += common::command_calls(&nodes, i, "pttl").await;
        }
        n
    };
    let ttl = Duration::from_millis(600);
    let a = redlock.elect(resource.as_str(), ttl).expect("elect");
    a.leader().await;
    let b = other.elect(resource.as_str(), ttl).expect("elect");
    assert!(common::lines::line_has(&nodes, &other, &resource, 1).await);
    let before = reads().await;
    let observer = other.observe(&resource).await.expect("observe");
    let rx = observer.watch();
    let first = rx.borrow().as_ref().map(|l| l.valid_until);
    let first = first.expect("the observer names the leader");
    let started = reads().await;
    assert!(
        started - before >= 2,
        "the observer's first read reads the TTLs"
    );
    // A window of several TTLs: the leader extends a dozen times.
    tokio::time::sleep(ttl * 5).await;
    assert_eq!(
        reads().await - started,
        0,
        "someone read while the leader extended"
    );
    let now = rx.borrow().as_ref().map(|l| l.valid_until);
    assert!(
        now.is_some_and(|v| v > first + ttl * 3),
        "the observer followed the extensions: {first:?} then {now:?}"
    );
    assert!(a.is_leader());
    observer.close().await;
    a.resign().await;
    b.resign().await;
}

/// A resign's release tells observers in the same script on every node but the line's gate
/// (whose release wakes the next candidate in its own): one script per node there, where the
/// release and the notification were two; the observer sees the vacancy from those messages.
/// Where it deleted the term's key, the script announces a view that is not live without
/// reading the election's record (`HMGET`: one command per node and term fewer). A failed
/// attempt's clean-up announces nothing (the idle-candidate test counts the reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_tells_observers_in_its_release_script() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let watcher = common::build(nodes.urls(), |b| b).await;
    let resource = common::unique("resign-told");
    let gate = redlock.line_node(&resource).expect("a gate");
    let observer = watcher.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let scripts = || futures::future::join_all((0..3).map(|i| common::script_calls(&nodes, i)));
    // The first term warms the scripts up (a first EVALSHA is answered NOSCRIPT, then EVAL).
    for value in ["a", "b"] {
        let term = first_term_shown(&redlock, &resource, &observer, &mut rx, value).await;
        settled_calls(&nodes, "evalsha").await;
        let before = scripts().await;
        let published = settled_calls(&nodes, "publish").await;
        let read = settled_calls(&nodes, "hmget").await;
        term.resign().await;
        assert!(
            shows(&mut rx, Duration::from_secs(5), Option::is_none).await,
            "resign not shown"
        );
        // One announcement per node, as before, and no read of the record.
        assert_eq!(settled_calls(&nodes, "publish").await - published, 3);
        assert_eq!(
            settled_calls(&nodes, "hmget").await - read,
            0,
            "a resign read the election's record where it deleted the term's key"
        );
        let after = scripts().await;
        for i in (0..3).filter(|&i| i != gate && value == "b") {
            assert_eq!(after[i] - before[i], 1, "scripts on node {i} for a resign");
        }
    }
    observer.close().await;
}

/// A raw subscriber on node `i`: `SUBSCRIBE channel`, its confirmation read.
async fn listen(nodes: &LocalNodes, i: usize, channel: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(nodes.addr(i)).await.unwrap();
    let subscribe = fredlock_testkit::RespValue::encode_command(&["SUBSCRIBE", channel]);
    conn.write_all(&subscribe).await.unwrap();
    assert_eq!(messages(&mut conn, Duration::from_secs(5), 1).await, 1);
    conn
}

/// The RESP frames (a subscription's confirmation, then messages) read from `conn` within
/// `within`, stopping at `want`.
async fn messages(conn: &mut tokio::net::TcpStream, within: Duration, want: usize) -> usize {
    use tokio::io::AsyncReadExt;
    let (mut buf, mut n) = (Vec::new(), 0);
    let deadline = Instant::now() + within;
    while n < want {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Ok(Ok(read)) if read > 0 => buf.extend_from_slice(&chunk[..read]),
            _ => break,
        }
        while let Some((_, used)) = fredlock_testkit::RespValue::parse(&buf).unwrap() {
            buf.drain(..used);
            n += 1;
        }
    }
    n
}

/// Candidates listen on the campaigns' channel, which a change of leader among candidates of
/// one priority leaves silent (observers hear it on the record's channel), and which hears a
/// request to yield and a claim of another priority. So 64 waiting candidates are not woken 3
/// times per change of leader. Fails when every claim or resign is told there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_leader_among_equals_wakes_no_candidate() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let other = common::build(nodes.urls(), |b| b.retry(RETRY)).await;
    let resource = common::unique("equals");
    let record = redlock.election_key(&resource);
    let a = redlock.elect(resource.as_str(), LONG_TTL).expect("elect");
    a.leader().await;
    let b = other.elect(resource.as_str(), LONG_TTL).expect("elect");
    assert!(common::lines::line_has(&nodes, &other, &resource, 1).await);
    // On the line's gate: `b` is woken by the release there, so its claim always finds its key
    // there. (Elsewhere `a`'s release may still be on its way when `b` acquires, after `a`'s
    // resign returned with a quorum: `b` then leads without that node, whose only message is
    // the late resign's.)
    let gate = redlock.line_node(&resource).expect("a gate");
    let mut told = listen(&nodes, gate, &record).await;
    let mut campaigns = listen(&nodes, gate, &format!("{record}|prio")).await;
    a.resign().await;
    b.leader().await;
    // The resign and the claim, on the record's channel; nothing on the campaigns'.
    assert_eq!(messages(&mut told, Duration::from_secs(5), 2).await, 2);
    assert_eq!(
        messages(&mut campaigns, Duration::from_millis(500), 1).await,
        0,
        "a change of leader among equals was told to the campaigns"
    );
    // A preferred candidate asks the leader to yield, and then claims with its priority: both
    // told to the campaigns.
    let c = redlock
        .elect_with_options(
            resource.as_str(),
            LONG_TTL,
            ElectOptions::default().priority(2),
        )
        .expect("elect");
    tokio::time::timeout(Duration::from_secs(5), c.leader())
        .await
        .expect("the preferred candidate leads");
    assert_eq!(messages(&mut campaigns, Duration::from_secs(5), 2).await, 2);
    for e in [b, c] {
        e.resign().await;
    }
}
