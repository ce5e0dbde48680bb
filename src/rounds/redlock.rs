//! Redlock itself: acquire with retries, try_acquire, inspect; and the extend/release rounds
//! that [`Lock`] runs. The algorithm lives here and nowhere else; it never parses a reply
//! (that is [`crate::nodes::node`]) and never counts votes by hand (that is [`crate::rounds::quorum`]).
//!
//! Owns: [`Redlock`] and its shared state, one acquire attempt (with its clean-up), the extend and
//! release rounds. Must not: parse replies (node), count votes by hand (quorum), keep background
//! work's books (background), or build a `Lock` (the layer above does, from a `Grant`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::error::{Error, InvalidInput, Names, NotHeldReason, Result, Round, Vote, Votes};
use crate::base::line::{Line, LEASE};
use crate::nodes::node::{Acquired, Held, LineRef, Node, Queue};
use crate::nodes::node_extend_many::Extension;
use crate::nodes::subscriber::Subscribers;
pub(crate) use crate::rounds::background::spawn_release;
use crate::rounds::background::{self, Background, CleanupGuard, Releaser};
use crate::rounds::quorum::{
    self, each_known, fan_out, fan_out_handed, item_votes, quorum_known, votes, AsVote, Late,
    Outcome,
};

/// A Redlock over N independent Redis nodes. Cheap to clone (one `Arc`); share it freely
/// across tasks.
#[derive(Clone, Debug)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) quorum: usize,
    pub(crate) retry: Retry,
    pub(crate) drift_factor: f64,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) key_prefix: String,
    /// The owner label stored with every lock that does not name its own (validated; empty:
    /// none).
    pub(crate) label: String,
    /// Hand out fencing tokens with every lock (one counter per resource on every node).
    pub(crate) fencing: bool,
    /// Releases spawned from drop paths that may not have reached fred's queues yet.
    pub(crate) background: Background,
    /// The keep-alive renewer of this Redlock (a handle the `renewal` layer above keeps here).
    pub(crate) renewer: Slot,
    /// The waiting acquires of this Redlock as members of the gates' wait lines.
    pub(crate) line: Arc<Line>,
    /// Wake-ups on release: the subscriber connections (`None`: off, or no node can have a
    /// subscriber; waiters in a line probe their gate at the retry pace).
    pub(crate) wake: Option<Subscribers>,
}

/// A value that a higher layer keeps per Redlock (the keep-alive renewer's handle), stored
/// type-erased so that this layer does not depend on the layer that defines it.
#[derive(Default)]
pub(crate) struct Slot(std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Slot {
    /// The stored `T` if there is one and `usable` says it still is; otherwise `make()`'s, which
    /// replaces whatever was stored. Atomic: two callers never both make one.
    pub(crate) fn get_or_replace<T: Clone + Send + 'static>(
        &self,
        usable: impl FnOnce(&T) -> bool,
        make: impl FnOnce() -> T,
    ) -> T {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(current) = slot.as_ref().and_then(|b| b.downcast_ref::<T>()) {
            if usable(current) {
                return current.clone();
            }
        }
        let fresh = make();
        *slot = Some(Box::new(fresh.clone()));
        fresh
    }
}

/// One lock's request in a batched extend round ([`Inner::extend_many`]).
pub(crate) struct ExtendRequest {
    pub(crate) held: Arc<Held>,
    pub(crate) ttl: Duration,
    /// The lock's current deadline: the round must be decided before it.
    pub(crate) deadline: Instant,
}

/// Earlier releases timed a waiting acquire's fallback poll as this many retry pauses. Waiting
/// acquires now keep a place in their resource's wait line and are woken in turn (see
/// [`Retry`]); nothing reads this constant any more.
#[deprecated(note = "waiting acquires now wait in line; see `Retry`")]
pub const FALLBACK_FACTOR: u32 = 4;

pub(crate) use crate::base::slots::RESERVED;

/// How [`Redlock::acquire`] retries while the lock is held by someone else or nodes fail.
///
/// Between attempts it sleeps `delay` plus a uniformly random extra of up to `jitter`, so that
/// contenders spread out instead of colliding again. There is no sleep after the last attempt.
///
/// **Waiting in line.** An acquire of ONE resource (a lock, a semaphore, an election) that has
/// to wait takes a place in the resource's wait line, on one node chosen by the resource's name
/// (its gate), which grants its vote only to the line's head: the fleet's waiters take turns in
/// arrival order instead of racing each other on every node. With wake-ups
/// ([`Builder::wake_on_release`](crate::Builder::wake_on_release), on by default) the head is
/// woken by the release that frees the lock; the others keep their place with one command per
/// second. Without wake-ups, the head asks the gate every `delay + random(0..=jitter)`, the
/// others one pause per place behind the head (up to 8). Either way `attempts` is a budget of waiting TIME: an acquire
/// gives up once it has waited `attempts - 1` pauses (a wait in line counts as the pauses it
/// lasted), so it waits about as long as with plain polling; `acquire_with`'s `wait` bounds it
/// instead (no attempt starts after it). Several resources locked at once wait by polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Every attempt counts, the first included: 1 = a single try. Must be at least 1.
    pub attempts: u32,
    /// Fixed part of the pause between attempts.
    pub delay: Duration,
    /// Random extra pause, uniform in `[0, jitter]`.
    pub jitter: Duration,
}

