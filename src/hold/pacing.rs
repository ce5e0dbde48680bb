//! How a keep-alive paces its extensions: the options a caller sets ([`KeepAliveOptions`], their
//! defaults and validation) and the arithmetic they drive: when the next extension round starts,
//! how long a retry waits, what TTL a round may ask for within a `max_hold` budget, whether a
//! round is worth sending, how early a round may start to share a batch, and when the lost
//! signal fires for a deadline.
//!
//! Owns: the options' values and checks, and pure functions of `Duration`s and `Instant`s with
//! their floors and margins. Must not: read the clock, sleep, publish a status or touch a lock
//! (the keep-alive task above does, and passes `now` in), or talk to nodes.

use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::InvalidInput;

/// How a [`KeepAlive`](crate::KeepAlive) extends its lock. Build with
/// [`KeepAliveOptions::default()`] and the setters; every value is validated when the guard starts.
#[derive(Debug, Clone, PartialEq)]
pub struct KeepAliveOptions {
    pub(crate) renew_when_left: f64,
    pub(crate) ttl: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) max_extensions: Option<u32>,
    pub(crate) retry_delay: Option<Duration>,
    pub(crate) batched: bool,
}

impl Default for KeepAliveOptions {
    /// Extend when a third of the TTL is left, with the lock's own TTL, without a budget;
    /// retry a failed round after `ttl / 30` (clamped to 5-500 ms) while validity is left;
    /// renewed in batches by the Redlock's shared renewer.
    fn default() -> Self {
        KeepAliveOptions {
            renew_when_left: 1.0 / 3.0,
            ttl: None,
            max_hold: None,
            max_extensions: None,
            retry_delay: None,
            batched: true,
        }
    }
}

// One setter per option, each with its own documentation: the same shape on purpose.
impl KeepAliveOptions {
    /// Extend when this fraction of the TTL is left before the deadline, in `(0, 1)`
    /// (default 1/3). Whatever the fraction, two extensions start at least `ttl / 10` apart, so
    /// no value can turn the keep-alive into a storm of rounds.
    pub fn renew_when_left(mut self, fraction: f64) -> Self {
        self.renew_when_left = fraction;
        self
    }
    /// TTL of each extension (default: the TTL the lock was acquired with). Validated exactly
    /// like an acquire's TTL: not zero, not too large for Redis, longer than the drift allowance.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Never hold the lock past `acquired_at + max` (the acquire's start plus this budget). The
    /// published deadline never passes that instant: extensions near the end are shortened to
    /// fit, none is sent that would not move the deadline forward by at least `ttl / 20`, and
    /// when no more fits the lock is lost with
    /// [`LostReason::BudgetExhausted`](crate::LostReason::BudgetExhausted) at its last deadline.
    /// A budget shorter than the acquire's own validity caps that first deadline too.
    /// `Duration::MAX` means no limit. Release (or drop) the guard to free the keys at once.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }
    /// Extend at most this many times, then let the lock expire
    /// ([`LostReason::BudgetExhausted`](crate::LostReason::BudgetExhausted)). `0` keeps the lost
    /// signal but never extends.
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.max_extensions = Some(max);
        self
    }
    /// Pause between extension rounds that failed transiently (a node down, a timeout), while
    /// validity is left (default `ttl / 30`, clamped to 5-500 ms). Never less than
    /// `max(ttl / 100, 1 ms)`, whatever is given; `Duration::MAX` means one try per round.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = Some(delay);
        self
    }

    /// Who extends the lock (default `true`). `true`: the [`Redlock`](crate::Redlock)'s shared
    /// renewer, one background task for all its kept-alive locks, which extends the locks due
    /// at about the same time together, with ONE script call per node for up to 128 keys,
    /// and decides each lock on its own (its own quorum, its own validity).
    /// A lock may then be extended up to `min(ttl / 20, 500 ms)` before `renew_when_left` says
    /// (its renewal is rounded down to a grid of that size, so that locks due within it share a
    /// batch), never sooner than `ttl / 10` after its previous round. `false`: a
    /// task of its own, one extension script per node per renewal: the behaviour before
    /// batching, kept for comparison and for a lock that must never share a round; at 10,000
    /// locks it costs about 2.5x the heap per held lock, 2.4x the nodes' CPU and 100x the
    /// commands (`examples/bench_keepalive.rs`). Every other option and guarantee is the same
    /// either way.
    pub fn batched(mut self, batched: bool) -> Self {
        self.batched = batched;
        self
    }

    /// Checks every value; `drift_factor` is the Redlock's, for the TTL check.
    pub(crate) fn validate(&self, drift_factor: f64) -> Result<(), InvalidInput> {
        if !(self.renew_when_left > 0.0 && self.renew_when_left < 1.0) {
            return Err(InvalidInput::KeepAlive("renew_when_left must be in (0, 1)"));
        }
        if let Some(ttl) = self.ttl {
            crate::rounds::quorum::ttl_millis(ttl)?;
            crate::rounds::quorum::validity(ttl, drift_factor)?;
        }
        if self.retry_delay.is_some_and(|d| d.is_zero()) {
            return Err(InvalidInput::KeepAlive(
                "retry_delay must be greater than zero",
            ));
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(InvalidInput::KeepAlive(
                "max_hold must be greater than zero",
            ));
        }
        Ok(())
    }
}

