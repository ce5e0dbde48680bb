// This file owns the semaphore and fencing modes of the checker: recording which grants are
// permits and which carry fencing tokens, and the three invariants over those records. It must
// not talk to Redis, and must not re-check what `windows.rs` already checks (per-resource
// overlaps apply to every permit's slot as to any lock).
//! Semaphore mode: at most `permits` permit windows of one semaphore overlap at any instant,
//! across all clients (per-node counting breaks this; one quorum mutex per slot does not).
//! Fencing mode: tokens strictly increase in grant order per resource (a grant whose attempt
//! began after another was returned gets a larger token), no token is handed out twice, and a
//! fenced register's accepted tokens strictly increase.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{Checker, Findings, GrantId, State, ViolationKind};

/// One permit's window: from the grant until its close (or deadline).
#[derive(Debug, Clone)]
pub(crate) struct PermitWindow {
    pub(crate) grant: GrantId,
    pub(crate) name: String,
    pub(crate) permits: usize,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// Where more permit windows than permits overlapped: the name, the permits, the instant and
/// the grants holding then.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverPermits {
    pub(crate) name: String,
    pub(crate) permits: usize,
    pub(crate) at: Instant,
    pub(crate) holders: Vec<GrantId>,
}

/// Sweeps each semaphore's windows in time order and reports every instant at which a window
/// opened while `permits` or more were already open (once per opening window). A window that
/// ends exactly when another starts does not overlap it.
pub(crate) fn over_permits(windows: &[PermitWindow]) -> Vec<OverPermits> {
    let mut by_name: BTreeMap<&str, Vec<&PermitWindow>> = BTreeMap::new();
    for w in windows.iter().filter(|w| w.end > w.start) {
        by_name.entry(w.name.as_str()).or_default().push(w);
    }
    let mut found = Vec::new();
    for (name, mut list) in by_name {
        list.sort_by_key(|w| (w.start, w.grant));
        let mut open: Vec<&PermitWindow> = Vec::new();
        for w in list {
            open.retain(|o| o.end > w.start);
            open.push(w);
            if open.len() > w.permits {
                found.push(OverPermits {
                    name: name.to_string(),
                    permits: w.permits,
                    at: w.start,
                    holders: open.iter().map(|o| o.grant).collect(),
                });
            }
        }
    }
    found
}

/// One granted lock's fencing token for one resource.
#[derive(Debug, Clone)]
pub(crate) struct Fenced {
    pub(crate) grant: GrantId,
    pub(crate) resource: String,
    pub(crate) token: u64,
    /// The attempt's start (`None` when unknown: the grant then only counts as the earlier one).
    pub(crate) t0: Option<Instant>,
    /// When the acquire returned the lock.
    pub(crate) granted_at: Instant,
}

/// A pair of grants of one resource whose tokens break the order: `later` started its attempt
/// after `earlier` had been granted, yet its token is not larger.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutOfOrder {
    pub(crate) resource: String,
    pub(crate) earlier: (GrantId, u64),
    pub(crate) later: (GrantId, u64),
}

