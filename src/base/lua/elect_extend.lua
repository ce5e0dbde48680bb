-- An election term's extension, and the announcement of this node's view after it, so that
-- observers learn the new TTL without reading (see `observe`).
-- KEYS: as `elect_view.lua`. ARGV[1]: the term's lock value, ARGV[2]: the new TTL in ms.
-- Reply: 1 extended (and announced), 0 not ours (nothing done, nothing announced), as `extend.lua`
-- for one key. By EVALSHA, as `extend.lua`: it never creates a key.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local r = redis.call('HMGET', KEYS[2], 'v', 't', 'val', 'p', 's')
announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], nil, tonumber(ARGV[2])))
return 1
