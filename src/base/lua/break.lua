-- Break a lock by force, whoever holds it (an operator's `fredlock break`): read the value and
-- its TTL, and delete the key (the caller then pokes the key's wait line, see `line_leave.lua`).
-- KEYS[1]: the lock key. ARGV[1]: ignored. Reply: `[value or nil, pttl]`
-- as `inspect.lua`, of what was deleted. A key of another type is no lock: GET fails with
-- WRONGTYPE and nothing is deleted.

local v = redis.call('GET', KEYS[1])
local t = redis.call('PTTL', KEYS[1])
if v then
  redis.call('DEL', KEYS[1])
end
return {v, t}
