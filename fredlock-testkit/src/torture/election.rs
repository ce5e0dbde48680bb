//! The torture run's election mode: candidates campaign in one election while observers watch
//! it, under a seeded schedule of faults (the leader cut off as if killed, its replies held as
//! if paused, every candidate cut off, observers' connections reset, resigns). Each
//! participant's every term is recorded from `Election::role_changes`, which skips none (the
//! role watch keeps only the latest value). Afterwards the checker (`election_check.rs`)
//! confirms that:
//! - no two participants acted as leader with overlapping validity (each participant's window
//!   runs from seeing itself leader to the earlier of seeing itself follower and its term's
//!   last `valid_until`);
//! - term numbers only grow (windows in start order have strictly growing terms);
//! - no observer named a superseded term for longer than a bound: a term is superseded when
//!   the next term begins, or at the latest one TTL after its leader's window ended (a leader
//!   whose replies were held may have extended its keys just before it stepped down); an
//!   observer may name it until then plus `bound`. A term that no participant held (a claim
//!   given up: its record reached a quorum, its replies did not) is superseded at the latest
//!   one TTL after an observer first named it, when its keys are gone.
//!
//! The negative control is an observer that never resyncs: subscribed on every node, it reads
//! once at the start and then only when a message arrives, never after a reconnect or at a
//! term's expiry. Every run cuts every candidate off at least once while a leader stands
//! (nothing publishes that the term ended), which leaves the control naming a dead term: the
//! checker must report it, on every seed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fredlock::{ElectOptions, Election, Redlock, Retry, Role};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::election_check::{check_leaders, check_observer, superseded, unheld, Timeline, Window};
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
    /// Terms an observer named that no participant held: claims given up (the candidate won
    /// the lock and wrote the term's record on a quorum, but the replies came too late, so it
    /// never led). Allowed only until their keys expire, like a superseded term.
    pub unheld: usize,
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

/// Records a participant's leader windows from its role changes: every value its role takes,
/// none skipped (a term won and lost at once included). The role watch would keep only the
/// latest value, and the checker could then not tell a term too short to see from a term
/// nobody held.
fn record_windows(id: usize, election: &Election, log: &Arc<RoleLog>) {
    let mut changes = election.role_changes();
    let windows = log.clone();
    let recorder = tokio::spawn(async move {
        let windows = &windows.windows;
        let mut open: Option<(u64, Instant, Instant)> = None;
        while let Some(role) = changes.recv().await {
            let now = Instant::now();
            match role {
                Role::Leader(term) => {
                    let start = match open {
                        Some((t, start, _)) if t == term.number() => start,
                        // Not sent by the campaign (a step down comes between two terms).
                        Some((t, start, valid)) => {
                            lock(windows).push((id, t, start, now.min(valid)));
                            now
                        }
                        None => now,
                    };
                    open = Some((term.number(), start, term.valid_until));
                }
                Role::Follower => {
                    if let Some((t, start, valid)) = open.take() {
                        lock(windows).push((id, t, start, now.min(valid)));
                    }
                }
            }
        }
        // The campaign stopped (resigned) while a term was open.
        if let Some((t, start, valid)) = open.take() {
            lock(windows).push((id, t, start, Instant::now().min(valid)));
        }
    });
    lock(&log.recorders).push(recorder);
}

/// The participants' leader windows, and the tasks that record them (each ends once its
/// election has resigned and its campaign stopped).
#[derive(Default)]
struct RoleLog {
    windows: Mutex<Vec<Window>>,
    recorders: Mutex<Vec<JoinHandle<()>>>,
}

