//! The retry loop of every acquire (locks, semaphore permits, read-write locks): runs single
//! attempts of the rounds layer below until one is granted, the budget of waiting is spent or
//! the caller's `wait` has passed, and keeps the waiter's place in the resource's wait line.
//!
//! The loop is a small state machine of three steps, each a function: [`Acquiring::attempt`]
//! (one attempt, with the turn in line it carries), [`Acquiring::decide`] (after a refusal:
//! give up, attempt again at once, or wait, and for how long) and [`Acquiring::wait`] (for the
//! timer or a wake-up from the gate).
//!
//! Owns: the acquire retry loop, a waiter's place in line ([`WaitLine`], `Place`), the error an
//! acquire that gave up returns. Must not: send commands itself (the rounds in `redlock` do), or
//! know what is acquired (a [`Lock`](crate::Lock), a permit: the caller's `attempt` builds it).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Error, HeldBy, Names, Result};
use crate::base::line::{Member, RENEW, RENEW_FAR};
use crate::nodes::node::{GateAnswer, Queue};
use crate::rounds::attempt::{Failure, Grant, Turn};
use crate::rounds::handover::Handoff;
use crate::rounds::redlock::{random_up_to, Inner, Redlock, Retry};

/// A waiter far behind its line's head asks its place (`ZRANK`) at every this many timers
/// (every 4 s: its timer is [`RENEW_FAR`]), and looks at the gate once it is the head or right
/// behind it (it renews its place with one command at every timer: see
/// `Acquiring::renewed_only`).
const LOOK_EVERY: u32 = 2;

/// Told after each attempt that was not granted (see `AcquireOptions::report`): `Some` with the
/// error the acquire would return for it when nodes failed or the validity ran out, `None`
/// when the nodes answered and refused (contention).
pub(crate) type Report = Arc<dyn Fn(Option<Error>) + Send + Sync>;

impl Redlock {
    /// The retry loop of every acquire: runs `attempt` until it succeeds, or it has waited
    /// `retry.attempts - 1` pauses (without `wait`), or the next attempt would start after
    /// `wait` (with it; a wait too large for the clock is no limit). A rejected request ends it
    /// at once.
    ///
    /// An acquire of one resource that may wait takes a place in the resource's wait line on
    /// its gate node (`line`, see `crate::base::line`): its first refused attempt puts it in line,
    /// and from then on it waits for its turn:
    /// - woken (the gate's release script woke this member: it is the head and the key is
    ///   free), it attempts on every node at once;
    /// - otherwise its timer fires: it asks the gate alone (a probe, which also renews its
    ///   place), and the other nodes only if the gate granted. The timer is [`RENEW`] while
    ///   wake-ups reach it (for the head, the holder's TTL left on the gate if sooner, so an
    ///   expired holder is noticed at once), else the retry pause times the place behind the head (1 to 8).
    ///   A waiter two places or more behind the head renews its place with one command instead
    ///   of asking, every [`RENEW_FAR`], and asks its place at every second timer (see
    ///   [`Acquiring::renewed_only`]).
    ///
    /// Without a line (several resources, a node failure at the gate, a `try_acquire`), it
    /// pauses `delay + random(0..=jitter)` between attempts. `attempts` is a budget of waiting
    /// time in pauses either way: a long wait in line for a turn counts as the pauses it lasted.
    /// Dropping the future, giving up or failing leaves the line (in the background).
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        retry: Retry,
        (wait, report): (Option<Duration>, Option<&Report>),
        resources: &[String],
        line: Option<WaitLine>,
        ttl: Duration,
        attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Turn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let started = Instant::now();
        let result = self
            .retry_loop(retry, (wait, report), resources, line, ttl, attempt)
            .await;
        let outcome = match &result {
            Ok(_) => "granted",
            Err(Error::Contended { .. }) => "contended",
            Err(Error::ValidityExpired { .. }) => "expired",
            Err(Error::InvalidInput(_)) => "invalid",
            Err(Error::Closed { .. }) => "closed",
            Err(_) => "unavailable",
        };
        crate::base::metrics::acquired(outcome, started.elapsed());
        result
    }

    /// Attempt, decide, wait; until an attempt is granted or the loop gives up.
    async fn retry_loop<T, F, Fut>(
        &self,
        retry: Retry,
        (wait, report): (Option<Duration>, Option<&Report>),
        resources: &[String],
        line: Option<WaitLine>,
        ttl: Duration,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Turn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        // `close()` waits for this call to end, and refuses it once closed.
        let Some(_in_flight) = self.inner.holds.acquiring() else {
            return Err(closed(resources));
        };
        let mut state = Acquiring::new(self, retry, wait, resources, line, ttl);
        loop {
            let failure = match state.attempt(&mut attempt).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if let Some(report) = report {
                report(state.reported(&failure));
            }
            match state.decide(failure) {
                Decision::GiveUp(e) => return Err(e),
                Decision::Again => {}
                Decision::Wait(pause) => state.wait(pause).await?,
            }
        }
    }

    /// The error for an acquire that gave up after `attempts` attempts, the last one `failure`.
    fn failed(
        &self,
        failure: Failure,
        resources: &[String],
        attempts: u32,
        ttl: Duration,
    ) -> Error {
        tracing::Span::current().record("attempt", attempts);
        let resources = Names(resources.to_vec());
        match failure {
            Failure::Contended(votes) | Failure::Queued(votes, _) => Error::Contended {
                resources,
                held_by: HeldBy::SomeoneElse,
                attempts,
                votes,
            },
            Failure::Unavailable(votes) => self.inner.unavailable(resources, attempts, votes),
            Failure::Expired(elapsed) => Error::ValidityExpired {
                resources,
                attempts,
                elapsed,
                ttl,
            },
            Failure::Rejected(e) => e.into(),
        }
    }
}

