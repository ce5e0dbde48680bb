-- A lone release on a key's gate while this process knows of no line there: the
-- compare-and-delete and a read of the line's flag in the same `MGET` (as `gate_free.lua` reads
-- them), and nothing of the line's library: the common, uncontended release costs the server
-- what a plain release does. KEYS[1]: the lock key; KEYS[2]: its line's flag. ARGV[1]: value.
-- Reply: 1 deleted, 0 not ours, plus 2 when the flag is set and the key is now free (the
-- caller then wakes the head with `gate_free.lua`, one more call on the rare path). By EVALSHA,
-- as a
-- lone release: only our token is ever deleted, so a resend can only find it gone.

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
