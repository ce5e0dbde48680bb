//! The order of a wait line under faults: a waiter's place is kept only by what reached the
//! gate. (That a release wakes the head is `tests/wake.rs`; what an uncontended cycle sends is
//! `tests/line_handover.rs`.)

mod common;

use std::time::Duration;

use common::lines::{line_has, line_key, line_members, sent_commands, Probe};
use common::*;
use fredlock::{AcquireOptions, Error, Retry};
use fredlock_testkit::{Fault, LocalNodes};

const TTL: Duration = Duration::from_secs(30);

/// A waiter whose attempts never reached the gate (every connection there reset) is not put at
/// the FRONT of the line by its attempts' clean-up, ahead of another process's waiter that was
/// there all along: a clean-up puts back only a waiter that held a place (its lease in the
/// line: a head whose granted turn failed on the other nodes). Before, the clean-up's retry,
/// landing once the gate was back, joined the waiter at the front.
#[tokio::test]
async fn a_clean_up_puts_back_only_a_waiter_that_held_a_place() {
    let nodes = LocalNodes::start(3).await.unwrap();
    // Attempts 4 s apart: the clean-up's retries (every 250 ms at most) land long before the
    // waiter's next attempt joins the line, at its back.
    let slow = Retry {
        attempts: u32::MAX,
        delay: Duration::from_secs(4),
        jitter: Duration::ZERO,
    };
    let (proxies, waiter) = behind_proxies(&nodes, |b| {
        b.retry(slow).node_timeout(Duration::from_millis(300))
    })
    .await;
    let r = unique("put-back");
    let (key, line) = (waiter.key(&r), line_key(&waiter, &r));
    let gate = waiter.line_node(&r).unwrap();
    held_elsewhere(&nodes, &key).await;
    // Another process's waiter, in line with a live lease.
    let other = "0badc0de:1";
    for args in [
        vec!["ZADD", &line, "0", other],
        vec!["PEXPIRE", &line, "60000"],
    ] {
        nodes.command(gate, &args).await.unwrap();
    }
    let lease = format!("{line}|{other}");
    nodes
        .command(gate, &["SET", &lease, "1", "PX", "60000"])
        .await
        .unwrap();
    proxies[gate].set(Fault::Reset);
    let probe = Probe::default();
    let _guard = probe.install();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    // Two failed attempts: the second carried the waiter's place (made at its first refusal),
    // and its clean-up on the gate failed with the connection.
    let failed = eventually(Duration::from_secs(15), || async {
        probe.count("attempt failed") >= 2
    });
    assert!(failed.await, "attempts: {:?}", probe.counts());
    proxies[gate].set(Fault::Pass);
    // The waiter joins the line: by its next attempt (at the back), or by a clean-up.
    let joined = eventually(Duration::from_secs(15), || async {
        line_members(&nodes, &waiter, &r).await.len() == 2
    });
    assert!(joined.await, "the waiter never joined the line");
    let members = line_members(&nodes, &waiter, &r).await;
    assert_eq!(
        members[0], other,
        "a waiter that never reached the gate went ahead of the line: {members:?}"
    );
    task.abort();
    waiter.close().await;
}

/// A head woken for its turn that finds another process's member first in the line (here the
/// only one: the head's own entry is gone) puts that member back, and the line keeps an expiry.
/// `ZPOPMIN` deletes a line it empties, and the put-back's `ZADD` made a new one that never
/// expired; fails without the put-back's `PEXPIRE` (the line's PTTL is then -1). The turn
/// without a script (a plain lock) and the script's turn (with fencing tokens).
#[tokio::test]
async fn a_put_back_into_an_emptied_line_keeps_it_expiring() {
    put_back_into_an_emptied_line(false).await;
}

#[tokio::test]
async fn a_put_back_into_an_emptied_line_keeps_it_expiring_with_fencing() {
    put_back_into_an_emptied_line(true).await;
}

