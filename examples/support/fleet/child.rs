//! What a fleet child does: build its client, warm it up on a key of its own, say `READY`,
//! wait for the parent's window, contend inside it, report.

use std::time::{Duration, Instant};

use fredlock::Redlock;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::super::etcd::{Etcd, LEASE_TTL_S};
use super::super::{process_cpu, waiters};
use super::{precise_hold, unix_ns, ChildResult, Client, Work, PERMITS, TERM, TTL};

/// The window the parent sent, as this process's instants.
struct Window {
    start: tokio::time::Instant,
    end: tokio::time::Instant,
}

/// The instant of `unix_ns` on this process's monotonic clock.
fn instant_of(unix_ns_at: u64) -> tokio::time::Instant {
    let (now, now_ns) = (tokio::time::Instant::now(), unix_ns());
    match unix_ns_at.checked_sub(now_ns) {
        Some(ahead) => now + Duration::from_nanos(ahead),
        None => now
            .checked_sub(Duration::from_nanos(now_ns - unix_ns_at))
            .unwrap_or(now),
    }
}

/// Reads `GO start end` from the parent.
async fn window() -> Window {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let line = lines
        .next_line()
        .await
        .expect("read the parent")
        .expect("a GO line from the parent");
    let v: Vec<u64> = line
        .strip_prefix("GO ")
        .expect("GO start end")
        .split(' ')
        .map(|n| n.parse().expect("a number"))
        .collect();
    Window {
        start: instant_of(v[0]),
        end: instant_of(v[1]),
    }
}

/// fredlock's client for `client` (default settings but the retry: unbounded, every 5 ms plus
/// up to 5 ms of jitter, as in the other contention benchmarks).
async fn redlock(urls: &[String], client: Client) -> Redlock {
    Redlock::builder()
        .nodes(urls.to_vec())
        .retry(waiters::RETRY)
        .wake_on_release(client != Client::Polling)
        .build()
        .await
        .expect("build a Redlock")
}

/// The contender of one workload, built and warmed up.
enum Contender {
    Lock(Redlock),
    Permits(Redlock, fredlock::Semaphore),
    Rslock(rslock::LockManager),
    /// etcd's lock service: one connection (a call at a time) and one lease.
    Etcd(tokio::sync::Mutex<Etcd>, String),
}

/// A connection to etcd at `urls[0]` and a lease of [`LEASE_TTL_S`], warmed up with a lock and
/// an unlock on a key of this child's own.
async fn etcd(urls: &[String], warm: &str) -> (Etcd, String) {
    let mut etcd = Etcd::connect(&urls[0]).await.expect("connect to etcd");
    let lease = etcd.grant(LEASE_TTL_S).await.expect("an etcd lease");
    let key = etcd.lock(warm, &lease).await.expect("etcd warm-up");
    etcd.unlock(&key).await.expect("etcd warm-up");
    (etcd, lease)
}

impl Contender {
    async fn build(work: Work, client: Client, urls: &[String], key: &str, index: usize) -> Self {
        let warm = format!("{key}:warm:{index}");
        if client == Client::Etcd {
            let (etcd, lease) = etcd(urls, &warm).await;
            return Contender::Etcd(tokio::sync::Mutex::new(etcd), lease);
        }
        if client == Client::Rslock {
            let manager = waiters::rslock(urls);
            let lock = manager
                .acquire_no_guard(warm.as_bytes(), TTL)
                .await
                .expect("rslock warm-up");
            manager.unlock(&lock).await;
            return Contender::Rslock(manager);
        }
        let redlock = redlock(urls, client).await;
        if work == Work::Semaphore {
            let own = redlock.semaphore(warm, PERMITS).expect("a semaphore");
            own.acquire(TTL)
                .await
                .expect("warm-up")
                .release()
                .await
                .expect("warm-up");
            let shared = redlock.semaphore(key, PERMITS).expect("a semaphore");
            return Contender::Permits(redlock, shared);
        }
        let lock = redlock.acquire(warm.as_str(), TTL).await.expect("warm-up");
        lock.release().await.expect("warm-up");
        Contender::Lock(redlock)
    }

    /// One acquisition, held [`HOLD`](super::HOLD) and released; its wait, or `None` when the
    /// window ended first (the acquire is then dropped).
    async fn cycle(&self, key: &str, end: tokio::time::Instant) -> Option<Duration> {
        let t0 = Instant::now();
        match self {
            Contender::Lock(r) => {
                let lock = tokio::time::timeout_at(end, r.acquire(key, TTL))
                    .await
                    .ok()?
                    .expect("acquire");
                let waited = t0.elapsed();
                precise_hold().await;
                lock.release().await.expect("release");
                Some(waited)
            }
            Contender::Permits(_, s) => {
                let permit = tokio::time::timeout_at(end, s.acquire(TTL))
                    .await
                    .ok()?
                    .expect("a permit");
                let waited = t0.elapsed();
                precise_hold().await;
                permit.release().await.expect("release a permit");
                Some(waited)
            }
            Contender::Rslock(m) => {
                let lock = tokio::time::timeout_at(end, m.acquire_no_guard(key.as_bytes(), TTL))
                    .await
                    .ok()?
                    .expect("rslock acquire");
                let waited = t0.elapsed();
                precise_hold().await;
                m.unlock(&lock).await;
                Some(waited)
            }
            Contender::Etcd(etcd, lease) => {
                let mut etcd = etcd.lock().await;
                let lock = tokio::time::timeout_at(end, etcd.lock(key, lease))
                    .await
                    .ok()?
                    .expect("etcd lock");
                let waited = t0.elapsed();
                precise_hold().await;
                etcd.unlock(&lock).await.expect("etcd unlock");
                Some(waited)
            }
        }
    }
}