/// Checks that tokens strictly increase in grant order per resource: whenever grant B's
/// attempt began after grant A was returned, `token(B) > token(A)`; and no two grants of a
/// resource share a token (reported as a pair whatever their order).
pub(crate) fn fencing_order(grants: &[Fenced]) -> Vec<OutOfOrder> {
    let mut by_resource: BTreeMap<&str, Vec<&Fenced>> = BTreeMap::new();
    for g in grants {
        by_resource.entry(g.resource.as_str()).or_default().push(g);
    }
    let mut found = Vec::new();
    for (resource, mut list) in by_resource {
        list.sort_by_key(|g| (g.granted_at, g.grant));
        // The largest token granted so far, among grants returned before the current one's
        // attempt began: a running maximum over a prefix, advanced as attempts begin later.
        let mut returned = 0;
        let mut best: Option<&Fenced> = None;
        let mut by_start: Vec<&Fenced> = list.iter().copied().filter(|g| g.t0.is_some()).collect();
        by_start.sort_by_key(|g| (g.t0, g.grant));
        for b in by_start {
            let t0 = b.t0.expect("filtered");
            while returned < list.len() && list[returned].granted_at < t0 {
                let a = list[returned];
                if best.is_none_or(|m| a.token > m.token) {
                    best = Some(a);
                }
                returned += 1;
            }
            if let Some(a) = best {
                if b.token <= a.token && a.grant != b.grant {
                    found.push(OutOfOrder {
                        resource: resource.to_string(),
                        earlier: (a.grant, a.token),
                        later: (b.grant, b.token),
                    });
                }
            }
        }
        // Repeats between grants that overlapped in time (neither began after the other
        // returned) are not order violations above, but a token is still handed out twice.
        let mut seen: BTreeMap<u64, GrantId> = BTreeMap::new();
        for g in &list {
            if let Some(&first) = seen.get(&g.token) {
                let pair = OutOfOrder {
                    resource: resource.to_string(),
                    earlier: (first, g.token),
                    later: (g.grant, g.token),
                };
                let already = found.iter().any(|f| {
                    f.resource == pair.resource
                        && f.later.1 == g.token
                        && (f.later.0 == g.grant || f.earlier.0 == g.grant)
                });
                if !already {
                    found.push(pair);
                }
            } else {
                seen.insert(g.token, g.grant);
            }
        }
    }
    found
}

/// Accepted tokens of one fenced register, in the order the register accepted them: each must
/// be larger than the one before. Returns the positions where it is not.
pub(crate) fn register_regressions(accepted: &[u64]) -> Vec<usize> {
    (1..accepted.len())
        .filter(|&i| accepted[i] <= accepted[i - 1])
        .collect()
}

impl Checker {
    /// Semaphore mode: `grant` is a permit of the semaphore `name` with `permits` permits.
    pub fn permit(&self, grant: GrantId, name: &str, permits: usize) {
        self.state()
            .permits
            .push((grant, name.to_string(), permits));
    }

    /// Fencing mode: `grant` got `token` for `resource`.
    pub fn fencing_token(&self, grant: GrantId, resource: &str, token: u64) {
        self.state()
            .fenced
            .push((grant, resource.to_string(), token));
    }

    /// Fencing mode: the tokens the fenced register of `resource` accepted, in its order (read
    /// from the register's own log at the end of the run).
    pub fn register_log(&self, resource: &str, accepted: Vec<u64>) {
        self.state()
            .registers
            .push((resource.to_string(), accepted));
    }

