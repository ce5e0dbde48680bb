//! The Lua scripts of the semaphore and of the read-write lock: taking a semaphore slot
//! (`sem_take!`, shared with the semaphore's gate script in `scripts`) and a read-write lock's
//! read share, write lock, downgrade and view, each with its KEYS/ARGV contract and reply.
//!
//! Owns: those script bodies. Must not: hash or send them (`scripts` registers them, the node
//! layer sends them).

/// `take()`: take one semaphore slot, the first free one in the order given (the same order is
/// sent to every node, so in the common case every node picks the same slot).
/// KEYS[1]: the semaphore's `permits` record; KEYS[2..p+1]: slot keys in the order to try;
/// KEYS[p+2..2p+1] (with fencing): their counters in the same order (a wait line's key may
/// follow, see `SEM_GATE` in `scripts`).
/// ARGV[1]: token, ARGV[2]: TTL in ms, ARGV[3]: permits, ARGV[4]: '1' to read the counter.
/// Returns `{1, position, counter}` a slot was set; `{0}` every slot is taken; `{-1, permits}`
/// this name is used with another number of permits (nothing set).
macro_rules! sem_take {
    () => {
        r#"
local function take()
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
end
"#
    };
}
pub(crate) use sem_take;

/// Take one semaphore slot (see `sem_take!`): reply `{1, position, counter}`, `{0}` or
/// `{-1, permits}`.
pub(crate) const SEM_ACQUIRE: &str = concat!(sem_take!(), "return take()\n");

/// Read-write lock, take a read share. Each reader is a lock key of its own (expiring with its
/// own TTL, extended and released like any lock key); the readers set lists the reader keys so
/// that a writer can find them (members whose key is gone are dropped here and by writers).
/// KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set,
/// KEYS[4]: this reader's key (all in one hash slot; the set's members are keys of that slot).
/// ARGV[1]: value, ARGV[2]: TTL in ms.
/// Reply: 1 the share was taken; 0 a writer holds the lock or waits for it (nothing set).
pub(crate) const RW_READ: &str = r#"
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
/// Reply: `{1, counter}` (0 without fencing; -1 when not a number) set; refused: `{0, 1}` when
/// a writer holds the lock, `{0, 0}` when only readers do.
pub(crate) const RW_WRITE: &str = r#"
local writer = redis.call('EXISTS', KEYS[1])
local busy = writer == 1
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('EXISTS', k) == 1 then busy = true else redis.call('SREM', KEYS[3], k) end
end
if busy then
  local mark = redis.call('GET', KEYS[2])
  if not mark or mark == ARGV[3] then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
  return {0, writer}
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
pub(crate) const RW_DOWNGRADE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if not redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('SADD', KEYS[2], KEYS[3])
redis.call('DEL', KEYS[1])
return 1
"#;

/// Read-write lock, inspect: the writer, the waiting writer's mark and every live reader.
/// KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set.
/// Reply: `{writer value or nil, pttl, mark or nil, pttl, reader value, pttl, ...}`.
pub(crate) const RW_VIEW: &str = r#"
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
