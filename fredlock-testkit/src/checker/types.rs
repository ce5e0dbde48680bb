//! The checker's public vocabulary: what a violation and a note are, what a grant record and
//! a counter value hold, and what [`finish`](super::Checker::finish) returns.
//!
//! Owns plain data types and their formatting only. Must not record or decide anything: the
//! recording API is in `record.rs`, `inspections.rs` and `modes.rs`, the invariants in
//! `windows.rs`, `counter.rs` and `modes.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// Identifies one grant (one acquisition) recorded by a [`Checker`](super::Checker).
pub type GrantId = u64;
/// Identifies one write of the lost-update counter. `0` is the initial (absent) value.
pub type WriteId = u64;

/// The kinds of safety violation the checker reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// S3: two grants' windows of the same resource overlap.
    Overlap,
    /// S2: a deadline later than `t0 + ttl - (ttl * drift_factor + 2 ms)`.
    Deadline,
    /// A lost update on the counter, or a final counter that does not match the writes.
    LostUpdate,
    /// S4: a key owned by someone else (a foreign key, or another holder's key) was deleted or
    /// changed by a release or extend that was not its owner's.
    ForeignKeyDeleted,
    /// S5: an extend re-created our token on a node where it had already gone.
    Revival,
    /// S4/S5: an extend or release on a lock that was no longer held (expired, or taken over)
    /// reported success.
    StaleOpSucceeded,
    /// S5: an extension's new deadline was not counted from the start of the extend.
    ExtendDeadline,
    /// S1: a grant whose attempt started and finished while a majority of nodes was down,
    /// partitioned or frozen.
    GrantDuringOutage,
    /// S1: right after a grant, fewer than a quorum of nodes held its token.
    NoQuorum,
    /// S3: a resource held by a foreign owner on every node was granted to a client.
    ForeignGranted,
    /// S7: two grants got the same token.
    DuplicateToken,
    /// Row 9 / S6: a lock key left with no expiry or with more than the maximum TTL.
    KeyBeyondTtl,
    /// S6: a failed, cancelled or released attempt left its key on a node it could reach.
    LeftKey,
    /// Semaphore mode: more permit windows of one semaphore overlapped than it has permits.
    OverPermits,
    /// Read-write mode: a write window of a read-write lock overlapped another of its windows
    /// (a reader's or another writer's).
    RwOverlap,
    /// Fencing mode: a grant that began after another was returned got a token that is not
    /// larger, or two grants of one resource got the same token.
    FencingOrder,
    /// Fencing mode: the fenced register accepted a token not larger than the one before.
    RegisterRegression,
    /// Row 9: a client task panicked (the library must return errors, never panic).
    Panic,
    /// The engine could not keep the run's set-up (a node did not restart, keys could not be
    /// planted or listed): not a library violation, but the run proves nothing, so it fails.
    Engine,
}

impl ViolationKind {
    /// Every kind, in report order.
    pub const ALL: [ViolationKind; 18] = [
        ViolationKind::Overlap,
        ViolationKind::Deadline,
        ViolationKind::LostUpdate,
        ViolationKind::ForeignKeyDeleted,
        ViolationKind::Revival,
        ViolationKind::StaleOpSucceeded,
        ViolationKind::ExtendDeadline,
        ViolationKind::GrantDuringOutage,
        ViolationKind::NoQuorum,
        ViolationKind::ForeignGranted,
        ViolationKind::DuplicateToken,
        ViolationKind::KeyBeyondTtl,
        ViolationKind::LeftKey,
        ViolationKind::OverPermits,
        ViolationKind::FencingOrder,
        ViolationKind::RegisterRegression,
        ViolationKind::Panic,
        ViolationKind::Engine,
    ];

