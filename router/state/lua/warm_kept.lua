-- The lease ids the janitor keeps, in one read: the pool's unexpired leases and
-- the entry's warm records (a paused warm sandbox holds no lease).
-- KEYS: leases, warm records ; ARGV: now
local now = tonumber(ARGV[1])
local kept = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')
for _, r in ipairs(warm_records(KEYS[2], now)) do table.insert(kept, r.lease) end
return kept
