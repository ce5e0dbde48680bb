-- The election scripts' shared functions:
-- - `view(lock, record, yield)`: this node's view of the election, `{live, term, value,
--   priority, version, pttl, label, yield, yield_pttl}` (see `elect_view.lua`); `view_of` builds
--   it from the lock's value and the record's fields when the script has them already, and
--   reads the request to yield only when given its key (`yield_key`; without it the view has
--   none: `''` and -2);
-- - `announce(record, v, channel)`: publishes the view `v` on the record's name, or on
--   `channel` when given (the campaigns' channel `<record>|prio`, which hears only what
--   changes a campaign: a request to yield, a claim of another priority than the last term's);
--   returns the number of receivers. Only the campaigns use the requests to yield, and they
--   listen on `<record>|prio` alone: what goes to the record's own channel (a claim, an
--   extension, a resign) carries none, and its script does not read the request; so that observers
--   follow the change without reading: `view1:<live>:<term>:<priority>:<version>:<pttl>:
--   <yield_pttl>:<bytes of value>:<bytes of label>:` then the value, the label and the yield
--   request, back to back (the value may hold any character).

local function view_of(lock, r, lock_key, yield_key, lock_pttl)
  local live = 0
  local label = ''
  if lock and r[1] and lock == r[1] then
    live = 1
    -- The owner separator 0x1f (decimal 31) ends the token; the label follows it.
    local sep = string.find(lock, '\31', 1, true)
    if sep then label = string.sub(lock, sep + 1) end
  end
  local y = ''
  if yield_key then y = redis.call('GET', yield_key) or '' end
  local ypttl = -2
  if y ~= '' then ypttl = redis.call('PTTL', yield_key) end
  -- No lock value: no key (GET fails on a key of another type), whose PTTL is -2. A
  -- caller that has just set the TTL passes it (`lock_pttl`) rather than reading it.
  local pttl = -2
  if lock then pttl = lock_pttl or redis.call('PTTL', lock_key) end
  return {live, tonumber(r[2] or '0') or 0, r[3] or '', tonumber(r[4] or '0') or 0,
    tonumber(r[5] or '0') or 0, pttl, label, y, ypttl}
end
local function view(lock_key, record, yield_key)
  local lock = redis.call('GET', lock_key)
  local r = redis.call('HMGET', record, 'v', 't', 'val', 'p', 's')
  return view_of(lock, r, lock_key, yield_key)
end
local function announce(record, v, channel)
  local head = string.format('view1:%d:%d:%d:%d:%d:%d:%d:%d:', v[1], v[2], v[4], v[5], v[6],
    v[9], #v[3], #v[7])
  return redis.call('PUBLISH', channel or record, head .. v[3] .. v[7] .. v[8])
end
