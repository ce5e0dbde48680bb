//! Work that outlives the call that started it: releases sent from drop paths (a dropped lock, a
//! cancelled acquire) and the retries of a release that failed on some nodes.
//!
//! Owns: the count of background tasks that [`Redlock::close`](crate::Redlock::close) waits for and
//! the `closed` flag that stops retries; spawning drop-path releases; which nodes a release is
//! retried on, until when and at what pace. Must not: send a command or choose a round's rule
//! itself (the Redlock one layer up does, through [`Releaser`]), or count votes toward a quorum.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{NodeError, NodeErrorKind, Vote, Votes};
use crate::nodes::node::Held;

/// What background releases need from the Redlock they run for (its shared state, one layer up).
pub(crate) trait Releaser: Send + Sync + 'static {
    /// This Redlock's background-work count and `closed` flag.
    fn background(&self) -> &Background;
    /// How many nodes are configured.
    fn node_count(&self) -> usize;
    /// The per-node command timeout for keys set with `ttl`.
    fn command_timeout(&self, ttl: Duration) -> Duration;
    /// Sends the release script to `targets`, returns when `enough` says so (or after the
    /// per-node timeout). Unanswered nodes finish in the background.
    fn release_round(
        &self,
        held: &Arc<Held>,
        targets: Vec<usize>,
        enough: fn(&[Option<Vote>]) -> bool,
    ) -> impl Future<Output = Votes> + Send;
}

/// A round on `targets` that waits for every answer (or each node's timeout).
async fn release_answered<R: Releaser>(inner: &R, held: &Arc<Held>, targets: Vec<usize>) -> Votes {
    inner
        .release_round(held, targets, |a| a.iter().all(Option::is_some))
        .await
}

/// Counts background tasks so that [`Redlock::close`](crate::Redlock::close) can wait for them.
#[derive(Debug, Default)]
pub(crate) struct Background {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
    /// Set by [`Redlock::close`](crate::Redlock::close): release retries stop (the clients are gone).
    closed: std::sync::atomic::AtomicBool,
}

impl Background {
    fn enter<R: Releaser>(inner: &Arc<R>) -> BackgroundGuard<R> {
        inner
            .background()
            .running
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        BackgroundGuard(inner.clone())
    }

    pub(crate) async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.running.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Sets the `closed` flag: release retries stop.
    pub(crate) fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }
}

struct BackgroundGuard<R: Releaser>(Arc<R>);

impl<R: Releaser> Drop for BackgroundGuard<R> {
    fn drop(&mut self) {
        let bg = self.0.background();
        if bg.running.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            bg.idle.notify_waiters();
        }
    }
}

/// Releases an attempt's keys on every node if the attempt is dropped before it settled.
pub(crate) struct CleanupGuard<R: Releaser> {
    pub(crate) inner: Option<Arc<R>>,
    pub(crate) held: Arc<Held>,
    pub(crate) ttl: Duration,
}

impl<R: Releaser> Drop for CleanupGuard<R> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            spawn_release(inner, self.held.clone(), self.ttl, "acquire cancelled");
        }
    }
}

/// Releases on every node from a background task (used on drop paths); nodes whose release
/// failed are retried (see [`retry_release`]). `ttl` is the keys' TTL: how long a retry can help.
pub(crate) fn spawn_release<R: Releaser>(
    inner: Arc<R>,
    held: Arc<Held>,
    ttl: Duration,
    why: &'static str,
) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            tracing::debug!(keys = ?held.keys, why, "fredlock: releasing in the background");
            let running = Background::enter(&inner);
            rt.spawn(async move {
                let until = retry_until(&*inner, ttl);
                let votes =
                    release_answered(&*inner, &held, (0..inner.node_count()).collect()).await;
                tracing::debug!(keys = ?held.keys, %votes, why, "fredlock: background release done");
                // close() waits for the first round (which hands every command to fred), not
                // for the retries: they stop once the Redlock is closed.
                drop(running);
                retry_release(inner, held, failed_nodes(&votes.0), until).await;
            });
        }
        Err(_) => {
            tracing::warn!(keys = ?held.keys, why, "fredlock: no tokio runtime to release on; the keys expire with their TTL");
        }
    }
}

