-- Extend: only if EVERY key still holds our token, then reset every key's TTL. Never creates a
-- key, so an expired lock is never revived.
-- KEYS: the lock keys. ARGV[1]: token, ARGV[2]: new TTL in ms.
-- Reply: 1 extended, 0 not ours (any key missing or holding another value).
-- A key of another type makes GET fail with WRONGTYPE: an error, counted as a failed node.

for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
