-- `free()`: the body of `gate_free.lua` (see there), as a function that also returns what the
-- lock key holds after it (`false`: nothing), for `elect_gate_free.lua`'s announcement.

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
