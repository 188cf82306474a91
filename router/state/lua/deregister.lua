-- A replica leaves the fleet (policies/fleet.py `deregister`, the same rules).
-- KEYS: members ; ARGV: replica, now
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local j, l, e, t = string.match(v, '^(%S+) (%S+) (%S+) (%S+)')
local now = tonumber(ARGV[2])
if tonumber(e) < now then now = tonumber(e) end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%s %s %.17g %s 1', j, l, now, t))
return 1
