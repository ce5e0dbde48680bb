//! One acquire attempt and its turn in the wait line: the attempt's round (every node at once,
//! or the gate alone first when probing), its tally and decision, the fencing write-back of a
//! grant, the clean-up of an attempt that failed, and a waiter's place in its resource's line
//! (joining through the attempt, leaving in the background).
//!
//! Owns: [`Turn`], [`Failure`], `Redlock::attempt`, the `Inner` rounds it runs and a waiter's
//! offer for a hand-over (`Inner::offer`).
//! Must not: retry (that is `acquire_loop`), extend or release a held lock (that is
//! `held_rounds`), parse replies (node), count votes by hand (quorum), or build a `Lock`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{InvalidInput, Vote, Votes};
use crate::base::line::LEASE;
use crate::nodes::node::{Acquired, GateAnswer, Held, LineRef, Place, Queue};
use crate::rounds::background::{self, CleanupGuard};
use crate::rounds::handover::{Handoff, Offer, Ticket};
use crate::rounds::quorum::{
    self, fan_out, fan_out_handed, quorum_known, votes, AsVote, Late, Outcome,
};
use crate::rounds::redlock::{Inner, Redlock, Request};

/// What one attempt of a waiting acquire is (see `lock`'s retry loop).
#[derive(Debug, Clone, Default)]
pub(crate) struct Turn {
    /// The waiter's member in the wait line (`None`: the acquire does not wait).
    pub(crate) member: Option<Arc<str>>,
    /// Ask the gate alone first, and the other nodes only once it granted: a waiter that is
    /// not known to be the line's head must not set keys elsewhere (it would split the votes
    /// of the head the gate is handing the lock to).
    pub(crate) probe: bool,
    /// The gate's answer: granted (it took the member out of its line) or not; told by the
    /// gate's call, also when it answers after the attempt was decided.
    pub(crate) gated: Arc<GateAnswer>,
    /// A waiter's hand-over inside the process (see `handover`): a refused attempt offers its
    /// next value there; a grant handed over is taken by the next attempt.
    pub(crate) handoff: Option<Arc<Handoff<Grant>>>,
    /// An earlier attempt carried the member: the gate may have the waiter in line, and it
    /// keeps that place (it never queues in the process instead).
    pub(crate) in_line: bool,
    /// Woken by its gate as the line's head (the attempt after the wake-up).
    pub(crate) woken: bool,
}

/// Why one attempt did not produce a lock.
pub(crate) enum Failure {
    Contended(Votes),
    /// Contended, and the gate put the waiter in the key's wait line (or told its place).
    Queued(Votes, Queue),
    Unavailable(Votes),
    Expired(Duration),
    /// Not worth retrying (for example a semaphore used with another number of permits).
    Rejected(InvalidInput),
}

pub(crate) use crate::rounds::redlock::Grant;

/// Per key: one more than the largest counter among the nodes that granted.
pub(crate) fn fencing_tokens(
    votes: &Votes,
    counters: &[Option<Vec<u64>>],
    keys: usize,
) -> Vec<u64> {
    (0..keys)
        .map(|k| {
            let max = votes
                .0
                .iter()
                .zip(counters)
                .filter(|(v, _)| **v == Vote::Granted)
                .filter_map(|(_, c)| c.as_ref()?.get(k).copied())
                .max()
                .unwrap_or(0);
            max.saturating_add(1)
        })
        .collect()
}

impl AsVote for Acquired {
    fn as_vote(&self) -> &Vote {
        &self.vote
    }
}

/// The votes of one attempt's round, with the fencing counters the granting nodes returned and
/// what the gate said about its line.
struct Tally {
    votes: Votes,
    counters: Vec<Option<Vec<u64>>>,
    queue: Option<Queue>,
}

