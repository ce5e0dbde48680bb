-- `gate_free.lua` for an election's term, and the announcement of the election's view on this node
-- after it (as `elect_resign.lua` announces it, without reading the lock key again).
-- KEYS[1..3] and ARGV: as `gate_free.lua`; KEYS[4]: the election's record. Reply: as
-- `gate_free.lua`. By
-- EVALSHA, as `gate_free.lua`.

local out, lock = free()
-- As ELECT_RESIGN: the record is read only when another value holds the key.
local r = {}
if lock then r = redis.call('HMGET', KEYS[4], 'v', 't', 'val', 'p', 's') end
announce(KEYS[4], view_of(lock, r, KEYS[1]))
return out
