//! The semaphore, read-write and fencing negative controls: fixed schedules of partitions and
//! restarts under which the strawmen (per-node counting, max-of-INCR tokens) and a node restarting EMPTY
//! break the mode's invariant, which the checker MUST find; and fredlock under the same
//! schedules (and with a durable node), where it must find nothing.
//!
//! Owns these scenarios: which holder reaches which majority (a client whose proxies to the
//! other nodes reset every connection), and what each records with a fresh checker. Must not
//! use the torture run's schedule, lanes or workers.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use fredlock::fred::clients::Client;
use fredlock::{Lock, Redlock, Retry};
use tokio::time::Instant;

use super::env::io_err;
use super::schedule::ms;
use super::verdict::{control, ControlResult};
use crate::checker::{Checker, CheckerReport, GrantKind, GrantRecord, ViolationKind};
use crate::strawman::{NaiveFencing, NaiveRwLock, NaiveSemaphore};
use crate::{FaultProxy, LocalNodes};

/// Three holders of a 2-permit semaphore, each reaching a different majority of three nodes.
const SEMAPHORE_VIEWS: [[usize; 2]; 3] = [[0, 1], [1, 2], [0, 2]];
/// Four successive grants on these majorities: max-of-INCR gives tokens 1, 2, 3, 3.
const FENCING_VIEWS: [[usize; 2]; 4] = [[0, 1], [0, 2], [0, 1], [1, 2]];
const TTL: Duration = Duration::from_secs(5);

/// The semaphore and fencing controls, in report order.
pub(super) async fn mode_controls() -> Vec<ControlResult> {
    let over = Some(ViolationKind::OverPermits);
    let order = Some(ViolationKind::FencingOrder);
    vec![
        control(
            "semaphore counted per node (strawman), 3 holders on 3 majorities, 2 permits",
            "2",
            over,
            naive_semaphore(),
        )
        .await,
        control(
            "fredlock semaphore, same partitions",
            "2",
            None,
            slot_semaphore(),
        )
        .await,
        control(
            "read-write lock counting readers per node (strawman), a reader on [2], a writer on [0,1]",
            "2",
            Some(ViolationKind::RwOverlap),
            naive_rwlock(),
        )
        .await,
        control(
            "fredlock read-write lock, same partitions",
            "2",
            None,
            quorum_rwlock(),
        )
        .await,
        control(
            "fencing by max of INCR (strawman), grants on [0,1] [0,2] [0,1] [1,2]",
            "2",
            order,
            naive_fencing(),
        )
        .await,
        control(
            "fredlock fencing, same grants",
            "2",
            None,
            write_back_fencing(&FENCING_VIEWS, None),
        )
        .await,
        control(
            "fencing: node 1 restarted EMPTY between grants on [0,1] and [1,2]",
            "11",
            order,
            write_back_fencing(&[[0, 1], [1, 2]], Some(false)),
        )
        .await,
        control(
            "same, node 1 durable (restarted with its counters)",
            "11",
            None,
            write_back_fencing(&[[0, 1], [1, 2]], Some(true)),
        )
        .await,
    ]
}

/// A `Redlock` that reaches only the nodes in `view` (the proxies to the others reset every
/// connection), and its proxies (which must live as long as it is used).
async fn reaching(
    nodes: &LocalNodes,
    view: &[usize],
    fencing: bool,
) -> io::Result<(Redlock, Vec<FaultProxy>)> {
    let proxies = FaultProxy::partition(nodes, view).await?;
    let redlock = Redlock::builder()
        .nodes(proxies.iter().map(FaultProxy::url))
        .node_timeout(ms(200))
        .connect_wait(ms(300))
        .fencing_tokens(fencing)
        .retry(Retry {
            attempts: 20,
            delay: ms(5),
            jitter: ms(5),
        })
        .build()
        .await
        .map_err(io_err)?;
    Ok((redlock, proxies))
}