/// One acquire's retry loop between its steps.
struct Acquiring<'a> {
    redlock: &'a Redlock,
    retry: Retry,
    resources: &'a [String],
    ttl: Duration,
    /// No attempt starts after this (`wait`; `None`: no limit in time).
    give_up: Option<Instant>,
    /// The place in the resource's wait line, for a call that may wait at all: made at the
    /// first refusal (or before a first attempt that asks the gate), so that an acquire granted
    /// at once costs nothing of the line's (see [`Acquiring::place`]).
    place: Option<Place>,
    /// The line of a call that may wait, and its member's sequence number (taken at the start:
    /// waiters of one process go in the order their acquires started), until `place` is made.
    line: Option<(WaitLine, u64)>,
    /// Waiting time so far and allowed, in retry pauses (no limit with `wait`).
    waited: f64,
    budget: f64,
    attempts: u32,
    /// The next attempt asks the gate first.
    probe: bool,
    /// The next attempt follows the gate's wake-up of its member, the line's head.
    woken: bool,
    /// The last attempt carried the member (it may have put us in line).
    joining: bool,
}

/// What the loop does after a refused attempt.
enum Decision {
    /// Stop with this error.
    GiveUp(Error),
    /// Attempt again at once.
    Again,
    /// Wait for the timer or a wake-up, then attempt again.
    Wait(Pause),
}

/// A planned wait: until when, what it counts for, and the refusal that led to it.
struct Pause {
    failure: Failure,
    /// The place in line the gate told, if any.
    queue: Option<Queue>,
    /// The retry pause (`delay + random(0..=jitter)`) the waiting time is counted in.
    pause: Duration,
    /// Pauses the wait counts for if the timer fires.
    planned: f64,
    /// When the timer fires (`None`: never).
    until: Option<Instant>,
    started: Instant,
}

