-- Add what a replica spent from this pool while the store was down, once per journal id.
-- KEYS: usage, leases, lease meta, held per entry, journal memo
-- ARGV: now, sessions, sandbox seconds, usage ttl, held leases (json list of
--       {id, entry, started, ttl, sandbox} and, when priced, the meter's rate, fee,
--       step, first, renew (strings) and kill), journal memo ttl (ms), unanswered
--       reservations (json list of lease ids: the store may hold them, never committed),
--       usd spent
-- A held lease's cover is held without asking the budget (it runs already).
if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
local now = tonumber(ARGV[1])
for _, lid in ipairs(cjson.decode(ARGV[7])) do
  refund(KEYS[1], KEYS[2], KEYS[3], KEYS[4], lid)
end
ensure_counts(KEYS[2], KEYS[3], KEYS[4])
redis.call('HINCRBY', KEYS[1], 'sessions', tonumber(ARGV[2]))
redis.call('HINCRBYFLOAT', KEYS[1], 'sandbox_seconds', ARGV[3])
redis.call('HSET', KEYS[1], 'usd', num(spent_usd(KEYS[1]) + tonumber(ARGV[8])))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
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
  end
end
redis.call('SET', KEYS[5], '1', 'PX', ARGV[6])
return 1
