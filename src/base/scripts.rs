//! Every Lua script fredlock runs, each with its KEYS/ARGV contract and reply.
//!
//! Most scripts are sent with EVALSHA and, on `NOSCRIPT` (after `SCRIPT FLUSH` or a node
//! restart), resent at once with EVAL on the same connection (see [`crate::nodes::node`]).
//! ACQUIRE_MANY, BATCH and the RELEASE of several keys or of a caller's token are always sent
//! with EVAL, because a resend breaks per-node order (a lone release with a fresh token goes by
//! EVALSHA: see `batch::release_script`; on a server with `DELIFEQ` it needs no script at all,
//! see `native`):
//! - a release can be answered after its caller stopped waiting (a paused node, a dropped
//!   future); a late NOSCRIPT then has nobody left to resend it, leaving the key for a TTL;
//! - an acquire answered NOSCRIPT after the quorum was decided would be resent AFTER the
//!   release queued behind it, setting a key nobody releases (the SCRIPT FLUSH test caught it).
//!
//! A resent extend lands at worst after a release, where it finds no token and does nothing.
//! EVAL costs the script's body on the wire (up to 1.6 KB) and a SHA1 of it on the server.
//!
//! So the scripts that must never be resent (`always_eval`, each with its own [`Script::slot`])
//! go whole until a connection to a single server has run them once, and then by EVALSHA
//! without any resend: a `NOSCRIPT` answer means the script did not run, so that node simply
//! refuses that one attempt (its retry sends the body again); nothing can land late.
//!
//! All scripts touch only their `KEYS`, and all of one call's keys share a hash slot on a Redis
//! Cluster node (`slots` names derived keys that way; `node` splits a multi-resource lock into one
//! call per slot).
//!
//! Owns: the script bodies and their hashes. Must not: send anything (the node layer does).

use crate::base::sem_rw_scripts::{
    sem_take, RW_DOWNGRADE, RW_READ, RW_VIEW, RW_WRITE, SEM_ACQUIRE,
};

/// A script and its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) body: &'static str,
    pub(crate) sha: String,
    /// Never resend: the body (EVAL) until the server is known to have it, then the hash
    /// (EVALSHA) with no resend on `NOSCRIPT` (see the top of this file).
    pub(crate) always_eval: bool,
    /// For an `always_eval` script: its bit among the scripts a connection knows the server
    /// has (`Caps::knows`).
    pub(crate) slot: Option<u8>,
}