impl Default for Retry {
    /// 10 attempts, 200 ms apart plus up to 100 ms of jitter (at most about 2.7 s of waiting).
    fn default() -> Self {
        Retry {
            attempts: 10,
            delay: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
        }
    }
}

impl Retry {
    /// A single attempt, no waiting.
    pub const fn once() -> Self {
        Retry {
            attempts: 1,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        if self.attempts == 0 {
            return Err(InvalidInput::ZeroAttempts);
        }
        if self.delay.checked_add(self.jitter).is_none()
            || self.delay + self.jitter > Duration::from_secs(86_400 * 365)
        {
            return Err(InvalidInput::RetryTooLarge);
        }
        Ok(())
    }
}

/// One or several resource names: `&str`, `String`, arrays, slices and vectors of them.
///
/// Several resources are locked all or nothing (one script per node). Names are sorted and
/// de-duplicated; [`Lock::resources`](crate::Lock::resources) returns that normalised list.
pub trait Resources {
    /// The resource names, as given.
    fn into_names(self) -> Vec<String>;
}

impl Resources for &str {
    fn into_names(self) -> Vec<String> {
        vec![self.to_string()]
    }
}
impl Resources for String {
    fn into_names(self) -> Vec<String> {
        vec![self]
    }
}
impl Resources for &String {
    fn into_names(self) -> Vec<String> {
        vec![self.clone()]
    }
}
impl<T: AsRef<str>, const N: usize> Resources for [T; N] {
    fn into_names(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}
impl<T: AsRef<str>> Resources for &[T] {
    fn into_names(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}
impl<T: AsRef<str>> Resources for Vec<T> {
    fn into_names(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}

/// A validated acquire request: the same for every attempt of one call.
pub(crate) struct Request {
    pub(crate) resources: Vec<String>,
    pub(crate) keys: Vec<String>,
    /// With fencing: each key's counter; empty otherwise.
    fence_keys: Vec<String>,
    pub(crate) ttl: Duration,
    pub(crate) ttl_ms: u64,
    pub(crate) validity: Duration,
    pub(crate) timeout: Duration,
    /// The owner label to store (validated; empty: none).
    pub(crate) label: String,
    /// The caller's token (validated), used by every attempt; `None`: a fresh one per attempt.
    pub(crate) token: Option<String>,
    /// A single key's wait line: its gate node and the line's key.
    pub(crate) line: Option<(usize, String)>,
}

/// What one attempt of a waiting acquire is (see `lock`'s retry loop).
#[derive(Debug, Clone, Default)]
pub(crate) struct Turn {
    /// The waiter's member in the wait line (`None`: the acquire does not wait).
    pub(crate) member: Option<Arc<str>>,
    /// Ask the gate alone first, and the other nodes only once it granted: a waiter that is
    /// not known to be the line's head must not set keys elsewhere (it would split the votes
    /// of the head the gate is handing the lock to).
    pub(crate) probe: bool,
    /// Set by the attempt: the gate granted (and so took the member out of its line).
    pub(crate) gated: Arc<std::sync::atomic::AtomicBool>,
}

impl Request {
    /// The value one attempt stores, and whether its token is the caller's.
    pub(crate) fn value(&self) -> (String, bool) {
        match &self.token {
            Some(token) => (crate::base::owner::value(token, &self.label), true),
            None => (crate::base::owner::value(&new_token(), &self.label), false),
        }
    }
}

/// Why one attempt did not produce a lock.
pub(crate) enum Failure {
    Contended(Votes),
    /// Contended, and the gate put the waiter in the key's wait line (or told its place).
    Queued(Votes, Queue),
    Unavailable(Votes),
    Expired(Duration),
    /// Not worth retrying (for example a semaphore used with another number of permits).
    Rejected(InvalidInput),
}

/// One attempt's grant: the keys and token, and the validity window `[t0, deadline]`.
pub(crate) struct Grant {
    pub(crate) held: Arc<Held>,
    pub(crate) t0: Instant,
    pub(crate) deadline: Instant,
    /// With fencing: each key's token, written back to a quorum.
    pub(crate) fencing: Option<Vec<u64>>,
}

/// Per key: one more than the largest counter among the nodes that granted.
pub(crate) fn fencing_tokens(
    votes: &Votes,
    counters: &[Option<Vec<u64>>],
    keys: usize,
) -> Vec<u64> {
    (0..keys)
        .map(|k| {
            let max = votes
                .0
                .iter()
                .zip(counters)
                .filter(|(v, _)| **v == Vote::Granted)
                .filter_map(|(_, c)| c.as_ref()?.get(k).copied())
                .max()
                .unwrap_or(0);
            max.saturating_add(1)
        })
        .collect()
}

impl AsVote for Acquired {
    fn as_vote(&self) -> &Vote {
        &self.vote
    }
}

impl Redlock {
    pub(crate) fn from_inner(inner: Inner) -> Redlock {
        Redlock {
            inner: Arc::new(inner),
        }
    }

