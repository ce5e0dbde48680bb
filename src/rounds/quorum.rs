//! The one fan-out primitive and the quorum and validity arithmetic.
//!
//! Acquire, extend, release and inspect all send one command per node through [`fan_out`], which
//! returns as soon as the caller's rule says the outcome is known: a dead, hung or slow minority
//! never adds its timeout to the latency. Commands still running at that point are not dropped:
//! they are driven to completion in a background task, so fred's own per-command timeout stays in
//! charge of them and whatever they chain (a release after a late grant) still happens in order.
//!
//! Owns: fan-out, the quorum tally, drift and validity arithmetic. Must not: know what a
//! command does or parse replies (it is generic over the per-node futures).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::base::error::{InvalidInput, Vote};

/// The quorum of the CONFIGURED nodes (never of the connected ones).
pub(crate) fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// Whether a set of votes already decides a quorum question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// More answers are needed.
    Undecided,
    /// At least a quorum granted.
    Reached,
    /// So many refused or failed that a quorum can no longer be reached.
    Impossible,
}

/// Decides from the votes so far (`Pending` = not answered yet).
pub(crate) fn outcome(votes: &[Vote]) -> Outcome {
    tally(votes.len(), votes.iter())
}

/// The one quorum rule, over any view of the votes: `Reached` with `nodes / 2 + 1` grants,
/// `Impossible` once more than `nodes - quorum` refused or failed.
fn tally<'a>(nodes: usize, votes: impl Iterator<Item = &'a Vote>) -> Outcome {
    let q = quorum(nodes);
    let (mut granted, mut against) = (0, 0);
    for v in votes {
        match v {
            Vote::Granted => granted += 1,
            Vote::Refused | Vote::Failed(_) => against += 1,
            Vote::Pending => {}
        }
    }
    if granted >= q {
        Outcome::Reached
    } else if against > nodes - q {
        Outcome::Impossible
    } else {
        Outcome::Undecided
    }
}

/// The clock-drift allowance: `ttl * drift_factor + 2 ms` (Redis' 1 ms expiry precision + 1 ms).
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// How long a lock granted now is valid: `ttl - drift`, or an error when nothing is left.
pub(crate) fn validity(ttl: Duration, drift_factor: f64) -> Result<Duration, InvalidInput> {
    let d = drift(ttl, drift_factor);
    match ttl.checked_sub(d) {
        Some(v) if !v.is_zero() => Ok(v),
        _ => Err(InvalidInput::TtlTooShort { ttl, drift: d }),
    }
}

/// Validates a TTL and turns it into whole milliseconds for Redis, rounding UP: a key that lives
/// a fraction of a millisecond longer than asked is safe; one that dies earlier is not.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, InvalidInput> {
    if ttl.is_zero() {
        return Err(InvalidInput::ZeroTtl);
    }
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    // Redis takes a signed 64-bit PX; stay far from the monotonic clock's limits too.
    if ms > (i64::MAX as u128) / 1_000 {
        return Err(InvalidInput::TtlTooLarge(ttl));
    }
    Ok(ms as u64)
}

/// Default per-node timeout for a TTL: 5% of it, at least 10 ms, at most 500 ms, and never more
/// than half the TTL. A node slower than this counts as failed for that attempt.
pub(crate) fn default_node_timeout(ttl: Duration) -> Duration {
    (ttl / 20)
        .clamp(Duration::from_millis(10), Duration::from_millis(500))
        .min(ttl / 2)
        .max(Duration::from_millis(1))
}

/// Runs `calls` (node index, command future) concurrently and returns each node's answer as soon
/// as `decided` says enough is known, or when `until` passes. Every call is polled at least once
/// first, so every node's command is handed to fred (and ordered on its connection) whatever
/// the decision. Nodes that did not answer by then
/// are `None`; their futures go on in a background task. Indices not in `calls` stay `None`.
///
/// Cancellation: dropping the returned future drops the per-node futures with [`Late::Drop`], and
/// hands them to a task that finishes them with [`Late::Finish`] (so fred's timeout still skips a
/// command not yet written). Commands already handed to fred still run on their nodes (fred keeps
/// per-connection order), so callers that need a clean-up after cancellation arm their own guard
/// (see `Redlock::attempt`).
pub(crate) async fn fan_out<T, F>(
    nodes: usize,
    calls: impl IntoIterator<Item = (usize, F)>,
    until: Option<Instant>,
    late: Late,
    decided: impl FnMut(&[Option<T>]) -> bool,
) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    fan_out_handed(nodes, calls, until, late, |_| false, decided).await
}

