//! A read-write lock that stays safe under a quorum: many readers or one writer of one name,
//! across the fleet, under every fault a Redlock mutex survives.
//!
//! Per node: a writer key (a plain lock key), a key per reader (a plain lock key each, so a
//! reader expires with its own TTL whatever the other readers do, and extends, keeps alive and
//! releases exactly as a [`Lock`]), a set listing the reader keys, and a "writer waiting" mark.
//! A read share is granted on a node that has no writer and no waiting writer; the write lock
//! on a node where no writer holds it and no reader key of the set still exists. Each is a
//! quorum grant, so any reader's quorum and any writer's quorum share a node, which saw one of
//! them first and refused the other (as for two holders of a mutex): no writer overlaps a
//! reader or another writer. Readers never exclude each other. A read or a write attempt is one
//! script call per node, whatever the number of readers.
//!
//! Writer preference: a refused writer leaves its mark on the nodes (until it gets in, gives
//! up, or the mark's TTL, the writer's, passes), and new readers are refused while it is there.
//! Readers already in are not stopped: they delay the writer until they release, or until
//! their TTL passes when they stop extending.
//!
//! Waiting uses the Redlock's [`Retry`](crate::Retry) policy (polling; a release sends no
//! wake-up to waiting readers and writers).
//!
//! Owns: [`RwLock`], its guards, its keys and rounds. Must not: count readers without a quorum.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;
use tokio::time::Instant;

use crate::error::{Error, InvalidInput, Names, NodeError, NodeErrorKind, Result, Vote, Votes};
use crate::inspect::{node_state, RwInspection, RwNodeView};
use crate::keepalive::{KeepAlive, KeepAliveOptions, Rejected};
use crate::lock::{Lock, ReleaseReport};
use crate::node::Held;
use crate::quorum::{self, fan_out, quorum_known, Late, Outcome};
use crate::redlock::{
    fencing_tokens, new_token, random_up_to, spawn_release, Failure, Grant, Redlock, Retry,
    RESERVED,
};
use crate::reply::Acquired;

/// A read-write lock named `name` over a [`Redlock`]'s nodes: many readers or one writer.
/// Cheap to clone. See [`Redlock::rwlock`].
#[derive(Debug, Clone)]
pub struct RwLock {
    redlock: Redlock,
    name: String,
}

/// A read share of a [`RwLock`]: a quorum lock on this reader's own key. Extend, release and
/// keep it alive exactly like a [`Lock`]; dropping it releases it in the background.
#[must_use = "dropping a ReadGuard releases it at once"]
#[derive(Debug)]
pub struct ReadGuard {
    lock: Lock,
}

/// The write lock of a [`RwLock`]: a quorum lock on its writer key. Extend, release and keep it
/// alive exactly like a [`Lock`]; dropping it releases it in the background.
#[must_use = "dropping a WriteGuard releases it at once"]
#[derive(Debug)]
pub struct WriteGuard {
    lock: Lock,
    rw: RwLock,
}

impl Redlock {
    /// A read-write lock named `name`: at any instant either any number of readers or one
    /// writer, across every client of these nodes. Nothing is sent until the first call.
    ///
    /// ```no_run
    /// # async fn demo(redlock: fredlock::Redlock) -> Result<(), fredlock::Error> {
    /// use std::time::Duration;
    ///
    /// let rw = redlock.rwlock("index:products")?;
    /// let r = rw.read(Duration::from_secs(10)).await?; // shared with other readers
    /// r.release().await?;
    /// let w = rw.write(Duration::from_secs(10)).await?; // alone: no reader, no other writer
    /// w.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// There is no upgrade from read to write: two readers that both wait to upgrade each wait
    /// for the other's share to go, for ever. Release the read share and take the write lock
    /// (and check again what you read).
    ///
    /// Errors: [`InvalidInput`] for an empty name or one starting with `~`.
    pub fn rwlock(&self, name: impl Into<String>) -> Result<RwLock> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource.into());
        }
        if name.starts_with(RESERVED) {
            return Err(InvalidInput::ReservedResource(name).into());
        }
        let rw = RwLock {
            redlock: self.clone(),
            name,
        };
        let mut keys = rw.keys().to_vec();
        keys.push(self.key(&rw.part("r:x")));
        if self.inner.fencing {
            keys.push(self.fence_key(&rw.part("w")));
        }
        self.check_slots(&keys)?;
        Ok(rw)
    }
}