    /// How many nodes must agree: `nodes / 2 + 1` of the configured nodes.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The configured nodes as `host:port/db` (no credentials), in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.inner.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The fred client of node `index`, for commands of your own (for example reading the data
    /// the lock protects). `None` when out of range, and for a Redis Cluster node (fredlock
    /// keeps one client per shard of it; use a cluster client of your own there). It is configured for locking: one attempt
    /// per command (no replay after a reconnect) and a bounded queue; pass your own options
    /// (`with_options`) or use a separate client where retries are wanted.
    pub fn client(&self, index: usize) -> Option<&fred::clients::Client> {
        self.inner.nodes.get(index).and_then(|n| n.client())
    }

    /// Closes the connections this `Redlock` opened (clients given with `clients()` are left
    /// open), after the commands already queued on them, such as releases still finishing in the
    /// background, have been answered. Call it before a short-lived process exits. Every clone
    /// of this `Redlock` is affected: later commands fail with [`Error::Unavailable`].
    ///
    /// Cancellation: dropping the future may leave some connections open until the `Redlock`
    /// is dropped.
    pub async fn close(&self) {
        self.inner.background.wait_idle().await;
        self.inner.background.close();
        if let Some(wake) = &self.inner.wake {
            wake.close().await;
        }
        let quits = self.inner.nodes.iter().map(|n| n.close());
        futures::future::join_all(quits).await;
    }

    /// The node (an index into [`node_names`](Self::node_names)) that keeps `resource`'s wait
    /// line: the acquires that wait for it take turns there (see [`Retry`]). Every process that
    /// lists the same nodes, in any order, picks the same one. `None` when no configured node
    /// is a single server (cluster nodes keep no line; waiters poll).
    pub fn line_node(&self, resource: &str) -> Option<usize> {
        self.inner.gate_of(&self.key(resource))
    }

    /// The Redis key that holds `resource`'s lock on every node.
    pub fn key(&self, resource: &str) -> String {
        format!("{}{}", self.inner.key_prefix, resource)
    }

    /// The Redis key of `resource`'s fencing counter on every node (with
    /// [`fencing_tokens`](crate::Builder::fencing_tokens)). It never expires: see the
    /// persistence note there.
    pub fn fence_key(&self, resource: &str) -> String {
        crate::base::slots::fence_key(&self.inner.key_prefix, RESERVED, resource)
    }

    /// The Redis key of `resource`'s election record on every node: a hash with the current
    /// term's number, campaign value and priority (see [`Redlock::leader_of`]). Like the
    /// fencing counter it never expires; it only counts while the lock key holds the term's
    /// token. Changes to it are published on a channel of the same name.
    pub fn election_key(&self, resource: &str) -> String {
        crate::base::slots::derived_key(&self.inner.key_prefix, RESERVED, "elect", resource)
    }

    /// The key of a pending request to `resource`'s leader to yield to a preferred candidate
    /// (it expires by itself).
    pub(crate) fn yield_key(&self, resource: &str) -> String {
        crate::base::slots::derived_key(&self.inner.key_prefix, RESERVED, "yield", resource)
    }

    /// Gives `req` fencing counters (as with fencing on for the whole Redlock), so that its
    /// grant carries a fencing token.
    pub(crate) fn fence_request(&self, req: &mut Request) -> Result<()> {
        if !req.fence_keys.is_empty() {
            return Ok(());
        }
        let fence_keys: Vec<String> = req.resources.iter().map(|r| self.fence_key(r)).collect();
        for (key, fence) in req.keys.iter().zip(&fence_keys) {
            self.check_slots(&[key.clone(), fence.clone()])?;
        }
        req.fence_keys = fence_keys;
        Ok(())
    }

    /// On a Redlock with a Redis Cluster node, `keys` must share one hash slot (one script takes
    /// them all); `Ok` otherwise, or when they do.
    pub(crate) fn check_slots(&self, keys: &[String]) -> std::result::Result<(), InvalidInput> {
        if !self.inner.nodes.iter().any(|n| n.is_cluster()) {
            return Ok(());
        }
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let slot = crate::base::slots::slot(first);
        if keys.iter().all(|k| crate::base::slots::slot(k) == slot) {
            return Ok(());
        }
        Err(InvalidInput::CrossSlot {
            keys: keys.to_vec(),
        })
    }