impl Redlock {
    /// One Redlock attempt with a fresh token (or the caller's).
    pub(crate) async fn attempt(
        &self,
        req: &Request,
        turn: &Turn,
    ) -> std::result::Result<Grant, Failure> {
        // Handed over by a release of this Redlock: the gate took the member out of its line.
        if let Some(grant) = turn.handoff.as_ref().and_then(|h| h.take_handed()) {
            turn.gated.tell(true);
            return Ok(grant);
        }
        if let Some(failure) = self.inner.queue_in_process(req, turn) {
            return Err(failure);
        }
        let held = self.inner.held_for(req, turn);
        // Armed until the outcome is settled: if this future is dropped, release everywhere.
        let mut guard = CleanupGuard {
            inner: Some(self.inner.clone()),
            held: held.clone(),
            ttl: req.ttl,
        };
        let t0 = Instant::now();
        let Some(deadline) = t0.checked_add(req.validity) else {
            guard.inner = None;
            return Err(Failure::Expired(Duration::ZERO));
        };
        let (answers, sent) = match (&req.line, turn.probe) {
            (Some((gate, _)), true) => self.inner.probe_round(&held, req, *gate, deadline).await,
            _ => (self.inner.acquire_round(&held, req, deadline).await, None),
        };
        let tally = self.inner.tally(req, answers, t0);
        let granted = self.inner.decide(req, turn, &tally);
        if let (Some(line), true) = (&held.line, line_granted(turn)) {
            line.at_gate
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut now = Instant::now();
        let mut failure = None;
        if granted && now < deadline {
            match self.inner.grant(&held, &tally, req, t0, deadline).await {
                Ok(grant) => {
                    guard.inner = None;
                    granted_line(&held);
                    if let Some(announce) = &req.announce {
                        let _ = held.announce.set(announce.clone());
                    }
                    return Ok(grant);
                }
                Err(refused) => failure = refused,
            }
            now = Instant::now();
        }
        // Release wherever our token may be: nodes that granted, failed or did not answer. The
        // release is handed to each node's connection (queued behind that node's SET, so it
        // lands after it) but not awaited: the call's time bound must not include it, and a
        // next attempt's SET is queued behind it in turn.
        let votes = &tally.votes.0;
        let targets = (0..votes.len())
            .filter(|&i| votes[i] != Vote::Refused)
            .filter(|&i| sent.as_ref().is_none_or(|s| s[i]));
        self.inner.release_unawaited(&held, targets, req.ttl).await;
        guard.inner = None;
        let failure =
            failure.unwrap_or_else(|| self.inner.failure(tally, granted, t0, now, deadline));
        // In line, told its place: a release of this Redlock may hand the lock over.
        if let (Failure::Queued(_, q), Some(handoff)) = (&failure, &turn.handoff) {
            if q.rank >= 0 {
                handoff.offered(self.inner.offer(req, turn, true));
            }
        }
        Err(failure)
    }
}

impl Inner {
    /// The offer a waiter refused with its place in line makes for its next attempt; `None` when
    /// the request cannot be handed over (several keys, fencing, a caller's token, a node that
    /// cannot run `PASS`).
    pub(crate) fn offer(
        self: &Arc<Self>,
        req: &Request,
        turn: &Turn,
        lined: bool,
    ) -> Option<Ticket<Grant>> {
        let member = turn.member.clone()?;
        let [key] = req.keys.as_slice() else {
            return None;
        };
        if req.token.is_some() || !req.fence_keys.is_empty() || req.line.is_none() {
            return None;
        }
        if !self.nodes.iter().all(|n| n.can_pass()) {
            return None;
        }
        let seq = member.rsplit(':').next()?.parse::<u64>().ok()?;
        let offer = Offer {
            held: self.held_for(req, turn),
            member,
            ttl_ms: req.ttl_ms,
            ttl: req.ttl,
            validity: req.validity,
            as_is: !req.keeps_minimum,
            lined,
        };
        let (inner, ttl) = (self.clone(), req.ttl);
        let orphan = Box::new(move |grant: Grant| {
            let why = "a handed-over lock nobody took";
            background::spawn_release(inner, grant.held, ttl, why);
        });
        Some(Ticket::offer(&self.handovers, key, seq, offer, orphan))
    }

    /// A waiter about to ask the gate for a place, while another waiter of this `Redlock` has
    /// one (an open offer from the line, see `Handovers::lined`): it offers too and waits in
    /// the process, sending nothing. The lock reaches the process through that waiter's place
    /// and then passes between the process's waiters (as it is, or by `PASS`, which the gate
    /// grants such a waiter only while no other process waits in the line). `None`: attempt.
    fn queue_in_process(self: &Arc<Self>, req: &Request, turn: &Turn) -> Option<Failure> {
        let handoff = turn.handoff.as_ref()?;
        let [key] = req.keys.as_slice() else {
            return None;
        };
        if !turn.probe || turn.in_line || !self.handovers.lined(key) {
            return None;
        }
        let ticket = self.offer(req, turn, false)?;
        handoff.offered(Some(ticket));
        let votes = Votes(vec![Vote::Refused; self.nodes.len()]);
        Some(Failure::Queued(votes, Queue::IN_PROCESS))
    }

