//! Every Lua script fredlock runs, each with its KEYS/ARGV contract and reply.
//!
//! Most scripts are sent with EVALSHA and, on `NOSCRIPT` (after `SCRIPT FLUSH` or a node
//! restart), resent at once with EVAL on the same connection (see [`crate::node`]).
//! RELEASE, ACQUIRE_MANY and BATCH are always sent with EVAL, because a resend breaks per-node order:
//! - a release can be answered after its caller stopped waiting (a paused node, a dropped
//!   future); a late NOSCRIPT then has nobody left to resend it, leaving the key for a TTL;
//! - an acquire answered NOSCRIPT after the quorum was decided would be resent AFTER the
//!   release queued behind it, setting a key nobody releases (the SCRIPT FLUSH test caught it).
//!
//! A resent extend lands at worst after a release, where it finds no token and does nothing.
//! EVAL costs ~250 bytes more on the wire and a SHA1 on the server.
//!
//! All scripts touch only their `KEYS`, and all of one call's keys share a hash slot on a Redis
//! Cluster node (`slots` names derived keys that way; `node` splits a multi-resource lock into one
//! call per slot).
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

/// Release and wake: RELEASE, plus a `PUBLISH key token` for each key deleted, so that waiting
/// acquires subscribed to the key's channel retry at once (see `subscriber` and `waiters`).
/// The channel is the lock key itself: in fredlock's key namespace, and in the key's own slot.
/// KEYS: the lock keys. ARGV[1]: token. Reply: the number of keys deleted (0 .. #KEYS).
/// EVAL-only like RELEASE, for the same reason.
const RELEASE_WAKE: &str = r#"
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    redis.call('PUBLISH', key, ARGV[1])
    n = n + 1
  end
end
return n
"#;

/// Shorten (hold at least): only if EVERY key still holds our token, lower each key's TTL to
/// ARGV[2] ms; a key whose TTL is already shorter (or that has none) keeps it, so this never
/// lengthens a lock nor re-creates a key.
/// KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
/// Reply: 1 ours (shortened where needed), 0 not ours (nothing changed).
const SHORTEN: &str = r#"
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return 0 end
end
local ms = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left > ms then redis.call('PEXPIRE', key, ms) end
end
return 1
"#;

/// Check a lease (a lock handed to another process): whether EVERY key still holds our token,
/// and the shortest TTL left among them. Changes nothing, so it never re-creates a lock.
/// KEYS: the lock keys. ARGV[1]: token.
/// Reply: `{1, pttl}` ours (pttl: the smallest PTTL in ms, -1 when a key has no expiry); `{0}`
/// not ours (a key missing or holding another value).
const LEASE_CHECK: &str = r#"
local least = nil
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return {0} end
  local t = redis.call('PTTL', key)
  if least == nil or t < least then least = t end
end
return {1, least}
"#;

