-- Shared by the session scripts: the binding of a session, as policies/sessions.py
-- reads and writes it (tests/state/test_lua_matches_policies.py checks the two agree).
-- KEYS[1]: the binding index (zset: session -> expiry); KEYS[2]: the bindings (hash:
-- session -> json {entry, sandbox_id, paused?, holder?}).

-- The session's live binding, its holder '' when none and its expiry a field, or nil.
local function live_binding(session, now)
  local raw = redis.call('HGET', KEYS[2], session)
  local expires = redis.call('ZSCORE', KEYS[1], session)
  if not raw or not expires or tonumber(expires) <= tonumber(now) then return nil end
  local b = cjson.decode(raw)
  b.holder = b.holder or ''
  b.sandbox_id = b.sandbox_id or ''
  b.expires = expires
  return b
end

-- Write a binding until `expires`; an unheld one keeps the shape it had before holders.
local function put_binding(session, b, expires)
  local stored = {entry = b.entry, sandbox_id = b.sandbox_id}
  if b.paused then stored.paused = true end
  if b.holder ~= '' then stored.holder = b.holder end
  redis.call('HSET', KEYS[2], session, cjson.encode(stored))
  redis.call('ZADD', KEYS[1], expires, session)
end