    /// A one-line description with the property it breaks.
    pub fn describe(self) -> &'static str {
        match self {
            ViolationKind::Overlap => "(a) S3 overlapping windows",
            ViolationKind::Deadline => "(b) S2 deadline > t0 + ttl - drift",
            ViolationKind::LostUpdate => "(c) lost update",
            ViolationKind::ForeignKeyDeleted => "(d) S4 foreign key deleted",
            ViolationKind::Revival => "(e) S5 extend revived a key",
            ViolationKind::StaleOpSucceeded => "S4/S5 stale extend/release said Ok",
            ViolationKind::ExtendDeadline => "S5 extend deadline not from its start",
            ViolationKind::GrantDuringOutage => "S1 grant during a majority outage",
            ViolationKind::NoQuorum => "S1 token on fewer than a quorum",
            ViolationKind::ForeignGranted => "S3 foreign-held resource granted",
            ViolationKind::DuplicateToken => "S7 duplicate token",
            ViolationKind::KeyBeyondTtl => "S6 key left beyond its TTL",
            ViolationKind::LeftKey => "S6 failed/cancelled attempt left a key",
            ViolationKind::OverPermits => "semaphore: more holders than permits",
            ViolationKind::RwOverlap => "read-write: a writer overlapped a reader or writer",
            ViolationKind::FencingOrder => "fencing: token not above an earlier grant's",
            ViolationKind::RegisterRegression => "fencing: register accepted a lower token",
            ViolationKind::Panic => "row 9 client task panicked",
            ViolationKind::Engine => "engine failure (run invalid)",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// One safety violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What broke.
    pub kind: ViolationKind,
    /// When it was recorded, from the checker's creation.
    pub at: Duration,
    /// What happened, with grant ids, clients, tokens and times (`+s` from the checker's start).
    pub detail: String,
}

/// Things worth reporting that are NOT violations of Redlock's guarantees: they happen only
/// outside its assumptions (a holder that stalls past its deadline), or are measurement noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoteKind {
    /// A counter write finished after its grant's window ended: the holder (process or network
    /// to the data node) stalled longer than the guard; row 10, not covered by Redlock.
    LateWrite,
    /// A lost update that involves a late or uncertain write (row 10, outside the assumptions).
    LostUpdateOutsideAssumptions,
    /// `acquire` returned after the lock's own deadline (the task was not scheduled in time);
    /// the window is empty and nothing was done under it.
    GrantReturnedExpired,
    /// A lost signal (`lost()` or `with_lock`'s cancellation) observed after the deadline by
    /// more than 10 ms: a scheduling delay of the observer; the window ends at the deadline.
    LostSignalLate,
    /// A grant whose window was never closed by the engine; closed at its deadline.
    UnclosedWindow,
}

impl NoteKind {
    /// A one-line description.
    pub fn describe(self) -> &'static str {
        match self {
            NoteKind::LateWrite => "write finished after its window (holder stall, row 10)",
            NoteKind::LostUpdateOutsideAssumptions => "lost update via a late/uncertain write",
            NoteKind::GrantReturnedExpired => "acquire returned after its own deadline",
            NoteKind::LostSignalLate => "lost signal observed > 10 ms after the deadline",
            NoteKind::UnclosedWindow => "window never closed (closed at deadline)",
        }
    }
}

/// One [`NoteKind`] occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// What was seen.
    pub kind: NoteKind,
    /// When it was recorded, from the checker's creation.
    pub at: Duration,
    /// Details.
    pub detail: String,
}

/// How a grant was obtained (for reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrantKind {
    /// `acquire` with retries.
    Acquire,
    /// `try_acquire`.
    TryAcquire,
    /// `acquire` of two resources at once.
    Multi,
    /// A lock kept alive in the background.
    KeepAlive,
    /// A `with_lock` section.
    WithLock,
    /// A lock left to expire without release (kept as a stale `Lock`).
    Abandoned,
    /// A lock taken while an older, stale lock of the resource is still around.
    Reacquire,
    /// A lock of a deterministic negative-control scenario.
    Control,
    /// A semaphore permit (its resource is the permit's slot).
    Permit,
    /// A lock with fencing tokens, whose holder writes to a fenced register.
    Fenced,
    /// A read share of a read-write lock (its resource is the reader's own key).
    Read,
    /// The write lock of a read-write lock.
    Write,
    /// A lock handed over as a lease and resumed (one grant: the same token).
    Lease,
}

