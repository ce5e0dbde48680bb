-- The wait line of a lock key on its gate node (see `line` and `redlock`'s waiting): a sorted
-- set of waiter members (`<instance>:<seq>`, score = arrival order) and, per member, a lease
-- key `<line>|<member>` that the waiter renews while it waits (a waiter whose process died
-- drops out when its lease expires). Functions shared by the gate scripts:
-- - `live_head(line, first)`: the first member whose lease is alive, dropping dead ones on
--   the way (`nil`: nobody waits; `false`: more dead entries than one call clears, try
--   later); `first`, when given, is the first entry as already read;
-- - `wake(member, prefix, why)`: `PUBLISH prefix<instance> <seq>|<why>`, the member's
--   process's own channel (one per `Redlock`, whatever the number of keys);
-- - `join(line, member, lease, front, lead, edge)`: into the line unless already in it (at the
--   back, or at the front for a waiter whose granted turn failed elsewhere); renew the lease.
--   `edge`, when given, is the line's edge entry as already read (`ZRANGE .. WITHSCORES`), or
--   `true` for a member known to be in the line (nothing is added, the lease is renewed).
--   The line and its flag live 4 leases from the last look of a waiter with no live member
--   ahead of it (`lead`: the head, which looks at least once a lease while its lease lives;
--   once it is gone, the next look finds no one ahead), from a put-back at the front, and from
--   a join to an empty line. The waiters behind the head only renew their own lease: two
--   commands fewer per renewal and per newcomer (members still waiting when the line
--   expires join again).

local function live_head(line, first)
  local h = first
  for _ = 1, 32 do
    if h == nil then h = redis.call('ZRANGE', line, 0, 0)[1] end
    if not h then return nil end
    if redis.call('EXISTS', line .. '|' .. h) == 1 then return h end
    redis.call('ZREM', line, h)
    h = nil
  end
  return false
end
local function wake(h, prefix, why)
  local inst, seq = string.match(h, '^([^:]+):(.+)$')
  if inst then redis.call('PUBLISH', prefix .. inst, seq .. '|' .. why) end
end
local function join(line, me, lease, front, lead, edge)
  if edge ~= true then
    local at, step = -1, 1
    if front then at, step = 0, -1 end
    if edge == nil then edge = redis.call('ZRANGE', line, at, at, 'WITHSCORES') end
    local s = 0
    if edge[2] then s = tonumber(edge[2]) + step else lead = true end
    redis.call('ZADD', line, 'NX', s, me)
  end
  -- The line lives while its head looks, and its flag (read by GATE_FREE) with it.
  if lead or front then
    redis.call('PEXPIRE', line, 4 * tonumber(lease))
    redis.call('SET', line .. '!', '1', 'PX', 4 * tonumber(lease))
  end
  redis.call('SET', line .. '|' .. me, '1', 'PX', lease)
end