/// Direct clients of the nodes in `view`.
async fn clients(nodes: &LocalNodes, view: &[usize]) -> io::Result<(Redlock, Vec<Client>)> {
    let direct = Redlock::builder()
        .nodes(nodes.urls())
        .build()
        .await
        .map_err(io_err)?;
    let clients = view
        .iter()
        .map(|&i| direct.client(i).cloned().ok_or_else(|| io_err("no client")))
        .collect::<io::Result<Vec<Client>>>()?;
    Ok((direct, clients))
}

fn checker() -> Checker {
    Checker::new(fredlock::config::DEFAULT_DRIFT_FACTOR)
}

/// Records a grant the strawman admitted (it has no `Lock`): its window is `[now, deadline]`.
fn record_admitted(checker: &Checker, client: usize, t0: Instant, what: String) -> u64 {
    checker.record_grant(GrantRecord {
        client,
        kind: GrantKind::Control,
        token: what.clone(),
        resources: vec![what],
        ttl: TTL,
        t0: Some(t0),
        granted_at: Instant::now(),
        deadline: t0.checked_add(checker.validity(TTL)).unwrap_or(t0),
    })
}

/// Per-node counting: each holder asks only the majority it reaches; all three are admitted.
async fn naive_semaphore() -> io::Result<(CheckerReport, String)> {
    let nodes = LocalNodes::start(3).await?;
    let checker = checker();
    let naive = NaiveSemaphore::new("control", 2, TTL);
    let mut admitted = Vec::new();
    for (h, view) in SEMAPHORE_VIEWS.iter().enumerate() {
        let (_direct, clients) = clients(&nodes, view).await?;
        let t0 = Instant::now();
        if naive.acquire(&clients, 3, &format!("holder-{h}")).await {
            let g = record_admitted(&checker, h, t0, format!("naive-holder-{h}"));
            checker.permit(g, "control", 2);
            admitted.push(h);
        }
    }
    let detail = format!("admitted holders {admitted:?}, each by a different majority");
    Ok((checker.finish(&HashMap::new()), detail))
}

/// fredlock's semaphore under the same partitions: at most two holders.
async fn slot_semaphore() -> io::Result<(CheckerReport, String)> {
    let nodes = LocalNodes::start(3).await?;
    let checker = checker();
    let mut held = Vec::new();
    for (h, view) in SEMAPHORE_VIEWS.iter().enumerate() {
        let (redlock, proxies) = reaching(&nodes, view, false).await?;
        let sem = redlock.semaphore("control", 2).map_err(io_err)?;
        if let Some(permit) = sem.try_acquire(TTL).await.ok().flatten() {
            let g = checker.grant(h, permit.lock(), GrantKind::Permit, Instant::now());
            checker.permit(g, "control", 2);
            held.push((permit, redlock, proxies));
        }
    }
    let detail = format!("{} of 3 holders got a permit", held.len());
    Ok((checker.finish(&HashMap::new()), detail))
}

/// A reader reaching node 2 only, then a writer reaching nodes 0 and 1: both admitted by the
/// strawman, whose reader needs no quorum.
async fn naive_rwlock() -> io::Result<(CheckerReport, String)> {
    let nodes = LocalNodes::start(3).await?;
    let checker = checker();
    let naive = NaiveRwLock::new("control", TTL);
    let mut admitted = Vec::new();
    for (h, (view, write)) in [(&[2][..], false), (&[0, 1][..], true)]
        .into_iter()
        .enumerate()
    {
        let (_direct, clients) = clients(&nodes, view).await?;
        let t0 = Instant::now();
        let ok = if write {
            naive.write(&clients, 3, "writer").await
        } else {
            naive.read(&clients, "reader").await
        };
        if ok {
            let g = record_admitted(&checker, h, t0, format!("naive-rw-{h}"));
            checker.rw_grant(g, "control", write);
            admitted.push(if write { "writer" } else { "reader" });
        }
    }
    let detail = format!("admitted {admitted:?}");
    Ok((checker.finish(&HashMap::new()), detail))
}