/// [`fan_out`], where `handed(i)` says that node `i`'s command, once sent, is out of reach of
/// its fred timeout (see `Node::handed_over`): with [`Late::Finish`], when every node still
/// running at the decision is so, the late calls are dropped instead of finished in a task.
///
/// Why that is safe: finishing a late call keeps fred's per-command timeout armed, and that
/// timeout does one thing to a command nobody else waits for: it makes fred skip the command
/// if its router task has not taken it from the client's channel yet (fred reads the flag when
/// it takes a command, and again only when replaying one, which one attempt per command rules
/// out). Every call was polled once before any decision, so each command is in that channel or
/// past it; `handed(i)` reads fred's count of commands in the channel as zero, so the router
/// has taken node `i`'s: it was written to the connection or failed, and its timeout flag
/// would never be read again. Dropping the call then changes nothing the node sees; per-
/// connection order still puts this token's clean-up or release behind it. What finishing
/// would also do, and dropping does not: resend a late `EVALSHA` answered NOSCRIPT as `EVAL`.
/// The late node then holds no key of this attempt, which is safe (the decision did not count
/// it, and every release goes to every node anyway). An operation queued in a node's batcher
/// (`batch`) is sent by the batcher, with its own deadline, whether its caller waits or not, so
/// `handed(i)` may say so too (`batch::Batched`).
/// Measured on a serial acquire+release: no task spawned per acquire, and the release that
/// follows finds the node idle and skips the batcher.
pub(crate) async fn fan_out_handed<T, F>(
    nodes: usize,
    calls: impl IntoIterator<Item = (usize, F)>,
    until: Option<Instant>,
    late: Late,
    handed: impl Fn(usize) -> bool,
    mut decided: impl FnMut(&[Option<T>]) -> bool,
) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut answers: Vec<Option<T>> = (0..nodes).map(|_| None).collect();
    // Poll every call once BEFORE any decision: a command reaches fred only when its future is
    // first polled, and fred fails commands to a disconnected node synchronously, so deciding on
    // the first answers could otherwise leave later nodes' futures unpolled: a release never
    // sent, or an acquire's SET sent only after the clean-up release behind which it had to land
    // (the torture run's S6 probe found both).
    let mut started: Vec<(usize, Option<Pin<Box<F>>>)> = calls
        .into_iter()
        .map(|(i, call)| (i, Some(Box::pin(call))))
        .collect();
    std::future::poll_fn(|cx| {
        for (i, slot) in started.iter_mut() {
            if let Some(call) = slot {
                if let Poll::Ready(answer) = call.as_mut().poll(cx) {
                    answers[*i] = Some(answer);
                    *slot = None;
                }
            }
        }
        Poll::Ready(())
    })
    .await;
    // Owned by a guard: with `Late::Finish`, calls still running when this future completes OR
    // is dropped go on in a task (see `Finishing`).
    let called: Vec<usize> = started.iter().map(|(i, _)| *i).collect();
    let mut running = Finishing {
        calls: started
            .into_iter()
            .filter_map(|(i, slot)| slot.map(|call| async move { (i, call.await) }))
            .collect::<FuturesUnordered<_>>(),
        late,
    };
    let timer = async {
        match until {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timer);
    // The first polls may already have decided it (synchronous failures, fast replies).
    while !running.calls.is_empty() && !decided(&answers) {
        tokio::select! {
            biased;
            Some((i, answer)) = running.calls.next() => {
                answers[i] = Some(answer);
            }
            () = &mut timer => break,
        }
    }
    // Decided (or out of time): the calls still running need no finishing task when every
    // one's command is already out of its timeout's reach (see above).
    if running.late == Late::Finish
        && !running.calls.is_empty()
        && called.iter().all(|&i| answers[i].is_some() || handed(i))
    {
        running.late = Late::Drop;
    }
    answers
}

