-- Announces this node's view of an election to its observers (after a resign), without the
-- request to yield (see `elect_lib`).
-- KEYS: as `elect_view.lua`. Reply: the number of receivers.

return announce(KEYS[2], view(KEYS[1], KEYS[2]))
