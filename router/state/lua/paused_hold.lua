-- Hold a paused sandbox's storage against its pool's usd budget (policies/paused.py
-- `hold`), after purging expired leases and holds.
-- KEYS: usage, leases, lease meta, held per entry
-- ARGV: now, sandbox id, entry, started, expires, rate, limit usd ('' = unlimited),
--       usage ttl
-- Answers '' when held, else the USD spent and held (the denial's `used`).
local now, id = tonumber(ARGV[1]), ARGV[2]
purge(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now)
local holds = paused_holds(KEYS[4])
purge_paused(KEYS[1], KEYS[4], holds, now)
local new = {entry = ARGV[3], started = ARGV[4], expires = ARGV[5], rate = ARGV[6]}
local started = tonumber(ARGV[4])
local freed = 0
if holds[id] then freed = paused_held(holds[id]) - paused_charge(holds[id], started) end
local committed = spent_usd(KEYS[1]) + held_usd(KEYS[4])
local fits = ARGV[7] == '' or committed - freed + paused_held(new) <= tonumber(ARGV[7])
if fits then
  settle_paused(KEYS[1], KEYS[4], holds, id, started)
  holds[id] = new
  redis.call('HSET', KEYS[4], HELD_USD, num(held_usd(KEYS[4]) + paused_held(new)))
end
save_paused(KEYS[4], holds)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[8]))
if fits then return '' end
return num(committed)
