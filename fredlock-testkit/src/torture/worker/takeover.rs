//! S4 and S5 at the script level ([`TakeoverProbe`]): on a resource only one client uses, the
//! lock's keys are deleted (the lock is gone: extend must fail and not re-create them; or only
//! on a minority of nodes, which lost them as a restart would: extend succeeds and re-sets
//! them there) or taken over by a foreign value (extend and release must not touch it) behind
//! the lock's back.
//!
//! Owns this probe, run as a task of its own so the client goes on meanwhile, and its admin
//! commands on the probe's private keys. Must not touch any key but its own private one (the
//! shared resources belong to the other operations and to the checker's counter).

use std::sync::Arc;
use std::time::Duration;

use fredlock::{Inspection, Redlock};
use tokio::time::Instant;

use super::super::env::{same, Env};
use super::super::schedule::ms;
use super::super::stats::Stats;
use super::{Op, Worker};
use crate::checker::{Checker, GrantKind, ViolationKind};

/// How long a takeover probe waits for its acquire's SETs to show on every node.
const TAKEOVER_SETTLE: Duration = Duration::from_millis(150);
/// The takeover probe's private lock lives at least this long.
const TAKEOVER_TTL_MIN: Duration = Duration::from_millis(500);
/// Per-command timeout of the engine's raw admin commands (DEL, SET, PEXPIRE on nodes).
const ADMIN_TIMEOUT: Duration = Duration::from_millis(200);

impl Worker {
    /// S4 and S5 at the script level, on a resource only this client uses (see
    /// [`TakeoverProbe`]). It waits on the nodes and on admin commands for most of its time, so
    /// it runs as a task of its own while the client goes on.
    pub(super) async fn op_takeover(&mut self, op: &Op) {
        self.private_seq += 1;
        let probe = TakeoverProbe {
            env: self.env.clone(),
            redlock: self.redlock.clone(),
            client: self.id,
            resource: format!("private:{}:{}", self.id, self.private_seq),
            foreign: format!("takeover:{}:{}", self.id, self.private_seq),
            revive: op.flag,
            minority: op.flag && op.pick % 2 == 0,
            stats: Stats::default(),
        };
        self.spawn_probe(probe.run()).await;
    }
}

/// S4 and S5 at the script level, on a resource only one client uses: after the grant, the
/// keys are deleted (the lock is gone: extend must fail and not re-create them) or overwritten
/// by a foreign value (extend and release must not touch it).
struct TakeoverProbe {
    env: Arc<Env>,
    redlock: Redlock,
    client: usize,
    resource: String,
    /// The value that takes the keys over.
    foreign: String,
    /// Delete the keys (a revival probe) rather than take them over.
    revive: bool,
    /// Delete them on a minority of the nodes only (nodes that lost the key, as a restart
    /// empties one): the lock still holds a quorum, so its extend succeeds and re-sets them.
    minority: bool,
    stats: Stats,
}

impl TakeoverProbe {
    fn checker(&self) -> &Checker {
        &self.env.checker
    }

    async fn run(mut self) -> Stats {
        let p = self.resource.clone();
        let key = self.redlock.key(&p);
        // Private: a long TTL costs nothing and leaves the extend below well inside validity.
        let ttl = (self.env.config.ttl_max * 4).max(TAKEOVER_TTL_MIN);
        let e_grant = self.env.epochs();
        let res = self.redlock.acquire(p.as_str(), ttl).await;
        let granted_at = Instant::now();
        let Some(mut lock) = self.stats.outcome(res.map(Some)) else {
            return self.stats;
        };
        let g = self
            .checker()
            .grant(self.client, &lock, GrantKind::Acquire, granted_at);
        let seen = self.settle(&p, lock.token()).await;
        let revive = self.revive;
        self.take_keys(&key).await;
        let q = self.env.config.quorum();
        let e0 = self.env.epochs();
        let before = self.env.observer.inspect(&p).await.ok();
        let old = lock.deadline();
        let call = Instant::now();
        let extended = lock.extend(ttl).await.is_ok();
        self.checker()
            .extended(g, call, old, ttl, extended.then(|| lock.deadline()));
        let after = self.env.observer.inspect(&p).await.ok();
        let e1 = self.env.epochs();
        let eligible: Vec<bool> = same(&e_grant, &e1)
            .into_iter()
            .zip(&seen)
            .map(|(undisturbed, &seen)| undisturbed && seen)
            .collect();
        if let (Some(b), Some(a)) = (&before, &after) {
            let held = holders(b, &eligible, lock.token());
            if extended && held < q {
                self.checker().violation(
                    ViolationKind::StaleOpSucceeded,
                    format!(
                        "extend of {p} (token {}) returned Ok after its keys were {} on all but {held} node(s)",
                        lock.token(),
                        if revive { "deleted" } else { "taken over" }
                    ),
                );
            }
            let undisturbed = same(&e0, &e1);
            self.check_extend(lock.token(), &key, extended, b, a, &eligible, &undisturbed);
        }
        let token = lock.token().to_string();
        self.stats.repairs += lock.repairs();
        let held = before.as_ref().map(|b| holders(b, &eligible, &token));
        self.checker().close(g, Instant::now(), lock.deadline());
        let released = lock.release().await.is_ok();
        if released && held.is_some_and(|h| h < q) {
            self.checker().violation(
                ViolationKind::StaleOpSucceeded,
                format!("release of {p} (token {token}) returned Ok although its keys were gone"),
            );
        }
        if !revive {
            self.check_release(&key, before.as_ref(), &e0).await;
        }
        self.stats
    }