    /// The keys and value one attempt of `req` sets (a fresh token unless the caller gave one),
    /// with its part in the key's wait line.
    pub(crate) fn held_for(self: &Arc<Self>, req: &Request, turn: &Turn) -> Arc<Held> {
        let (value, custom) = req.value();
        Arc::new(Held {
            keys: req.keys.clone(),
            value,
            custom,
            resources: req.resources.clone(),
            fence_keys: req.fence_keys.clone(),
            line: req
                .line
                .as_ref()
                .map(|(gate, key)| self.line_ref(*gate, key, turn)),
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        })
    }

    /// Counts the round's answers (one not yet answered is `Pending`), notes a key granted
    /// through its line as hot, and records the votes on the metrics and the current span.
    fn tally(&self, req: &Request, answers: Vec<Option<Acquired>>, t0: Instant) -> Tally {
        let at_gate = req
            .line
            .as_ref()
            .and_then(|(gate, _)| answers[*gate].as_ref());
        let queue = at_gate.and_then(|a| a.queue);
        if at_gate.is_some_and(|a| a.lined) {
            // Granted through a line: others are likely still waiting, so this process's next
            // acquire of the key asks the gate first.
            if let Some(key) = req.keys.first() {
                self.line.mark_hot(key);
            }
        }
        let mut counters = Vec::new();
        let votes = Votes(
            answers
                .into_iter()
                .map(|a| {
                    let a = a.unwrap_or(Acquired::plain(Vote::Pending));
                    counters.push(a.counters);
                    a.vote
                })
                .collect(),
        );
        crate::base::metrics::failures(&votes.0);
        let span = tracing::Span::current();
        span.record("granted", votes.granted());
        span.record("failed", votes.failed());
        span.record("elapsed_us", t0.elapsed().as_micros() as u64);
        Tally {
            votes,
            counters,
            queue,
        }
    }

    /// Whether the attempt may take its quorum; also tells `turn` whether the gate granted.
    fn decide(&self, req: &Request, turn: &Turn, tally: &Tally) -> bool {
        // A quorum without the gate while the gate keeps a line ahead of us is not taken (we
        // are behind its head, or do not wait and the gate refused for the line alone): the
        // head is being handed the lock. Giving up a grant is always safe. (The head itself
        // takes a quorum without the gate, whose key someone else holds.)
        let granted = quorum::outcome(&tally.votes.0) == Outcome::Reached
            && !tally
                .queue
                .is_some_and(|q| q.rank > 0 || (q.rank < 0 && q.pttl == -2));
        // Granted there: the gate took the member out of its line. Otherwise (failed) a refusal
        // there may still have put it in line: the retry loop then leaves the line after a
        // grant. Not answered yet: the gate's call tells its answer when it comes.
        if let Some(vote) = req.line.as_ref().and_then(|(g, _)| tally.votes.0.get(*g)) {
            if *vote != Vote::Pending {
                turn.gated.tell(*vote == Vote::Granted);
            }
        }
        granted
    }

    /// Turns a quorum reached in time into a grant; with fencing, only once its tokens are
    /// written back to a quorum (unless the caller raises them itself: `raise_later`).
    /// `Err(Some(_))`: the write-back failed in time; `Err(None)`: it ended past the deadline.
    async fn grant(
        &self,
        held: &Arc<Held>,
        tally: &Tally,
        req: &Request,
        t0: Instant,
        deadline: Instant,
    ) -> std::result::Result<Grant, Option<Failure>> {
        if held.fence_keys.is_empty() {
            return Ok(Grant {
                held: held.clone(),
                t0,
                deadline,
                fencing: None,
                handed: None,
            });
        }
        // Fencing: each token is one more than the largest counter the granting nodes
        // returned, and is written back to a quorum (a max-register) before the lock is
        // handed out, so that any later grant's quorum sees it and goes higher.
        let tokens = fencing_tokens(&tally.votes, &tally.counters, held.keys.len());
        // Unless the caller raises them before the token is seen (`Request::raise_later`).
        if !req.raise_later {
            let raised = self
                .raise_fence(&held.fence_keys, &tokens, deadline, req.timeout)
                .await;
            let now = Instant::now();
            if quorum::outcome(&raised.0) != Outcome::Reached || now >= deadline {
                return Err((now < deadline).then_some(Failure::Unavailable(raised)));
            }
        }
        Ok(Grant {
            held: held.clone(),
            t0,
            deadline,
            fencing: Some(tokens),
            handed: None,
        })
    }

