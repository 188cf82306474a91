-- Warm pools: the rules of policies/warm.py, kept line for line in step with
-- them (tests/state/test_lua_matches_policies.py checks the two agree). An
-- entry's records are one hash, lease id -> the record's JSON as the router
-- wrote it (never re-encoded here: cjson would round its times).

-- The entry's records still kept (those past `expires` are dropped), first made first.
local function warm_records(warm_key, now)
  local flat = redis.call('HGETALL', warm_key)
  local records = {}
  for i = 1, #flat, 2 do
    local r = cjson.decode(flat[i + 1])
    if r.expires <= now then
      redis.call('HDEL', warm_key, flat[i])
    else
      r.lease = flat[i]
      table.insert(records, r)
    end
  end
  table.sort(records, function(a, b)
    if a.since ~= b.since then return a.since < b.since end
    return a.lease < b.lease
  end)
  return records
end

-- The reservation a claim makes, priced by the acquire's meter (`meter`: reserve's
-- ARGV from the rate on, or nil): its rate for its first cover, no fee.
local function claimed_meta(entry, now, hold, meter)
  local m = {entry = entry, started = now, ttl = hold, live = 0, counted = 0, sandbox = ''}
  if meter and meter[1] ~= '' and tonumber(meter[1]) > 0 then
    m.rate, m.fee, m.step = meter[1], '0', meter[3]
    m.covered, m.renew, m.kill, m.short = meter[4], meter[5], tonumber(meter[6]), 0
  end
  return m
end

-- Whether the budget (`limit`, '' = none) holds m's cover once `freed` USD of holds
-- is let go, and `also` ({spent and held, limit}: its tenant's, or nil) holds it
-- (policies/warm.py `_fits`).
local function claim_fits(usage_key, held_key, m, freed, limit, also)
  if not m.rate then return true end
  if also and also[1] + hold_of(m) > also[2] then return false end
  if limit == '' then return true end
  return spent_usd(usage_key) + held_usd(held_key) - freed + hold_of(m) <= tonumber(limit)
end

-- Hand the first claimable warm sandbox to a reservation held for `hold` seconds
-- (KEYS as reserve's), priced by `meter`, its cover fitting the tenant's budget `also`
-- too (t_budget, or nil), or nil. Expired leases are already purged.
local function warm_claim(usage_key, leases_key, meta_key, held_key, warm_key, entry, now, hold,
                          limit_seconds, limit_concurrent, usage_ttl, limit_usd, meter, also)
  local seconds = tonumber(redis.call('HGET', usage_key, 'sandbox_seconds') or '0')
  if limit_seconds ~= '' and seconds >= tonumber(limit_seconds) then return nil end
  for _, r in ipairs(warm_records(warm_key, now)) do
    if r.deadline > now then
      local c = claimed_meta(entry, now, hold, meter)
      if r.paused then
        local full = limit_concurrent ~= ''
          and redis.call('ZCARD', leases_key) >= tonumber(limit_concurrent)
        if not full then
          if not claim_fits(usage_key, held_key, c, 0, limit_usd, also) then return nil end
          redis.call('HDEL', warm_key, r.lease)
          redis.call('ZADD', leases_key, now + hold, r.lease)
          redis.call('HSET', meta_key, r.lease, cjson.encode(c))
          count_lease(held_key, entry, 1)
          if c.rate then add_held(held_key, hold_of(c)) end
          return {lease_id = r.lease, sandbox_id = r.sandbox_id, paused = true,
                  idle = now - r.since, metered = 0}
        end
      else
        local raw = redis.call('HGET', meta_key, r.lease)
        local m = raw and cjson.decode(raw)
        if not (m and m.live == 1) then
          redis.call('HDEL', warm_key, r.lease)
        else
          local idle = math.max(0, now - m.started)
          local freed = 0
          if m.rate then
            local fee = tonumber(m.fee)
            if m.counted == 0 then fee = 0 end
            freed = hold_of(m) - (tonumber(m.rate) * metered(idle, tonumber(m.step)) + fee)
          end
          if not claim_fits(usage_key, held_key, c, freed, limit_usd, also) then return nil end
          redis.call('HDEL', warm_key, r.lease)
          redis.call('HINCRBYFLOAT', usage_key, 'sandbox_seconds', idle)
          redis.call('EXPIRE', usage_key, usage_ttl)
          settle_usd(usage_key, held_key, m, idle)
          redis.call('HSET', meta_key, r.lease, cjson.encode(c))
          redis.call('ZADD', leases_key, now + hold, r.lease)
          if c.rate then add_held(held_key, hold_of(c)) end
          return {lease_id = r.lease, sandbox_id = r.sandbox_id, paused = false,
                  idle = now - r.since, metered = idle}
        end
      end
    end
  end
  return nil
end
