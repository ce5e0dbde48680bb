-- Read several keys atomically. KEYS: the keys. Reply: `{v1, pttl1, v2, pttl2, ...}`.

local out = {}
for i, k in ipairs(KEYS) do
  out[2 * i - 1] = redis.call('GET', k)
  out[2 * i] = redis.call('PTTL', k)
end
return out
