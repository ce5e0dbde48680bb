-- Raise fencing counters: a max-register, so a late or repeated write never lowers one.
-- KEYS: the counters. ARGV[i]: the token for KEYS[i]. Reply: 1.
-- A counter that is not a number is an error (never silently overwritten).

for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  local c = tonumber(raw or '0')
  if c == nil then return redis.error_reply('fencing counter ' .. KEYS[i] .. ' is not a number') end
  if c < tonumber(ARGV[i]) then redis.call('SET', KEYS[i], ARGV[i]) end
end
return 1
