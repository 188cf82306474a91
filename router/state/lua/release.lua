-- Free a lease's slot, meter its seconds, and lift a capacity block.
-- KEYS: usage, leases, lease meta, health, held per entry, call memo
-- ARGV: now, lease_id, usage ttl, call memo ttl (ms)
-- Answers the seconds metered, or '' when the lease was not held.
return once(function()
  local now, lid = tonumber(ARGV[1]), ARGV[2]
  local raw = redis.call('HGET', KEYS[3], lid)
  if not raw then return '' end
  local m = cjson.decode(raw)
  local expires = tonumber(redis.call('ZSCORE', KEYS[2], lid) or now)
  local seconds = 0
  if m.live == 1 then seconds = math.max(0, math.min(now, expires) - m.started) end
  redis.call('HINCRBYFLOAT', KEYS[1], 'sandbox_seconds', seconds)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  ensure_counts(KEYS[2], KEYS[3], KEYS[5])
  redis.call('HDEL', KEYS[3], lid)
  redis.call('ZREM', KEYS[2], lid)
  count_lease(KEYS[5], m.entry, -1)
  local s = load_health(KEYS[4])
  if s.block == 'capacity' then
    clear_block(s)
    save_health(KEYS[4], s)
  end
  return tostring(seconds)
end)
