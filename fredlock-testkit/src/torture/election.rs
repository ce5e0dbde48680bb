//! The torture run's election mode: candidates campaign in one election while observers watch
//! it, under a seeded schedule of faults (the leader cut off as if killed, its replies held as
//! if paused, every candidate cut off, observers' connections reset, resigns). Afterwards the
//! checker confirms that:
//! - no two participants acted as leader with overlapping validity (each participant's window
//!   runs from seeing itself leader to the earlier of seeing itself follower and its term's
//!   last `valid_until`);
//! - term numbers only grow (windows in start order have strictly growing terms);
//! - no observer named a superseded term for longer than a bound: a term is superseded when
//!   the next term begins, or at the latest one TTL after its leader's window ended (a leader
//!   whose replies were held may have extended its keys just before it stepped down); an
//!   observer may name it until then plus `bound`; and an observer never names a term that no
//!   participant held.
//!
//! The negative control is an observer that never resyncs: it reads only when a message
//! arrives, never after a reconnect or at a term's expiry. The schedule's "every candidate cut
//! off" episodes leave it naming a dead term, which the checker must report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock::fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fredlock::{ElectOptions, Election, Redlock, Retry, Role};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::{Fault, FaultProxy, LocalNodes};

/// What an election run does.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Seeds the fault schedule.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Candidate participants, each behind its own fault proxies.
    pub candidates: usize,
    /// Real observers, each behind its own fault proxies (the control comes on top).
    pub observers: usize,
    /// The candidates' lock TTL.
    pub ttl: Duration,
    /// How long after a term is superseded an observer may still name it.
    pub bound: Duration,
}

