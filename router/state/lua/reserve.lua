-- Admit through the entry's breaker, then reserve one session and one slot, and hold
-- a priced lease's first cover against the usd budget.
-- With warm '1', first claim a ready warm sandbox of the entry (warm.lua).
-- KEYS: usage, leases, lease meta, health, held per entry, warm records, [the tenant's
--       usage, leases, meta, spend (tenant_of)], call memo
-- ARGV: now, lease_id, entry, hold, limit sessions, limit seconds,
--       limit concurrent, limit usd ('' = unlimited), fingerprint, breaker config,
--       usage ttl, new session ('1'; '0' reconnects to a session's sandbox: a slot, no
--       session), warm ('1' claims a warm sandbox when one is ready), the meter: rate
--       ('' = unpriced), fee, step, first cover, renewal, kill ('1' / '0'), the tenant's
--       name and limits sessions, concurrent, usd, then the call memo ttl (ms)
-- The tenant is asked after the pool, before either is spent: all or nothing.
-- Answers: a grant without a claim is '+<probe 1/0>|<from>|<to>' (the hot path: no JSON
-- for the router to parse); a claim and a denial are JSON objects.
return once(function()
  local now, lid, entry, hold = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
  -- A lease id already held was granted before (a repeat the call memo forgot).
  if redis.call('HEXISTS', KEYS[3], lid) == 1 then
    return '+0||'
  end
  local T = tenant_of(7, ARGV[20], ARGV[21], ARGV[22], ARGV[23])
  if T then t_purge(T, now, tonumber(ARGV[11])) end
  local cfg = cjson.decode(ARGV[10])
  local s = load_health(KEYS[4])
  local a = admit(s, cfg, now, ARGV[9])
  if not a.allowed then
    if a.changed then save_health(KEYS[4], s) end
    return cjson.encode({granted = false, reason = a.reason, until_ = a.until_, detail = s.block_detail})
  end
  purge(KEYS[1], KEYS[2], KEYS[3], KEYS[5], now)
  -- A tenant's warm claim needs room for one more lease (tables.py `_room`), and its
  -- cover must fit the tenant's usd budget (warm_claim's `also`).
  local room = not T or T.concurrent == '' or
    redis.call('ZCARD', T.leases) < tonumber(T.concurrent)
  if ARGV[13] == '1' and not a.probe and room then
    local c = warm_claim(KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6], entry, now, hold,
                         ARGV[6], ARGV[7], tonumber(ARGV[11]), ARGV[8],
                         {ARGV[14], ARGV[15], ARGV[16], ARGV[17], ARGV[18], ARGV[19]},
                         t_budget(T))
    if c then
      if a.changed then save_health(KEYS[4], s) end
      if T then
        t_add(T, c.lease_id, cjson.decode(redis.call('HGET', KEYS[3], c.lease_id)),
              tonumber(redis.call('ZSCORE', KEYS[2], c.lease_id)), tonumber(ARGV[11]))
      end
      return cjson.encode({granted = true, probe = false, from = a.from or '', to = a.to or '',
                           claimed = c})
    end
  end
  local used = {
    tonumber(redis.call('HGET', KEYS[1], 'sessions') or '0'),
    tonumber(redis.call('HGET', KEYS[1], 'sandbox_seconds') or '0'),
    redis.call('ZCARD', KEYS[2]),
  }
  local units = {'sessions', 'sandbox_seconds', 'concurrent'}
  local counted = ARGV[12] == '1'
  local first = 1
  if not counted then first = 2 end
  local function deny(unit, amount, limit, reason)
    if a.probe then s.probe_until = 0 end
    if a.changed then save_health(KEYS[4], s) end
    return cjson.encode({granted = false, reason = reason or 'quota', unit = unit,
                         used = num(amount), limit = tonumber(limit),
                         version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')})
  end
  for i = first, 3 do
    local limit = ARGV[4 + i]
    if limit ~= '' and used[i] >= tonumber(limit) then
      return deny(units[i], used[i], limit)
    end
  end
  local m = {entry = entry, started = now, ttl = hold, live = 0, counted = counted and 1 or 0,
             sandbox = ''}
  local fee = counted and tonumber(ARGV[15]) or 0
  if ARGV[14] ~= '' and (tonumber(ARGV[14]) > 0 or fee > 0) then
    m.rate, m.fee, m.step = ARGV[14], counted and ARGV[15] or '0', ARGV[16]
    m.covered, m.renew, m.kill, m.short = ARGV[17], ARGV[18], tonumber(ARGV[19]), 0
    local held = spent_usd(KEYS[1]) + held_usd(KEYS[5])
    if ARGV[8] ~= '' and held + hold_of(m) > tonumber(ARGV[8]) then
      return deny('usd', held, ARGV[8])
    end
  end
  if T then
    local unit, amount, limit = t_check(T, m)
    if unit then return deny(unit, amount, limit, 'tenant') end
  end
  if m.rate then add_held(KEYS[5], hold_of(m)) end
  if counted then
    redis.call('HINCRBY', KEYS[1], 'sessions', 1)
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[11]))
  end
  redis.call('ZADD', KEYS[2], now + hold, lid)
  redis.call('HSET', KEYS[3], lid, cjson.encode(m))
  count_lease(KEYS[5], entry, 1)
  if T then t_add(T, lid, m, now + hold, tonumber(ARGV[11])) end
  if a.changed then save_health(KEYS[4], s) end
  return '+' .. (a.probe and '1' or '0') .. '|' .. (a.from or '') .. '|' .. (a.to or '')
end)