    /// Lets every SET of this acquire reach its node first: one still on its way (queued in
    /// the client, or in a starved proxy) could otherwise land after the deletion and look
    /// like a revival. Usually the first look shows the token on every node that answers;
    /// a node where it does not show counts as disturbed (it may still get it). Returns, by
    /// node, whether the token showed.
    async fn settle(&self, p: &str, token: &str) -> Vec<bool> {
        let settle_until = Instant::now() + TAKEOVER_SETTLE;
        loop {
            let Ok(i) = self.env.observer.inspect(p).await else {
                break vec![false; self.env.config.nodes];
            };
            let seen: Vec<bool> = i
                .nodes
                .iter()
                .map(|n| matches!(&n.state, Ok(Some(h)) if h.has_token(token)))
                .collect();
            let absent = i.nodes.iter().any(|n| matches!(&n.state, Ok(None)));
            if !absent || Instant::now() >= settle_until {
                break seen;
            }
            tokio::time::sleep(ms(5)).await;
        }
    }

    /// Behind the lock's back, on every node: deletes its key (a revival probe), or sets it to
    /// the foreign value (a takeover).
    async fn take_keys(&self, key: &str) {
        let admin = self.env.admin.read().await;
        let n = self.env.config.nodes;
        let targets = match self.minority {
            true => n - self.env.config.quorum(),
            false => n,
        };
        for i in 0..targets {
            let args: Vec<&str> = if self.revive {
                vec!["DEL", key]
            } else {
                vec!["SET", key, self.foreign.as_str(), "PX", "30000"]
            };
            let _ = admin.command(i, key, &args, ADMIN_TIMEOUT).await;
        }
    }

    /// After the extend: S5 (the deleted token is not back) or S4 (the foreign value is
    /// untouched), on the nodes that may judge it. An extend that succeeded (a quorum still
    /// held the token: nodes the deletion did not reach, checked above) re-sets the deleted
    /// keys on purpose (a repair of a held lock), so the revival check applies to a failed one.
    #[allow(clippy::too_many_arguments)]
    fn check_extend(
        &mut self,
        token: &str,
        key: &str,
        extended: bool,
        b: &Inspection,
        a: &Inspection,
        eligible: &[bool],
        undisturbed: &[bool],
    ) {
        if self.revive {
            self.stats.revivals += 1;
            if extended {
                return;
            }
            self.checker().check_revival(
                "extend after the keys were deleted",
                token,
                b,
                a,
                eligible,
            );
        } else {
            self.stats.takeovers += 1;
            self.check_takeover(
                key,
                &self.foreign,
                b,
                a,
                undisturbed,
                "extend after takeover",
            );
        }
    }

    /// After the release of a taken-over lock: the foreign value is still untouched. Then the
    /// probe deletes its key everywhere.
    async fn check_release(&self, key: &str, before: Option<&Inspection>, e0: &[u64]) {
        let after2 = self.env.observer.inspect(&self.resource).await.ok();
        let e2 = self.env.epochs();
        if let (Some(b), Some(a2)) = (before, &after2) {
            self.check_takeover(
                key,
                &self.foreign,
                b,
                a2,
                &same(e0, &e2),
                "release after takeover",
            );
        }
        let admin = self.env.admin.read().await;
        for i in 0..self.env.config.nodes {
            let _ = admin.command(i, key, &["DEL", key], ADMIN_TIMEOUT).await;
        }
    }

    /// The foreign value planted by a takeover must be untouched (value, and a TTL still far
    /// above any TTL of ours: an extend must not PEXPIRE it).
    fn check_takeover(
        &self,
        key: &str,
        foreign: &str,
        before: &Inspection,
        after: &Inspection,
        eligible: &[bool],
        what: &str,
    ) {
        for (i, (b, a)) in before.nodes.iter().zip(&after.nodes).enumerate() {
            let planted = matches!(&b.state, Ok(Some(h)) if h.has_token(foreign));
            if !planted || !eligible[i] {
                continue;
            }
            match &a.state {
                Err(_) => {}
                Ok(found) => self.checker().check_foreign_value(
                    what,
                    i,
                    key,
                    foreign,
                    // Inspections show fingerprints: the planted value where it matches.
                    found.as_ref().map(|h| {
                        let seen = if h.has_token(foreign) {
                            foreign
                        } else {
                            h.fingerprint.as_str()
                        };
                        (seen, h.ttl)
                    }),
                    Duration::from_secs(20),
                ),
            }
        }
    }
}

/// Nodes that may still hold `token`: where it was seen, unknown, or disturbed.
fn holders(b: &Inspection, eligible: &[bool], token: &str) -> usize {
    b.nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| match &n.state {
            _ if !eligible[*i] => true,
            Ok(Some(h)) => h.has_token(token),
            Ok(None) => false,
            Err(_) => true,
        })
        .count()
}
