-- Release: delete each key that still holds our token, leave every other key alone.
-- KEYS: the lock keys. ARGV[1]: token.
-- Reply: the number of keys deleted (0 .. #KEYS).

local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
