-- The release of an election's term on a node that is not its line's gate, and the
-- announcement of this node's view after it (what `elect_notify.lua` sends, in the same script;
-- once the key holds no value, a view that is not live and names no term, without reading
-- the record: an observer names a leader from live views alone).
-- KEYS: as `elect_view.lua`. ARGV[1]: the term's lock value.
-- Reply: 1 deleted, 0 not ours (as `release.lua` for one key). By EVALSHA, as a lone release: only
-- the term's own fresh token is ever deleted, so a resend can only find it gone.

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
