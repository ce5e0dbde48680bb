//! A held lock: its resources, token and deadline; extend and release; what dropping it does.
//! Also the acquire calls of [`Redlock`] that hand out a [`Lock`], each one the retry loop of
//! `acquire_loop` over the single attempts of the rounds layer below.
//!
//! Owns: [`Lock`], the acquire calls, the drop behaviour.
//! Must not: send commands itself (the rounds in `redlock` do), retry (`acquire_loop` does), or
//! know about keep-alive.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::base::error::{Error, Result, Votes};
use crate::nodes::node::Held;
use crate::rounds::acquire_loop::WaitLine;
use crate::rounds::attempt::{Grant, Turn};
use crate::rounds::handover_rounds::Tenure;
use crate::rounds::holds::{Claim, Shape};
use crate::rounds::options::AcquireOptions;
use crate::rounds::quorum::{self, Outcome};
use crate::rounds::redlock::{spawn_release, Redlock, Resources, Retry};

/// A lock held on a quorum of nodes until [`deadline`](Lock::deadline).
///
/// Dropping a `Lock` without [`release`](Lock::release) releases it in a background task (and
/// says so in a `tracing` debug event); if no tokio runtime is running, the keys expire with their
/// TTL. Prefer `release().await`, which also tells you whether you still held it.
///
/// `Debug` shows the resources, the label, the token's [`fingerprint`](Lock::fingerprint) and
/// the validity left, never the token.
#[must_use = "dropping a Lock releases it at once"]
pub struct Lock {
    redlock: Redlock,
    /// Keys, token and resource names (shared with every per-node command of this lock).
    held: Arc<Held>,
    ttl: Duration,
    acquired_at: Instant,
    deadline: Instant,
    /// When a round last set the keys: `acquired_at`, or earlier for a lock handed over as it
    /// is (the start of the tenure its hand-overs count from).
    keys_set_at: Instant,
    released: bool,
    /// With fencing: one token per resource, in `resources` order.
    fencing: Option<Vec<u64>>,
    /// [`AcquireOptions::hold_at_least`]: a release before `acquired_at + this` lets the keys
    /// expire then instead of deleting them.
    hold_at_least: Option<Duration>,
    /// This lock's place among the Redlock's held locks, and whether `close()` took it.
    id: u64,
    claim: Arc<Claim>,
}

/// What [`Lock::release`] found on each node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseReport {
    /// Per node, in configuration order: `Granted` = our keys deleted there; `Refused` = our
    /// token was not there (expired or taken over); `Failed` = error or timeout (the keys expire
    /// with their TTL); `Pending` = not answered when the outcome was known (finished in the
    /// background). A lock handed to a waiter of the same `Redlock`
    /// ([`Builder::handover_window`](crate::Builder::handover_window)) is `Granted` where the
    /// waiter now holds the keys instead of us: everywhere when it was handed over as it is
    /// (nothing was sent).
    pub votes: Votes,
    /// Time the release round took.
    pub elapsed: Duration,
    /// What the release did with the keys. `None`: they were deleted (where `votes` says
    /// `Granted`). `Some(left)`: the release came before the end of the
    /// [`AcquireOptions::hold_at_least`] minimum, so nothing was deleted: the keys were left to
    /// expire `left` after the release was sent (the rest of the minimum; where `votes` says
    /// `Granted`, their TTL was lowered to it), and other acquires are refused until then.
    pub left_to_expire: Option<Duration>,
}

impl std::fmt::Debug for Lock {
    // The token is a secret (whoever knows it can release the lock): its fingerprint only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.held.resources)
            .field("label", &self.label())
            .field("fingerprint", &self.fingerprint())
            .field("fencing_tokens", &self.fencing)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// The lock a grant of the rounds layer stands for.
    pub(crate) fn from_grant(redlock: Redlock, grant: Grant, ttl: Duration) -> Lock {
        let shape = Shape {
            ttl,
            minimum_until: None,
        };
        let (id, claim) = redlock.inner.holds.register(grant.held.clone(), shape);
        Lock {
            id,
            claim,
            redlock,
            held: grant.held,
            ttl,
            acquired_at: grant.t0,
            deadline: grant.deadline,
            keys_set_at: grant.handed.unwrap_or(grant.t0),
            released: false,
            fencing: grant.fencing,
            hold_at_least: None,
        }
    }

