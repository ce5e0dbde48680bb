//! The lost-update counter, checked by [`finish`](super::Checker::finish) (invariant (c)): every
//! write's timing against its grant's window, and per resource the tree of writes (values that
//! no write stored, two landed writes that read the same value, a final count that does not
//! match the writes). See the module docs of `checker` for what the counter is.
//!
//! Owns this invariant only. Must not record violations or notes directly (they go to
//! [`Findings`], which `finish` records in order) nor judge windows against each other (that is
//! `windows.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{
    Checker, DataValue, Findings, GrantId, NoteKind, State, ViolationKind, Write, WriteId,
    WriteState,
};

/// What the counter check counted, for the report.
pub(super) struct Tally {
    /// Grants with at least one write completed inside their window.
    pub(super) verified: usize,
    /// Writes acknowledged.
    pub(super) completed: usize,
    /// Writes with an unknown outcome.
    pub(super) uncertain: usize,
}

impl State {
    fn write(&self, id: WriteId) -> &Write {
        &self.writes[id as usize - 1]
    }
}

/// A completed write's timing against its own grant's window: `Some(true)` inside it, `None`
/// when the write did not complete.
fn in_window(s: &State, w: &Write) -> Option<bool> {
    let g = &s.grants[w.grant as usize - 1];
    match w.state {
        WriteState::Completed(done) => {
            Some(w.read_at >= g.record.granted_at && done <= g.end.unwrap_or(g.deadline))
        }
        _ => None,
    }
}

impl Checker {
    /// (c) The lost-update counter. `final_values` as for [`finish`](Checker::finish).
    pub(super) fn check_counter(
        &self,
        s: &State,
        final_values: &HashMap<String, Option<String>>,
        found: &mut Findings,
    ) -> Tally {
        let mut by_resource: BTreeMap<&str, Vec<WriteId>> = BTreeMap::new();
        for (i, w) in s.writes.iter().enumerate() {
            by_resource
                .entry(w.resource.as_str())
                .or_default()
                .push(i as WriteId + 1);
        }
        let tally = self.time_writes(s, found);
        for (resource, ids) in &by_resource {
            self.check_resource_counter(s, resource, ids, final_values, found);
        }
        tally
    }

