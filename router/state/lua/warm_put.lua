-- Put a committed lease's sandbox in the entry's warm pool (policies/warm.py `put`).
-- KEYS: usage, leases, lease meta, held per entry, warm records, call memo
-- ARGV: lease id, record (json), paused ('1' / '0'), since, expires, usage ttl,
--       call memo ttl (ms)
-- Reply: '1' put, '0' when the lease was not live. A retry of the call (same memo)
-- gets the first answer: a paused put releases the lease, so run again it would
-- find none.
return once(function()
  local lid = ARGV[1]
  local raw = redis.call('HGET', KEYS[3], lid)
  if not raw then return '0' end
  local m = cjson.decode(raw)
  if m.live ~= 1 then return '0' end
  if ARGV[3] == '1' then
    drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], lid, m, tonumber(ARGV[4]), tonumber(ARGV[6]))
  else
    local expires = tonumber(ARGV[5])
    m.ttl = expires - m.started
    redis.call('HSET', KEYS[3], lid, cjson.encode(m))
    redis.call('ZADD', KEYS[2], expires, lid)
  end
  redis.call('HSET', KEYS[5], lid, ARGV[2])
  return '1'
end)
