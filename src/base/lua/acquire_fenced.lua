-- Acquire several keys at once, all or none, and read each key's fencing counter in the same
-- script, so that a grant never lacks its counter.
-- KEYS[1..n]: the lock keys, KEYS[n+1..2n]: their counters. ARGV[1]: token, ARGV[2]: TTL in ms.
-- Reply: `{1, c1, ..., cn}` (each counter, 0 when absent, -1 when not a number) when every key
-- was set; `{0}` when any key exists and nothing was set. Counters are never written here.
-- One key (every election term, most fenced locks): its `SET NX` is the check, no `EXISTS`.

local n = #KEYS / 2
if n == 1 then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0') or -1}
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {0} end
end
local out = {1}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  out[i + 1] = tonumber(redis.call('GET', KEYS[n + i]) or '0') or -1
end
return out
