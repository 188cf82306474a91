-- Claim a session for a holder until `expires` (policies.sessions.claim).
-- KEYS: binding index, bindings ; ARGV: session, holder, expires, now
-- Reply: {'busy', binding} (another holder has it), {'held', binding} (the caller holds
-- it now; the binding as found), or {'new'} (no sandbox yet: the caller holds a claim).
local b = live_binding(ARGV[1], ARGV[4])
if b and b.holder ~= '' and b.holder ~= ARGV[2] then
  return {'busy', cjson.encode(b)}
end
if not b or b.sandbox_id == '' then
  put_binding(ARGV[1], {entry = '', sandbox_id = '', holder = ARGV[2]}, ARGV[3])
  return {'new'}
end
local found = cjson.encode(b)
b.holder = ARGV[2]
put_binding(ARGV[1], b, ARGV[3])
return {'held', found}
