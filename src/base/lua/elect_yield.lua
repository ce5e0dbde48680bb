-- A preferred candidate asks the leader of a term to yield.
-- KEYS[1]: the lock key, KEYS[2]: the record, KEYS[3]: the yield request. ARGV[1]: the term,
-- ARGV[2]: the candidate's priority, ARGV[3]: how long the request stands, in ms.
-- Reply: 1 requested (and this node's view announced, on the campaigns' channel too); 0 not
-- needed (another term, a leader
-- of equal or higher priority, or an equal or stronger request already pending).

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