/// The next `always_eval` script's slot.
static NEXT_SLOT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Script {
    fn new(body: &'static str) -> Self {
        Script {
            body,
            sha: fred::util::sha1_hash(body),
            always_eval: false,
            slot: None,
        }
    }

    fn eval_only(body: &'static str) -> Self {
        let slot = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Script {
            always_eval: true,
            slot: (slot < 64).then_some(slot),
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

/// Repair a held lock on a node where (some of) its keys are missing: only if no key holds
/// another value, set every key to our value with the TTL (a missing key is created, one of
/// ours has its TTL reset); all or none. Sent only while the lock is held, after an extension
/// won on a quorum (see `held_rounds`); a one-key lock is repaired with a plain
/// `SET key token NX PX ttl` instead (its key is missing there). On a cluster node, one call
/// per hash slot, even for one key (which may be ours while another slot's is missing).
/// KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
/// Reply: 1 set, 0 another value at a key (nothing changed).
const REPAIR: &str = r#"
for _, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and v ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
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

/// Inspect one key atomically.
/// KEYS[1]: the lock key. Reply: `[value or nil, pttl]` (pttl -2 = no key, -1 = no expiry).
const INSPECT: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#;

/// Break a lock by force, whoever holds it (an operator's `fredlock break`): read the value and
/// its TTL, and delete the key (the caller then pokes the key's wait line, see LINE_LEAVE).
/// KEYS[1]: the lock key. ARGV[1]: ignored. Reply: `[value or nil, pttl]`
/// as [`INSPECT`], of what was deleted. A key of another type is no lock: GET fails with
/// WRONGTYPE and nothing is deleted.
const BREAK: &str = r#"
local v = redis.call('GET', KEYS[1])
local t = redis.call('PTTL', KEYS[1])
if v then
  redis.call('DEL', KEYS[1])
end
return {v, t}
"#;

/// Acquire several keys at once, all or none, and read each key's fencing counter in the same
/// script, so that a grant never lacks its counter.
/// KEYS[1..n]: the lock keys, KEYS[n+1..2n]: their counters. ARGV[1]: token, ARGV[2]: TTL in ms.
/// Reply: `{1, c1, ..., cn}` (each counter, 0 when absent, -1 when not a number) when every key
/// was set; `{0}` when any key exists and nothing was set. Counters are never written here.
/// One key (every election term, most fenced locks): its `SET NX` is the check, no `EXISTS`.
const ACQUIRE_FENCED: &str = r#"
local n = #KEYS / 2
if n == 1 then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0') or -1}
end
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

/// The wait line of a lock key on its gate node (see `line` and `redlock`'s waiting): a sorted
/// set of waiter members (`<instance>:<seq>`, score = arrival order) and, per member, a lease
/// key `<line>|<member>` that the waiter renews while it waits (a waiter whose process died
/// drops out when its lease expires). Functions shared by the gate scripts:
/// - `live_head(line, first)`: the first member whose lease is alive, dropping dead ones on
///   the way (`nil`: nobody waits; `false`: more dead entries than one call clears, try
///   later); `first`, when given, is the first entry as already read;
/// - `wake(member, prefix, why)`: `PUBLISH prefix<instance> <seq>|<why>`, the member's
///   process's own channel (one per `Redlock`, whatever the number of keys);
/// - `join(line, member, lease, front, lead, edge)`: into the line unless already in it (at the
///   back, or at the front for a waiter whose granted turn failed elsewhere); renew the lease.
///   `edge`, when given, is the line's edge entry as already read (`ZRANGE .. WITHSCORES`), or
///   `true` for a member known to be in the line (nothing is added, the lease is renewed).
///   The line and its flag live 4 leases from the last look of a waiter with no live member
///   ahead of it (`lead`: the head, which looks at least once a lease while its lease lives;
///   once it is gone, the next look finds no one ahead), from a put-back at the front, and from
///   a join to an empty line. The waiters behind the head only renew their own lease: two
///   commands fewer per renewal and per newcomer (members still waiting when the line
///   expires join again).
macro_rules! line_lib {
    () => {
        r#"
local function live_head(line, first)
  local h = first
  for _ = 1, 32 do
    if h == nil then h = redis.call('ZRANGE', line, 0, 0)[1] end
    if not h then return nil end
    if redis.call('EXISTS', line .. '|' .. h) == 1 then return h end
    redis.call('ZREM', line, h)
    h = nil
  end
  return false
end
local function wake(h, prefix, why)
  local inst, seq = string.match(h, '^([^:]+):(.+)$')
  if inst then redis.call('PUBLISH', prefix .. inst, seq .. '|' .. why) end
end
local function join(line, me, lease, front, lead, edge)
  if edge ~= true then
    local at, step = -1, 1
    if front then at, step = 0, -1 end
    if edge == nil then edge = redis.call('ZRANGE', line, at, at, 'WITHSCORES') end
    local s = 0
    if edge[2] then s = tonumber(edge[2]) + step else lead = true end
    redis.call('ZADD', line, 'NX', s, me)
  end
  -- The line lives while its head looks, and its flag (read by GATE_FREE) with it.
  if lead or front then
    redis.call('PEXPIRE', line, 4 * tonumber(lease))
    redis.call('SET', line .. '!', '1', 'PX', 4 * tonumber(lease))
  end
  redis.call('SET', line .. '|' .. me, '1', 'PX', lease)
end
"#
    };
}

/// Acquire one lock key on its gate node: granted only to the head of the key's wait line (or
/// to anyone while the line is empty), so that the woken head never splits votes with the
/// waiters behind it. A refused waiter joins the line (or renews its lease there).
/// KEYS[1]: the lock key, KEYS[2]: its line, KEYS[3] (with fencing): its counter.
/// ARGV[1]: value, ARGV[2]: TTL in ms, ARGV[3]: the waiter's member ('' = does not wait),
/// ARGV[4]: the lease in ms, ARGV[5]: `rank` to be told the exact place behind the head (a
/// waiter far behind renews its place without looking, one that polls paces itself by it),
/// ARGV[6]: what the caller knows of its place: `turn` (woken as the head: its first entry is
/// popped, and put back unless the key is set), `new` (not in the line: only its tail is read,
/// a head whose lease is gone is left to the waiters' looks), or '' (look at the head).
/// Reply: `{1, counter}` set (counter 0 without fencing, -1 when not a number), `{1, counter,
/// 1}` set for the head of a line (others may still wait); `{0, rank,
/// pttl}` refused: the waiter's place in the line (0 = head, 1.. = behind it: unless asked for
/// the rank, 1, or 2 for a newcomer that found two members or more ahead; -1 = not in it) and,
/// for the head and for a caller that does not wait, the
/// lock key's PTTL (-2: free, refused for the line alone; -3: not read).
const GATE_ACQUIRE: &str = concat!(
    line_lib!(),
    r#"
local key, line, me, how = KEYS[1], KEYS[2], ARGV[3], ARGV[6]
local function take(lined)
  if not redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then return nil end
  local c = 0
  if KEYS[3] then c = tonumber(redis.call('GET', KEYS[3]) or '0') or -1 end
  if lined then return {1, c, 1} end
  return {1, c}
end
local h, edge, known, ahead = nil, nil, false, 1
if me ~= '' and how == 'turn' then
  -- Woken as the head: out of the line and granted in two commands. (A user whose ACL
  -- predates this script, without +zpopmin, looks at the head below.)
  local first = redis.pcall('ZPOPMIN', line)
  if first.err then first = {} end
  if first[1] == me then
    local g = take(true)
    if g then return g end
    h, known = me, true
  end
  -- Back at its place (anyone else, or the head refused by a key still held).
  if first[1] then
    redis.call('ZADD', line, first[2], first[1])
    -- A put-back at the front renews the line: ZPOPMIN deletes a line it empties, expiry and
    -- all, and someone else's entry put back alone would make a line that never expires.
    -- (The waiter's own entry gets its expiry from its join below.)
    if first[1] ~= me then redis.call('PEXPIRE', line, 4 * tonumber(ARGV[4])) end
  end
elseif me ~= '' and how == 'new' then
  -- Not in the line yet: its last two entries say whether anyone is ahead, and whether two
  -- are (a head whose lease is gone is left to the waiters' looks).
  local last = redis.call('ZRANGE', line, -2, -1, 'WITHSCORES')
  local n = #last
  if last[n - 1] ~= me then
    edge, h, known = {last[n - 1], last[n]}, last[n - 1], true
    if n == 4 and last[1] ~= me then ahead = 2 end
    if h == nil then
      local g = take(false)
      if g then return g end
    end
  end
end
if not known then
  h = redis.call('ZRANGE', line, 0, 0)[1]
  if h and h ~= me then h = live_head(line, h) end
  if h == nil or h == me then
    local g = take(h ~= nil)
    if g then
      -- Out of the line (its lease key expires on its own).
      if h then redis.call('ZREM', line, me) end
      return g
    end
  end
end
if me == '' then return {0, -1, redis.call('PTTL', key)} end
if h == nil or h == me then
  if h == me then edge = true end
  join(line, me, ARGV[4], false, true, edge)
  return {0, 0, redis.call('PTTL', key)}
end
local rank
if edge == nil and ARGV[5] == 'rank' then
  rank = redis.call('ZRANK', line, me)
  if rank then edge = true end
end
join(line, me, ARGV[4], false, false, edge)
if ARGV[5] == 'rank' then return {0, rank or redis.call('ZRANK', line, me), -3} end
return {0, ahead, -3}
"#
);

/// Take one semaphore slot on the semaphore's gate node: `take()` (see `sem_take!` in
/// `sem_rw_scripts`) for the head of the semaphore's wait line only (or anyone while it is
/// empty); a refused waiter joins the line. After a grant, when another slot is still free, the
/// next head is woken at once (one grant per wake-up, however many permits came free together).
/// KEYS: as `take()`, then the line's key LAST. ARGV[1..4]: as `take()`; ARGV[5]: the
/// waiter's member ('' = does not wait); ARGV[6]: the lease in ms; ARGV[7]: channel prefix.
/// Reply: as `take()`, or `{0, rank}` when refused with the waiter's place in line (0 = head,
/// 1 = behind it, -1 = not in it).
const SEM_GATE: &str = concat!(
    sem_take!(),
    line_lib!(),
    r#"
local line, me = KEYS[#KEYS], ARGV[5]
local h = live_head(line)
if h == nil or h == me then
  local r = take()
  if r[1] ~= 0 then
    if r[1] == 1 and h then
      redis.call('ZREM', line, me)
      local nh = live_head(line)
      if nh then
        local p = tonumber(ARGV[3])
        for i = 1, math.min(p, 64) do
          if redis.call('EXISTS', KEYS[1 + i]) == 0 then
            wake(nh, ARGV[7], 'more')
            break
          end
        end
      end
    end
    return r
  end
end
if me == '' then return {0, -1} end
join(line, me, ARGV[6], false, h == nil or h == me)
if h == nil or h == me then return {0, 0} end
return {0, 1}
"#
);

/// Release on a gate node: RELEASE, then, for a holder's release, wake the head of the line
/// when a key is free (whoever deleted it: an expired or broken holder's key counts too); a
/// clean-up (`q`) wakes it only when it deleted a key (someone may have been refused by it);
/// for a waiter's failed attempt, put the waiter back at the FRONT of the line (its turn is not
/// lost to a barging client), but only a waiter that held a place here (its lease key lives):
/// one whose attempts never reached the gate joins at the back at its next attempt. Used on a cluster node and for the put-back; a single server's
/// `w` and `q` go through GATE_FREE.
/// KEYS[1..n]: the lock keys; KEYS[n+1]: their line. ARGV[1]: value; ARGV[2]: `w` (wake), `q`
/// (clean-up) or the member to put back (`+member`: put back whatever its lease, the gate
/// granted this attempt); ARGV[3]: the lease in ms; ARGV[4]: channel prefix;
/// ARGV[5]: a short id of this release (sent with the wake-up).
/// Reply: `{deleted, woken member or ''}`. EVAL-only like RELEASE.
const GATE_RELEASE: &str = concat!(
    line_lib!(),
    r#"
local n = #KEYS - 1
local line = KEYS[n + 1]
local deleted, free = 0, false
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
    free = true
  elseif not v then
    free = true
  end
end
local mode = ARGV[2]
if mode == 'w' or mode == 'q' then
  -- A holder's release, or a clean-up that freed a key someone may have been refused by.
  if (mode == 'w' and free) or deleted > 0 then
    local h = live_head(line)
    if h then
      wake(h, ARGV[4], ARGV[5])
      return {deleted, h}
    end
  end
elseif string.sub(mode, 1, 1) == '+' then
  -- Granted here by this attempt (the head, or the line was empty), refused elsewhere.
  join(line, string.sub(mode, 2), ARGV[3], true, true)
elseif redis.call('EXISTS', line .. '|' .. mode) == 1 then
  -- Only a waiter that held a place here (its lease lives on after its grant took it out).
  join(line, mode, ARGV[3], true, true)
end
return {deleted, ''}
"#
);

/// Leave a wait line (a waiter that gave up, was cancelled or timed out, or was granted by the
/// other nodes while this gate refused it), and when the leaver was its head (or no member is
/// given: a poke after a lock was broken) wake the next head: for its turn when a key is free
/// (`leave`), otherwise only to look at the gate (`look`), which tells it that it is the head
/// now (a waiter far behind would learn it only at its next `ZRANK`, up to 4 s later, and a
/// key held by a client that ignores lines is freed without a wake-up).
/// KEYS[1..n]: the lock keys; KEYS[n+1]: the line. ARGV[1]: the member ('' = none); ARGV[2]:
/// channel prefix. Reply: the member woken for its turn, or ''.
const LINE_LEAVE: &str = concat!(
    line_lib!(),
    r#"
local n = #KEYS - 1
local line, me = KEYS[n + 1], ARGV[1]
local was_head = true
if me ~= '' then
  was_head = redis.call('ZRANGE', line, 0, 0)[1] == me
  redis.call('ZREM', line, me)
  redis.call('DEL', line .. '|' .. me)
end
if not was_head then return '' end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local h = live_head(line)
    if h then
      wake(h, ARGV[2], 'leave')
      return h
    end
    return ''
  end
end
local h = live_head(line)
if h then wake(h, ARGV[2], 'look') end
return ''
"#
);

/// `free()`: the body of [`GATE_FREE`] (see there), as a function that also returns what the
/// lock key holds after it (`false`: nothing), for [`ELECT_GATE_FREE`]'s announcement.
macro_rules! gate_free_fn {
    () => {
        r#"
local function free()
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local lease = KEYS[2]
  if h then lease = KEYS[3] .. '|' .. h end
  local v = redis.pcall('MGET', KEYS[1], KEYS[2], lease)
  -- A user whose ACL predates this script (no +mget): three reads.
  if v.err then
    v = {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('GET', lease)}
  end
  -- MGET reads a key of another type as nil: GET says WRONGTYPE, as every release does.
  if not v[1] then redis.call('GET', KEYS[1]) end
  if v[1] and v[1] ~= ARGV[1] then return {0, ''}, v[1] end
  local deleted = 0
  if v[1] then
    redis.call('DEL', KEYS[1])
    if not v[2] then return {1, ''}, false end
    deleted = 1
  elseif not v[2] or ARGV[4] ~= 'w' then
    return {0, ''}, false
  end
  -- The key is free and the line has (or had) members: the head's turn (its lease read above).
  if h and not v[3] then h = live_head(KEYS[3], h) end
  if h then
    wake(h, ARGV[2], ARGV[3])
    return {deleted, h}, false
  end
  redis.call('DEL', KEYS[2])
  return {deleted, ''}, false
end
"#
    };
}

/// A holder's release on its gate node, for a key known to have a line: the line's head, then
/// one `MGET` of the key, its line's flag (set while the line has members) and the head's
/// lease; without a flag, the compare-and-delete and nothing more; with one, the head is woken
/// as GATE_RELEASE does (a head whose lease is gone is passed over, as `live_head` does). The
/// flag outlives its line by at most its own expiry (it is removed by the first release to find
/// the line empty).
/// KEYS[1]: the lock key; KEYS[2]: its line's flag; KEYS[3]: the line. ARGV[1]: value;
/// ARGV[2]: channel prefix; ARGV[3]: a short id of this release; ARGV[4]: `w` for a holder's
/// release (which wakes the head also when its own key had expired), `q` for a clean-up.
/// Reply: `{deleted, woken member or ''}`. By EVALSHA, as a lone release: only our token is
/// ever deleted, so a resend can only find it gone.
const GATE_FREE: &str = concat!(
    line_lib!(),
    gate_free_fn!(),
    r#"
local out = free()
return out
"#
);

/// A lone release on a key's gate while this process knows of no line there: the
/// compare-and-delete and a read of the line's flag in the same `MGET` (as GATE_FREE reads
/// them), and nothing of the line's library: the common, uncontended release costs the server
/// what a plain release does. KEYS[1]: the lock key; KEYS[2]: its line's flag. ARGV[1]: value.
/// Reply: 1 deleted, 0 not ours, plus 2 when the flag is set and the key is now free (the
/// caller then wakes the head with GATE_FREE, one more call on the rare path). By EVALSHA, as a
/// lone release: only our token is ever deleted, so a resend can only find it gone.
const GATE_FLAG: &str = r#"
local v = redis.pcall('MGET', KEYS[1], KEYS[2])
-- A user whose ACL predates this script (no +mget): two reads.
if v.err then v = {redis.call('GET', KEYS[1]), redis.pcall('GET', KEYS[2])} end
-- MGET reads a key of another type as nil: GET says WRONGTYPE, as every release does.
if not v[1] then redis.call('GET', KEYS[1]) end
local out = 0
if v[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  out = 1
end
if (out == 1 or not v[1]) and type(v[2]) == 'string' then
  out = out + 2
end
return out
"#;

/// A holder hands its lock to a waiter of its own process, on a node that is not the key's
/// gate: where the key still holds the holder's value (or is free), it now holds the waiter's.
/// KEYS[1]: the lock key. ARGV[1]: the holder's value; ARGV[2]: the waiter's; ARGV[3]: TTL in ms.
/// Reply: `{0, ''}` someone else's key, untouched; `{2, ''}` passed; `{3, ''}` free, set.
/// EVAL-only: it creates a key, as an acquire does.
const PASS: &str = r#"
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return {0, ''} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if v then return {2, ''} end
return {3, ''}
"#;

/// PASS on the key's gate, in line order: passed only when no member of another process is
/// ahead of the waiter in the key's line (the waiter then leaves the line; a waiter not in the
/// line, queued in its process, passes only when every member is of its process); otherwise nothing
/// is changed (the holder cleans up where PASS landed elsewhere, then releases here as usual,
/// which wakes the head: the head never finds the waiter's keys in its way).
/// KEYS[1]: the lock key; KEYS[2]: its line. ARGV[1..3]: as PASS; ARGV[4]: the waiter's member;
/// ARGV[5]: this process's member prefix (`<instance>:`).
/// Reply: as PASS, or `{4, ''}`: not passed, nothing changed.
const GATE_PASS: &str = concat!(
    line_lib!(),
    r#"
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return {0, ''} end
local line, me, ours = KEYS[2], ARGV[4], ARGV[5]
local h = live_head(line)
local ok = h == nil or h == me
if h and not ok then
  -- Every member ahead of the waiter is of this process (at most 64 looked at); a waiter
  -- queued in its process, not in the line, is behind every member.
  local r, ahead = redis.call('ZRANK', line, me), nil
  if r and r <= 64 then
    ahead = redis.call('ZRANGE', line, 0, r - 1)
  elseif not r then
    ahead = redis.call('ZRANGE', line, 0, 64)
    if #ahead > 64 then ahead = nil end
  end
  if ahead then
    ok = true
    for _, m in ipairs(ahead) do
      if string.sub(m, 1, #ours) ~= ours then ok = false break end
    end
  end
end
if ok then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZREM', line, me)
  redis.call('DEL', line .. '|' .. me)
  if v then return {2, ''} end
  return {3, ''}
end
return {4, ''}
"#
);

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
/// Operation i is ARGV[2i - 1] (its token) and ARGV[2i]: the TTL in ms for an acquire (`SET key
/// token NX PX ttl`), `r` for a release (RELEASE), `f` for a release on the key's gate (GATE_FREE
/// without its wake-up). Each takes the next KEYS in order: its key, and for `f` also its line's
/// flag.
/// Reply: one element per operation, in order: an acquire 1 set / 0 the key exists (any type);
/// a release the number of keys deleted (1 / 0); `f` as a release, plus 2 when its line's flag
/// is set and the key is now free (whoever freed it: the caller then wakes the line's head); or
/// the server's error as a string for that operation alone (`redis.pcall`: a WRONGTYPE key
/// fails its own operation, not the others).
/// ARGV that do not match KEYS: an error, nothing done. EVAL-only, like RELEASE.
const BATCH: &str = r#"
local n = #ARGV / 2
local want = 0
for i = 1, n do
  if ARGV[2 * i] == 'f' then want = want + 2 else want = want + 1 end
end
if #ARGV % 2 ~= 0 or want ~= #KEYS then
  return redis.error_reply('fredlock: a batch wants a token and an operation per key')
end
local out, k = {}, 1
for i = 1, n do
  local key, token, op = KEYS[k], ARGV[2 * i - 1], ARGV[2 * i]
  k = k + 1
  if op == 'r' or op == 'f' then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      out[i] = v.err
    elseif v == token then
      redis.call('DEL', key)
      out[i] = 1
    else
      out[i] = 0
    end
    if op == 'f' then
      -- The flag is read as GATE_FREE reads it (GET: no command beyond a release's ACL).
      if (out[i] == 1 or v == false) and type(redis.pcall('GET', KEYS[k])) == 'string' then
        out[i] = out[i] + 2
      end
      k = k + 1
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

/// The election scripts' shared functions:
/// - `view(lock, record, yield)`: this node's view of the election, `{live, term, value,
///   priority, version, pttl, label, yield, yield_pttl}` (see [`ELECT_VIEW`]); `view_of` builds
///   it from the lock's value and the record's fields when the script has them already, and
///   reads the request to yield only when given its key (`yield_key`; without it the view has
///   none: `''` and -2);
/// - `announce(record, v, channel)`: publishes the view `v` on the record's name, or on
///   `channel` when given (the campaigns' channel `<record>|prio`, which hears only what
///   changes a campaign: a request to yield, a claim of another priority than the last term's);
///   returns the number of receivers. Only the campaigns use the requests to yield, and they
///   listen on `<record>|prio` alone: what goes to the record's own channel (a claim, an
///   extension, a resign) carries none, and its script does not read the request; so that observers
///   follow the change without reading: `view1:<live>:<term>:<priority>:<version>:<pttl>:
///   <yield_pttl>:<bytes of value>:<bytes of label>:` then the value, the label and the yield
///   request, back to back (the value may hold any character).
macro_rules! elect_lib {
    () => {
        r#"
local function view_of(lock, r, lock_key, yield_key, lock_pttl)
  local live = 0
  local label = ''
  if lock and r[1] and lock == r[1] then
    live = 1
    -- The owner separator 0x1f (decimal 31) ends the token; the label follows it.
    local sep = string.find(lock, '\31', 1, true)
    if sep then label = string.sub(lock, sep + 1) end
  end
  local y = ''
  if yield_key then y = redis.call('GET', yield_key) or '' end
  local ypttl = -2
  if y ~= '' then ypttl = redis.call('PTTL', yield_key) end
  -- No lock value: no key (GET fails on a key of another type), whose PTTL is -2. A
  -- caller that has just set the TTL passes it (`lock_pttl`) rather than reading it.
  local pttl = -2
  if lock then pttl = lock_pttl or redis.call('PTTL', lock_key) end
  return {live, tonumber(r[2] or '0') or 0, r[3] or '', tonumber(r[4] or '0') or 0,
    tonumber(r[5] or '0') or 0, pttl, label, y, ypttl}
end
local function view(lock_key, record, yield_key)
  local lock = redis.call('GET', lock_key)
  local r = redis.call('HMGET', record, 'v', 't', 'val', 'p', 's')
  return view_of(lock, r, lock_key, yield_key)
end
local function announce(record, v, channel)
  local head = string.format('view1:%d:%d:%d:%d:%d:%d:%d:%d:', v[1], v[2], v[4], v[5], v[6],
    v[9], #v[3], #v[7])
  return redis.call('PUBLISH', channel or record, head .. v[3] .. v[7] .. v[8])
end
"#
    };
}

/// An election's leader claims its term, or changes its campaign value within it (proclaim).
/// KEYS[1]: the lock key, KEYS[2]: the election record (a hash: `v` the lock value of the term,
/// `t` the term number, `val` the campaign value, `p` the priority, `s` the value's version within
/// the term: 1 for the claim, one more for each proclaim), KEYS[3]: the yield request, KEYS[4]
/// (the claim only): the lock's fencing counter, raised to the term first, whatever else the
/// script finds (a max-register, as FENCE_RAISE: the acquire handed the term out unraised, and
/// the claim's quorum is the raise's); the counter and the lock key are read with one `MGET`.
/// ARGV[1]: the lock value, ARGV[2]: the term, ARGV[3]: the value, ARGV[4]: the priority,
/// ARGV[5]: the version, ARGV[6] (optional): the lock's TTL to announce, in ms (no more than
/// the key's: the caller's validity left); without it the script reads the key's `PTTL`. A version not newer than the stored one of the same term is
/// acknowledged without a write (a late or repeated proclaim never undoes a newer one).
/// Reply: 1 written (and this node's view announced, see `elect_lib`; on the campaigns'
/// channel too when the priority is not the last term's); 0 the lock key does not
/// hold our value (nothing written); -1 the record names a later term, or this term with
/// another lock value (nothing written: a late claim never overwrites a newer term).
const ELECT_CLAIM: &str = concat!(
    elect_lib!(),
    r#"
local lock
if KEYS[4] then
  -- The counter and the lock key in one read.
  local v = redis.pcall('MGET', KEYS[4], KEYS[1])
  -- A user whose ACL predates this script (no +mget): two reads.
  if v.err then v = {redis.call('GET', KEYS[4]), redis.call('GET', KEYS[1])} end
  -- MGET reads a key of another type as nil: GET says WRONGTYPE, as the reads it replaces.
  if not v[1] then redis.call('GET', KEYS[4]) end
  if not v[2] then redis.call('GET', KEYS[1]) end
  local c = tonumber(v[1] or '0')
  if c == nil then return redis.error_reply('fencing counter ' .. KEYS[4] .. ' is not a number') end
  if c < tonumber(ARGV[2]) then redis.call('SET', KEYS[4], ARGV[2]) end
  lock = v[2]
else
  lock = redis.call('GET', KEYS[1])
end
if lock ~= ARGV[1] then return 0 end
local term = tonumber(ARGV[2])
local last = redis.call('HMGET', KEYS[2], 't', 'p')
local t = tonumber(last[1] or '0') or 0
if t > term then return -1 end
if t == term then
  if redis.call('HGET', KEYS[2], 'v') ~= ARGV[1] then return -1 end
  local s = tonumber(redis.call('HGET', KEYS[2], 's') or '0') or 0
  if s >= tonumber(ARGV[5]) then return 1 end
end
redis.call('HSET', KEYS[2], 'v', ARGV[1], 't', ARGV[2], 'val', ARGV[3], 'p', ARGV[4], 's', ARGV[5])
-- The view without reading again what was just checked and written.
local r = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]}
announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], nil, tonumber(ARGV[6])))
-- Campaigns hear a claim only when the leader's priority changes (or there was no record),
-- with the request to yield.
if tonumber(last[2] or '-1') ~= tonumber(ARGV[4]) then
  announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], KEYS[3], tonumber(ARGV[6])), KEYS[2] .. '|prio')
end
return 1
"#
);

/// Read an election's state atomically, without its secret token.
/// KEYS[1]: the lock key, KEYS[2]: the record (see [`ELECT_CLAIM`]), KEYS[3]: the yield request.
/// Reply: `{live, term, value, priority, version, pttl, label, yield, yield_pttl}`: `live` 1 when
/// the lock key holds the record's lock value (the term is current here), else 0; `term` 0 and
/// `value` '' without a record; `label` the lock value's owner label ('' without one); `yield`
/// the pending request ('term:priority', '' without one; then `yield_pttl` is -2).
const ELECT_VIEW: &str = concat!(
    elect_lib!(),
    r#"
return view(KEYS[1], KEYS[2], KEYS[3])
"#
);

/// A preferred candidate asks the leader of a term to yield.
/// KEYS[1]: the lock key, KEYS[2]: the record, KEYS[3]: the yield request. ARGV[1]: the term,
/// ARGV[2]: the candidate's priority, ARGV[3]: how long the request stands, in ms.
/// Reply: 1 requested (and this node's view announced, on the campaigns' channel too); 0 not needed (another term, a leader
/// of equal or higher priority, or an equal or stronger request already pending).
const ELECT_YIELD: &str = concat!(
    elect_lib!(),
    r#"
local r = redis.call('HMGET', KEYS[2], 't', 'p')
if r[1] ~= ARGV[1] then return 0 end
local prio = tonumber(ARGV[2])
if (tonumber(r[2] or '0') or 0) >= prio then return 0 end
local y = redis.call('GET', KEYS[3])
if y then
  local yp = tonumber(string.match(y, ':(%d+)$') or '0') or 0
  if yp >= prio then return 0 end
end
redis.call('SET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
local v = view(KEYS[1], KEYS[2], KEYS[3])
announce(KEYS[2], v)
announce(KEYS[2], v, KEYS[2] .. '|prio')
return 1
"#
);

/// Announces this node's view of an election to its observers (after a resign), without the
/// request to yield (see `elect_lib`).
/// KEYS: as [`ELECT_VIEW`]. Reply: the number of receivers.
const ELECT_NOTIFY: &str = concat!(
    elect_lib!(),
    r#"
return announce(KEYS[2], view(KEYS[1], KEYS[2]))
"#
);

/// An election term's extension, and the announcement of this node's view after it, so that
/// observers learn the new TTL without reading (see `observe`).
/// KEYS: as [`ELECT_VIEW`]. ARGV[1]: the term's lock value, ARGV[2]: the new TTL in ms.
/// Reply: 1 extended (and announced), 0 not ours (nothing done, nothing announced), as EXTEND
/// for one key. By EVALSHA, as EXTEND: it never creates a key.
const ELECT_EXTEND: &str = concat!(
    elect_lib!(),
    r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local r = redis.call('HMGET', KEYS[2], 'v', 't', 'val', 'p', 's')
announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], nil, tonumber(ARGV[2])))
return 1
"#
);

