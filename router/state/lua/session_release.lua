-- A holder lets go of its session (policies.sessions.let_go): kept unheld until
-- `expires` while it names the holder's sandbox, else deleted (`drop`, another sandbox
-- or none). Answered once per call: a retry after a lost reply must not read "not
-- yours" (its caller would kill what it just kept).
-- KEYS: binding index, bindings, call memo
-- ARGV: session, holder, sandbox id ('' for any), expires, now,
--       paused ('' as it was, '0', '1'), drop ('0'/'1'), memo ms
local function forget()
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
end

return once(function()
  local b = live_binding(ARGV[1], ARGV[5])
  if ARGV[2] == '' or not b or b.holder ~= ARGV[2] then
    return '0'
  end
  if ARGV[3] ~= '' and b.sandbox_id ~= ARGV[3] then
    forget()  -- it names another sandbox, or none: the holder's is nobody's to keep
    return '0'
  end
  if ARGV[7] == '1' or b.sandbox_id == '' then
    forget()
    return '1'
  end
  b.holder = ''
  if ARGV[6] == '1' then b.paused = true elseif ARGV[6] == '0' then b.paused = false end
  put_binding(ARGV[1], b, ARGV[4])
  return '1'
end)
