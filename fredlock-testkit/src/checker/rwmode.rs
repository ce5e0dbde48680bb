// This file owns the read-write mode of the checker: recording which grants are read shares
// and which are write locks of a read-write lock, and the read-write invariant over their
// windows. It must not talk to Redis, and must not re-check what `windows.rs` already checks
// (per-resource overlaps: every write lock's key is one resource, each reader's another).
//! Read-write mode: no write window of a read-write lock overlaps any other window of it, read
//! or write, counted from grant to close (or deadline) as for the mutex. Readers may overlap
//! each other. A per-node reader count without a quorum breaks this; one quorum lock per
//! reader plus a quorum write lock that sees them does not.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{Checker, Findings, GrantId, State, ViolationKind};

/// One window of a read-write lock.
#[derive(Debug, Clone)]
pub(crate) struct RwWindow {
    pub(crate) grant: GrantId,
    pub(crate) name: String,
    pub(crate) write: bool,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// A write window that overlapped another window of the same read-write lock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RwConflict {
    pub(crate) name: String,
    pub(crate) at: Instant,
    /// The window that opened while the other was open, and the other.
    pub(crate) opened: GrantId,
    pub(crate) open: GrantId,
}

/// Sweeps each lock's windows in time order: a window that opens while a window of the other
/// side (or another write window) is open is a conflict. A window that ends exactly when
/// another starts does not overlap it.
pub(crate) fn rw_conflicts(windows: &[RwWindow]) -> Vec<RwConflict> {
    let mut by_name: BTreeMap<&str, Vec<&RwWindow>> = BTreeMap::new();
    for w in windows.iter().filter(|w| w.end > w.start) {
        by_name.entry(w.name.as_str()).or_default().push(w);
    }
    let mut found = Vec::new();
    for (name, mut list) in by_name {
        list.sort_by_key(|w| (w.start, w.grant));
        let mut open: Vec<&RwWindow> = Vec::new();
        for w in list {
            open.retain(|o| o.end > w.start);
            if let Some(o) = open.iter().find(|o| w.write || o.write) {
                found.push(RwConflict {
                    name: name.to_string(),
                    at: w.start,
                    opened: w.grant,
                    open: o.grant,
                });
            }
            open.push(w);
        }
    }
    found
}

impl Checker {
    /// Read-write mode: `grant` is a read share (`write = false`) or the write lock of the
    /// read-write lock `name`.
    pub fn rw_grant(&self, grant: GrantId, name: &str, write: bool) {
        self.state().rw.push((grant, name.to_string(), write));
    }

    /// The read-write invariant, over windows as `finish` closed them.
    pub(super) fn check_rw(&self, s: &State, found: &mut Findings) {
        let window = |g: GrantId| {
            let grant = &s.grants[g as usize - 1];
            (grant.record.granted_at, grant.end.unwrap_or(grant.deadline))
        };
        let windows: Vec<RwWindow> =
            s.rw.iter()
                .map(|(g, name, write)| {
                    let (start, end) = window(*g);
                    RwWindow {
                        grant: *g,
                        name: name.clone(),
                        write: *write,
                        start,
                        end,
                    }
                })
                .collect();
        let side = |g: GrantId| {
            let write = s.rw.iter().any(|(id, _, w)| *id == g && *w);
            let (start, end) = window(g);
            let client = s.grants[g as usize - 1].record.client;
            format!(
                "{} #{g} client {client} [{}, {}]",
                if write { "writer" } else { "reader" },
                self.rel(start),
                self.rel(end)
            )
        };
        for c in rw_conflicts(&windows) {
            found.violations.push((
                ViolationKind::RwOverlap,
                format!(
                    "read-write lock {}: {} opened at {} while {} held it",
                    c.name,
                    side(c.opened),
                    self.rel(c.at),
                    side(c.open)
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn w(grant: GrantId, write: bool, from: u64, to: u64, base: Instant) -> RwWindow {
        RwWindow {
            grant,
            name: "rw".into(),
            write,
            start: base + Duration::from_millis(from),
            end: base + Duration::from_millis(to),
        }
    }

    #[test]
    fn readers_share_and_writers_do_not() {
        let t = Instant::now();
        // Readers overlapping each other, then a writer after them: fine.
        let ok = [
            w(1, false, 0, 10, t),
            w(2, false, 5, 20, t),
            w(3, true, 20, 30, t),
        ];
        assert!(rw_conflicts(&ok).is_empty());
        // A reader opening inside a write window, and a writer inside a read window.
        let bad = [
            w(1, true, 0, 10, t),
            w(2, false, 9, 12, t),
            w(3, true, 11, 13, t),
        ];
        let found = rw_conflicts(&bad);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].opened, found[0].open), (2, 1));
        assert_eq!((found[1].opened, found[1].open), (3, 2));
        // Two writers overlapping.
        let two = [w(1, true, 0, 10, t), w(2, true, 5, 15, t)];
        assert_eq!(rw_conflicts(&two).len(), 1);
    }
}
