-- Hold a paused sandbox's storage against its pool's usd budget, and its tenant's when a
-- tenant's lease paused it (policies/paused.py `hold`), after purging expired leases and
-- holds.
-- KEYS: usage, leases, lease meta, held per entry, [the tenant's usage, leases, meta,
--       spend (tenant_of)]
-- ARGV: now, sandbox id, entry, started, expires, rate, limit usd ('' = unlimited),
--       usage ttl, [the tenant's name, its usd limit ('' = unlimited)]
-- Answers {} when held, else {budget ('pool' or 'tenant'), the USD it has spent and held}.
local now, id, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[8])
local T = tenant_of(5, ARGV[9], '', '', ARGV[10])
purge(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now)
local holds = paused_holds(KEYS[4])
purge_paused(KEYS[1], KEYS[4], holds, now)
if T then t_purge(T, now, ttl) end
local new = {entry = ARGV[3], started = ARGV[4], expires = ARGV[5], rate = ARGV[6]}
if T then new.tenant = T.name end
local started = tonumber(ARGV[4])

-- What the sandbox's old hold frees, settled at `started` (it is paused again).
local function freed(old)
  if not old then return 0 end
  return paused_held(old) - paused_charge(old, started)
end

local denial = nil
local committed = spent_usd(KEYS[1]) + held_usd(KEYS[4])
if ARGV[7] ~= '' and committed - freed(holds[id]) + paused_held(new) > tonumber(ARGV[7]) then
  denial = {'pool', num(committed)}
end
local mine = {}
if T then mine = t_paused(T) end
if not denial and T and T.usd ~= '' then
  local spent = t_spent(T) + t_held(T)
  if spent - freed(mine[id]) + paused_held(new) > tonumber(T.usd) then
    denial = {'tenant', num(spent)}
  end
end
if not denial then
  if T then t_settle_paused(T, mine, id, started) end
  settle_paused(KEYS[1], KEYS[4], holds, id, started)
  holds[id] = new
  redis.call('HSET', KEYS[4], HELD_USD, num(held_usd(KEYS[4]) + paused_held(new)))
  if T then
    mine[id] = new
    t_set_held(T, t_held(T) + paused_held(new))
    t_save_paused(T, mine)
    t_touch(T, ttl)
  end
end
save_paused(KEYS[4], holds)
redis.call('EXPIRE', KEYS[1], ttl)
return denial or {}
