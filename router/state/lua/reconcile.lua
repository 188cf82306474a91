-- Add what a replica spent from this pool while the store was down, once per journal id.
-- KEYS: usage, leases, lease meta, held per entry, [the tenant's usage, leases, meta,
--       spend (tenant_of)], journal memo
-- ARGV: now, sessions, sandbox seconds, usage ttl, held leases (json list of
--       {id, entry, started, ttl, sandbox} and, when priced, the meter's rate, fee,
--       step, first, renew (strings) and kill), journal memo ttl (ms), unanswered
--       reservations (json list of lease ids: the store may hold them, never committed),
--       usd spent, the tenant's name (its spend split from the other tenants' and the
--       tenant-less by the caller, each with its own journal memo)
-- A held lease's cover is held without asking the budget (it runs already).
local memo = KEYS[#KEYS]
if redis.call('EXISTS', memo) == 1 then return 0 end
local now = tonumber(ARGV[1])
local T = tenant_of(5, ARGV[9], '', '', '')
if T then
  local ids = cjson.decode(ARGV[7])
  for _, l in ipairs(cjson.decode(ARGV[5])) do table.insert(ids, l.id) end
  t_purge(T, now, tonumber(ARGV[4]), t_kept(KEYS[3], ids))
end
for _, lid in ipairs(cjson.decode(ARGV[7])) do
  refund(KEYS[1], KEYS[2], KEYS[3], KEYS[4], lid)
  if T then t_refund(T, lid, tonumber(ARGV[4])) end
end
ensure_counts(KEYS[2], KEYS[3], KEYS[4])
redis.call('HINCRBY', KEYS[1], 'sessions', tonumber(ARGV[2]))
redis.call('HINCRBYFLOAT', KEYS[1], 'sandbox_seconds', ARGV[3])
redis.call('HSET', KEYS[1], 'usd', num(spent_usd(KEYS[1]) + tonumber(ARGV[8])))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if T then
  redis.call('HINCRBY', T.usage, 'sessions', tonumber(ARGV[2]))
  redis.call('HSET', T.usage, 'usd', num(t_spent(T) + tonumber(ARGV[8])))
  t_touch(T, tonumber(ARGV[4]))
end
for _, l in ipairs(cjson.decode(ARGV[5])) do
  if redis.call('HEXISTS', KEYS[3], l.id) == 0 then
    local m = {entry = l.entry, started = l.started, ttl = l.ttl, live = 1, counted = 1,
               sandbox = l.sandbox}
    local kept = now + l.ttl
    if l.rate then
      m.rate, m.fee, m.step, m.covered, m.renew = l.rate, l.fee, l.step, l.first, l.renew
      m.kill, m.short = l.kill, 0
      add_held(KEYS[4], hold_of(m))
      kept = cover(KEYS[1], KEYS[4], m, kept, '')
    end
    redis.call('ZADD', KEYS[2], kept, l.id)
    redis.call('HSET', KEYS[3], l.id, cjson.encode(m))
    count_lease(KEYS[4], l.entry, 1)
    if T and redis.call('HEXISTS', T.meta, l.id) == 0 then t_hand_over(T, l.id, m, kept) end
  end
end
redis.call('SET', memo, '1', 'PX', ARGV[6])
return 1
