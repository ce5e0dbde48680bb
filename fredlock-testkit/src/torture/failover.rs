//! The torture run's failover mode: every Redlock node is a Sentinel-managed group
//! ([`LocalSentinel`]: a primary, one replica, one sentinel), and a seeded schedule fails the
//! groups over while clients contend for a few resources with confirmed votes
//! (`confirm_replicas(1, ..)`):
//! - a primary killed (the sentinels promote its replica; it comes back EMPTY and is made a
//!   replica of the new primary);
//! - a primary frozen past the sentinels' down-after time (promoted around it; resumed, it is
//!   made a replica);
//! - a failover with replication held back: the replica frozen for a while (grants meanwhile
//!   reach the primary alone), then the primary killed and the replica resumed and promoted;
//! - two groups at once (a majority of 3), one with replication held back.
//!
//! Every client takes fencing tokens. Every grant's window and token go to the [`Checker`],
//! which must find no two windows of one resource overlapping (S3) and no token that is not
//! above the token of a grant made before its attempt began (the fencing guarantee under
//! failover). The negative control runs the held-back failover on a majority of the groups
//! WITHOUT confirmation while a holder holds: a second client must get the lock, and the checker
//! must report the overlap; the same with confirmation must refuse the first holder instead
//! (its replica could not confirm), on every seed.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::{Redlock, Retry};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::checker::{Checker, GrantKind, Violation, ViolationKind};
use crate::LocalSentinel;

/// What a failover run does.
#[derive(Debug, Clone)]
pub struct FailoverConfig {
    /// Seeds the fault schedule and the clients' choices.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Sentinel groups (Redlock nodes).
    pub groups: usize,
    /// Clients, each its own `Redlock`.
    pub clients: usize,
    /// Resources they contend for.
    pub resources: usize,
    /// The locks' TTL: longer than a failover takes, so a lost key would matter.
    pub ttl: Duration,
    /// `confirm_replicas(1, confirm_timeout)`.
    pub confirm_timeout: Duration,
}

impl FailoverConfig {
    /// 3 groups, 6 clients on 2 resources, TTL 5 s, confirmation within 200 ms.
    pub fn new(seed: u64, duration: Duration) -> FailoverConfig {
        FailoverConfig {
            seed,
            duration,
            groups: 3,
            clients: 6,
            resources: 2,
            ttl: Duration::from_secs(5),
            confirm_timeout: Duration::from_millis(200),
        }
    }
}

/// What a failover run saw.
#[derive(Debug)]
pub struct FailoverReport {
    /// Grants checked.
    pub grants: usize,
    /// Acquires that gave up (no quorum of confirmed votes within their wait).
    pub unavailable: usize,
    /// Fault episodes, by kind: killed, frozen, held back, two groups at once.
    pub episodes: [usize; 4],
    /// The checker's violations in the main run.
    pub violations: Vec<Violation>,
    /// The control without confirmation: overlaps the checker reported (must be at least 1).
    pub control_overlaps: usize,
    /// The control without confirmation: fencing tokens not above an earlier grant's (the
    /// second holder's token, from counters the failover rolled back; reported, not required).
    pub control_fencing: usize,
    /// The control with confirmation: whether the first holder was refused (must be).
    pub control_confirmed_refused: bool,
}

impl FailoverReport {
    /// Whether both halves of the control behaved.
    pub fn control_caught(&self) -> bool {
        self.control_overlaps > 0 && self.control_confirmed_refused
    }
}

type Groups = Arc<Vec<Mutex<LocalSentinel>>>;

/// Runs the failover mode and its control.
pub async fn run(config: FailoverConfig) -> io::Result<FailoverReport> {
    let groups = start_groups(config.groups).await?;
    let urls = urls(&groups).await;
    let checker = Arc::new(Checker::new(0.01));
    let stop = Arc::new(AtomicBool::new(false));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let mut clients = JoinSet::new();
    for c in 0..config.clients {
        let redlock = build(&urls, Some(config.confirm_timeout)).await?;
        let (checker, stop, unavailable) = (checker.clone(), stop.clone(), unavailable.clone());
        let config = config.clone();
        clients.spawn(async move {
            client(c, redlock, &config, &checker, &stop, &unavailable).await;
        });
    }
    let episodes = faults(&groups, &config).await;
    stop.store(true, Ordering::Release);
    while let Some(done) = clients.join_next().await {
        done.map_err(|e| io::Error::other(format!("a client panicked: {e}")))?;
    }
    let episodes = episodes?;
    let report = checker.finish(&HashMap::new());
    drop(groups);
    let (control_overlaps, control_fencing) = control(false).await?.unwrap_or((0, 0));
    let control_confirmed_refused = control(true).await?.is_none();
    Ok(FailoverReport {
        grants: report.grants,
        unavailable: unavailable.load(Ordering::Relaxed),
        episodes,
        violations: report.violations,
        control_overlaps,
        control_fencing,
        control_confirmed_refused,
    })
}

async fn start_groups(n: usize) -> io::Result<Groups> {
    let mut starting = JoinSet::new();
    for _ in 0..n {
        starting.spawn(LocalSentinel::start(1, 1));
    }
    let mut groups = Vec::with_capacity(n);
    while let Some(started) = starting.join_next().await {
        let group = started.map_err(|e| io::Error::other(format!("a group's start: {e}")))?;
        groups.push(Mutex::new(group?));
    }
    Ok(Arc::new(groups))
}

async fn urls(groups: &Groups) -> Vec<String> {
    let mut urls = Vec::with_capacity(groups.len());
    for g in groups.iter() {
        urls.push(g.lock().await.url());
    }
    urls
}

