//! Leases: a held lock handed to another process. [`Lock::into_lease`] turns a lock into a
//! [`Lease`] (its resources, its stored value with the secret token, its fencing tokens, its
//! TTL and its deadline as a wall-clock time) without releasing anything; the lease prints as
//! one line of text and parses back; [`Redlock::resume`] turns it into a [`Lock`] again after
//! checking on a quorum that the token still holds the keys (never re-creating them), and
//! [`Redlock::release_lease`] releases by lease, from any process.
//!
//! Owns: [`Lease`], its text form, resume and release by lease.
//! Must not: create a lock key (a lease only ever finds, extends or deletes its own).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::base::error::{Error, InvalidInput, Names, NotHeldReason, Result, Vote, Votes};
use crate::base::reply::Checked;
use crate::hold::keepalive::KeepAlive;
use crate::nodes::node::Held;
use crate::rounds::attempt::Grant;
use crate::rounds::lock::{Lock, ReleaseReport};
use crate::rounds::quorum::{self, fan_out, quorum_known, AsVote, Late, Outcome};
use crate::rounds::redlock::Redlock;

/// What a lease's text starts with, then its format version.
const MAGIC: &str = "fredlock-lease";
const VERSION: &str = "1";
/// The format version of a lease that carries a hold-at-least minimum (one more field).
const VERSION_MIN: &str = "2";

/// A held lock, handed from one process to another: the resources, the token, the fencing
/// tokens, the TTL and the deadline as a wall-clock time.
///
/// **A lease is a secret**: whoever has its text can resume, extend and release the lock. Pass
/// it the way you pass a password (an environment variable, a file readable by the next step,
/// a secret store), never in a log or a URL. `Debug` shows the token's fingerprint only;
/// `Display` prints the whole lease (that is its purpose), and `FromStr` parses it back.
///
/// A lease does not keep the lock alive: the keys expire with their TTL unless a process
/// resumes the lease and extends (or keeps alive) the lock before [`deadline`](Self::deadline).
/// Several processes that resume one lease all hold the same lock; hand it to one.
///
/// ```no_run
/// # async fn demo(redlock: fredlock::Redlock) -> Result<(), fredlock::Error> {
/// use std::time::Duration;
/// use fredlock::{Lease, Lock};
///
/// // Step one of a pipeline takes the lock and passes it on as text.
/// let lock = redlock.acquire("deploy:prod", Duration::from_secs(600)).await?;
/// let text = lock.into_lease().to_string();
/// // A later step, in another process: the same lock, checked on a quorum.
/// let lock: Lock = redlock.resume(text.parse::<Lease>()?).await?;
/// lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    resources: Vec<String>,
    /// What the nodes store: the token, then the label (see [`Lock::value`]).
    value: String,
    fencing: Option<Vec<u64>>,
    /// Milliseconds since the Unix epoch.
    deadline_ms: u64,
    ttl: Duration,
    /// When the lock's [`hold_at_least`](crate::AcquireOptions::hold_at_least) minimum ends,
    /// milliseconds since the Unix epoch (`None`: no minimum, or it was over).
    minimum_ms: Option<u64>,
}

impl fmt::Debug for Lease {
    // The token is a secret: only its fingerprint is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resources", &self.resources)
            .field("fingerprint", &self.fingerprint())
            .field("label", &self.label())
            .field("fencing", &self.fencing)
            .field("deadline_unix_ms", &self.deadline_ms)
            .field("ttl", &self.ttl)
            .field("minimum_unix_ms", &self.minimum_ms)
            .finish()
    }
}

impl Lease {
    /// The resources the lease holds (sorted, without the key prefix).
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The wall-clock time after which the lock must be considered lost (the holder's deadline
    /// when the lease was made, on its clock). Clocks of two machines differ: keep a margin.
    pub fn deadline(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.deadline_ms)
    }

