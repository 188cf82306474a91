-- Forget session bindings whose idle TTL has passed.
-- KEYS: binding index (zset name -> expiry), bindings (hash name -> json) ; ARGV: now
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1000)
for _, name in ipairs(expired) do
  redis.call('HDEL', KEYS[2], name)
  redis.call('ZREM', KEYS[1], name)
end
return #expired
