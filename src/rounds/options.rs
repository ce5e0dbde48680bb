//! [`AcquireOptions`]: the per-call options of [`Redlock::acquire_using`](crate::Redlock::acquire_using) (owner label, custom
//! token, wait bound, minimum hold), and how they shape a request.
//!
//! Owns: the options and their checks. Must not: send anything, or retry.

use std::time::Duration;

use crate::base::error::Result;

/// Per-call options of [`Redlock::acquire_using`](crate::Redlock::acquire_using). Every option is optional; `new()` changes
/// nothing from [`Redlock::acquire`](crate::Redlock::acquire).
#[derive(Clone, Default)]
pub struct AcquireOptions {
    label: Option<String>,
    token: Option<String>,
    /// The bound on the whole wait, instead of the retry policy's attempts.
    pub(crate) wait: Option<Duration>,
    /// Hand out a fencing token with this lock even when the Redlock does not (elections).
    pub(crate) fenced: bool,
    /// With `fenced`: hand the token out UNRAISED; the caller raises the counter on a quorum
    /// before anyone sees the token (an election's claim does, see `Redlock::write_record`).
    pub(crate) raise_later: bool,
    /// An election's term: its release announces the election's view to observers in the
    /// same script (one resource only).
    pub(crate) announce: bool,
    /// The minimum hold, if any (see [`hold_at_least`](Self::hold_at_least)).
    pub(crate) hold_at_least: Option<Duration>,
    /// Told after every attempt that was not granted: the error when nodes failed, `None` when
    /// a quorum answered (an election's campaign reports its failures while it waits).
    pub(crate) report: Option<crate::rounds::acquire_loop::Report>,
}

impl std::fmt::Debug for AcquireOptions {
    // The token is a secret: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcquireOptions")
            .field("label", &self.label)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("wait", &self.wait)
            .field("hold_at_least", &self.hold_at_least)
            .finish()
    }
}

impl AcquireOptions {
    /// No option set: the `Redlock`'s label, a fresh token per attempt, its retry policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// The owner label stored with this lock, instead of the `Redlock`'s
    /// ([`Builder::owner_label`](crate::Builder::owner_label)): public text that
    /// [`Redlock::inspect`](crate::Redlock::inspect) shows, at most [`MAX_LABEL_LEN`](crate::MAX_LABEL_LEN) bytes without
    /// control characters (checked at acquire: [`InvalidInput::InvalidLabel`](crate::InvalidInput::InvalidLabel)).
    /// An empty label stores none.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Your own lock token instead of 128 fresh random bits: 1 to
    /// [`MAX_TOKEN_LEN`](crate::MAX_TOKEN_LEN) bytes without the separator 0x1f (checked at
    /// acquire: [`InvalidInput::InvalidToken`](crate::InvalidInput::InvalidToken)).
    ///
    /// **Safety rests on it**: whoever knows the token can release and extend the lock, and two
    /// acquisitions with the same token (and label) are the same holder to every node. It must
    /// be unguessable (at least 128 random bits) and NEW for every acquisition; a token that
    /// repeats, or can be guessed, lets another process delete or keep your lock, and mutual
    /// exclusion is lost. Use it to carry an identifier you already generate that way (a job's
    /// random id), not a name. Every attempt of one acquire uses it; a failed attempt's
    /// clean-up is then never resent late (it could delete the next attempt's key), so a node
    /// that missed it keeps our own value until its TTL. (Waiters of the same `Redlock` may then
    /// notice this lock's release by their fallback timer rather than at once: a failed
    /// attempt's value is kept quiet for them for 10 s.)
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Retry until `wait` has passed instead of for the policy's number of attempts, exactly as
    /// [`Redlock::acquire_with`](crate::Redlock::acquire_with): `Duration::ZERO` makes one attempt (then
    /// [`Error::Contended`](crate::Error::Contended) when the lock is held), `Duration::MAX` waits without a limit.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Hold the lock for at least `at_least` from [`Lock::acquired_at`](crate::Lock::acquired_at), however early it is
    /// released: for jobs that every replica fires at the same time (cron de-duplication), where
    /// a job that finishes in 50 ms and releases would let a replica whose clock is late run it
    /// again. A [`release`](crate::Lock::release) (or drop) before `acquired_at + at_least` deletes
    /// nothing: the keys are left to expire at that time, their TTL shortened to it
    /// ([`ReleaseReport::left_to_expire`](crate::ReleaseReport::left_to_expire) says so). A release after it deletes the keys as
    /// usual. The handle reports the lock released at once either way, and other acquires are
    /// refused until the keys expire. An [`extend`](crate::Lock::extend) to a shorter TTL than the
    /// rest of the minimum extends to the rest of the minimum. `Duration::ZERO`: no minimum.
    ///
    /// The minimum must not be longer than the TTL passed to the acquire: keys expire with
    /// their TTL, so such a minimum could not be kept, and the acquire fails at once with
    /// [`InvalidInput::HoldLongerThanTtl`](crate::InvalidInput::HoldLongerThanTtl) (nothing is
    /// sent). The TTL is not raised for you: it is also how long a holder that crashes keeps
    /// everyone else out, which is yours to choose. (`fredlock run --hold-at-least` applies the
    /// same rule to its `--ttl`.)
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.hold_at_least = Some(at_least);
        self
    }

    /// Checks the options and puts them into `req`.
    pub(crate) fn apply(&self, req: &mut crate::rounds::redlock::Request) -> Result<()> {
        if let Some(at_least) = self.hold_at_least.filter(|&a| a > req.ttl) {
            return Err(crate::base::error::InvalidInput::HoldLongerThanTtl {
                hold_at_least: at_least,
                ttl: req.ttl,
            }
            .into());
        }
        if let Some(label) = &self.label {
            crate::base::owner::check_label(label)?;
            req.label = label.clone();
        }
        if let Some(token) = &self.token {
            crate::base::owner::check_token(token)?;
            req.token = Some(token.clone());
        }
        req.keeps_minimum = self.hold_at_least.is_some_and(|d| !d.is_zero());
        Ok(())
    }
}
