//! A safety checker for Redlock histories: every grant's window on one monotonic clock, a
//! lost-update counter, foreign keys, revival and quorum checks, outages.
//!
//! The checker is pure bookkeeping: it never talks to Redis. Whoever drives the locks (the
//! torture engine in [`super::torture`], or a test) records what happened, and
//! [`Checker::finish`] decides, from the records alone, which safety properties were broken.
//! Everything is recorded on ONE clock, `tokio::time::Instant`, in one process, so windows of
//! different clients compare directly.
//!
//! # What a window is
//! A grant's window is `[granted_at, end]`: `granted_at` is when `acquire` RETURNED (so every
//! node that granted had executed its `SET` before it), `end` is when the holder stopped acting:
//! the start of its release call or its deadline, whichever came first (or when its lost signal
//! fired, or its `with_lock` closure stopped). Both ends are measured conservatively for the
//! library: the true grant happened before `granted_at`, the true "stopped acting" after `end`
//! only if the holder acted past its deadline, which the engine avoids (see below). Under
//! Redlock's assumptions a later holder's `SET` on a node shared with an earlier holder can only
//! succeed after that holder's key was deleted (after its release started) or expired (at least
//! `ttl` after its `t0`, which is after its deadline), so windows of one resource never overlap.
//!
//! # The lost-update counter
//! Each critical section does a NON-atomic read-modify-write on a data node nobody faults:
//! `GET` the counter, pause, `SET` it to the value plus one. Each write stores `count:writer`,
//! where `writer` is a fresh [`WriteId`], so every value read names the write that produced it.
//! The writes of one resource then form a tree (each write's parent is the write it read). A
//! serial history is a chain; two writes that read the same value (two children of one node) is
//! a lost update, attributed to the two grants that did it. A write whose outcome is unknown
//! (the future was cancelled or the `SET` failed) is "uncertain": it counts as landed only if
//! someone later read its value or it is the final value.
//!
//! A write that FINISHED after its grant's window ended means the holder acted past its deadline
//! (a process or network stall longer than the engine's guard): that is row 10 of the fault
//! matrix, outside Redlock's guarantees, and is reported as a [`NoteKind`], not a violation. A
//! lost update between two writes that both ran inside their windows is a violation; it can
//! only happen when the windows overlap, which is reported too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use fredlock::Inspection;
use fredlock::{Lock, LockHandle};

/// Identifies one grant (one acquisition) recorded by a [`Checker`].
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
    /// Row 9: a client task panicked (the library must return errors, never panic).
    Panic,
    /// The engine could not keep the run's set-up (a node did not restart, keys could not be
    /// planted or listed): not a library violation, but the run proves nothing, so it fails.
    Engine,
}

impl ViolationKind {
    /// Every kind, in report order.
    pub const ALL: [ViolationKind; 15] = [
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
}

/// Everything about one grant, for [`Checker::record_grant`].
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

/// How a counter write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteState {
    /// `begin_write` recorded, outcome not yet known.
    InFlight,
    /// The `SET` was acknowledged at this instant.
    Completed(Instant),
    /// Outcome unknown (cancelled, or the `SET` failed): it may or may not have landed.
    Uncertain,
}

#[derive(Debug, Clone)]
struct Grant {
    record: GrantRecord,
    /// The latest deadline (moved by extensions).
    deadline: Instant,
    end: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Write {
    grant: GrantId,
    resource: String,
    read: DataValue,
    read_at: Instant,
    state: WriteState,
}

#[derive(Debug, Clone)]
struct Outage {
    start: Instant,
    end: Instant,
    label: String,
}

#[derive(Debug, Default)]
struct State {
    grants: Vec<Grant>,
    writes: Vec<Write>,
    outages: Vec<Outage>,
    tokens: HashSet<String>,
    violations: Vec<Violation>,
    notes: Vec<Note>,
    checks: BTreeMap<&'static str, u64>,
    max_extend_lag: Option<Duration>,
    max_lost_lateness: Option<Duration>,
    events: Vec<(Instant, String)>,
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

/// What [`Checker::finish`] found.
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

/// Extend deadlines may count from up to this long after the caller's `Instant::now()` taken
/// just before calling `extend`: the library reads its own clock in the same poll, so the real
/// lag is microseconds; 10 ms leaves room for the OS preempting the thread in between, while a
/// deadline counted from the replies (the bug this catches) is late by a round trip, which the
/// latency faults make tens to hundreds of milliseconds.
pub const EXTEND_LAG_ALLOWED: Duration = Duration::from_millis(10);

/// Lost-signal lateness above this is noted (scheduling of the observer).
const LOST_LATE_NOTE: Duration = Duration::from_millis(10);

/// Records a run's history and checks it. Cheap to share behind an `Arc`; every method takes
/// `&self` (one internal mutex, held only for bookkeeping, never across an `.await`).
#[derive(Debug)]
pub struct Checker {
    epoch: Instant,
    drift_factor: f64,
    state: Mutex<State>,
}

impl Checker {
    /// A checker for locks built with this drift factor (the S2 bound depends on it).
    pub fn new(drift_factor: f64) -> Checker {
        Checker {
            epoch: Instant::now(),
            drift_factor,
            state: Mutex::new(State::default()),
        }
    }