    /// The minimum hold of [`AcquireOptions::hold_at_least`], if any.
    pub fn hold_at_least(&self) -> Option<Duration> {
        self.hold_at_least
    }

    pub(crate) fn set_hold_at_least(&mut self, at_least: Option<Duration>) {
        self.hold_at_least = at_least.filter(|d| !d.is_zero());
        let until = self
            .hold_at_least
            .and_then(|d| self.acquired_at.checked_add(d));
        self.claim.reshape(|s| s.minimum_until = until);
    }

    /// Runs `f` if [`Redlock::close`] takes this lock (at once if it already did).
    pub(crate) fn on_close(&self, f: Box<dyn FnOnce() + Send>) {
        self.claim.on_close(f);
    }

    fn closed_error(&self) -> Error {
        Error::Closed {
            resources: self.held.names(),
        }
    }

    /// The minimum hold left, rounded up to whole milliseconds, or `None` when it is over or
    /// unset.
    pub(crate) fn hold_left(&self) -> Option<Duration> {
        let left = self
            .hold_at_least?
            .checked_sub(self.acquired_at.elapsed())?;
        let ms = u64::try_from(left.as_nanos().div_ceil(1_000_000)).ok()?;
        Some(Duration::from_millis(ms)).filter(|d| !d.is_zero())
    }

    /// Milliseconds of the minimum hold left (at least 1), or `None` when it is over or unset.
    fn hold_left_ms(&self) -> Option<u64> {
        self.hold_left()
            .map(|left| left_to_expire_ms(left, self.ttl))
    }

    /// Marks the lock as no longer this handle's to release (a lease took it over).
    pub(crate) fn disarm(mut self) -> (Arc<Held>, Option<Vec<u64>>) {
        self.released = true;
        // `close()` must not release what the lease's holder now keeps.
        self.claim.release();
        // The lease's holder may release it at any time, on connections of its own.
        self.held.repairs.close();
        (self.held.clone(), self.fencing.take())
    }

