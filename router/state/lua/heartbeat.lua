-- Extend a live lease, and a priced one's cover (policies/quota.py `heartbeat`).
-- KEYS: usage, leases, lease meta, held per entry, [the tenant's usage, leases, meta,
-- spend (tenant_of)] ; ARGV: now, lease_id, ttl, limit usd ('' = unlimited), [the
-- tenant's name, usd limit, usage ttl]. Answers '0' (expired), '1' (alive), or
-- '1|<cover end>|<pool or tenant>' when that budget could not renew its cover.
local now, lid, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local T = tenant_of(5, ARGV[5], '', '', ARGV[6])
if T then t_purge(T, now, tonumber(ARGV[7]), t_kept(KEYS[3], {lid})) end
local expires = redis.call('ZSCORE', KEYS[2], lid)
if not expires or tonumber(expires) <= now then return '0' end
local m = cjson.decode(redis.call('HGET', KEYS[3], lid))
m.ttl = ttl
local kept, fits, short = cover(KEYS[1], KEYS[4], m, now + ttl, ARGV[4], T and t_budget(T))
redis.call('ZADD', KEYS[2], kept, lid)
redis.call('HSET', KEYS[3], lid, cjson.encode(m))
if T then t_mirror(T, lid, m, kept) end
if fits then return '1' end
return '1|' .. num(cover_end(m)) .. '|' .. short
