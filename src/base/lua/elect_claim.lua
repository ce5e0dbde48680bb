-- An election's leader claims its term, or changes its campaign value within it (proclaim).
-- KEYS[1]: the lock key, KEYS[2]: the election record (a hash: `v` the lock value of the term,
-- `t` the term number, `val` the campaign value, `p` the priority, `s` the value's version within
-- the term: 1 for the claim, one more for each proclaim), KEYS[3]: the yield request, KEYS[4]
-- (the claim only): the lock's fencing counter, raised to the term first, whatever else the
-- script finds (a max-register, as `fence_raise.lua`: the acquire handed the term out unraised,
-- and
-- the claim's quorum is the raise's); the counter and the lock key are read with one `MGET`.
-- ARGV[1]: the lock value, ARGV[2]: the term, ARGV[3]: the value, ARGV[4]: the priority,
-- ARGV[5]: the version, ARGV[6] (optional): the lock's TTL to announce, in ms (no more than
-- the key's: the caller's validity left); without it the script reads the key's `PTTL`. A version
-- not newer than the stored one of the same term is
-- acknowledged without a write (a late or repeated proclaim never undoes a newer one).
-- Reply: 1 written (and this node's view announced, see `elect_lib`; on the campaigns'
-- channel too when the priority is not the last term's); 0 the lock key does not
-- hold our value (nothing written); -1 the record names a later term, or this term with
-- another lock value (nothing written: a late claim never overwrites a newer term).

local lock
if KEYS[4] then
  -- The counter and the lock key in one read.
  local v = redis.pcall('MGET', KEYS[4], KEYS[1])
  -- A user whose ACL predates this script (no +mget): two reads.
  if v.err then v = {redis.call('GET', KEYS[4]), redis.call('GET', KEYS[1])} end
  -- MGET reads a key of another type as nil: GET says WRONGTYPE, as the reads it replaces.
  if not v[1] then redis.call('GET', KEYS[4]) end
  if not v[2] then redis.call('GET', KEYS[1]) end
  local c = tonumber(v[1] or '0')
  if c == nil then return redis.error_reply('fencing counter ' .. KEYS[4] .. ' is not a number') end
  if c < tonumber(ARGV[2]) then redis.call('SET', KEYS[4], ARGV[2]) end
  lock = v[2]
else
  lock = redis.call('GET', KEYS[1])
end
if lock ~= ARGV[1] then return 0 end
local term = tonumber(ARGV[2])
local last = redis.call('HMGET', KEYS[2], 't', 'p')
local t = tonumber(last[1] or '0') or 0
if t > term then return -1 end
if t == term then
  if redis.call('HGET', KEYS[2], 'v') ~= ARGV[1] then return -1 end
  local s = tonumber(redis.call('HGET', KEYS[2], 's') or '0') or 0
  if s >= tonumber(ARGV[5]) then return 1 end
end
redis.call('HSET', KEYS[2], 'v', ARGV[1], 't', ARGV[2], 'val', ARGV[3], 'p', ARGV[4], 's', ARGV[5])
-- The view without reading again what was just checked and written.
local r = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]}
announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], nil, tonumber(ARGV[6])))
-- Campaigns hear a claim only when the leader's priority changes (or there was no record),
-- with the request to yield.
if tonumber(last[2] or '-1') ~= tonumber(ARGV[4]) then
  announce(KEYS[2], view_of(ARGV[1], r, KEYS[1], KEYS[3], tonumber(ARGV[6])), KEYS[2] .. '|prio')
end
return 1