    /// The fencing token of this lock (of its first resource, for a multi-resource lock), when
    /// the `Redlock` hands them out ([`fencing_tokens`](crate::Builder::fencing_tokens)).
    /// Strictly larger than the token of every earlier holder of the resource, as long as a
    /// majority of nodes keeps its data. Give it to the protected resource with every write; the
    /// resource rejects a write whose token is lower than the highest it has seen, which stops
    /// a holder that paused past its deadline.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing.as_ref().and_then(|t| t.first().copied())
    }

    /// Every resource's fencing token, in [`resources`](Self::resources) order.
    pub fn fencing_tokens(&self) -> Option<&[u64]> {
        self.fencing.as_deref()
    }

    /// The resources held (sorted, without duplicates), without the key prefix.
    pub fn resources(&self) -> &[String] {
        &self.held.resources
    }

    /// The secret owner token: 128 random bits as 32 hex digits, fresh for each acquisition
    /// from the nodes (or the caller's, given with [`AcquireOptions::token`]); a lock handed
    /// over as it is by a holder of the same `Redlock` keeps that holder's (see
    /// [`Builder::handover_window`](crate::Builder::handover_window)). Whoever knows it can
    /// release or extend the lock: keep it out of logs (show [`fingerprint`](Self::fingerprint)
    /// instead).
    pub fn token(&self) -> &str {
        self.held.token()
    }

    /// The owner label stored with the lock (public: [`Redlock::inspect`] shows it); `None`
    /// when it was stored without one.
    pub fn label(&self) -> Option<&str> {
        self.held.label()
    }

    /// A short public fingerprint of the token (12 hex digits of its SHA-1): what
    /// [`Redlock::inspect`] shows as [`Holder::fingerprint`](crate::Holder::fingerprint), so a
    /// holder can recognise itself there without the token ever being shown.
    pub fn fingerprint(&self) -> String {
        crate::base::owner::fingerprint(self.held.token())
    }

    /// What every node stores at the lock's keys, and what every release, extend and keep-alive
    /// compares: the token, then the separator [`SEPARATOR`](crate::SEPARATOR) (0x1f) and the
    /// label when there is one. Scripts of your own that check the lock compare this value.
    pub fn value(&self) -> &str {
        &self.held.value
    }

    /// How many times a key of this lock was re-set on a node that had lost it (down at the
    /// acquire, or restarted since): an extension that wins on a quorum re-sets the keys where
    /// they are missing, with `SET NX`, so the lock regains the node (see
    /// docs/algorithm.md, "Healing").
    pub fn repairs(&self) -> u64 {
        self.held.repairs.count()
    }

    /// The TTL of the last acquire or extend.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the attempt that acquired the lock started (its validity counts from here); for a
    /// lock handed over as it is by a holder of the same `Redlock`, when it was handed over
    /// (its validity is the holder's, see
    /// [`Builder::handover_window`](crate::Builder::handover_window)).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The instant (monotonic clock) after which the lock must be considered lost:
    /// `start + ttl - (ttl * drift_factor + 2 ms)`, where `start` is when the acquire or the last
    /// successful extend began (for a lock handed over as it is by a holder of the same
    /// `Redlock`, the holder's).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Validity left before [`deadline`](Self::deadline); zero once it has passed, and once
    /// [`Redlock::close`] released the lock.
    pub fn remaining(&self) -> Duration {
        if self.claim.closed() {
            return Duration::ZERO;
        }
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline is still ahead (`false` once [`Redlock::close`] released the lock).
    pub fn is_valid(&self) -> bool {
        !self.claim.closed() && Instant::now() < self.deadline
    }

    /// The [`Redlock`] this lock came from.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// Extends the lock to `ttl` from now: every node resets its keys' TTL if our token is still
    /// there. Succeeds with a quorum within the current validity; the new deadline counts from
    /// the start of this call. A lock that lost its quorum is never re-created; once the
    /// extension won, nodes where our keys were missing get them again with `SET NX` (never over
    /// another value; see [`repairs`](Self::repairs)), which does not count toward the quorum.
    ///
    /// Errors: [`Error::NotHeld`](crate::Error::NotHeld) when the deadline passed or a quorum no longer holds our token
    /// (the lock is lost for good); [`Error::Unavailable`](crate::Error::Unavailable) when too few nodes answered but the lock
    /// is still valid until its old deadline (you may retry); [`Error::InvalidInput`](crate::Error::InvalidInput) for a bad
    /// TTL; [`Error::Closed`] once [`Redlock::close`] released the lock (nothing is sent). On an error the deadline is unchanged, except that a `ttl` ending before the current
    /// deadline lowers it first (see below).
    ///
    /// A shorter `ttl` than the validity left shortens the lock: an extension whose outcome is
    /// unknown (an error, a timeout, a dropped future) may have shortened the keys on some nodes,
    /// so the deadline drops to `now + ttl - drift` before anything is sent, whatever happens next.
    ///
    /// With [`AcquireOptions::hold_at_least`], a `ttl` shorter than the rest of the minimum is
    /// raised to it: the keys never expire before the minimum ends (a release before it leaves
    /// them until then, as without an extension).
    ///
    /// Cancellation: dropping the future leaves the deadline as described above; extensions
    /// already sent may still land on some nodes.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.extend_inner(ttl, false).await
    }

    /// `patient`: per-node timeout up to half the validity left (keep-alive), instead of the
    /// configured node timeout.
    pub(crate) async fn extend_inner(&mut self, ttl: Duration, patient: bool) -> Result<()> {
        if self.claim.closed() {
            return Err(self.closed_error());
        }
        // A minimum hold not over yet is kept: a shorter `ttl` is raised to the rest of it (a
        // TTL the nodes cannot take is refused as it is).
        let ttl = match self.hold_left() {
            Some(left) if quorum::ttl_millis(ttl).is_ok() => ttl.max(left),
            _ => ttl,
        };
        let span = tracing::debug_span!("fredlock.extend", resources = ?self.held.resources, ttl_ms = ttl.as_millis() as u64);
        // The extension may land on some nodes whatever becomes of this call (an error, a
        // timeout, a dropped future). If `ttl` ends before the current deadline it may SHORTEN
        // the keys there, so the deadline drops to what the extension would set, before anything
        // is sent: never later than what the nodes may hold.
        self.before_extend(ttl, Instant::now());
        let deadline = tracing::Instrument::instrument(
            self.redlock
                .inner
                .extend(&self.held, ttl, self.deadline, patient),
            span.clone(),
        )
        .await?;
        self.extended(deadline, ttl);
        span.in_scope(|| {
            tracing::debug!(
                remaining_ms = self.remaining().as_millis() as u64,
                "extended"
            )
        });
        Ok(())
    }

    /// Releases the lock on every node (only keys that still hold our token are deleted) and
    /// reports per node. Returns once the outcome is known; nodes still busy finish in the
    /// background, a node whose release failed is retried in the background (10 ms, doubling
    /// to 250 ms) until the keys would have expired anyway or the `Redlock` is closed, and a
    /// node that stays down keeps its key until the TTL expires.
    ///
    /// `Ok` means a quorum still held our token when it was deleted, so no one else can have held
    /// the lock in the meantime (under Redlock's assumptions), even if the deadline had passed.
    /// Errors: [`Error::NotHeld`](crate::Error::NotHeld) (reason `TokenGone`) when a quorum no longer held our token:
    /// it expired or was taken over, and the work done under it may not have been exclusive.
    /// [`Error::Unavailable`](crate::Error::Unavailable) when too few nodes answered to know.
    /// [`Error::Closed`] when [`Redlock::close`] released the lock first (nothing is sent).
    ///
    /// With [`AcquireOptions::hold_at_least`], a release before `acquired_at + at_least` deletes
    /// nothing: every node lowers the keys' TTL so that they expire at that time (a key whose TTL
    /// ends sooner keeps it; nothing is ever lengthened), the votes say where our token was
    /// still present, and [`ReleaseReport::left_to_expire`] says how long the keys have left.
    /// The lock counts as released for this handle at once either way.
    ///
    /// Cancellation: dropping the future still releases (the release is finished in the
    /// background, as when a `Lock` is dropped).
    pub async fn release(mut self) -> Result<ReleaseReport> {
        if !self.claim.release() {
            self.released = true;
            return Err(self.closed_error());
        }
        let span = tracing::debug_span!("fredlock.release", resources = ?self.held.resources);
        let started = Instant::now();
        let inner = self.redlock.inner.clone();
        let held = self.held.clone();
        // From here on, a drop of this future must still release: keep `self` armed until the
        // round has been sent and answered.
        let left_ms = self.hold_left_ms();
        let votes = match left_ms {
            Some(ms) => {
                tracing::Instrument::instrument(inner.shorten_all(&held, ms), span.clone()).await
            }
            None => {
                let tenure = Tenure {
                    deadline: self.deadline,
                    keys_set_at: self.keys_set_at,
                };
                let release = inner.release_or_hand_over(&held, self.ttl, Some(tenure));
                tracing::Instrument::instrument(release, span.clone()).await
            }
        };
        self.released = true;
        crate::base::metrics::held(self.acquired_at.elapsed());
        let elapsed = started.elapsed();
        let report = ReleaseReport {
            votes: votes.clone(),
            elapsed,
            left_to_expire: left_ms.map(Duration::from_millis),
        };
        span.in_scope(
            || tracing::debug!(%votes, elapsed_us = elapsed.as_micros() as u64, "released"),
        );
        match quorum::outcome(&votes.0) {
            Outcome::Reached => Ok(report),
            _ => Err(inner.round_failure(&self.held, crate::base::error::Round::Release, votes)),
        }
    }
}