    /// Time left before [`deadline`](Self::deadline) on this machine's clock; zero once passed.
    pub fn remaining(&self) -> Duration {
        self.deadline()
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    }

    /// Whether the deadline has passed on this machine's clock.
    pub fn is_expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The TTL of the lock's last acquire or extend (what a resumed lock extends by default).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the lock's [`hold_at_least`](crate::AcquireOptions::hold_at_least) minimum ends
    /// (wall clock), if it was not over when the lease was made: a release before it, by
    /// [`Redlock::release_lease`] or by the resumed lock, leaves the keys until then.
    pub fn minimum_ends(&self) -> Option<SystemTime> {
        self.minimum_ms
            .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
    }

    /// The rest of the minimum, from now by the wall clock (`None`: over or none).
    fn minimum_left(&self) -> Option<Duration> {
        self.minimum_ends()?
            .duration_since(SystemTime::now())
            .ok()
            .filter(|d| !d.is_zero())
    }

    /// The fencing token of the first resource (see [`Lock::fencing_token`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing.as_ref().and_then(|t| t.first().copied())
    }

    /// Every resource's fencing token, in [`resources`](Self::resources) order.
    pub fn fencing_tokens(&self) -> Option<&[u64]> {
        self.fencing.as_deref()
    }

    /// The owner label stored with the lock (public).
    pub fn label(&self) -> Option<&str> {
        crate::base::owner::split(&self.value).1
    }

    /// The token's public fingerprint (see [`Lock::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        crate::base::owner::fingerprint(crate::base::owner::split(&self.value).0)
    }

    fn held(&self, redlock: &Redlock) -> Result<Arc<Held>> {
        // Validates the names and TTL as an acquire would (a permit's slot is a lease too).
        let req = redlock.request_unchecked(self.resources.clone(), self.ttl)?;
        Ok(Arc::new(Held {
            keys: req.keys,
            value: self.value.clone(),
            custom: false,
            resources: req.resources,
            fence_keys: Vec::new(),
            line: None,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        }))
    }
}

impl Lock {
    /// Hands this lock over as a [`Lease`]: nothing is released, the keys stay until their TTL
    /// unless the process that resumes the lease extends or releases them. The lease carries the
    /// secret token: see [`Lease`].
    ///
    /// Right after the acquire, a node that had not answered yet may still receive this
    /// process's SET (within the node timeout): a release by lease from another process that
    /// reaches that node first leaves its key there until the TTL (one node, not a quorum).
    pub fn into_lease(self) -> Lease {
        // The wall clock first, then the time left: the deadline can only come out early.
        let now = SystemTime::now();
        let remaining = self.remaining();
        let ttl = self.ttl();
        // Rounded up to whole milliseconds: the minimum can only come out late (kept longer).
        let minimum = self.hold_left().and_then(|left| now.checked_add(left));
        let (held, fencing) = self.disarm();
        let deadline = now.checked_add(remaining).unwrap_or(now);
        Lease {
            resources: held.resources.clone(),
            value: held.value.clone(),
            fencing,
            deadline_ms: unix_ms(deadline),
            ttl,
            minimum_ms: minimum.map(|m| unix_ms(m).saturating_add(1)),
        }
    }
}

impl KeepAlive {
    /// Stops keeping the lock alive here and hands it over as a [`Lease`] (see
    /// [`Lock::into_lease`]); nothing is released. Handles see [`LostReason::Released`](crate::LostReason::Released).
    ///
    /// Errors: [`Error::NotHeld`] when the lock had already been lost.
    ///
    /// Cancellation: dropping the future before it returns releases the lock in the
    /// background, as dropping the `KeepAlive` does.
    pub async fn into_lease(self) -> Result<Lease> {
        let resources = Names(self.resources().to_vec());
        match self.stop().await {
            Some(lock) if lock.is_valid() => Ok(lock.into_lease()),
            _ => Err(Error::NotHeld {
                resources,
                reason: NotHeldReason::Expired,
                votes: Votes::default(),
            }),
        }
    }
}

