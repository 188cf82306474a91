-- Add what a replica spent from this pool while the store was down, once per journal id.
-- KEYS: usage, leases, lease meta, held per entry, journal memo
-- ARGV: now, sessions, sandbox seconds, usage ttl, held leases (json list of
--       {id, entry, started, ttl, sandbox}), journal memo ttl (ms)
if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
local now = tonumber(ARGV[1])
ensure_counts(KEYS[2], KEYS[3], KEYS[4])
redis.call('HINCRBY', KEYS[1], 'sessions', tonumber(ARGV[2]))
redis.call('HINCRBYFLOAT', KEYS[1], 'sandbox_seconds', ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
for _, l in ipairs(cjson.decode(ARGV[5])) do
  if redis.call('HEXISTS', KEYS[3], l.id) == 0 then
    redis.call('ZADD', KEYS[2], now + l.ttl, l.id)
    redis.call('HSET', KEYS[3], l.id, cjson.encode({entry = l.entry, started = l.started,
                                                   ttl = l.ttl, live = 1, counted = 1,
                                                   sandbox = l.sandbox}))
    count_lease(KEYS[4], l.entry, 1)
  end
end
redis.call('SET', KEYS[5], '1', 'PX', ARGV[6])
return 1
