-- Re-bind a session to its sandbox only while the binding still names that sandbox.
-- Two leases may hold one session (concurrent acquires each bound it): the one it
-- names now keeps it; the other's release must kill its sandbox, not take it back.
-- KEYS: binding index (zset name -> expiry), bindings (hash name -> json)
-- ARGV: session, sandbox id, the new binding (json), expires, now
local raw = redis.call('HGET', KEYS[2], ARGV[1])
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not raw or not expires or tonumber(expires) <= tonumber(ARGV[5]) then
  return 0
end
if cjson.decode(raw)['sandbox_id'] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
return 1