    pub(crate) fn request(&self, names: Vec<String>, ttl: Duration) -> Result<Request> {
        if names.is_empty() {
            return Err(InvalidInput::NoResources.into());
        }
        if names.iter().any(|n| n.is_empty()) {
            return Err(InvalidInput::EmptyResource.into());
        }
        if let Some(name) = names.iter().find(|n| n.starts_with(RESERVED)) {
            return Err(InvalidInput::ReservedResource(name.clone()).into());
        }
        self.request_unchecked(names, ttl)
    }

    /// [`request`](Self::request) without the reserved-name check (for fredlock's own keys,
    /// such as semaphore slots).
    pub(crate) fn request_unchecked(&self, names: Vec<String>, ttl: Duration) -> Result<Request> {
        let ttl_ms = quorum::ttl_millis(ttl)?;
        let validity = quorum::validity(ttl, self.inner.drift_factor)?;
        let mut resources = names;
        resources.sort();
        resources.dedup();
        let keys: Vec<String> = resources.iter().map(|r| self.key(r)).collect();
        let fence_keys: Vec<String> = if self.inner.fencing {
            resources.iter().map(|r| self.fence_key(r)).collect()
        } else {
            Vec::new()
        };
        for (key, fence) in keys.iter().zip(&fence_keys) {
            self.check_slots(&[key.clone(), fence.clone()])?;
        }
        let line = match keys.as_slice() {
            [key] => self
                .inner
                .gate_of(key)
                .map(|g| (g, crate::base::slots::line_key(&self.inner.key_prefix, key))),
            _ => None,
        };
        Ok(Request {
            resources,
            keys,
            fence_keys,
            ttl,
            ttl_ms,
            validity,
            timeout: self.inner.node_timeout(ttl),
            label: self.inner.label.clone(),
            token: None,
            line,
        })
    }

