// This file owns the checker's shared state (the records, behind one mutex), its small helpers,
// the public names of the module, and `finish`, which runs every invariant in order and builds
// the report. It must not hold an invariant's logic itself (each has a file of its own below) and
// must not talk to Redis: the checker is pure bookkeeping.
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
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

mod counter;
mod inspections;
mod modes;
mod record;
mod rwmode;
#[cfg(test)]
mod test_support;
mod types;
mod windows;

pub use types::{
    CheckerReport, DataValue, GrantId, GrantKind, GrantRecord, Margin, Note, NoteKind, Violation,
    ViolationKind, WriteId,
};

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
    /// Semaphore mode: grants that are permits, with their semaphore's name and permits.
    permits: Vec<(GrantId, String, usize)>,
    /// Read-write mode: grants of read-write locks, with the lock's name and whether it is the
    /// write lock.
    rw: Vec<(GrantId, String, bool)>,
    /// Fencing mode: each fenced grant's token per resource.
    fenced: Vec<(GrantId, String, u64)>,
    /// Fencing mode: each fenced register's accepted tokens, in the order it accepted them.
    registers: Vec<(String, Vec<u64>)>,
}

/// What the checks of [`Checker::finish`] found: recorded (in this order) once they all ran.
#[derive(Debug, Default)]
struct Findings {
    violations: Vec<(ViolationKind, String)>,
    notes: Vec<(NoteKind, String)>,
}

/// Extend deadlines may count from up to this long after the caller's `Instant::now()` taken
/// just before calling `extend`: the library reads its own clock in the same poll, so the real
/// lag is microseconds; 10 ms leaves room for the OS preempting the thread in between, while a
/// deadline counted from the replies (the bug this catches) is late by a round trip, which the
/// latency faults make tens to hundreds of milliseconds.
pub const EXTEND_LAG_ALLOWED: Duration = Duration::from_millis(10);

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

    /// Decides. `final_values` maps each resource whose counter was written to the counter's
    /// raw value on the data node at the end (`None`: absent). Windows never closed are closed
    /// at their deadline (noted).
    pub fn finish(&self, final_values: &HashMap<String, Option<String>>) -> CheckerReport {
        let mut s = self.state();
        // Close what the engine left open, conservatively at the deadline.
        self.close_unclosed(&mut s);
        let mut found = Findings::default();
        // (a) Overlaps, and the smallest margin, per resource.
        let (windows, min_margin) = self.check_overlaps(&s, &mut found);
        // S1: grants inside a majority outage.
        self.check_outages(&s, &mut found);
        // (c) The lost-update counter.
        let counter = self.check_counter(&s, final_values, &mut found);
        // Semaphore and fencing modes.
        self.check_modes(&s, &mut found);
        self.check_rw(&s, &mut found);
        *s.checks.entry("(c) counter writes").or_default() += s.writes.len() as u64;
        *s.checks.entry("(a) windows").or_default() += windows as u64;
        for (kind, detail) in found.violations {
            self.push_violation(&mut s, kind, detail);
        }
        for (kind, detail) in found.notes {
            self.push_note(&mut s, kind, detail);
        }
        CheckerReport {
            grants: s.grants.len(),
            windows,
            verified_sections: counter.verified,
            writes_completed: counter.completed,
            writes_uncertain: counter.uncertain,
            violations: s.violations.clone(),
            notes: s.notes.clone(),
            checks: s.checks.clone(),
            min_margin,
            max_extend_lag: s.max_extend_lag,
            max_lost_lateness: s.max_lost_lateness,
        }
    }
}

fn fmt_dur(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}
