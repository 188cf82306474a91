-- Take a warm sandbox out of the pool to kill it (policies/warm.py `take`): its
-- lease (running) is released and its seconds metered.
-- KEYS: usage, leases, lease meta, held per entry, warm records, call memo
-- ARGV: now, lease id, usage ttl, call memo ttl (ms)
-- Reply: the seconds metered, as a string, or '' when it was not there. A retry
-- of the call (same memo) gets the first answer: a take it lost the reply of is
-- still its own, and its sandbox is still its to kill.
return once(function()
  local now, lid = tonumber(ARGV[1]), ARGV[2]
  local raw = redis.call('HGET', KEYS[5], lid)
  if not raw then return '' end
  redis.call('HDEL', KEYS[5], lid)
  local r = cjson.decode(raw)
  if r.expires <= now then return '' end
  if r.paused then return '0' end
  raw = redis.call('HGET', KEYS[3], lid)
  if not raw then return '0' end
  local m = cjson.decode(raw)
  return tostring(drop_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], lid, m, now, tonumber(ARGV[3])))
end)
