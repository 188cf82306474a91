-- Release a lock only if this holder still owns it. KEYS: lock ; ARGV: token
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