/// Two extension rounds start at least this far apart (a fraction of the TTL).
const MIN_RENEW_GAP_DIVISOR: u32 = 10;
/// A retry after a failed round waits at least `ttl / this`, and at least [`MIN_RETRY_PAUSE`].
const MIN_RETRY_DIVISOR: u32 = 100;
/// The smallest pause between two rounds.
const MIN_RETRY_PAUSE: Duration = Duration::from_millis(1);

/// A batched renewal's time is rounded down to a grid of at most `ttl / this`...
const GRAIN_DIVISOR: u32 = 20;
/// ... and at most this, whatever the TTL.
const MAX_GRAIN: Duration = Duration::from_millis(500);

/// The lost signal's timer is set this long BEFORE the deadline: timers fire at or after their
/// instant (tokio rounds up to its next millisecond tick, then the task must run), and the
/// signal must come no later than the deadline. What is left of it when a waiter wakes is the
/// margin users see: between 0 and 2 ms (`tests/keepalive.rs` measures it).
pub(crate) const LOST_MARGIN: Duration = Duration::from_millis(2);

/// When the lost signal fires for a given deadline.
pub(crate) fn fire_at(deadline: Instant) -> Instant {
    deadline.checked_sub(LOST_MARGIN).unwrap_or(deadline)
}

/// `acquired_at + max_hold`, or `None` for no limit (no budget, or one too large for the clock).
pub(crate) fn hold_end(acquired_at: Instant, max_hold: Option<Duration>) -> Option<Instant> {
    max_hold.and_then(|h| acquired_at.checked_add(h))
}

/// A deadline obtained from the nodes, capped by the budget's end.
pub(crate) fn cap(deadline: Instant, hold_end: Option<Instant>) -> Instant {
    hold_end.map_or(deadline, |end| deadline.min(end))
}

/// The schedule of one keep-alive, fixed when its task starts.
#[derive(Debug, Clone)]
pub(crate) struct Pacing {
    /// TTL of a full extension.
    pub(crate) ttl: Duration,
    /// Two rounds start at least this far apart.
    gap: Duration,
    /// Pause after a round that failed transiently.
    retry_delay: Duration,
    /// Extend when this fraction of `ttl` is left before the deadline.
    renew_when_left: f64,
    /// The budget's end (`acquired_at + max_hold`), if any.
    hold_end: Option<Instant>,
    /// The Redlock's drift factor, for the validity a round would obtain.
    drift_factor: f64,
}

impl Pacing {
    /// The schedule for `options` (already validated) on a lock acquired with `lock_ttl`. The
    /// retry delay is the option as given (default `ttl / 30`, clamped to 5-500 ms); either way
    /// never less than `max(ttl / 100, 1 ms)`.
    pub(crate) fn new(
        options: &KeepAliveOptions,
        lock_ttl: Duration,
        hold_end: Option<Instant>,
        drift_factor: f64,
    ) -> Pacing {
        let ttl = options.ttl.unwrap_or(lock_ttl);
        let retry_delay = options
            .retry_delay
            .unwrap_or_else(|| {
                (ttl / 30).clamp(Duration::from_millis(5), Duration::from_millis(500))
            })
            .max((ttl / MIN_RETRY_DIVISOR).max(MIN_RETRY_PAUSE));
        Pacing {
            ttl,
            gap: (ttl / MIN_RENEW_GAP_DIVISOR).max(MIN_RETRY_PAUSE),
            retry_delay,
            renew_when_left: options.renew_when_left,
            hold_end,
            drift_factor,
        }
    }

    /// When the next round starts: when `renew_when_left` of the TTL is left before `deadline`,
    /// and at least the pacing gap after the previous round started.
    pub(crate) fn renew_at(&self, deadline: Instant, last_round: Instant) -> Instant {
        deadline
            .checked_sub(self.ttl.mul_f64(self.renew_when_left))
            .unwrap_or(deadline)
            .max(last_round.checked_add(self.gap).unwrap_or(deadline))
    }

