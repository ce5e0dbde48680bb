//! Redlock's shared state: [`Redlock`] and its `Inner` state, the retry policy ([`Retry`]), the
//! resource names ([`Resources`]) and the validated acquire `Request`, the keys, gates and node
//! timeouts every round uses, and how a failed round is reported.
//!
//! Owns: those. Must not: run a round (one acquire attempt is `attempt`, the extend and release
//! rounds are `held_rounds`, the retries `acquire_loop`), parse replies (node), count votes by
//! hand (quorum), keep background work's books (background), or build a `Lock`.

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::{Error, InvalidInput, Names, NotHeldReason, Result, Round, Votes};
use crate::base::line::Line;
use crate::nodes::node::{Held, Node};
use crate::nodes::node_status::NodeStatus;
use crate::nodes::subscriber::Subscribers;
pub(crate) use crate::rounds::background::spawn_release;
use crate::rounds::background::Background;
use crate::rounds::quorum;

/// A Redlock over N independent Redis nodes. Cheap to clone (one `Arc`); share it freely
/// across tasks.
///
/// `Debug` shows the nodes (`host:port/db`, never credentials), the quorum, the key prefix and
/// the owner label.
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Redlock {
    // What a log line needs, not the connection and wait-line machinery.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<&str> = self.inner.nodes.iter().map(|n| n.name.as_str()).collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("quorum", &self.inner.quorum)
            .field("key_prefix", &self.inner.key_prefix)
            .field("label", &self.inner.label)
            .finish_non_exhaustive()
    }
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
    /// The campaigns' shared observers (the `primitives` layer's registry, kept here).
    pub(crate) campaigns: Slot,
    /// What higher layers close with this Redlock (see [`Inner::on_close`]).
    pub(crate) closing: Closing,
    /// The locks held and the acquires under way, for [`Redlock::close`].
    pub(crate) holds: crate::rounds::holds::Holds,
    /// The waiting acquires of this Redlock as members of the gates' wait lines.
    pub(crate) line: Arc<Line>,
    /// How long after a round set a lock's keys its holder may still hand it to a waiter of
    /// this Redlock as it is ([`Builder::handover_window`](crate::Builder::handover_window)).
    pub(crate) handover_window: Duration,
    /// Waiters' offers for a hand-over inside this Redlock (see `handover`).
    pub(crate) handovers: Arc<crate::rounds::handover::Handovers<Grant>>,
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

/// What higher layers close with a Redlock ([`Redlock::close`]), each once.
#[derive(Default)]
pub(crate) struct Closing(std::sync::Mutex<Vec<Box<dyn FnOnce() + Send>>>);

impl std::fmt::Debug for Closing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Closing")
    }
}

