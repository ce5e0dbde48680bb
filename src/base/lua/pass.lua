-- A holder hands its lock to a waiter of its own process, on a node that is not the key's
-- gate: where the key still holds the holder's value (or is free), it now holds the waiter's.
-- KEYS[1]: the lock key. ARGV[1]: the holder's value; ARGV[2]: the waiter's; ARGV[3]: TTL in ms.
-- Reply: `{0, ''}` someone else's key, untouched; `{2, ''}` passed; `{3, ''}` free, set.
-- EVAL-only: it creates a key, as an acquire does.

local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return {0, ''} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if v then return {2, ''} end
return {3, ''}
