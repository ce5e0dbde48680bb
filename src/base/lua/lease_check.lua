-- Check a lease (a lock handed to another process): whether EVERY key still holds our token,
-- and the shortest TTL left among them. Changes nothing, so it never re-creates a lock.
-- KEYS: the lock keys. ARGV[1]: token.
-- Reply: `{1, pttl}` ours (pttl: the smallest PTTL in ms, -1 when a key has no expiry); `{0}`
-- not ours (a key missing or holding another value).

local least = nil
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) ~= ARGV[1] then return {0} end
  local t = redis.call('PTTL', key)
  if least == nil or t < least then least = t end
end
return {1, least}
