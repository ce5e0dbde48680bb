//! The rounds on a held lock: extend (one lock, or many in one batch), release (awaited, or
//! handed to the nodes' connections unawaited) and shorten; and the release round that
//! background retries run through [`Releaser`].
//!
//! Owns: [`ExtendRequest`] and those rounds. Must not: acquire (that is `attempt`), parse
//! replies (node), count votes by hand (quorum), keep background work's books (background), or
//! build a `Lock`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Error, InvalidInput, NotHeldReason, Result, Round, Vote, Votes};
use crate::nodes::node::Held;
use crate::nodes::node_extend_many::Extension;
use crate::rounds::background::{self, Background, Releaser};
use crate::rounds::holds::Taken;
use crate::rounds::quorum::{
    self, each_known, fan_out, fan_out_rest, item_votes, quorum_known, votes, Late, Outcome,
};
use crate::rounds::redlock::Inner;

/// One lock's request in a batched extend round ([`Inner::extend_many`]).
pub(crate) struct ExtendRequest {
    pub(crate) held: Arc<Held>,
    pub(crate) ttl: Duration,
    /// The lock's current deadline: the round must be decided before it.
    pub(crate) deadline: Instant,
}

impl Inner {
    /// Releases every lock `close()` took, all at once, each as its holder's release would:
    /// deleted, or, before the end of a minimum hold, shortened to expire at that end.
    pub(crate) async fn release_taken(self: &Arc<Self>, taken: Vec<Taken>) {
        let releases = taken.into_iter().map(|t| async move {
            let left = t
                .shape
                .minimum_until
                .map(|until| until.saturating_duration_since(Instant::now()))
                .filter(|left| !left.is_zero());
            match left {
                Some(left) => {
                    let ms = left.min(t.shape.ttl).as_nanos().div_ceil(1_000_000);
                    let ms = u64::try_from(ms).unwrap_or(u64::MAX).max(1);
                    self.shorten_all(&t.held, ms).await
                }
                None => self.release_all(&t.held, t.shape.ttl).await,
            }
        });
        futures::future::join_all(releases).await;
    }

    /// Hands a release to `targets` without waiting for the answers (they land in each node's
    /// order, after the commands queued before them). The answers are still read, in a task:
    /// a node whose release fails (at once: fred fails new commands while reconnecting, yet
    /// still writes what it had buffered; or later: a reset connection, a moved shard) is
    /// retried in the background; see [`background::finish_release`].
    pub(crate) async fn release_unawaited(
        self: &Arc<Self>,
        held: &Arc<Held>,
        targets: impl Iterator<Item = usize>,
        ttl: Duration,
    ) {
        let timeout = self.release_timeout();
        let mut failed = Vec::new();
        let mut late = Vec::new();
        // Each release is polled once here, which hands it to its node's connection (a cluster
        // node's, to a task of its own): the next attempt's commands queue behind it.
        for i in targets {
            let mut call = Box::pin(self.nodes[i].clone().release(held.clone(), timeout));
            match futures::poll!(call.as_mut()) {
                std::task::Poll::Ready(vote) if background::is_failed(&vote) => failed.push(i),
                std::task::Poll::Ready(_) => {}
                std::task::Poll::Pending => late.push((i, call)),
            }
        }
        // A caller's token is the same in every attempt of one acquire: a clean-up resent late
        // could delete what the NEXT attempt set. Not resent, the worst a failed clean-up leaves
        // is a key holding our own value until its TTL, which later attempts are refused by
        // (never granted by) and which this lock's extend and release treat as its own. (The
        // releases already sent still run; only their answers go unread.)
        if held.custom {
            failed.clear();
            late.clear();
        }
        // A release queued in its node's batcher is the batcher's to finish (see `Batched`).
        late.retain(|(i, _)| !held.batched.queued(*i));
        background::finish_release(self, held, failed, late, ttl);
    }