impl<'a> Acquiring<'a> {
    fn new(
        redlock: &'a Redlock,
        retry: Retry,
        wait: Option<Duration>,
        resources: &'a [String],
        line: Option<WaitLine>,
        ttl: Duration,
    ) -> Self {
        // A place in line only for a call that may wait at all (never for `try_acquire`).
        let may_wait = wait.map_or(retry.attempts > 1, |w| !w.is_zero());
        let inner = &redlock.inner;
        let line = line.filter(|_| may_wait).map(|l| (l, inner.line.seq()));
        // A key contended lately: ask its gate first rather than split the woken head's votes.
        let probe = line
            .as_ref()
            .is_some_and(|(l, _)| inner.line.is_hot(&l.hot));
        let mut acquiring = Acquiring {
            redlock,
            retry,
            resources,
            ttl,
            give_up: wait.and_then(|w| Instant::now().checked_add(w)),
            place: None,
            line,
            waited: 0.0,
            budget: match wait {
                None => f64::from(retry.attempts.saturating_sub(1)),
                Some(_) => f64::INFINITY,
            },
            attempts: 0,
            probe,
            woken: false,
            joining: false,
        };
        if probe {
            acquiring.place();
        }
        acquiring
    }

    /// Makes the place in line (once), for a call that may wait.
    fn place(&mut self) {
        if let Some((line, seq)) = self.line.take() {
            self.place = Some(Place::new(&self.redlock.inner, line, seq));
        }
    }

    /// Step 1: one attempt, carrying this call's turn in line.
    async fn attempt<T, F, Fut>(&mut self, attempt: &mut F) -> std::result::Result<T, Failure>
    where
        F: FnMut(Turn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        self.attempts = self.attempts.saturating_add(1);
        crate::base::metrics::attempt();
        // The first attempt, unless it asks the gate first, does not join the line: in the
        // common case it is granted, and a refusal at the gate that its grant overtook would
        // leave a member nobody waits for.
        self.joining = self.probe || self.attempts > 1;
        // The last refusal's offer: withdrawn, or the lock a release handed over.
        if let Some(p) = &self.place {
            p.handoff.settle().await;
        }
        let (probe, joining) = (self.probe, self.joining);
        let woken = std::mem::take(&mut self.woken);
        let turn = self
            .place
            .as_mut()
            .map(|p| p.turn(probe, joining, woken))
            .unwrap_or_default();
        let value = attempt(turn).await?;
        if let Some(p) = self.place.as_mut() {
            p.granted = true;
            // A member's lease outlives its grant on the gate: close() deletes it.
            if p.joined {
                let lease = format!("{}|{}", p.line.line_key, p.member.name());
                p.inner.line.spent(p.line.gate, lease);
            }
            // Granted by the gate: it took us out of its line with the grant.
            // Granted without its answer: we may be in line there; leave (in the
            // background).
            if p.gated.granted() {
                p.joined = false;
            }
        }
        tracing::Span::current().record("attempt", self.attempts);
        tracing::debug!("acquired");
        Ok(value)
    }

    /// What a [`Report`] is told of a refused attempt: the error for it, unless the nodes
    /// answered and only contention stood in the way.
    fn reported(&self, failure: &Failure) -> Option<Error> {
        let copy = match failure {
            Failure::Contended(_) | Failure::Queued(..) => return None,
            Failure::Unavailable(votes) => Failure::Unavailable(votes.clone()),
            Failure::Expired(elapsed) => Failure::Expired(*elapsed),
            Failure::Rejected(e) => Failure::Rejected(e.clone()),
        };
        Some(self.give_up_after(copy))
    }