/// fredlock's read-write lock under the same views: the reader on one node gets no quorum.
async fn quorum_rwlock() -> io::Result<(CheckerReport, String)> {
    let nodes = LocalNodes::start(3).await?;
    let checker = checker();
    let mut held = Vec::new();
    let mut admitted = Vec::new();
    for (h, (view, write)) in [(&[2][..], false), (&[0, 1][..], true)]
        .into_iter()
        .enumerate()
    {
        let (redlock, proxies) = reaching(&nodes, view, false).await?;
        let rw = redlock.rwlock("control").map_err(io_err)?;
        let got = if write {
            rw.try_write(TTL)
                .await
                .ok()
                .flatten()
                .map(|g| g.into_lock())
        } else {
            rw.try_read(TTL).await.ok().flatten().map(|g| g.into_lock())
        };
        if let Some(lock) = got {
            let kind = if write {
                GrantKind::Write
            } else {
                GrantKind::Read
            };
            let g = checker.grant(h, &lock, kind, Instant::now());
            checker.rw_grant(g, "control", write);
            admitted.push(if write { "writer" } else { "reader" });
            held.push((lock, redlock, proxies));
        }
    }
    let detail = format!("admitted {admitted:?}");
    Ok((checker.finish(&HashMap::new()), detail))
}

/// Max-of-INCR tokens on four successive grants: the fourth repeats the third's token.
async fn naive_fencing() -> io::Result<(CheckerReport, String)> {
    let nodes = LocalNodes::start(3).await?;
    let checker = checker();
    let naive = NaiveFencing::new("control");
    let mut tokens = Vec::new();
    for (h, view) in FENCING_VIEWS.iter().enumerate() {
        let (redlock, _proxies) = reaching(&nodes, view, false).await?;
        let (_direct, clients) = clients(&nodes, view).await?;
        let lock = redlock.acquire("control", TTL).await.map_err(io_err)?;
        let g = checker.grant(h, &lock, GrantKind::Control, Instant::now());
        let token = naive
            .token(&clients)
            .await
            .ok_or_else(|| io_err("no INCR"))?;
        checker.fencing_token(g, "control", token);
        tokens.push(token);
        close(&checker, g, lock).await;
    }
    Ok((
        checker.finish(&HashMap::new()),
        format!("tokens {tokens:?}"),
    ))
}

/// fredlock's tokens on successive grants through `views`. With `restart`, node 1 is killed
/// and restarted after the first grant: empty (`Some(false)`, plain nodes) or with its data
/// (`Some(true)`, durable nodes).
async fn write_back_fencing(
    views: &[[usize; 2]],
    restart: Option<bool>,
) -> io::Result<(CheckerReport, String)> {
    let mut nodes = if restart == Some(true) {
        LocalNodes::start_durable(3).await?
    } else {
        LocalNodes::start(3).await?
    };
    let checker = checker();
    let mut tokens = Vec::new();
    for (h, view) in views.iter().enumerate() {
        if h == 1 && restart.is_some() {
            nodes.restart(1).await?;
        }
        let (redlock, _proxies) = reaching(&nodes, view, true).await?;
        let lock = redlock.acquire("control", TTL).await.map_err(io_err)?;
        let g = checker.grant(h, &lock, GrantKind::Fenced, Instant::now());
        let token = lock.fencing_token().ok_or_else(|| io_err("no token"))?;
        checker.fencing_token(g, "control", token);
        tokens.push(token);
        close(&checker, g, lock).await;
    }
    Ok((
        checker.finish(&HashMap::new()),
        format!("tokens {tokens:?}"),
    ))
}

async fn close(checker: &Checker, g: u64, lock: Lock) {
    checker.close(g, Instant::now(), lock.deadline());
    let _ = lock.release().await;
}
