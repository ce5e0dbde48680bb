//! Leader election over one resource: campaign (acquire, retrying), hold leadership with a
//! keep-alive, step down the moment the lock is lost, campaign again; resign on request or drop.
//!
//! A [`Role::Leader`] carries its validity (`valid_until`), updated with every extension, so an
//! observer that runs late still never acts as leader past the lock's deadline:
//! use [`Role::is_leader`], which checks the clock.
//!
//! Owns: the campaign task and the role watch. Must not: extend or release by itself (the
//! keep-alive guard does).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, InvalidInput, Names, Result};
use crate::keepalive::KeepAliveOptions;
use crate::leader::{ElectionState, Record, Written};
use crate::lock::AcquireOptions;
use crate::observe::Observer;
use crate::redlock::Redlock;

/// One term of leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// When this participant became leader (the acquire's start: validity counts from here).
    pub since: Instant,
    /// The lock token of this term.
    pub token: String,
    /// When leadership must stop being exercised: the lock's current deadline less the lost
    /// signal's 2 ms margin. Moves forward with every extension.
    pub valid_until: Instant,
    /// The campaign value in force ([`ElectOptions::value`], or the last
    /// [`Election::proclaim`]).
    pub value: String,
    /// The term number (see [`fencing_token`](Term::fencing_token)).
    number: u64,
}

impl Term {
    /// The term's fencing token, always `Some` for an election: its term number, strictly
    /// larger than every earlier term's of this election (as long as a majority of nodes keeps
    /// its data), and the count of transitions so far. Send it with every write the leader
    /// makes; the resource refuses a write whose number is lower than the highest it has seen,
    /// which stops a deposed leader's late write. [`Redlock::leader_of`] names the same number.
    pub fn fencing_token(&self) -> Option<u64> {
        Some(self.number)
    }

    /// The term number (the same as [`fencing_token`](Term::fencing_token)).
    pub fn number(&self) -> u64 {
        self.number
    }
}

/// What this participant is, as seen through [`Election::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Not leader (campaigning, or stopped).
    Follower,
    /// Leader for this term.
    Leader(Term),
}

impl Role {
    /// Leader AND still within the term's validity right now.
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(t) if Instant::now() < t.valid_until)
    }

    /// The term, if leader (without checking the clock).
    pub fn term(&self) -> Option<&Term> {
        match self {
            Role::Leader(t) => Some(t),
            Role::Follower => None,
        }
    }
}

/// How a participant campaigns ([`Redlock::elect_with_options`]). `Default`: an empty value,
/// priority 0, the default [`KeepAliveOptions`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ElectOptions {
    value: String,
    priority: u32,
    keep_alive: KeepAliveOptions,
}

impl ElectOptions {
    /// The campaign value published while this participant leads (public: anyone can read it
    /// with [`Redlock::leader_of`] or an [`Observer`](crate::Observer)); for example the address
    /// followers forward requests to. Any text up to [`MAX_VALUE_LEN`] bytes.
    pub fn value(mut self, value: impl Into<String>) -> Self {
        self.value = value.into();
        self
    }

    /// The priority of this participant (default 0). A candidate of higher priority than the
    /// leader asks it to yield: the leader's term ends ([`Election::term_ended`] resolves; the
    /// reason is logged and counted) and the preferred candidate leads next, usually within a
    /// retry pause. Equal or lower priority never preempts. For rolling deploys: give the new
    /// version a higher priority, and leadership moves once, to it.
    pub fn priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }

    /// How the leader's lock is kept alive (for example `max_hold`, to hand leadership over
    /// periodically).
    pub fn keep_alive(mut self, keep_alive: KeepAliveOptions) -> Self {
        self.keep_alive = keep_alive;
        self
    }
}