    /// Releases on every node, deciding as soon as the outcome is known. (On a lock's gate the
    /// release wakes the head of its wait line.) Nodes whose release failed are retried in the
    /// background (see [`background::retry_release`]): a release can fail at once while a late
    /// SET of the same lock still waits in fred's queue for that node.
    ///
    /// The releases still running when the quorum answered are awaited in the background too,
    /// and retried where they fail (see [`background::finish_release`]); one queued in its
    /// node's batcher is left to the batcher, which resends it there (see `batch::Batched`). A late release is
    /// not done just because fred took it: it can still fail without reaching the node (the
    /// connection reset, or the node, frozen with the release unread, is killed), while the
    /// lock's `SET` before it was applied there and, on a node that keeps its data, comes back
    /// with it. Dropped unread, such a failure left our key there for its whole TTL; with
    /// another node down, no acquire of the resource could get a quorum meanwhile. Sending it
    /// again is safe: it deletes only our token, which no later command of ours stores (fresh
    /// per acquisition), and it is queued behind everything this process sent the node before.
    /// With a caller's token (repeated across acquisitions) a late release is not resent: it
    /// could delete the caller's next lock.
    pub(crate) async fn release_all(self: &Arc<Self>, held: &Arc<Held>, ttl: Duration) -> Votes {
        let timeout = self.release_timeout();
        let calls = (0..self.nodes.len())
            .map(|i| (i, self.nodes[i].clone().release(held.clone(), timeout)));
        let (answers, mut late) = fan_out_rest(self.nodes.len(), calls, quorum_known).await;
        let votes = votes(answers);
        crate::base::metrics::failures(&votes.0);
        if held.custom {
            late.clear();
        }
        // A release queued in its node's batcher is the batcher's to finish: it resends one
        // that fails for the connection once its caller stopped waiting (see `Batched`).
        late.retain(|(i, _)| !held.batched.queued(*i));
        background::finish_release(self, held, background::failed_nodes(&votes.0), late, ttl);
        votes
    }

