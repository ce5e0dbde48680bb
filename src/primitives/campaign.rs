//! The campaign of one election participant, run in a background task: campaign (acquire,
//! retrying), hold leadership with a keep-alive, step down the moment the lock is lost,
//! campaign again; until the [`Election`](crate::Election) handle resigns or is dropped. Also the
//! role it publishes ([`Role`], [`Term`]) and the state it shares with the handle.
//!
//! Owns: the campaign task, the role it publishes, the shared state. Must not: extend or release
//! by itself (the keep-alive guard does), or validate the caller's options (the handle's
//! constructors do, before the task starts).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::base::error::{Error, Names, Result};
use crate::hold::keepalive::KeepAliveOptions;
pub(crate) use crate::primitives::campaign_observers::locked;
use crate::primitives::campaign_observers::CampaignView;
use crate::primitives::leader::{tally, ElectionState, Record, Written};
use crate::rounds::options::AcquireOptions;
use crate::rounds::redlock::Redlock;

/// One term of leadership.
///
/// `Debug` shows the term number, the campaign value, the token's
/// [`fingerprint`](Term::fingerprint) and the validity left, never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Term {
    /// When this participant became leader (the acquire's start: validity counts from here).
    pub since: Instant,
    /// The lock token of this term: a secret (see [`token`](Term::token)).
    pub(crate) token: String,
    /// When leadership must stop being exercised: the lock's current deadline less the lost
    /// signal's 2 ms margin. Moves forward with every extension.
    pub valid_until: Instant,
    /// The campaign value in force ([`ElectOptions::value`](crate::ElectOptions::value), or the last
    /// [`Election::proclaim`](crate::Election::proclaim)).
    pub value: String,
    /// The term number (see [`fencing_token`](Term::fencing_token)).
    number: u64,
}

impl std::fmt::Debug for Term {
    // The token is a secret (whoever knows it can release the leader's lock): its fingerprint.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.number)
            .field("value", &self.value)
            .field("fingerprint", &self.fingerprint())
            .field(
                "remaining",
                &self.valid_until.saturating_duration_since(Instant::now()),
            )
            .finish_non_exhaustive()
    }
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

    /// The secret token of the term's lock (as [`Lock::token`](crate::Lock::token)): whoever
    /// knows it can release or extend the leader's lock, so keep it out of logs and messages
    /// (show [`fingerprint`](Self::fingerprint) instead). Fencing needs the term number, not
    /// this; it is for scripts of your own that check, on a node, that this term still holds
    /// the lock key (the key holds the token, then [`SEPARATOR`](crate::SEPARATOR) and the label).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The token's public fingerprint (see [`Lock::fingerprint`](crate::Lock::fingerprint)):
    /// what [`Redlock::inspect`] shows for the leader's lock, and what the
    /// leader logs when it takes office.
    pub fn fingerprint(&self) -> String {
        crate::base::owner::fingerprint(&self.token)
    }
}

/// What this participant is, as seen through [`Election::watch`](crate::Election::watch).
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

/// What the campaign task and the `Election` handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) redlock: Redlock,
    pub(crate) resource: String,
    pub(crate) ttl: Duration,
    pub(crate) priority: u32,
    /// The role every `watch()` receiver follows. Changed only through `change_role`.
    pub(crate) role: watch::Sender<Role>,
    /// Every `role_changes()` receiver still open: each is sent every value `role` takes.
    pub(crate) changes: Mutex<Vec<mpsc::UnboundedSender<Role>>>,
    /// The campaign value to claim a term with (the last proclaimed one).
    pub(crate) value: Mutex<String>,
    /// The lock value of the current term and the version of its value (for proclaim);
    /// `None` when not leading.
    pub(crate) lock_value: Mutex<Option<(String, u64)>>,
    /// When the leader's lock was last acquired or extended.
    pub(crate) renewed: Mutex<Option<Instant>>,
    /// The term `Election::step_down` asks to end (0: none yet).
    pub(crate) step_down: watch::Sender<u64>,
    /// The last term of this participant that is over (released, or lost).
    pub(crate) ended: watch::Sender<u64>,
}