/// How long a release before the end of a minimum hold leaves the keys: `left`, rounded up to
/// whole milliseconds (the keys must not expire before the minimum), at least 1, never more
/// than `ttl` (the minimum is at most the acquire's TTL, and an extension never sets less than
/// the rest of it; the shortening script never lengthens a key anyway).
pub(crate) fn left_to_expire_ms(left: Duration, ttl: Duration) -> u64 {
    let ms = left.min(ttl).as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// The steps of an extension, for the keep-alive's batched rounds as for [`Lock::extend`].
impl Lock {
    /// The keys and token (shared with every per-node command of this lock).
    pub(crate) fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// Before an extension of `ttl` is sent at `now`: it may land on some nodes whatever becomes
    /// of it, and if it ends before the current deadline it may SHORTEN the keys there, so the
    /// deadline drops to what it would set (`now + ttl - drift`), never later than what the
    /// nodes may hold. Returns the deadline the extension must be decided before.
    pub(crate) fn before_extend(&mut self, ttl: Duration, now: Instant) -> Instant {
        if let Ok(v) = quorum::validity(ttl, self.redlock.inner.drift_factor) {
            if let Some(end) = now.checked_add(v) {
                self.deadline = self.deadline.min(end);
            }
        }
        self.deadline
    }

    /// After an extension of `ttl` succeeded with `deadline`.
    pub(crate) fn extended(&mut self, deadline: Instant, ttl: Duration) {
        self.deadline = deadline;
        self.ttl = ttl;
        self.claim.reshape(|s| s.ttl = ttl);
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.redlock.inner.holds.forget(self.id);
        // Released by `close()`: nothing more is this handle's to send.
        if !self.released && !self.claim.release() {
            return;
        }
        if let (false, Some(ms)) = (self.released, self.hold_left_ms()) {
            // Held for a minimum that is not over: the keys are shortened, not deleted (without
            // a runtime they keep their TTL, which only holds the lock longer).
            crate::base::metrics::held(self.acquired_at.elapsed());
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (inner, held) = (self.redlock.inner.clone(), self.held.clone());
                rt.spawn(async move { inner.shorten_all(&held, ms).await });
            }
            return;
        }
        if !self.released {
            crate::base::metrics::held(self.acquired_at.elapsed());
            tracing::debug!(resources = ?self.held.resources, "fredlock: Lock dropped without release(); releasing in the background");
            spawn_release(
                self.redlock.inner.clone(),
                self.held.clone(),
                self.ttl,
                "lock dropped",
            );
        }
    }
}

