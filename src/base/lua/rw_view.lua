-- Read-write lock, inspect: the writer, the waiting writer's mark and every live reader.
-- KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set.
-- Reply: `{writer value or nil, pttl, mark or nil, pttl, reader value, pttl, ...}`.

local out = {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2])}
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local v = redis.call('GET', k)
  if v then
    out[#out + 1] = v
    out[#out + 1] = redis.call('PTTL', k)
  end
end
return out
