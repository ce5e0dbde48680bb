-- A holder's release on its gate node, for a key known to have a line: the line's head, then
-- one `MGET` of the key, its line's flag (set while the line has members) and the head's
-- lease; without a flag, the compare-and-delete and nothing more; with one, the head is woken
-- as `gate_release.lua` does (a head whose lease is gone is passed over, as `live_head` does). The
-- flag outlives its line by at most its own expiry (it is removed by the first release to find
-- the line empty).
-- KEYS[1]: the lock key; KEYS[2]: its line's flag; KEYS[3]: the line. ARGV[1]: value;
-- ARGV[2]: channel prefix; ARGV[3]: a short id of this release; ARGV[4]: `w` for a holder's
-- release (which wakes the head also when its own key had expired), `q` for a clean-up.
-- Reply: `{deleted, woken member or ''}`. By EVALSHA, as a lone release: only our token is
-- ever deleted, so a resend can only find it gone.

local out = free()
return out
