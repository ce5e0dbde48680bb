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
//! Waiting uses the Redlock's [`Retry`](crate::Retry) policy: readers and writers poll every
//! node at its pace. Unlike plain locks and semaphores they do not wait in a wait line, and a
//! release sends them no wake-up (a waiting writer still gets in ahead of new readers, through
//! its mark).
//!
//! Owns: [`RwLock`], its guards, the read and write calls and their retry loop, inspect. The
//! rounds themselves (one attempt, the downgrade) are `rwlock_round`'s.
//! Must not: count readers without a quorum, or send a round's commands itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Error, NodeError, NodeErrorKind, Result};
use crate::hold::keepalive::{KeepAlive, KeepAliveOptions, Rejected};
use crate::ops::inspect::{node_state, RwInspection, RwNodeView};
use crate::primitives::rwlock_round::{Mark, RwRounds, Side};
use crate::rounds::attempt::Failure;
use crate::rounds::lock::{Lock, ReleaseReport};
use crate::rounds::quorum::{fan_out, Late};
use crate::rounds::redlock::{random_up_to, Redlock, Retry};

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
pub struct WriteGuard {
    lock: Lock,
    rw: RwLock,
}

impl std::fmt::Debug for WriteGuard {
    // The lock (which never shows its token), not the Redlock behind it again.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("rwlock", &self.rw.name)
            .field("lock", &self.lock)
            .finish()
    }
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
    /// Errors: [`InvalidInput`](crate::InvalidInput) for an empty name, one over
    /// [`MAX_RESOURCE_LEN`](crate::MAX_RESOURCE_LEN) bytes, or one starting with `~`.
    pub fn rwlock(&self, name: impl Into<String>) -> Result<RwLock> {
        let name = name.into();
        crate::base::slots::check_name(&name)?;
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

impl RwLock {
    /// The name given to [`Redlock::rwlock`].
    pub fn name(&self) -> &str {
        &self.name
    }

    fn part(&self, part: &str) -> String {
        self.rounds().part(part)
    }

    /// The writer key, the writer-waiting key, the readers set.
    fn keys(&self) -> [String; 3] {
        self.rounds().keys()
    }

    /// The lock as its rounds see it.
    fn rounds(&self) -> RwRounds<'_> {
        RwRounds {
            redlock: &self.redlock,
            name: &self.name,
        }
    }

    /// Takes a read share for `ttl`, retrying per the Redlock's [`Retry`] while a writer holds
    /// or waits for the lock, or nodes fail. The retries poll (no wait line, no wake-up on a
    /// release: see the module's docs). Errors as [`Redlock::acquire`];
    /// [`Error::Contended`]'s `held_by` is [`HeldBy::WriterHoldsOrWaits`](crate::HeldBy::WriterHoldsOrWaits).
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
    /// already in keep their shares until they release or expire). The retries poll (no wait
    /// line, no wake-up on a release). Errors as [`Redlock::acquire`]; [`Error::Contended`]
    /// says who was in the way in its `held_by`: [`HeldBy::Readers`](crate::HeldBy::Readers)
    /// when only readers held it, [`HeldBy::Writer`](crate::HeldBy::Writer) when a writer did.
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
        let mark = (side == Side::Write).then(|| Mark::new(&self.rounds(), ttl));
        let give_up = wait.and_then(|w| Instant::now().checked_add(w));
        // `close()` waits for this call to end, and refuses it once closed.
        let holds = &self.redlock.inner.holds;
        let Some(_in_flight) = holds.acquiring() else {
            return Err(crate::rounds::acquire_loop::closed(std::slice::from_ref(
                &self.name,
            )));
        };
        let mut attempts: u32 = 0;
        let result = tracing::Instrument::instrument(
            async {
                loop {
                    attempts = attempts.saturating_add(1);
                    let mark_value = mark.as_ref().map(|m| m.value());
                    let failure = match self.rounds().attempt(side, &req, mark_value).await {
                        Ok(lock) => return Ok(lock),
                        Err((Failure::Rejected(e), _)) => return Err(e.into()),
                        Err(f) => f,
                    };
                    if let (Failure::Unavailable(votes), _) = &failure {
                        let subject = format!("read-write lock {}", self.name);
                        let quorum = self.redlock.quorum();
                        if let Some(e) = crate::base::error::not_permitted(subject, votes, quorum) {
                            return Err(e);
                        }
                    }
                    let pause = retry.delay + random_up_to(retry.jitter);
                    let now = Instant::now();
                    let out_of_time =
                        give_up.is_some_and(|g| now.checked_add(pause).is_none_or(|t| t >= g));
                    if out_of_time || (wait.is_none() && attempts >= retry.attempts) {
                        return Err(self.rounds().failed(failure, attempts, ttl));
                    }
                    tokio::select! {
                        () = holds.closing() => {
                            return Err(crate::rounds::acquire_loop::closed(std::slice::from_ref(&self.name)));
                        }
                        () = tokio::time::sleep(pause) => {}
                    }
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

    /// Every node's writer, waiting writer and readers (label, token fingerprint, TTL). One read
    /// per node, waiting for every node (each bounded by the per-node timeout, default 500 ms).
    ///
    /// Cancellation: safe (read-only).
    pub async fn inspect(&self) -> Result<RwInspection> {
        let inner = &self.redlock.inner;
        let keys = Arc::new(self.keys().to_vec());
        let timeout = inner.node_timeout.unwrap_or(Duration::from_millis(500));
        let scripts = crate::base::scripts::Scripts::get();
        let calls = inner.nodes.iter().enumerate().map(|(n, node)| {
            let call = node.clone().eval_script(
                &scripts.rw_view,
                keys.clone(),
                Arc::new(Vec::new()),
                None,
                timeout,
            );
            let name = node.name.clone();
            (
                n,
                async move { crate::base::reply::rw_view(&name, call.await) },
            )
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
        let lock = rw.rounds().downgrade(lock, ttl).await?;
        Ok(ReadGuard { lock })
    }

    /// The write lock's fencing token (with [`fencing_tokens`](crate::Builder::fencing_tokens)):
    /// strictly larger than that of every earlier writer of this lock. Readers have none.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }
}