/// [`fan_out`] without a deadline that hands back, instead of finishing or dropping them, the
/// calls still running when `decided` says the outcome is known (each polled at least once, so
/// its command is handed to fred), for the caller to await in the background: a release whose
/// answer still matters after the quorum answered (see `Inner::release_all`).
/// Every call still running is polled again at every wake-up: meant for a few nodes.
pub(crate) async fn fan_out_rest<T, F>(
    nodes: usize,
    calls: impl IntoIterator<Item = (usize, F)>,
    mut decided: impl FnMut(&[Option<T>]) -> bool,
) -> (Vec<Option<T>>, Vec<(usize, Pin<Box<F>>)>)
where
    F: Future<Output = T>,
{
    let mut answers: Vec<Option<T>> = (0..nodes).map(|_| None).collect();
    let mut running: Vec<(usize, Pin<Box<F>>)> = calls
        .into_iter()
        .map(|(i, call)| (i, Box::pin(call)))
        .collect();
    // As in `fan_out_handed`: every call is polled before any decision (the first pass polls
    // them all), and each pass harvests every answer that is in before deciding.
    std::future::poll_fn(|cx| {
        running.retain_mut(|(i, call)| match call.as_mut().poll(cx) {
            Poll::Ready(answer) => {
                if let Some(slot) = answers.get_mut(*i) {
                    *slot = Some(answer);
                }
                false
            }
            Poll::Pending => true,
        });
        if running.is_empty() || decided(&answers) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (answers, running)
}

/// The calls of a [`fan_out`] still running; with [`Late::Finish`], dropping it (the fan-out
/// decided, or its caller dropped it half-way) moves them into a task that runs them to the end.
///
/// This matters for a cancelled acquire: fred applies its per-command timeout inside the
/// caller's future, and skips a timed-out command only if it was not written yet. A SET whose
/// future is simply dropped loses its timeout and stays queued (behind a slow write, or during a
/// reconnect) to be written whenever the connection gets to it, possibly after the clean-up
/// release queued behind it has itself timed out and been skipped: a key left for its full TTL.
struct Finishing<G: Future + Send + 'static> {
    calls: FuturesUnordered<G>,
    late: Late,
}

impl<G: Future + Send + 'static> Drop for Finishing<G> {
    fn drop(&mut self) {
        if self.late != Late::Finish {
            return;
        }
        if self.calls.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mut calls = std::mem::take(&mut self.calls);
            rt.spawn(async move { while calls.next().await.is_some() {} });
        }
    }
}

/// What [`fan_out`] does with commands still running when the outcome is known.
///
/// Only fred's per-command timeout depends on it: what a late command still NEEDS (a script's
/// `EVAL` resend after `NOSCRIPT`, a release's answer) is finished by the node layer whatever
/// the round chose (see `Node::eval_with`), so a round cannot lose a late write by choosing
/// `Drop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// Drive them to completion in a background task, so that fred's timeout stays in charge:
    /// a SET that times out before it is written is then skipped, never written after a
    /// reconnect; an EVALSHA answered NOSCRIPT is resent. For acquire and extend.
    Finish,
    /// Drop them: the commands already handed to fred still run, in order, and what a late
    /// answer needs from the protocol (a `NOSCRIPT` resend) is done by the node (see above).
    /// For reads, raising fencing counters and shortening a TTL: saves a task spawn per round.
    /// Not for a lock's release: one that fails late (its connection cut) must be sent again
    /// (see [`fan_out_rest`]).
    Drop,
}

/// Votes with unanswered nodes as [`Vote::Pending`].
pub(crate) fn votes(answers: Vec<Option<Vote>>) -> crate::base::error::Votes {
    crate::base::error::Votes(
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Vote::Pending))
            .collect(),
    )
}

/// Anything a node answers that carries its vote (a plain vote, or a vote with data).
pub(crate) trait AsVote {
    /// The vote in this answer.
    fn as_vote(&self) -> &Vote;
}

impl AsVote for Vote {
    fn as_vote(&self) -> &Vote {
        self
    }
}

/// `decided` rule for quorum questions: stop once the outcome is known.
pub(crate) fn quorum_known<T: AsVote>(answers: &[Option<T>]) -> bool {
    // Called after every answer: counts in place, no Vec<Vote> built.
    tally(answers.len(), answers.iter().flatten().map(AsVote::as_vote)) != Outcome::Undecided
}