impl AsVote for Checked {
    fn as_vote(&self) -> &Vote {
        &self.vote
    }
}

impl Redlock {
    /// The lock a [`Lease`] stands for, in this process: checks on every node (deciding as soon
    /// as a quorum's answer is known) that the lease's token still holds every key, and changes
    /// nothing there: a lock that expired or was taken over is never re-created. The lock's
    /// deadline is the earlier of the lease's (converted to this machine's monotonic clock) and
    /// what the nodes' TTLs allow: the time a quorum still keeps the keys, less the drift
    /// allowance. Extend it, keep it alive or release it as any lock. Uses this `Redlock`'s key
    /// prefix: resume with one configured like the lease's.
    ///
    /// Errors: [`Error::NotHeld`] with reason `Expired` when the lease's deadline passed (nothing
    /// is sent), `TokenGone` when a quorum no longer holds the token (it expired or someone else
    /// took the lock); [`Error::Unavailable`] when too few nodes answered; [`Error::InvalidInput`]
    /// when the lease names reserved or cross-slot resources.
    ///
    /// Cancellation: safe (the check is read-only).
    pub async fn resume(&self, lease: Lease) -> Result<Lock> {
        let names = Names(lease.resources.clone());
        let expired = |votes| Error::NotHeld {
            resources: names.clone(),
            reason: NotHeldReason::Expired,
            votes,
        };
        let held = lease.held(self)?;
        let inner = &self.inner;
        // `close()` waits for this call to end (the lock it makes is then released with the
        // rest), and refuses it once closed.
        let Some(_in_flight) = inner.holds.acquiring() else {
            return Err(Error::Closed { resources: names });
        };
        let timeout = inner.node_timeout(lease.ttl);
        // The monotonic clock first, then the time left: the deadline can only come out early.
        let t0 = Instant::now();
        let left = lease.remaining();
        if left.is_zero() {
            return Err(expired(Votes::default()));
        }
        let until = t0.checked_add(left);
        let calls = inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().check_lease(held.clone(), timeout)));
        let answers = fan_out(inner.nodes.len(), calls, until, Late::Drop, quorum_known).await;
        let votes = Votes(
            answers
                .iter()
                .map(|a| a.as_ref().map_or(Vote::Pending, |c| c.vote.clone()))
                .collect(),
        );
        crate::base::metrics::failures(&votes.0);
        if quorum::outcome(&votes.0) != Outcome::Reached {
            return Err(inner.round_failure(&held, crate::base::error::Round::Extend, votes));
        }
        // The q-th longest TTL among the nodes that hold it: a quorum keeps the keys that long
        // from t0 at least (each node answered after t0).
        let mut pttls: Vec<u64> = answers
            .iter()
            .flatten()
            .filter(|c| c.vote == Vote::Granted)
            .map(|c| c.pttl_ms)
            .collect();
        pttls.sort_unstable_by(|a, b| b.cmp(a));
        let quorum_ttl = Duration::from_millis(pttls.get(inner.quorum - 1).copied().unwrap_or(0));
        let by_nodes = quorum::validity(quorum_ttl, inner.drift_factor)
            .ok()
            .and_then(|v| t0.checked_add(v));
        let deadline = match (by_nodes, until) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, _) => return Err(expired(votes)),
        };
        if Instant::now() >= deadline {
            return Err(expired(votes));
        }
        let minimum_left = lease.minimum_left();
        let grant = Grant {
            held,
            t0,
            deadline,
            fencing: lease.fencing,
            handed: None,
        };
        let mut lock = Lock::from_grant(self.clone(), grant, lease.ttl);
        // The minimum counts from the lock's `acquired_at` (here `t0`); never more than the TTL
        // (as at an acquire: a hostile text cannot make every extension an invalid TTL).
        let minimum = minimum_left.map(|left| left.saturating_add(t0.elapsed()).min(lease.ttl));
        lock.set_hold_at_least(minimum);
        Ok(lock)
    }

    /// Releases the lock a [`Lease`] stands for, from any process: exactly
    /// [`Lock::release`] (only keys that still hold the lease's token are deleted), without
    /// resuming it first. The lease's deadline is not checked: a late release finds the token
    /// gone and says so.
    ///
    /// As for [`Lock::release`], before the lease's [`minimum_ends`](Lease::minimum_ends) this
    /// deletes nothing: the keys are left to expire then.
    ///
    /// Errors: as [`Lock::release`]: [`Error::NotHeld`] (`TokenGone`) when a quorum no longer
    /// held the token, [`Error::Unavailable`] when too few nodes answered.
    ///
    /// Cancellation: the release is handed to the nodes at the first poll; dropping the future
    /// later leaves it to finish on its own.
    pub async fn release_lease(&self, lease: &Lease) -> Result<ReleaseReport> {
        let held = lease.held(self)?;
        let started = Instant::now();
        let left_ms = lease
            .minimum_left()
            .map(|left| crate::rounds::lock::left_to_expire_ms(left, lease.ttl));
        let votes = match left_ms {
            Some(ms) => self.inner.shorten_all(&held, ms).await,
            None => {
                self.inner
                    .release_or_hand_over(&held, lease.ttl, None)
                    .await
            }
        };
        let report = ReleaseReport {
            votes: votes.clone(),
            elapsed: started.elapsed(),
            left_to_expire: left_ms.map(Duration::from_millis),
        };
        match quorum::outcome(&votes.0) {
            Outcome::Reached => Ok(report),
            _ => Err(self
                .inner
                .round_failure(&held, crate::base::error::Round::Release, votes)),
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl fmt::Display for Lease {
    /// `fredlock-lease:1:DEADLINE_MS:TTL_MS:FENCING:VALUE:RESOURCES`: one line of shell-safe
    /// text (the value and the resource names in hex, fencing tokens comma-separated or `-`).
    /// A lock held for a minimum ([`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least))
    /// not over yet gives version 2, with the minimum's end after the TTL:
    /// `fredlock-lease:2:DEADLINE_MS:TTL_MS:MINIMUM_MS:FENCING:VALUE:RESOURCES`.
    /// This is the secret: print it only where the lock may go.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fencing = match &self.fencing {
            Some(t) => t.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            None => "-".into(),
        };
        let resources: Vec<String> = self.resources.iter().map(|r| hex(r)).collect();
        let (version, minimum) = match self.minimum_ms {
            Some(ms) => (VERSION_MIN, format!(":{ms}")),
            None => (VERSION, String::new()),
        };
        write!(
            f,
            "{MAGIC}:{version}:{}:{}{minimum}:{fencing}:{}:{}",
            self.deadline_ms,
            self.ttl.as_millis(),
            hex(&self.value),
            resources.join(",")
        )
    }
}

