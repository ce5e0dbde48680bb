//! The election mode's checker: what the participants' lossless role logs and the observers'
//! records must satisfy (see `election.rs` for the run that produces them).
//!
//! Owns: the records' shapes (`Window`, `Timeline`) and the checks. Must not: run anything or
//! know about faults; it sees only the records and the run's times.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// A leader window: participant, term, start, end. One per term a participant held, every
/// term included (recorded from `Election::role_changes`, which skips none).
pub(super) type Window = (usize, u64, Instant, Instant);
/// An observer's record: when it named which term (`None`: no leader).
pub(super) type Timeline = Vec<(Instant, Option<u64>)>;

/// When each named term is superseded, and whether a participant held it.
pub(super) type Superseded = BTreeMap<u64, (Instant, bool)>;

/// Leader windows never overlap, and term numbers grow in start order.
pub(super) fn check_leaders(windows: &[Window]) -> Vec<String> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| w.2);
    let mut out = Vec::new();
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.2 < a.3 {
            out.push(format!(
                "leader windows overlap: participant {} (term {}) until {:?} after participant {} (term {}) began",
                a.0, a.1, a.3 - b.2, b.0, b.1
            ));
        }
        if b.1 <= a.1 {
            out.push(format!(
                "term numbers do not grow: term {} began after term {}",
                b.1, a.1
            ));
        }
    }
    out
}

/// Per term any participant held or any observer named: when it is superseded.
///
/// - A term a participant held: at the next held term's start, or one TTL after its window
///   ended (a leader whose replies were held may have extended its keys just before it
///   stepped down), whichever comes first.
/// - A term no participant held that an observer named: a claim given up. Its candidate won
///   the lock and wrote the term's record on a quorum, but the replies came too late, so it
///   never led and dropped the lock (released in the background; the release may not land).
///   Nobody extends its keys, so they are gone one TTL after they were set, which is before
///   any observer named the term: superseded at the next held term's start, or one TTL after
///   the first time any observer named it, whichever comes first.
pub(super) fn superseded(
    windows: &[Window],
    timelines: &[&Timeline],
    ttl: Duration,
    end: Instant,
) -> Superseded {
    let mut held: BTreeMap<u64, Window> = BTreeMap::new();
    for w in windows {
        held.insert(w.1, *w);
    }
    let next_start = |term: u64| {
        held.range(term + 1..)
            .next()
            .map_or(end, |(_, next)| next.2)
    };
    let mut out = Superseded::new();
    for (&term, w) in &held {
        let at = (w.3 + ttl).min(next_start(term)).max(w.2);
        out.insert(term, (at, true));
    }
    let mut first_named: BTreeMap<u64, Instant> = BTreeMap::new();
    for (at, term) in timelines.iter().flat_map(|t| t.iter()) {
        if let Some(term) = term.filter(|t| !held.contains_key(t)) {
            let first = first_named.entry(term).or_insert(*at);
            *first = (*first).min(*at);
        }
    }
    for (term, first) in first_named {
        let at = (first + ttl).min(next_start(term)).max(first);
        out.insert(term, (at, false));
    }
    out
}

/// The terms named that no participant held (claims given up), in order.
pub(super) fn unheld(superseded: &Superseded) -> BTreeSet<u64> {
    superseded
        .iter()
        .filter(|(_, (_, held))| !held)
        .map(|(term, _)| *term)
        .collect()
}

/// An observer names no term longer than `bound` after it was superseded, whether a
/// participant held it or not.
pub(super) fn check_observer(
    who: &str,
    timeline: &Timeline,
    superseded: &Superseded,
    bound: Duration,
    (started, end): (Instant, Instant),
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (at, term)) in timeline.iter().enumerate() {
        let Some(term) = term else { continue };
        // Up to the end of the run (the resigns after it are not part of the schedule).
        let until = timeline.get(i + 1).map_or(end, |n| n.0).min(end);
        let Some(&(s, held)) = superseded.get(term) else {
            // `superseded` covers every term any timeline names; not reached.
            out.push(format!(
                "{who} named term {term}, which nobody held or named"
            ));
            continue;
        };
        if until > s + bound && until > started {
            let what = if held {
                "after it was superseded"
            } else {
                "after its keys expired at the latest (no participant held it: a claim given up)"
            };
            out.push(format!(
                "{who} named term {term} until {:?} {what} (bound {bound:?}; shown since {:?} before that)",
                until - s,
                s.saturating_duration_since(*at)
            ));
        }
    }
    out
}
