//! The rounds of a [`RwLock`](crate::RwLock): one attempt at a read share or the write lock,
//! and the downgrade of a write lock to a read share. Each is one script call per node, a
//! quorum grant or a clean-up of whatever the round may have set.
//!
//! Owns: one read-write lock's keys, the scripts' keys and arguments, one attempt (send,
//! settle), a writer's waiting mark, the downgrade round. Must not: retry (the read and write
//! calls do), or know the public guard types (it hands back locks).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;
use tokio::time::Instant;

use crate::base::error::{Error, HeldBy, Names, Result, Vote, Votes};
use crate::base::reply::Acquired;
use crate::nodes::node::Held;
use crate::rounds::attempt::{fencing_tokens, Failure, Grant};
use crate::rounds::lock::Lock;
use crate::rounds::quorum::{self, fan_out, quorum_known, AsVote, Late, Outcome};
use crate::rounds::redlock::{new_token, spawn_release, Redlock, RESERVED};

/// Which side an attempt takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Read,
    Write,
}

/// One read-write lock, as its rounds see it: its Redlock and name.
#[derive(Clone, Copy)]
pub(crate) struct RwRounds<'a> {
    pub(crate) redlock: &'a Redlock,
    pub(crate) name: &'a str,
}

/// One node's answer to an attempt: its vote (and counter), and, for a refused write, whether a
/// writer was in the way (rather than only readers).
struct RwAnswer {
    acquired: Acquired,
    writer: bool,
}

impl AsVote for RwAnswer {
    fn as_vote(&self) -> &Vote {
        &self.acquired.vote
    }
}

/// One attempt's votes, and what it would hold, between its steps.
struct Answered {
    resource: String,
    held: Arc<Held>,
    fenced: bool,
    t0: Instant,
    deadline: Instant,
    votes: Votes,
    counters: Vec<Option<Vec<u64>>>,
}