    /// One Redlock attempt with a fresh token (or the caller's).
    pub(crate) async fn attempt(
        &self,
        req: &Request,
        turn: &Turn,
    ) -> std::result::Result<Grant, Failure> {
        let (value, custom) = req.value();
        let held = Arc::new(Held {
            keys: req.keys.clone(),
            value,
            custom,
            resources: req.resources.clone(),
            fence_keys: req.fence_keys.clone(),
            line: req
                .line
                .as_ref()
                .map(|(gate, key)| self.inner.line_ref(*gate, key, turn)),
        });
        // Armed until the outcome is settled: if this future is dropped, release everywhere.
        let mut guard = CleanupGuard {
            inner: Some(self.inner.clone()),
            held: held.clone(),
            ttl: req.ttl,
        };
        let t0 = Instant::now();
        let Some(deadline) = t0.checked_add(req.validity) else {
            guard.inner = None;
            return Err(Failure::Expired(Duration::ZERO));
        };
        let (answers, sent) = match (&req.line, turn.probe) {
            (Some((gate, _)), true) => self.inner.probe_round(&held, req, *gate, deadline).await,
            _ => (self.inner.acquire_round(&held, req, deadline).await, None),
        };
        let at_gate = req
            .line
            .as_ref()
            .and_then(|(gate, _)| answers[*gate].as_ref());
        let queue = at_gate.and_then(|a| a.queue);
        if at_gate.is_some_and(|a| a.lined) {
            // Granted through a line: others are likely still waiting, so this process's next
            // acquire of the key asks the gate first.
            if let Some(key) = req.keys.first() {
                self.inner.line.mark_hot(key);
            }
        }
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
        crate::base::metrics::failures(&votes.0);
        let mut now = Instant::now();
        let span = tracing::Span::current();
        span.record("granted", votes.granted());
        span.record("failed", votes.failed());
        span.record("elapsed_us", now.duration_since(t0).as_micros() as u64);

        // A quorum without the gate while the gate keeps a line ahead of us is not taken (we
        // are behind its head, or do not wait and the gate refused for the line alone): the
        // head is being handed the lock. Giving up a grant is always safe. (The head itself
        // takes a quorum without the gate, whose key someone else holds.)
        let granted = quorum::outcome(&votes.0) == Outcome::Reached
            && !queue.is_some_and(|q| q.rank > 0 || (q.rank < 0 && q.pttl == -2));
        if let Some((gate, _)) = &req.line {
            // Granted there: the gate took the member out of its line. Otherwise (not answered
            // yet, or failed) a refusal there may still have put it in line: the retry loop
            // then leaves the line after a grant.
            turn.gated.store(
                votes.0.get(*gate) == Some(&Vote::Granted),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        let mut failure = None;
        if granted && now < deadline {
            if held.fence_keys.is_empty() {
                guard.inner = None;
                granted_line(&held);
                return Ok(Grant {
                    held,
                    t0,
                    deadline,
                    fencing: None,
                });
            }
            // Fencing: each token is one more than the largest counter the granting nodes
            // returned, and is written back to a quorum (a max-register) before the lock is
            // handed out, so that any later grant's quorum sees it and goes higher.
            let tokens = fencing_tokens(&votes, &counters, held.keys.len());
            let raised = self
                .inner
                .raise_fence(&held.fence_keys, &tokens, deadline, req.timeout)
                .await;
            now = Instant::now();
            if quorum::outcome(&raised.0) == Outcome::Reached && now < deadline {
                guard.inner = None;
                granted_line(&held);
                return Ok(Grant {
                    held,
                    t0,
                    deadline,
                    fencing: Some(tokens),
                });
            }
            if now < deadline {
                failure = Some(Failure::Unavailable(raised));
            }
        }
        // Release wherever our token may be: nodes that granted, failed or did not answer. The
        // release is handed to each node's connection (queued behind that node's SET, so it
        // lands after it) but not awaited: the call's time bound must not include it, and a
        // next attempt's SET is queued behind it in turn.
        let targets = (0..votes.0.len())
            .filter(|&i| votes.0[i] != Vote::Refused)
            .filter(|&i| sent.as_ref().is_none_or(|s| s[i]));
        self.inner.release_unawaited(&held, targets, req.ttl).await;
        guard.inner = None;
        // Out of validity with answers still outstanding: the TTL is too short for the network,
        // which is not the same as nodes being down.
        let expired_waiting = now >= deadline && votes.0.contains(&Vote::Pending);
        let failure = if let Some(failure) = failure {
            failure
        } else if granted || expired_waiting {
            Failure::Expired(now.duration_since(t0))
        } else if votes.failed() > self.inner.nodes.len() - self.inner.quorum
            || votes.refused() == 0
        {
            Failure::Unavailable(votes)
        } else if let Some(queue) = queue {
            Failure::Queued(votes, queue)
        } else {
            Failure::Contended(votes)
        };
        Err(failure)
    }
}

/// A granted lock's releases wake its line's head (its attempt's clean-up would have put the
/// waiter back in line instead).
fn granted_line(held: &Held) {
    if let Some(line) = &held.line {
        line.wake.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Inner {
    /// Every node at once (one round trip), decided as soon as the quorum is known.
    async fn acquire_round(
        &self,
        held: &Arc<Held>,
        req: &Request,
        deadline: Instant,
    ) -> Vec<Option<Acquired>> {
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().acquire(held.clone(), req.ttl_ms, req.timeout)));
        // A waiter that fails also waits for its gate's answer (its place in line), which a
        // grant does not (a slow gate must not slow grants down).
        let gate = held
            .line
            .as_ref()
            .filter(|l| l.member.is_some())
            .map(|l| l.gate);
        let q = self.quorum;
        // A late node's SET (or gate script) already taken by fred's router needs no task to
        // finish it (see `fan_out_handed`): the serial path then spawns nothing, and the
        // release that follows finds that node idle and is sent directly.
        let handed = |i: usize| self.nodes.get(i).is_some_and(|n| n.handed_over());
        fan_out_handed(
            self.nodes.len(),
            calls,
            Some(deadline),
            Late::Finish,
            handed,
            |a| {
                let granted = a
                    .iter()
                    .flatten()
                    .filter(|x| x.vote == Vote::Granted)
                    .count();
                quorum_known(a) && (granted >= q || gate.is_none_or(|g| a[g].is_some()))
            },
        )
        .await
    }

    /// The gate alone first; the other nodes only when it granted (two round trips, the
    /// validity counted from before the first). Also returns which nodes were sent anything
    /// (the others need no clean-up).
    async fn probe_round(
        &self,
        held: &Arc<Held>,
        req: &Request,
        gate: usize,
        deadline: Instant,
    ) -> (Vec<Option<Acquired>>, Option<Vec<bool>>) {
        let n = self.nodes.len();
        let call = self.nodes[gate]
            .clone()
            .acquire(held.clone(), req.ttl_ms, req.timeout);
        let mut first = fan_out(n, [(gate, call)], Some(deadline), Late::Finish, |a| {
            a[gate].is_some()
        })
        .await;
        let at_gate = first[gate].take();
        let mut sent = vec![false; n];
        sent[gate] = true;
        if at_gate.as_ref().is_none_or(|a| a.vote != Vote::Granted) {
            first[gate] = at_gate;
            return (first, Some(sent));
        }
        let q = self.quorum;
        let calls = (0..n).filter(|&i| i != gate).map(|i| {
            (
                i,
                self.nodes[i]
                    .clone()
                    .acquire(held.clone(), req.ttl_ms, req.timeout),
            )
        });
        let mut answers = fan_out(n, calls, Some(deadline), Late::Finish, |a| {
            let votes = a.iter().flatten().map(|x| &x.vote);
            let granted = 1 + votes.clone().filter(|v| **v == Vote::Granted).count();
            let lost = votes.filter(|v| **v != Vote::Granted).count();
            granted >= q || lost > n - q
        })
        .await;
        answers[gate] = at_gate;
        (answers, None)
    }

    /// The gate of `key`: rendezvous over the single servers' addresses (they can wake
    /// waiters). `None` without single servers: a Redis Cluster node cannot keep a line (the
    /// line's keys would have to move with a migrating slot; a multi-key script there is
    /// refused with TRYAGAIN mid-migration), so waiters on cluster-only Redlocks poll.
    pub(crate) fn gate_of(&self, key: &str) -> Option<usize> {
        let eligible = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.is_cluster())
            .map(|(i, n)| (i, n.addr.as_str()));
        crate::base::slots::gate(eligible, key)
    }

    /// This attempt's part in the line `key` on node `gate`.
    pub(crate) fn line_ref(self: &Arc<Self>, gate: usize, key: &str, turn: &Turn) -> LineRef {
        LineRef {
            gate,
            key: key.to_string(),
            member: turn.member.clone(),
            wake: std::sync::atomic::AtomicBool::new(false),
            local: self.line.clone(),
        }
    }

    /// Leaves line `line_key` on `gate` in the background (a waiter that gave up or was
    /// cancelled), waking the next head when the leaver was the head and a key is free; with no
    /// member, only that wake-up (a lock broken by force).
    /// A leave that fails (the gate frozen, restarting, loading) is retried while the place
    /// could still be there, see [`background::retry_leave`].
    pub(crate) fn leave_line(
        self: &Arc<Self>,
        gate: usize,
        keys: Vec<String>,
        line_key: String,
        member: String,
    ) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let node = self.nodes[gate].clone();
        let inner = self.clone();
        let spec = Arc::new((line_key, member, self.line.prefix().to_string()));
        let keys = Arc::new(keys);
        let timeout = self.release_timeout();
        // The place ends with its lease, renewed at the latest by the attempt that just ended.
        let until = Instant::now()
            .checked_add(LEASE)
            .unwrap_or_else(Instant::now);
        rt.spawn(async move {
            let leave = || node.clone().leave_line(keys.clone(), spec.clone(), timeout);
            if let Some(Some(woken)) = background::retry_leave(&*inner, until, leave).await {
                inner.line.woke(&woken);
            }
        });
    }

    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| quorum::default_node_timeout(ttl))
    }