/// Read-write lock, take a read share. Each reader is a lock key of its own (expiring with its
/// own TTL, extended and released like any lock key); the readers set lists the reader keys so
/// that a writer can find them (members whose key is gone are dropped here and by writers).
/// KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set,
/// KEYS[4]: this reader's key (all in one hash slot; the set's members are keys of that slot).
/// ARGV[1]: value, ARGV[2]: TTL in ms.
/// Reply: 1 the share was taken; 0 a writer holds the lock or waits for it (nothing set).
const RW_READ: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('EXISTS', k) == 0 then redis.call('SREM', KEYS[3], k) end
end
if not redis.call('SET', KEYS[4], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SADD', KEYS[3], KEYS[4])
return 1
"#;

/// Read-write lock, take the write lock: only when no writer holds it and no reader key of the
/// set still exists. Refused, it marks a writer as waiting (unless another writer's mark is
/// there), so that new readers are refused until the writer got in or gave up; the writer
/// deletes its mark then (it also expires with ARGV[4]).
/// KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set,
/// KEYS[4] (with fencing): the writer key's fencing counter.
/// ARGV[1]: value, ARGV[2]: TTL in ms, ARGV[3]: this writer's waiting mark, ARGV[4]: the
/// mark's TTL in ms, ARGV[5]: '1' to read the fencing counter.
/// Reply: `{1, counter}` (0 without fencing; -1 when not a number) set; `{0}` refused.
const RW_WRITE: &str = r#"
local busy = redis.call('EXISTS', KEYS[1]) == 1
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('EXISTS', k) == 1 then busy = true else redis.call('SREM', KEYS[3], k) end
end
if busy then
  local mark = redis.call('GET', KEYS[2])
  if not mark or mark == ARGV[3] then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
  return {0}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local c = 0
if ARGV[5] == '1' then c = tonumber(redis.call('GET', KEYS[4]) or '0') or -1 end
return {1, c}
"#;

/// Read-write lock, downgrade: the writer becomes a reader without a gap, in one step per
/// node: only where the writer key still holds the writer's value, a reader key is set and
/// listed and the writer key deleted.
/// KEYS[1]: the writer key, KEYS[2]: the readers set, KEYS[3]: the new reader's key.
/// ARGV[1]: the writer's value, ARGV[2]: the reader's value, ARGV[3]: TTL in ms.
/// Reply: 1 downgraded; 0 the writer key is not ours (nothing changed).
const RW_DOWNGRADE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if not redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('SADD', KEYS[2], KEYS[3])
redis.call('DEL', KEYS[1])
return 1
"#;

/// Read-write lock, inspect: the writer, the waiting writer's mark and every live reader.
/// KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set.
/// Reply: `{writer value or nil, pttl, mark or nil, pttl, reader value, pttl, ...}`.
const RW_VIEW: &str = r#"
local out = {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2])}
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local v = redis.call('GET', k)
  if v then
    out[#out + 1] = v
    out[#out + 1] = redis.call('PTTL', k)
  end
end
return out
"#;

/// Inspect one key atomically.
/// KEYS[1]: the lock key. Reply: `[value or nil, pttl]` (pttl -2 = no key, -1 = no expiry).
const INSPECT: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#;

/// Break a lock by force, whoever holds it (an operator's `fredlock break`): read the value and
/// its TTL, delete the key, and with wake-ups publish the value as a release would, so that
/// waiters retry at once.
/// KEYS[1]: the lock key. ARGV[1]: ignored. ARGV[2]: 1 to publish. Reply: `[value or nil, pttl]`
/// as [`INSPECT`], of what was deleted. A key of another type is no lock: GET fails with
/// WRONGTYPE and nothing is deleted.
const BREAK: &str = r#"
local v = redis.call('GET', KEYS[1])
local t = redis.call('PTTL', KEYS[1])
if v then
  redis.call('DEL', KEYS[1])
  if ARGV[2] == '1' then redis.call('PUBLISH', KEYS[1], v) end
end
return {v, t}
"#;

/// Acquire several keys at once, all or none, and read each key's fencing counter in the same
/// script, so that a grant never lacks its counter.
/// KEYS[1..n]: the lock keys, KEYS[n+1..2n]: their counters. ARGV[1]: token, ARGV[2]: TTL in ms.
/// Reply: `{1, c1, ..., cn}` (each counter, 0 when absent, -1 when not a number) when every key
/// was set; `{0}` when any key exists and nothing was set. Counters are never written here.
const ACQUIRE_FENCED: &str = r#"
local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {0} end
end
local out = {1}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  out[i + 1] = tonumber(redis.call('GET', KEYS[n + i]) or '0') or -1
end
return out
"#;

/// Raise fencing counters: a max-register, so a late or repeated write never lowers one.
/// KEYS: the counters. ARGV[i]: the token for KEYS[i]. Reply: 1.
/// A counter that is not a number is an error (never silently overwritten).
const FENCE_RAISE: &str = r#"
for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  local c = tonumber(raw or '0')
  if c == nil then return redis.error_reply('fencing counter ' .. KEYS[i] .. ' is not a number') end
  if c < tonumber(ARGV[i]) then redis.call('SET', KEYS[i], ARGV[i]) end
end
return 1
"#;

/// Take one semaphore slot: the first free one in the order given (the same order is sent to
/// every node, so in the common case every node picks the same slot).
/// KEYS[1]: the semaphore's `permits` record; KEYS[2..p+1]: slot keys in the order to try;
/// KEYS[p+2..2p+1] (with fencing): their counters in the same order.
/// ARGV[1]: token, ARGV[2]: TTL in ms, ARGV[3]: permits, ARGV[4]: '1' to read the counter.
/// Reply: `{1, position, counter}` a slot was set; `{0}` every slot is taken; `{-1, permits}`
/// this name is used with another number of permits (nothing set).
const SEM_ACQUIRE: &str = r#"
local meta = redis.call('GET', KEYS[1])
if meta and meta ~= ARGV[3] then return {-1, meta} end
local p = tonumber(ARGV[3])
for i = 1, p do
  local k = KEYS[1 + i]
  if redis.call('EXISTS', k) == 0 then
    redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
    if not meta then redis.call('SET', KEYS[1], ARGV[3]) end
    local c = 0
    if ARGV[4] == '1' then c = tonumber(redis.call('GET', KEYS[1 + p + i]) or '0') or -1 end
    return {1, i - 1, c}
  end
end
return {0}
"#;

/// Read several keys atomically. KEYS: the keys. Reply: `{v1, pttl1, v2, pttl2, ...}`.
const VIEW_MANY: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  out[2 * i - 1] = redis.call('GET', k)
  out[2 * i] = redis.call('PTTL', k)
end
return out
"#;

/// Extend many locks in one call (the keep-alive's batched renewal): per lock, exactly what
/// [`EXTEND`] does for one, so each lock's answer is its own.
/// KEYS: every lock's keys, lock after lock. `ARGV[1]`: the new TTL in ms, the same for every
/// lock of the call; `ARGV[i + 1]`: the token of `KEYS[i]`. A lock is a run of consecutive keys
/// with the same token (tokens are 128 random bits, fresh per lock: two locks never share one).
/// Reply: an array with one element per lock, in order: 1 extended, 0 not ours (any key missing
/// or holding another value; nothing changed), or the server's error as a string when a key of
/// this lock is of another type (WRONGTYPE): that lock fails on this node, the others are
/// unaffected (`redis.pcall`). ARGV that do not match KEYS: an error, nothing changed.
/// Cost on the server: one GET per key and one PEXPIRE per key extended, and two arguments per
/// key (no per-lock count or TTL: measured 25% less node CPU per lock than with them); the
/// caller bounds the number of keys per call (see `renewal`).
const EXTEND_MANY: &str = r#"
local n = #KEYS
if #ARGV ~= n + 1 then
  return redis.error_reply('fredlock: batched extend wants one token per key after the TTL')
end
local ttl = ARGV[1]
local out = {}
local i = 1
while i <= n do
  local token = ARGV[i + 1]
  local last = i
  while last < n and ARGV[last + 2] == token do
    last = last + 1
  end
  local ok = 1
  for k = i, last do
    local v = redis.pcall('GET', KEYS[k])
    if type(v) == 'table' and v.err then
      ok = v.err
      break
    end
    if v ~= token then
      ok = 0
      break
    end
  end
  if ok == 1 then
    for k = i, last do
      redis.call('PEXPIRE', KEYS[k], ttl)
    end
  end
  out[#out + 1] = ok
  i = last + 1
end
return out
"#;

/// Many single-key operations of concurrent locks on one node, in one call (see `batch`): each
/// does exactly what its plain form does, in the order given, so a release never runs before
/// an earlier acquire of the same token.
/// KEYS[i]: the key of operation i. ARGV[2i - 1]: its token; ARGV[2i]: the TTL in ms for an
/// acquire (`SET key token NX PX ttl`), `r` for a release (RELEASE), `w` for a release that
/// wakes (RELEASE_WAKE).
/// Reply: one element per operation, in order: an acquire 1 set / 0 the key exists (any type);
/// a release the number of keys deleted (1 / 0); or the server's error as a string for that
/// operation alone (`redis.pcall`: a WRONGTYPE key fails its own operation, not the others).
/// ARGV that do not match KEYS: an error, nothing done. EVAL-only, like RELEASE.
const BATCH: &str = r#"
local n = #KEYS
if #ARGV ~= 2 * n then
  return redis.error_reply('fredlock: a batch wants a token and an operation per key')
end
local out = {}
for i = 1, n do
  local key, token, op = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
  if op == 'r' or op == 'w' then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      out[i] = v.err
    elseif v == token then
      redis.call('DEL', key)
      if op == 'w' then redis.call('PUBLISH', key, token) end
      out[i] = 1
    else
      out[i] = 0
    end
  else
    local r = redis.pcall('SET', key, token, 'PX', op, 'NX')
    if type(r) == 'table' and r.err then
      out[i] = r.err
    elseif r then
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
"#;

/// The scripts, hashed once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire_many: Script,
    pub(crate) extend: Script,
    pub(crate) shorten: Script,
    pub(crate) lease_check: Script,
    pub(crate) rw_read: Script,
    pub(crate) rw_write: Script,
    pub(crate) rw_view: Script,
    pub(crate) rw_downgrade: Script,
    pub(crate) release: Script,
    pub(crate) release_wake: Script,
    pub(crate) inspect: Script,
    pub(crate) force_break: Script,
    pub(crate) acquire_fenced: Script,
    pub(crate) fence_raise: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) view_many: Script,
    pub(crate) extend_many: Script,
    pub(crate) batch: Script,
}

impl Scripts {
    pub(crate) fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire_many: Script::eval_only(ACQUIRE_MANY),
            extend: Script::new(EXTEND),
            // Like EXTEND, a resend can only find the token gone and do nothing.
            shorten: Script::new(SHORTEN),
            // Read-only: a resend changes nothing.
            lease_check: Script::new(LEASE_CHECK),
            // Acquires: EVAL-only, for the reason given at the top of this file.
            rw_read: Script::eval_only(RW_READ),
            rw_write: Script::eval_only(RW_WRITE),
            rw_view: Script::new(RW_VIEW),
            // Deletes the writer key, as a release does: EVAL-only.
            rw_downgrade: Script::eval_only(RW_DOWNGRADE),
            release: Script::eval_only(RELEASE),
            release_wake: Script::eval_only(RELEASE_WAKE),
            inspect: Script::new(INSPECT),
            // A deletion is sent whole, like a release: a late NOSCRIPT resend could delete a
            // NEWER holder's key.
            force_break: Script::eval_only(BREAK),
            // Acquires are EVAL-only, for the reason given at the top of this file.
            acquire_fenced: Script::eval_only(ACQUIRE_FENCED),
            fence_raise: Script::new(FENCE_RAISE),
            sem_acquire: Script::eval_only(SEM_ACQUIRE),
            view_many: Script::new(VIEW_MANY),
            // Like EXTEND: a resent batch lands at worst after a release, where each lock's
            // token is gone and nothing is done for it.
            extend_many: Script::new(EXTEND_MANY),
            // A resent batch could land after a release queued behind it: EVAL only.
            batch: Script::eval_only(BATCH),
        })
    }
}