impl RoleLog {
    /// Every window, once every recorder has ended (all elections resigned); `None` if one
    /// has not ended within `limit`.
    async fn finish(&self, limit: Duration) -> Option<Vec<Window>> {
        let recorders = std::mem::take(&mut *lock(&self.recorders));
        let all = async {
            for r in recorders {
                let _ = r.await;
            }
        };
        tokio::time::timeout(limit, all).await.ok()?;
        Some(lock(&self.windows).clone())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn elect(c: &mut Candidate, id: usize, ttl: Duration, log: &Arc<RoleLog>) {
    let options = ElectOptions::default().value(format!("candidate-{id}"));
    match c.redlock.elect_with_options(NAME, ttl, options) {
        Ok(e) => {
            record_windows(id, &e, log);
            c.election = Some(e);
        }
        Err(e) => panic!("election torture: elect: {e}"),
    }
}

/// The election's name.
pub const NAME: &str = "torture:election";

/// A real observer's record.
fn record_observer(observer: &fredlock::Observer, timeline: Arc<Mutex<Timeline>>) {
    let mut rx = observer.watch();
    tokio::spawn(async move {
        loop {
            let term = rx.borrow_and_update().as_ref().map(|l| l.term);
            lock(&timeline).push((Instant::now(), term));
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The control: subscribed on every node, it reads (`leader_of`) once when subscribed and then
/// only when a message arrives; never after a reconnect, never at a term's expiry. So when
/// every candidate is cut off (nothing publishes that the term ended), it names the dead term
/// until the next claim publishes. Stops when `stop` fires.
async fn naive_observer(
    redlock: Redlock,
    timeline: Arc<Mutex<Timeline>>,
    mut stop: oneshot::Receiver<()>,
) {
    let channel = redlock.election_key(NAME);
    let (heard_tx, mut heard) = mpsc::unbounded_channel();
    let mut clients = Vec::new();
    let mut listeners = JoinSet::new();
    let configs: Vec<_> = (0..)
        .map_while(|i| redlock.client(i))
        .map(ClientLike::client_config)
        .collect();
    for config in configs {
        let mut builder = fredlock::fred::types::Builder::from_config(config);
        builder.set_policy(fredlock::fred::prelude::ReconnectPolicy::new_constant(
            0, 50,
        ));
        let Ok(client) = builder.build() else {
            continue;
        };
        let (messages, reconnects) = (client.message_rx(), client.reconnect_rx());
        if client.init().await.is_err() {
            continue;
        }
        let _ = client.subscribe(channel.clone()).await;
        let heard = heard_tx.clone();
        listeners.spawn(listen(
            client.clone(),
            channel.clone(),
            messages,
            reconnects,
            heard,
        ));
        clients.push(client);
    }
    drop(heard_tx);
    let mut last = None;
    loop {
        // A read that fails is tried again (a few times): the control's flaw is what it never
        // reads after, not reads that fail.
        for _ in 0..5 {
            if let Ok(l) = redlock.leader_of(NAME).await {
                let term = l.map(|l| l.term);
                if last != Some(term) {
                    last = Some(term);
                    lock(&timeline).push((Instant::now(), term));
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::select! {
            _ = &mut stop => break,
            heard = heard.recv() => if heard.is_none() { break },
        }
    }
    listeners.abort_all();
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
    }
}

type Messages = tokio::sync::broadcast::Receiver<fredlock::fred::types::Message>;
type Reconnects = tokio::sync::broadcast::Receiver<fredlock::fred::types::config::Server>;

/// One node's subscriber of the control: tells `heard` of every message; subscribes again
/// after a reconnect (so it keeps hearing messages), but asks for no read then.
async fn listen(
    client: Client,
    channel: String,
    mut messages: Messages,
    mut reconnects: Reconnects,
    heard: mpsc::UnboundedSender<()>,
) {
    loop {
        tokio::select! {
            m = messages.recv() => match m {
                Err(RecvError::Closed) => return,
                // A message, or some were dropped: read.
                _ => if heard.send(()).is_err() { return },
            },
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
    let log: Arc<RoleLog> = Arc::default();
    let mut candidates = Vec::new();
    for id in 0..config.candidates {
        let proxies = proxies(&nodes).await?;
        let redlock = redlock_over(&proxies).await;
        let mut c = Candidate {
            proxies,
            redlock,
            election: None,
        };
        elect(&mut c, id, config.ttl, &log);
        candidates.push(c);
    }
    let mut observers = Vec::new();
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
        record_observer(&observer, timeline.clone());
        timelines.push(timeline);
        observers.push(observer);
        observer_proxies.push((proxies, redlock));
    }
    let control_proxies = proxies(&nodes).await?;
    let control_redlock = redlock_over(&control_proxies).await;
    let control: Arc<Mutex<Timeline>> = Arc::default();
    let (stop_control, stop) = oneshot::channel();
    let control_task = tokio::spawn(naive_observer(control_redlock, control.clone(), stop));

    let started = Instant::now();
    let episodes = schedule(
        &config,
        &mut candidates,
        &observer_proxies,
        &control_proxies,
        &log,
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
    let _ = stop_control.send(());
    let _ = control_task.await;
    for o in observers {
        o.close().await;
    }
    let windows = log.finish(Duration::from_secs(10)).await;
    let timelines: Vec<Timeline> = timelines.iter().map(|t| lock(t).clone()).collect();
    let control = lock(&control).clone();
    Ok(check(
        &config,
        windows,
        &timelines,
        &control,
        episodes,
        (started, end),
    ))
}

/// Checks the records of a run (`windows`: `None` when a recorder did not finish).
fn check(
    config: &ElectionConfig,
    windows: Option<Vec<Window>>,
    timelines: &[Timeline],
    control: &Timeline,
    episodes: usize,
    span: (Instant, Instant),
) -> ElectionReport {
    let mut report = ElectionReport {
        episodes,
        observed: timelines.iter().map(Vec::len).sum(),
        ..ElectionReport::default()
    };
    let Some(windows) = windows else {
        report
            .violations
            .push("a participant's role log did not end after it resigned".to_string());
        return report;
    };
    report.terms = windows.len();
    report.violations = check_leaders(&windows);
    let named: Vec<&Timeline> = timelines.iter().chain([control]).collect();
    let superseded = superseded(&windows, &named, config.ttl, span.1);
    report.unheld = unheld(&superseded).len();
    for (i, t) in timelines.iter().enumerate() {
        let who = format!("observer {i}");
        report
            .violations
            .extend(check_observer(&who, t, &superseded, config.bound, span));
    }
    report.control_violations = check_observer("control", control, &superseded, config.bound, span);
    report
}

/// The fault schedule: episodes until the run's time is up. Returns how many ran.
///
/// At least one episode cuts every candidate off while a leader stands: if none has by half
/// of the run, the next episode that finds a leader does (the run goes on until one has, for
/// at most twice its time). That is the episode that leaves the control naming a dead term,
/// so every seed tests that the checker catches it.
async fn schedule(
    config: &ElectionConfig,
    candidates: &mut [Candidate],
    observers: &[(Vec<FaultProxy>, Redlock)],
    control: &[FaultProxy],
    log: &Arc<RoleLog>,
) -> usize {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let ttl = config.ttl;
    let half = Instant::now() + config.duration / 2;
    let until = Instant::now() + config.duration;
    let mut episodes = 0;
    let mut cut_off_a_leader = false;
    // Past the run's time only while that cut-off has not come (a leader stood at no episode
    // since half-way), and for at most another run's time.
    let last_call = until + config.duration;
    while Instant::now() < until || (!cut_off_a_leader && Instant::now() < last_call) {
        tokio::time::sleep(ttl.mul_f64(rng.random_range(0.5..1.5))).await;
        let leader = candidates
            .iter()
            .position(|c| c.election.as_ref().is_some_and(Election::is_leader));
        episodes += 1;
        let mut kind = rng.random_range(0..5u8);
        if leader.is_some() && !cut_off_a_leader && Instant::now() >= half {
            kind = 2;
        }
        cut_off_a_leader |= kind == 2 && leader.is_some();
        match (kind, leader) {
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
                elect(&mut candidates[l], l, ttl, log);
            }
            _ => episodes -= 1,
        }
    }
    episodes
}
