-- Read-write lock, take the write lock: only when no writer holds it and no reader key of the
-- set still exists. Refused, it marks a writer as waiting (unless another writer's mark is
-- there), so that new readers are refused until the writer got in or gave up; the writer
-- deletes its mark then (it also expires with ARGV[4]).
-- KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set,
-- KEYS[4] (with fencing): the writer key's fencing counter.
-- ARGV[1]: value, ARGV[2]: TTL in ms, ARGV[3]: this writer's waiting mark, ARGV[4]: the
-- mark's TTL in ms, ARGV[5]: '1' to read the fencing counter.
-- Reply: `{1, counter}` (0 without fencing; -1 when not a number) set; refused: `{0, 1}` when
-- a writer holds the lock, `{0, 0}` when only readers do.

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
