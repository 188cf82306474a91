-- Bind a session to a sandbox until `expires`, held by a holder ('' for nobody)
-- (policies.sessions.bind): refused while another holder has the session; `kept` (a
-- lease keeping its session) only while the binding names this sandbox and holder.
-- KEYS: binding index, bindings
-- ARGV: session, entry, sandbox id, expires, now, paused ('0'/'1'), holder, kept ('0'/'1')
local b = live_binding(ARGV[1], ARGV[5])
if ARGV[8] == '1' then
  if not b or b.sandbox_id ~= ARGV[3] or b.holder ~= ARGV[7] then return 0 end
elseif b and b.holder ~= '' and b.holder ~= ARGV[7] then
  return 0
end
local new = {entry = ARGV[2], sandbox_id = ARGV[3], paused = ARGV[6] == '1', holder = ARGV[7]}
put_binding(ARGV[1], new, ARGV[4])
return 1