async fn put_back_into_an_emptied_line(fencing: bool) {
    let (nodes, waiter) = local_with(3, |b| {
        b.retry(retry(u32::MAX, 2000, 0)).fencing_tokens(fencing)
    })
    .await;
    let r = unique("put-back-ttl");
    let line = line_key(&waiter, &r);
    let gate = waiter.line_node(&r).unwrap();
    let task = waiting_head(&nodes, &waiter, &r, gate).await;
    let me = line_members(&nodes, &waiter, &r).await.remove(0);
    // Another process's member in the line, alone: the waiter's entry removed.
    let other = waiter_of_another_process(&nodes, &waiter, &r, 0).await;
    nodes.command(gate, &["ZREM", &line, &me]).await.unwrap();
    assert_eq!(
        line_members(&nodes, &waiter, &r).await,
        std::slice::from_ref(&other)
    );
    // The waiter's own wake-up, as a release would publish it: it sends its turn.
    let (instance, seq) = me.split_once(':').expect("<instance>:<seq>");
    let channel = format!("{}~wake:{instance}", waiter.key(""));
    let message = format!("{seq}|test");
    nodes
        .command(gate, &["PUBLISH", &channel, &message])
        .await
        .unwrap();
    // Its turn popped `other`, put it back, and joined the waiter behind it.
    assert!(
        line_has(&nodes, &waiter, &r, 2).await,
        "the waiter's turn never ran"
    );
    assert_eq!(line_members(&nodes, &waiter, &r).await, [other, me]);
    let ttl = nodes.command(gate, &["PTTL", &line]).await.unwrap();
    assert!(
        matches!(ttl, fredlock_testkit::RespValue::Integer(ms) if ms > 0),
        "the line lost its expiry: PTTL {ttl:?}"
    );
    task.abort();
    waiter.close().await;
}

/// Another process holds `key` on every node for a minute.
async fn held_elsewhere(nodes: &LocalNodes, key: &str) {
    for i in 0..3 {
        nodes
            .command(i, &["SET", key, "someone-else", "PX", "60000"])
            .await
            .unwrap();
    }
}

/// Puts a waiter of another process at the head of `resource`'s line (a live lease), as a
/// refused waiter's attempt would; returns its member.
async fn head_of_another_process(
    nodes: &LocalNodes,
    redlock: &fredlock::Redlock,
    r: &str,
) -> String {
    waiter_of_another_process(nodes, redlock, r, 0).await
}

/// As [`head_of_another_process`], at `score` in the line (the head's is 0).
async fn waiter_of_another_process(
    nodes: &LocalNodes,
    redlock: &fredlock::Redlock,
    r: &str,
    score: u32,
) -> String {
    let (gate, line) = (redlock.line_node(r).unwrap(), line_key(redlock, r));
    let other = format!("{:08x}:1", rand::random::<u32>());
    let lease = format!("{line}|{other}");
    let score = score.to_string();
    for args in [
        vec!["ZADD", line.as_str(), score.as_str(), other.as_str()],
        vec!["PEXPIRE", line.as_str(), "60000"],
        vec!["SET", lease.as_str(), "1", "PX", "60000"],
    ] {
        nodes.command(gate, &args).await.unwrap();
    }
    other
}

/// The order `docs/algorithm.md` promises, and where it stops: a newcomer's first attempt is not
/// in line and may take a key that is free at that instant, ahead of the line's head (here a
/// head of another process that has not attempted yet); a process that saw the key contended in
/// the last 2 s sends its first attempt through the line, and waits behind that head.
#[tokio::test]
async fn only_a_process_that_saw_contention_lines_up_at_its_first_attempt() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let probe = Probe::default();
    let _guard = probe.install();
    let r = unique("first-attempt");
    let (seen, fresh) = (
        build(nodes.urls(), |b| b).await,
        build(nodes.urls(), |b| b).await,
    );
    let key = seen.key(&r);
    let briefly = AcquireOptions::new().wait(Duration::from_millis(300));
    // `seen` meets the key held by someone else, and gives up.
    held_elsewhere(&nodes, &key).await;
    let refused = seen.acquire_using(r.as_str(), TTL, &briefly).await;
    assert!(
        matches!(refused, Err(Error::Contended { .. })),
        "held by someone else: {refused:?}"
    );
    let before = probe.counts();
    // The key is free now, and another process's waiter heads the line (its wake-up on its way).
    for i in 0..3 {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let other = head_of_another_process(&nodes, &seen, &r).await;
    let behind = seen.acquire_using(r.as_str(), TTL, &briefly).await;
    assert!(
        behind.is_err(),
        "a process that saw the key contended went ahead of the line's head: {behind:?}; \
         events before: {before:?}, after: {:?}, line: {:?}",
        probe.counts(),
        line_members(&nodes, &seen, &r).await
    );
    assert!(
        freed_within(&seen, &key, Duration::from_secs(5)).await,
        "its attempts' values were left on the nodes: {:?}",
        values(&seen, &key).await
    );
    let members = line_members(&nodes, &seen, &r).await;
    assert_eq!(
        members.first(),
        Some(&other),
        "the head kept its place: {members:?}"
    );
    // A newcomer's first attempt is not in line: the free key is its.
    let lock = fresh
        .acquire_using(r.as_str(), TTL, &briefly)
        .await
        .expect("a newcomer's first attempt takes a free key");
    lock.release().await.unwrap();
    seen.close().await;
    fresh.close().await;
}

