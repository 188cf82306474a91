-- Drop a paused sandbox's storage hold, charging the storage it used until now to its
-- pool and, when the call names the hold's tenant, to the tenant's copy
-- (policies/paused.py `settle`); then charge the pool's expired holds whole.
-- KEYS: usage, leases, held per entry, [the tenant's usage, leases, meta, spend]
-- ARGV: now, sandbox id, usage ttl, [the tenant's name]
-- Answers the USD charged, or '' when the sandbox held nothing.
local now, id, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local holds = paused_holds(KEYS[3])
local T = tenant_of(4, ARGV[4], '', '', '')
if T and not (holds[id] and holds[id].tenant == T.name) then T = nil end
if T then
  t_purge(T, now, ttl)
  local mine = t_paused(T)
  t_settle_paused(T, mine, id, now)
  t_save_paused(T, mine)
  t_no_dust(T)
  t_touch(T, ttl)
end
local charged = settle_paused(KEYS[1], KEYS[3], holds, id, now)
purge_paused(KEYS[1], KEYS[3], holds, now)
save_paused(KEYS[3], holds)
clear_held(KEYS[2], KEYS[3])
redis.call('EXPIRE', KEYS[1], ttl)
if charged == nil then return '' end
return num(charged)
