-- Read an election's state atomically, without its secret token.
-- KEYS[1]: the lock key, KEYS[2]: the record (see `elect_claim.lua`), KEYS[3]: the yield request.
-- Reply: `{live, term, value, priority, version, pttl, label, yield, yield_pttl}`: `live` 1 when
-- the lock key holds the record's lock value (the term is current here), else 0; `term` 0 and
-- `value` '' without a record; `label` the lock value's owner label ('' without one); `yield`
-- the pending request ('term:priority', '' without one; then `yield_pttl` is -2).

return view(KEYS[1], KEYS[2], KEYS[3])