/// The longest campaign value: 64 KiB.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// A participant in a leader election. Campaigns in a background task from creation until
/// [`resign`](Election::resign) or drop.
///
/// At most one participant at a time holds the lock within its validity, so at most one sees
/// `role().is_leader() == true` at any instant (under Redlock's assumptions; a participant that
/// pauses longer than the TTL between checking and acting is the case only fencing covers:
/// every term carries a fencing token, [`Term::fencing_token`]).
#[derive(Debug)]
pub struct Election {
    role: watch::Receiver<Role>,
    failure: watch::Receiver<Option<Error>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the campaign task and the `Election` handle share.
#[derive(Debug)]
struct Shared {
    redlock: Redlock,
    resource: String,
    ttl: Duration,
    priority: u32,
    /// The role every `watch()` receiver follows.
    role: watch::Sender<Role>,
    /// The campaign value to claim a term with (the last proclaimed one).
    value: Mutex<String>,
    /// The lock value of the current term and the version of its value (for proclaim);
    /// `None` when not leading.
    lock_value: Mutex<Option<(String, u64)>>,
    /// When the leader's lock was last acquired or extended.
    renewed: Mutex<Option<Instant>>,
}

impl Redlock {
    /// Starts campaigning for `resource` with locks of `ttl`, kept alive with the default
    /// [`KeepAliveOptions`]. Between failed campaign attempts it pauses per the [`crate::Retry`]
    /// policy's `delay` + `jitter`. Must be called inside a tokio runtime.
    pub fn elect(&self, resource: impl Into<String>, ttl: Duration) -> Result<Election> {
        self.elect_with_options(resource, ttl, ElectOptions::default())
    }

    /// [`elect`](Self::elect) with keep-alive options (for example `max_hold`, to hand
    /// leadership over periodically).
    pub fn elect_with(
        &self,
        resource: impl Into<String>,
        ttl: Duration,
        keep_alive: KeepAliveOptions,
    ) -> Result<Election> {
        self.elect_with_options(
            resource,
            ttl,
            ElectOptions::default().keep_alive(keep_alive),
        )
    }

    /// [`elect`](Self::elect) with [`ElectOptions`]: a campaign value, a priority, keep-alive
    /// options. Every term gets a fencing token (a term number), whether or not the `Redlock`
    /// hands out fencing tokens for locks. Must be called inside a tokio runtime.
    ///
    /// Errors: [`InvalidInput`](crate::InvalidInput) at once for an empty or reserved name, a
    /// TTL or keep-alive option out of range, a value longer than [`MAX_VALUE_LEN`].
    pub fn elect_with_options(
        &self,
        resource: impl Into<String>,
        ttl: Duration,
        options: ElectOptions,
    ) -> Result<Election> {
        let resource = resource.into();
        // Validate everything now, not in the background task.
        self.check_election_name(&resource)?;
        crate::quorum::ttl_millis(ttl)?;
        crate::quorum::validity(ttl, self.inner.drift_factor)?;
        options.keep_alive.validate(self.inner.drift_factor)?;
        if options.value.len() > MAX_VALUE_LEN {
            return Err(InvalidInput::ValueTooLong(options.value.len()).into());
        }
        let (role_tx, role_rx) = watch::channel(Role::Follower);
        let (failure_tx, failure_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            redlock: self.clone(),
            resource,
            ttl,
            priority: options.priority,
            role: role_tx,
            value: Mutex::new(options.value),
            lock_value: Mutex::new(None),
            renewed: Mutex::new(None),
        });
        let campaign = Campaign {
            shared: shared.clone(),
            keep_alive: options.keep_alive,
            failure: failure_tx,
        };
        let task = tokio::spawn(campaign.run(stop_rx));
        Ok(Election {
            role: role_rx,
            failure: failure_rx,
            stop: Some(stop_tx),
            task: Some(task),
            shared,
        })
    }
}

