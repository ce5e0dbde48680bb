//! [`InvalidInput`]: every input or configuration that fredlock refuses before it sends
//! anything, each with what to do instead.
//!
//! Owns: the variants and their messages. Must not: import anything of this crate (it is the
//! bottom layer; `error` wraps it in `Error::InvalidInput`).

use std::time::Duration;

/// A caller's input or configuration that fredlock rejects before talking to Redis.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// `build()` was called without any node.
    #[error("no nodes configured")]
    NoNodes,
    /// Two entries reach the same server: the same address (whatever the database index, which
    /// never makes a node independent), or, once connected, the same `run_id`. They would fake a
    /// majority.
    #[error("nodes {first} ({first_node}) and {second} ({second_node}) are the same server{how}; one server must not vote twice: list each independent server once")]
    DuplicateNode {
        /// Index of the first entry.
        first: usize,
        /// The first entry, as `host:port/db` (no credentials).
        first_node: String,
        /// Index of the repeated entry.
        second: usize,
        /// The repeated entry, as `host:port/db` (no credentials).
        second_node: String,
        /// How it was found: empty for the same address, ` (same run_id ...)` once connected.
        how: String,
    },
    /// A node URL was rejected. The message never repeats the password.
    #[error("node {index}: invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// Index of the entry.
        index: usize,
        /// The URL with any password replaced by `***`.
        url: String,
        /// Why it was rejected, and what to do.
        reason: String,
    },
    /// A client passed to `clients()` has no reconnect policy: after one dropped connection every
    /// command on it would hang or fail forever.
    #[error(
        "node {index}: the fred client has no reconnect policy (set one with Builder::set_policy)"
    )]
    NoReconnectPolicy {
        /// Index of the entry.
        index: usize,
    },
    /// An acquire named no resource.
    #[error("no resource given")]
    NoResources,
    /// A resource name was empty.
    #[error("empty resource name")]
    EmptyResource,
    /// A resource name longer than [`MAX_RESOURCE_LEN`](crate::MAX_RESOURCE_LEN) bytes.
    #[error("resource name {start:?}... is {len} bytes, more than the {max} allowed: lock a hash of the name instead (for example its SHA-256 in hex)")]
    ResourceTooLong {
        /// The name's first characters (at most 40 bytes).
        start: String,
        /// The name's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A resource name starting with `~`, which fredlock reserves for its own keys (fencing
    /// counters, semaphore slots).
    #[error("resource name {0:?} starts with '~', which is reserved for fredlock's own keys")]
    ReservedResource(String),
    /// On a Redlock with a Redis Cluster node, keys that one script must take together (a lock
    /// key and its fencing counter, or a semaphore's keys) fall in different hash slots. fredlock
    /// names its own keys to share the slot; only a key prefix with an unbalanced `{` or `}`
    /// defeats that.
    #[error("keys {keys:?} must share one hash slot on a Redis Cluster node and do not: use a key prefix without '{{' or '}}', or one with a complete hash tag such as \"{{locks}}:\" (then every key lands in one slot)")]
    CrossSlot {
        /// The keys.
        keys: Vec<String>,
    },
    /// A semaphore with zero permits.
    #[error("a semaphore needs at least 1 permit")]
    ZeroPermits,
    /// A semaphore with more permits than fredlock supports per name.
    #[error("a semaphore has at most {max} permits, {asked} asked")]
    TooManyPermits {
        /// The number asked for.
        asked: usize,
        /// The limit.
        max: usize,
    },
    /// The semaphore name is already used with another number of permits on a quorum of
    /// nodes. Changing the number of permits of a name is rejected: two numbers at once would
    /// admit more holders than the smaller allows. Use a new name.
    #[error("semaphore {name:?} is in use with {existing} permits, not {asked}: use a new name to change the number of permits")]
    PermitsMismatch {
        /// The semaphore.
        name: String,
        /// The number asked for.
        asked: usize,
        /// The number recorded on the nodes.
        existing: String,
    },
    /// A TTL of zero.
    #[error("TTL must be greater than zero")]
    ZeroTtl,
    /// A TTL too large for Redis (milliseconds must fit in a signed 64-bit integer) or for the
    /// monotonic clock.
    #[error("TTL {0:?} is too large (Redis takes at most 2^63-1 ms; a lock that long is never released by expiry)")]
    TtlTooLarge(Duration),
    /// A minimum hold ([`AcquireOptions::hold_at_least`](crate::AcquireOptions::hold_at_least))
    /// longer than the lock's TTL. The keys expire with the TTL, so the minimum could not be
    /// kept; it is refused rather than silently cut to the TTL, and the TTL is never raised
    /// behind the caller's back (the TTL is also how long a crashed holder keeps others out).
    /// Pass a TTL of at least the minimum.
    #[error("hold_at_least {hold_at_least:?} is longer than the TTL {ttl:?}: the keys would expire with the TTL, before the minimum; give a TTL of at least {hold_at_least:?}")]
    HoldLongerThanTtl {
        /// The minimum hold asked for.
        hold_at_least: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },
    /// A TTL so short that the clock-drift allowance leaves no validity at all.
    #[error("TTL {ttl:?} leaves no validity after the drift allowance {drift:?}")]
    TtlTooShort {
        /// The TTL asked for.
        ttl: Duration,
        /// The drift allowance subtracted from it.
        drift: Duration,
    },
    /// The drift factor must be in `[0, 0.5)` and finite.
    #[error("drift factor {0} is outside [0, 0.5)")]
    DriftFactor(f64),
    /// `Retry::attempts` must be at least 1 (1 = a single try).
    #[error("retry attempts must be at least 1")]
    ZeroAttempts,
    /// Retry delay plus jitter overflowed.
    #[error("retry delay plus jitter is too large")]
    RetryTooLarge,
    /// [`Builder::confirm_replicas`](crate::Builder::confirm_replicas) with 0 replicas, a
    /// timeout of zero or above 1 hour, or with a Redis Cluster node (whose writes `WAIT` on
    /// one connection cannot confirm).
    #[error("confirm_replicas: {reason}")]
    ConfirmReplicas {
        /// What is wrong, in words.
        reason: String,
    },
    /// A per-node timeout of zero.
    #[error("node timeout must be greater than zero")]
    ZeroNodeTimeout,
    /// A per-node timeout longer than [`crate::config::MAX_NODE_TIMEOUT`]: a node that takes
    /// that long is down, and a lock cannot wait for it.
    #[error("node timeout {0:?} is too large (at most 1 hour)")]
    NodeTimeoutTooLarge(std::time::Duration),
    /// A campaign value ([`ElectOptions::value`](crate::ElectOptions::value),
    /// [`Election::proclaim`](crate::Election::proclaim)) longer than
    /// [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) bytes.
    #[error("campaign value of {0} bytes is longer than the 65536 allowed (MAX_VALUE_LEN)")]
    ValueTooLong(usize),
    /// A keep-alive setting that cannot work (for example an extension interval of zero).
    #[error("invalid keep-alive setting: {0}")]
    KeepAlive(&'static str),
    /// A lease's text ([`Lease`](crate::Lease)'s `FromStr`) could not be read.
    #[error("not a fredlock lease ({0}): pass the whole text that Lease's Display (or `fredlock acquire`) printed")]
    InvalidLease(&'static str),
    /// An owner label that cannot be stored with a lock: longer than
    /// [`MAX_LABEL_LEN`](crate::MAX_LABEL_LEN) bytes, or with a control character (a newline, a
    /// tab, the separator 0x1f). Labels are public text that operators read.
    #[error("owner label {label:?} is {reason}: use printable text of at most 256 bytes")]
    InvalidLabel {
        /// The label (escaped, and shortened when long).
        label: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A custom lock token that cannot be used: empty, longer than
    /// [`MAX_TOKEN_LEN`](crate::MAX_TOKEN_LEN) bytes, or containing the separator 0x1f. The token
    /// is a secret and is never shown.
    #[error("custom lock token rejected: {reason} (a token must be 1 to 256 bytes without 0x1f, unguessable, and new for every acquisition)")]
    InvalidToken {
        /// What is wrong with it.
        reason: &'static str,
    },
}
