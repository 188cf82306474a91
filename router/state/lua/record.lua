-- Record a health outcome on an entry outside an acquire.
-- KEYS: health, call memo
-- ARGV: outcome, now, fingerprint, detail, until (0 = none), breaker config, call memo ttl (ms)
return once(function()
  local s = load_health(KEYS[1])
  local t = record(s, cjson.decode(ARGV[6]), ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]))
  save_health(KEYS[1], s)
  if t then return cjson.encode({from = t[1], to = t[2]}) end
  return cjson.encode({from = '', to = ''})
end)