    /// Why an attempt that was not granted (or was, too late) failed.
    fn failure(
        &self,
        tally: Tally,
        granted: bool,
        t0: Instant,
        now: Instant,
        deadline: Instant,
    ) -> Failure {
        let votes = tally.votes;
        // Out of validity with answers still outstanding: the TTL is too short for the network,
        // which is not the same as nodes being down.
        let expired_waiting = now >= deadline && votes.0.contains(&Vote::Pending);
        if granted || expired_waiting {
            Failure::Expired(now.duration_since(t0))
        } else if votes.failed() > self.nodes.len() - self.quorum || votes.refused() == 0 {
            Failure::Unavailable(votes)
        } else if let Some(queue) = tally.queue {
            Failure::Queued(votes, queue)
        } else {
            Failure::Contended(votes)
        }
    }
}

/// Whether the gate granted the attempt that carried `turn` (see `Inner::decide`).
fn line_granted(turn: &Turn) -> bool {
    turn.member.is_some() && turn.gated.granted()
}

/// A granted lock's releases wake its line's head (its attempt's clean-up would have put the
/// waiter back in line instead).
fn granted_line(held: &Held) {
    if let Some(line) = &held.line {
        line.wake.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Inner {
    /// Every node at once (one round trip), decided as soon as the quorum is known.
    async fn acquire_round(
        &self,
        held: &Arc<Held>,
        req: &Request,
        deadline: Instant,
    ) -> Vec<Option<Acquired>> {
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().acquire(held.clone(), req.ttl_ms, req.timeout)));
        // A waiter that fails also waits for its gate's answer (its place in line), which a
        // grant does not (a slow gate must not slow grants down).
        let gate = held
            .line
            .as_ref()
            .filter(|l| l.member.is_some())
            .map(|l| l.gate);
        let q = self.quorum;
        // A late node's SET (or gate script) already taken by fred's router, or queued in its
        // batcher, needs no task to finish it (see `fan_out_handed`): the serial path then
        // spawns nothing, and the release that follows finds that node idle and is sent
        // directly. A waiter's gate is
        // finished: its answer tells whether the waiter is still in line there.
        let handed = |i: usize| {
            Some(i) != gate
                && (held.batched.queued(i) || self.nodes.get(i).is_some_and(|n| n.handed_over()))
        };
        fan_out_handed(
            self.nodes.len(),
            calls,
            Some(deadline),
            Late::Finish,
            handed,
            |a| {
                let granted = a
                    .iter()
                    .flatten()
                    .filter(|x| x.vote == Vote::Granted)
                    .count();
                quorum_known(a) && (granted >= q || gate.is_none_or(|g| a[g].is_some()))
            },
        )
        .await
    }

    /// The gate alone first; the other nodes only when it granted (two round trips, the
    /// validity counted from before the first). Also returns which nodes were sent anything
    /// (the others need no clean-up).
    async fn probe_round(
        &self,
        held: &Arc<Held>,
        req: &Request,
        gate: usize,
        deadline: Instant,
    ) -> (Vec<Option<Acquired>>, Option<Vec<bool>>) {
        let n = self.nodes.len();
        let call = self.nodes[gate]
            .clone()
            .acquire(held.clone(), req.ttl_ms, req.timeout);
        let mut first = fan_out(n, [(gate, call)], Some(deadline), Late::Finish, |a| {
            a[gate].is_some()
        })
        .await;
        let at_gate = first[gate].take();
        let mut sent = vec![false; n];
        sent[gate] = true;
        if at_gate.as_ref().is_none_or(|a| a.vote != Vote::Granted) {
            first[gate] = at_gate;
            return (first, Some(sent));
        }
        let q = self.quorum;
        let calls = (0..n).filter(|&i| i != gate).map(|i| {
            (
                i,
                self.nodes[i]
                    .clone()
                    .acquire(held.clone(), req.ttl_ms, req.timeout),
            )
        });
        let mut answers = fan_out(n, calls, Some(deadline), Late::Finish, |a| {
            let votes = a.iter().flatten().map(|x| &x.vote);
            let granted = 1 + votes.clone().filter(|v| **v == Vote::Granted).count();
            let lost = votes.filter(|v| **v != Vote::Granted).count();
            granted >= q || lost > n - q
        })
        .await;
        answers[gate] = at_gate;
        (answers, None)
    }

    /// Raises the fencing counters `keys` to `tokens` on every node; returns once a quorum did
    /// (or can no longer), or at `deadline`.
    pub(crate) async fn raise_fence(
        &self,
        keys: &[String],
        tokens: &[u64],
        deadline: Instant,
        timeout: Duration,
    ) -> Votes {
        let fence = Arc::new((keys.to_vec(), tokens.to_vec()));
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().raise_fence(fence.clone(), timeout)));
        // A late raise only raises a counter further; its NOSCRIPT resend is the node's.
        votes(
            fan_out(
                self.nodes.len(),
                calls,
                Some(deadline),
                Late::Drop,
                quorum_known,
            )
            .await,
        )
    }

    /// This attempt's part in the line `key` on node `gate`.
    pub(crate) fn line_ref(self: &Arc<Self>, gate: usize, key: &str, turn: &Turn) -> LineRef {
        LineRef {
            gate,
            key: key.to_string(),
            member: turn.member.clone(),
            wake: std::sync::atomic::AtomicBool::new(false),
            local: self.line.clone(),
            at_gate: std::sync::atomic::AtomicBool::new(false),
            rank: turn.in_line || self.wake.is_none(),
            answer: turn.member.is_some().then(|| turn.gated.clone()),
            call: Default::default(),
            place: match (turn.woken, turn.in_line) {
                (true, _) => Place::Turn,
                (false, false) => Place::New,
                (false, true) => Place::Look,
            },
        }
    }

    /// Leaves line `line_key` on `gate` in the background (a waiter that gave up or was
    /// cancelled), waking the next head when the leaver was the head and a key is free; with no
    /// member, only that wake-up (a lock broken by force).
    /// A leave that fails (the gate frozen, restarting, loading) is retried while the place
    /// could still be there, see [`background::retry_leave`].
    pub(crate) fn leave_line(
        self: &Arc<Self>,
        gate: usize,
        keys: Vec<String>,
        line_key: String,
        member: String,
    ) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let node = self.nodes[gate].clone();
        let inner = self.clone();
        let spec = Arc::new((line_key, member, self.line.prefix().to_string()));
        let keys = Arc::new(keys);
        let timeout = self.release_timeout();
        // The place ends with its lease, renewed at the latest by the attempt that just ended.
        let until = Instant::now()
            .checked_add(LEASE)
            .unwrap_or_else(Instant::now);
        rt.spawn(async move {
            let leave = || node.clone().leave_line(keys.clone(), spec.clone(), timeout);
            if let Some(Some(woken)) = background::retry_leave(&*inner, until, leave).await {
                inner.line.woke(&woken);
            }
        });
    }

    /// Deletes the leases of this Redlock's granted members that are still alive (one `DEL`
    /// per gate node, all at once), so that a closed Redlock leaves no key in the lines: an
    /// operator scanning for leftovers finds none. Failures are ignored: each lease expires
    /// within [`LEASE`] anyway.
    pub(crate) async fn drop_spent_leases(&self) {
        let timeout = self.release_timeout();
        let deletes = self.line.take_spent().into_iter().map(|(gate, keys)| {
            let node = self.nodes[gate].clone();
            async move { node.drop_leases(keys, timeout).await }
        });
        for result in futures::future::join_all(deletes).await {
            if let Err(e) = result {
                tracing::debug!("fredlock: a granted member's lease is left to expire: {e}");
            }
        }
    }

    /// Takes `member` out of line `line_key` on `gate` in the background, for a waiter granted
    /// the lock before its gate answered. The gate ran that attempt's call first (same
    /// connection), so the member is in line there only if the gate refused it: the gate's late
    /// answer is awaited first (up to the release timeout), and after a grant there (which took
    /// the member out already) nothing is sent. Otherwise it leaves as a waiter that gave up
    /// does ([`leave_line`](Self::leave_line)): when it was the head, the next head is woken
    /// (for its turn when the key is free there, otherwise to look). The key on the gate was not ours (it refused), and our release
    /// there, which may come first, saw our own member at the head and woke nobody: the one
    /// behind it may not even know it is next (a waiter far behind asks its place every 4 s).
    pub(crate) fn forget_place(
        self: &Arc<Self>,
        gate: usize,
        keys: Vec<String>,
        line_key: String,
        member: String,
        answer: Arc<GateAnswer>,
    ) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        let timeout = self.release_timeout();
        rt.spawn(async move {
            if !answer.granted_within(timeout).await {
                inner.leave_line(gate, keys, line_key, member);
            }
        });
    }
}
