-- Shorten (hold at least): only if EVERY key still holds our token, lower each key's TTL to
-- ARGV[2] ms; a key whose TTL is already shorter (or that has none) keeps it, so this never
-- lengthens a lock nor re-creates a key.
-- KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
-- Reply: 1 ours (shortened where needed), 0 not ours (nothing changed).

for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return 0 end
end
local ms = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left > ms then redis.call('PEXPIRE', key, ms) end
end
return 1