/// The release of an election's term on a node that is not its line's gate, and the
/// announcement of this node's view after it (what ELECT_NOTIFY sends, in the same script;
/// once the key holds no value, a view that is not live and names no term, without reading
/// the record: an observer names a leader from live views alone).
/// KEYS: as [`ELECT_VIEW`]. ARGV[1]: the term's lock value.
/// Reply: 1 deleted, 0 not ours (as RELEASE for one key). By EVALSHA, as a lone release: only
/// the term's own fresh token is ever deleted, so a resend can only find it gone.
const ELECT_RESIGN: &str = concat!(
    elect_lib!(),
    r#"
local lock = redis.call('GET', KEYS[1])
local deleted = 0
if lock == ARGV[1] then
  redis.call('DEL', KEYS[1])
  deleted = 1
  lock = false
end
-- Without a lock value the view is not live whatever the record says (and observers name a
-- leader from live views alone): the record is read only when another value holds the key.
local r = {}
if lock then r = redis.call('HMGET', KEYS[2], 'v', 't', 'val', 'p', 's') end
announce(KEYS[2], view_of(lock, r, KEYS[1]))
return deleted
"#
);

/// GATE_FREE for an election's term, and the announcement of the election's view on this node
/// after it (as ELECT_RESIGN announces it, without reading the lock key again).
/// KEYS[1..3] and ARGV: as GATE_FREE; KEYS[4]: the election's record. Reply: as GATE_FREE. By
/// EVALSHA, as GATE_FREE.
const ELECT_GATE_FREE: &str = concat!(
    line_lib!(),
    elect_lib!(),
    gate_free_fn!(),
    r#"
local out, lock = free()
-- As ELECT_RESIGN: the record is read only when another value holds the key.
local r = {}
if lock then r = redis.call('HMGET', KEYS[4], 'v', 't', 'val', 'p', 's') end
announce(KEYS[4], view_of(lock, r, KEYS[1]))
return out
"#
);