impl FromStr for Lease {
    type Err = Error;

    fn from_str(s: &str) -> Result<Lease> {
        let bad = |why| Error::from(InvalidInput::InvalidLease(why));
        let mut parts: Vec<&str> = s.trim().split(':').collect();
        let minimum = match parts.get(1) {
            Some(&VERSION_MIN) if parts.len() == 8 => Some(parts.remove(4)),
            _ => None,
        };
        let [magic, version, deadline, ttl, fencing, value, resources] = parts.as_slice() else {
            return Err(bad("wrong number of fields"));
        };
        if *magic != MAGIC {
            return Err(bad("it does not start with fredlock-lease"));
        }
        if *version != VERSION && *version != VERSION_MIN {
            return Err(bad("unknown version"));
        }
        let minimum_ms = match minimum {
            Some(m) => Some(m.parse().map_err(|_| bad("bad minimum"))?),
            None if *version == VERSION_MIN => return Err(bad("wrong number of fields")),
            None => None,
        };
        let deadline_ms = deadline.parse().map_err(|_| bad("bad deadline"))?;
        let ttl_ms: u64 = ttl.parse().map_err(|_| bad("bad TTL"))?;
        if ttl_ms == 0 {
            return Err(bad("zero TTL"));
        }
        let value = unhex(value).ok_or_else(|| bad("bad token"))?;
        crate::base::owner::check_token(crate::base::owner::split(&value).0)
            .map_err(|_| bad("bad token"))?;
        let resources = resources
            .split(',')
            .map(|r| unhex(r).filter(|r| !r.is_empty()))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| bad("bad resource name"))?;
        let fencing = match *fencing {
            "-" => None,
            list => {
                let tokens = list
                    .split(',')
                    .map(|t| t.parse::<u64>().ok())
                    .collect::<Option<Vec<u64>>>()
                    .ok_or_else(|| bad("bad fencing token"))?;
                if tokens.len() != resources.len() {
                    return Err(bad("one fencing token per resource expected"));
                }
                Some(tokens)
            }
        };
        Ok(Lease {
            resources,
            value,
            fencing,
            deadline_ms,
            ttl: Duration::from_millis(ttl_ms),
            minimum_ms,
        })
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Lease {
    /// As its text form (a string): the lease is a secret, serialize it only where it may go.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Lease {
    /// From its text form (a string).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Lease, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            resources: vec!["deploy:prod".into(), "b,c:d".into()],
            value: crate::base::owner::value(&"ab".repeat(16), "ci step 3"),
            fencing: Some(vec![7, u64::MAX]),
            deadline_ms: 1_700_000_000_000,
            ttl: Duration::from_secs(600),
            minimum_ms: None,
        }
    }

    #[test]
    fn text_round_trips_and_debug_hides_the_token() {
        let l = lease();
        let text = l.to_string();
        assert!(text.starts_with("fredlock-lease:1:"));
        assert!(!text.contains(' ') && !text.contains('\n'));
        assert_eq!(text.parse::<Lease>().expect("parse"), l);
        let debug = format!("{l:?}");
        assert!(!debug.contains(&"ab".repeat(16)), "{debug}");
        assert!(debug.contains(&l.fingerprint()));
        let plain = Lease { fencing: None, ..l };
        assert_eq!(plain.to_string().parse::<Lease>().expect("parse"), plain);
        // With a minimum: version 2, one more field; round trips too.
        let held = Lease {
            minimum_ms: Some(1_700_000_030_000),
            ..plain.clone()
        };
        let text = held.to_string();
        assert!(text.starts_with("fredlock-lease:2:"), "{text}");
        assert_eq!(text.parse::<Lease>().expect("parse"), held);
        // A version 2 text without the field, or version 1 with it: refused.
        let v2_short = plain.to_string().replacen(":1:", ":2:", 1);
        assert!(v2_short.parse::<Lease>().is_err(), "{v2_short}");
        let v1_long = text.replacen(":2:", ":1:", 1);
        assert!(v1_long.parse::<Lease>().is_err(), "{v1_long}");
    }

    #[test]
    fn hostile_text_is_a_typed_error() {
        let good = lease().to_string();
        let cases = [
            String::new(),
            "fredlock-lease".into(),
            good.replace("fredlock-lease", "other"),
            good.replacen(":1:", ":2:", 1),
            good.replace(":600000:", ":0:"),
            good.replace(":600000:", ":-5:"),
            good.replace(":7,18446744073709551615:", ":7:"),
            good.replace(":7,18446744073709551615:", ":x,y:"),
            format!("{good}zz"),
            format!("{good}:extra"),
            good.replace(&hex(&lease().value), ""),
            good.replace(&hex(&lease().value), "ff"),
        ];
        for text in cases {
            match text.parse::<Lease>() {
                Err(Error::InvalidInput(InvalidInput::InvalidLease(_))) => {}
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
