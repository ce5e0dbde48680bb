-- Release on a gate node: `release.lua`, then, for a holder's release, wake the head of the line
-- when a key is free (whoever deleted it: an expired or broken holder's key counts too); a
-- clean-up (`q`) wakes it only when it deleted a key (someone may have been refused by it);
-- for a waiter's failed attempt, put the waiter back at the FRONT of the line (its turn is not
-- lost to a barging client), but only a waiter that held a place here (its lease key lives):
-- one whose attempts never reached the gate joins at the back at its next attempt. Used on a
-- cluster node and for the put-back; a single server's
-- `w` and `q` go through `gate_free.lua`.
-- KEYS[1..n]: the lock keys; KEYS[n+1]: their line. ARGV[1]: value; ARGV[2]: `w` (wake), `q`
-- (clean-up) or the member to put back (`+member`: put back whatever its lease, the gate
-- granted this attempt); ARGV[3]: the lease in ms; ARGV[4]: channel prefix;
-- ARGV[5]: a short id of this release (sent with the wake-up).
-- Reply: `{deleted, woken member or ''}`. EVAL-only like `release.lua`.

local n = #KEYS - 1
local line = KEYS[n + 1]
local deleted, free = 0, false
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
    free = true
  elseif not v then
    free = true
  end
end
local mode = ARGV[2]
if mode == 'w' or mode == 'q' then
  -- A holder's release, or a clean-up that freed a key someone may have been refused by.
  if (mode == 'w' and free) or deleted > 0 then
    local h = live_head(line)
    if h then
      wake(h, ARGV[4], ARGV[5])
      return {deleted, h}
    end
  end
elseif string.sub(mode, 1, 1) == '+' then
  -- Granted here by this attempt (the head, or the line was empty), refused elsewhere.
  join(line, string.sub(mode, 2), ARGV[3], true, true)
elseif redis.call('EXISTS', line .. '|' .. mode) == 1 then
  -- Only a waiter that held a place here (its lease lives on after its grant took it out).
  join(line, mode, ARGV[3], true, true)
end
return {deleted, ''}