/// Finishes, in a task, the releases of a clean-up or of a lock (`Inner::release_all`) that
/// were still running when its round returned, then retries the nodes where any of them failed
/// (see [`retry_release`]); `failed` are the nodes whose release already failed.
///
/// Why the answers matter: a release can fail AFTER it was handed to the connection (the
/// connection reset, or on a Redis Cluster node a shard moved or failed), while the `SET` it
/// cleans up after had already created the key. Dropping the answer would leave that key for
/// its full TTL.
pub(crate) fn finish_release<R, F>(
    inner: &Arc<R>,
    held: &Arc<Held>,
    mut failed: Vec<usize>,
    late: Vec<(usize, F)>,
    ttl: Duration,
) where
    R: Releaser,
    F: Future<Output = Vote> + Send + 'static,
{
    if failed.is_empty() && late.is_empty() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let until = retry_until(&**inner, ttl);
    let (inner, held) = (inner.clone(), held.clone());
    // close() waits for the late answers (a late release may still wait in a busy node's
    // queue, which quitting the connection would cut), not for the retries (as for
    // `spawn_release`).
    let running = Background::enter(&inner);
    rt.spawn(async move {
        let answers = futures::future::join_all(
            late.into_iter()
                .map(|(i, call)| async move { (i, call.await) }),
        )
        .await;
        drop(running);
        failed.extend(
            answers
                .into_iter()
                .filter(|(_, v)| is_failed(v))
                .map(|(i, _)| i),
        );
        retry_release(inner, held, failed, until).await;
    });
}

/// Until when retrying a release can remove keys set with `ttl`: a SET is written within its
/// node timeout (fred skips it after that) and lives `ttl` from then.
fn retry_until<R: Releaser>(inner: &R, ttl: Duration) -> Instant {
    let span = ttl.saturating_add(inner.command_timeout(ttl));
    Instant::now()
        .checked_add(span)
        .unwrap_or_else(Instant::now)
}

/// Nodes whose release failed (an error or a timeout), and so may still hold the keys. A
/// duplicate's answer never counts: it is left out.
pub(crate) fn failed_nodes(votes: &[Vote]) -> Vec<usize> {
    (0..votes.len()).filter(|&i| is_failed(&votes[i])).collect()
}

/// A release answer that may have left the keys: an error or a timeout (a duplicate's answer
/// never counts).
pub(crate) fn is_failed(vote: &Vote) -> bool {
    matches!(vote, Vote::Failed(e) if e.kind != NodeErrorKind::Duplicate)
}

/// Retries a release on `nodes` until each gives an answer, `until` passes or the Redlock is
/// closed, pausing 10 ms, then twice as long each time up to 250 ms.
///
/// Why: a release can fail while the SET it cleans up after is still waiting in fred's queue
/// (fred fails a new command at once while reconnecting, yet writes the commands it already
/// buffered once connected). Replaying a release is safe (it deletes only our token), and a
/// retry is queued behind that SET, so it lands after it.
pub(crate) async fn retry_release<R: Releaser>(
    inner: Arc<R>,
    held: Arc<Held>,
    mut nodes: Vec<usize>,
    until: Instant,
) {
    let mut pause = Duration::from_millis(10);
    while !nodes.is_empty() && !inner.background().is_closed() {
        if Instant::now().checked_add(pause).is_none_or(|t| t >= until) {
            tracing::debug!(keys = ?held.keys, ?nodes, "fredlock: release retries given up; the keys expire with their TTL");
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
        let votes = release_answered(&*inner, &held, nodes).await;
        nodes = failed_nodes(&votes.0);
    }
}

/// Leaves a wait line (`leave`: one try of the gate's leave script), retrying until the gate
/// answers, `until` passes or the Redlock is closed, at the pace of [`retry_release`]. Returns
/// the gate's answer, `None` when none came.
///
/// Why: a waiter that gave up while its gate was frozen, restarting or loading its data stays
/// at the head of the gate's line until its lease expires, and meanwhile the gate refuses every
/// other acquire of the key (the head is being handed the lock); a node that keeps its data
/// across a restart brings the line back with it. Leaving twice is harmless: the script removes
/// only this waiter's own member and wakes the next head only when it removed the head.
pub(crate) async fn retry_leave<R, T, F, Fut>(inner: &R, until: Instant, mut leave: F) -> Option<T>
where
    R: Releaser,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, NodeError>>,
{
    let mut pause = Duration::from_millis(10);
    loop {
        let e = match leave().await {
            Ok(answer) => return Some(answer),
            Err(e) => e,
        };
        let late = Instant::now().checked_add(pause).is_none_or(|t| t >= until);
        if late || inner.background().is_closed() {
            tracing::debug!(node = %e.node, cause = %e.message, "fredlock: leaving a wait line given up; the place there ends with its lease");
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}
