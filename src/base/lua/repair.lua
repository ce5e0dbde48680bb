-- Repair a held lock on a node where (some of) its keys are missing: only if no key holds
-- another value, set every key to our value with the TTL (a missing key is created, one of
-- ours has its TTL reset); all or none. Sent only while the lock is held, after an extension
-- won on a quorum (see `held_rounds`); a one-key lock is repaired with a plain
-- `SET key token NX PX ttl` instead (its key is missing there). On a cluster node, one call
-- per hash slot, even for one key (which may be ours while another slot's is missing).
-- KEYS: the lock keys. ARGV[1]: token, ARGV[2]: TTL in ms.
-- Reply: 1 set, 0 another value at a key (nothing changed).

for _, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and v ~= ARGV[1] then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