/// The scripts, hashed once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire_many: Script,
    pub(crate) extend: Script,
    pub(crate) repair: Script,
    pub(crate) shorten: Script,
    pub(crate) lease_check: Script,
    pub(crate) rw_read: Script,
    pub(crate) rw_write: Script,
    pub(crate) rw_view: Script,
    pub(crate) rw_downgrade: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) force_break: Script,
    pub(crate) acquire_fenced: Script,
    pub(crate) fence_raise: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) view_many: Script,
    pub(crate) extend_many: Script,
    pub(crate) batch: Script,
    pub(crate) gate_acquire: Script,
    pub(crate) sem_gate: Script,
    pub(crate) gate_release: Script,
    pub(crate) gate_free: Script,
    pub(crate) elect_gate_free: Script,
    pub(crate) gate_flag: Script,
    pub(crate) pass: Script,
    pub(crate) gate_pass: Script,
    pub(crate) line_leave: Script,
    pub(crate) elect_resign: Script,
    pub(crate) elect_extend: Script,
    pub(crate) elect_claim: Script,
    pub(crate) elect_view: Script,
    pub(crate) elect_yield: Script,
    pub(crate) elect_notify: Script,
}

impl Scripts {
    pub(crate) fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire_many: Script::eval_only(ACQUIRE_MANY),
            extend: Script::new(EXTEND),
            // Creates keys, as an acquire does: EVAL-only (a late resend could land after the
            // release queued behind it).
            repair: Script::eval_only(REPAIR),
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
            // Acquires and releases: EVAL-only like the others (a late NOSCRIPT resend would
            // break per-node order). Leaving a line is idempotent and orders with nothing.
            gate_acquire: Script::eval_only(GATE_ACQUIRE),
            sem_gate: Script::eval_only(SEM_GATE),
            gate_release: Script::eval_only(GATE_RELEASE),
            // Deletes only its caller's token, like a lone release (see the top of this file).
            gate_free: Script::new(GATE_FREE),
            elect_gate_free: Script::new(ELECT_GATE_FREE),
            gate_flag: Script::new(GATE_FLAG),
            // Hand-overs create the waiter's key, as an acquire does: EVAL-only.
            pass: Script::eval_only(PASS),
            gate_pass: Script::eval_only(GATE_PASS),
            line_leave: Script::new(LINE_LEAVE),
            // A resent claim or yield re-checks everything it depends on: EVALSHA is safe.
            elect_claim: Script::new(ELECT_CLAIM),
            elect_view: Script::new(ELECT_VIEW),
            elect_yield: Script::new(ELECT_YIELD),
            elect_notify: Script::new(ELECT_NOTIFY),
            // Deletes only the term's own fresh token, like a lone release.
            elect_resign: Script::new(ELECT_RESIGN),
            // Like EXTEND: never creates a key, so a late resend only finds it gone.
            elect_extend: Script::new(ELECT_EXTEND),
        })
    }
}