impl ElectionConfig {
    /// 3 candidates, 4 observers and the control, TTL 1 s, bound 700 ms.
    pub fn new(seed: u64, duration: Duration) -> ElectionConfig {
        ElectionConfig {
            seed,
            duration,
            candidates: 3,
            observers: 4,
            ttl: Duration::from_secs(1),
            bound: Duration::from_millis(700),
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct ElectionReport {
    /// Leader windows recorded.
    pub terms: usize,
    /// Fault episodes run.
    pub episodes: usize,
    /// Changes shown by the (real) observers, in all.
    pub observed: usize,
    /// What the checker found in the participants' and the real observers' records.
    pub violations: Vec<String>,
    /// What the checker found in the never-resyncing control observer's record.
    pub control_violations: Vec<String>,
}

impl ElectionReport {
    /// The control was caught (the checker found its stale names).
    pub fn control_caught(&self) -> bool {
        !self.control_violations.is_empty()
    }
}

/// A leader window: participant, term, start, end.
type Window = (usize, u64, Instant, Instant);
/// An observer's record: when it named which term (`None`: no leader).
type Timeline = Vec<(Instant, Option<u64>)>;

const RETRY: Retry = Retry {
    attempts: 3,
    delay: Duration::from_millis(20),
    jitter: Duration::from_millis(20),
};

async fn proxies(nodes: &LocalNodes) -> std::io::Result<Vec<FaultProxy>> {
    let mut out = Vec::new();
    for i in 0..nodes.len() {
        out.push(FaultProxy::start(nodes.addr(i)).await?);
    }
    Ok(out)
}

async fn redlock_over(proxies: &[FaultProxy]) -> Redlock {
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    match Redlock::builder().nodes(urls).retry(RETRY).build().await {
        Ok(r) => r,
        Err(e) => panic!("election torture: build a Redlock: {e}"),
    }
}

fn set_all(proxies: &[FaultProxy], fault: Fault) {
    for p in proxies {
        p.set(fault);
    }
}

/// Ends a swallowing fault the way the torture run does: a short reset, then pass.
async fn heal(proxies: &[FaultProxy]) {
    set_all(proxies, Fault::Reset);
    tokio::time::sleep(super::config::RESET_HOLD).await;
    set_all(proxies, Fault::Pass);
}

struct Candidate {
    proxies: Vec<FaultProxy>,
    redlock: Redlock,
    election: Option<Election>,
}

/// Records a participant's leader windows from its role watch.
fn record_windows(id: usize, election: &Election, windows: Arc<Mutex<Vec<Window>>>) {
    let mut rx = election.watch();
    tokio::spawn(async move {
        let mut open: Option<(u64, Instant, Instant)> = None;
        loop {
            let role = rx.borrow_and_update().clone();
            let now = Instant::now();
            match role {
                Role::Leader(term) => {
                    let start = open.map_or(now, |o| o.1);
                    open = Some((term.number(), start, term.valid_until));
                }
                Role::Follower => {
                    if let Some((t, s, v)) = open.take() {
                        lock(&windows).push((id, t, s, now.min(v)));
                    }
                }
            }
            if rx.changed().await.is_err() {
                if let Some((t, s, v)) = open.take() {
                    lock(&windows).push((id, t, s, Instant::now().min(v)));
                }
                return;
            }
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn elect(c: &mut Candidate, id: usize, ttl: Duration, windows: &Arc<Mutex<Vec<Window>>>) {
    let options = ElectOptions::default().value(format!("candidate-{id}"));
    match c.redlock.elect_with_options(NAME, ttl, options) {
        Ok(e) => {
            record_windows(id, &e, windows.clone());
            c.election = Some(e);
        }
        Err(e) => panic!("election torture: elect: {e}"),
    }
}

/// The election's name.
pub const NAME: &str = "torture:election";

/// A real observer's record.
fn record_observer(observer: fredlock::Observer, timeline: Arc<Mutex<Timeline>>) {
    tokio::spawn(async move {
        let mut rx = observer.watch();
        loop {
            let term = rx.borrow_and_update().as_ref().map(|l| l.term);
            lock(&timeline).push((Instant::now(), term));
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The control: reads (`leader_of`) only when a message arrives; never after a reconnect,
/// never at a term's expiry.
async fn naive_observer(redlock: Redlock, timeline: Arc<Mutex<Timeline>>) {
    let Some(config) = redlock.client(0).map(|c| c.client_config()) else {
        return;
    };
    let mut builder = fredlock::fred::types::Builder::from_config(config);
    builder.set_policy(fredlock::fred::prelude::ReconnectPolicy::new_constant(
        0, 50,
    ));
    let Ok(client) = builder.build() else { return };
    // Subscribed on node 0 only, and re-subscribed after a reconnect (so it keeps hearing
    // messages), but it never reads on its own.
    let mut messages = client.message_rx();
    let mut reconnects = client.reconnect_rx();
    if client.init().await.is_err() {
        return;
    }
    let channel = redlock.election_key(NAME);
    let _ = client.subscribe(channel.clone()).await;
    let mut last = None;
    lock(&timeline).push((Instant::now(), None));
    loop {
        tokio::select! {
            m = messages.recv() => {
                if m.is_err() { return; }
                if let Ok(l) = redlock.leader_of(NAME).await {
                    let term = l.map(|l| l.term);
                    if term != last {
                        last = term;
                        lock(&timeline).push((Instant::now(), term));
                    }
                }
            }
            r = reconnects.recv() => {
                if r.is_err() { return; }
                let _ = client.subscribe(channel.clone()).await;
            }
        }
    }
}

/// Runs the election mode and checks it.
pub async fn run(config: ElectionConfig) -> std::io::Result<ElectionReport> {
    let nodes = LocalNodes::start(3).await?;
    let windows: Arc<Mutex<Vec<Window>>> = Arc::default();
    let mut candidates = Vec::new();
    for id in 0..config.candidates {
        let proxies = proxies(&nodes).await?;
        let redlock = redlock_over(&proxies).await;
        let mut c = Candidate {
            proxies,
            redlock,
            election: None,
        };
        elect(&mut c, id, config.ttl, &windows);
        candidates.push(c);
    }
    let mut observer_proxies = Vec::new();
    let mut timelines = Vec::new();
    for _ in 0..config.observers {
        let proxies = proxies(&nodes).await?;
        let redlock = redlock_over(&proxies).await;
        let observer = match redlock.observe(NAME).await {
            Ok(o) => o,
            Err(e) => panic!("election torture: observe: {e}"),
        };
        let timeline: Arc<Mutex<Timeline>> = Arc::default();
        record_observer(observer, timeline.clone());
        timelines.push(timeline);
        observer_proxies.push((proxies, redlock));
    }
    let control_proxies = proxies(&nodes).await?;
    let control_redlock = redlock_over(&control_proxies).await;
    let control: Arc<Mutex<Timeline>> = Arc::default();
    let control_task = tokio::spawn(naive_observer(control_redlock, control.clone()));

    let started = Instant::now();
    let episodes = schedule(
        &config,
        &mut candidates,
        &observer_proxies,
        &control_proxies,
        &windows,
    )
    .await;
    for c in &candidates {
        set_all(&c.proxies, Fault::Pass);
    }
    let end = Instant::now();
    for c in &mut candidates {
        if let Some(e) = c.election.take() {
            e.resign().await;
        }
    }
    control_task.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let windows = lock(&windows).clone();
    let timelines: Vec<Timeline> = timelines.iter().map(|t| lock(t).clone()).collect();
    let control = lock(&control).clone();
    let mut report = ElectionReport {
        terms: windows.len(),
        episodes,
        observed: timelines.iter().map(Vec::len).sum(),
        ..ElectionReport::default()
    };
    report.violations = check_leaders(&windows);
    let superseded = superseded(&windows, config.ttl, end);
    let span = (started, end);
    for (i, t) in timelines.iter().enumerate() {
        let who = format!("observer {i}");
        report
            .violations
            .extend(check_observer(&who, t, &superseded, config.bound, span));
    }
    report.control_violations =
        check_observer("control", &control, &superseded, config.bound, span);
    Ok(report)
}

/// The fault schedule: episodes until the run's time is up. Returns how many ran.
async fn schedule(
    config: &ElectionConfig,
    candidates: &mut [Candidate],
    observers: &[(Vec<FaultProxy>, Redlock)],
    control: &[FaultProxy],
    windows: &Arc<Mutex<Vec<Window>>>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let ttl = config.ttl;
    let until = Instant::now() + config.duration;
    let mut episodes = 0;
    while Instant::now() < until {
        tokio::time::sleep(ttl.mul_f64(rng.random_range(0.5..1.5))).await;
        let leader = candidates
            .iter()
            .position(|c| c.election.as_ref().is_some_and(Election::is_leader));
        episodes += 1;
        match (rng.random_range(0..5u8), leader) {
            // The leader as good as killed: nothing it sends arrives.
            (0, Some(l)) => {
                set_all(&candidates[l].proxies, Fault::Blackhole);
                tokio::time::sleep(ttl * 2).await;
                heal(&candidates[l].proxies).await;
            }
            // The leader paused: its replies held for longer than its validity.
            (1, Some(l)) => {
                set_all(&candidates[l].proxies, Fault::HoldReplies);
                tokio::time::sleep(ttl.mul_f64(1.5)).await;
                set_all(&candidates[l].proxies, Fault::Pass);
            }
            // Every candidate cut off for 4 TTLs: no leader, and no message says so.
            (2, _) => {
                for c in candidates.iter() {
                    set_all(&c.proxies, Fault::Blackhole);
                }
                tokio::time::sleep(ttl * 4).await;
                for c in candidates.iter() {
                    heal(&c.proxies).await;
                }
            }
            // An observer's (or the control's) connections reset for a while.
            (3, _) => {
                let k = rng.random_range(0..=observers.len());
                let proxies = observers.get(k).map_or(control, |o| o.0.as_slice());
                set_all(proxies, Fault::Reset);
                tokio::time::sleep(ttl.mul_f64(rng.random_range(0.1..0.5))).await;
                set_all(proxies, Fault::Pass);
            }
            // The leader resigns and campaigns again.
            (_, Some(l)) => {
                if let Some(e) = candidates[l].election.take() {
                    e.resign().await;
                }
                elect(&mut candidates[l], l, ttl, windows);
            }
            _ => episodes -= 1,
        }
    }
    episodes
}

/// Leader windows never overlap, and term numbers grow in start order.
fn check_leaders(windows: &[Window]) -> Vec<String> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| w.2);
    let mut out = Vec::new();
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.2 < a.3 {
            out.push(format!(
                "leader windows overlap: participant {} (term {}) until {:?} after participant {} (term {}) began",
                a.0, a.1, a.3 - b.2, b.0, b.1
            ));
        }
        if b.1 <= a.1 {
            out.push(format!(
                "term numbers do not grow: term {} began after term {}",
                b.1, a.1
            ));
        }
    }
    out
}

/// Per term: when it is superseded (the next term's start, or one TTL after its window ended).
fn superseded(windows: &[Window], ttl: Duration, end: Instant) -> BTreeMap<u64, Instant> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| w.1);
    let mut out = BTreeMap::new();
    for (i, w) in sorted.iter().enumerate() {
        let by_expiry = w.3 + ttl;
        let by_next = sorted.get(i + 1).map_or(end, |n| n.2);
        out.insert(w.1, by_expiry.min(by_next).max(w.2));
    }
    out
}

/// An observer names no term that nobody held, and no term longer than `bound` after it was
/// superseded.
fn check_observer(
    who: &str,
    timeline: &Timeline,
    superseded: &BTreeMap<u64, Instant>,
    bound: Duration,
    (started, end): (Instant, Instant),
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (at, term)) in timeline.iter().enumerate() {
        let Some(term) = term else { continue };
        // Up to the end of the run (the resigns after it are not part of the schedule).
        let until = timeline.get(i + 1).map_or(end, |n| n.0).min(end);
        match superseded.get(term) {
            // A term below the highest recorded one that no window recorded: a term so short
            // that the participant's role watch (which keeps only the latest value) went from
            // leader back to follower before the recorder looked. Not flagged: the recorder
            // cannot tell it from a term nobody held. Above every recorded term, nobody held it.
            None if superseded.keys().next_back().is_some_and(|max| term < max) => {}
            None => out.push(format!("{who} named term {term}, which no participant held")),
            Some(s) if until > *s + bound && until > started => out.push(format!(
                "{who} named term {term} until {:?} after it was superseded (bound {bound:?}; shown since {:?} before that)",
                until - *s,
                s.saturating_duration_since(*at)
            )),
            _ => {}
        }
    }
    out
}