    /// The grid that batched renewals are rounded down to: the largest power of two of
    /// milliseconds not above `min(ttl / 20, 500 ms)`; `None` below 1 ms (no rounding).
    /// Powers of two nest, so locks of different TTLs still meet on the coarser grid's points.
    fn grain(&self) -> Option<Duration> {
        let cap = (self.ttl / GRAIN_DIVISOR).min(MAX_GRAIN).as_millis();
        if cap == 0 {
            return None;
        }
        let mut grain: u64 = 1;
        while u128::from(grain * 2) <= cap {
            grain *= 2;
        }
        Some(Duration::from_millis(grain))
    }

    /// When a renewal due at `due` is sent by the shared renewer: rounded down to the grid of
    /// [`grain`](Self::grain) counted from `epoch` (the renewer's start), so that locks due
    /// within one grain of each other share a batch; never sooner than the pacing gap after the
    /// previous round (`last_round`), never later than `due`. So a renewal starts less than
    /// `min(ttl / 20, 500 ms)` early, which only moves the deadline forward sooner (the round's
    /// TTL and usefulness are measured when it is sent); and locks extended together, having the
    /// same new deadline, stay due together.
    pub(crate) fn batch_at(&self, due: Instant, last_round: Instant, epoch: Instant) -> Instant {
        let Some(grain) = self.grain() else {
            return due;
        };
        let since = due.saturating_duration_since(epoch).as_nanos();
        let rounded = u64::try_from(since - since % grain.as_nanos())
            .ok()
            .and_then(|n| epoch.checked_add(Duration::from_nanos(n)))
            .unwrap_or(due);
        let paced = last_round.checked_add(self.gap).unwrap_or(due);
        rounded.max(paced).min(due)
    }

    /// This round's TTL: the full one, or what is left of the budget, measured at `now`.
    pub(crate) fn round_ttl(&self, now: Instant) -> Duration {
        match self.hold_end {
            Some(end) => self.ttl.min(end.saturating_duration_since(now)),
            None => self.ttl,
        }
    }

    /// Whether a round of `round_ttl` sent at `now` would move `deadline` forward by at least
    /// half the pacing gap (`ttl / 20`). A round paced `gap` after the previous one always gains
    /// more than this, so only the budget's end can make a round useless.
    pub(crate) fn useful(&self, round_ttl: Duration, now: Instant, deadline: Instant) -> bool {
        crate::rounds::quorum::validity(round_ttl, self.drift_factor)
            .ok()
            .and_then(|v| now.checked_add(v))
            .is_some_and(|projected| {
                deadline
                    .checked_add(self.gap / 2)
                    .is_some_and(|n| projected >= n)
            })
    }

