-- Leave a wait line (a waiter that gave up, was cancelled or timed out, or was granted by the
-- other nodes while this gate refused it), and when the leaver was its head (or no member is
-- given: a poke after a lock was broken) wake the next head: for its turn when a key is free
-- (`leave`), otherwise only to look at the gate (`look`), which tells it that it is the head
-- now (a waiter far behind would learn it only at its next `ZRANK`, up to 4 s later, and a
-- key held by a client that ignores lines is freed without a wake-up).
-- KEYS[1..n]: the lock keys; KEYS[n+1]: the line. ARGV[1]: the member ('' = none); ARGV[2]:
-- channel prefix. Reply: the member woken for its turn, or ''.

local n = #KEYS - 1
local line, me = KEYS[n + 1], ARGV[1]
local was_head = true
if me ~= '' then
  was_head = redis.call('ZRANGE', line, 0, 0)[1] == me
  redis.call('ZREM', line, me)
  redis.call('DEL', line .. '|' .. me)
end
if not was_head then return '' end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local h = live_head(line)
    if h then
      wake(h, ARGV[2], 'leave')
      return h
    end
    return ''
  end
end
local h = live_head(line)
if h then wake(h, ARGV[2], 'look') end
return ''
