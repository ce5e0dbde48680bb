//! Leader election over one resource: the [`Election`] handle and its options. The handle
//! starts a campaign in a background task (`campaign`: acquire, retrying; hold leadership with
//! a keep-alive; step down the moment the lock is lost; campaign again) and stops it on
//! resign or drop.
//!
//! A [`Role::Leader`] carries its validity (`valid_until`), updated with every extension, so an
//! observer that runs late still never acts as leader past the lock's deadline:
//! use [`Role::is_leader`], which checks the clock.
//!
//! Owns: [`Election`], [`ElectOptions`], the checks of the caller's options, the role watch and
//! the lossless log of role changes as callers read them, proclaim. Must not: extend or release by itself (the keep-alive guard
//! does), or run the campaign (`campaign` does).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::base::error::{Error, InvalidInput, Names, Result};
use crate::hold::keepalive::KeepAliveOptions;
use crate::primitives::campaign::{locked, Campaign, Role, Shared, Term};
use crate::primitives::leader::{Record, Written};
use crate::rounds::redlock::Redlock;

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
///
/// The campaign follows the leader's priority and requests to yield through an observer (one
/// subscriber connection per node) that the `Election`s of one [`Redlock`] on the same
/// resource and priority share; it stays open 10 s after the last of them ends, so that a new
/// `Election` soon after a [`resign`](Election::resign) opens no connection and reads nothing
/// to start. [`Redlock::close`] closes it.
///
/// `Debug` shows the resource, the priority and the current [`Role`] (whose [`Term`] shows the
/// token's fingerprint, never the token).
pub struct Election {
    role: watch::Receiver<Role>,
    failure: watch::Receiver<Option<Error>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("resource", &self.shared.resource)
            .field("priority", &self.shared.priority)
            .field("role", &*self.role.borrow())
            .finish_non_exhaustive()
    }
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
    /// Errors: [`InvalidInput`](crate::InvalidInput) at once for an empty, reserved or too long name, a
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
        crate::rounds::quorum::ttl_millis(ttl)?;
        crate::rounds::quorum::validity(ttl, self.inner.drift_factor)?;
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
            changes: Mutex::default(),
            value: Mutex::new(options.value),
            lock_value: Mutex::new(None),
            renewed: Mutex::new(None),
            step_down: watch::channel(0).0,
            ended: watch::channel(0).0,
        });
        let campaign = Campaign {
            shared: shared.clone(),
            keep_alive: options.keep_alive,
            failure: Arc::new(failure_tx),
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

    /// A receiver of every value the role takes from now on, in order and none skipped: the
    /// current role first, then each term won ([`Role::Leader`]), each extension of its
    /// validity and each proclaim (the same term, updated), each step down
    /// ([`Role::Follower`]). [`watch`](Self::watch) keeps only the latest value, so a term won
    /// and lost between two looks never shows there; this one is for a log or an audit of
    /// every term (the election torture's recorder reads it).
    ///
    /// Ends (`recv` gives `None`) once the election is resigned or dropped and its campaign
    /// has stopped. Cost: an unbounded channel, into which each change is cloned (while
    /// leading, one per extension: a few per TTL); read it, or drop it.
    pub fn role_changes(&self) -> mpsc::UnboundedReceiver<Role> {
        self.shared.role_changes()
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
                    term: term.number(),
                    value: &value,
                    priority: s.priority,
                    version,
                    pttl_ms: None,
                },
                s.ttl,
            )
            .await;
        match written {
            Written::Done => {
                *locked(&s.value) = value.clone();
                s.change_role(|r| match r {
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

    /// Ends the current term, if this participant leads, and stays a candidate: the term's lock
    /// is released and observers are told, as for [`resign`](Self::resign), and the campaign
    /// joins the back of the election's line at once, so the candidate first in line leads
    /// next (with nobody else waiting, this one leads again, in a new term). For leaders that
    /// hand over after each job or on a schedule, without a new [`Election`] and its
    /// connections. Returns `false` at once when not leading; otherwise once the term is over
    /// (released, or lost meanwhile), or the campaign's task ended (its runtime shut down):
    /// then this participant no longer leads either.
    ///
    /// Cancellation: dropping the future does not take the request back: the term ends anyway.
    pub async fn step_down(&self) -> bool {
        let Some(number) = self.current_term().map(|t| t.number()) else {
            return false;
        };
        let mut ended = self.shared.ended.subscribe();
        self.shared.step_down.send_replace(number);
        let _ = ended.wait_for(|&n| n >= number).await;
        true
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
