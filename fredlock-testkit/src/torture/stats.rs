//! The counters of a run ([`Stats`]): what the clients attempted and got, summed over clients
//! and probes.
//!
//! Owns counting only. Must not decide whether anything is safe (that is the checker's job) nor
//! format a report (that is `report.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use fredlock::Error;

/// Counters of one run, summed over the clients.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Acquire calls (acquire, try_acquire, two-resource acquire, `with_lock`), foreign ones
    /// excluded.
    pub attempted: u64,
    /// Of those, granted.
    pub granted: u64,
    /// Failed: held by someone else (including `try_acquire`'s `Ok(None)`).
    pub contended: u64,
    /// Failed: too few nodes reachable.
    pub unavailable: u64,
    /// Failed: a quorum granted too late.
    pub validity_expired: u64,
    /// Granted, then lost while kept alive (`lost()` fired, or `with_lock` returned `Lost`).
    pub lost: u64,
    /// Failed for another reason.
    pub other: u64,
    /// The first few "other" errors.
    pub other_errors: Vec<String>,
    /// Counter writes acknowledged.
    pub writes: u64,
    /// Counter writes skipped because too little validity was left (the guard).
    pub writes_skipped: u64,
    /// Data-node errors (the data node is never faulted: should be 0).
    pub data_errors: u64,
    /// Explicit extend calls on live locks.
    pub extends: u64,
    /// Of those, successful.
    pub extends_ok: u64,
    /// Keys of held locks re-set on a node that had lost them (a node down at the grant, or
    /// restarted since), by keep-alives and explicit extends (`Lock::repairs`).
    pub repairs: u64,
    /// Releases that returned `Ok`.
    pub releases_ok: u64,
    /// Releases that returned `NotHeld`.
    pub releases_not_held: u64,
    /// Releases that returned another error.
    pub releases_failed: u64,
    /// Extends of stale (expired) locks.
    pub stale_extends: u64,
    /// Releases of stale locks while this client held the resource again.
    pub stale_releases_with_holder: u64,
    /// Releases of stale locks without a new holder.
    pub stale_releases: u64,
    /// Stale operations skipped (no stale lock was ready).
    pub stale_skipped: u64,
    /// Private-resource probes with the keys taken over by a foreign value.
    pub takeovers: u64,
    /// Private-resource probes with the keys deleted (revival).
    pub revivals: u64,
    /// Semaphore permits granted.
    pub permits: u64,
    /// Read shares / write locks of the run's read-write locks granted.
    pub rw_reads: u64,
    /// See `rw_reads`.
    pub rw_writes: u64,
    /// Leases resumed / whose resume failed (nodes, or the token gone) / refused as they
    /// should be, after their deadline.
    pub leases_resumed: u64,
    /// See `leases_resumed`.
    pub leases_failed: u64,
    /// See `leases_resumed`.
    pub leases_refused: u64,
    /// Fenced writes the register accepted / refused (holder inside its window).
    pub fenced_accepted: u64,
    /// See `fenced_accepted`.
    pub fenced_refused: u64,
    /// Fenced writes by a holder that stalled past its deadline: accepted (no newer holder had
    /// written) / refused (a newer holder had: the stale write was fenced off).
    pub fenced_stale_accepted: u64,
    /// See `fenced_stale_accepted`.
    pub fenced_stale_refused: u64,
    /// Attempts on foreign resources.
    pub foreign_attempts: u64,
    /// Inspections that a fresh grant's token is on a quorum.
    pub quorum_checks: u64,
    /// S6 probes: acquires cancelled (future dropped), failed, granted (then released).
    pub cleanup_probes: [u64; 3],
    /// Operations run, by kind.
    pub ops: BTreeMap<&'static str, u64>,
    /// Client time by operation kind (think time included), split by whether it got a grant.
    pub op_time: BTreeMap<(&'static str, bool), Duration>,
    /// Fleet mode: the hot resources' grants and waits (see [`Liveness`](super::Liveness)).
    pub live: super::fleet::Live,
}

impl Stats {
    pub(super) fn merge(&mut self, o: &Stats) {
        self.attempted += o.attempted;
        self.granted += o.granted;
        self.contended += o.contended;
        self.unavailable += o.unavailable;
        self.validity_expired += o.validity_expired;
        self.lost += o.lost;
        self.other += o.other;
        for e in &o.other_errors {
            if self.other_errors.len() < 5 && !self.other_errors.contains(e) {
                self.other_errors.push(e.clone());
            }
        }
        self.writes += o.writes;
        self.writes_skipped += o.writes_skipped;
        self.data_errors += o.data_errors;
        self.extends += o.extends;
        self.extends_ok += o.extends_ok;
        self.repairs += o.repairs;
        self.releases_ok += o.releases_ok;
        self.releases_not_held += o.releases_not_held;
        self.releases_failed += o.releases_failed;
        self.stale_extends += o.stale_extends;
        self.stale_releases_with_holder += o.stale_releases_with_holder;
        self.stale_releases += o.stale_releases;
        self.stale_skipped += o.stale_skipped;
        self.takeovers += o.takeovers;
        self.revivals += o.revivals;
        self.foreign_attempts += o.foreign_attempts;
        self.quorum_checks += o.quorum_checks;
        self.permits += o.permits;
        self.rw_reads += o.rw_reads;
        self.rw_writes += o.rw_writes;
        self.leases_resumed += o.leases_resumed;
        self.leases_failed += o.leases_failed;
        self.leases_refused += o.leases_refused;
        self.fenced_accepted += o.fenced_accepted;
        self.fenced_refused += o.fenced_refused;
        self.fenced_stale_accepted += o.fenced_stale_accepted;
        self.fenced_stale_refused += o.fenced_stale_refused;
        for i in 0..3 {
            self.cleanup_probes[i] += o.cleanup_probes[i];
        }
        for (k, v) in &o.ops {
            *self.ops.entry(k).or_default() += v;
        }
        for (k, v) in &o.op_time {
            *self.op_time.entry(*k).or_default() += *v;
        }
        self.live.merge(&o.live);
    }

    /// Counts an acquire outcome; returns the lock if granted.
    pub(super) fn outcome<T>(&mut self, res: Result<Option<T>, Error>) -> Option<T> {
        self.attempted += 1;
        match res {
            Ok(Some(lock)) => {
                self.granted += 1;
                Some(lock)
            }
            Ok(None) => {
                self.contended += 1;
                None
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    pub(super) fn failed(&mut self, e: &Error) {
        match e {
            Error::Contended { .. } => self.contended += 1,
            Error::Unavailable { .. } => self.unavailable += 1,
            Error::ValidityExpired { .. } => self.validity_expired += 1,
            Error::Lost { .. } => self.lost += 1,
            other => {
                self.other += 1;
                if self.other_errors.len() < 5 {
                    self.other_errors.push(other.to_string());
                }
            }
        }
    }
}
