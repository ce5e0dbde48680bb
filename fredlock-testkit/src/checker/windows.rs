//! The invariants on windows, checked by [`finish`](super::Checker::finish): (a) S3, no two
//! windows of one resource overlap (and the smallest margin between consecutive ones); S1, no
//! grant whose attempt lies inside a majority outage. Also closes the windows the engine left
//! open, first, so that every grant has a window to check.
//!
//! Owns these two invariants and the overlap's report (with the events around it). Must not
//! record violations directly (they go to [`Findings`], which `finish` records in order) nor
//! look at the counter's writes (that is `counter.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{fmt_dur, Checker, Findings, GrantId, Margin, NoteKind, State, ViolationKind};

/// One grant's window on one resource: `(grant, granted_at, end)`.
type Window = (GrantId, Instant, Instant);

impl Checker {
    /// Closes what the engine left open, conservatively at the deadline (noted).
    pub(super) fn close_unclosed(&self, s: &mut State) {
        let mut unclosed = Vec::new();
        for (i, g) in s.grants.iter_mut().enumerate() {
            if g.end.is_none() {
                g.end = Some(g.deadline);
                unclosed.push(i + 1);
            }
        }
        for id in unclosed {
            self.push_note(
                s,
                NoteKind::UnclosedWindow,
                format!("grant #{id} closed at its deadline"),
            );
        }
    }

    /// (a) S3: overlapping windows, per resource. Returns how many windows were checked and the
    /// smallest margin seen between consecutive ones.
    pub(super) fn check_overlaps(
        &self,
        s: &State,
        found: &mut Findings,
    ) -> (usize, Option<Margin>) {
        let mut per_resource = windows_by_resource(s);
        let mut windows = 0;
        let mut min_margin: Option<Margin> = None;
        for (resource, list) in per_resource.iter_mut() {
            list.sort_by_key(|w| (w.1, w.0));
            windows += list.len();
            self.sweep(s, resource, list, &mut min_margin, found);
        }
        (windows, min_margin)
    }

    /// Walks one resource's windows in grant order against the latest end seen so far.
    fn sweep(
        &self,
        s: &State,
        resource: &str,
        list: &[Window],
        min_margin: &mut Option<Margin>,
        found: &mut Findings,
    ) {
        let mut cur: Option<Window> = None;
        for &w in list.iter() {
            if let Some(c) = cur {
                let nanos = signed_nanos(w.1, c.2);
                if min_margin.as_ref().is_none_or(|m| nanos < m.nanos) {
                    *min_margin = Some(Margin {
                        resource: resource.to_string(),
                        nanos,
                    });
                }
                if w.1 < c.2 {
                    let detail = self.overlap_detail(s, resource, c, w);
                    found.violations.push((ViolationKind::Overlap, detail));
                }
            }
            if cur.is_none_or(|c| w.2 > c.2) {
                cur = Some(w);
            }
        }
    }

    /// Both grants, their windows, the overlap, and the events from 1 s before the first one.
    fn overlap_detail(&self, s: &State, resource: &str, c: Window, w: Window) -> String {
        let (a, b) = (&s.grants[c.0 as usize - 1], &s.grants[w.0 as usize - 1]);
        format!(
            "{resource}: grant #{} (client {}, {:?}, token {}) window [{}, {}] overlaps grant #{} (client {}, {:?}, token {}) window [{}, {}] by {}",
            c.0, a.record.client, a.record.kind, a.record.token, self.rel(c.1), self.rel(c.2),
            w.0, b.record.client, b.record.kind, b.record.token, self.rel(w.1), self.rel(w.2),
            fmt_dur(c.2 - w.1)
        ) + &format!(
            ". Events from 1 s before the first grant's t0: {}",
            self.events_between(
                s,
                a.record.t0.unwrap_or(c.1).checked_sub(Duration::from_secs(1)).unwrap_or(c.1),
                c.2.max(w.2),
            )
        )
    }

    /// S1: grants inside a majority outage.
    pub(super) fn check_outages(&self, s: &State, found: &mut Findings) {
        for (i, g) in s.grants.iter().enumerate() {
            let Some(t0) = g.record.t0 else { continue };
            for o in &s.outages {
                if t0 >= o.start && g.record.granted_at <= o.end {
                    found.violations.push((
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
    }
}

/// Every non-empty window, by resource, in grant order.
fn windows_by_resource(s: &State) -> BTreeMap<&str, Vec<Window>> {
    let mut per_resource: BTreeMap<&str, Vec<Window>> = BTreeMap::new();
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
    per_resource
}

/// `a - b` in nanoseconds, signed.
fn signed_nanos(a: Instant, b: Instant) -> i128 {
    if a >= b {
        (a - b).as_nanos() as i128
    } else {
        -((b - a).as_nanos() as i128)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{finals, grant, ms, write, TTL};
    use super::super::{Checker, DataValue, ViolationKind};
    use tokio::time::Instant;

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
}
