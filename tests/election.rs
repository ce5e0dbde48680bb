//! Leader election under faults: three participants, each behind its own fault proxies; the
//! leader is repeatedly cut off (connections reset, as when its process dies) or frozen (replies
//! held, as when it pauses). Leader windows never overlap, and a new leader follows within
//! TTL + the maximum retry pause of the old one stepping down.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock::{Election, Retry, Role};
use fredlock_testkit::{Fault, FaultProxy, LocalNodes};
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(500);
const RETRY: Retry = common::retry(3, 50, 50);
const RUN: Duration = Duration::from_secs(20);

struct Participant {
    proxies: Vec<FaultProxy>,
    election: Election,
    /// Closed leader windows: (became leader, stopped being leader or validity ended).
    windows: Arc<Mutex<Vec<(Instant, Instant)>>>,
}

impl Participant {
    fn set(&self, fault: Fault) {
        for p in &self.proxies {
            p.set(fault);
        }
    }
}

/// Records leader windows as seen by an observer: the start when it sees Leader, the end at the
/// earlier of seeing Follower and the last validity it was told.
fn observe(election: &Election, windows: Arc<Mutex<Vec<(Instant, Instant)>>>) {
    let mut rx = election.watch();
    tokio::spawn(async move {
        let mut open: Option<(Instant, Instant)> = None;
        loop {
            let role = rx.borrow_and_update().clone();
            let now = Instant::now();
            match role {
                Role::Leader(term) => {
                    let start = open.map(|(s, _)| s).unwrap_or(now);
                    open = Some((start, term.valid_until));
                }
                Role::Follower => {
                    if let Some((start, valid_until)) = open.take() {
                        windows.lock().unwrap().push((start, now.min(valid_until)));
                    }
                }
            }
            if rx.changed().await.is_err() {
                if let Some((start, valid_until)) = open.take() {
                    windows
                        .lock()
                        .unwrap()
                        .push((start, Instant::now().min(valid_until)));
                }
                return;
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_never_overlap_and_fail_over_in_time() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let resource = common::unique("leader");
    let mut participants = Vec::new();
    for _ in 0..3 {
        let (proxies, redlock) = common::behind_proxies(&nodes, |b| b.retry(RETRY)).await;
        let election = redlock.elect(resource.as_str(), TTL).unwrap();
        let windows = Arc::new(Mutex::new(Vec::new()));
        observe(&election, windows.clone());
        participants.push(Participant {
            proxies,
            election,
            windows,
        });
    }

    let started = Instant::now();
    let mut faults = 0;
    while started.elapsed() < RUN {
        // Wait for a leader, let it lead for a while, then take it out.
        let leader = loop {
            if let Some(i) = participants.iter().position(|p| p.election.is_leader()) {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        tokio::time::sleep(TTL * 3).await;
        let p = &participants[leader];
        let fault = if faults % 2 == 0 {
            Fault::Reset
        } else {
            Fault::HoldReplies
        };
        faults += 1;
        p.set(fault);
        // Until it stepped down, plus a TTL: a dead process stays dead for a while.
        let mut rx = p.election.watch();
        while rx.borrow_and_update().is_leader() {
            let _ = tokio::time::timeout(TTL, rx.changed()).await;
        }
        tokio::time::sleep(TTL).await;
        p.set(Fault::Pass);
    }
    for p in participants.iter() {
        p.set(Fault::Pass);
    }
    let mut all: Vec<(usize, Instant, Instant)> = Vec::new();
    for (i, p) in participants.into_iter().enumerate() {
        p.election.resign().await;
        // The observer closes its window when the watch ends; give it a moment to record it.
        tokio::task::yield_now().await;
        all.extend(p.windows.lock().unwrap().iter().map(|&(s, e)| (i, s, e)));
    }
    all.sort_by_key(|w| w.1);
    println!(
        "{faults} faults over {:?}, {} leader terms",
        started.elapsed(),
        all.len()
    );
    assert!(faults >= 4, "only {faults} faults injected");
    assert!(
        all.len() > faults,
        "{} terms for {faults} faults",
        all.len()
    );
    let max_gap = TTL + RETRY.delay + RETRY.jitter;
    let mut worst_gap = Duration::ZERO;
    for pair in all.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            b.1 >= a.2,
            "leader windows overlap: participant {} until {:?}, participant {} from {:?}",
            a.0,
            a.2,
            b.0,
            b.1
        );
        let gap = b.1 - a.2;
        worst_gap = worst_gap.max(gap);
        // A wide margin for a loaded machine: connection resets make fred reconnect, and each
        // observer sees changes only when scheduled.
        assert!(
            gap <= max_gap + Duration::from_millis(200),
            "failover took {gap:?} (bound {max_gap:?})"
        );
    }
    println!("worst failover gap {worst_gap:?} (bound {max_gap:?} + margin)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_ended_fires_when_the_term_is_lost() {
    let nodes = LocalNodes::start(3).await.unwrap();
    let (proxies, redlock) = common::behind_proxies(&nodes, |b| b.retry(RETRY)).await;
    let election = redlock.elect(common::unique("term").as_str(), TTL).unwrap();
    let term = election.leader().await;
    assert_eq!(
        election.current_term().map(|t| t.token().to_string()),
        Some(term.token().to_string())
    );
    // Cut it off: the term must end no later than its validity.
    for p in &proxies {
        p.set(Fault::Reset);
    }
    let ended = tokio::time::timeout(TTL * 2, election.term_ended(&term)).await;
    assert!(ended.is_ok(), "term_ended did not fire within 2 TTLs");
    let latest = election
        .role()
        .term()
        .map(|t| t.valid_until)
        .unwrap_or(term.valid_until);
    assert!(Instant::now() <= latest.max(term.valid_until) + Duration::from_millis(50));
    assert!(election.current_term().is_none());
    election.resign().await;
}

/// A campaign whose task ends without a resign (here its runtime shuts down while it leads):
/// the `Election` says at once that it no longer leads (its lock went with the task), and a
/// `step_down` answers at once instead of waiting for a task that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_gone_with_its_runtime_no_longer_leads() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let r = common::unique("runtime-gone");
    let election = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let election = rt.block_on(async {
            let redlock = common::build(urls, |b| b).await;
            let election = redlock
                .elect(r.as_str(), Duration::from_secs(30))
                .expect("elect");
            election.leader().await;
            election
        });
        drop(rt);
        election
    })
    .join()
    .expect("the runtime's thread");
    assert!(!election.is_leader());
    assert!(election.watch().borrow().term().is_none(), "a follower");
    let answered = tokio::time::timeout(Duration::from_secs(5), election.step_down()).await;
    assert_eq!(answered.ok(), Some(false), "not leading: answered at once");
}

/// `step_down` ends the term and keeps the candidate campaigning at the back of the line:
/// leadership goes round the candidates in the order they joined (a, b, c, then a again), a new
/// term each time; a candidate that does not lead is told so and keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepping_down_passes_the_term_round_the_line() {
    let (nodes, first) = common::local_with(3, |b| b.retry(RETRY)).await;
    let mut redlocks = vec![first];
    for _ in 0..2 {
        redlocks.push(common::build(nodes.urls(), |b| b.retry(RETRY)).await);
    }
    let r = common::unique("rotate");
    let ttl = Duration::from_secs(10);
    let a = redlocks[0].elect(r.as_str(), ttl).expect("elect");
    let mut last = a.leader().await.number();
    let b = redlocks[1].elect(r.as_str(), ttl).expect("elect");
    assert!(common::lines::line_has(&nodes, &redlocks[1], &r, 1).await);
    let c = redlocks[2].elect(r.as_str(), ttl).expect("elect");
    assert!(common::lines::line_has(&nodes, &redlocks[2], &r, 2).await);
    assert!(!b.step_down().await, "b does not lead");
    for (from, to) in [(&a, &b), (&b, &c), (&c, &a)] {
        assert!(from.step_down().await, "the leader steps down");
        let term = tokio::time::timeout(Duration::from_secs(10), to.leader())
            .await
            .expect("the first in line leads next");
        assert!(term.number() > last, "a new term");
        last = term.number();
        assert!(!from.is_leader());
        // The one that stepped down waits in line again, behind the other.
        assert!(common::lines::line_has(&nodes, &redlocks[0], &r, 2).await);
    }
    for e in [a, b, c] {
        e.resign().await;
    }
}