    /// When to retry after a round that failed at `now`, or `None` when no retry starts before
    /// `give_up` (the lost signal of the current deadline).
    pub(crate) fn retry_at(&self, now: Instant, give_up: Instant) -> Option<Instant> {
        now.checked_add(self.retry_delay)
            .filter(|next| *next < give_up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pacing(ttl: Duration, retry: Option<Duration>, hold_end: Option<Instant>) -> Pacing {
        let options = KeepAliveOptions {
            retry_delay: retry,
            ..KeepAliveOptions::default()
        };
        Pacing::new(&options, ttl, hold_end, 0.01)
    }

    #[test]
    fn an_extension_ttl_overrides_the_locks() {
        let ttl = Duration::from_secs(3);
        let options = KeepAliveOptions::default().ttl(ttl);
        let p = Pacing::new(&options, Duration::from_secs(30), None, 0.01);
        assert_eq!((p.ttl, p.gap), (ttl, ttl / 10));
    }

    #[test]
    fn the_lost_signal_fires_before_the_deadline() {
        let t0 = Instant::now() + Duration::from_secs(1);
        assert_eq!(fire_at(t0), t0 - LOST_MARGIN);
        assert_eq!(cap(t0, Some(t0 - MS)), t0 - MS);
        assert_eq!(cap(t0, None), t0);
        assert_eq!(hold_end(t0, Some(MS)), Some(t0 + MS));
        assert_eq!(hold_end(t0, Some(Duration::MAX)), None);
        assert_eq!(hold_end(t0, None), None);
    }

    #[test]
    fn retry_delays_are_clamped_and_floored() {
        let s = Duration::from_secs(1);
        assert_eq!(pacing(30 * s, None, None).retry_delay, 500 * MS);
        assert_eq!(pacing(30 * MS, None, None).retry_delay, 5 * MS);
        // A given delay is floored at ttl / 100, and at 1 ms.
        assert_eq!(pacing(10 * s, Some(MS), None).retry_delay, 100 * MS);
        assert_eq!(pacing(10 * MS, Some(MS / 10), None).retry_delay, MS);
        assert_eq!(
            pacing(s, Some(Duration::MAX), None).retry_delay,
            Duration::MAX
        );
        let p = pacing(s, Some(Duration::MAX), None);
        let now = Instant::now();
        assert_eq!(p.retry_at(now, now + s), None);
        let p = pacing(s, Some(10 * MS), None);
        assert_eq!(p.retry_at(now, now + s), Some(now + 10 * MS));
        assert_eq!(p.retry_at(now, now + 10 * MS), None);
    }

    #[test]
    fn rounds_are_paced_by_the_fraction_and_the_gap() {
        let ttl = Duration::from_secs(30);
        let p = pacing(ttl, None, None);
        let t0 = Instant::now();
        let deadline = t0.checked_add(ttl).expect("a 30 s TTL");
        assert_eq!(p.renew_at(deadline, t0), t0 + Duration::from_secs(20));
        // A round that just ran pushes the next one at least ttl / 10 later.
        let last = t0 + Duration::from_secs(19);
        assert_eq!(p.renew_at(deadline, last), last + Duration::from_secs(3));
        // The gap has a 1 ms floor.
        assert_eq!(pacing(5 * MS, None, None).gap, MS);
    }

    #[test]
    fn a_batched_renewal_is_rounded_down_to_a_grid() {
        let ttl = Duration::from_secs(6);
        let p = pacing(ttl, None, None);
        // ttl / 20 = 300 ms: a grid of 256 ms.
        assert_eq!(p.grain(), Some(256 * MS));
        let epoch = Instant::now();
        let t0 = epoch + Duration::from_secs(10);
        let due = epoch + 4_100 * MS;
        assert_eq!(p.batch_at(due, epoch, epoch), epoch + 4_096 * MS);
        // Two locks due 30 ms apart in one grain renew at the same instant.
        let a = epoch + 5_130 * MS;
        let b = epoch + 5_160 * MS;
        assert_eq!(p.batch_at(a, epoch, epoch), p.batch_at(b, epoch, epoch));
        // Never sooner than the gap (600 ms) after the previous round, never after `due`.
        assert_eq!(p.batch_at(a, epoch, epoch), epoch + 5_120 * MS);
        assert_eq!(p.batch_at(a, a - 605 * MS, epoch), a - 5 * MS);
        assert_eq!(p.batch_at(a, a, epoch), a);
        // A due before the epoch is not moved.
        assert_eq!(p.batch_at(epoch, t0, t0), epoch);
        // At most 500 ms (a 256 ms grid) whatever the TTL; tiny TTLs are not rounded.
        assert_eq!(
            pacing(Duration::from_secs(60), None, None).grain(),
            Some(256 * MS)
        );
        assert_eq!(
            pacing(Duration::from_millis(100), None, None).grain(),
            Some(4 * MS)
        );
        assert_eq!(pacing(Duration::from_millis(10), None, None).grain(), None);
        // A renewal paced right after the previous one (renew_when_left near 1) is never early.
        let options = KeepAliveOptions::default().renew_when_left(0.999);
        let eager = Pacing::new(&options, ttl, None, 0.01);
        let due = eager.renew_at(t0 + ttl, t0);
        assert_eq!(eager.batch_at(due, t0, epoch), due);
    }

    #[test]
    fn the_budget_shortens_rounds_and_ends_them() {
        let ttl = Duration::from_secs(10);
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(14);
        let p = pacing(ttl, None, Some(end));
        let deadline = t0.checked_add(ttl).expect("a 30 s TTL");
        assert_eq!(p.round_ttl(t0), ttl);
        assert_eq!(
            p.round_ttl(t0 + Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        assert_eq!(p.round_ttl(end + MS), Duration::ZERO);
        assert!(p.useful(
            p.round_ttl(t0 + Duration::from_secs(7)),
            t0 + Duration::from_secs(7),
            deadline
        ));
        // Near the end the budget's remainder cannot move the deadline by ttl / 20.
        let late = t0 + Duration::from_secs(13);
        assert!(!p.useful(p.round_ttl(late), late, t0 + Duration::from_secs(14)));
        assert!(!p.useful(Duration::ZERO, late, deadline));
        assert_eq!(pacing(ttl, None, None).round_ttl(end + MS), ttl);
    }
}
