//! Checks on node states that the caller inspected: S1 (a fresh grant's token is on a quorum),
//! S5 (an extend did not revive a token), S4 (another holder's key, or a foreign value, was left
//! alone).
//!
//! Owns the comparison of [`Inspection`]s and their description in violation details. Must not
//! inspect anything itself (the caller brings the inspections: the checker never talks to Redis)
//! nor keep any state beyond the violations and check counts it records.

use std::time::Duration;

use fredlock::Inspection;

use super::{Checker, GrantId, ViolationKind};

impl Checker {
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
                Ok(Some(h)) if h.has_token(token) => present += 1,
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
                Ok(Some(h)) => !h.has_token(token),
                Err(_) => false,
            };
            let present_after = matches!(&a.state, Ok(Some(h)) if h.has_token(token));
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
            let present_before = matches!(&b.state, Ok(Some(h)) if h.has_token(token));
            let gone_after = match &a.state {
                Ok(None) => true,
                Ok(Some(h)) => !h.has_token(token),
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
}

/// `node: token@ttl` per node, marking `ours`.
fn describe_inspection(i: &Inspection, ours: &str) -> String {
    i.nodes
        .iter()
        .enumerate()
        .map(|(n, v)| match &v.state {
            Ok(None) => format!("{n}: -"),
            Ok(Some(h)) if h.has_token(ours) => format!("{n}: OURS({:?})", h.ttl),
            Ok(Some(h)) => format!("{n}: {}({:?})", h.fingerprint, h.ttl),
            Err(e) => format!("{n}: ERR {:?}", e.kind),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::test_support::{inspection, ms};
    use super::*;

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
}
