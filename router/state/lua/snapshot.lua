-- A pool's usage, the leases each entry holds and the entries' health, read
-- after purging expired leases and paused holds: O(1) in the number of live leases.
-- KEYS: usage, leases, lease meta, held per entry, then each entry's health
-- ARGV: now, usage ttl, then each entry's name (in the order of the health keys)
-- Reply: sessions, sandbox seconds, leases held, limits version, usd spent, usd held,
-- then each entry's leases, then its health
local now = tonumber(ARGV[1])
local holds = paused_holds(KEYS[4])
local ended = purge_paused(KEYS[1], KEYS[4], holds, now)
if ended > 0 then save_paused(KEYS[4], holds) end
if purge(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now) + ended > 0 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
end
local reply = {
  redis.call('HGET', KEYS[1], 'sessions'),
  redis.call('HGET', KEYS[1], 'sandbox_seconds'),
  redis.call('ZCARD', KEYS[2]),
  redis.call('HGET', KEYS[1], 'version'),
  redis.call('HGET', KEYS[1], 'usd'),
  redis.call('HGET', KEYS[4], '$usd'),
}
for i = 3, #ARGV do table.insert(reply, redis.call('HGET', KEYS[4], ARGV[i])) end
for i = 5, #KEYS do table.insert(reply, redis.call('GET', KEYS[i])) end
return reply