/// A waiter that the gate grants while the other nodes are held (the holder's key missing on
/// the gate: its late `SET` there came after ours, or the gate lost it) joins the line at its
/// front when its attempt fails, so that the holder's release wakes it. Before, the clean-up
/// put back only a member that already held a place, and a waiter granted at its first look at
/// the gate held none: it waited outside the line for its whole retry pause (seen: a test whose
/// waiter gave up after 800 ms without ever being in line, 1 run in 25 under load).
#[tokio::test]
async fn a_waiter_granted_by_the_gate_alone_waits_in_line() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let slow = Retry {
        attempts: u32::MAX,
        delay: Duration::from_secs(10),
        jitter: Duration::ZERO,
    };
    let waiter = build(nodes.urls(), |b| b.retry(slow)).await;
    let r = unique("gate-alone");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).unwrap();
    // Another holder's key on every node but the gate.
    for i in (0..3).filter(|&i| i != gate) {
        nodes
            .command(i, &["SET", &key, "someone-else", "PX", "60000"])
            .await
            .unwrap();
    }
    let briefly = AcquireOptions::new().wait(Duration::from_millis(800));
    let attempt = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire_using(r.as_str(), TTL, &briefly).await }
    });
    let members = |n| line_has(&nodes, &waiter, &r, n);
    assert!(
        members(1).await,
        "the waiter is in line: {:?}",
        line_members(&nodes, &waiter, &r).await
    );
    let gave_up = attempt.await.unwrap();
    assert!(
        matches!(gave_up, Err(Error::Contended { .. })),
        "{gave_up:?}"
    );
    assert!(members(0).await, "the waiter left the line when it gave up");
    waiter.close().await;
}

/// The line (and its flag) lives while its head looks: a waiter that joins or renews its place
/// behind a live head renews only its own lease, and leaves the line's expiry alone (two
/// commands fewer per renewal and per newcomer); once no one is ahead of it, its next look
/// (within a second) renews the line. Fails when every join renews the line (its TTL falls
/// from the minute set here to the 12 s a join sets).
#[tokio::test]
async fn only_a_waiter_with_no_one_ahead_renews_the_line() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let waiter = build(nodes.urls(), |b| b.retry(retry(u32::MAX, 20, 20))).await;
    let r = unique("renews");
    let (key, line) = (waiter.key(&r), line_key(&waiter, &r));
    let gate = waiter.line_node(&r).unwrap();
    held_elsewhere(&nodes, &key).await;
    let head = head_of_another_process(&nodes, &waiter, &r).await;
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 2).await, "the waiter joined");
    let pttl = || async {
        match nodes.command(gate, &["PTTL", &line]).await.unwrap() {
            fredlock_testkit::RespValue::Integer(t) => t,
            other => panic!("PTTL: {other:?}"),
        }
    };
    // Joined, and renewed twice (a renewal a second, each asking its place: `ZRANK`): the
    // minute set above stands.
    let renewed = eventually(Duration::from_secs(5), || async {
        command_calls(&nodes, gate, "zrank").await >= 2
    });
    assert!(renewed.await, "the waiter renewed its place");
    assert!(
        pttl().await > 15_000,
        "the line's expiry was renewed from behind the head"
    );
    // The head leaves: the waiter's next look finds no one ahead and renews the line.
    let lease = format!("{line}|{head}");
    nodes.command(gate, &["ZREM", &line, &head]).await.unwrap();
    nodes.command(gate, &["DEL", &lease]).await.unwrap();
    let head_renews = eventually(Duration::from_secs(5), || async { pttl().await <= 12_000 });
    assert!(head_renews.await, "the head did not renew the line");
    task.abort();
    waiter.close().await;
}