    /// Step 2: after a refused attempt, give up, attempt again at once, or plan a wait.
    fn decide(&mut self, failure: Failure) -> Decision {
        if let Failure::Rejected(e) = failure {
            return Decision::GiveUp(e.into());
        }
        // Refused (NOPERM) by so many nodes that no retry can succeed: say so at once.
        if let Failure::Unavailable(votes) = &failure {
            let subject = format!("lock {}", Names(self.resources.to_vec()));
            let quorum = self.redlock.quorum();
            if let Some(e) = crate::base::error::not_permitted(subject, votes, quorum) {
                return Decision::GiveUp(e);
            }
        }
        tracing::trace!(attempt = self.attempts, "attempt failed");
        let queue = match &failure {
            Failure::Queued(_, q) if q.rank >= 0 => Some(*q),
            _ => None,
        };
        let contended = matches!(failure, Failure::Contended(_) | Failure::Queued(..));
        let in_process = queue == Some(Queue::IN_PROCESS);
        self.place();
        if let Some(p) = self.place.as_mut() {
            p.failed(contended, self.joining, in_process);
        }
        let pause = self.retry.delay + random_up_to(self.retry.jitter);
        let now = Instant::now();
        if self.waited >= self.budget || self.give_up.is_some_and(|g| now >= g) {
            return Decision::GiveUp(self.give_up_after(failure));
        }
        if self.place.is_some() && contended && !self.joining {
            // Met a holder without joining: join at once (a probe of the gate).
            self.probe = true;
            return Decision::Again;
        }
        let timer = match (&self.place, queue) {
            (Some(p), Some(q)) => p.timer(q, pause),
            // In line without news of the place (the gate failed): renew it in time.
            (Some(p), None) if p.joined => pause.min(RENEW),
            _ => pause,
        };
        let (planned, until) = self.plan(timer, pause, now);
        Decision::Wait(Pause {
            failure,
            queue,
            pause,
            planned,
            until,
            started: now,
        })
    }

    /// A wait of `timer` from `now`: the retry pauses it counts for (no more than the budget
    /// left) and when it ends (no later than `give_up`).
    fn plan(&self, timer: Duration, pause: Duration, now: Instant) -> (f64, Option<Instant>) {
        let planned = pauses(timer, pause).min(self.budget - self.waited);
        let until = Duration::try_from_secs_f64(pause.as_secs_f64() * planned)
            .ok()
            .filter(|_| !pause.is_zero())
            .unwrap_or(timer);
        let until = match (now.checked_add(until), self.give_up) {
            (Some(t), Some(g)) => Some(t.min(g)),
            (t, g) => t.or(g),
        };
        (planned, until)
    }

    /// A waiter two or more places behind its line's head, as the gate last told it, renews its
    /// place with one command when its timer fires ([`Node::renew_place`]) instead of looking at
    /// the gate (about 5 commands); at every [`LOOK_EVERY`]-th renewal (a waiter told only that
    /// it is behind the head: at its first) it also asks its place (`ZRANK`,
    /// [`Node::place_rank`]) and looks only once it is the head or right behind it:
    /// the head's looks notice a lost wake-up and the next waiter's notice a dead head (each
    /// within [`RENEW`]), and only those two can take the next turn. Whether it renewed (and may
    /// wait again, `p` told its new place); `false` when it should look now (its place's lease
    /// was gone, the gate failed, the waiting time ran out, or it moved up to the head's side).
    ///
    /// [`Node::renew_place`]: crate::nodes::node::Node::renew_place
    /// [`Node::place_rank`]: crate::nodes::node::Node::place_rank
    async fn renewed_only(&mut self, p: &mut Pause) -> bool {
        let spent = self.waited >= self.budget || self.give_up.is_some_and(|g| Instant::now() >= g);
        let Some(place) = self.place.as_mut() else {
            return false;
        };
        // Told only that it is behind the head: it renews and asks its place (2 commands)
        // rather than looking (5), and looks only when it is right behind it.
        let unknown = p.queue.is_some_and(|q| !q.exact && q.rank == 1);
        let far = unknown || p.queue.is_some_and(|q| q.rank >= 2);
        let woken = place.inner.wake.is_some() && place.inner.line.is_up(place.line.gate);
        if !far || !woken || spent {
            place.renewals = 0;
            return false;
        }
        let node = &place.inner.nodes[place.line.gate];
        let timeout = place.inner.release_timeout();
        let member = place.member.name();
        let line = &place.line.line_key;
        if !matches!(node.renew_place(line, member, timeout).await, Ok(true)) {
            place.renewals = 0;
            return false;
        }
        place.renewals += 1;
        if place.renewals < LOOK_EVERY && !unknown {
            return true;
        }
        place.renewals = 0;
        match (
            node.place_rank(line, member, timeout).await,
            p.queue.as_mut(),
        ) {
            (Ok(Some(rank)), Some(q)) if rank >= 2 => {
                q.rank = rank;
                q.exact = true;
                true
            }
            _ => false,
        }
    }