    /// The release of a lock held for at least a minimum, before that minimum: every node lowers
    /// our keys' TTL to `ttl_ms` (never raising it) instead of deleting them, so they expire when
    /// the minimum ends. Decided as soon as a quorum's answer is known; a late node still gets
    /// its shortening (the node layer finishes a script's `NOSCRIPT` resend, and orders it
    /// behind the lock's `SET`); a node that missed it keeps the keys until their TTL, which
    /// only holds the lock longer.
    pub(crate) async fn shorten_all(&self, held: &Arc<Held>, ttl_ms: u64) -> Votes {
        let timeout = self.release_timeout();
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().shorten(held.clone(), ttl_ms, timeout)));
        let votes = votes(fan_out(self.nodes.len(), calls, None, Late::Drop, quorum_known).await);
        crate::base::metrics::failures(&votes.0);
        votes
    }

    /// One extend round: every node resets the TTL if our token is still there. Succeeds with a
    /// quorum within the current validity; the new deadline counts from this round's start.
    pub(crate) async fn extend(
        &self,
        held: &Arc<Held>,
        ttl: Duration,
        current_deadline: Instant,
        patient: bool,
    ) -> Result<Instant> {
        let result = self
            .extend_round(held, ttl, current_deadline, patient)
            .await;
        crate::base::metrics::extension(result.is_ok());
        result
    }

    async fn extend_round(
        &self,
        held: &Arc<Held>,
        ttl: Duration,
        current_deadline: Instant,
        patient: bool,
    ) -> Result<Instant> {
        let ttl_ms = quorum::ttl_millis(ttl)?;
        let validity = quorum::validity(ttl, self.drift_factor)?;
        let t0 = Instant::now();
        if t0 >= current_deadline {
            return Err(Error::NotHeld {
                resources: held.names(),
                reason: NotHeldReason::Expired,
                votes: Votes::default(),
            });
        }
        let Some(new_deadline) = t0.checked_add(validity) else {
            return Err(InvalidInput::TtlTooLarge(ttl).into());
        };
        // A keep-alive extension only has to land before the deadline, so it may wait for half of
        // the time left: under load, a longer wait beats a timeout and a retry.
        let mut timeout = self.node_timeout(ttl);
        if patient {
            timeout = timeout.max(current_deadline.duration_since(t0) / 2);
        }
        let (verdict, seen) = tokio::sync::watch::channel(None);
        let repair_timeout = self.node_timeout(ttl);
        let calls = self.nodes.iter().enumerate().map(|(i, n)| {
            let (n, held, seen) = (n.clone(), held.clone(), seen.clone());
            let call = async move {
                let vote = n.clone().extend(held.clone(), ttl_ms, timeout).await;
                if vote == Vote::Refused {
                    heal(&n, &held, 0, ttl_ms, repair_timeout, seen).await;
                }
                vote
            };
            (i, call)
        });
        let votes = votes(
            // Finished, not dropped: a late extension still answered NOSCRIPT must be resent
            // (else that node keeps the old TTL); landing late only keeps our own key longer.
            fan_out(
                self.nodes.len(),
                calls,
                Some(current_deadline),
                Late::Finish,
                quorum_known,
            )
            .await,
        );
        crate::base::metrics::failures(&votes.0);
        let reached = quorum::outcome(&votes.0) == Outcome::Reached;
        if reached && Instant::now() < current_deadline {
            verdict.send_replace(Some(Arc::new(vec![Some(new_deadline)])));
            return Ok(new_deadline);
        }
        if Instant::now() >= current_deadline {
            return Err(Error::NotHeld {
                resources: held.names(),
                reason: NotHeldReason::Expired,
                votes,
            });
        }
        Err(self.round_failure(held, Round::Extend, votes))
    }

    /// One batched extend round for many locks of this Redlock (the keep-alive's): ONE call per
    /// node carries every lock (see [`Node::extend_many`](crate::nodes::node::Node::extend_many)),
    /// and each lock is decided on its own, exactly as [`extend`](Self::extend) with `patient`
    /// decides for one: it is extended only if a quorum of nodes extended IT, before its own
    /// current deadline, and its new deadline counts from before the batch was sent
    /// (`t0 + validity(its ttl)`). One result per request, in order, with the errors of `extend`.
    /// A request whose deadline already passed, or whose TTL is invalid, is answered without
    /// being sent.
    ///
    /// The per-node timeout is the most patient one that every lock of the batch allows (the
    /// smallest of `max(node timeout, half its validity left)`); the round returns as soon as
    /// every lock's outcome is known.
    ///
    /// Cancellation: dropping the future abandons the round; the calls already handed to fred
    /// still run on their nodes and only extend keys that still hold their lock's token.
    pub(crate) async fn extend_many(&self, reqs: &[ExtendRequest]) -> Vec<Result<Instant>> {
        let t0 = Instant::now();
        let Planned {
            plans,
            batch,
            timeout,
            until,
        } = self.plan_extensions(reqs, t0);
        let (verdict, seen) = tokio::sync::watch::channel(None);
        let answers = match timeout {
            Some(timeout) => {
                let items = batch.len();
                let batch = Arc::new(batch);
                let repair_timeouts = self.repair_timeouts(&batch);
                let calls = self.nodes.iter().enumerate().map(|(i, n)| {
                    let call = extend_many_then_heal(
                        n.clone(),
                        batch.clone(),
                        timeout,
                        repair_timeouts.clone(),
                        seen.clone(),
                    );
                    (i, call)
                });
                // Finished, not dropped: a late NOSCRIPT must still be resent.
                fan_out(self.nodes.len(), calls, Some(until), Late::Finish, |a| {
                    each_known(a, items)
                })
                .await
            }
            None => Vec::new(),
        };
        if !answers.is_empty() {
            // Node failures once per node and round (not once per lock of the batch).
            crate::base::metrics::failures(&item_votes(&answers, 0).0);
        }
        let now = Instant::now();
        // Per item of the batch: its new deadline when its extension won (for the repairs).
        let mut won = vec![None; reqs.len()];
        let results: Vec<Result<Instant>> = plans
            .into_iter()
            .zip(reqs)
            .map(|(plan, r)| match plan {
                Plan::Done(e) => Err(e),
                Plan::Sent(k, new_deadline) => {
                    let votes = item_votes(&answers, k);
                    let reached = quorum::outcome(&votes.0) == Outcome::Reached;
                    if now >= r.deadline {
                        Err(Error::NotHeld {
                            resources: r.held.names(),
                            reason: NotHeldReason::Expired,
                            votes,
                        })
                    } else if reached {
                        if let Some(slot) = won.get_mut(k) {
                            *slot = Some(new_deadline);
                        }
                        Ok(new_deadline)
                    } else {
                        Err(self.round_failure(&r.held, Round::Extend, votes))
                    }
                }
            })
            .inspect(|r| crate::base::metrics::extension(r.is_ok()))
            .collect();
        verdict.send_replace(Some(Arc::new(won)));
        results
    }
}