/// Runs a child to the end of its window and returns its result.
pub async fn run(
    work: Work,
    client: Client,
    urls: &[String],
    key: &str,
    index: usize,
) -> ChildResult {
    let contender = match work {
        Work::Election => None,
        _ => Some(Contender::build(work, client, urls, key, index).await),
    };
    // A candidate campaigns before the window (the fleet's start-up, 64 observers subscribing
    // and reading at once, is not a term's cost): the window sees the fleet in its steady state.
    if (work, client) == (Work::Election, Client::Etcd) {
        let (etcd, lease) = etcd(urls, &format!("{key}:warm:{index}")).await;
        println!("READY");
        let w = window().await;
        tokio::time::sleep_until(w.start).await;
        let cpu0 = process_cpu();
        let mut result = etcd_campaign(etcd, &lease, key, w.end).await;
        result.cpu_ms = process_cpu()
            .zip(cpu0)
            .map_or(0, |(b, a)| b.saturating_sub(a).as_millis() as u64);
        return result;
    }
    let elector = match work {
        Work::Election => {
            let redlock = warm_elector(urls, client, key, index).await;
            let election = redlock.elect(key, TTL).expect("elect");
            Some((redlock, election))
        }
        _ => None,
    };
    println!("READY");
    let w = window().await;
    tokio::time::sleep_until(w.start).await;
    let cpu0 = process_cpu();
    let mut result = match (&contender, elector) {
        (Some(c), _) => contend(c, key, w.end).await,
        (_, Some((_, e))) if client == Client::StepDown => rotate(e, w.end).await,
        (_, Some((r, e))) => campaign(&r, e, key, w.end).await,
        _ => unreachable!("a contender or an elector"),
    };
    result.cpu_ms = process_cpu()
        .zip(cpu0)
        .map_or(0, |(b, a)| b.saturating_sub(a).as_millis() as u64);
    result
}

async fn contend(contender: &Contender, key: &str, end: tokio::time::Instant) -> ChildResult {
    let mut result = ChildResult::default();
    while tokio::time::Instant::now() < end {
        let Some(waited) = contender.cycle(key, end).await else {
            break;
        };
        result.acquired += 1;
        result.waits_us.push(waited.as_micros() as u64);
    }
    result
}

async fn warm_elector(urls: &[String], client: Client, key: &str, index: usize) -> Redlock {
    let redlock = redlock(urls, client).await;
    let warm = format!("{key}:warm:{index}");
    let lock = redlock.acquire(warm.as_str(), TTL).await.expect("warm-up");
    lock.release().await.expect("warm-up");
    redlock
}

/// One campaign until `end`: each term held [`TERM`], then ended with `step_down` (the
/// campaign goes on, at the back of the line).
async fn rotate(election: fredlock::Election, end: tokio::time::Instant) -> ChildResult {
    let mut result = ChildResult::default();
    while tokio::time::Instant::now() < end {
        let Ok(_term) = tokio::time::timeout_at(end, election.leader()).await else {
            break;
        };
        let began = unix_ns();
        tokio::time::sleep(TERM).await;
        let resigned = unix_ns();
        election.step_down().await;
        result.acquired += 1;
        result.terms.push((began, resigned));
    }
    election.resign().await;
    result
}

/// Campaigns until `end` (`first`: the campaign begun before the window): each term held
/// [`TERM`], then resigned, then a new campaign.
async fn campaign(
    redlock: &Redlock,
    first: fredlock::Election,
    key: &str,
    end: tokio::time::Instant,
) -> ChildResult {
    let mut result = ChildResult::default();
    let mut first = Some(first);
    while tokio::time::Instant::now() < end {
        let election = match first.take() {
            Some(e) => e,
            None => redlock.elect(key, TTL).expect("elect"),
        };
        let Ok(_term) = tokio::time::timeout_at(end, election.leader()).await else {
            election.resign().await;
            break;
        };
        let began = unix_ns();
        tokio::time::sleep(TERM).await;
        let resigned = unix_ns();
        election.resign().await;
        result.acquired += 1;
        result.terms.push((began, resigned));
        tokio::time::sleep(TERM / 2).await;
    }
    result
}

/// [`campaign`] through etcd's election service: campaigns until `end`, each term held
/// [`TERM`], then resigned, then a new campaign half a term later. A campaign still waiting at
/// `end` is dropped with the connection (etcd then withdraws it).
async fn etcd_campaign(
    mut etcd: Etcd,
    lease: &str,
    key: &str,
    end: tokio::time::Instant,
) -> ChildResult {
    let mut result = ChildResult::default();
    while tokio::time::Instant::now() < end {
        let Ok(leader) = tokio::time::timeout_at(end, etcd.campaign(key, lease)).await else {
            break;
        };
        let leader = leader.expect("etcd campaign");
        let began = unix_ns();
        tokio::time::sleep(TERM).await;
        let resigned = unix_ns();
        etcd.resign(leader).await.expect("etcd resign");
        result.acquired += 1;
        result.terms.push((began, resigned));
        tokio::time::sleep(TERM / 2).await;
    }
    result
}