/// A waiter two places or more behind the head renews its place with one command (`SET` of its
/// lease, `XX`) at its timers (every 2 s), and asks its place (`ZRANK`) at every second, looking
/// at the gate (a script) only once it is the head or right behind it: only those two look
/// every second (a lost wake-up, a dead head); a newcomer learns at its join that two members
/// are ahead of it (the gate reads the line's last two entries) and renews from its first timer
/// on. Its place stays alive meanwhile, and once the waiters ahead are gone, its next question
/// finds it at the head: it looks, and takes the freed lock. Fails when every timer looks (a
/// script a second), when the newcomer's first timer looks or asks, when a question comes at
/// another renewal than the second, or when it looks without asking.
#[tokio::test]
async fn a_waiter_far_behind_the_head_renews_its_place_with_one_command() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let waiter = build(nodes.urls(), |b| b.retry(retry(u32::MAX, 20, 20))).await;
    // Its wake-ups up, it asks no place at its join (a waiter that polls always asks).
    let holder = build(nodes.urls(), |b| b).await;
    wake_ups_up(&nodes, &holder, &waiter).await;
    holder.close().await;
    let r = unique("far");
    let (key, line) = (waiter.key(&r), line_key(&waiter, &r));
    let gate = waiter.line_node(&r).unwrap();
    held_elsewhere(&nodes, &key).await;
    let mut ahead = Vec::new();
    for score in 0..2 {
        ahead.push(waiter_of_another_process(&nodes, &waiter, &r, score).await);
    }
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 3).await, "the waiter joined");
    // From its first renewal to its question: no script on the gate.
    let nodes = &nodes;
    let calls = |name: &'static str, n: u64| async move {
        eventually(Duration::from_secs(10), || async move {
            command_calls(nodes, gate, name).await >= n
        })
        .await
    };
    let (before, scripts, joined_asked) = (
        command_calls(nodes, gate, "set").await,
        script_calls(nodes, gate).await,
        command_calls(nodes, gate, "zrank").await,
    );
    assert!(
        calls("set", before + 1).await,
        "the waiter renewed its place"
    );
    // Its join told it that two members were ahead: no look and no question at its first timer.
    assert_eq!(
        (
            script_calls(nodes, gate).await - scripts,
            command_calls(nodes, gate, "zrank").await - joined_asked
        ),
        (0, 0),
        "a waiter two places behind the head looked or asked its place at its first timer"
    );
    // Its question comes with its second renewal (the third is a timer later).
    assert!(
        calls("zrank", joined_asked + 1).await,
        "the waiter asked its place"
    );
    let asked = command_calls(nodes, gate, "zrank").await;
    assert_eq!(
        (
            command_calls(nodes, gate, "set").await - before,
            script_calls(nodes, gate).await - scripts
        ),
        (2, 0),
        "a waiter two places behind the head asked its place at another renewal than its second, or looked"
    );
    let members = line_members(nodes, &waiter, &r).await;
    assert_eq!(members.len(), 3, "the waiter kept its place: {members:?}");
    // The waiters ahead leave and the lock is freed: the waiter's next question (at its fourth
    // timer at the latest) finds it at the head, and its look takes the lock.
    for member in &ahead {
        let lease = format!("{line}|{member}");
        nodes.command(gate, &["ZREM", &line, member]).await.unwrap();
        nodes.command(gate, &["DEL", &lease]).await.unwrap();
    }
    for i in 0..3 {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let lock = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the waiter took the lock once the waiters ahead left")
        .unwrap()
        .unwrap();
    assert!(
        command_calls(nodes, gate, "zrank").await > asked,
        "the waiter looked without asking its place first"
    );
    lock.release().await.unwrap();
    waiter.close().await;
}