    /// Hands a release to `targets` without waiting for the answers (they land in each node's
    /// order, after the commands queued before them). The answers are still read, in a task:
    /// a node whose release fails (at once: fred fails new commands while reconnecting, yet
    /// still writes what it had buffered; or later: a reset connection, a moved shard) is
    /// retried in the background; see [`background::finish_release`].
    pub(crate) async fn release_unawaited(
        self: &Arc<Self>,
        held: &Arc<Held>,
        targets: impl Iterator<Item = usize>,
        ttl: Duration,
    ) {
        let timeout = self.release_timeout();
        let mut failed = Vec::new();
        let mut late = Vec::new();
        // Each release is polled once here, which hands it to its node's connection (a cluster
        // node's, to a task of its own): the next attempt's commands queue behind it.
        for i in targets {
            let mut call = Box::pin(self.nodes[i].clone().release(held.clone(), timeout));
            match futures::poll!(call.as_mut()) {
                std::task::Poll::Ready(vote) if background::is_failed(&vote) => failed.push(i),
                std::task::Poll::Ready(_) => {}
                std::task::Poll::Pending => late.push((i, call)),
            }
        }
        // A caller's token is the same in every attempt of one acquire: a clean-up resent late
        // could delete what the NEXT attempt set. Not resent, the worst a failed clean-up leaves
        // is a key holding our own value until its TTL, which later attempts are refused by
        // (never granted by) and which this lock's extend and release treat as its own. (The
        // releases already sent still run; only their answers go unread.)
        if held.custom {
            failed.clear();
            late.clear();
        }
        background::finish_release(self, held, failed, late, ttl);
    }

    /// Raises the fencing counters `keys` to `tokens` on every node; returns once a quorum did
    /// (or can no longer), or at `deadline`.
    pub(crate) async fn raise_fence(
        &self,
        keys: &[String],
        tokens: &[u64],
        deadline: Instant,
        timeout: Duration,
    ) -> Votes {
        let fence = Arc::new((keys.to_vec(), tokens.to_vec()));
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().raise_fence(fence.clone(), timeout)));
        // A late raise only raises a counter further: nothing to finish.
        votes(
            fan_out(
                self.nodes.len(),
                calls,
                Some(deadline),
                Late::Drop,
                quorum_known,
            )
            .await,
        )
    }

    /// Releases on every node, deciding as soon as the outcome is known. (On a lock's gate the
    /// release wakes the head of its wait line.) Nodes whose release failed are retried in the
    /// background (see [`background::retry_release`]): a release can fail at once while a late
    /// SET of the same lock still waits in fred's queue for that node.
    pub(crate) async fn release_all(self: &Arc<Self>, held: &Arc<Held>, ttl: Duration) -> Votes {
        let votes = self
            .release_round(held, (0..self.nodes.len()).collect(), quorum_known)
            .await;
        background::retry_failed(self, held, &votes, ttl);
        votes
    }