    /// The semaphore and fencing invariants, over windows as `finish` closed them.
    pub(super) fn check_modes(&self, s: &State, found: &mut Findings) {
        let window = |g: GrantId| {
            let grant = &s.grants[g as usize - 1];
            (grant.record.granted_at, grant.end.unwrap_or(grant.deadline))
        };
        let permits: Vec<PermitWindow> = s
            .permits
            .iter()
            .map(|(g, name, permits)| {
                let (start, end) = window(*g);
                PermitWindow {
                    grant: *g,
                    name: name.clone(),
                    permits: *permits,
                    start,
                    end,
                }
            })
            .collect();
        for o in over_permits(&permits) {
            let who: Vec<String> = o
                .holders
                .iter()
                .map(|&g| {
                    let (start, end) = window(g);
                    let r = &s.grants[g as usize - 1].record;
                    format!(
                        "#{g} client {} [{}, {}]",
                        r.client,
                        self.rel(start),
                        self.rel(end)
                    )
                })
                .collect();
            found.violations.push((
                ViolationKind::OverPermits,
                format!(
                    "semaphore {} ({} permits): {} holders at {}: {}",
                    o.name,
                    o.permits,
                    o.holders.len(),
                    self.rel(o.at),
                    who.join(", ")
                ),
            ));
        }
        let fenced: Vec<Fenced> = s
            .fenced
            .iter()
            .map(|(g, resource, token)| {
                let r = &s.grants[*g as usize - 1].record;
                Fenced {
                    grant: *g,
                    resource: resource.clone(),
                    token: *token,
                    t0: r.t0,
                    granted_at: r.granted_at,
                }
            })
            .collect();
        for o in fencing_order(&fenced) {
            let at = |g: GrantId| {
                let r = &s.grants[g as usize - 1].record;
                let t0 = r.t0.map_or("?".to_string(), |t| self.rel(t));
                format!(
                    "#{g} client {} (attempt {t0}, granted {})",
                    r.client,
                    self.rel(r.granted_at)
                )
            };
            found.violations.push((
                ViolationKind::FencingOrder,
                format!(
                    "{}: token {} of {} is not above token {} of {}",
                    o.resource,
                    o.later.1,
                    at(o.later.0),
                    o.earlier.1,
                    at(o.earlier.0)
                ),
            ));
        }
        for (resource, accepted) in &s.registers {
            for i in register_regressions(accepted) {
                found.violations.push((
                    ViolationKind::RegisterRegression,
                    format!(
                        "{resource}: the register accepted token {} after {}",
                        accepted[i],
                        accepted[i - 1]
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn window(grant: GrantId, start: Instant, end: Instant) -> PermitWindow {
        PermitWindow {
            grant,
            name: "s".into(),
            permits: 2,
            start,
            end,
        }
    }

    #[test]
    fn permits_count_overlaps_not_touching_windows() {
        let t = Instant::now();
        // Two at a time, and a third that starts exactly when the first ends: fine.
        let ok = [
            window(1, at(t, 0), at(t, 10)),
            window(2, at(t, 5), at(t, 20)),
            window(3, at(t, 10), at(t, 30)),
        ];
        assert!(over_permits(&ok).is_empty());
        // A third inside both: found, naming all three.
        let bad = [
            window(1, at(t, 0), at(t, 10)),
            window(2, at(t, 5), at(t, 20)),
            window(3, at(t, 9), at(t, 30)),
        ];
        let found = over_permits(&bad);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].holders, vec![1, 2, 3]);
        assert_eq!(found[0].at, at(t, 9));
    }

    fn fenced(grant: GrantId, token: u64, t0: Instant, granted_at: Instant) -> Fenced {
        Fenced {
            grant,
            resource: "r".into(),
            token,
            t0: Some(t0),
            granted_at,
        }
    }

    #[test]
    fn tokens_must_rise_in_grant_order_and_never_repeat() {
        let t = Instant::now();
        let rising = [
            fenced(1, 1, at(t, 0), at(t, 1)),
            fenced(2, 2, at(t, 5), at(t, 6)),
            fenced(3, 5, at(t, 7), at(t, 8)),
        ];
        assert!(fencing_order(&rising).is_empty());
        // The naive max-of-INCR history: tokens 1, 2, 3, 3.
        let naive = [
            fenced(1, 1, at(t, 0), at(t, 1)),
            fenced(2, 2, at(t, 2), at(t, 3)),
            fenced(3, 3, at(t, 4), at(t, 5)),
            fenced(4, 3, at(t, 6), at(t, 7)),
        ];
        let found = fencing_order(&naive);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].earlier, (3, 3));
        assert_eq!(found[0].later, (4, 3));
        // A later grant with a lower token.
        let lower = [
            fenced(1, 7, at(t, 0), at(t, 1)),
            fenced(2, 4, at(t, 2), at(t, 3)),
        ];
        assert_eq!(fencing_order(&lower).len(), 1);
        // Concurrent attempts (B began before A returned) may come in either order, but a
        // repeated token is still found.
        let concurrent = [
            fenced(1, 4, at(t, 0), at(t, 5)),
            fenced(2, 4, at(t, 1), at(t, 9)),
        ];
        assert_eq!(fencing_order(&concurrent).len(), 1);
        let concurrent_ok = [
            fenced(1, 5, at(t, 0), at(t, 5)),
            fenced(2, 4, at(t, 1), at(t, 9)),
        ];
        assert!(fencing_order(&concurrent_ok).is_empty());
    }

    #[test]
    fn a_register_must_accept_rising_tokens_only() {
        assert!(register_regressions(&[1, 2, 5, 9]).is_empty());
        assert_eq!(register_regressions(&[1, 3, 3, 2]), vec![2, 3]);
    }
}