impl Redlock {
    /// Acquires `resources` (one name, or several all-or-nothing) for `ttl`, retrying per the
    /// configured [`Retry`] while it is held elsewhere or nodes fail.
    ///
    /// Each attempt sends one command per node at once and decides as soon as a quorum granted
    /// or can no longer grant; the lock's validity is counted from before the first command.
    /// A failed attempt releases on every node that granted or did not answer.
    ///
    /// Errors: [`Error::Contended`], [`Error::Unavailable`], [`Error::ValidityExpired`] after
    /// the last attempt; [`Error::InvalidInput`] at once.
    ///
    /// Cancellation: dropping the future at any point releases in the background whatever the
    /// current attempt may have set, on every node (the release is queued behind that node's
    /// `SET` on the same connection, so it lands after it). Nothing stays locked for a TTL.
    pub async fn acquire(&self, resources: impl Resources, ttl: Duration) -> Result<Lock> {
        self.acquire_inner(
            resources.into_names(),
            ttl,
            self.inner.retry,
            &AcquireOptions::new(),
        )
        .await
    }

    /// Like [`acquire`](Self::acquire), with per-call [`AcquireOptions`]: an owner label of its
    /// own, a custom token, a time bound on waiting instead of the retry count.
    ///
    /// ```no_run
    /// # async fn demo(redlock: fredlock::Redlock) -> Result<(), fredlock::Error> {
    /// use std::time::Duration;
    /// use fredlock::AcquireOptions;
    ///
    /// let options = AcquireOptions::new()
    ///     .label("nightly backup, run 1842")
    ///     .wait(Duration::from_secs(10));
    /// let lock = redlock.acquire_using("backup", Duration::from_secs(60), &options).await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: those of [`acquire`](Self::acquire) (of [`acquire_with`](Self::acquire_with)
    /// with a `wait`); [`InvalidInput::InvalidLabel`](crate::InvalidInput::InvalidLabel) and
    /// [`InvalidInput::InvalidToken`](crate::InvalidInput::InvalidToken) at once, before anything
    /// is sent.
    ///
    /// Cancellation: as for [`acquire`](Self::acquire).
    pub async fn acquire_using(
        &self,
        resources: impl Resources,
        ttl: Duration,
        options: &AcquireOptions,
    ) -> Result<Lock> {
        self.acquire_inner(resources.into_names(), ttl, self.inner.retry, options)
            .await
    }