/// Which side an attempt takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

impl RwLock {
    /// The name given to [`Redlock::rwlock`].
    pub fn name(&self) -> &str {
        &self.name
    }

    fn part(&self, part: &str) -> String {
        crate::slots::rwlock_part(RESERVED, &self.name, part)
    }

    /// The writer key, the writer-waiting key, the readers set.
    fn keys(&self) -> [String; 3] {
        ["w", "i", "r"].map(|p| self.redlock.key(&self.part(p)))
    }

    /// Takes a read share for `ttl`, retrying per the Redlock's [`Retry`] while a writer holds
    /// or waits for the lock, or nodes fail. Errors as [`Redlock::acquire`].
    ///
    /// Cancellation: dropping the future releases whatever the current attempt may have set,
    /// on every node, in the background.
    pub async fn read(&self, ttl: Duration) -> Result<ReadGuard> {
        let lock = self
            .acquire(Side::Read, ttl, self.redlock.inner.retry, None)
            .await?;
        Ok(ReadGuard { lock })
    }

    /// Like [`read`](Self::read), bounded by `wait` instead of a number of attempts (as
    /// [`Redlock::acquire_with`]; `Duration::MAX` waits without a limit).
    ///
    /// Cancellation: as for [`read`](Self::read).
    pub async fn read_with(&self, ttl: Duration, wait: Duration) -> Result<ReadGuard> {
        let lock = self
            .acquire(Side::Read, ttl, self.redlock.inner.retry, Some(wait))
            .await?;
        Ok(ReadGuard { lock })
    }

