-- Shared by every script: the entry-health rules of policies/breaker.py and
-- the lease ledger of policies/quota.py, kept line for line in step with
-- them (tests/state/test_lua_matches_policies.py checks the two agree).
-- `until` is a Lua keyword, hence `until_` in tables and JSON.

-- A call retried after its reply was lost (a timeout, a dropped connection)
-- gets the first answer again instead of applying twice. The caller's last
-- key holds this call's answer, kept for the milliseconds of its last ARGV.
local function once(body)
  local memo = KEYS[#KEYS]
  local seen = redis.call('GET', memo)
  if seen then return seen end
  local reply = body()
  redis.call('SET', memo, reply, 'PX', ARGV[#ARGV])
  return reply
end

local function load_health(key)
  local raw = redis.call('GET', key)
  local s = {}
  if raw then s = cjson.decode(raw) end
  s.circuit = s.circuit or 'closed'
  s.failures = s.failures or 0
  s.openings = s.openings or 0
  s.open_until = s.open_until or 0
  s.probe_until = s.probe_until or 0
  if type(s.window) ~= 'table' then s.window = {} end
  s.block = s.block or ''
  s.block_until = s.block_until or 0
  s.block_detail = s.block_detail or ''
  s.fingerprint = s.fingerprint or ''
  return s
end

local function save_health(key, s)
  redis.call('SET', key, cjson.encode(s))
end

local function clear_block(s)
  s.block = ''
  s.block_until = 0
  s.block_detail = ''
  s.fingerprint = ''
end

-- `changed` tells the caller whether `s` needs saving.
local function admit(s, cfg, now, fingerprint)
  local changed = false
  if s.block ~= '' then
    if s.block == 'misconfigured' then
      if s.fingerprint == fingerprint then
        return {allowed = false, reason = 'misconfigured', until_ = 0}
      end
      clear_block(s)
    elseif now < s.block_until then
      return {allowed = false, reason = s.block, until_ = s.block_until}
    else
      clear_block(s)
    end
    changed = true
  end
  if s.circuit == 'open' then
    if now < s.open_until then
      return {allowed = false, reason = 'open', until_ = s.open_until, changed = changed}
    end
    s.circuit = 'half_open'
    s.probe_until = now + cfg.probe_timeout
    return {allowed = true, probe = true, from = 'open', to = 'half_open', changed = true}
  end
  if s.circuit == 'half_open' then
    if now < s.probe_until then
      return {allowed = false, reason = 'half_open', until_ = s.probe_until, changed = changed}
    end
    s.probe_until = now + cfg.probe_timeout
    return {allowed = true, probe = true, changed = true}
  end
  return {allowed = true, probe = false, changed = changed}
end

-- The window's buckets (see WINDOW_BUCKETS in policies/breaker.py).
local BUCKETS = 10

local function count(s, cfg, now, failed)
  local current = math.floor(now / (cfg.window_seconds / BUCKETS))
  local kept = {}
  for _, b in ipairs(s.window) do
    if b[1] > current - BUCKETS then table.insert(kept, b) end
  end
  s.window = kept
  for _, b in ipairs(kept) do
    if b[1] == current then
      b[2] = b[2] + 1
      b[3] = b[3] + failed
      return
    end
  end
  table.insert(kept, {current, 1, failed})
end

local function tripped(s, cfg)
  if s.failures >= cfg.failure_threshold then return true end
  local calls, failed = 0, 0
  for _, b in ipairs(s.window) do
    calls = calls + b[2]
    failed = failed + b[3]
  end
  return calls >= cfg.min_calls and failed / calls >= cfg.failure_rate
end

local function open_circuit(s, cfg, now)
  s.openings = s.openings + 1
  local cooldown = math.min(cfg.cooldown_base * s.openings, cfg.cooldown_max)
  s.circuit = 'open'
  s.open_until = math.max(s.open_until, now + cooldown)
  s.probe_until = 0
  s.failures = 0
  s.window = {}
end

local function block(s, reason, until_, detail)
  if s.block == 'misconfigured' then return end
  if s.block == reason then
    until_ = math.max(until_, s.block_until)
  elseif s.block ~= '' and s.block_until > until_ then
    return
  end
  s.block = reason
  s.block_until = until_
  s.block_detail = detail
end

local function record(s, cfg, outcome, now, fingerprint, detail, until_)
  local before = s.circuit
  if outcome == 'success' then
    count(s, cfg, now, 0)
    s.failures = 0
    if s.circuit == 'half_open' then
      s.circuit = 'closed'
      s.openings = 0
      s.probe_until = 0
    end
  elseif outcome == 'transient' then
    count(s, cfg, now, 1)
    s.failures = s.failures + 1
    if s.circuit == 'half_open' then
      open_circuit(s, cfg, now)
    elseif s.circuit == 'closed' and tripped(s, cfg) then
      open_circuit(s, cfg, now)
    end
  else
    if s.circuit == 'half_open' then s.probe_until = 0 end
    if outcome == 'auth' then
      s.block = 'misconfigured'
      s.block_until = 0
      s.block_detail = detail
      s.fingerprint = fingerprint
    elseif outcome == 'quota' then
      block(s, 'exhausted', until_ > 0 and until_ or now + cfg.quota_default, detail)
    elseif outcome == 'rate_limited' then
      block(s, 'rate_limited', until_ > 0 and until_ or now + cfg.rate_limit_default, detail)
    elseif outcome == 'capacity' then
      block(s, 'capacity', now + cfg.capacity_cooldown, detail)
    end
  end
  if s.circuit ~= before then return {before, s.circuit} end
  return false
end

-- The count of leases each entry holds in the pool (the `held` hash), kept by
-- every script that adds or drops a lease, so a snapshot (what the balanced
-- strategy reads on every acquire) never reads the lease set itself.
-- An entry's count stays at zero rather than going, so the hash outlives its
-- last lease and `ensure_counts` costs one EXISTS.
local function count_lease(held_key, entry, n)
  redis.call('HINCRBY', held_key, entry, n)
end

-- A pool whose leases an older router wrote has no counts yet: count them once.
local function ensure_counts(leases_key, meta_key, held_key)
  if redis.call('EXISTS', held_key) == 1 or redis.call('ZCARD', leases_key) == 0 then return end
  for _, raw in ipairs(redis.call('HVALS', meta_key)) do
    redis.call('HINCRBY', held_key, cjson.decode(raw).entry, 1)
  end
end

-- Dollars (policies/quota.py's usd unit). A priced lease's meta carries its meter as
-- strings (rate, fee, step, renew, covered: exact, where cjson would keep 14 digits),
-- kill and short as 0/1; an unpriced one has no rate. The pool's holds are the `$usd`
-- field of the held hash (no entry name starts with `$`), the window's spend the usage
-- hash's `usd`; both written as %.17g so they read back as the Python store's floats.
local HELD_USD = '$usd'

local function num(x)
  return string.format('%.17g', x)
end

local function metered(seconds, step)
  if seconds <= 0 then return 0 end
  if step <= 0 then return seconds end
  return math.ceil(seconds / step - 1e-9) * step
end

local function hold_of(m)
  if not m.rate then return 0 end
  return tonumber(m.rate) * metered(tonumber(m.covered), tonumber(m.step)) + tonumber(m.fee)
end

local function held_usd(held_key)
  return tonumber(redis.call('HGET', held_key, HELD_USD) or '0')
end

local function spent_usd(usage_key)
  return tonumber(redis.call('HGET', usage_key, 'usd') or '0')
end

local function add_held(held_key, amount)
  redis.call('HSET', held_key, HELD_USD, num(math.max(0, held_usd(held_key) + amount)))
end

-- Paused sandboxes' storage holds (policies/paused.py): the held hash's `$paused` field, a
-- json object sandbox id -> {entry, started, expires, rate} (numbers as %.17g strings),
-- their USD counted in `$usd`; no field once none is held.
local PAUSED = '$paused'

-- Nothing left holds anything: no float dust stays behind.
local function clear_held(leases_key, held_key)
  if redis.call('ZCARD', leases_key) == 0 and redis.call('HEXISTS', held_key, HELD_USD) == 1
      and redis.call('HEXISTS', held_key, PAUSED) == 0 then
    redis.call('HSET', held_key, HELD_USD, '0')
  end
end

local function paused_holds(held_key)
  local raw = redis.call('HGET', held_key, PAUSED)
  if not raw then return {} end
  return cjson.decode(raw)
end

local function save_paused(held_key, holds)
  if next(holds) == nil then
    redis.call('HDEL', held_key, PAUSED)
  else
    redis.call('HSET', held_key, PAUSED, cjson.encode(holds))
  end
end

local function paused_held(h)
  return tonumber(h.rate) * (tonumber(h.expires) - tonumber(h.started))
end

local function paused_charge(h, now)
  local started = tonumber(h.started)
  return tonumber(h.rate) * (math.min(math.max(now, started), tonumber(h.expires)) - started)
end

-- Drop sandbox `id`'s storage hold, charging what it used until `now`: the USD, nil if
-- it held none.
local function settle_paused(usage_key, held_key, holds, id, now)
  local h = holds[id]
  if not h then return nil end
  holds[id] = nil
  add_held(held_key, -paused_held(h))
  local charged = paused_charge(h, now)
  redis.call('HSET', usage_key, 'usd', num(spent_usd(usage_key) + charged))
  return charged
end

-- Charge whole every hold LAPSE_GRACE past its end, in sandbox id order. Returns how many.
local LAPSE_GRACE = 24 * 3600  -- policies/paused.py's
local function purge_paused(usage_key, held_key, holds, now)
  local ended = {}
  for id, h in pairs(holds) do
    if tonumber(h.expires) + LAPSE_GRACE <= now then table.insert(ended, id) end
  end
  table.sort(ended)
  for _, id in ipairs(ended) do settle_paused(usage_key, held_key, holds, id, now) end
  return #ended
end

-- When m's cover ends: the end of the last billing step its hold pays for.
local function cover_end(m)
  return m.started + metered(tonumber(m.covered), tonumber(m.step))
end

-- Drop m's hold and charge its cost for `seconds` (its fee if it took a session).
local function settle_usd(usage_key, held_key, m, seconds)
  if not m.rate then return end
  local fee = tonumber(m.fee)
  if m.counted == 0 then fee = 0 end
  add_held(held_key, -hold_of(m))
  local charged = tonumber(m.rate) * metered(seconds, tonumber(m.step)) + fee
  redis.call('HSET', usage_key, 'usd', num(spent_usd(usage_key) + charged))
end

-- `covered` grown by the fewest whole `renew` windows whose paid steps reach `need`
-- seconds (policies/quota.py `_grown`).
local function grown_cover(covered, renew, step, need)
  if step <= 0 then return covered + math.ceil((need - covered) / renew - 1e-9) * renew end
  local steps = math.ceil(need / step - 1e-9)
  local windows = math.max(1, math.floor(((steps - 1) * step - covered) / renew))
  while metered(covered + windows * renew, step) < need do windows = windows + 1 end
  return covered + windows * renew
end

-- Grow m's cover to `expires` by whole renewals if the budget (`limit`, '' = none)
-- holds them, and the second budget `also` ({spent and held, limit}: its tenant's) when
-- given (policies/quota.py `cover`). Returns the expiry to keep, whether it fit, and
-- which budget did not ('pool', asked first, or 'tenant'; '' when it fit).
local function cover(usage_key, held_key, m, expires, limit, also)
  if not m.rate then return expires, true, '' end
  local covered, renew, step = tonumber(m.covered), tonumber(m.renew), tonumber(m.step)
  local need = expires - m.started
  local paid = metered(covered, step)  -- the cover ends where its paid steps do
  if need <= paid or renew <= 0 then return expires, true, '' end
  local grown = grown_cover(covered, renew, step, need)
  local extra = tonumber(m.rate) * (metered(grown, step) - metered(covered, step))
  local short = ''
  if limit ~= '' and spent_usd(usage_key) + held_usd(held_key) + extra > tonumber(limit) then
    short = 'pool'
  elseif also ~= nil and also[1] + extra > also[2] then
    short = 'tenant'
  end
  local fits = short == ''
  m.short = fits and 0 or 1
  if not fits and m.kill == 1 then return m.started + paid, false, short end
  redis.call('HSET', held_key, HELD_USD, num(held_usd(held_key) + extra))
  m.covered = num(grown)
  return expires, fits, short
end

-- Free lease `lid` (its slot and its count) and meter a live one's seconds from its
-- commit to `upto` (or its expiry, if sooner) into the usage, its hold settled to
-- their cost. Returns the seconds.
local function drop_lease(usage_key, leases_key, meta_key, held_key, lid, m, upto, usage_ttl)
  local expires = tonumber(redis.call('ZSCORE', leases_key, lid) or upto)
  local seconds = 0
  if m.live == 1 then seconds = math.max(0, math.min(upto, expires) - m.started) end
  redis.call('HINCRBYFLOAT', usage_key, 'sandbox_seconds', seconds)
  settle_usd(usage_key, held_key, m, seconds)
  redis.call('EXPIRE', usage_key, usage_ttl)
  ensure_counts(leases_key, meta_key, held_key)
  redis.call('HDEL', meta_key, lid)
  redis.call('ZREM', leases_key, lid)
  count_lease(held_key, m.entry, -1)
  clear_held(leases_key, held_key)
  return seconds
end

-- Give back reservation `lid` while it is not live (its create failed, or it was
-- never answered): its slot, and its session when it took one. Returns true if it did.
local function refund(usage_key, leases_key, meta_key, held_key, lid)
  local raw = redis.call('HGET', meta_key, lid)
  if not raw then return false end
  local m = cjson.decode(raw)
  if m.live ~= 0 then return false end
  ensure_counts(leases_key, meta_key, held_key)
  redis.call('HDEL', meta_key, lid)
  redis.call('ZREM', leases_key, lid)
  count_lease(held_key, m.entry, -1)
  if m.counted ~= 0 and redis.call('HINCRBY', usage_key, 'sessions', -1) < 0 then
    redis.call('HSET', usage_key, 'sessions', 0)
  end
  if m.rate then add_held(held_key, -hold_of(m)) end
  clear_held(leases_key, held_key)
  return true
end

-- Drop expired leases (the lease set is their index by expiry, so only those
-- are read), charging each its seconds (and dollars) until it expired. Returns how many.
local function purge(usage_key, leases_key, meta_key, held_key, now)
  ensure_counts(leases_key, meta_key, held_key)
  local expired = redis.call('ZRANGEBYSCORE', leases_key, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1000)
  for i = 1, #expired, 2 do
    local lid, expires = expired[i], tonumber(expired[i + 1])
    local raw = redis.call('HGET', meta_key, lid)
    if raw then
      local m = cjson.decode(raw)
      local seconds = 0
      if m.live == 1 then
        seconds = math.max(0, expires - m.started)
        redis.call('HINCRBYFLOAT', usage_key, 'sandbox_seconds', seconds)
      end
      settle_usd(usage_key, held_key, m, seconds)
      redis.call('HDEL', meta_key, lid)
      count_lease(held_key, m.entry, -1)
    end
    redis.call('ZREM', leases_key, lid)
  end
  if #expired > 0 then clear_held(leases_key, held_key) end
  return #expired / 2
end

-- Tenants (policies/tenants.py). A tenant's keys, under the tenants' own hash tag:
-- usage (hash: sessions, usd of its window), leases (zset: lease id -> the expiry its
-- pool keeps), meta (hash: lease id -> a copy of the pool's slot; `$usd` its holds) and
-- spend (zset: the window's tenants by usd spent, for `cost --tenants`). `T` is nil for
-- a lease without a tenant; its limits are strings ('' = unlimited).
local function tenant_of(first, name, sessions, concurrent, usd)
  if #KEYS < first + 3 then return nil end
  return {usage = KEYS[first], leases = KEYS[first + 1], meta = KEYS[first + 2],
          spend = KEYS[first + 3], name = name, sessions = sessions,
          concurrent = concurrent, usd = usd}
end

local function t_held(T)
  return tonumber(redis.call('HGET', T.meta, HELD_USD) or '0')
end

local function t_spent(T)
  return tonumber(redis.call('HGET', T.usage, 'usd') or '0')
end

local function t_set_held(T, amount)
  redis.call('HSET', T.meta, HELD_USD, num(math.max(0, amount)))
end

local function t_touch(T, usage_ttl)
  redis.call('ZADD', T.spend, t_spent(T), T.name)
  redis.call('EXPIRE', T.usage, usage_ttl)
  redis.call('EXPIRE', T.spend, usage_ttl)
end

-- Nothing left holds anything: no float dust stays behind.
local function t_no_dust(T)
  if redis.call('ZCARD', T.leases) == 0 and redis.call('HEXISTS', T.meta, PAUSED) == 0 then
    redis.call('DEL', T.meta)
  end
end

-- The tenant's copies of its paused sandboxes' storage holds (policies/paused.py), the
-- meta hash's `$paused` field as the pool's held hash keeps them.
local function t_paused(T)
  return paused_holds(T.meta)
end

local function t_save_paused(T, holds)
  save_paused(T.meta, holds)
end

-- Drop the tenant's copy of sandbox `id`'s hold, charging what it used until `now`.
local function t_settle_paused(T, holds, id, now)
  local h = holds[id]
  if not h then return end
  holds[id] = nil
  t_set_held(T, t_held(T) - paused_held(h))
  redis.call('HSET', T.usage, 'usd', num(t_spent(T) + paused_charge(h, now)))
end

-- Drop m's hold and charge its cost for `seconds` (its fee if it took a session).
local function t_settle(T, m, seconds)
  if not m.rate then return end
  local fee = tonumber(m.fee)
  if m.counted == 0 then fee = 0 end
  t_set_held(T, t_held(T) - hold_of(m))
  local charged = tonumber(m.rate) * metered(seconds, tonumber(m.step)) + fee
  redis.call('HSET', T.usage, 'usd', num(t_spent(T) + charged))
end

-- Drop the tenant's expired leases, charging each until its expiry (as its pool does),
-- but those in `keep` (a set, or nil): the leases a call names while their pool holds them;
-- then charge whole its paused holds LAPSE_GRACE past their end (as its pools do).
local function t_purge(T, now, usage_ttl, keep)
  local expired = redis.call('ZRANGEBYSCORE', T.leases, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1000)
  for i = 1, #expired, 2 do
    local lid, expires = expired[i], tonumber(expired[i + 1])
    if not (keep and keep[lid]) then
      local raw = redis.call('HGET', T.meta, lid)
      if raw then
        local m = cjson.decode(raw)
        local seconds = 0
        if m.live == 1 then seconds = math.max(0, expires - m.started) end
        t_settle(T, m, seconds)
        redis.call('HDEL', T.meta, lid)
      end
      redis.call('ZREM', T.leases, lid)
    end
  end
  local holds, lapsed = t_paused(T), {}
  for id, h in pairs(holds) do
    if tonumber(h.expires) + LAPSE_GRACE <= now then table.insert(lapsed, id) end
  end
  table.sort(lapsed)
  for _, id in ipairs(lapsed) do t_settle_paused(T, holds, id, now) end
  if #lapsed > 0 then t_save_paused(T, holds) end
  if #expired > 0 or #lapsed > 0 then
    t_no_dust(T)
    t_touch(T, usage_ttl)
  end
end

-- The lease a call names, kept from its tenant's purge while its pool holds it.
local function t_kept(meta_key, lids)
  local kept = {}
  for _, lid in ipairs(lids) do
    if redis.call('HEXISTS', meta_key, lid) == 1 then kept[lid] = true end
  end
  return kept
end

-- The unit the tenant has no room in for slot m, as (unit, used, limit), or nil.
local function t_check(T, m)
  local sessions = tonumber(redis.call('HGET', T.usage, 'sessions') or '0')
  if m.counted == 1 and T.sessions ~= '' and sessions >= tonumber(T.sessions) then
    return 'sessions', sessions, T.sessions
  end
  local live = redis.call('ZCARD', T.leases)
  if T.concurrent ~= '' and live >= tonumber(T.concurrent) then
    return 'concurrent', live, T.concurrent
  end
  local held = t_spent(T) + t_held(T)
  if T.usd ~= '' and m.rate and held + hold_of(m) > tonumber(T.usd) then
    return 'usd', held, T.usd
  end
  return nil
end

-- Count slot m (granted by its pool, expiring at `expires`) to the tenant.
local function t_add(T, lid, m, expires, usage_ttl)
  redis.call('HSET', T.meta, lid, cjson.encode(m))
  redis.call('ZADD', T.leases, expires, lid)
  if m.counted == 1 then redis.call('HINCRBY', T.usage, 'sessions', 1) end
  if m.rate then t_set_held(T, t_held(T) + hold_of(m)) end
  t_touch(T, usage_ttl)
end

-- Hold a lease an outage ledger granted (its session is in the hand-over's spend).
local function t_hand_over(T, lid, m, expires)
  redis.call('HSET', T.meta, lid, cjson.encode(m))
  redis.call('ZADD', T.leases, expires, lid)
  if m.rate then t_set_held(T, t_held(T) + hold_of(m)) end
end

-- The tenant's usd budget as a renewal must fit it too, or nil when unlimited.
local function t_budget(T)
  if T == nil or T.usd == '' then return nil end
  return {t_spent(T) + t_held(T), tonumber(T.usd)}
end

-- Copy the pool's slot m after a commit or heartbeat changed it (its hold follows).
local function t_mirror(T, lid, m, expires)
  local raw = redis.call('HGET', T.meta, lid)
  if not raw then return end
  t_set_held(T, t_held(T) + hold_of(m) - hold_of(cjson.decode(raw)))
  redis.call('HSET', T.meta, lid, cjson.encode(m))
  redis.call('ZADD', T.leases, expires, lid)
end

local function t_release(T, lid, now, usage_ttl)
  local raw = redis.call('HGET', T.meta, lid)
  if not raw then return end
  local m = cjson.decode(raw)
  local seconds = 0
  if m.live == 1 then
    seconds = math.max(0, math.min(now, tonumber(redis.call('ZSCORE', T.leases, lid))) - m.started)
  end
  t_settle(T, m, seconds)
  redis.call('HDEL', T.meta, lid)
  redis.call('ZREM', T.leases, lid)
  t_no_dust(T)
  t_touch(T, usage_ttl)
end

local function t_refund(T, lid, usage_ttl)
  local raw = redis.call('HGET', T.meta, lid)
  if not raw then return end
  local m = cjson.decode(raw)
  if m.live ~= 0 then return end
  redis.call('HDEL', T.meta, lid)
  redis.call('ZREM', T.leases, lid)
  if m.counted ~= 0 and redis.call('HINCRBY', T.usage, 'sessions', -1) < 0 then
    redis.call('HSET', T.usage, 'sessions', 0)
  end
  if m.rate then t_set_held(T, t_held(T) - hold_of(m)) end
  t_no_dust(T)
  t_touch(T, usage_ttl)
end
