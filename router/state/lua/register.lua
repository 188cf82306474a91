-- Register a replica in the fleet (policies/fleet.py `register`, the same rules).
-- KEYS: members (hash: replica -> "joined last expires ttl left"), sequence
-- ARGV: replica, now, ttl, keys' ttl (ms)
-- Returns {replicas, seq, joined, oldest}.
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local seq = redis.call('INCR', KEYS[2])
local count, oldest, joined = 1, seq, seq
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local j, l, e, t, left = string.match(flat[i + 1], '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  j, l, e, t = tonumber(j), tonumber(l), tonumber(e), tonumber(t)
  if now >= e + t then
    redis.call('HDEL', KEYS[1], flat[i])
  elseif flat[i] == ARGV[1] then
    if left == '0' then joined = j end
  else
    count = count + 1
    if left == '0' and l < oldest then oldest = l end
  end
end
redis.call('HSET', KEYS[1], ARGV[1],
           string.format('%d %d %.17g %.17g 0', joined, seq, now + ttl, ttl))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {count, seq, joined, oldest}