/// The gate reads only what a waiter's attempt needs: a newcomer joins behind a live head by
/// reading the line's tail alone (no look at the head's lease: `EXISTS`), and the head, woken
/// by the holder's release, is taken out of the line and granted in one pop (`ZPOPMIN`) and
/// the `SET`, sent without a script. Fails on the scripts that looked at the head for every
/// attempt, and on a turn that runs the line's script (one command more per hand-over).
#[tokio::test]
async fn the_gate_reads_only_what_a_waiter_needs() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let holder = build(nodes.urls(), |b| b).await;
    // Slow polling: until its wake-ups are up, the waiter looks at most every 2 s.
    let waiter = build(nodes.urls(), |b| b.retry(retry(u32::MAX, 2000, 0))).await;
    wake_ups_up(&nodes, &holder, &waiter).await;
    let r = unique("reads");
    let line = line_key(&waiter, &r);
    let gate = waiter.line_node(&r).unwrap();
    let lock = holder.acquire(r.as_str(), TTL).await.unwrap();
    let head = head_of_another_process(&nodes, &waiter, &r).await;
    // The line's flag, which that head's join set: a release reads it to wake the head.
    let flag = format!("{line}!");
    nodes
        .command(gate, &["SET", &flag, "1", "PX", "60000"])
        .await
        .unwrap();
    let before = calls(&nodes, gate).await;
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(&nodes, &waiter, &r, 2).await, "the waiter joined");
    // Each look of a waiter in line (it polls until its wake-ups are up) reads the head's lease
    // once and asks its place once; the join did neither.
    let joined = calls(&nodes, gate).await;
    assert_eq!(
        joined.exists - before.exists,
        joined.zrank - before.zrank,
        "the newcomer looked at the head's lease: {before:?} -> {joined:?}"
    );
    // The head of the other process leaves; the holder's release wakes the waiter. The gate's
    // slow log, every command logged, shows what clients sent (not what scripts ran).
    nodes.command(gate, &["ZREM", &line, &head]).await.unwrap();
    for args in [
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"][..],
        &["CONFIG", "SET", "slowlog-max-len", "1024"],
        &["SLOWLOG", "RESET"],
    ] {
        nodes.command(gate, args).await.unwrap();
    }
    lock.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the woken waiter took the lock")
        .unwrap()
        .unwrap();
    let sent = sent_commands(&nodes, gate).await;
    nodes
        .command(gate, &["CONFIG", "SET", "slowlog-log-slower-than", "10000"])
        .await
        .unwrap();
    assert_eq!(
        calls(&nodes, gate).await.zpopmin,
        before.zpopmin + 1,
        "the woken head did not pop itself out of the line"
    );
    // Its turn is the pop and the key's SET, sent as they are: no script.
    let turn = |c: &[String]| c.first().is_some_and(|n| n.eq_ignore_ascii_case("zpopmin"));
    assert!(sent.iter().any(|c| turn(c)), "no ZPOPMIN sent: {sent:?}");
    assert!(
        !sent.iter().any(|c| c.iter().any(|a| a == "turn")),
        "the woken head's turn ran the line's script: {sent:?}"
    );
    assert!(line_has(&nodes, &waiter, &r, 0).await, "the line is empty");
    lock.release().await.unwrap();
    holder.close().await;
    waiter.close().await;
}

/// Makes `waiter`'s wake-ups come up before a test watches what it sends: it waits once, on a
/// resource of its own, behind `holder` (a subscription coming up makes each waiter look at its
/// gate once, which would otherwise land in the middle of the test).
async fn wake_ups_up(nodes: &LocalNodes, holder: &fredlock::Redlock, waiter: &fredlock::Redlock) {
    let r = unique("warm-up");
    let held = holder.acquire(r.as_str(), TTL).await.unwrap();
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.clone());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    let subscribed = eventually(Duration::from_secs(5), || async {
        for i in 0..nodes.len() {
            if pubsub_clients(nodes, i).await == 0 {
                return false;
            }
        }
        true
    });
    assert!(subscribed.await, "the waiter subscribed to its wake-ups");
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the warm-up's waiter took the lock")
        .unwrap()
        .unwrap();
    lock.release().await.unwrap();
}

/// A waiter granted by the other nodes before its gate answered (the gate's replies 300 ms
/// late), whose gate then granted too, sends nothing more: the gate's grant took it out of the
/// line. Fails when it leaves anyway (one `ZREM` more on the gate, as before the late answer was
/// awaited).
#[tokio::test]
async fn a_waiter_granted_before_its_gate_granted_sends_nothing_more() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (proxies, waiter) = behind_proxies(&nodes, |b| b.retry(retry(u32::MAX, 2000, 0))).await;
    let r = unique("granted-first");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).unwrap();
    let task = waiting_head(&nodes, &waiter, &r, gate).await;
    // The gate answers late; the key is freed everywhere (no release: no wake-up), and the
    // head's next look (within a second) asks every node.
    proxies[gate].set(Fault::Latency(Duration::from_millis(300)));
    let before = calls(&nodes, gate).await;
    for i in 0..3 {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the head took the freed lock")
        .unwrap()
        .unwrap();
    // The gate granted it (its script took it out of the line) ...
    let granted = eventually(Duration::from_secs(5), || async {
        calls(&nodes, gate).await.zrem > before.zrem
    });
    assert!(granted.await, "the gate never ran the late attempt");
    assert!(line_has(&nodes, &waiter, &r, 0).await, "still in line");
    // ... and after its answer (the release's, on the gate's connection, comes after it) and
    // one more cycle on the same connection, no command took the waiter out again.
    proxies[gate].set(Fault::Pass);
    lock.release().await.unwrap();
    let again = waiter.acquire(r.as_str(), TTL).await.unwrap();
    again.release().await.unwrap();
    let after = calls(&nodes, gate).await;
    assert_eq!(
        after.zrem - before.zrem,
        1,
        "only the gate's grant takes the waiter out: {before:?} -> {after:?}"
    );
    waiter.close().await;
}