/// `decided` rule for a batch of `items` quorum questions answered together (each node's answer
/// carries one vote per item, in order): stop once every item's outcome is known. Each item is
/// tallied on its own, with the same rule as [`quorum_known`].
pub(crate) fn each_known(answers: &[Option<Vec<Vote>>], items: usize) -> bool {
    (0..items).all(|k| {
        let votes = answers.iter().flatten().filter_map(|a| a.get(k));
        tally(answers.len(), votes) != Outcome::Undecided
    })
}

/// Item `k`'s votes in a batch's answers (unanswered nodes, and answers without it, `Pending`).
pub(crate) fn item_votes(answers: &[Option<Vec<Vote>>], k: usize) -> crate::base::error::Votes {
    crate::base::error::Votes(
        answers
            .iter()
            .map(|a| {
                a.as_ref()
                    .and_then(|v| v.get(k))
                    .cloned()
                    .unwrap_or(Vote::Pending)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::error::{NodeError, NodeErrorKind};

    fn failed() -> Vote {
        Vote::Failed(NodeError {
            node: "n".into(),
            kind: NodeErrorKind::Timeout,
            message: String::new(),
        })
    }

    #[test]
    fn quorum_of_configured_nodes() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn decides_as_soon_as_known() {
        use Vote::*;
        assert_eq!(outcome(&[Granted, Granted, Pending]), Outcome::Reached);
        assert_eq!(outcome(&[Granted, Pending, Pending]), Outcome::Undecided);
        assert_eq!(outcome(&[Refused, failed(), Pending]), Outcome::Impossible);
        assert_eq!(outcome(&[Granted, Refused, Pending]), Outcome::Undecided);
        assert_eq!(
            outcome(&[Granted, Granted, Refused, Refused, Pending]),
            Outcome::Undecided
        );
        assert_eq!(
            outcome(&[Granted, Granted, Refused, Refused, Refused]),
            Outcome::Impossible
        );
        // Every mask of N = 3 and 5: reached exactly when granted >= quorum.
        for n in [3usize, 5] {
            for mask in 0u32..(1 << n) {
                let v: Vec<Vote> = (0..n)
                    .map(|i| {
                        if mask & (1 << i) != 0 {
                            Granted
                        } else {
                            Refused
                        }
                    })
                    .collect();
                let reached = (mask.count_ones() as usize) >= quorum(n);
                assert_eq!(
                    outcome(&v) == Outcome::Reached,
                    reached,
                    "n={n} mask={mask:b}"
                );
            }
        }
    }

    #[test]
    fn validity_arithmetic() {
        let ttl = Duration::from_secs(10);
        assert_eq!(drift(ttl, 0.01), Duration::from_millis(102));
        assert_eq!(validity(ttl, 0.01).unwrap(), Duration::from_millis(9_898));
        assert!(matches!(
            validity(Duration::from_millis(2), 0.01),
            Err(InvalidInput::TtlTooShort { .. })
        ));
        assert_eq!(
            validity(Duration::from_millis(100), 0.01).unwrap(),
            Duration::from_millis(97)
        );
    }

    #[test]
    fn ttl_rounds_up_and_rejects_bad_values() {
        assert_eq!(ttl_millis(Duration::from_micros(1_500)).unwrap(), 2);
        assert_eq!(ttl_millis(Duration::from_millis(7)).unwrap(), 7);
        assert_eq!(ttl_millis(Duration::ZERO), Err(InvalidInput::ZeroTtl));
        assert!(matches!(
            ttl_millis(Duration::MAX),
            Err(InvalidInput::TtlTooLarge(_))
        ));
    }

    #[test]
    fn node_timeout_defaults() {
        assert_eq!(
            default_node_timeout(Duration::from_secs(10)),
            Duration::from_millis(500)
        );
        assert_eq!(
            default_node_timeout(Duration::from_secs(1)),
            Duration::from_millis(50)
        );
        assert_eq!(
            default_node_timeout(Duration::from_millis(100)),
            Duration::from_millis(10)
        );
        assert_eq!(
            default_node_timeout(Duration::from_millis(10)),
            Duration::from_millis(5)
        );
    }

    #[test]
    fn a_batch_is_decided_item_by_item() {
        use Vote::*;
        // Two nodes of three answered: item 0 granted by both, item 1 split.
        let answers = vec![
            Some(vec![Granted, Granted]),
            Some(vec![Granted, Refused]),
            None,
        ];
        assert!(!each_known(&answers, 2), "item 1 needs the third node");
        assert!(each_known(&answers[..], 1));
        assert_eq!(item_votes(&answers, 1).0, vec![Granted, Refused, Pending]);
        let all = vec![
            Some(vec![Granted, Granted]),
            Some(vec![Granted, Refused]),
            Some(vec![failed(), Refused]),
        ];
        assert!(each_known(&all, 2));
        assert_eq!(outcome(&item_votes(&all, 0).0), Outcome::Reached);
        assert_eq!(outcome(&item_votes(&all, 1).0), Outcome::Impossible);
        // A short answer never counts as a vote for the items it lacks.
        let short = vec![Some(vec![Granted]), Some(vec![Granted]), None];
        assert!(!each_known(&short, 2));
        assert_eq!(item_votes(&short, 1).0, vec![Pending, Pending, Pending]);
    }

    /// A future that never finishes and records when it is dropped.
    struct Hung(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Future for Hung {
        type Output = Vote;
        fn poll(self: Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<Vote> {
            Poll::Pending
        }
    }

    impl Drop for Hung {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Decides at 2 of 3 with node 2 hung; `handed` as given. Whether node 2's call was dropped.
    async fn late_call_dropped(handed: impl Fn(usize) -> bool) -> bool {
        type Call = std::pin::Pin<Box<dyn Future<Output = Vote> + Send>>;
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let calls: Vec<(usize, Call)> = vec![
            (0, Box::pin(async { Vote::Granted })),
            (1, Box::pin(async { Vote::Granted })),
            (2, Box::pin(Hung(dropped.clone()))),
        ];
        let got = fan_out_handed(3, calls, None, Late::Finish, handed, quorum_known).await;
        assert_eq!(votes(got).0[2], Vote::Pending);
        tokio::task::yield_now().await;
        dropped.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_late_call_is_finished_unless_handed_over() {
        // Not handed over (fred still holds the command in its channel): finished in a task,
        // so its fred timeout stays armed.
        assert!(!late_call_dropped(|_| false).await);
        // Only the nodes that answered are "handed": the late one still needs finishing.
        assert!(!late_call_dropped(|i| i < 2).await);
        // Every late node handed over: dropped at once, no task.
        assert!(late_call_dropped(|_| true).await);
        assert!(late_call_dropped(|i| i == 2).await);
    }

    /// The calls still running at the decision come back, polled once and unfinished, for
    /// the caller to await (a release whose failure must still be seen).
    #[tokio::test]
    async fn fan_out_rest_hands_back_the_late_calls() {
        type Call = std::pin::Pin<Box<dyn Future<Output = Vote> + Send>>;
        let (tx, rx) = tokio::sync::oneshot::channel::<Vote>();
        let late: Call = Box::pin(async move { rx.await.unwrap_or(Vote::Pending) });
        let calls: Vec<(usize, Call)> = vec![
            (0, Box::pin(async { Vote::Granted })),
            (1, late),
            (2, Box::pin(async { Vote::Granted })),
        ];
        let (got, rest) =
            tokio::time::timeout(Duration::from_secs(5), fan_out_rest(3, calls, quorum_known))
                .await
                .expect("decided without the late node");
        assert_eq!(
            votes(got).0,
            vec![Vote::Granted, Vote::Pending, Vote::Granted]
        );
        let [(1, call)] = <[_; 1]>::try_from(rest).unwrap_or_else(|_| panic!("one late call"))
        else {
            panic!("node 1 is the late one");
        };
        let _ = tx.send(Vote::Refused);
        assert_eq!(call.await, Vote::Refused);
    }

    #[tokio::test]
    async fn fan_out_returns_before_a_hung_node() {
        type Call = std::pin::Pin<Box<dyn Future<Output = Vote> + Send>>;
        let calls: Vec<(usize, Call)> = vec![
            (0, Box::pin(async { Vote::Granted })),
            (1, Box::pin(async { Vote::Granted })),
            (2, Box::pin(std::future::pending())),
        ];
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            fan_out(3, calls, None, Late::Finish, quorum_known),
        )
        .await
        .expect("decided without the hung node");
        assert_eq!(
            votes(got).0,
            vec![Vote::Granted, Vote::Granted, Vote::Pending]
        );
    }
}