    /// Every write's timing against its own grant's window: a write completed after it is a
    /// late write (noted, row 10).
    fn time_writes(&self, s: &State, found: &mut Findings) -> Tally {
        let mut verified: HashSet<GrantId> = HashSet::new();
        let mut completed = 0;
        let mut uncertain = 0;
        for (i, w) in s.writes.iter().enumerate() {
            match (w.state, in_window(s, w)) {
                (WriteState::Completed(done), Some(inside)) => {
                    completed += 1;
                    if inside {
                        verified.insert(w.grant);
                    } else {
                        let g = &s.grants[w.grant as usize - 1];
                        found.notes.push((
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
        Tally {
            verified: verified.len(),
            completed,
            uncertain,
        }
    }

    /// The writes `ids` of one resource against each other and against the final value.
    fn check_resource_counter(
        &self,
        s: &State,
        resource: &str,
        ids: &[WriteId],
        final_values: &HashMap<String, Option<String>>,
        found: &mut Findings,
    ) {
        let final_raw = final_values.get(resource).cloned().flatten();
        let final_value = DataValue::parse(final_raw.as_deref());
        let landed = landed(s, ids, final_value);
        self.check_values_written(s, resource, ids, final_value, &final_raw, found);
        self.check_siblings(s, resource, ids, &landed, found);
        if let Some(v) = final_value {
            check_final_count(s, resource, ids, &landed, v, found);
        }
    }

    /// Consistency: every value read (and the final one) must be one a write stored.
    fn check_values_written(
        &self,
        s: &State,
        resource: &str,
        ids: &[WriteId],
        final_value: Option<DataValue>,
        final_raw: &Option<String>,
        found: &mut Findings,
    ) {
        let mut reads: Vec<(DataValue, Option<WriteId>)> =
            ids.iter().map(|&id| (s.write(id).read, Some(id))).collect();
        match final_value {
            Some(v) => reads.push((v, None)),
            None => found.violations.push((
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
                    .is_some_and(|w| w.resource == resource && w.read.count + 1 == v.count)
            };
            if !consistent {
                found.violations.push((
                    ViolationKind::LostUpdate,
                    format!(
                        "{resource}: value {} read by {} was never written",
                        v.encode(),
                        by.map_or("the final check".to_string(), |id| format!("write #{id}"))
                    ),
                ));
            }
        }
    }

    /// Two landed writes that read the same value: one overwrote the other.
    fn check_siblings(
        &self,
        s: &State,
        resource: &str,
        ids: &[WriteId],
        landed: &HashSet<WriteId>,
        found: &mut Findings,
    ) {
        let mut children: BTreeMap<WriteId, Vec<WriteId>> = BTreeMap::new();
        for &id in ids {
            if landed.contains(&id) {
                children
                    .entry(s.write(id).read.writer)
                    .or_default()
                    .push(id);
            }
        }
        for (parent, kids) in &children {
            if kids.len() < 2 {
                continue;
            }
            let all_inside = kids.iter().all(|&k| in_window(s, s.write(k)) == Some(true));
            let who: Vec<String> = kids.iter().map(|&k| self.describe_write(s, k)).collect();
            let detail = format!(
                "{resource}: {} writes read the value of write #{parent}: {}",
                kids.len(),
                who.join("; ")
            );
            if all_inside {
                found.violations.push((ViolationKind::LostUpdate, detail));
            } else {
                found
                    .notes
                    .push((NoteKind::LostUpdateOutsideAssumptions, detail));
            }
        }
    }

    /// A write of a lost update: its grant, when it read, and how it ended.
    fn describe_write(&self, s: &State, k: WriteId) -> String {
        let w = s.write(k);
        let g = &s.grants[w.grant as usize - 1];
        format!(
            "write #{k} (grant #{} client {} token {}, read {}, {})",
            w.grant,
            g.record.client,
            g.record.token,
            self.rel(w.read_at),
            match (w.state, in_window(s, w)) {
                (WriteState::Completed(d), Some(true)) => format!("done {} in window", self.rel(d)),
                (WriteState::Completed(d), _) => format!("done {} AFTER its window", self.rel(d)),
                _ => "outcome unknown".to_string(),
            }
        )
    }
}

/// Which writes are known to have landed: the completed ones, every one whose value was read,
/// and the final value's.
fn landed(s: &State, ids: &[WriteId], final_value: Option<DataValue>) -> HashSet<WriteId> {
    let mut landed: HashSet<WriteId> = HashSet::new();
    for &id in ids {
        if matches!(s.write(id).state, WriteState::Completed(_)) {
            landed.insert(id);
        }
        let parent = s.write(id).read.writer;
        if parent != 0 {
            landed.insert(parent);
        }
    }
    if let Some(v) = final_value {
        if v.writer != 0 {
            landed.insert(v.writer);
        }
    }
    landed
}

/// The final count against the writes: completed ones all landed, uncertain ones may.
fn check_final_count(
    s: &State,
    resource: &str,
    ids: &[WriteId],
    landed: &HashSet<WriteId>,
    v: DataValue,
    found: &mut Findings,
) {
    let done = ids
        .iter()
        .filter(|&&id| matches!(s.write(id).state, WriteState::Completed(_)))
        .count() as u64;
    let maybe = ids.len() as u64 - done;
    let known_uncertain = ids
        .iter()
        .filter(|&&id| {
            !matches!(s.write(id).state, WriteState::Completed(_)) && landed.contains(&id)
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
        let explained = fewer
            && ids
                .iter()
                .any(|&id| in_window(s, s.write(id)) != Some(true));
        if explained {
            found
                .notes
                .push((NoteKind::LostUpdateOutsideAssumptions, detail));
        } else {
            found.violations.push((ViolationKind::LostUpdate, detail));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{finals, grant, ms, write, TTL};
    use super::super::{Checker, DataValue, NoteKind, ViolationKind};
    use tokio::time::Instant;

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
}