async fn build(urls: &[String], confirm: Option<Duration>) -> io::Result<Redlock> {
    let mut builder = Redlock::builder()
        .nodes(urls.to_vec())
        .connect_wait(Duration::from_secs(20))
        .require_quorum(true)
        .fencing_tokens(true)
        .retry(Retry {
            attempts: 20,
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(50),
        });
    if let Some(timeout) = confirm {
        builder = builder.confirm_replicas(1, timeout);
    }
    builder
        .build()
        .await
        .map_err(|e| io::Error::other(e.to_string()))
}

/// One client: acquire a resource (waiting at most 2 s), hold it briefly, release; every grant
/// recorded with its window.
async fn client(
    c: usize,
    redlock: Redlock,
    config: &FailoverConfig,
    checker: &Checker,
    stop: &AtomicBool,
    unavailable: &AtomicUsize,
) {
    let mut rng = StdRng::seed_from_u64(config.seed ^ (c as u64 + 1).wrapping_mul(0x9e37));
    while !stop.load(Ordering::Acquire) {
        let resource = format!("failover:{}", rng.random_range(0..config.resources));
        let hold = Duration::from_millis(rng.random_range(0..30));
        match redlock
            .acquire_with(&resource, config.ttl, Duration::from_secs(2))
            .await
        {
            Ok(lock) => {
                let id = checker.grant(c, &lock, GrantKind::Acquire, Instant::now());
                if let Some(token) = lock.fencing_token() {
                    checker.fencing_token(id, &resource, token);
                }
                tokio::time::sleep(hold).await;
                checker.close(id, Instant::now(), lock.deadline());
                let _ = lock.release().await;
            }
            Err(_) => {
                unavailable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    redlock.close().await;
}

/// The seeded schedule: one episode after another until the run's time is up.
async fn faults(groups: &Groups, config: &FailoverConfig) -> io::Result<[usize; 4]> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let end = Instant::now() + config.duration;
    let mut episodes = [0; 4];
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
        let kind = rng.random_range(0..4);
        let g = rng.random_range(0..groups.len());
        match kind {
            0..=2 => episode(&groups[g], kind, Duration::ZERO).await?,
            _ => {
                let h = (g + 1 + rng.random_range(0..groups.len() - 1)) % groups.len();
                let (a, b) = tokio::join!(
                    episode(&groups[g], 2, Duration::from_millis(300)),
                    episode(&groups[h], rng.random_range(0..2), Duration::ZERO)
                );
                a?;
                b?;
            }
        }
        episodes[kind] += 1;
    }
    Ok(episodes)
}

/// One group's failover of `kind` (0 killed, 1 frozen, 2 held back for `held` or 300 ms),
/// waited for to the end: the new primary serving, the old one back as its replica.
async fn episode(group: &Mutex<LocalSentinel>, kind: usize, held: Duration) -> io::Result<()> {
    let mut g = group.lock().await;
    let old = g.primary().await?;
    let replica = (old + 1) % g.data().len();
    match kind {
        0 => {
            g.kill_primary().await?;
            g.wait_new_primary(old).await?;
            g.start_node(old).await
        }
        1 => {
            g.pause_primary().await?;
            let waited = g.wait_new_primary(old).await;
            g.resume(old)?;
            waited?;
            g.wait_rejoined(old).await
        }
        _ => {
            g.hold_replication(replica).await?;
            tokio::time::sleep(held.max(Duration::from_millis(300))).await;
            let killed = g.kill_primary().await;
            g.resume(replica)?;
            killed?;
            g.wait_new_primary(old).await?;
            g.start_node(old).await
        }
    }
}

/// The control: a holder takes `failover:control` while the replicas of a majority of the
/// groups are frozen, then those groups fail over (primaries killed, replicas resumed and
/// promoted) and a second client asks for the lock. Without confirmation (`confirm` false)
/// the second client gets it: the overlaps the checker reports. With confirmation the holder's
/// acquire must fail: `None`.
async fn control(confirm: bool) -> io::Result<Option<(usize, usize)>> {
    let groups = start_groups(3).await?;
    let urls = urls(&groups).await;
    let timeout = confirm.then_some(Duration::from_millis(200));
    let (first, second) = (build(&urls, timeout).await?, build(&urls, timeout).await?);
    let checker = Checker::new(0.01);
    let ttl = Duration::from_secs(20);
    let mut replicas = Vec::new();
    for g in &groups[..2] {
        let g = g.lock().await;
        let replica = (g.primary().await? + 1) % g.data().len();
        g.hold_replication(replica).await?;
        replicas.push(replica);
    }
    let held = first.try_acquire("failover:control", ttl).await;
    for (g, &replica) in groups[..2].iter().zip(&replicas) {
        let mut g = g.lock().await;
        let old = g.kill_primary().await;
        g.resume(replica)?;
        g.wait_new_primary(old?).await?;
    }
    let Ok(Some(holder)) = held else {
        first.close().await;
        second.close().await;
        return Ok(None);
    };
    let a = checker.grant(0, &holder, GrantKind::TryAcquire, Instant::now());
    if let Some(token) = holder.fencing_token() {
        checker.fencing_token(a, "failover:control", token);
    }
    let taken = second
        .acquire_with("failover:control", ttl, Duration::from_secs(10))
        .await;
    if let Ok(lock) = &taken {
        let b = checker.grant(1, lock, GrantKind::Acquire, Instant::now());
        if let Some(token) = lock.fencing_token() {
            checker.fencing_token(b, "failover:control", token);
        }
        checker.close(b, Instant::now(), lock.deadline());
    }
    checker.close(a, Instant::now(), holder.deadline());
    first.close().await;
    second.close().await;
    let report = checker.finish(&HashMap::new());
    Ok(Some((
        report.count(ViolationKind::Overlap),
        report.count(ViolationKind::FencingOrder),
    )))
}