    /// The release of a lock held for at least a minimum, before that minimum: every node lowers
    /// our keys' TTL to `ttl_ms` (never raising it) instead of deleting them, so they expire when
    /// the minimum ends. Decided as soon as a quorum's answer is known; a node that missed it
    /// keeps the keys until their TTL, which only holds the lock longer.
    pub(crate) async fn shorten_all(&self, held: &Arc<Held>, ttl_ms: u64) -> Votes {
        let timeout = self.release_timeout();
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().shorten(held.clone(), ttl_ms, timeout)));
        let votes = votes(fan_out(self.nodes.len(), calls, None, Late::Drop, quorum_known).await);
        crate::base::metrics::failures(&votes.0);
        votes
    }

    pub(crate) fn release_timeout(&self) -> Duration {
        self.node_timeout.unwrap_or(Duration::from_millis(500))
    }

    /// One extend round: every node resets the TTL if our token is still there. Succeeds with a
    /// quorum within the current validity; the new deadline counts from this round's start.
    pub(crate) async fn extend(
        &self,
        held: &Arc<Held>,
        ttl: Duration,
        current_deadline: Instant,
        patient: bool,
    ) -> Result<Instant> {
        let result = self
            .extend_round(held, ttl, current_deadline, patient)
            .await;
        crate::base::metrics::extension(result.is_ok());
        result
    }

    async fn extend_round(
        &self,
        held: &Arc<Held>,
        ttl: Duration,
        current_deadline: Instant,
        patient: bool,
    ) -> Result<Instant> {
        let ttl_ms = quorum::ttl_millis(ttl)?;
        let validity = quorum::validity(ttl, self.drift_factor)?;
        let t0 = Instant::now();
        if t0 >= current_deadline {
            return Err(Error::NotHeld {
                resources: held.names(),
                reason: NotHeldReason::Expired,
                votes: Votes::default(),
            });
        }
        let Some(new_deadline) = t0.checked_add(validity) else {
            return Err(InvalidInput::TtlTooLarge(ttl).into());
        };
        // A keep-alive extension only has to land before the deadline, so it may wait for half of
        // the time left: under load, a longer wait beats a timeout and a retry.
        let mut timeout = self.node_timeout(ttl);
        if patient {
            timeout = timeout.max(current_deadline.duration_since(t0) / 2);
        }
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.clone().extend(held.clone(), ttl_ms, timeout)));
        let votes = votes(
            // Finished, not dropped: a late extension still answered NOSCRIPT must be resent
            // (else that node keeps the old TTL); landing late only keeps our own key longer.
            fan_out(
                self.nodes.len(),
                calls,
                Some(current_deadline),
                Late::Finish,
                quorum_known,
            )
            .await,
        );
        crate::base::metrics::failures(&votes.0);
        let reached = quorum::outcome(&votes.0) == Outcome::Reached;
        if reached && Instant::now() < current_deadline {
            return Ok(new_deadline);
        }
        if Instant::now() >= current_deadline {
            return Err(Error::NotHeld {
                resources: held.names(),
                reason: NotHeldReason::Expired,
                votes,
            });
        }
        Err(self.round_failure(held, Round::Extend, votes))
    }

    /// One batched extend round for many locks of this Redlock (the keep-alive's): ONE call per
    /// node carries every lock (see [`Node::extend_many`]), and each lock is decided on its own,
    /// exactly as [`extend`](Self::extend) with `patient` decides for one: it is extended only if
    /// a quorum of nodes extended IT, before its own current deadline, and its new deadline
    /// counts from before the batch was sent (`t0 + validity(its ttl)`). One result per request,
    /// in order, with the errors of `extend`. A request whose deadline already passed, or whose
    /// TTL is invalid, is answered without being sent.
    ///
    /// The per-node timeout is the most patient one that every lock of the batch allows (the
    /// smallest of `max(node timeout, half its validity left)`); the round returns as soon as
    /// every lock's outcome is known.
    ///
    /// Cancellation: dropping the future abandons the round; the calls already handed to fred
    /// still run on their nodes and only extend keys that still hold their lock's token.
    pub(crate) async fn extend_many(&self, reqs: &[ExtendRequest]) -> Vec<Result<Instant>> {
        /// Each request: decided before sending, or sent as item `k` with its new deadline.
        enum Plan {
            Done(Error),
            Sent(usize, Instant),
        }
        let t0 = Instant::now();
        let mut batch = Vec::with_capacity(reqs.len());
        let mut timeout: Option<Duration> = None;
        let mut until = t0;
        let plans: Vec<Plan> = reqs
            .iter()
            .map(|r| {
                let checked = quorum::ttl_millis(r.ttl)
                    .and_then(|ms| Ok((ms, quorum::validity(r.ttl, self.drift_factor)?)));
                let (ttl_ms, validity) = match checked {
                    Ok(v) => v,
                    Err(e) => return Plan::Done(e.into()),
                };
                if t0 >= r.deadline {
                    return Plan::Done(Error::NotHeld {
                        resources: r.held.names(),
                        reason: NotHeldReason::Expired,
                        votes: Votes::default(),
                    });
                }
                let Some(new_deadline) = t0.checked_add(validity) else {
                    return Plan::Done(InvalidInput::TtlTooLarge(r.ttl).into());
                };
                let patience = self
                    .node_timeout(r.ttl)
                    .max(r.deadline.duration_since(t0) / 2);
                timeout = Some(timeout.map_or(patience, |t| t.min(patience)));
                until = until.max(r.deadline);
                batch.push(Extension {
                    held: r.held.clone(),
                    ttl_ms,
                });
                Plan::Sent(batch.len() - 1, new_deadline)
            })
            .collect();
        let answers = match timeout {
            Some(timeout) => {
                let items = batch.len();
                let batch = Arc::new(batch);
                let calls = self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (i, n.clone().extend_many(batch.clone(), timeout)));
                // Finished, not dropped: a late NOSCRIPT must still be resent.
                fan_out(self.nodes.len(), calls, Some(until), Late::Finish, |a| {
                    each_known(a, items)
                })
                .await
            }
            None => Vec::new(),
        };
        if !answers.is_empty() {
            // Node failures once per node and round (not once per lock of the batch).
            crate::base::metrics::failures(&item_votes(&answers, 0).0);
        }
        let now = Instant::now();
        plans
            .into_iter()
            .zip(reqs)
            .map(|(plan, r)| match plan {
                Plan::Done(e) => Err(e),
                Plan::Sent(k, new_deadline) => {
                    let votes = item_votes(&answers, k);
                    let reached = quorum::outcome(&votes.0) == Outcome::Reached;
                    if now >= r.deadline {
                        Err(Error::NotHeld {
                            resources: r.held.names(),
                            reason: NotHeldReason::Expired,
                            votes,
                        })
                    } else if reached {
                        Ok(new_deadline)
                    } else {
                        Err(self.round_failure(&r.held, Round::Extend, votes))
                    }
                }
            })
            .inspect(|r| crate::base::metrics::extension(r.is_ok()))
            .collect()
    }

    /// Why a quorum round on a held lock (`round`: extend, release) failed: `NotHeld(TokenGone)`
    /// when refusals alone rule out a quorum, `Unavailable` otherwise (too few answers to know).
    pub(crate) fn round_failure(&self, held: &Held, round: Round, votes: Votes) -> Error {
        self.names_failure(held.names(), round, votes)
    }

    /// [`round_failure`](Self::round_failure) for locks named `resources`.
    pub(crate) fn names_failure(&self, resources: Names, round: Round, votes: Votes) -> Error {
        if votes.refused() > self.nodes.len() - self.quorum {
            Error::NotHeld {
                resources,
                reason: NotHeldReason::TokenGone,
                votes,
            }
        } else {
            self.unavailable_in(round, resources, 1, votes)
        }
    }

    /// An acquire's `Unavailable` with the node counts filled in.
    pub(crate) fn unavailable(&self, resources: Names, attempts: u32, votes: Votes) -> Error {
        self.unavailable_in(Round::Acquire, resources, attempts, votes)
    }

    fn unavailable_in(&self, round: Round, resources: Names, attempts: u32, votes: Votes) -> Error {
        Error::Unavailable {
            round,
            resources,
            attempts,
            nodes: self.nodes.len(),
            quorum: self.quorum,
            reachable: votes.answered(),
            votes,
        }
    }
}

