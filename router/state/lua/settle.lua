-- Commit a reservation (outcome 'success': the lease goes live for ttl) or
-- refund it, and record the outcome on the entry's breaker.
-- KEYS: usage, leases, lease meta, health, held per entry, call memo
-- ARGV: now, lease_id, outcome, ttl, detail, until (0 = none), fingerprint, breaker config,
--       sandbox id (on success), call memo ttl (ms)
-- Answers '1' (applied) or '0', then '|<from>|<to>' when the circuit moved.
return once(function()
  local now, lid, outcome, ttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
  local applied = false
  local raw = redis.call('HGET', KEYS[3], lid)
  if raw then
    local m = cjson.decode(raw)
    if outcome == 'success' then
      m.live, m.started, m.ttl, m.sandbox = 1, now, ttl, ARGV[9]
      redis.call('HSET', KEYS[3], lid, cjson.encode(m))
      redis.call('ZADD', KEYS[2], now + ttl, lid)
      applied = true
    elseif m.live == 0 then
      ensure_counts(KEYS[2], KEYS[3], KEYS[5])
      redis.call('HDEL', KEYS[3], lid)
      redis.call('ZREM', KEYS[2], lid)
      count_lease(KEYS[5], m.entry, -1)
      if m.counted ~= 0 and redis.call('HINCRBY', KEYS[1], 'sessions', -1) < 0 then
        redis.call('HSET', KEYS[1], 'sessions', 0)
      end
      applied = true
    end
  end
  local s = load_health(KEYS[4])
  local t = record(s, cjson.decode(ARGV[8]), outcome, now, ARGV[7], ARGV[5], tonumber(ARGV[6]))
  save_health(KEYS[4], s)
  local answer = applied and '1' or '0'
  if t then return answer .. '|' .. t[1] .. '|' .. t[2] end
  return answer
end)