    /// Like [`acquire`](Self::acquire), but retries until `wait` has passed instead of for a
    /// number of attempts: the policy's pauses (`delay` + `jitter`) apply, its `attempts` does
    /// not. No attempt starts after `wait`, and an attempt lasts at most one per-node timeout (a
    /// failed attempt's clean-up release is sent, not awaited), so the call returns within `wait`
    /// plus one per-node timeout. `Duration::ZERO` makes exactly one attempt; `Duration::MAX`
    /// waits without a limit (until granted, or until the future is dropped).
    ///
    /// Cancellation: as for [`acquire`](Self::acquire).
    pub async fn acquire_with(
        &self,
        resources: impl Resources,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock> {
        let options = AcquireOptions::new().wait(wait);
        self.acquire_inner(resources.into_names(), ttl, self.inner.retry, &options)
            .await
    }

    /// One attempt, no retry. `Ok(None)` when the lock is held by someone else (contention is not
    /// an error here); errors when nodes are unreachable or the validity ran out.
    ///
    /// Cancellation: as for [`acquire`](Self::acquire).
    pub async fn try_acquire(
        &self,
        resources: impl Resources,
        ttl: Duration,
    ) -> Result<Option<Lock>> {
        match self
            .acquire_inner(
                resources.into_names(),
                ttl,
                Retry::once(),
                &AcquireOptions::new(),
            )
            .await
        {
            Ok(lock) => Ok(Some(lock)),
            Err(Error::Contended { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn acquire_inner(
        &self,
        names: Vec<String>,
        ttl: Duration,
        retry: Retry,
        options: &AcquireOptions,
    ) -> Result<Lock> {
        let mut req = self.request(names, ttl).inspect_err(|_| {
            crate::base::metrics::acquired("invalid", Duration::ZERO);
        })?;
        options.apply(&mut req).inspect_err(|_| {
            crate::base::metrics::acquired("invalid", Duration::ZERO);
        })?;
        if options.fenced {
            self.fence_request(&mut req)?;
            req.raise_later = options.raise_later;
        }
        if let (true, [resource]) = (options.announce, req.resources.as_slice()) {
            let keys = [self.election_key(resource), self.yield_key(resource)];
            req.announce = Some(Arc::new(keys));
        }
        let wait = options.wait;
        let span = tracing::debug_span!(
            "fredlock.acquire",
            resources = ?req.resources,
            ttl_ms = req.ttl.as_millis() as u64,
            attempt = tracing::field::Empty,
            granted = tracing::field::Empty,
            failed = tracing::field::Empty,
            elapsed_us = tracing::field::Empty,
            remaining_ms = tracing::field::Empty,
        );
        let line = req.line.as_ref().map(|(gate, line_key)| WaitLine {
            gate: *gate,
            line_key: line_key.clone(),
            keys: req.keys.clone(),
            hot: req.keys[0].clone(),
        });
        let req = &req;
        let hold_at_least = options.hold_at_least;
        let attempt = |turn: Turn| async move {
            let grant = self.attempt(req, &turn).await?;
            let mut lock = Lock::from_grant(self.clone(), grant, req.ttl);
            lock.set_hold_at_least(hold_at_least);
            Ok(lock)
        };
        let report = options.report.as_ref();
        let lock = self
            .with_retries(retry, (wait, report), &req.resources, line, ttl, attempt)
            .instrument(span.clone())
            .await?;
        span.record("remaining_ms", lock.remaining().as_millis() as u64);
        Ok(lock)
    }
}
