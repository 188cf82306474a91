-- Drop a paused sandbox's storage hold, charging the storage it used until now
-- (policies/paused.py `settle`), then charge the pool's expired holds whole.
-- KEYS: usage, leases, held per entry
-- ARGV: now, sandbox id, usage ttl
-- Answers the USD charged, or '' when the sandbox held nothing.
local now = tonumber(ARGV[1])
local holds = paused_holds(KEYS[3])
local charged = settle_paused(KEYS[1], KEYS[3], holds, ARGV[2], now)
purge_paused(KEYS[1], KEYS[3], holds, now)
save_paused(KEYS[3], holds)
clear_held(KEYS[2], KEYS[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
if charged == nil then return '' end
return num(charged)
