//! The recording API: grants (with the checks that need nothing but the grant: S2 deadline,
//! S7 token uniqueness), window ends, lost signals, extends (S5 deadline), counter writes and
//! majority outages.
//!
//! Owns what is checked at the moment something is recorded. Must not look at the whole
//! history (that is `finish`'s job, in `windows.rs` and `counter.rs`) nor at node states (that
//! is `inspections.rs`).

use std::time::Duration;

use tokio::time::Instant;

use fredlock::{Lock, LockHandle};

use super::{
    fmt_dur, Checker, DataValue, Grant, GrantId, GrantKind, GrantRecord, NoteKind, Outage,
    ViolationKind, Write, WriteId, WriteState, EXTEND_LAG_ALLOWED,
};

/// Lost-signal lateness above this is noted (scheduling of the observer).
const LOST_LATE_NOTE: Duration = Duration::from_millis(10);

impl Checker {
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
        // t0 <= started_at, so the deadline (t0 plus validity) <= started_at plus validity.
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
            // A bound past the end of time (a TTL near Duration::MAX) bounds nothing.
            let bound = t0.checked_add(self.validity(record.ttl));
            if bound.is_some_and(|b| record.deadline > b) || record.t0 > Some(record.granted_at) {
                let detail = format!(
                    "grant #{id} client {} {:?}: t0 {} granted {} deadline {} > bound {} (ttl {:?}, drift factor {})",
                    record.client,
                    record.resources,
                    self.rel(t0),
                    self.rel(record.granted_at),
                    self.rel(record.deadline),
                    bound.map_or("none".to_string(), |b| self.rel(b)),
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::test_support::{grant, inspection, ms, TTL};
    use super::*;

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
}
