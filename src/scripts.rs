//! Every Lua script fredlock runs, each with its KEYS/ARGV contract and reply.
//!
//! Most scripts are sent with EVALSHA and, on `NOSCRIPT` (after `SCRIPT FLUSH` or a node
//! restart), resent at once with EVAL on the same connection (see [`crate::node`]).
//! RELEASE and ACQUIRE_MANY are always sent with EVAL, because a resend breaks per-node order:
//! - a release can be answered after its caller stopped waiting (a paused node, a dropped
//!   future); a late NOSCRIPT then has nobody left to resend it, leaving the key for a TTL;
//! - an acquire answered NOSCRIPT after the quorum was decided would be resent AFTER the
//!   release queued behind it, setting a key nobody releases (the SCRIPT FLUSH test caught it).
//!
//! A resent extend lands at worst after a release, where it finds no token and does nothing.
//! EVAL costs ~250 bytes more on the wire and a SHA1 on the server.
//!
//! All scripts touch only their `KEYS`, so a Redis Cluster used as one node works when the keys
//! share a hash slot (use hash tags such as `{account}:1`).
//!
//! Owns: the script bodies and their hashes. Must not: send anything (the node layer does).

/// A script and its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) body: &'static str,
    pub(crate) sha: String,
    /// Send the body every time (EVAL), never the hash.
    pub(crate) always_eval: bool,
}

impl Script {
    fn new(body: &'static str) -> Self {
        Script {
            body,
            sha: fred::util::sha1_hash(body),
            always_eval: false,
        }
    }

    fn eval_only(body: &'static str) -> Self {
        Script {
            always_eval: true,
            ..Script::new(body)
        }
    }
}

/// Acquire several keys at once, all or none.
/// KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
/// Reply: 1 when every key was set, 0 when any key exists (any type) and nothing was set.
/// (A single key is acquired with a plain `SET key token NX PX ttl`, which is the same contract.)
const ACQUIRE_MANY: &str = r#"
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"#;

/// Extend: only if EVERY key still holds our token, then reset every key's TTL. Never creates a
/// key, so an expired lock is never revived.
/// KEYS: the lock keys. ARGV[1]: token, ARGV[2]: new TTL in ms.
/// Reply: 1 extended, 0 not ours (any key missing or holding another value).
/// A key of another type makes GET fail with WRONGTYPE: an error, counted as a failed node.
const EXTEND: &str = r#"
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
"#;

/// Release: delete each key that still holds our token, leave every other key alone.
/// KEYS: the lock keys. ARGV[1]: token.
/// Reply: the number of keys deleted (0 .. #KEYS).
const RELEASE: &str = r#"
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"#;

/// Inspect one key atomically.
/// KEYS[1]: the lock key. Reply: `[value or nil, pttl]` (pttl -2 = no key, -1 = no expiry).
const INSPECT: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#;

/// The scripts, hashed once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire_many: Script,
    pub(crate) extend: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
}

impl Scripts {
    pub(crate) fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire_many: Script::eval_only(ACQUIRE_MANY),
            extend: Script::new(EXTEND),
            release: Script::eval_only(RELEASE),
            inspect: Script::new(INSPECT),
        })
    }
}
