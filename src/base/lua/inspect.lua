-- Inspect one key atomically.
-- KEYS[1]: the lock key. Reply: `[value or nil, pttl]` (pttl -2 = no key, -1 = no expiry).

return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
