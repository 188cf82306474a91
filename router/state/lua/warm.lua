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

-- Hand the first claimable warm sandbox to a reservation held for `hold` seconds
-- (KEYS as reserve's), or nil. Expired leases are already purged.
local function warm_claim(usage_key, leases_key, meta_key, held_key, warm_key, entry, now, hold,
                          limit_seconds, limit_concurrent, usage_ttl)
  local seconds = tonumber(redis.call('HGET', usage_key, 'sandbox_seconds') or '0')
  if limit_seconds ~= '' and seconds >= tonumber(limit_seconds) then return nil end
  for _, r in ipairs(warm_records(warm_key, now)) do
    if r.deadline > now then
      if r.paused then
        local full = limit_concurrent ~= ''
          and redis.call('ZCARD', leases_key) >= tonumber(limit_concurrent)
        if not full then
          redis.call('HDEL', warm_key, r.lease)
          redis.call('ZADD', leases_key, now + hold, r.lease)
          redis.call('HSET', meta_key, r.lease, cjson.encode({entry = entry, started = now,
            ttl = hold, live = 0, counted = 0, sandbox = ''}))
          count_lease(held_key, entry, 1)
          return {lease_id = r.lease, sandbox_id = r.sandbox_id, paused = true,
                  idle = now - r.since, metered = 0}
        end
      else
        redis.call('HDEL', warm_key, r.lease)
        local raw = redis.call('HGET', meta_key, r.lease)
        if raw then
          local m = cjson.decode(raw)
          if m.live == 1 then
            local metered = math.max(0, now - m.started)
            redis.call('HINCRBYFLOAT', usage_key, 'sandbox_seconds', metered)
            redis.call('EXPIRE', usage_key, usage_ttl)
            m.live, m.counted, m.sandbox, m.started, m.ttl = 0, 0, '', now, hold
            redis.call('HSET', meta_key, r.lease, cjson.encode(m))
            redis.call('ZADD', leases_key, now + hold, r.lease)
            return {lease_id = r.lease, sandbox_id = r.sandbox_id, paused = false,
                    idle = now - r.since, metered = metered}
          end
        end
      end
    end
  end
  return nil
end
