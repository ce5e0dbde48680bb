-- Acquire one lock key on its gate node: granted only to the head of the key's wait line (or
-- to anyone while the line is empty), so that the woken head never splits votes with the
-- waiters behind it. A refused waiter joins the line (or renews its lease there).
-- KEYS[1]: the lock key, KEYS[2]: its line, KEYS[3] (with fencing): its counter.
-- ARGV[1]: value, ARGV[2]: TTL in ms, ARGV[3]: the waiter's member ('' = does not wait),
-- ARGV[4]: the lease in ms, ARGV[5]: `rank` to be told the exact place behind the head (a
-- waiter far behind renews its place without looking, one that polls paces itself by it),
-- ARGV[6]: what the caller knows of its place: `turn` (woken as the head: its first entry is
-- popped, and put back unless the key is set), `new` (not in the line: only its tail is read,
-- a head whose lease is gone is left to the waiters' looks), or '' (look at the head).
-- Reply: `{1, counter}` set (counter 0 without fencing, -1 when not a number), `{1, counter,
-- 1}` set for the head of a line (others may still wait); `{0, rank,
-- pttl}` refused: the waiter's place in the line (0 = head, 1.. = behind it: unless asked for
-- the rank, 1, or 2 for a newcomer that found two members or more ahead; -1 = not in it) and,
-- for the head and for a caller that does not wait, the
-- lock key's PTTL (-2: free, refused for the line alone; -3: not read).

local key, line, me, how = KEYS[1], KEYS[2], ARGV[3], ARGV[6]
local function take(lined)
  if not redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then return nil end
  local c = 0
  if KEYS[3] then c = tonumber(redis.call('GET', KEYS[3]) or '0') or -1 end
  if lined then return {1, c, 1} end
  return {1, c}
end
local h, edge, known, ahead = nil, nil, false, 1
if me ~= '' and how == 'turn' then
  -- Woken as the head: out of the line and granted in two commands. (A user whose ACL
  -- predates this script, without +zpopmin, looks at the head below.)
  local first = redis.pcall('ZPOPMIN', line)
  if first.err then first = {} end
  if first[1] == me then
    local g = take(true)
    if g then return g end
    h, known = me, true
  end
  -- Back at its place (anyone else, or the head refused by a key still held).
  if first[1] then
    redis.call('ZADD', line, first[2], first[1])
    -- A put-back at the front renews the line: ZPOPMIN deletes a line it empties, expiry and
    -- all, and someone else's entry put back alone would make a line that never expires.
    -- (The waiter's own entry gets its expiry from its join below.)
    if first[1] ~= me then redis.call('PEXPIRE', line, 4 * tonumber(ARGV[4])) end
  end
elseif me ~= '' and how == 'new' then
  -- Not in the line yet: its last two entries say whether anyone is ahead, and whether two
  -- are (a head whose lease is gone is left to the waiters' looks).
  local last = redis.call('ZRANGE', line, -2, -1, 'WITHSCORES')
  local n = #last
  if last[n - 1] ~= me then
    edge, h, known = {last[n - 1], last[n]}, last[n - 1], true
    if n == 4 and last[1] ~= me then ahead = 2 end
    if h == nil then
      local g = take(false)
      if g then return g end
    end
  end
end
if not known then
  h = redis.call('ZRANGE', line, 0, 0)[1]
  if h and h ~= me then h = live_head(line, h) end
  if h == nil or h == me then
    local g = take(h ~= nil)
    if g then
      -- Out of the line (its lease key expires on its own).
      if h then redis.call('ZREM', line, me) end
      return g
    end
  end
end
if me == '' then return {0, -1, redis.call('PTTL', key)} end
if h == nil or h == me then
  if h == me then edge = true end
  join(line, me, ARGV[4], false, true, edge)
  return {0, 0, redis.call('PTTL', key)}
end
local rank
if edge == nil and ARGV[5] == 'rank' then
  rank = redis.call('ZRANK', line, me)
  if rank then edge = true end
end
join(line, me, ARGV[4], false, false, edge)
if ARGV[5] == 'rank' then return {0, rank or redis.call('ZRANK', line, me), -3} end
return {0, ahead, -3}
