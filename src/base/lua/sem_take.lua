-- `take()`: take one semaphore slot, the first free one in the order given (the same order is
-- sent to every node, so in the common case every node picks the same slot).
-- KEYS[1]: the semaphore's `permits` record; KEYS[2..p+1]: slot keys in the order to try;
-- KEYS[p+2..2p+1] (with fencing): their counters in the same order (a wait line's key may
-- follow, see `SEM_GATE` in `scripts`).
-- ARGV[1]: token, ARGV[2]: TTL in ms, ARGV[3]: permits, ARGV[4]: '1' to read the counter.
-- Returns `{1, position, counter}` a slot was set; `{0}` every slot is taken; `{-1, permits}`
-- this name is used with another number of permits (nothing set).

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