/// Everything about one grant, for [`Checker::record_grant`](super::Checker::record_grant).
#[derive(Debug, Clone)]
pub struct GrantRecord {
    /// The client (any number that identifies it in reports).
    pub client: usize,
    /// How it was obtained.
    pub kind: GrantKind,
    /// The owner token.
    pub token: String,
    /// The resources held.
    pub resources: Vec<String>,
    /// The TTL asked for.
    pub ttl: Duration,
    /// `Lock::acquired_at`: the attempt's start. `None` when unknown (`with_lock`).
    pub t0: Option<Instant>,
    /// When the acquire returned (or, for `with_lock`, the closure started).
    pub granted_at: Instant,
    /// The lock's deadline as granted.
    pub deadline: Instant,
}

/// A value of the lost-update counter: `count:writer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataValue {
    /// How many increments produced it.
    pub count: u64,
    /// The write that stored it; 0 for the initial, absent value.
    pub writer: WriteId,
}

impl DataValue {
    /// The value of a counter that was never written.
    pub const INITIAL: DataValue = DataValue {
        count: 0,
        writer: 0,
    };

    /// Parses a stored value; an absent key is [`DataValue::INITIAL`]. `None` for garbage.
    pub fn parse(raw: Option<&str>) -> Option<DataValue> {
        let Some(raw) = raw else {
            return Some(DataValue::INITIAL);
        };
        let (count, writer) = raw.split_once(':')?;
        Some(DataValue {
            count: count.parse().ok()?,
            writer: writer.parse().ok()?,
        })
    }

    /// The value `writer` stores after reading `self`.
    pub fn next(self, writer: WriteId) -> DataValue {
        DataValue {
            count: self.count + 1,
            writer,
        }
    }

    /// The stored form, `count:writer`.
    pub fn encode(self) -> String {
        format!("{}:{}", self.count, self.writer)
    }
}

/// The smallest gap seen between one holder's window end and the next holder's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Margin {
    /// The resource.
    pub resource: String,
    /// `next.granted_at - prev.end` in nanoseconds (negative: the windows overlapped).
    pub nanos: i128,
}

impl fmt::Display for Margin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} ms ({})", self.nanos as f64 / 1e6, self.resource)
    }
}

/// What [`Checker::finish`](super::Checker::finish) found.
#[derive(Debug, Clone)]
pub struct CheckerReport {
    /// Grants recorded.
    pub grants: usize,
    /// Windows checked for overlap (one per grant and resource, empty ones excluded).
    pub windows: usize,
    /// Windows with at least one counter write completed inside them.
    pub verified_sections: usize,
    /// Counter writes acknowledged.
    pub writes_completed: usize,
    /// Counter writes with an unknown outcome.
    pub writes_uncertain: usize,
    /// Every violation, in the order found.
    pub violations: Vec<Violation>,
    /// Every note, in the order found.
    pub notes: Vec<Note>,
    /// How many times each check ran.
    pub checks: BTreeMap<&'static str, u64>,
    /// The smallest safety margin between consecutive windows of a resource.
    pub min_margin: Option<Margin>,
    /// The largest lag seen between an extend call's start and the start its deadline counts
    /// from (should be microseconds).
    pub max_extend_lag: Option<Duration>,
    /// The largest delay seen between a deadline and the observed lost signal.
    pub max_lost_lateness: Option<Duration>,
}

impl CheckerReport {
    /// Violations of one kind.
    pub fn count(&self, kind: ViolationKind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    /// Notes of one kind.
    pub fn note_count(&self, kind: NoteKind) -> usize {
        self.notes.iter().filter(|n| n.kind == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_values_round_trip() {
        assert_eq!(DataValue::parse(None), Some(DataValue::INITIAL));
        let v = DataValue::INITIAL.next(42);
        assert_eq!(DataValue::parse(Some(&v.encode())), Some(v));
        assert_eq!(DataValue::parse(Some("x")), None);
    }
}