impl RwRounds<'_> {
    /// The resource name of one of the lock's parts (`w`, `i`, `r`, `r:<reader>`).
    pub(crate) fn part(&self, part: &str) -> String {
        crate::base::slots::rwlock_part(RESERVED, self.name, part)
    }

    /// The writer key, the writer-waiting key, the readers set.
    pub(crate) fn keys(&self) -> [String; 3] {
        ["w", "i", "r"].map(|p| self.redlock.key(&self.part(p)))
    }

    /// One attempt of either side: one script call per node, a quorum grant or a clean-up.
    /// Refused: why, and who was in the way (for the error once the caller gives up).
    pub(crate) async fn attempt(
        &self,
        side: Side,
        req: &crate::rounds::redlock::Request,
        mark: Option<&str>,
    ) -> std::result::Result<Lock, (Failure, HeldBy)> {
        let inner = &self.redlock.inner;
        let Plan {
            resource,
            script,
            keys,
            argv,
            held,
            fenced,
        } = self.plan(side, req, mark);
        let value = held.value.clone();
        // Armed until settled: a dropped attempt releases our key everywhere.
        let mut guard = Cleanup(Some((self.redlock.clone(), held.clone())), req.ttl);
        let t0 = Instant::now();
        let Some(deadline) = t0.checked_add(req.validity) else {
            guard.0 = None;
            return Err((Failure::Expired(Duration::ZERO), HeldBy::SomeoneElse));
        };
        let (keys, argv) = (Arc::new(keys), Arc::new(argv));
        let creating: Arc<str> = Arc::from(value.as_str());
        let calls = inner.nodes.iter().enumerate().map(|(n, node)| {
            let call = node.clone().eval_script(
                script,
                keys.clone(),
                argv.clone(),
                Some(creating.clone()),
                req.timeout,
            );
            let name = node.name.clone();
            (n, async move {
                let reply = call.await;
                let (acquired, writer) = match side {
                    Side::Read => (
                        Acquired::plain(crate::base::reply::vote(&name, reply)),
                        false,
                    ),
                    Side::Write => crate::base::reply::rw_write(&name, reply),
                };
                RwAnswer { acquired, writer }
            })
        });
        let answers = fan_out(
            inner.nodes.len(),
            calls,
            Some(deadline),
            Late::Finish,
            quorum_known,
        )
        .await;
        let mut counters = Vec::new();
        let mut writer = false;
        let votes = Votes(
            answers
                .into_iter()
                .map(|a| {
                    let Some(RwAnswer {
                        acquired: a,
                        writer: w,
                    }) = a
                    else {
                        counters.push(None);
                        return Vote::Pending;
                    };
                    writer |= w;
                    counters.push(a.counters);
                    a.vote
                })
                .collect(),
        );
        let held_by = match side {
            Side::Read => HeldBy::WriterHoldsOrWaits,
            Side::Write if writer => HeldBy::Writer,
            Side::Write => HeldBy::Readers,
        };
        crate::base::metrics::failures(&votes.0);
        let answered = Answered {
            resource,
            held,
            fenced,
            t0,
            deadline,
            votes,
            counters,
        };
        self.settle(req, answered, guard)
            .await
            .map_err(|failure| (failure, held_by))
    }

    /// The answers are in: a quorum's grant within the validity (with the writer's fencing
    /// token raised on a quorum, when fencing is on), or a clean-up on every node that may hold
    /// our key, and why.
    async fn settle(
        &self,
        req: &crate::rounds::redlock::Request,
        answered: Answered,
        mut guard: Cleanup,
    ) -> std::result::Result<Lock, Failure> {
        let inner = &self.redlock.inner;
        let Answered {
            resource,
            held,
            fenced,
            t0,
            deadline,
            votes,
            counters,
        } = answered;
        let mut now = Instant::now();
        let granted = quorum::outcome(&votes.0) == Outcome::Reached;
        let mut failure = None;
        if granted && now < deadline {
            let mut fencing = None;
            if fenced {
                let tokens = fencing_tokens(&votes, &counters, 1);
                let fence = [self.redlock.fence_key(&resource)];
                let raised = inner
                    .raise_fence(&fence, &tokens, deadline, req.timeout)
                    .await;
                now = Instant::now();
                if quorum::outcome(&raised.0) == Outcome::Reached && now < deadline {
                    fencing = Some(tokens);
                } else if now < deadline {
                    failure = Some(Failure::Unavailable(raised));
                }
            }
            if failure.is_none() && now < deadline {
                guard.0 = None;
                let grant = Grant {
                    held,
                    t0,
                    deadline,
                    fencing,
                    handed: None,
                };
                return Ok(Lock::from_grant(self.redlock.clone(), grant, req.ttl));
            }
        }
        let targets = (0..votes.0.len()).filter(|&n| votes.0[n] != Vote::Refused);
        inner.release_unawaited(&held, targets, req.ttl).await;
        guard.0 = None;
        let expired_waiting = now >= deadline && votes.0.contains(&Vote::Pending);
        Err(if let Some(failure) = failure {
            failure
        } else if granted || expired_waiting {
            Failure::Expired(now.duration_since(t0))
        } else if votes.failed() > inner.nodes.len() - inner.quorum || votes.refused() == 0 {
            Failure::Unavailable(votes)
        } else {
            Failure::Contended(votes)
        })
    }

    /// What one attempt sends (the script, its keys and arguments) and what it would hold.
    fn plan(&self, side: Side, req: &crate::rounds::redlock::Request, mark: Option<&str>) -> Plan {
        let inner = &self.redlock.inner;
        let scripts = crate::base::scripts::Scripts::get();
        let value = crate::base::owner::value(&new_token(), &inner.label);
        let [w, i, r] = self.keys();
        let fenced = side == Side::Write && inner.fencing;
        let ttl_ms = Value::Integer(req.ttl_ms as i64);
        let (resource, script, keys, argv) = match side {
            Side::Read => {
                let resource = self.part(&format!("r:{}", new_token()));
                let key = self.redlock.key(&resource);
                let argv = vec![Value::from(value.as_str()), ttl_ms];
                (resource, &scripts.rw_read, vec![w, i, r, key], argv)
            }
            Side::Write => {
                let resource = self.part("w");
                let mut keys = vec![w, i, r];
                if fenced {
                    keys.push(self.redlock.fence_key(&resource));
                }
                let argv = vec![
                    Value::from(value.as_str()),
                    ttl_ms.clone(),
                    Value::from(mark.unwrap_or_default()),
                    ttl_ms,
                    Value::from(if fenced { "1" } else { "0" }),
                ];
                (resource, &scripts.rw_write, keys, argv)
            }
        };
        let lock_key = self.redlock.key(&resource);
        let held = Arc::new(Held {
            keys: vec![lock_key],
            value,
            custom: false,
            resources: vec![resource.clone()],
            fence_keys: Vec::new(),
            line: None,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        });
        Plan {
            resource,
            script,
            keys,
            argv,
            held,
            fenced,
        }
    }

    /// The error for a call that gave up after `attempts` attempts, the last one `failure`
    /// (contended: `held_by` was in the way).
    pub(crate) fn failed(
        &self,
        (failure, held_by): (Failure, HeldBy),
        attempts: u32,
        ttl: Duration,
    ) -> Error {
        let resources = Names(vec![self.name.to_string()]);
        match failure {
            Failure::Contended(votes) | Failure::Queued(votes, _) => Error::Contended {
                resources,
                held_by,
                attempts,
                votes,
            },
            Failure::Unavailable(votes) => {
                self.redlock.inner.unavailable(resources, attempts, votes)
            }
            Failure::Expired(elapsed) => Error::ValidityExpired {
                resources,
                attempts,
                elapsed,
                ttl,
            },
            Failure::Rejected(e) => e.into(),
        }
    }

    /// Turns the write lock `lock` into a read share for `ttl` in one step on every node (see
    /// [`WriteGuard::downgrade`](crate::WriteGuard::downgrade)): the share, or an error with
    /// both keys released everywhere.
    pub(crate) async fn downgrade(&self, lock: Lock, ttl: Duration) -> Result<Lock> {
        let until = lock.deadline();
        let writer_ttl = lock.ttl();
        let req = self.redlock.request_unchecked(vec![self.part("w")], ttl)?;
        let (writer, _) = lock.disarm();
        let redlock = self.redlock;
        let inner = &redlock.inner;
        // Armed until settled: a dropped downgrade releases both keys everywhere.
        let mut wguard = Cleanup(Some((redlock.clone(), writer.clone())), writer_ttl);
        let resource = self.part(&format!("r:{}", new_token()));
        let key = redlock.key(&resource);
        let value = crate::base::owner::value(&new_token(), &inner.label);
        let reader = Arc::new(Held {
            keys: vec![key.clone()],
            value: value.clone(),
            custom: false,
            resources: vec![resource],
            fence_keys: Vec::new(),
            line: None,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        });
        let mut rguard = Cleanup(Some((redlock.clone(), reader.clone())), req.ttl);
        let [w, _, r] = self.keys();
        let keys = Arc::new(vec![w, r, key]);
        let argv = Arc::new(vec![
            Value::from(writer.value.as_str()),
            Value::from(value.as_str()),
            Value::Integer(req.ttl_ms as i64),
        ]);
        let t0 = Instant::now();
        let deadline = t0.checked_add(req.validity).map(|d| d.min(until));
        let script = &crate::base::scripts::Scripts::get().rw_downgrade;
        let creating: Arc<str> = Arc::from(value.as_str());
        let calls = inner.nodes.iter().enumerate().map(|(n, node)| {
            let call = node.clone().eval_script(
                script,
                keys.clone(),
                argv.clone(),
                Some(creating.clone()),
                req.timeout,
            );
            let name = node.name.clone();
            (
                n,
                async move { crate::base::reply::vote(&name, call.await) },
            )
        });
        let answers = fan_out(
            inner.nodes.len(),
            calls,
            Some(until),
            Late::Finish,
            quorum_known,
        )
        .await;
        let votes = quorum::votes(answers);
        crate::base::metrics::failures(&votes.0);
        let now = Instant::now();
        if let Some(deadline) = deadline.filter(|d| now < *d) {
            if quorum::outcome(&votes.0) == Outcome::Reached {
                wguard.0 = None;
                rguard.0 = None;
                let grant = Grant {
                    held: reader,
                    t0,
                    deadline,
                    fencing: None,
                    handed: None,
                };
                let lock = Lock::from_grant(redlock.clone(), grant, req.ttl);
                return Ok(lock);
            }
        }
        let all = 0..inner.nodes.len();
        inner.release_unawaited(&reader, all.clone(), req.ttl).await;
        inner.release_unawaited(&writer, all, writer_ttl).await;
        wguard.0 = None;
        rguard.0 = None;
        if now >= until {
            return Err(Error::NotHeld {
                resources: Names(vec![self.name.to_string()]),
                reason: crate::base::error::NotHeldReason::Expired,
                votes,
            });
        }
        Err(inner.names_failure(
            Names(vec![self.name.to_string()]),
            crate::base::error::Round::Extend,
            votes,
        ))
    }
}