impl Shared {
    /// Changes the role with `change` (which says whether it changed anything), notifies the
    /// watch, and sends the new role to every `role_changes()` receiver. The `changes` lock is
    /// held throughout, so that every receiver gets the values in the order the watch took them.
    pub(crate) fn change_role(&self, change: impl FnOnce(&mut Role) -> bool) {
        let mut changes = locked(&self.changes);
        if self.role.send_if_modified(change) && !changes.is_empty() {
            let role = self.role.borrow().clone();
            changes.retain(|tx| tx.send(role.clone()).is_ok());
        }
    }

    /// A receiver of the current role, then of every change (see `Election::role_changes`).
    pub(crate) fn role_changes(&self) -> mpsc::UnboundedReceiver<Role> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut changes = locked(&self.changes);
        // Under the lock: no change can come between the current role and the next change.
        let _ = tx.send(self.role.borrow().clone());
        changes.push(tx);
        rx
    }
}

/// Held by a campaign's task: however the task ends (a resign, the election dropped, a panic,
/// its runtime shutting down), the participant is a follower from then on (its term's lock,
/// dropped with the task, is released in the background, and is never still said to be held)
/// and every `Election::step_down` waiting is answered.
struct Over<'a>(&'a Shared);

impl Drop for Over<'_> {
    fn drop(&mut self) {
        self.0.change_role(|r| {
            let changed = r.term().is_some();
            *r = Role::Follower;
            changed
        });
        self.0.ended.send_replace(u64::MAX);
    }
}

/// How long one acquire of a campaign waits in line at most (it is dropped earlier when
/// priorities or a request to yield come into play); then a new one joins at the back.
const IN_LINE_FOR: Duration = Duration::from_secs(3600);

/// Whether a campaign of `priority` waits in the line (no other priority, no request to
/// yield), as far as its observer knows (without one: always).
fn in_line(state: Option<&watch::Receiver<ElectionState>>, priority: u32) -> bool {
    state.is_none_or(|st| st.borrow().same_priority(priority))
}

/// Resolves when a campaign of `priority` waiting in line should no longer (another priority
/// or a request to yield came into play); never without an observer.
async fn in_line_changes(state: Option<&watch::Receiver<ElectionState>>, priority: u32) {
    let Some(mut st) = state.cloned() else {
        return std::future::pending().await;
    };
    loop {
        if st.changed().await.is_err() {
            return std::future::pending().await;
        }
        let st = st.borrow_and_update();
        if !st.same_priority(priority) || held_back(&st, priority) {
            return;
        }
    }
}

/// Records how the last attempt went: `Some` failure (logged at WARN the first time, shown by
/// `campaign_failure`), or `None` when a quorum answered (a failure recorded before is cleared).
fn reached(failure: &watch::Sender<Option<Error>>, e: Option<Error>, span: &tracing::Span) {
    match e {
        None | Some(Error::Contended { .. }) => {
            if failure.send_if_modified(|f| f.take().is_some()) {
                tracing::info!(parent: span, "campaign reaches a quorum of nodes again");
            }
        }
        Some(e) => {
            if failure.borrow().is_none() {
                tracing::warn!(parent: span, error = %e, "fredlock: election campaign failing (not contention); retrying");
            } else {
                tracing::debug!(parent: span, error = %e, "campaign attempt failed");
            }
            failure.send_replace(Some(e));
        }
    }
}

/// The campaign task: win a term, hold it, campaign again; until stopped.
pub(crate) struct Campaign {
    pub(crate) shared: Arc<Shared>,
    pub(crate) keep_alive: KeepAliveOptions,
    pub(crate) failure: Arc<watch::Sender<Option<Error>>>,
}

/// How a term of this participant ended.
enum Ended {
    /// Resigned (or the election was dropped): the campaign stops.
    Resigned,
    /// Lost, or yielded to a preferred candidate: campaign again.
    Again,
}