    /// One attempt at a read share: `Ok(None)` when a writer holds or waits for the lock.
    ///
    /// Cancellation: as for [`read`](Self::read).
    pub async fn try_read(&self, ttl: Duration) -> Result<Option<ReadGuard>> {
        match self.acquire(Side::Read, ttl, Retry::once(), None).await {
            Ok(lock) => Ok(Some(ReadGuard { lock })),
            Err(Error::Contended { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Takes the write lock for `ttl`, retrying per the Redlock's [`Retry`] while readers or
    /// another writer hold it, or nodes fail. While it waits, new readers are refused (readers
    /// already in keep their shares until they release or expire). Errors as
    /// [`Redlock::acquire`].
    ///
    /// Cancellation: dropping the future releases whatever the current attempt may have set,
    /// and this writer's waiting mark, on every node, in the background.
    pub async fn write(&self, ttl: Duration) -> Result<WriteGuard> {
        let lock = self
            .acquire(Side::Write, ttl, self.redlock.inner.retry, None)
            .await?;
        Ok(WriteGuard {
            lock,
            rw: self.clone(),
        })
    }

    /// Like [`write`](Self::write), bounded by `wait` instead of a number of attempts.
    ///
    /// Cancellation: as for [`write`](Self::write).
    pub async fn write_with(&self, ttl: Duration, wait: Duration) -> Result<WriteGuard> {
        let lock = self
            .acquire(Side::Write, ttl, self.redlock.inner.retry, Some(wait))
            .await?;
        Ok(WriteGuard {
            lock,
            rw: self.clone(),
        })
    }

    /// One attempt at the write lock: `Ok(None)` when readers or a writer hold it (its waiting
    /// mark is removed again at once).
    ///
    /// Cancellation: as for [`write`](Self::write).
    pub async fn try_write(&self, ttl: Duration) -> Result<Option<WriteGuard>> {
        match self.acquire(Side::Write, ttl, Retry::once(), None).await {
            Ok(lock) => Ok(Some(WriteGuard {
                lock,
                rw: self.clone(),
            })),
            Err(Error::Contended { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The retry loop: the policy's pauses, its attempts (or `wait`), as a lock's acquire
    /// without wake-ups. A writer's waiting mark is removed when the call ends, however it ends.
    async fn acquire(
        &self,
        side: Side,
        ttl: Duration,
        retry: Retry,
        wait: Option<Duration>,
    ) -> Result<Lock> {
        // Validates the TTL as a lock's (the names are ours).
        let req = self.redlock.request_unchecked(vec![self.part("w")], ttl)?;
        let span =
            tracing::debug_span!("fredlock.rwlock", name = %self.name, write = side == Side::Write);
        let mark = (side == Side::Write).then(|| Mark::new(self, ttl));
        let give_up = wait.and_then(|w| Instant::now().checked_add(w));
        let mut attempts: u32 = 0;
        let result = tracing::Instrument::instrument(
            async {
                loop {
                    attempts = attempts.saturating_add(1);
                    let mark_value = mark.as_ref().map(|m| m.value());
                    let failure = match self.attempt(side, &req, mark_value).await {
                        Ok(lock) => return Ok(lock),
                        Err(Failure::Rejected(e)) => return Err(e.into()),
                        Err(f) => f,
                    };
                    if let Failure::Unavailable(votes) = &failure {
                        let subject = format!("read-write lock {}", self.name);
                        let quorum = self.redlock.quorum();
                        if let Some(e) = crate::error::not_permitted(subject, votes, quorum) {
                            return Err(e);
                        }
                    }
                    let pause = retry.delay + random_up_to(retry.jitter);
                    let now = Instant::now();
                    let out_of_time =
                        give_up.is_some_and(|g| now.checked_add(pause).is_none_or(|t| t >= g));
                    if out_of_time || (wait.is_none() && attempts >= retry.attempts) {
                        return Err(self.failed(failure, attempts, ttl));
                    }
                    tokio::time::sleep(pause).await;
                }
            },
            span,
        )
        .await;
        if let Some(mark) = mark {
            mark.remove().await;
        }
        result
    }

    fn failed(&self, failure: Failure, attempts: u32, ttl: Duration) -> Error {
        let resources = Names(vec![self.name.clone()]);
        match failure {
            Failure::Contended(votes) | Failure::Queued(votes, _) => Error::Contended {
                resources,
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

    /// One attempt of either side: one script call per node, a quorum grant or a clean-up.
    async fn attempt(
        &self,
        side: Side,
        req: &crate::redlock::Request,
        mark: Option<&str>,
    ) -> std::result::Result<Lock, Failure> {
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
            return Err(Failure::Expired(Duration::ZERO));
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
                match side {
                    Side::Read => Acquired::plain(crate::reply::vote(&name, reply)),
                    Side::Write => crate::reply::fenced_acquire(&name, reply, 1),
                }
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
        let votes = Votes(
            answers
                .into_iter()
                .map(|a| {
                    let a = a.unwrap_or(Acquired::plain(Vote::Pending));
                    counters.push(a.counters);
                    a.vote
                })
                .collect(),
        );
        crate::metrics::failures(&votes.0);
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
    fn plan(&self, side: Side, req: &crate::redlock::Request, mark: Option<&str>) -> Plan {
        let inner = &self.redlock.inner;
        let scripts = crate::scripts::Scripts::get();
        let value = crate::owner::value(&new_token(), &inner.label);
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

    /// Every node's writer, waiting writer and readers (label, token fingerprint, TTL). One read
    /// per node, waiting for every node (each bounded by the per-node timeout, default 500 ms).
    ///
    /// Cancellation: safe (read-only).
    pub async fn inspect(&self) -> Result<RwInspection> {
        let inner = &self.redlock.inner;
        let keys = Arc::new(self.keys().to_vec());
        let timeout = inner.node_timeout.unwrap_or(Duration::from_millis(500));
        let scripts = crate::scripts::Scripts::get();
        let calls = inner.nodes.iter().enumerate().map(|(n, node)| {
            let call = node.clone().eval_script(
                &scripts.rw_view,
                keys.clone(),
                Arc::new(Vec::new()),
                None,
                timeout,
            );
            let name = node.name.clone();
            (n, async move { crate::reply::rw_view(&name, call.await) })
        });
        let answers = fan_out(inner.nodes.len(), calls, None, Late::Drop, |_| false).await;
        let nodes = answers
            .into_iter()
            .zip(&inner.nodes)
            .map(|(answer, node)| RwNodeView {
                node: node.name.clone(),
                state: match answer {
                    Some(Ok(pairs)) => Ok(node_state(&pairs)),
                    Some(Err(e)) => Err(e),
                    None => Err(NodeError {
                        node: node.name.clone(),
                        kind: NodeErrorKind::Timeout,
                        message: "no answer".into(),
                    }),
                },
            })
            .collect();
        Ok(RwInspection {
            name: self.name.clone(),
            quorum: inner.quorum,
            nodes,
        })
    }
}

/// One attempt's script, keys and arguments, and what it would hold (see [`RwLock::plan`]).
struct Plan {
    resource: String,
    script: &'static crate::scripts::Script,
    keys: Vec<String>,
    argv: Vec<Value>,
    held: Arc<Held>,
    fenced: bool,
}

/// A writer's waiting mark: one value for every attempt of one call, removed from every node
/// when the call ends (granted, given up or dropped).
struct Mark {
    redlock: Redlock,
    held: Arc<Held>,
    ttl: Duration,
    /// Removed already (by [`remove`](Self::remove)); otherwise a drop removes it.
    removed: bool,
}

impl Mark {
    fn new(rw: &RwLock, ttl: Duration) -> Mark {
        Mark {
            redlock: rw.redlock.clone(),
            held: Arc::new(Held {
                keys: vec![rw.keys()[1].clone()],
                value: new_token(),
                custom: false,
                resources: vec![rw.part("i")],
                fence_keys: Vec::new(),
                line: None,
            }),
            ttl,
            removed: false,
        }
    }

    fn value(&self) -> &str {
        &self.held.value
    }

    /// Removes the mark from every node: handed to each node's connection before this returns,
    /// so this process's next commands (a try_read right after a failed try_write) land after
    /// it.
    async fn remove(mut self) {
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

/// The methods both guards share: each is its [`Lock`].
macro_rules! guard_methods {
    ($guard:ident) => {
        impl $guard {
            /// The guard as the lock it is (on its own key).
            pub fn lock(&self) -> &Lock {
                &self.lock
            }

            /// The secret owner token (see [`Lock::token`]).
            pub fn token(&self) -> &str {
                self.lock.token()
            }

            /// The owner label stored with it (see [`Lock::label`]).
            pub fn label(&self) -> Option<&str> {
                self.lock.label()
            }

            /// The token's public fingerprint (see [`Lock::fingerprint`]).
            pub fn fingerprint(&self) -> String {
                self.lock.fingerprint()
            }

            /// When it must be considered lost (see [`Lock::deadline`]).
            pub fn deadline(&self) -> Instant {
                self.lock.deadline()
            }

            /// Validity left.
            pub fn remaining(&self) -> Duration {
                self.lock.remaining()
            }

            /// Extends it, as [`Lock::extend`].
            ///
            /// Cancellation: as for [`Lock::extend`].
            pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
                self.lock.extend(ttl).await
            }

            /// Releases it, as [`Lock::release`].
            ///
            /// Cancellation: dropping the future still releases, in the background.
            pub async fn release(self) -> Result<ReleaseReport> {
                self.lock.release().await
            }

            /// Keeps it alive in the background, with the same lost signal as a lock
            /// ([`Lock::keep_alive`]).
            pub fn keep_alive(self) -> KeepAlive {
                self.lock.keep_alive()
            }

            /// [`keep_alive`](Self::keep_alive) with options ([`Lock::keep_alive_with`]).
            pub fn keep_alive_with(
                self,
                options: KeepAliveOptions,
            ) -> std::result::Result<KeepAlive, Box<Rejected>> {
                self.lock.keep_alive_with(options)
            }

            /// The lock this guard is.
            pub fn into_lock(self) -> Lock {
                self.lock
            }
        }
    };
}

guard_methods!(ReadGuard);
guard_methods!(WriteGuard);

impl WriteGuard {
    /// Turns the write lock into a read share for `ttl` without a gap: on every node, in one
    /// step, where the writer key still holds this writer's value, a reader key is set and the
    /// writer key deleted. No other writer can get in between, and readers that waited behind
    /// this writer may join as soon as it is done. The share's deadline counts from the start of
    /// this call, as an acquire's.
    ///
    /// Errors: [`Error::NotHeld`] when a quorum no longer held the write lock (or its deadline
    /// passed first), [`Error::Unavailable`] when too few nodes answered; either way nothing is
    /// held any more: the write lock and whatever share was set are released on every node.
    /// [`Error::InvalidInput`] for a bad TTL (the write lock is then released too).
    ///
    /// Cancellation: dropping the future releases the write lock and the share on every node, in
    /// the background.
    pub async fn downgrade(self, ttl: Duration) -> Result<ReadGuard> {
        let WriteGuard { lock, rw } = self;
        let until = lock.deadline();
        let writer_ttl = lock.ttl();
        let req = rw.redlock.request_unchecked(vec![rw.part("w")], ttl)?;
        let (writer, _) = lock.disarm();
        let redlock = &rw.redlock;
        let inner = &redlock.inner;
        // Armed until settled: a dropped downgrade releases both keys everywhere.
        let mut wguard = Cleanup(Some((redlock.clone(), writer.clone())), writer_ttl);
        let resource = rw.part(&format!("r:{}", new_token()));
        let key = redlock.key(&resource);
        let value = crate::owner::value(&new_token(), &inner.label);
        let reader = Arc::new(Held {
            keys: vec![key.clone()],
            value: value.clone(),
            custom: false,
            resources: vec![resource],
            fence_keys: Vec::new(),
            line: None,
        });
        let mut rguard = Cleanup(Some((redlock.clone(), reader.clone())), req.ttl);
        let [w, _, r] = rw.keys();
        let keys = Arc::new(vec![w, r, key]);
        let argv = Arc::new(vec![
            Value::from(writer.value.as_str()),
            Value::from(value.as_str()),
            Value::Integer(req.ttl_ms as i64),
        ]);
        let t0 = Instant::now();
        let deadline = t0.checked_add(req.validity).map(|d| d.min(until));
        let script = &crate::scripts::Scripts::get().rw_downgrade;
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
            (n, async move { crate::reply::vote(&name, call.await) })
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
        crate::metrics::failures(&votes.0);
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
                };
                let lock = Lock::from_grant(redlock.clone(), grant, req.ttl);
                return Ok(ReadGuard { lock });
            }
        }
        let all = 0..inner.nodes.len();
        inner.release_unawaited(&reader, all.clone(), req.ttl).await;
        inner.release_unawaited(&writer, all, writer_ttl).await;
        wguard.0 = None;
        rguard.0 = None;
        if now >= until {
            return Err(Error::NotHeld {
                resources: Names(vec![rw.name.clone()]),
                reason: crate::error::NotHeldReason::Expired,
                votes,
            });
        }
        Err(inner.names_failure(
            Names(vec![rw.name.clone()]),
            crate::error::Round::Extend,
            votes,
        ))
    }

    /// The write lock's fencing token (with [`fencing_tokens`](crate::Builder::fencing_tokens)):
    /// strictly larger than that of every earlier writer of this lock. Readers have none.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }
}