    /// Step 3: wait for the timer or a wake-up from the gate; an error when the time to wait
    /// ran out meanwhile.
    async fn wait(&mut self, mut p: Pause) -> Result<()> {
        while let Some(mut again) = self.wait_once(p).await? {
            // Renewed without looking: the same place, a new timer.
            let now = Instant::now();
            (again.planned, again.until) = self.plan(RENEW_FAR, again.pause, now);
            again.started = now;
            p = again;
        }
        Ok(())
    }

    /// One wait of [`wait`](Self::wait): the pause back when its timer fired and the place was
    /// renewed without looking (wait again).
    async fn wait_once(&mut self, mut p: Pause) -> Result<Option<Pause>> {
        let sleep = async {
            match p.until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let place = &self.place;
        let woken = async {
            match place {
                Some(place) if p.queue.is_some() => place.member.woken().await,
                _ => std::future::pending().await,
            }
        };
        tracing::trace!(attempt = self.attempts, queue = ?p.queue, "waiting");
        let closing = self.redlock.inner.holds.closing();
        tokio::select! {
            biased;
            () = closing => return Err(closed(self.resources)),
            () = woken => {
                self.waited += pauses(p.started.elapsed(), p.pause).min(p.planned);
                // Woken by the gate: the head of the line, the key free: every node at
                // once. Woken by a subscriber coming up: look at the gate first.
                self.woken = self.place.as_ref().is_some_and(|place| place.member.take_turn());
                self.probe = !self.woken;
            }
            () = sleep => {
                self.waited += p.planned;
                if self.renewed_only(&mut p).await {
                    return Ok(Some(p));
                }
                // A timer in line: ask the gate first (it also renews the place); the head
                // asks every node at once, so a key left on the gate alone (a stale clean-up's,
                // a node back from its append-only file) does not hold it back until that key
                // expires while newcomers take the other nodes' quorum. Behind the head, asking
                // the other nodes would split the head's votes.
                self.probe = p.queue.is_some_and(|q| q.rank != 0);
                // No attempt starts after `wait` (but every call makes one).
                if self.give_up.is_some_and(|g| Instant::now() >= g) {
                    return Err(self.give_up_after(p.failure));
                }
            }
        }
        Ok(None)
    }

    /// The error to return, the last attempt refused with `failure`.
    fn give_up_after(&self, failure: Failure) -> Error {
        self.redlock
            .failed(failure, self.resources, self.attempts, self.ttl)
    }
}

/// How many retry pauses `elapsed` is (a zero pause counts each wait as one).
/// The error of an acquire that `close()` ended.
pub(crate) fn closed(resources: &[String]) -> Error {
    Error::Closed {
        resources: Names(resources.to_vec()),
    }
}

fn pauses(elapsed: Duration, pause: Duration) -> f64 {
    if pause.is_zero() {
        1.0
    } else {
        elapsed.as_secs_f64() / pause.as_secs_f64()
    }
}
/// Where a waiting acquire's line is: its gate, the line's key, the lock keys (a leaver that
/// was the head wakes the next one when one of them is free) and the key whose contention this
/// Redlock remembers.
pub(crate) struct WaitLine {
    pub(crate) gate: usize,
    pub(crate) line_key: String,
    pub(crate) keys: Vec<String>,
    pub(crate) hot: String,
}

/// A waiting acquire's place in a line: its member, and whether the gate may have it in line
/// (then leaving, by giving up or being dropped, removes it there in the background).
struct Place {
    inner: Arc<Inner>,
    line: WaitLine,
    member: Member,
    joined: bool,
    /// `joined` before the current attempt.
    joined_before: bool,
    /// The acquire got its lock.
    granted: bool,
    /// The last attempt's gate answer.
    gated: Arc<GateAnswer>,
    /// Offers for a hand-over inside the process, and a grant handed over.
    handoff: Arc<Handoff<Grant>>,
    /// Renewals of the place since its place was last asked (see `renewed_only`).
    renewals: u32,
}

impl Place {
    fn new(inner: &Arc<Inner>, line: WaitLine, seq: u64) -> Place {
        Place {
            member: inner.line.member(Some(line.gate), seq),
            inner: inner.clone(),
            line,
            joined: false,
            joined_before: false,
            granted: false,
            gated: Default::default(),
            handoff: Default::default(),
            renewals: 0,
        }
    }