/// A waiter granted by the other nodes while its gate, answering late, refused it (a key left
/// on the gate alone) leaves the line as a waiter that gives up does: by the line's leave
/// script, which also deletes its lease and, as it was the head, wakes the next waiter (see
/// `tests/line_mixed.rs`). Fails when it stays in line (the late answer taken for a grant), or
/// leaves with a bare `ZREM` (no `DEL` of its lease), as it did before: its release there saw
/// its own member at the head and woke nobody, so the next waiter was not told.
#[tokio::test]
async fn a_waiter_granted_while_its_gate_refused_leaves_the_line() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (proxies, waiter) = behind_proxies(&nodes, |b| b.retry(retry(u32::MAX, 2000, 0))).await;
    let r = unique("refused-late");
    let key = waiter.key(&r);
    let gate = waiter.line_node(&r).unwrap();
    let task = waiting_head(&nodes, &waiter, &r, gate).await;
    // The gate answers late and keeps someone else's key; the two other nodes are freed.
    proxies[gate].set(Fault::Latency(Duration::from_millis(300)));
    let before = calls(&nodes, gate).await;
    for i in (0..3).filter(|&i| i != gate) {
        nodes.command(i, &["DEL", &key]).await.unwrap();
    }
    let lock = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the head took the quorum of the two others")
        .unwrap()
        .unwrap();
    assert!(
        line_has(&nodes, &waiter, &r, 0).await,
        "the waiter granted elsewhere stayed in its gate's line"
    );
    let after = calls(&nodes, gate).await;
    assert_eq!(after.zrem - before.zrem, 1, "{before:?} -> {after:?}");
    assert_eq!(
        after.del - before.del,
        1,
        "the waiter left without the leave script: {before:?} -> {after:?}"
    );
    proxies[gate].set(Fault::Pass);
    lock.release().await.unwrap();
    waiter.close().await;
}

/// A waiter of `r` at the head of its line, the key held by someone else on every node, its
/// wake-ups up and its timer looking at the gate: its acquire's task.
async fn waiting_head(
    nodes: &LocalNodes,
    waiter: &fredlock::Redlock,
    r: &str,
    gate: usize,
) -> tokio::task::JoinHandle<fredlock::Result<fredlock::Lock>> {
    held_elsewhere(nodes, &waiter.key(r)).await;
    let start = calls(nodes, gate).await;
    let task = tokio::spawn({
        let (waiter, r) = (waiter.clone(), r.to_string());
        async move { waiter.acquire(r.as_str(), TTL).await }
    });
    assert!(line_has(nodes, waiter, r, 1).await, "the waiter joined");
    // Its wake-ups came up, and it looked at the gate twice more (the head's join and each of
    // its looks read the key's PTTL): the look, gate first, that a subscription coming up
    // brings (one or two), then its timer's, every node at once.
    let looked = eventually(Duration::from_secs(5), || async {
        calls(nodes, gate).await.pttl >= start.pttl + 3
    });
    assert!(looked.await, "the waiter never looked again");
    task
}

/// Calls of the commands this file's tests count, from one `INFO`.
#[derive(Debug)]
struct Calls {
    exists: u64,
    zrank: u64,
    zpopmin: u64,
    zrem: u64,
    del: u64,
    pttl: u64,
}

async fn calls(nodes: &LocalNodes, i: usize) -> Calls {
    let info = nodes.command(i, &["INFO", "commandstats"]).await.unwrap();
    let fredlock_testkit::RespValue::Bulk(Some(text)) = info else {
        panic!("INFO commandstats: {info:?}");
    };
    let text = String::from_utf8_lossy(&text);
    let count = |command: &str| {
        let prefix = format!("cmdstat_{command}:calls=");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a count"))
    };
    Calls {
        exists: count("exists"),
        zrank: count("zrank"),
        zpopmin: count("zpopmin"),
        zrem: count("zrem"),
        del: count("del"),
        pttl: count("pttl"),
    }
}