/// Each request of a batched extension: decided before sending, or sent as item `k` with its
/// new deadline.
enum Plan {
    Done(Error),
    Sent(usize, Instant),
}

/// A batched extension round before it is sent (see [`Inner::plan_extensions`]).
struct Planned {
    plans: Vec<Plan>,
    /// What is sent, one item per `Plan::Sent`.
    batch: Vec<Extension>,
    /// The most patient per-node timeout every lock allows; `None` when nothing is sent.
    timeout: Option<Duration>,
    /// The latest current deadline among the locks sent.
    until: Instant,
}

impl Inner {
    /// Checks each request at `t0` (TTL, deadline, new deadline) and builds what is sent.
    fn plan_extensions(&self, reqs: &[ExtendRequest], t0: Instant) -> Planned {
        let mut batch = Vec::with_capacity(reqs.len());
        let mut timeout: Option<Duration> = None;
        let mut until = t0;
        let plans: Vec<Plan> = reqs
            .iter()
            .map(|r| {
                let checked = quorum::ttl_millis(r.ttl)
                    .and_then(|ms| Ok((ms, quorum::validity(r.ttl, self.drift_factor)?)));
                let (ttl_ms, validity) = match checked {
                    Ok(v) => v,
                    Err(e) => return Plan::Done(e.into()),
                };
                if t0 >= r.deadline {
                    return Plan::Done(Error::NotHeld {
                        resources: r.held.names(),
                        reason: NotHeldReason::Expired,
                        votes: Votes::default(),
                    });
                }
                let Some(new_deadline) = t0.checked_add(validity) else {
                    return Plan::Done(InvalidInput::TtlTooLarge(r.ttl).into());
                };
                let patience = self
                    .node_timeout(r.ttl)
                    .max(r.deadline.duration_since(t0) / 2);
                timeout = Some(timeout.map_or(patience, |t| t.min(patience)));
                until = until.max(r.deadline);
                batch.push(Extension {
                    held: r.held.clone(),
                    ttl_ms,
                });
                Plan::Sent(batch.len() - 1, new_deadline)
            })
            .collect();
        Planned {
            plans,
            batch,
            timeout,
            until,
        }
    }
}

/// One node's share of a batched extend round: the extensions, then the repairs of the locks
/// it refused (see [`heal`]), side by side (a node that lost every key, restarted, repairs many).
async fn extend_many_then_heal(
    node: Arc<crate::nodes::node::Node>,
    batch: Arc<Vec<Extension>>,
    timeout: Duration,
    repair_timeouts: Arc<Vec<Duration>>,
    seen: Verdict,
) -> Vec<Vote> {
    let votes = node.clone().extend_many(batch.clone(), timeout).await;
    let each = votes.iter().zip(batch.iter()).zip(repair_timeouts.iter());
    let repairs = each
        .enumerate()
        .filter(|(_, ((vote, _), _))| **vote == Vote::Refused)
        .map(|(k, ((_, x), &t))| heal(&node, &x.held, k, x.ttl_ms, t, seen.clone()));
    futures::future::join_all(repairs).await;
    votes
}

