-- Read-write lock, downgrade: the writer becomes a reader without a gap, in one step per
-- node: only where the writer key still holds the writer's value, a reader key is set and
-- listed and the writer key deleted.
-- KEYS[1]: the writer key, KEYS[2]: the readers set, KEYS[3]: the new reader's key.
-- ARGV[1]: the writer's value, ARGV[2]: the reader's value, ARGV[3]: TTL in ms.
-- Reply: 1 downgraded; 0 the writer key is not ours (nothing changed).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if not redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('SADD', KEYS[2], KEYS[3])
redis.call('DEL', KEYS[1])
return 1
