-- Extend a live lease. KEYS: leases, lease meta ; ARGV: now, lease_id, ttl
local now, lid, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local expires = redis.call('ZSCORE', KEYS[1], lid)
if not expires or tonumber(expires) <= now then return 0 end
redis.call('ZADD', KEYS[1], now + ttl, lid)
local m = cjson.decode(redis.call('HGET', KEYS[2], lid))
m.ttl = ttl
redis.call('HSET', KEYS[2], lid, cjson.encode(m))
return 1
