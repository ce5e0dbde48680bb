//! S6 ([`CleanupProbe`]): an acquire on a private resource that is cancelled after 0-3 ms,
//! fails, or is granted and released, must leave no key on any node whose state and link did
//! not change meanwhile.
//!
//! Owns this probe: the acquire in the client, the two looks at the nodes in a task of its own.
//! Must not count a node that was disturbed (frozen, restarted, or its link reset) since the
//! acquire: S6 allows a key there until its TTL.

use std::sync::Arc;
use std::time::Duration;

use fredlock::Inspection;
use tokio::time::Instant;

use super::super::env::Env;
use super::super::schedule::ms;
use super::super::stats::Stats;
use super::{Op, Worker};
use crate::checker::ViolationKind;

/// The S6 probe looks a second time this long after the first look.
const CLEANUP_SECOND_LOOK: Duration = Duration::from_millis(500);
/// The S6 probe's private lock lives at least this long: a key left behind must still be there
/// at the second look.
const CLEANUP_TTL_MIN: Duration = Duration::from_secs(2);

impl Worker {
    /// S6 on a resource only this client uses: an acquire given 0-3 ms (so its future is
    /// dropped before, during or after its SETs), or one that fails, or a lock released, must
    /// leave no key behind on any node it can reach. Only nodes whose state and whose proxy
    /// for this client did not change meanwhile count: a node that froze, restarted, or whose
    /// link reset may keep a key until its TTL, which S6 allows for unreachable nodes.
    ///
    /// The looks at the nodes wait for the clean-up to land (hundreds of milliseconds): they run
    /// in a task of their own, so the client goes on with its next operation meanwhile.
    pub(super) async fn op_cancel(&mut self, op: &Op) {
        self.private_seq += 1;
        let p = format!("private:{}:{}", self.id, self.private_seq);
        // A long TTL (the resource is private, no one waits for it): a key left behind is still
        // there at the second look below, while a clean-up that is merely slow is not.
        let ttl = (self.env.config.ttl_max * 4).max(CLEANUP_TTL_MIN);
        let (e0, pe0) = (self.env.epochs(), self.env.board.epochs(self.id));
        let budget = Duration::from_micros(op.offset_us.unsigned_abs() % 3_000);
        let outcome =
            match tokio::time::timeout(budget, self.redlock.acquire(p.as_str(), ttl)).await {
                Ok(Ok(lock)) => {
                    self.stats.cleanup_probes[2] += 1;
                    let _ = lock.release().await;
                    "granted and released"
                }
                Ok(Err(_)) => {
                    self.stats.cleanup_probes[1] += 1;
                    "failed"
                }
                Err(_) => {
                    self.stats.cleanup_probes[0] += 1;
                    "cancelled"
                }
            };
        let probe = CleanupProbe {
            given_up: Instant::now(),
            env: self.env.clone(),
            client: self.id,
            node_timeout: self.node_timeout,
            resource: p,
            outcome,
            budget,
            ttl,
            node_epochs: e0,
            link_epochs: pe0,
        };
        self.spawn_probe(async move {
            probe.look().await;
            Stats::default()
        })
        .await;
    }
}

/// The second half of an S6 clean-up probe ([`Worker::op_cancel`]): look at the nodes once the
/// background releases had time to land, and again later where a key was still there.
struct CleanupProbe {
    /// When the acquire returned or was cancelled.
    given_up: Instant,
    env: Arc<Env>,
    client: usize,
    node_timeout: Duration,
    resource: String,
    outcome: &'static str,
    budget: Duration,
    ttl: Duration,
    /// Node epochs and this client's link epochs from before the acquire.
    node_epochs: Vec<u64>,
    link_epochs: Vec<u64>,
}

impl CleanupProbe {
    async fn look(self) {
        let checker = &self.env.checker;
        let p = self.resource.as_str();
        // Background releases are queued behind their SETs on the same connections: they land
        // within a node timeout (the per-command timeout of fred bounds them).
        tokio::time::sleep(self.node_timeout + ms(150)).await;
        let Ok(first) = self.env.observer.inspect(p).await else {
            return;
        };
        checker.count_check("S6 clean-up");
        let held = |i: &Inspection, n: usize| match &i.nodes[n].state {
            Ok(Some(h)) => Some(h.fingerprint.clone()),
            _ => None,
        };
        let suspects: Vec<usize> = (0..first.nodes.len())
            .filter(|&n| held(&first, n).is_some())
            .collect();
        if suspects.is_empty() {
            return;
        }
        // Look again later: only a key that is still there (same token) was left behind.
        tokio::time::sleep(CLEANUP_SECOND_LOOK).await;
        let second_at = Instant::now();
        let Ok(second) = self.env.observer.inspect(p).await else {
            return;
        };
        let (e1, pe1) = (self.env.epochs(), self.env.board.epochs(self.client));
        for n in suspects {
            let token = held(&first, n);
            if self.node_epochs[n] != e1[n]
                || self.link_epochs[n] != pe1[n]
                || held(&second, n) != token
            {
                continue;
            }
            let ttl_left = match &second.nodes[n].state {
                Ok(Some(h)) => h.ttl,
                _ => None,
            };
            // When the node ran the SET, from the TTL it had left (to a millisecond or so).
            let set_at = ttl_left
                .and_then(|left| self.ttl.checked_sub(left))
                .and_then(|age| second_at.checked_sub(age));
            let landed = match set_at {
                Some(t) if t >= self.given_up => format!("{:?} after", t - self.given_up),
                Some(t) => format!("{:?} before", self.given_up - t),
                None => "?".to_string(),
            };
            checker.violation(
                ViolationKind::LeftKey,
                format!(
                    "client {}: acquire of {p} ({}, budget {:?}, ttl {:?}, node timeout {:?}) left token {} on node {n} ({ttl_left:?} left {:?} later; its SET ran about {landed} the acquire returned), node and link undisturbed. Events from 2 s before: {}",
                    self.client,
                    self.outcome,
                    self.budget,
                    self.ttl,
                    self.node_timeout,
                    token.unwrap_or_default(),
                    second_at - self.given_up,
                    checker.events(
                        self.given_up.checked_sub(Duration::from_secs(2)).unwrap_or(self.given_up),
                        second_at
                    ),
                ),
            );
        }
    }
}
