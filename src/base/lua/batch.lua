-- Many single-key operations of concurrent locks on one node, in one call (see `batch`): each
-- does exactly what its plain form does, in the order given, so a release never runs before
-- an earlier acquire of the same token.
-- Operation i is ARGV[2i - 1] (its token) and ARGV[2i]: the TTL in ms for an acquire (`SET key
-- token NX PX ttl`), `r` for a release (`release.lua`), `f` for a release on the key's gate
-- (`gate_free.lua`
-- without its wake-up). Each takes the next KEYS in order: its key, and for `f` also its line's
-- flag.
-- Reply: one element per operation, in order: an acquire 1 set / 0 the key exists (any type);
-- a release the number of keys deleted (1 / 0); `f` as a release, plus 2 when its line's flag
-- is set and the key is now free (whoever freed it: the caller then wakes the line's head); or
-- the server's error as a string for that operation alone (`redis.pcall`: a WRONGTYPE key
-- fails its own operation, not the others).
-- ARGV that do not match KEYS: an error, nothing done. EVAL-only, like `release.lua`.

local n = #ARGV / 2
local want = 0
for i = 1, n do
  if ARGV[2 * i] == 'f' then want = want + 2 else want = want + 1 end
end
if #ARGV % 2 ~= 0 or want ~= #KEYS then
  return redis.error_reply('fredlock: a batch wants a token and an operation per key')
end
local out, k = {}, 1
for i = 1, n do
  local key, token, op = KEYS[k], ARGV[2 * i - 1], ARGV[2 * i]
  k = k + 1
  if op == 'r' or op == 'f' then
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      out[i] = v.err
    elseif v == token then
      redis.call('DEL', key)
      out[i] = 1
    else
      out[i] = 0
    end
    if op == 'f' then
      -- The flag is read as GATE_FREE reads it (GET: no command beyond a release's ACL).
      if (out[i] == 1 or v == false) and type(redis.pcall('GET', KEYS[k])) == 'string' then
        out[i] = out[i] + 2
      end
      k = k + 1
    end
  else
    local r = redis.pcall('SET', key, token, 'PX', op, 'NX')
    if type(r) == 'table' and r.err then
      out[i] = r.err
    elseif r then
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
