-- Free a lease's slot, meter its seconds, and lift a capacity block.
-- KEYS: usage, leases, lease meta, health, held per entry, [the tenant's usage, leases,
--       meta, spend (tenant_of)], call memo
-- ARGV: now, lease_id, usage ttl, the tenant's name, call memo ttl (ms)
-- Answers the seconds metered, or '' when the lease was not held.
return once(function()
  local now, lid = tonumber(ARGV[1]), ARGV[2]
  local T = tenant_of(6, ARGV[4], '', '', '')
  if T then
    t_purge(T, now, tonumber(ARGV[3]), t_kept(KEYS[3], {lid}))
    t_release(T, lid, now, tonumber(ARGV[3]))
  end
  local raw = redis.call('HGET', KEYS[3], lid)
  if not raw then return '' end
  local m = cjson.decode(raw)
  local seconds = drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[5], lid, m, now, tonumber(ARGV[3]))
  local s = load_health(KEYS[4])
  if s.block == 'capacity' then
    clear_block(s)
    save_health(KEYS[4], s)
  end
  return tostring(seconds)
end)
