-- Read-write lock, take a read share. Each reader is a lock key of its own (expiring with its
-- own TTL, extended and released like any lock key); the readers set lists the reader keys so
-- that a writer can find them (members whose key is gone are dropped here and by writers).
-- KEYS[1]: the writer key, KEYS[2]: the writer-waiting key, KEYS[3]: the readers set,
-- KEYS[4]: this reader's key (all in one hash slot; the set's members are keys of that slot).
-- ARGV[1]: value, ARGV[2]: TTL in ms.
-- Reply: 1 the share was taken; 0 a writer holds the lock or waits for it (nothing set).

if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('EXISTS', k) == 0 then redis.call('SREM', KEYS[3], k) end
end
if not redis.call('SET', KEYS[4], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SADD', KEYS[3], KEYS[4])
return 1