impl Closing {
    fn take(&self) -> Vec<Box<dyn FnOnce() + Send>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Inner {
    /// Runs `close` when the Redlock is closed ([`Redlock::close`]), once.
    pub(crate) fn on_close(&self, close: Box<dyn FnOnce() + Send>) {
        self.closing
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(close);
    }
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

/// One attempt's grant: the keys and token, and the validity window `[t0, deadline]`.
pub(crate) struct Grant {
    pub(crate) held: Arc<Held>,
    pub(crate) t0: tokio::time::Instant,
    pub(crate) deadline: tokio::time::Instant,
    /// With fencing: each key's token, written back to a quorum.
    pub(crate) fencing: Option<Vec<u64>>,
    /// Handed over as it is by a holder of the same Redlock (see `handover_rounds`): when a
    /// round last set the keys. `None`: this grant's own round set them, at `t0`.
    pub(crate) handed: Option<tokio::time::Instant>,
}

/// A validated acquire request: the same for every attempt of one call.
pub(crate) struct Request {
    pub(crate) resources: Vec<String>,
    pub(crate) keys: Vec<String>,
    /// With fencing: each key's counter; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
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
    /// The lock is held for a minimum ([`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least)).
    pub(crate) keeps_minimum: bool,
    /// With fencing: the grant carries its tokens unraised, for the caller to raise (an
    /// election's claim raises its term's counter in the same script that writes the record).
    pub(crate) raise_later: bool,
    /// An election's term: its record and yield request, announced by the release (see
    /// `Held::announce`).
    pub(crate) announce: Option<Arc<[String; 2]>>,
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

    /// Each configured node's status now, in configuration order: whether a server answers
    /// there, whether its votes count, and if not why (the server's or the OS's own words:
    /// `WRONGPASS ...`, `Connection refused`, a reply that is not the Redis protocol). See
    /// [`NodeStatus`] for every state.
    ///
    /// `build()` succeeds, and so do acquires, while a quorum of nodes is usable: a fleet that
    /// lost its fault tolerance (a wrong password on one node of three) is otherwise only
    /// seen in a WARN log and the `fredlock_node_usable` gauge. Nothing is sent to the nodes:
    /// this reads what their connections know (cheap enough for a health endpoint). A node
    /// whose first connection attempt has not ended is reported `connecting`; to wait for
    /// those, use [`settled_node_status`](Self::settled_node_status).
    ///
    /// ```no_run
    /// # async fn demo(redlock: fredlock::Redlock) {
    /// for node in redlock.node_status() {
    ///     if let Some(cause) = &node.cause {
    ///         eprintln!("node {} not usable: {}: {}", node.name, cause.kind, cause.message);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.inner
            .nodes
            .iter()
            .map(|n| crate::nodes::node_status::status(&n.state))
            .collect()
    }

    /// [`node_status`](Self::node_status) once every node's first connection attempt has
    /// ended (connected, or failed with a cause), waiting at most `wait` (`Duration::MAX`: no
    /// limit). `build()` gives the nodes beyond a quorum only a moment, and an attempt on an
    /// address that never answers takes 2 s to fail: this is the call that reports why.
    ///
    /// Cancellation: dropping the future only stops the wait.
    pub async fn settled_node_status(&self, wait: Duration) -> Vec<NodeStatus> {
        let waits = self
            .inner
            .nodes
            .iter()
            .map(|n| crate::nodes::node_status::settled(&n.state, wait));
        futures::future::join_all(waits).await;
        self.node_status()
    }

    /// The fred client of node `index`, for commands of your own (for example reading the data
    /// the lock protects). `None` when out of range, and for a Redis Cluster node (fredlock
    /// keeps one client per shard of it; use a cluster client of your own there). It is configured for locking: one attempt
    /// per command (no replay after a reconnect) and a bounded queue; pass your own options
    /// (`with_options`) or use a separate client where retries are wanted.
    pub fn client(&self, index: usize) -> Option<&fred::clients::Client> {
        self.inner.nodes.get(index).and_then(|n| n.client())
    }

    /// Ends everything this `Redlock` holds and waits for, then closes its connections: call
    /// it before the process exits (or give it a shutdown signal with
    /// [`shutdown_on`](Self::shutdown_on)), so that no key is left to block the other
    /// processes for its TTL. In order:
    /// 1. acquires waiting for a lock (a permit, a term) end with [`Error::Closed`], as do those
    ///    asked afterwards; an attempt already on the wire is waited for;
    /// 2. every lock, permit, read or write guard and election term still held is released
    ///    on every node, all at once, as its own release would (a lock held for a minimum with
    ///    [`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least) is left to
    ///    expire at the minimum's end): the next waiter in another process is woken by that
    ///    release, as by any other. Kept-alive locks stop being extended and their
    ///    [`lost`](crate::LockHandle::lost) signal fires with [`LostReason::Closed`](crate::LostReason::Closed), so
    ///    [`with_lock`](Self::with_lock) work is cancelled and returns [`Error::Lost`]; the
    ///    handles say not held ([`Lock::is_valid`](crate::Lock::is_valid) is `false`), and
    ///    their `release` or `extend` returns [`Error::Closed`] without sending anything;
    /// 3. the connections this `Redlock` opened close (clients given with `clients()` are left
    ///    open) once the commands already queued on them have been answered, including
    ///    releases still finishing in the background and the late nodes of a round that
    ///    decided without them (a node that does not answer is waited for at most 5 s).
    ///
    /// Every clone of this `Redlock` is affected: later commands fail with [`Error::Closed`]
    /// or [`Error::Unavailable`]. A lock handed out as a [`Lease`](crate::Lease) is the lease
    /// holder's and is left alone. Calling it again does nothing more.
    ///
    /// Cancellation: dropping the future may leave some locks held until their TTL and some
    /// connections open until the `Redlock` is dropped.
    pub async fn close(&self) {
        let taken = self.inner.holds.close().await;
        for close in self.inner.closing.take() {
            close();
        }
        self.inner.release_taken(taken).await;
        self.inner.holds.mark_released();
        self.inner.background.wait_idle().await;
        self.inner.drop_spent_leases().await;
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
        for name in &names {
            crate::base::slots::check_name(name)?;
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
            keeps_minimum: false,
            raise_later: false,
            announce: Default::default(),
        })
    }
}

impl Inner {
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

    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| quorum::default_node_timeout(ttl))
    }

    pub(crate) fn release_timeout(&self) -> Duration {
        self.node_timeout.unwrap_or(Duration::from_millis(500))
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