    /// The instant times in reports are relative to.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The validity a lock of this TTL gets: `ttl - (ttl * drift_factor + 2 ms)`, computed
    /// exactly as the library documents it.
    pub fn validity(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(ttl.mul_f64(self.drift_factor) + Duration::from_millis(2))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the records inconsistent enough to matter.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rel(&self, t: Instant) -> String {
        match t.checked_duration_since(self.epoch) {
            Some(d) => format!("+{:.3}s", d.as_secs_f64()),
            None => format!("-{:.3}s", (self.epoch - t).as_secs_f64()),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn push_violation(&self, s: &mut State, kind: ViolationKind, detail: String) {
        s.violations.push(Violation {
            kind,
            at: self.now(),
            detail,
        });
    }

    fn push_note(&self, s: &mut State, kind: NoteKind, detail: String) {
        s.notes.push(Note {
            kind,
            at: self.now(),
            detail,
        });
    }

    /// Records a violation found by the caller (for checks that need Redis, such as a foreign
    /// grant or a panicked task).
    pub fn violation(&self, kind: ViolationKind, detail: impl Into<String>) {
        let mut s = self.state();
        self.push_violation(&mut s, kind, detail.into());
    }

    /// Records a note (see [`NoteKind`]).
    pub fn note(&self, kind: NoteKind, detail: impl Into<String>) {
        let mut s = self.state();
        self.push_note(&mut s, kind, detail.into());
    }

    /// Logs something that happened (a fault began or ended, the engine released a lock): an
    /// overlap's report lists the events around it, to find its cause.
    pub fn event(&self, what: impl Into<String>) {
        self.state().events.push((Instant::now(), what.into()));
    }

    /// The events logged from `from` to `to`, as `+s what` lines (for a violation's detail).
    pub fn events(&self, from: Instant, to: Instant) -> String {
        let s = self.state();
        self.events_between(&s, from, to)
    }

    /// Events from `from` to `to`, as `+s what` lines.
    fn events_between(&self, s: &State, from: Instant, to: Instant) -> String {
        let lines: Vec<String> = s
            .events
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(at, what)| format!("{} {what}", self.rel(*at)))
            .collect();
        if lines.is_empty() {
            "no events".to_string()
        } else {
            lines.join("; ")
        }
    }

    /// Counts one run of a named check (for the report's "checks performed").
    pub fn count_check(&self, name: &'static str) {
        *self.state().checks.entry(name).or_default() += 1;
    }

    /// Records a grant from a [`Lock`] the caller just got. `granted_at` is when the acquire
    /// returned. Checks S2 and token uniqueness at once.
    pub fn grant(
        &self,
        client: usize,
        lock: &Lock,
        kind: GrantKind,
        granted_at: Instant,
    ) -> GrantId {
        self.record_grant(GrantRecord {
            client,
            kind,
            token: lock.token().to_string(),
            resources: lock.resources().to_vec(),
            ttl: lock.ttl(),
            t0: Some(lock.acquired_at()),
            granted_at,
            deadline: lock.deadline(),
        })
    }

    /// Records a grant seen through a [`LockHandle`] (a `with_lock` closure): the attempt's
    /// start is unknown, so S2 is checked against `started_at`, which is later than it (a
    /// weaker but still sound bound).
    pub fn grant_handle(
        &self,
        client: usize,
        handle: &LockHandle,
        ttl: Duration,
        kind: GrantKind,
        started_at: Instant,
    ) -> GrantId {
        let id = self.record_grant(GrantRecord {
            client,
            kind,
            token: handle.token().to_string(),
            resources: handle.resources().to_vec(),
            ttl,
            t0: None,
            granted_at: started_at,
            deadline: handle.deadline(),
        });
        // t0 <= started_at, so deadline = t0 + validity <= started_at + validity.
        let bound = started_at + self.validity(ttl);
        if handle.deadline() > bound {
            self.violation(
                ViolationKind::Deadline,
                format!(
                    "grant #{id} (with_lock): deadline {} after closure start + validity {}",
                    self.rel(handle.deadline()),
                    self.rel(bound)
                ),
            );
        }
        id
    }

    /// Records a grant. Checks S2 (when `t0` is known) and that the token is new.
    pub fn record_grant(&self, record: GrantRecord) -> GrantId {
        let mut s = self.state();
        let id = s.grants.len() as GrantId + 1;
        *s.checks.entry("S2 deadline").or_default() += 1;
        if let Some(t0) = record.t0 {
            // S2, with the library's own arithmetic: validity = ttl - (ttl * df + 2 ms).
            let bound = t0 + self.validity(record.ttl);
            if record.deadline > bound || record.t0 > Some(record.granted_at) {
                let detail = format!(
                    "grant #{id} client {} {:?}: t0 {} granted {} deadline {} > bound {} (ttl {:?}, drift factor {})",
                    record.client,
                    record.resources,
                    self.rel(t0),
                    self.rel(record.granted_at),
                    self.rel(record.deadline),
                    self.rel(bound),
                    record.ttl,
                    self.drift_factor
                );
                self.push_violation(&mut s, ViolationKind::Deadline, detail);
            }
        }
        if record.granted_at >= record.deadline {
            let detail = format!(
                "grant #{id} client {}: returned {} after its deadline",
                record.client,
                fmt_dur(record.granted_at - record.deadline)
            );
            self.push_note(&mut s, NoteKind::GrantReturnedExpired, detail);
        }
        if !s.tokens.insert(record.token.clone()) {
            let detail = format!("grant #{id}: token {} seen before", record.token);
            self.push_violation(&mut s, ViolationKind::DuplicateToken, detail);
        }
        let deadline = record.deadline;
        s.grants.push(Grant {
            record,
            deadline,
            end: None,
        });
        id
    }

    /// Closes a grant's window: the holder stopped acting at `stopped_at`; `deadline` is the
    /// lock's final deadline (after extensions). The window ends at the earlier of the two.
    pub fn close(&self, grant: GrantId, stopped_at: Instant, deadline: Instant) {
        let mut s = self.state();
        if let Some(g) = s.grants.get_mut(grant as usize - 1) {
            g.deadline = g.deadline.max(deadline);
            g.end = Some(stopped_at.min(deadline));
        }
    }

    /// Records how late a lost signal was observed after the deadline (`None`: on time).
    pub fn lost_signal(&self, grant: GrantId, observed_at: Instant, deadline: Instant) {
        let mut s = self.state();
        *s.checks.entry("S8 lost signal").or_default() += 1;
        let late = observed_at.saturating_duration_since(deadline);
        s.max_lost_lateness = Some(s.max_lost_lateness.unwrap_or_default().max(late));
        if late > LOST_LATE_NOTE {
            let kind = s.grants.get(grant as usize - 1).map(|g| g.record.kind);
            let detail = format!(
                "grant #{grant} ({kind:?}): lost signal observed {} after the deadline {}",
                fmt_dur(late),
                self.rel(deadline)
            );
            self.push_note(&mut s, NoteKind::LostSignalLate, detail);
        }
    }

    /// Checks one explicit `Lock::extend` call. `call_start` was read just before calling it,
    /// `old_deadline` is the deadline before it; `new_deadline` is `Some` when it returned `Ok`.
    pub fn extended(
        &self,
        grant: GrantId,
        call_start: Instant,
        old_deadline: Instant,
        ttl: Duration,
        new_deadline: Option<Instant>,
    ) {
        let mut s = self.state();
        *s.checks.entry("S5 extend").or_default() += 1;
        let Some(new_deadline) = new_deadline else {
            return;
        };
        if call_start >= old_deadline {
            let detail = format!(
                "grant #{grant}: extend called {} after the deadline {} returned Ok",
                fmt_dur(call_start - old_deadline),
                self.rel(old_deadline)
            );
            self.push_violation(&mut s, ViolationKind::StaleOpSucceeded, detail);
        }
        let from = new_deadline
            .checked_sub(self.validity(ttl))
            .unwrap_or(new_deadline);
        let lag = from.saturating_duration_since(call_start);
        s.max_extend_lag = Some(s.max_extend_lag.unwrap_or_default().max(lag));
        if lag > EXTEND_LAG_ALLOWED {
            let detail = format!(
                "grant #{grant}: extend deadline {} counts from {} after the call started (ttl {:?})",
                self.rel(new_deadline),
                fmt_dur(lag),
                ttl
            );
            self.push_violation(&mut s, ViolationKind::ExtendDeadline, detail);
        }
        if let Some(g) = s.grants.get_mut(grant as usize - 1) {
            g.deadline = g.deadline.max(new_deadline);
        }
    }

    /// Starts a counter write: `read` was read at `read_at` (before the GET was sent). Returns
    /// the write's id; store `read.next(id)`, then call [`complete_write`](Self::complete_write)
    /// or [`uncertain_write`](Self::uncertain_write).
    pub fn begin_write(
        &self,
        grant: GrantId,
        resource: &str,
        read: DataValue,
        read_at: Instant,
    ) -> WriteId {
        let mut s = self.state();
        s.writes.push(Write {
            grant,
            resource: resource.to_string(),
            read,
            read_at,
            state: WriteState::InFlight,
        });
        s.writes.len() as WriteId
    }

    /// The write's `SET` was acknowledged at `done_at`.
    pub fn complete_write(&self, write: WriteId, done_at: Instant) {
        if let Some(w) = self.state().writes.get_mut(write as usize - 1) {
            w.state = WriteState::Completed(done_at);
        }
    }

    /// The write's outcome is unknown (cancelled or failed).
    pub fn uncertain_write(&self, write: WriteId) {
        if let Some(w) = self.state().writes.get_mut(write as usize - 1) {
            if w.state == WriteState::InFlight {
                w.state = WriteState::Uncertain;
            }
        }
    }

    /// Records that grants had to fail from `start` to `end` (a majority down, partitioned or
    /// frozen): any grant whose attempt started after `start` and returned before `end` is a
    /// violation.
    pub fn outage(&self, start: Instant, end: Instant, label: impl Into<String>) {
        let mut s = self.state();
        if end > start {
            s.outages.push(Outage {
                start,
                end,
                label: label.into(),
            });
        }
    }

    /// S1: right after `grant`, `inspection` must show its token on a quorum, counting nodes
    /// that did not answer or are not `eligible` (restarted, paused since) as possibly holding
    /// it. Only meaningful if the inspection finished before the deadline (`in_time`).
    pub fn check_quorum(
        &self,
        grant: GrantId,
        token: &str,
        inspection: &Inspection,
        eligible: &[bool],
        in_time: bool,
    ) {
        if !in_time {
            return;
        }
        let mut s = self.state();
        *s.checks.entry("S1 quorum inspection").or_default() += 1;
        let (mut present, mut unknown) = (0, 0);
        for (i, n) in inspection.nodes.iter().enumerate() {
            match &n.state {
                _ if !eligible.get(i).copied().unwrap_or(false) => unknown += 1,
                Ok(Some(h)) if h.token == token => present += 1,
                Ok(_) => {}
                Err(_) => unknown += 1,
            }
        }
        if present + unknown < inspection.quorum {
            let detail = format!(
                "grant #{grant} {}: token on {present} node(s), {unknown} unknown, quorum {}: {}",
                inspection.resource,
                inspection.quorum,
                describe_inspection(inspection, token)
            );
            self.push_violation(&mut s, ViolationKind::NoQuorum, detail);
        }
    }

    /// S5: after an extend (or release) of `token`, it must not be back on any node where
    /// `before` showed it absent. `eligible[i]` false skips node `i` (a node that was paused,
    /// killed or restarted since the token was first set can still receive that old `SET` late,
    /// which is not a revival by extend).
    pub fn check_revival(
        &self,
        what: &str,
        token: &str,
        before: &Inspection,
        after: &Inspection,
        eligible: &[bool],
    ) {
        let mut s = self.state();
        *s.checks.entry("S5 revival").or_default() += 1;
        for (i, (b, a)) in before.nodes.iter().zip(&after.nodes).enumerate() {
            if !eligible.get(i).copied().unwrap_or(false) {
                continue;
            }
            let absent_before = match &b.state {
                Ok(None) => true,
                Ok(Some(h)) => h.token != token,
                Err(_) => false,
            };
            let present_after = matches!(&a.state, Ok(Some(h)) if h.token == token);
            if absent_before && present_after {
                let detail = format!(
                    "{what}: token {token} of {} absent on node {i} ({}) before, present after: before [{}] after [{}]",
                    before.resource,
                    b.node,
                    describe_inspection(before, token),
                    describe_inspection(after, token)
                );
                self.push_violation(&mut s, ViolationKind::Revival, detail);
            }
        }
    }

    /// S4: another holder's `token` (a live lock) must still be wherever `before` showed it,
    /// on `eligible` nodes that answered `after`. Call only while that holder's lock is valid.
    pub fn check_holder_intact(
        &self,
        what: &str,
        token: &str,
        before: &Inspection,
        after: &Inspection,
        eligible: &[bool],
    ) {
        let mut s = self.state();
        *s.checks.entry("S4 holder intact").or_default() += 1;
        for (i, (b, a)) in before.nodes.iter().zip(&after.nodes).enumerate() {
            if !eligible.get(i).copied().unwrap_or(false) {
                continue;
            }
            let present_before = matches!(&b.state, Ok(Some(h)) if h.token == token);
            let gone_after = match &a.state {
                Ok(None) => true,
                Ok(Some(h)) => h.token != token,
                Err(_) => false,
            };
            if present_before && gone_after {
                let detail = format!(
                    "{what}: holder's token {token} of {} deleted on node {i} ({}): before [{}] after [{}]",
                    before.resource,
                    b.node,
                    describe_inspection(before, token),
                    describe_inspection(after, token)
                );
                self.push_violation(&mut s, ViolationKind::ForeignKeyDeleted, detail);
            }
        }
    }

    /// S4: a foreign value (not a fredlock token of ours) found on node `node` must still be
    /// there, unchanged, with at least `min_ttl` left (an extend must not PEXPIRE someone
    /// else's key either). `found` is `(value, pttl)`, `None` when the key is missing.
    pub fn check_foreign_value(
        &self,
        what: &str,
        node: usize,
        key: &str,
        expected: &str,
        found: Option<(&str, Option<Duration>)>,
        min_ttl: Duration,
    ) {
        let mut s = self.state();
        *s.checks.entry("S4 foreign key").or_default() += 1;
        let ok = match found {
            Some((value, ttl)) => value == expected && ttl.is_none_or(|t| t >= min_ttl),
            None => false,
        };
        if !ok {
            let detail = format!(
                "{what}: key {key} on node {node}: expected {expected:?} with >= {min_ttl:?} left, found {found:?}"
            );
            self.push_violation(&mut s, ViolationKind::ForeignKeyDeleted, detail);
        }
    }

    /// Decides. `final_values` maps each resource whose counter was written to the counter's
    /// raw value on the data node at the end (`None`: absent). Windows never closed are closed
    /// at their deadline (noted).
    pub fn finish(&self, final_values: &HashMap<String, Option<String>>) -> CheckerReport {
        let mut s = self.state();
        // Close what the engine left open, conservatively at the deadline.
        let mut unclosed = Vec::new();
        for (i, g) in s.grants.iter_mut().enumerate() {
            if g.end.is_none() {
                g.end = Some(g.deadline);
                unclosed.push(i + 1);
            }
        }
        for id in unclosed {
            self.push_note(
                &mut s,
                NoteKind::UnclosedWindow,
                format!("grant #{id} closed at its deadline"),
            );
        }
        let mut found: Vec<(ViolationKind, String)> = Vec::new();
        let mut notes: Vec<(NoteKind, String)> = Vec::new();

        // (a) Overlaps, and the smallest margin, per resource.
        let mut per_resource: BTreeMap<&str, Vec<(GrantId, Instant, Instant)>> = BTreeMap::new();
        for (i, g) in s.grants.iter().enumerate() {
            let end = g.end.unwrap_or(g.deadline);
            for r in &g.record.resources {
                if end > g.record.granted_at {
                    per_resource.entry(r.as_str()).or_default().push((
                        i as GrantId + 1,
                        g.record.granted_at,
                        end,
                    ));
                }
            }
        }
        let mut windows = 0;
        let mut min_margin: Option<Margin> = None;
        for (resource, list) in per_resource.iter_mut() {
            list.sort_by_key(|w| (w.1, w.0));
            windows += list.len();
            let mut cur: Option<(GrantId, Instant, Instant)> = None;
            for &w in list.iter() {
                if let Some(c) = cur {
                    let nanos = signed_nanos(w.1, c.2);
                    if min_margin.as_ref().is_none_or(|m| nanos < m.nanos) {
                        min_margin = Some(Margin {
                            resource: resource.to_string(),
                            nanos,
                        });
                    }
                    if w.1 < c.2 {
                        let (a, b) = (&s.grants[c.0 as usize - 1], &s.grants[w.0 as usize - 1]);
                        found.push((
                            ViolationKind::Overlap,
                            format!(
                                "{resource}: grant #{} (client {}, {:?}, token {}) window [{}, {}] overlaps grant #{} (client {}, {:?}, token {}) window [{}, {}] by {}",
                                c.0, a.record.client, a.record.kind, a.record.token, self.rel(c.1), self.rel(c.2),
                                w.0, b.record.client, b.record.kind, b.record.token, self.rel(w.1), self.rel(w.2),
                                fmt_dur(c.2 - w.1)
                            ) + &format!(
                                ". Events from 1 s before the first grant's t0: {}",
                                self.events_between(
                                    &s,
                                    a.record.t0.unwrap_or(c.1).checked_sub(Duration::from_secs(1)).unwrap_or(c.1),
                                    c.2.max(w.2),
                                )
                            ),
                        ));
                    }
                }
                if cur.is_none_or(|c| w.2 > c.2) {
                    cur = Some(w);
                }
            }
        }

        // S1: grants inside a majority outage.
        for (i, g) in s.grants.iter().enumerate() {
            let Some(t0) = g.record.t0 else { continue };
            for o in &s.outages {
                if t0 >= o.start && g.record.granted_at <= o.end {
                    found.push((
                        ViolationKind::GrantDuringOutage,
                        format!(
                            "grant #{} client {} {:?}: attempt {}..{} inside outage {} [{}, {}]",
                            i + 1,
                            g.record.client,
                            g.record.resources,
                            self.rel(t0),
                            self.rel(g.record.granted_at),
                            o.label,
                            self.rel(o.start),
                            self.rel(o.end)
                        ),
                    ));
                }
            }
        }

        // (c) The lost-update counter.
        let mut verified: HashSet<GrantId> = HashSet::new();
        let mut completed = 0;
        let mut uncertain = 0;
        let mut by_resource: BTreeMap<&str, Vec<WriteId>> = BTreeMap::new();
        for (i, w) in s.writes.iter().enumerate() {
            by_resource
                .entry(w.resource.as_str())
                .or_default()
                .push(i as WriteId + 1);
        }
        // Every write's timing against its own grant's window.
        let in_window = |w: &Write| -> Option<bool> {
            let g = &s.grants[w.grant as usize - 1];
            match w.state {
                WriteState::Completed(done) => {
                    Some(w.read_at >= g.record.granted_at && done <= g.end.unwrap_or(g.deadline))
                }
                _ => None,
            }
        };
        for (i, w) in s.writes.iter().enumerate() {
            match (w.state, in_window(w)) {
                (WriteState::Completed(done), Some(inside)) => {
                    completed += 1;
                    if inside {
                        verified.insert(w.grant);
                    } else {
                        let g = &s.grants[w.grant as usize - 1];
                        notes.push((
                            NoteKind::LateWrite,
                            format!(
                                "write #{} of grant #{} ({}): read {} done {}, window [{}, {}]",
                                i + 1,
                                w.grant,
                                w.resource,
                                self.rel(w.read_at),
                                self.rel(done),
                                self.rel(g.record.granted_at),
                                self.rel(g.end.unwrap_or(g.deadline))
                            ),
                        ));
                    }
                }
                _ => uncertain += 1,
            }
        }
        for (resource, ids) in &by_resource {
            let write = |id: WriteId| &s.writes[id as usize - 1];
            let final_raw = final_values.get(*resource).cloned().flatten();
            let final_value = DataValue::parse(final_raw.as_deref());
            // Which writes are known to have landed.
            let mut landed: HashSet<WriteId> = HashSet::new();
            for &id in ids {
                if matches!(write(id).state, WriteState::Completed(_)) {
                    landed.insert(id);
                }
                let parent = write(id).read.writer;
                if parent != 0 {
                    landed.insert(parent);
                }
            }
            if let Some(v) = final_value {
                if v.writer != 0 {
                    landed.insert(v.writer);
                }
            }
            // Consistency: every value read (and the final one) must be one a write stored.
            let mut reads: Vec<(DataValue, Option<WriteId>)> =
                ids.iter().map(|&id| (write(id).read, Some(id))).collect();
            match final_value {
                Some(v) => reads.push((v, None)),
                None => found.push((
                    ViolationKind::LostUpdate,
                    format!("{resource}: final counter value {final_raw:?} is not count:writer"),
                )),
            }
            for (v, by) in reads {
                let consistent = if v.writer == 0 {
                    v.count == 0
                } else {
                    s.writes
                        .get(v.writer as usize - 1)
                        .is_some_and(|w| w.resource == *resource && w.read.count + 1 == v.count)
                };
                if !consistent {
                    found.push((
                        ViolationKind::LostUpdate,
                        format!(
                            "{resource}: value {} read by {} was never written",
                            v.encode(),
                            by.map_or("the final check".to_string(), |id| format!("write #{id}"))
                        ),
                    ));
                }
            }
            // Two landed writes that read the same value: one overwrote the other.
            let mut children: BTreeMap<WriteId, Vec<WriteId>> = BTreeMap::new();
            for &id in ids {
                if landed.contains(&id) {
                    children.entry(write(id).read.writer).or_default().push(id);
                }
            }
            for (parent, kids) in &children {
                if kids.len() < 2 {
                    continue;
                }
                let all_inside = kids.iter().all(|&k| in_window(write(k)) == Some(true));
                let who: Vec<String> = kids
                    .iter()
                    .map(|&k| {
                        let w = write(k);
                        let g = &s.grants[w.grant as usize - 1];
                        format!(
                            "write #{k} (grant #{} client {} token {}, read {}, {})",
                            w.grant,
                            g.record.client,
                            g.record.token,
                            self.rel(w.read_at),
                            match (w.state, in_window(w)) {
                                (WriteState::Completed(d), Some(true)) =>
                                    format!("done {} in window", self.rel(d)),
                                (WriteState::Completed(d), _) =>
                                    format!("done {} AFTER its window", self.rel(d)),
                                _ => "outcome unknown".to_string(),
                            }
                        )
                    })
                    .collect();
                let detail = format!(
                    "{resource}: {} writes read the value of write #{parent}: {}",
                    kids.len(),
                    who.join("; ")
                );
                if all_inside {
                    found.push((ViolationKind::LostUpdate, detail));
                } else {
                    notes.push((NoteKind::LostUpdateOutsideAssumptions, detail));
                }
            }
            // The final count against the writes: completed ones all landed, uncertain ones may.
            if let Some(v) = final_value {
                let done = ids
                    .iter()
                    .filter(|&&id| matches!(write(id).state, WriteState::Completed(_)))
                    .count() as u64;
                let maybe = ids.len() as u64 - done;
                let known_uncertain = ids
                    .iter()
                    .filter(|&&id| {
                        !matches!(write(id).state, WriteState::Completed(_)) && landed.contains(&id)
                    })
                    .count() as u64;
                if v.count < done + known_uncertain || v.count > done + maybe {
                    let fewer = v.count < done + known_uncertain;
                    let detail = format!(
                        "{resource}: final counter {} but {done} writes completed, {known_uncertain} uncertain ones known to have landed, {maybe} uncertain in all ({})",
                        v.count,
                        if fewer { "fewer: updates lost" } else { "more: impossible" }
                    );
                    // Fewer is the definition of a lost update; if late writes exist it is
                    // explained by them (already noted), otherwise it is a violation.
                    let explained =
                        fewer && ids.iter().any(|&id| in_window(write(id)) != Some(true));
                    if explained {
                        notes.push((NoteKind::LostUpdateOutsideAssumptions, detail));
                    } else {
                        found.push((ViolationKind::LostUpdate, detail));
                    }
                }
            }
        }
        *s.checks.entry("(c) counter writes").or_default() += s.writes.len() as u64;
        *s.checks.entry("(a) windows").or_default() += windows as u64;
        for (kind, detail) in found {
            self.push_violation(&mut s, kind, detail);
        }
        for (kind, detail) in notes {
            self.push_note(&mut s, kind, detail);
        }
        CheckerReport {
            grants: s.grants.len(),
            windows,
            verified_sections: verified.len(),
            writes_completed: completed,
            writes_uncertain: uncertain,
            violations: s.violations.clone(),
            notes: s.notes.clone(),
            checks: s.checks.clone(),
            min_margin,
            max_extend_lag: s.max_extend_lag,
            max_lost_lateness: s.max_lost_lateness,
        }
    }
}

/// `a - b` in nanoseconds, signed.
fn signed_nanos(a: Instant, b: Instant) -> i128 {
    if a >= b {
        (a - b).as_nanos() as i128
    } else {
        -((b - a).as_nanos() as i128)
    }
}

fn fmt_dur(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// `node: token@ttl` per node, marking `ours`.
fn describe_inspection(i: &Inspection, ours: &str) -> String {
    i.nodes
        .iter()
        .enumerate()
        .map(|(n, v)| match &v.state {
            Ok(None) => format!("{n}: -"),
            Ok(Some(h)) if h.token == ours => format!("{n}: OURS({:?})", h.ttl),
            Ok(Some(h)) => format!("{n}: {}({:?})", short(&h.token), h.ttl),
            Err(e) => format!("{n}: ERR {:?}", e.kind),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

#[cfg(test)]
mod tests {
    //! The checker must not be blind: each kind of violation, planted in a synthetic history,
    //! is found; a clean history has none.
    use super::*;
    use fredlock::{Holder, NodeView};
    use fredlock::{NodeError, NodeErrorKind};

    const TTL: Duration = Duration::from_millis(500);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn grant(c: &Checker, client: usize, token: &str, t0: Instant, granted: Duration) -> GrantId {
        c.record_grant(GrantRecord {
            client,
            kind: GrantKind::Acquire,
            token: token.into(),
            resources: vec!["r".into()],
            ttl: TTL,
            t0: Some(t0),
            granted_at: t0 + granted,
            deadline: t0 + c.validity(TTL),
        })
    }

    fn write(c: &Checker, g: GrantId, read: DataValue, at: Instant, done: Instant) -> DataValue {
        let id = c.begin_write(g, "r", read, at);
        c.complete_write(id, done);
        read.next(id)
    }

    fn finals(v: DataValue) -> HashMap<String, Option<String>> {
        HashMap::from([("r".to_string(), Some(v.encode()))])
    }

    fn inspection(states: Vec<Result<Option<&str>, ()>>) -> Inspection {
        Inspection {
            resource: "r".into(),
            quorum: states.len() / 2 + 1,
            nodes: states
                .into_iter()
                .enumerate()
                .map(|(i, s)| NodeView {
                    node: format!("n{i}"),
                    state: match s {
                        Ok(t) => Ok(t.map(|t| Holder {
                            token: t.into(),
                            ttl: Some(ms(100)),
                        })),
                        Err(()) => Err(NodeError {
                            node: format!("n{i}"),
                            kind: NodeErrorKind::Timeout,
                            message: String::new(),
                        }),
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn a_serial_history_is_clean_and_reports_its_margin() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        let a = grant(&c, 0, "a", t, ms(1));
        let v = write(&c, a, DataValue::INITIAL, t + ms(2), t + ms(3));
        c.close(a, t + ms(10), t + c.validity(TTL));
        let b = grant(&c, 1, "b", t + ms(11), ms(1));
        let v = write(&c, b, v, t + ms(13), t + ms(14));
        c.close(b, t + ms(20), t + ms(11) + c.validity(TTL));
        let r = c.finish(&finals(v));
        assert_eq!(r.violations, vec![], "{r:?}");
        assert_eq!(r.writes_completed, 2);
        assert_eq!(r.verified_sections, 2);
        assert_eq!(r.min_margin.unwrap().nanos, 2_000_000);
    }

    #[test]
    fn overlapping_windows_and_the_lost_update_are_found() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        let a = grant(&c, 0, "a", t, ms(1));
        let b = grant(&c, 1, "b", t + ms(5), ms(1));
        let a_read = DataValue::INITIAL;
        let v = write(&c, b, DataValue::INITIAL, t + ms(7), t + ms(8));
        write(&c, a, a_read, t + ms(2), t + ms(9));
        c.close(b, t + ms(10), t + ms(400));
        c.close(a, t + ms(11), t + ms(400));
        let r = c.finish(&finals(v));
        assert_eq!(r.count(ViolationKind::Overlap), 1, "{r:?}");
        assert!(r.count(ViolationKind::LostUpdate) >= 1, "{r:?}");
        assert!(r.min_margin.unwrap().nanos < 0);
    }

    #[test]
    fn a_late_write_is_a_note_not_a_violation() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        let a = grant(&c, 0, "a", t, ms(1));
        let deadline = t + c.validity(TTL);
        c.close(a, deadline, deadline);
        let b = grant(&c, 1, "b", deadline + ms(5), ms(1));
        // a read before its deadline, wrote long after it (a stalled holder); b read in between.
        let vb = write(
            &c,
            b,
            DataValue::INITIAL,
            deadline + ms(7),
            deadline + ms(8),
        );
        write(&c, a, DataValue::INITIAL, t + ms(2), deadline + ms(20));
        c.close(b, deadline + ms(30), deadline + ms(400));
        let r = c.finish(&finals(vb));
        assert_eq!(r.violations, vec![], "{r:?}");
        assert_eq!(r.note_count(NoteKind::LateWrite), 1);
        assert!(r.note_count(NoteKind::LostUpdateOutsideAssumptions) >= 1);
    }

    #[test]
    fn counts_that_do_not_match_are_found() {
        // Fewer: the final value is older than a completed write.
        let c = Checker::new(0.01);
        let t = Instant::now();
        let a = grant(&c, 0, "a", t, ms(1));
        let v1 = write(&c, a, DataValue::INITIAL, t + ms(2), t + ms(3));
        write(&c, a, v1, t + ms(4), t + ms(5));
        c.close(a, t + ms(10), t + ms(400));
        let r = c.finish(&finals(v1));
        assert!(r.count(ViolationKind::LostUpdate) >= 1, "{r:?}");
        // More: a final value nobody wrote.
        let c = Checker::new(0.01);
        let a = grant(&c, 0, "a", t, ms(1));
        write(&c, a, DataValue::INITIAL, t + ms(2), t + ms(3));
        c.close(a, t + ms(10), t + ms(400));
        let r = c.finish(&finals(DataValue {
            count: 7,
            writer: 99,
        }));
        assert!(r.count(ViolationKind::LostUpdate) >= 1, "{r:?}");
    }

    #[test]
    fn an_uncertain_write_may_land_or_not() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        let a = grant(&c, 0, "a", t, ms(1));
        let v = write(&c, a, DataValue::INITIAL, t + ms(2), t + ms(3));
        let u = c.begin_write(a, "r", v, t + ms(4));
        c.uncertain_write(u);
        c.close(a, t + ms(10), t + ms(400));
        // Not landed: final is v. Landed: final is v.next(u). Both are clean.
        assert_eq!(c.finish(&finals(v)).violations, vec![]);
        let c2 = Checker::new(0.01);
        let a = grant(&c2, 0, "a", t, ms(1));
        let v = write(&c2, a, DataValue::INITIAL, t + ms(2), t + ms(3));
        let u = c2.begin_write(a, "r", v, t + ms(4));
        c2.uncertain_write(u);
        c2.close(a, t + ms(10), t + ms(400));
        assert_eq!(c2.finish(&finals(v.next(u))).violations, vec![]);
    }

    #[test]
    fn a_late_deadline_is_found() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        c.record_grant(GrantRecord {
            client: 0,
            kind: GrantKind::Acquire,
            token: "a".into(),
            resources: vec!["r".into()],
            ttl: TTL,
            t0: Some(t),
            granted_at: t + ms(1),
            // One nanosecond past t0 + ttl - (ttl * 0.01 + 2 ms).
            deadline: t + TTL - ms(7) + Duration::from_nanos(1),
        });
        let r = c.finish(&HashMap::new());
        assert_eq!(r.count(ViolationKind::Deadline), 1, "{r:?}");
        // Exactly on the bound is fine.
        let c = Checker::new(0.01);
        c.record_grant(GrantRecord {
            client: 0,
            kind: GrantKind::Acquire,
            token: "a".into(),
            resources: vec!["r".into()],
            ttl: TTL,
            t0: Some(t),
            granted_at: t + ms(1),
            deadline: t + TTL - ms(7),
        });
        assert_eq!(c.finish(&HashMap::new()).violations, vec![]);
    }

    #[test]
    fn revival_and_deleted_holders_and_foreign_values_are_found() {
        let c = Checker::new(0.01);
        let before = inspection(vec![Ok(None), Ok(Some("other")), Err(())]);
        let after = inspection(vec![Ok(Some("t")), Ok(Some("t")), Ok(Some("t"))]);
        c.check_revival("test", "t", &before, &after, &[true, true, true]);
        let r = c.finish(&HashMap::new());
        // Nodes 0 and 1 revived; node 2 was unknown before.
        assert_eq!(r.count(ViolationKind::Revival), 2, "{r:?}");
        // Not eligible: skipped.
        let c = Checker::new(0.01);
        c.check_revival("test", "t", &before, &after, &[false, false, true]);
        assert_eq!(c.finish(&HashMap::new()).violations, vec![]);

        let c = Checker::new(0.01);
        let before = inspection(vec![Ok(Some("b")), Ok(Some("b")), Ok(None)]);
        let after = inspection(vec![Ok(None), Err(()), Ok(None)]);
        c.check_holder_intact("test", "b", &before, &after, &[true, true, true]);
        c.check_foreign_value("test", 0, "k", "owner", None, ms(1));
        c.check_foreign_value(
            "test",
            1,
            "k",
            "owner",
            Some(("owner", Some(ms(5)))),
            ms(10),
        );
        c.check_foreign_value("test", 2, "k", "owner", Some(("owner", None)), ms(10));
        let r = c.finish(&HashMap::new());
        assert_eq!(r.count(ViolationKind::ForeignKeyDeleted), 3, "{r:?}");
    }

    #[test]
    fn quorum_outage_extend_and_token_checks() {
        let c = Checker::new(0.01);
        let t = Instant::now();
        let g = grant(&c, 0, "t", t, ms(1));
        let i = inspection(vec![Ok(Some("t")), Ok(None), Ok(None)]);
        c.check_quorum(g, "t", &i, &[true; 3], true);
        let i = inspection(vec![Ok(Some("t")), Err(()), Ok(None)]);
        c.check_quorum(g, "t", &i, &[true; 3], true); // unknown may hold it: fine
        c.outage(t - ms(1), t + ms(5), "test");
        grant(&c, 1, "t", t + ms(10), ms(1)); // duplicate token, after the outage
        c.extended(
            g,
            t + c.validity(TTL),
            t + c.validity(TTL),
            TTL,
            Some(t + ms(900)),
        );
        c.extended(
            g,
            t + ms(2),
            t + ms(100),
            TTL,
            Some(t + ms(2) + c.validity(TTL)),
        );
        c.extended(
            g,
            t + ms(2),
            t + ms(100),
            TTL,
            Some(t + ms(60) + c.validity(TTL)),
        );
        c.close(g, t + ms(3), t + ms(400));
        let r = c.finish(&HashMap::new());
        assert_eq!(r.count(ViolationKind::NoQuorum), 1, "{r:?}");
        assert_eq!(r.count(ViolationKind::GrantDuringOutage), 1, "{r:?}");
        assert_eq!(r.count(ViolationKind::DuplicateToken), 1, "{r:?}");
        assert_eq!(r.count(ViolationKind::StaleOpSucceeded), 1, "{r:?}");
        assert_eq!(r.count(ViolationKind::ExtendDeadline), 1, "{r:?}");
    }

    #[test]
    fn data_values_round_trip() {
        assert_eq!(DataValue::parse(None), Some(DataValue::INITIAL));
        let v = DataValue::INITIAL.next(42);
        assert_eq!(DataValue::parse(Some(&v.encode())), Some(v));
        assert_eq!(DataValue::parse(Some("x")), None);
    }
}
