-- `pass.lua` on the key's gate, in line order: passed only when no member of another process is
-- ahead of the waiter in the key's line (the waiter then leaves the line; a waiter not in the
-- line, queued in its process, passes only when every member is of its process); otherwise nothing
-- is changed (the holder cleans up where `pass.lua` landed elsewhere, then releases here as usual,
-- which wakes the head: the head never finds the waiter's keys in its way).
-- KEYS[1]: the lock key; KEYS[2]: its line. ARGV[1..3]: as `pass.lua`; ARGV[4]: the waiter's
-- member;
-- ARGV[5]: this process's member prefix (`<instance>:`).
-- Reply: as `pass.lua`, or `{4, ''}`: not passed, nothing changed.

local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return {0, ''} end
local line, me, ours = KEYS[2], ARGV[4], ARGV[5]
local h = live_head(line)
local ok = h == nil or h == me
if h and not ok then
  -- Every member ahead of the waiter is of this process (at most 64 looked at); a waiter
  -- queued in its process, not in the line, is behind every member.
  local r, ahead = redis.call('ZRANK', line, me), nil
  if r and r <= 64 then
    ahead = redis.call('ZRANGE', line, 0, r - 1)
  elseif not r then
    ahead = redis.call('ZRANGE', line, 0, 64)
    if #ahead > 64 then ahead = nil end
  end
  if ahead then
    ok = true
    for _, m in ipairs(ahead) do
      if string.sub(m, 1, #ours) ~= ours then ok = false break end
    end
  end
end
if ok then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZREM', line, me)
  redis.call('DEL', line .. '|' .. me)
  if v then return {2, ''} end
  return {3, ''}
end
return {4, ''}
