//! Leader election over one resource: campaign (acquire, retrying), hold leadership with a
//! keep-alive, step down the moment the lock is lost, campaign again; resign on request or drop.
//!
//! A [`Role::Leader`] carries its validity (`valid_until`), updated with every extension, so an
//! observer that runs late still never acts as leader past the lock's deadline:
//! use [`Role::is_leader`], which checks the clock.
//!
//! Owns: the campaign task and the role watch. Must not: extend or release by itself (the
//! keep-alive guard does).

use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, LostReason, Result};
use crate::keepalive::KeepAliveOptions;
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

/// A participant in a leader election. Campaigns in a background task from creation until
/// [`resign`](Election::resign) or drop.
///
/// At most one participant at a time holds the lock within its validity, so at most one sees
/// `role().is_leader() == true` at any instant (under Redlock's assumptions; a participant that
/// pauses longer than the TTL between checking and acting is the case only fencing covers).
#[derive(Debug)]
pub struct Election {
    role: watch::Receiver<Role>,
    failure: watch::Receiver<Option<Error>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Redlock {
    /// Starts campaigning for `resource` with locks of `ttl`, kept alive with the default
    /// [`KeepAliveOptions`]. Between failed campaign attempts it pauses per the [`crate::Retry`]
    /// policy's `delay` + `jitter`. Must be called inside a tokio runtime.
    pub fn elect(&self, resource: impl Into<String>, ttl: Duration) -> Result<Election> {
        self.elect_with(resource, ttl, KeepAliveOptions::default())
    }

    /// [`elect`](Self::elect) with keep-alive options (for example `max_hold`, to hand
    /// leadership over periodically).
    pub fn elect_with(
        &self,
        resource: impl Into<String>,
        ttl: Duration,
        keep_alive: KeepAliveOptions,
    ) -> Result<Election> {
        let resource = resource.into();
        // Validate everything now, not in the background task.
        if resource.is_empty() {
            return Err(crate::error::InvalidInput::EmptyResource.into());
        }
        crate::quorum::ttl_millis(ttl)?;
        crate::quorum::validity(ttl, self.inner.drift_factor)?;
        keep_alive.validate(self.inner.drift_factor)?;
        let (role_tx, role_rx) = watch::channel(Role::Follower);
        let (failure_tx, failure_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(campaign(
            self.clone(),
            resource,
            ttl,
            keep_alive,
            role_tx,
            failure_tx,
            stop_rx,
        ));
        Ok(Election {
            role: role_rx,
            failure: failure_rx,
            stop: Some(stop_tx),
            task: Some(task),
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

/// How long one round of a campaign waits in line before it looks at its own state again
/// (a failure to reach the nodes is reported after at most this long).
const CAMPAIGN_WAIT: Duration = Duration::from_secs(5);

async fn campaign(
    redlock: Redlock,
    resource: String,
    ttl: Duration,
    keep_alive: KeepAliveOptions,
    role: watch::Sender<Role>,
    failure: watch::Sender<Option<Error>>,
    mut stop: oneshot::Receiver<()>,
) {
    let retry = redlock.inner.retry;
    let span = tracing::debug_span!("fredlock.election", resource = %resource);
    loop {
        // Campaign: wait in the resource's line (a resign or a lost term hands over to the
        // next candidate at once), in rounds of CAMPAIGN_WAIT so that failures are reported.
        let lock = loop {
            let attempt = tokio::select! {
                biased;
                _ = &mut stop => return,
                r = redlock.acquire_with(resource.as_str(), ttl, CAMPAIGN_WAIT) => r,
            };
            match attempt {
                Ok(lock) => {
                    if failure.send_if_modified(|f| f.take().is_some()) {
                        tracing::info!(parent: &span, "campaign reaches a quorum of nodes again");
                    }
                    break lock;
                }
                Err(Error::Contended { .. }) => {
                    if failure.send_if_modified(|f| f.take().is_some()) {
                        tracing::info!(parent: &span, "campaign reaches a quorum of nodes again");
                    }
                    continue;
                }
                Err(e) => {
                    if failure.borrow().is_none() {
                        tracing::warn!(parent: &span, error = %e, "fredlock: election campaign failing (not contention); retrying");
                    } else {
                        tracing::debug!(parent: &span, error = %e, "campaign attempt failed");
                    }
                    failure.send_replace(Some(e));
                }
            }
            let pause = retry.delay + crate::redlock::random_up_to(retry.jitter);
            tokio::select! {
                biased;
                _ = &mut stop => return,
                () = tokio::time::sleep(pause) => {}
            }
        };
        let since = lock.acquired_at();
        let guard = match lock.keep_alive_with(keep_alive.clone()) {
            Ok(g) => g,
            // Validated in elect_with; the lock is released as it drops.
            Err(_) => return,
        };
        let handle = guard.handle();
        let mut changes = handle.changes();
        let token = handle.token().to_string();
        // The fingerprint, never the token: logs are read by many.
        tracing::info!(parent: &span, fingerprint = %handle.fingerprint(), "became leader");
        role.send_replace(Role::Leader(Term {
            since,
            token: token.clone(),
            valid_until: crate::keepalive::fire_at(handle.deadline()),
        }));
        // Hold: follow extensions, step down the moment the lock is lost.
        let reason = loop {
            tokio::select! {
                biased;
                _ = &mut stop => {
                    role.send_replace(Role::Follower);
                    if let Err(e) = guard.release().await {
                        tracing::debug!(parent: &span, error = %e, "release on resign");
                    }
                    tracing::info!(parent: &span, "resigned");
                    return;
                }
                reason = handle.lost() => break reason,
                Ok(()) = changes.changed() => {
                    let deadline = changes.borrow_and_update().deadline;
                    role.send_modify(|r| {
                        if let Role::Leader(t) = r {
                            t.valid_until = crate::keepalive::fire_at(deadline);
                        }
                    });
                }
            }
        };
        role.send_replace(Role::Follower);
        tracing::warn!(parent: &span, %reason, "lost leadership; campaigning again");
        if reason == LostReason::Released {
            return;
        }
        drop(guard);
    }
}
