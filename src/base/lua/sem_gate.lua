-- Take one semaphore slot on the semaphore's gate node: `take()` (see `sem_take.lua` in
-- `sem_rw_scripts`) for the head of the semaphore's wait line only (or anyone while it is
-- empty); a refused waiter joins the line. After a grant, when another slot is still free, the
-- next head is woken at once (one grant per wake-up, however many permits came free together).
-- KEYS: as `take()`, then the line's key LAST. ARGV[1..4]: as `take()`; ARGV[5]: the
-- waiter's member ('' = does not wait); ARGV[6]: the lease in ms; ARGV[7]: channel prefix.
-- Reply: as `take()`, or `{0, rank}` when refused with the waiter's place in line (0 = head,
-- 1 = behind it, -1 = not in it).

local line, me = KEYS[#KEYS], ARGV[5]
local h = live_head(line)
if h == nil or h == me then
  local r = take()
  if r[1] ~= 0 then
    if r[1] == 1 and h then
      redis.call('ZREM', line, me)
      local nh = live_head(line)
      if nh then
        local p = tonumber(ARGV[3])
        for i = 1, math.min(p, 64) do
          if redis.call('EXISTS', KEYS[1 + i]) == 0 then
            wake(nh, ARGV[7], 'more')
            break
          end
        end
      end
    end
    return r
  end
end
if me == '' then return {0, -1} end
join(line, me, ARGV[6], false, h == nil or h == me)
if h == nil or h == me then return {0, 0} end
return {0, 1}