/// What the nodes of an extend round see of its outcome, for their repairs: unset until the
/// round is decided, then per lock of the round (by its index in the call) its new deadline
/// when its extension won, else `None`. A round that ends undecided (failed, or dropped) drops
/// the sender, and no repair follows.
type Verdict = tokio::sync::watch::Receiver<Option<Arc<Vec<Option<Instant>>>>>;

/// After `node` refused to extend lock `k` of a round (our keys missing there, or another
/// value there): once the round is decided, and only if that lock's extension won on a quorum,
/// re-set its keys on that node with `SET NX` (see `Node::repair`; never over another value),
/// before the new deadline. So a lock that missed a node (down at its acquire, restarted since)
/// regains it while held: see docs/algorithm.md, "Healing". Only plain locks heal
/// ([`Held::heals`]).
///
/// Runs inside the node's call: at once when the round is already decided (a late answer,
/// finished in the background by `fan_out`); otherwise in a task that waits for the verdict,
/// so that this answer still reaches the round's decision.
async fn heal(
    node: &Arc<crate::nodes::node::Node>,
    held: &Arc<Held>,
    k: usize,
    ttl_ms: u64,
    timeout: Duration,
    mut verdict: Verdict,
) {
    if !held.heals() {
        return;
    }
    let (node, held) = (node.clone(), held.clone());
    let decided = verdict.borrow().clone();
    match decided {
        Some(won) => {
            repair_if_won(node, held, won.get(k).copied().flatten(), ttl_ms, timeout).await
        }
        None => {
            tokio::spawn(async move {
                let won = match verdict.wait_for(Option::is_some).await {
                    Ok(v) => v.as_ref().and_then(|w| w.get(k).copied().flatten()),
                    Err(_) => None,
                };
                repair_if_won(node, held, won, ttl_ms, timeout).await;
            });
        }
    }
}

/// [`heal`]'s repair, when the lock's extension `won` (its new deadline) and that deadline has
/// not passed; bounded by `timeout` and by the time left.
async fn repair_if_won(
    node: Arc<crate::nodes::node::Node>,
    held: Arc<Held>,
    won: Option<Instant>,
    ttl_ms: u64,
    timeout: Duration,
) {
    let Some(until) = won else { return };
    let now = Instant::now();
    if now >= until {
        return;
    }
    let timeout = timeout.min(until.duration_since(now));
    let Some(vote) = node.clone().repair(held.clone(), ttl_ms, timeout).await else {
        return;
    };
    crate::base::metrics::repair(&vote);
    if vote == Vote::Granted {
        held.repairs.made();
        tracing::debug!(node = %node.name, resources = ?held.resources, "fredlock: re-set a held lock's keys on a node that had lost them");
    }
}

impl Inner {
    /// Each lock's per-node timeout for its repairs (see [`heal`]).
    fn repair_timeouts(&self, batch: &[Extension]) -> Arc<Vec<Duration>> {
        let each = batch.iter().map(|x| Duration::from_millis(x.ttl_ms));
        Arc::new(each.map(|ttl| self.node_timeout(ttl)).collect())
    }
}

impl Releaser for Inner {
    fn background(&self) -> &Background {
        &self.background
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn command_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout(ttl)
    }

    async fn release_round(
        &self,
        held: &Arc<Held>,
        targets: Vec<usize>,
        enough: fn(&[Option<Vote>]) -> bool,
    ) -> Votes {
        self.release_round_with(held, targets, enough).await
    }
}

impl Inner {
    async fn release_round_with(
        &self,
        held: &Arc<Held>,
        targets: Vec<usize>,
        enough: impl FnMut(&[Option<Vote>]) -> bool,
    ) -> Votes {
        let timeout = self.release_timeout();
        let calls: Vec<_> = targets
            .into_iter()
            .map(|i| (i, self.nodes[i].clone().release(held.clone(), timeout)))
            .collect();
        let votes = votes(fan_out(self.nodes.len(), calls, None, Late::Drop, enough).await);
        crate::base::metrics::failures(&votes.0);
        votes
    }
}
