//! Elections that others can see: campaign values, term numbers (fencing tokens), who leads
//! (`leader_of`), proclaim, preferred candidates, the health check. Against real nodes.

mod common;

use std::time::Duration;

use fredlock::{ElectOptions, Election, Error, InvalidInput, Retry, Role, Term, MAX_VALUE_LEN};
use fredlock_testkit::{Fault, LocalNodes};
use tokio::time::Instant;

const RETRY: Retry = common::retry(3, 20, 20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_term_has_a_growing_number_and_anyone_can_read_the_leader() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("value");
    // No election yet: nobody leads, and nothing fails.
    assert_eq!(redlock.leader_of(&resource).await.expect("read"), None);
    let mut last = 0;
    for round in 0..4 {
        let value = format!("10.0.0.{round}:8080");
        let election = redlock
            .elect_with_options(
                resource.as_str(),
                Duration::from_secs(5),
                ElectOptions::default().value(value.clone()),
            )
            .expect("elect");
        let term = election.leader().await;
        let number = term.fencing_token().expect("elections are always fenced");
        assert!(number > last, "term {number} after {last}");
        last = number;
        assert_eq!(term.value, value);
        // Any other process (here: another Redlock over the same nodes) reads the same.
        let leader = redlock
            .leader_of(&resource)
            .await
            .expect("read")
            .expect("a leader");
        assert_eq!(
            (leader.term, leader.value.as_str()),
            (number, value.as_str())
        );
        assert!(leader.remaining() > Duration::from_secs(3));
        election.resign().await;
        // Resigned: the term is over for every reader at once.
        assert_eq!(redlock.leader_of(&resource).await.expect("read"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_the_leaders_owner_label() {
    let (nodes, candidate) = common::local_with(3, |b| b.retry(RETRY).owner_label("sched-a")).await;
    // A reader with a label of its own: what it shows is the leader's, not its own.
    let reader = common::build(nodes.urls(), |b| b.owner_label("reader")).await;
    let resource = common::unique("label");
    let observer = reader.observe(&resource).await.expect("observe");
    let mut rx = observer.watch();
    let election = candidate
        .elect(resource.as_str(), Duration::from_secs(30))
        .expect("elect");
    let term = election.leader().await;
    let leader = reader
        .leader_of(&resource)
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(leader.term, term.number());
    assert_eq!(leader.label.as_deref(), Some("sched-a"));
    // The observer shows the same leader, label included.
    let seen = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|l| l.as_ref().is_some_and(|l| l.term == term.number())),
    )
    .await
    .expect("the observer shows the term within 10 s")
    .expect("observing")
    .clone();
    assert_eq!(seen.and_then(|l| l.label).as_deref(), Some("sched-a"));
    // And inspect agrees: the same label on the lock key.
    let held = reader.inspect(&resource).await.expect("inspect");
    let holder = held.holder().expect("held");
    assert_eq!(holder.label.as_deref(), Some("sched-a"));
    election.resign().await;
    observer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_numbers_grow_without_fencing_turned_on_and_with_it() {
    for fencing in [false, true] {
        let (_nodes, redlock) =
            common::local_with(3, |b| b.retry(RETRY).fencing_tokens(fencing)).await;
        let resource = common::unique("fenced");
        // A plain lock of the same name first: the election's numbers come after its token.
        let lock = redlock
            .acquire(resource.as_str(), Duration::from_secs(5))
            .await
            .expect("lock");
        let before = lock.fencing_token();
        lock.release().await.expect("release");
        let election = redlock
            .elect(resource.as_str(), Duration::from_secs(5))
            .expect("elect");
        let term = election.leader().await;
        let number = term.fencing_token().expect("fenced");
        if let Some(before) = before {
            assert!(number > before);
        }
        election.resign().await;
    }
}

/// The campaign's acquire hands the term number out unraised and the claim raises the lock's
/// fencing counter in the script that writes the record: when `leader()` returns, every node
/// that answered holds the number, so a fenced lock of the same resource taken after the term
/// gets a larger token. Fails if the claim does not raise (the counters stay at 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terms_number_is_on_the_counters_before_the_term_starts() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY).fencing_tokens(true)).await;
    let resource = common::unique("raised");
    let key = redlock.fence_key(&resource);
    let election = redlock
        .elect(resource.as_str(), Duration::from_secs(5))
        .expect("elect");
    let number = election.leader().await.fencing_token().expect("fenced");
    for i in 0..3 {
        let counter = common::get(&redlock, i, &key).await;
        assert_eq!(counter, Some(number.to_string()), "node {i}");
    }
    election.resign().await;
    let lock = redlock
        .acquire(resource.as_str(), Duration::from_secs(5))
        .await
        .expect("lock");
    assert!(lock.fencing_token().expect("fenced") > number);
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_changes_the_value_and_never_overwrites_a_later_term() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("proclaim");
    let ttl = Duration::from_secs(10);
    let a = redlock
        .elect_with_options(resource.as_str(), ttl, ElectOptions::default().value("a:1"))
        .expect("elect");
    let term_a = a.leader().await;
    a.proclaim("a:2").await.expect("proclaim");
    assert_eq!(a.current_term().expect("leads").value, "a:2");
    let read = redlock
        .leader_of(&resource)
        .await
        .expect("read")
        .expect("leader");
    assert_eq!((read.term, read.value.as_str()), (term_a.number(), "a:2"));
    // Too long a value is refused before anything is sent.
    let long = "x".repeat(MAX_VALUE_LEN + 1);
    assert!(matches!(
        a.proclaim(long).await,
        Err(Error::InvalidInput(InvalidInput::ValueTooLong(_)))
    ));

    // An operator breaks the lock; B takes the next term while A still believes it leads (its
    // keep-alive notices only at its next extension, seconds away).
    let b = redlock
        .elect_with_options(resource.as_str(), ttl, ElectOptions::default().value("b:1"))
        .expect("elect");
    redlock.force_release(&resource).await.expect("break");
    let term_b = b.leader().await;
    assert!(term_b.number() > term_a.number());
    assert!(a.is_leader(), "A should not have noticed yet");
    // A's late proclaim must not touch B's term.
    let late = a.proclaim("a:late").await;
    assert!(matches!(late, Err(Error::NotLeader { .. })), "{late:?}");
    let read = redlock
        .leader_of(&resource)
        .await
        .expect("read")
        .expect("leader");
    assert_eq!((read.term, read.value.as_str()), (term_b.number(), "b:1"));
    // A follower cannot proclaim either.
    a.resign().await;
    let c = redlock.elect(resource.as_str(), ttl).expect("elect");
    assert!(matches!(
        c.proclaim("c").await,
        Err(Error::NotLeader { .. })
    ));
    b.resign().await;
    c.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_candidate_takes_over_once_and_lower_ones_never_preempt() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("priority");
    let ttl = Duration::from_secs(10);
    let old = |v: &str, p: u32| ElectOptions::default().value(v).priority(p);
    let a = redlock
        .elect_with_options(resource.as_str(), ttl, old("v1-a", 1))
        .expect("elect");
    let term_a = a.leader().await;
    // Equal and lower priority candidates join: nothing moves.
    let b = redlock
        .elect_with_options(resource.as_str(), ttl, old("v1-b", 1))
        .expect("elect");
    let c = redlock
        .elect_with_options(resource.as_str(), ttl, old("v0-c", 0))
        .expect("elect");
    let mut a_role = a.watch();
    let moved =
        tokio::time::timeout(Duration::from_secs(1), a_role.wait_for(|r| !r.is_leader())).await;
    assert!(
        moved.is_err(),
        "an equal or lower priority candidate preempted the leader"
    );
    // The new version joins with a higher priority: it leads within about a second, and A's
    // term ends.
    let joined = Instant::now();
    let d = redlock
        .elect_with_options(resource.as_str(), ttl, old("v2-d", 2))
        .expect("elect");
    let ended = tokio::time::timeout(Duration::from_secs(3), a.term_ended(&term_a)).await;
    assert!(ended.is_ok(), "the leader did not yield");
    let term_d = tokio::time::timeout(Duration::from_secs(3), d.leader())
        .await
        .expect("D leads");
    println!(
        "preferred candidate led {:?} after joining",
        joined.elapsed()
    );
    assert!(term_d.number() > term_a.number());
    assert!(!b.is_leader() && !c.is_leader() && !a.is_leader());
    // And it stays: no flapping back to the others.
    let mut d_role = d.watch();
    let lost =
        tokio::time::timeout(Duration::from_secs(1), d_role.wait_for(|r| !r.is_leader())).await;
    assert!(lost.is_err(), "leadership moved again");
    let read = redlock
        .leader_of(&resource)
        .await
        .expect("read")
        .expect("leader");
    assert_eq!((read.term, read.value.as_str()), (term_d.number(), "v2-d"));
    for e in [a, b, c, d] {
        e.resign().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_fails_when_renewals_stop() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let (proxies, redlock) = common::behind_proxies(&nodes, |b| b.retry(RETRY)).await;
    let resource = common::unique("health");
    let ttl = Duration::from_secs(3);
    let election = redlock.elect(resource.as_str(), ttl).expect("elect");
    let term = election.leader().await;
    let bound = Duration::from_millis(1500);
    assert!(election.check_health(bound).is_ok());
    // Cut off: renewals fail; the check fails before the term's validity runs out.
    for p in &proxies {
        p.set(Fault::Reset);
    }
    let mut failed = None;
    while election.is_leader() {
        if let Err(e) = election.check_health(bound) {
            failed = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let message = failed.expect("the health check failed while still leader");
    assert!(message.contains(&resource), "{message}");
    assert!(Instant::now() < term.valid_until + Duration::from_millis(50));
    // A follower is healthy.
    let _ = tokio::time::timeout(ttl * 2, election.term_ended(&term)).await;
    assert!(election.check_health(bound).is_ok());
    for p in &proxies {
        p.set(Fault::Pass);
    }
    election.resign().await;
}

/// The next term of `election` numbered above `after` (fails the test after 10 s).
async fn term_after(election: &Election, after: u64) -> Term {
    let mut role = election.watch();
    let next = async {
        loop {
            if let Some(t) = role
                .borrow_and_update()
                .term()
                .filter(|t| t.number() > after)
            {
                return t.clone();
            }
            role.changed().await.expect("the campaign runs");
        }
    };
    tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("a new term within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_changes_show_every_term_in_order_where_the_watch_shows_the_latest() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("changes");
    let election = redlock
        .elect(resource.as_str(), Duration::from_secs(1))
        .expect("elect");
    let mut changes = election.role_changes();
    let watch = election.watch();
    // Three terms: the lock is broken twice; each time the keep-alive's next extension finds it
    // gone, the participant steps down and campaigns again.
    let mut held = vec![election.leader().await.number()];
    for _ in 0..2 {
        redlock.force_release(&resource).await.expect("break");
        let last = held[held.len() - 1];
        held.push(term_after(&election, last).await.number());
    }
    election.resign().await;
    // The watch, not looked at meanwhile, shows only the latest role.
    assert_eq!(*watch.borrow(), Role::Follower);
    // The changes: the current role first, then every value, in order, until the campaign
    // ended: each term (its extensions are the same term again), a step down after each.
    let mut seen: Vec<Option<u64>> = Vec::new();
    while let Some(role) = changes.recv().await {
        let now = role.term().map(Term::number);
        if seen.last() != Some(&now) {
            seen.push(now);
        }
    }
    // (The first term is normally won after the call, but it may already stand.)
    if seen.first() == Some(&None) {
        seen.remove(0);
    }
    let expected: Vec<Option<u64>> = held.iter().flat_map(|&n| [Some(n), None]).collect();
    assert_eq!(seen, expected, "terms held: {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_values_are_refused_at_once() {
    let (_nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    assert!(matches!(
        redlock.leader_of("").await,
        Err(Error::InvalidInput(InvalidInput::EmptyResource))
    ));
    assert!(matches!(
        redlock.leader_of("~fence").await,
        Err(Error::InvalidInput(InvalidInput::ReservedResource(_)))
    ));
    assert!(matches!(
        redlock.observe("").await,
        Err(Error::InvalidInput(InvalidInput::EmptyResource))
    ));
    let long = ElectOptions::default().value("v".repeat(MAX_VALUE_LEN + 1));
    assert!(matches!(
        redlock.elect_with_options("x", Duration::from_secs(1), long),
        Err(Error::InvalidInput(InvalidInput::ValueTooLong(_)))
    ));
    // A record of the wrong type on a majority: a typed error, not a leader.
    let resource = common::unique("wrongtype");
    let record = redlock.election_key(&resource);
    for i in 0..2 {
        common::raw(&redlock, i, &["SET", &record, "not-a-hash"]).await;
    }
    let read = redlock.leader_of(&resource).await;
    assert!(matches!(read, Err(Error::Unavailable { .. })), "{read:?}");
}

/// A new `Election` of the same `Redlock`, resource and priority after a resign shares the
/// campaign observer the last one left: no connection opened (each of this client's connections
/// starts with `CLIENT ID`), no subscription (fails when each `Election` opens its own: one
/// connection and one `SUBSCRIBE` more per node), and its claim announces the lock's validity
/// as the view's TTL (fails when it reads `PTTL`, as the observer's first read does too).
/// `Redlock::close` closes the observer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_election_after_a_resign_reuses_the_campaign_observer() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("again");
    let first = redlock
        .elect(resource.as_str(), Duration::from_secs(5))
        .expect("elect");
    let term = first.leader().await;
    first.resign().await;
    let counts = |i: usize| {
        let nodes = &nodes;
        async move {
            (
                common::command_calls(nodes, i, "client|id").await,
                common::command_calls(nodes, i, "subscribe").await,
                common::command_calls(nodes, i, "pttl").await,
            )
        }
    };
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(counts(i).await);
    }
    let second = redlock
        .elect(resource.as_str(), Duration::from_secs(5))
        .expect("elect");
    assert!(second.leader().await.number() > term.number());
    for (i, before) in before.iter().enumerate() {
        assert_eq!(
            counts(i).await,
            *before,
            "node {i}: (CLIENT ID, SUBSCRIBE, PTTL)"
        );
    }
    second.resign().await;
    for i in 0..3 {
        assert!(
            common::pubsub_clients(&nodes, i).await > 0,
            "node {i}: closed on resign"
        );
    }
    redlock.close().await;
    let closed = common::eventually(Duration::from_secs(5), || async {
        let mut open = 0;
        for i in 0..3 {
            open += common::pubsub_clients(&nodes, i).await;
        }
        open == 0
    });
    assert!(
        closed.await,
        "the campaign observer outlived Redlock::close"
    );
}

/// A term with no priorities in play costs each node three scripts (the acquire, the claim, the
/// release with its announcement: on the line's gate too, whose release announced in a second
/// script before) and reads no request to yield: `GET`s per node, the fenced acquire's of the
/// fencing counter and, off the gate, the release's of the lock key (the claim reads the counter
/// and the lock key with one `MGET`, the gate's release with the line's flag). Only the
/// campaigns use requests to yield, and they hear them on their own channel. Fails when the
/// announcements read the request, as they did (6 `GET`s per node), with the claim's two `GET`s
/// (4), and with the gate's separate announcement (4 scripts on the gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_costs_each_node_three_scripts_and_reads_no_request_to_yield() {
    let (nodes, redlock) = common::local_with(3, |b| b.retry(RETRY)).await;
    let resource = common::unique("noyield");
    let gate = redlock.line_node(&resource).expect("a gate");
    // The first term sets up the campaign observer (its first read includes the request) and
    // sends each script whole once.
    let first = redlock
        .elect(resource.as_str(), Duration::from_secs(5))
        .expect("elect");
    first.leader().await;
    first.resign().await;
    let counts = |i: usize| {
        let nodes = &nodes;
        async move {
            let scripts = common::command_calls(nodes, i, "evalsha").await
                + common::command_calls(nodes, i, "eval").await;
            (common::command_calls(nodes, i, "get").await, scripts)
        }
    };
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(counts(i).await);
    }
    let second = redlock
        .elect(resource.as_str(), Duration::from_secs(5))
        .expect("elect");
    second.leader().await;
    second.resign().await;
    for (i, (gets, scripts)) in before.into_iter().enumerate() {
        let (gets_now, scripts_now) = counts(i).await;
        let want = if i == gate { 1 } else { 2 };
        assert_eq!(gets_now - gets, want, "node {i}: GET calls in a term");
        assert_eq!(scripts_now - scripts, 3, "node {i}: scripts in a term");
    }
    redlock.close().await;
}