impl Campaign {
    pub(crate) async fn run(self, mut stop: oneshot::Receiver<()>) {
        let s = &self.shared;
        // Dropped last, however the campaign ends.
        let _over = Over(s);
        let span = tracing::debug_span!("fredlock.election", resource = %s.resource);
        // The campaign's observer (shared with this Redlock's other elections of the resource
        // and priority): the leader's priority, requests to yield.
        let observer = tokio::select! {
            biased;
            _ = &mut stop => return,
            o = s.redlock.campaign_observer(&s.resource, s.priority) => o.ok(),
        };
        let mut state = observer.as_ref().map(CampaignView::state);
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
        // Dropped: the observer lingers for the next election of this Redlock.
        drop(observer);
    }

    /// Campaigns until a term is won and claimed (the lock and the term number), or stopped.
    async fn win(
        &self,
        stop: &mut oneshot::Receiver<()>,
        state: Option<&watch::Receiver<ElectionState>>,
        span: &tracing::Span,
    ) -> Option<(crate::rounds::lock::Lock, u64)> {
        let s = &self.shared;
        let retry = s.redlock.inner.retry;
        loop {
            let held_back = state.is_some_and(|st| held_back(&st.borrow(), s.priority));
            // With no priorities in play, wait in the resource's line, for as long as that
            // holds (the place is kept: turns in arrival order): a resign or a lost term wakes
            // the next candidate at once. Otherwise one attempt per retry pause, so that a
            // preferred candidate asks the leader to yield and lower ones hold back.
            let in_line = !held_back && in_line(state, s.priority);
            let mut options = AcquireOptions::new().wait(match in_line {
                true => IN_LINE_FOR,
                false => Duration::ZERO,
            });
            options.fenced = true;
            // The term's counter is raised by the claim, in the script that writes the record:
            // one round and one script per node fewer before the term starts.
            options.raise_later = true;
            // Its release tells observers, in the same script (on the line's gate too).
            options.announce = true;
            if in_line {
                // Failures are told while it waits, not when the wait ends.
                let (failure, span) = (self.failure.clone(), span.clone());
                options.report = Some(Arc::new(move |e| reached(&failure, e, &span)));
            }
            let attempt = if held_back {
                Ok(None)
            } else {
                tokio::select! {
                    biased;
                    _ = &mut *stop => return None,
                    () = in_line_changes(state, s.priority), if in_line => continue,
                    r = s.redlock.acquire_using(s.resource.as_str(), s.ttl, &options) => match r {
                        Ok(lock) => Ok(Some(lock)),
                        Err(Error::Contended { .. }) => Ok(None),
                        // Closed: nothing can be won any more.
                        Err(Error::Closed { .. }) => return None,
                        Err(e) => Err(e),
                    },
                }
            };
            reached(&self.failure, attempt.as_ref().err().cloned(), span);
            if let Ok(Some(lock)) = attempt {
                match self.claim(&lock, span).await {
                    Ok(Some(number)) => return Some((lock, number)),
                    Ok(None) => {}
                    Err(e) => reached(&self.failure, Some(e), span),
                }
            } else if let (Ok(None), false) = (&attempt, held_back) {
                self.maybe_preempt(state, retry).await;
            }
            if in_line {
                continue;
            }
            let pause = retry.delay + crate::rounds::redlock::random_up_to(retry.jitter);
            tokio::select! {
                biased;
                _ = &mut *stop => return None,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Writes the record of a term just won: its number, or `None` when a later term exists or
    /// the lock is gone, or the error when too few nodes took it (the lock is released as it
    /// drops, in every case but success).
    async fn claim(
        &self,
        lock: &crate::rounds::lock::Lock,
        span: &tracing::Span,
    ) -> Result<Option<u64>> {
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
                    // The lock's validity left: every node's key lives at least as long (its
                    // TTL counts from after the attempt began; the validity also subtracts
                    // the drift allowance).
                    pttl_ms: Some(
                        lock.deadline()
                            .saturating_duration_since(tokio::time::Instant::now())
                            .as_millis()
                            .clamp(1, u128::from(u64::MAX)) as u64,
                    ),
                },
                s.ttl,
            )
            .await;
        tracing::debug!(parent: span, outcome = ?written, "recording the term");
        match written {
            Written::Done => Ok(Some(number)),
            Written::NotLeader => Ok(None),
            Written::Unavailable(votes) => Err(Error::Unavailable {
                round: crate::base::error::Round::Acquire,
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
            // The campaign's observer hears no change of term among candidates of one priority
            // (see `Redlock::observe_as`): ask for the term a read finds, if any still leads.
            let term = match s.redlock.election_views(&s.resource).await {
                Ok(views) => {
                    let now = tally(&views, s.redlock.inner.quorum);
                    match now.leader {
                        Some(l) if now.priority < s.priority => l.term,
                        _ => return,
                    }
                }
                Err(_) => term,
            };
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
        lock: crate::rounds::lock::Lock,
        number: u64,
        stop: &mut oneshot::Receiver<()>,
        mut state: Option<&mut watch::Receiver<ElectionState>>,
        span: &tracing::Span,
    ) -> Ended {
        let s = &self.shared;
        let since = lock.acquired_at();
        let lock_value = lock.value().to_string();
        // Vacant, as far as this process knows, since the attempt that won began: the
        // campaign's observer hears no resign nor expiry of a leader of its own priority (see
        // `Redlock::observe_as`), and a candidate woken in line attempts at once.
        let vacant = Some(since);
        let guard = match lock.keep_alive_with(self.keep_alive.clone()) {
            Ok(g) => g,
            // Validated in elect_with_options; the lock is released as it drops.
            Err(_) => return Ended::Resigned,
        };
        let handle = guard.handle();
        let mut changes = handle.changes();
        // Before the role says leader: a step-down asked for this term is not missed.
        let mut step_down = s.step_down.subscribe();
        // The fingerprint, never the token: logs are read by many.
        tracing::info!(parent: span, fingerprint = %handle.fingerprint(), term = number, "became leader");
        *locked(&s.lock_value) = Some((lock_value, 1));
        *locked(&s.renewed) = Some(since);
        crate::base::metrics::leading(&s.resource, true);
        if let Some(v) = vacant {
            crate::base::metrics::handover(&s.resource, v.elapsed());
        }
        let term = Term {
            since,
            token: handle.token().to_string(),
            valid_until: crate::hold::keepalive::fire_at(handle.deadline()),
            value: lock_value_of(&s.value),
            number,
        };
        s.change_role(|r| {
            *r = Role::Leader(term);
            true
        });
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
                    s.change_role(|r| match r {
                        Role::Leader(t) => {
                            t.valid_until = crate::hold::keepalive::fire_at(deadline);
                            true
                        }
                        Role::Follower => false,
                    });
                }
                Ok(()) = step_down.changed() => {
                    if *step_down.borrow_and_update() == number {
                        tracing::info!(parent: span, term = number, "stepping down; campaigning again");
                        break "stepped_down";
                    }
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
        self.end_term(guard, number, ended, span).await
    }

    /// After the term `number` ended for `reason` (see `hold`): follower again, the lock
    /// released (unless lost) and observers told; a candidate that stepped down goes back into
    /// the line.
    async fn end_term(
        &self,
        guard: crate::hold::keepalive::KeepAlive,
        number: u64,
        reason: &'static str,
        span: &tracing::Span,
    ) -> Ended {
        let s = &self.shared;
        s.change_role(|r| {
            *r = Role::Follower;
            true
        });
        *locked(&s.lock_value) = None;
        crate::base::metrics::leading(&s.resource, false);
        crate::base::metrics::term_ended(&s.resource, reason);
        if reason != "lost" {
            if let Err(e) = guard.release().await {
                tracing::debug!(parent: span, error = %e, "release on {reason}");
            }
            s.redlock.notify_observers(&s.resource).await;
        }
        if reason == "stepped_down" {
            // Back into the line at once: the next attempt asks the gate first (refused while
            // the woken head is in line), so it never takes the other nodes from the head.
            let key = s.redlock.key(&s.resource);
            s.redlock.inner.line.mark_hot(&key);
        }
        s.ended.send_replace(number);
        if reason == "resigned" {
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
pub(crate) fn held_back(state: &ElectionState, priority: u32) -> bool {
    state
        .yield_to
        .is_some_and(|(_, p, until)| p > priority && Instant::now() < until)
}

pub(crate) fn lock_value_of(value: &Mutex<String>) -> String {
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