/// One attempt's script, keys and arguments, and what it would hold (see `RwRounds::plan`).
struct Plan {
    resource: String,
    script: &'static crate::base::scripts::Script,
    keys: Vec<String>,
    argv: Vec<Value>,
    held: Arc<Held>,
    fenced: bool,
}

/// A writer's waiting mark: one value for every attempt of one call, removed from every node
/// when the call ends (granted, given up or dropped).
pub(crate) struct Mark {
    redlock: Redlock,
    held: Arc<Held>,
    ttl: Duration,
    /// Removed already (by [`remove`](Self::remove)); otherwise a drop removes it.
    removed: bool,
}

impl Mark {
    pub(crate) fn new(rw: &RwRounds<'_>, ttl: Duration) -> Mark {
        Mark {
            redlock: rw.redlock.clone(),
            held: Arc::new(Held {
                keys: vec![rw.keys()[1].clone()],
                value: new_token(),
                custom: false,
                resources: vec![rw.part("i")],
                fence_keys: Vec::new(),
                line: None,
                repairs: Default::default(),
                wire: Default::default(),
                announce: Default::default(),
                batched: Default::default(),
            }),
            ttl,
            removed: false,
        }
    }

    pub(crate) fn value(&self) -> &str {
        &self.held.value
    }

    /// Removes the mark from every node: handed to each node's connection before this returns,
    /// so this process's next commands (a try_read right after a failed try_write) land after
    /// it.
    pub(crate) async fn remove(mut self) {
        let inner = self.redlock.inner.clone();
        inner
            .release_unawaited(&self.held, 0..inner.nodes.len(), self.ttl)
            .await;
        self.removed = true;
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        spawn_release(
            self.redlock.inner.clone(),
            self.held.clone(),
            self.ttl,
            "write lock call ended",
        );
    }
}

/// Releases an attempt's key on every node if the attempt is dropped.
struct Cleanup(Option<(Redlock, Arc<Held>)>, Duration);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some((redlock, held)) = self.0.take() {
            spawn_release(
                redlock.inner.clone(),
                held,
                self.1,
                "rwlock attempt cancelled",
            );
        }
    }
}