    /// The next attempt's turn; forgets a wake-up that came during the previous attempt.
    fn turn(&mut self, probe: bool, joining: bool, woken: bool) -> Turn {
        self.member.clear();
        let in_line = self.joined;
        self.joined_before = in_line;
        // From now on the gate may put us in line: a call dropped mid-attempt leaves it.
        self.joined |= joining;
        // Each attempt's own: a late answer to an earlier one says nothing of this one.
        self.gated = Arc::default();
        Turn {
            member: joining.then(|| self.member.name().clone()),
            probe,
            gated: self.gated.clone(),
            handoff: Some(self.handoff.clone()),
            in_line,
            woken: woken && in_line,
        }
    }

    /// An attempt failed (`contended`: a holder or a line was in the way; `joining`: it
    /// carried the member; `in_process`: it sent nothing, queued behind a waiter of this
    /// `Redlock`).
    fn failed(&mut self, contended: bool, joining: bool, in_process: bool) {
        // Any failed attempt with the member may have left us in line (refused, or put back at
        // the front); one queued in the process did not.
        match in_process {
            true => self.joined = self.joined_before,
            false => self.joined |= joining,
        }
        if contended {
            self.inner.line.mark_hot(&self.line.hot);
            if let Some(wake) = &self.inner.wake {
                wake.start();
            }
        }
    }

    /// How long to wait for a wake-up before probing the gate, at place `q` of the line.
    fn timer(&self, q: Queue, pause: Duration) -> Duration {
        let woken = self.inner.wake.is_some() && self.inner.line.is_up(self.line.gate);
        let expiry = u64::try_from(q.pttl)
            .ok()
            .map(|ms| Duration::from_millis(ms.saturating_add(1)));
        match (woken, q.rank) {
            (true, 0) => expiry.map_or(RENEW, |e| e.min(RENEW)),
            // Two or more ahead (exactly, or "at least" as a newcomer's join tells it).
            (true, r) if r >= 2 => RENEW_FAR,
            (true, _) => RENEW,
            // Polling: the next in line at the retry pace, the others as far behind as they are.
            (false, rank) => {
                let behind = u32::try_from(rank.clamp(1, 8)).unwrap_or(8);
                pause.saturating_mul(behind).min(RENEW)
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Leaving without the lock: a waiter of this Redlock queued in the process behind
        // this one, with nobody of this Redlock left in line to bring it the lock, asks the
        // gate now rather than at its next timer.
        if !self.granted {
            self.handoff.withdraw();
            if let Some(member) = self.inner.handovers.stranded(&self.line.hot) {
                self.inner.line.nudge(&member);
            }
        }
        if self.joined && self.granted {
            self.inner.forget_place(
                self.line.gate,
                std::mem::take(&mut self.line.keys),
                std::mem::take(&mut self.line.line_key),
                self.member.name().to_string(),
                self.gated.clone(),
            );
        } else if self.joined {
            self.inner.leave_line(
                self.line.gate,
                std::mem::take(&mut self.line.keys),
                std::mem::take(&mut self.line.line_key),
                self.member.name().to_string(),
            );
        }
    }
}