impl Election {
    /// A receiver of every role change (and every extension of a term's validity).
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Why the campaign is failing, when it fails for a reason other than contention (every
    /// node down, a wrong password, a duplicate server): the latest such error, or `None` once an
    /// attempt reaches a quorum again (won or contended). The campaign keeps trying either way;
    /// the first failure of a run is also logged at WARN.
    pub fn campaign_failure(&self) -> Option<Error> {
        self.failure.borrow().clone()
    }

    /// A receiver of every change of [`campaign_failure`](Self::campaign_failure), to alert on
    /// (for example, a health endpoint that reports the election as degraded).
    pub fn watch_failures(&self) -> watch::Receiver<Option<Error>> {
        self.failure.clone()
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    /// Leader right now, within validity.
    pub fn is_leader(&self) -> bool {
        self.role.borrow().is_leader()
    }

    /// The current term, only while it is valid (leader and before `valid_until`).
    pub fn current_term(&self) -> Option<Term> {
        match &*self.role.borrow() {
            Role::Leader(t) if Instant::now() < t.valid_until => Some(t.clone()),
            _ => None,
        }
    }

    /// Resolves when `term` is over: this participant stepped down, a different term began, or
    /// the term's validity (as extended) ran out. Run a job as
    /// `tokio::select! { () = election.term_ended(&term) => {}, () = job() => {} }` so that it
    /// stops the moment leadership goes.
    ///
    /// Cancellation: safe (it only observes).
    pub async fn term_ended(&self, term: &Term) {
        let mut rx = self.role.clone();
        loop {
            let valid_until = match &*rx.borrow_and_update() {
                Role::Leader(t) if t.token == term.token => t.valid_until,
                _ => return,
            };
            if Instant::now() >= valid_until {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(valid_until) => {}
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Waits until this participant is leader and returns the term.
    ///
    /// Cancellation: safe (it only observes).
    pub async fn leader(&self) -> Term {
        let mut rx = self.role.clone();
        loop {
            if let Role::Leader(t) = &*rx.borrow_and_update() {
                if Instant::now() < t.valid_until {
                    return t.clone();
                }
            }
            if rx.changed().await.is_err() {
                // The campaign ended; nothing will change any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The election's name.
    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    /// Changes the campaign value within the current term: [`Redlock::leader_of`] and every
    /// [`Observer`](crate::Observer) then show `value`, and so does this participant's
    /// [`Term::value`]. Written where this term's lock still stands, on a quorum of nodes;
    /// a later term's record is never overwritten.
    ///
    /// Errors: [`Error::NotLeader`] when this participant does not lead (or a quorum no longer
    /// holds its term); [`Error::Unavailable`] when too few nodes answered (the value may then
    /// show on some nodes: readers name the newest value of the term among a quorum);
    /// [`InvalidInput::ValueTooLong`](crate::InvalidInput::ValueTooLong).
    ///
    /// Cancellation: dropping the future may leave the new value written on some nodes.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<()> {
        let value = value.into();
        if value.len() > MAX_VALUE_LEN {
            return Err(InvalidInput::ValueTooLong(value.len()).into());
        }
        let not_leader = || Error::NotLeader {
            resource: self.shared.resource.clone(),
        };
        let term = self.current_term().ok_or_else(not_leader)?;
        let (lock_value, version) = {
            let mut current = locked(&self.shared.lock_value);
            let (lock_value, version) = current.as_mut().ok_or_else(not_leader)?;
            *version += 1;
            (lock_value.clone(), *version)
        };
        let s = &self.shared;
        let written = s
            .redlock
            .write_record(
                &s.resource,
                Record {
                    lock_value: &lock_value,
                    term: term.number,
                    value: &value,
                    priority: s.priority,
                    version,
                },
                s.ttl,
            )
            .await;
        match written {
            Written::Done => {
                *locked(&s.value) = value.clone();
                s.role.send_if_modified(|r| match r {
                    Role::Leader(t) if t.token == term.token => {
                        t.value = value;
                        true
                    }
                    _ => false,
                });
                Ok(())
            }
            Written::NotLeader => Err(not_leader()),
            Written::Unavailable(votes) => Err(Error::Unavailable {
                round: crate::error::Round::Acquire,
                resources: Names(vec![s.resource.clone()]),
                attempts: 1,
                nodes: votes.0.len(),
                quorum: s.redlock.quorum(),
                reachable: votes.granted() + votes.refused(),
                votes,
            }),
        }
    }

    /// When the leader's lock was last acquired or extended successfully (`None` when this
    /// participant does not lead).
    pub fn last_renewal(&self) -> Option<Instant> {
        if !self.role.borrow().is_leader() {
            return None;
        }
        *locked(&self.shared.renewed)
    }

    /// A health check for a leader that must not act on stale leadership: fails when this
    /// participant believes it leads but its lock was last renewed more than `bound` ago (its
    /// keep-alive cannot reach the nodes; it steps down by itself when the validity runs out).
    /// Passes for a follower. The error says which election, how long ago, and what to check.
    pub fn check_health(&self, bound: Duration) -> std::result::Result<(), String> {
        let Some(renewed) = self.last_renewal() else {
            return Ok(());
        };
        let age = renewed.elapsed();
        if age <= bound {
            return Ok(());
        }
        Err(format!(
            "election {}: leader, but its lock was last renewed {age:?} ago (bound {bound:?}): the nodes are unreachable or slow from here; check campaign_failure() and the nodes",
            self.shared.resource
        ))
    }

    /// Stops campaigning; if leader, releases the lock first (awaited) and becomes follower.
    ///
    /// Cancellation: dropping the future still stops the campaign and releases in the background.
    pub async fn resign(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // Dropping `stop` ends the campaign; a held lock is released in the background.
        self.stop.take();
    }
}

/// How long one round of a campaign waits in line before it looks at its own state again (a
/// failure to reach the nodes is reported after at most this long).
const CAMPAIGN_WAIT: Duration = Duration::from_secs(5);

/// Whether candidates wait in the resource's line (see `win`). Off until measured: candidates
/// make one attempt per retry pause, as before wait lines.
const WAIT_IN_LINE: bool = false;

/// Whether no yield request stands and the leader (if any) has `priority` too.
fn same_priority(st: &ElectionState, priority: u32) -> bool {
    st.yield_to.is_none() && (st.leader.is_none() || st.priority == priority)
}

/// Locks a mutex, a poisoned one included (its data is a plain value).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The campaign task: win a term, hold it, campaign again; until stopped.
struct Campaign {
    shared: Arc<Shared>,
    keep_alive: KeepAliveOptions,
    failure: watch::Sender<Option<Error>>,
}

/// How a term of this participant ended.
enum Ended {
    /// Resigned (or the election was dropped): the campaign stops.
    Resigned,
    /// Lost, or yielded to a preferred candidate: campaign again.
    Again,
}

impl Campaign {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let s = &self.shared;
        let span = tracing::debug_span!("fredlock.election", resource = %s.resource);
        // The campaign's own observer: the leader's priority, requests to yield.
        let observer = tokio::select! {
            biased;
            _ = &mut stop => return,
            o = s.redlock.observe(&s.resource) => o.ok(),
        };
        let mut state = observer.as_ref().map(Observer::state);
        loop {
            let Some((lock, number)) = self.win(&mut stop, state.as_ref(), &span).await else {
                return;
            };
            match self
                .hold(lock, number, &mut stop, state.as_mut(), &span)
                .await
            {
                Ended::Resigned => break,
                Ended::Again => {}
            }
        }
        if let Some(o) = observer {
            o.close().await;
        }
    }

    /// Campaigns until a term is won and claimed (the lock and the term number), or stopped.
    async fn win(
        &self,
        stop: &mut oneshot::Receiver<()>,
        state: Option<&watch::Receiver<ElectionState>>,
        span: &tracing::Span,
    ) -> Option<(crate::lock::Lock, u64)> {
        let s = &self.shared;
        let retry = s.redlock.inner.retry;
        loop {
            let held_back = state.is_some_and(|st| held_back(&st.borrow(), s.priority));
            // With no priorities in play, wait in the resource's line: a resign or a lost term
            // wakes the next candidate at once. Otherwise one attempt per retry pause, so that
            // a preferred candidate asks the leader to yield and lower ones hold back.
            let in_line = WAIT_IN_LINE
                && !held_back
                && state.is_none_or(|st| same_priority(&st.borrow(), s.priority));
            let wait = if in_line {
                CAMPAIGN_WAIT
            } else {
                Duration::ZERO
            };
            let mut options = AcquireOptions::new().wait(wait);
            options.fenced = true;
            let attempt = if held_back {
                Ok(None)
            } else {
                tokio::select! {
                    biased;
                    _ = &mut *stop => return None,
                    r = s.redlock.acquire_using(s.resource.as_str(), s.ttl, &options) => match r {
                        Ok(lock) => Ok(Some(lock)),
                        Err(Error::Contended { .. }) => Ok(None),
                        Err(e) => Err(e),
                    },
                }
            };
            match attempt {
                Ok(found) => {
                    if self.failure.send_if_modified(|f| f.take().is_some()) {
                        tracing::info!(parent: span, "campaign reaches a quorum of nodes again");
                    }
                    match found {
                        Some(lock) => match self.claim(&lock, span).await {
                            Ok(Some(number)) => return Some((lock, number)),
                            Ok(None) => {}
                            Err(e) => self.failing(e, span),
                        },
                        None if !held_back => self.maybe_preempt(state, retry).await,
                        None => {}
                    }
                }
                Err(e) => self.failing(e, span),
            }
            if in_line {
                continue;
            }
            let pause = retry.delay + crate::redlock::random_up_to(retry.jitter);
            tokio::select! {
                biased;
                _ = &mut *stop => return None,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// An attempt failed for another reason than contention: logged (at WARN the first time)
    /// and shown by `campaign_failure`.
    fn failing(&self, e: Error, span: &tracing::Span) {
        if self.failure.borrow().is_none() {
            tracing::warn!(parent: span, error = %e, "fredlock: election campaign failing (not contention); retrying");
        } else {
            tracing::debug!(parent: span, error = %e, "campaign attempt failed");
        }
        self.failure.send_replace(Some(e));
    }

    /// Writes the record of a term just won: its number, or `None` when a later term exists or
    /// the lock is gone, or the error when too few nodes took it (the lock is released as it
    /// drops, in every case but success).
    async fn claim(&self, lock: &crate::lock::Lock, span: &tracing::Span) -> Result<Option<u64>> {
        let s = &self.shared;
        let Some(number) = lock.fencing_token() else {
            return Ok(None);
        };
        let value = lock_value_of(&s.value);
        let written = s
            .redlock
            .write_record(
                &s.resource,
                Record {
                    lock_value: lock.value(),
                    term: number,
                    value: &value,
                    priority: s.priority,
                    version: 1,
                },
                s.ttl,
            )
            .await;
        tracing::debug!(parent: span, outcome = ?written, "recording the term");
        match written {
            Written::Done => Ok(Some(number)),
            Written::NotLeader => Ok(None),
            Written::Unavailable(votes) => Err(Error::Unavailable {
                round: crate::error::Round::Acquire,
                resources: Names(vec![s.resource.clone()]),
                attempts: 1,
                nodes: votes.0.len(),
                quorum: s.redlock.quorum(),
                reachable: votes.granted() + votes.refused(),
                votes,
            }),
        }
    }

    /// A candidate of higher priority than the leader asks it to yield (once per pending
    /// request: none is sent while an equal or stronger one stands).
    async fn maybe_preempt(
        &self,
        state: Option<&watch::Receiver<ElectionState>>,
        retry: crate::Retry,
    ) {
        let s = &self.shared;
        let Some(st) = state else { return };
        let (term, ask) = {
            let st = st.borrow();
            let pending = st
                .yield_to
                .is_some_and(|(_, p, until)| p >= s.priority && Instant::now() < until);
            match &st.leader {
                Some(l) if st.priority < s.priority && !pending => (l.term, true),
                _ => (0, false),
            }
        };
        if ask {
            let pause = retry.delay.saturating_add(retry.jitter);
            let standing = YIELD_STANDING
                .saturating_add(pause.saturating_mul(2))
                .min(Duration::from_secs(60));
            tracing::info!(resource = %s.resource, term, priority = s.priority, "asking the leader to yield to a candidate of higher priority");
            s.redlock
                .request_yield(&s.resource, term, s.priority, standing)
                .await;
        }
    }
}

impl Campaign {
    /// Leads the term `number` held by `lock` until it is lost, yielded or resigned.
    async fn hold(
        &self,
        lock: crate::lock::Lock,
        number: u64,
        stop: &mut oneshot::Receiver<()>,
        mut state: Option<&mut watch::Receiver<ElectionState>>,
        span: &tracing::Span,
    ) -> Ended {
        let s = &self.shared;
        let since = lock.acquired_at();
        let lock_value = lock.value().to_string();
        let vacant = state.as_ref().and_then(|st| st.borrow().vacant_since);
        let guard = match lock.keep_alive_with(self.keep_alive.clone()) {
            Ok(g) => g,
            // Validated in elect_with_options; the lock is released as it drops.
            Err(_) => return Ended::Resigned,
        };
        let handle = guard.handle();
        let mut changes = handle.changes();
        // The fingerprint, never the token: logs are read by many.
        tracing::info!(parent: span, fingerprint = %handle.fingerprint(), term = number, "became leader");
        *locked(&s.lock_value) = Some((lock_value, 1));
        *locked(&s.renewed) = Some(since);
        crate::metrics::leading(&s.resource, true);
        if let Some(v) = vacant {
            crate::metrics::handover(&s.resource, v.elapsed());
        }
        s.role.send_replace(Role::Leader(Term {
            since,
            token: handle.token().to_string(),
            valid_until: crate::keepalive::fire_at(handle.deadline()),
            value: lock_value_of(&s.value),
            number,
        }));
        // Hold: follow extensions, step down the moment the lock is lost or a preferred
        // candidate asks.
        let ended = loop {
            tokio::select! {
                biased;
                _ = &mut *stop => break "resigned",
                reason = handle.lost() => {
                    tracing::warn!(parent: span, %reason, "lost leadership; campaigning again");
                    break "lost";
                }
                Ok(()) = changes.changed() => {
                    let deadline = changes.borrow_and_update().deadline;
                    *locked(&s.renewed) = Some(Instant::now());
                    s.role.send_modify(|r| {
                        if let Role::Leader(t) = r {
                            t.valid_until = crate::keepalive::fire_at(deadline);
                        }
                    });
                }
                () = state_changed(state.as_deref_mut()) => {
                    let asked = state.as_ref().and_then(|st| st.borrow().yield_to);
                    if let Some((term, priority, until)) = asked {
                        if term == number && priority > s.priority && Instant::now() < until {
                            tracing::info!(parent: span, term, to_priority = priority, own_priority = s.priority, "yielding leadership to a candidate of higher priority");
                            break "yielded";
                        }
                    }
                }
            }
        };
        s.role.send_replace(Role::Follower);
        *locked(&s.lock_value) = None;
        crate::metrics::leading(&s.resource, false);
        crate::metrics::term_ended(&s.resource, ended);
        if ended != "lost" {
            if let Err(e) = guard.release().await {
                tracing::debug!(parent: span, error = %e, "release on {ended}");
            }
            s.redlock.notify_observers(&s.resource).await;
        }
        if ended == "resigned" {
            tracing::info!(parent: span, "resigned");
            return Ended::Resigned;
        }
        Ended::Again
    }
}

/// How long a request to yield stands (plus two retry pauses): lower candidates hold back
/// meanwhile, so that the preferred candidate takes the term.
const YIELD_STANDING: Duration = Duration::from_secs(1);

/// Whether a request to yield to a higher priority than `priority` stands: then this
/// participant does not attempt.
fn held_back(state: &ElectionState, priority: u32) -> bool {
    state
        .yield_to
        .is_some_and(|(_, p, until)| p > priority && Instant::now() < until)
}

fn lock_value_of(value: &Mutex<String>) -> String {
    locked(value).clone()
}

/// Resolves on the next change of the observer's state; never without an observer.
async fn state_changed(state: Option<&mut watch::Receiver<ElectionState>>) {
    if let Some(st) = state {
        if st.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}
