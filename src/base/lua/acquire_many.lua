-- Acquire several keys at once, all or none.
-- KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
-- Reply: 1 when every key was set, 0 when any key exists (any type) and nothing was set.
-- (A single key is acquired with a plain `SET key token NX PX ttl`, which is the same contract.)

for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