impl Releaser for Inner {
    fn background(&self) -> &Background {
        &self.background
    }

    fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn command_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout(ttl)
    }

    async fn release_round(
        &self,
        held: &Arc<Held>,
        targets: Vec<usize>,
        enough: fn(&[Option<Vote>]) -> bool,
    ) -> Votes {
        self.release_round_with(held, targets, enough).await
    }
}

impl Inner {
    async fn release_round_with(
        &self,
        held: &Arc<Held>,
        targets: Vec<usize>,
        enough: impl FnMut(&[Option<Vote>]) -> bool,
    ) -> Votes {
        let timeout = self.release_timeout();
        let calls: Vec<_> = targets
            .into_iter()
            .map(|i| (i, self.nodes[i].clone().release(held.clone(), timeout)))
            .collect();
        let votes = votes(fan_out(self.nodes.len(), calls, None, Late::Drop, enough).await);
        crate::base::metrics::failures(&votes.0);
        votes
    }
}

/// 128 random bits from a CSPRNG (rand's ThreadRng: ChaCha12 seeded from the OS), as 32 hex digits.
pub(crate) fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub(crate) fn random_up_to(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_and_fresh() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            assert!(random_up_to(Duration::from_millis(5)) <= Duration::from_millis(5));
        }
        assert_eq!(random_up_to(Duration::ZERO), Duration::ZERO);
    }
}
