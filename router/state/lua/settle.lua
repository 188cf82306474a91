-- Commit a reservation (outcome 'success': the lease goes live for ttl) or
-- refund it, and record the outcome on the entry's breaker.
-- KEYS: usage, leases, lease meta, health, held per entry, [the tenant's usage, leases,
--       meta, spend (tenant_of)], call memo
-- ARGV: now, lease_id, outcome, ttl, detail, until (0 = none), fingerprint, breaker config,
--       sandbox id (on success), limit usd ('' = unlimited), the tenant's name and usd
--       limit, usage ttl, call memo ttl (ms)
-- Answers '<applied 1/0>|<from>|<to>|<cover end>|<short>': from and to when the circuit
-- moved, the cover's end and which budget ('pool' or 'tenant') when a usd budget could
-- not cover the committed lease's ttl.
return once(function()
  local now, lid, outcome, ttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
  local applied = false
  local short, short_of = '', ''
  local T = tenant_of(6, ARGV[11], '', '', ARGV[12])
  if T then t_purge(T, now, tonumber(ARGV[13]), t_kept(KEYS[3], {lid})) end
  if outcome ~= 'success' then
    applied = refund(KEYS[1], KEYS[2], KEYS[3], KEYS[5], lid)
    if T then t_refund(T, lid, tonumber(ARGV[13])) end
  else
    local raw = redis.call('HGET', KEYS[3], lid)
    if raw then
      local m = cjson.decode(raw)
      m.live, m.started, m.ttl, m.sandbox = 1, now, ttl, ARGV[9]
      local kept, fits, budget = cover(KEYS[1], KEYS[5], m, now + ttl, ARGV[10],
                                       T and t_budget(T))
      if not fits then short, short_of = num(cover_end(m)), budget end
      redis.call('HSET', KEYS[3], lid, cjson.encode(m))
      redis.call('ZADD', KEYS[2], kept, lid)
      if T then t_mirror(T, lid, m, kept) end
      applied = true
    end
  end
  local s = load_health(KEYS[4])
  local t = record(s, cjson.decode(ARGV[8]), outcome, now, ARGV[7], ARGV[5], tonumber(ARGV[6]))
  save_health(KEYS[4], s)
  local answer = applied and '1' or '0'
  if t then return answer .. '|' .. t[1] .. '|' .. t[2] .. '|' .. short .. '|' .. short_of end
  return answer .. '|||' .. short .. '|' .. short_of
end)
