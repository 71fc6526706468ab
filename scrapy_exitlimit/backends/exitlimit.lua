-- scrapy_exitlimit: shared exit state. One script, one call per operation.
--
-- Time comes from Redis TIME only, so processes on machines with skewed clocks
-- agree. Every key carries the same {hash tag} (the key prefix), so one call's
-- keys share a Redis Cluster slot; every key a call touches is passed in KEYS.
--
--   pair  hash  (origin, exit IP or id): tat (GCRA), tol (its burst tolerance), cool
--               (cooldown end), ban (ban end), last (last admitted)
--   lease zset  per exit: lease token -> expiry; expired tokens free their place
--   exit  hash  per exit: dead (evicted until)
--   origin hash per origin: tat (budget GCRA), hold (503 pause end), last (last admitted)
--   scope hash  per named scope (an account, an API key; every exit and origin):
--               tat (budget GCRA)
--   learn hash  per origin: v (version), blob (what the pool learned, JSON); kept
--               EXITLIMIT_STATE_MAX_AGE after it was last written or used
--   procs zset  process id -> heartbeat expiry
local IDLE = 3600      -- pair/exit/origin state idle this long is forgotten
local LEARN_IDLE = 86400  -- what was learned: EXITLIMIT_STATE_MAX_AGE, when given
local NEG = -1e18

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local function num(v, default)
  return tonumber(v) or default
end

local function f6(x)
  return string.format('%.6f', x)
end

local op = ARGV[1]

-- this process is alive for ttl more seconds; the reply: now, how many processes are,
-- then each one's id and when it last said so (so each can tell who is back)
local function presence(pk, id, ttl)
  redis.call('ZADD', pk, now + ttl, id)
  redis.call('ZREMRANGEBYSCORE', pk, '-inf', now)
  redis.call('EXPIRE', pk, IDLE)
  local members = redis.call('ZRANGE', pk, 0, -1, 'WITHSCORES')
  local reply = {f6(now), #members / 2}
  for i = 1, #members, 2 do
    reply[#reply + 1] = members[i]
    reply[#reply + 1] = f6(tonumber(members[i + 1]) - ttl)
  end
  return reply
end

-- give back lease `token`; `arrived` 1: the request reached the server as late as
-- now - back, so the pair's next request goes an interval after that; 2: the same on a
-- cold path (back is only how late this call is), which a slower pace counts from too
-- (`arr`). An empty token gives nothing back: a request sent late re-anchors a shared
-- budget (pk) alone
local function release(lk, pk, token, arrived, back, interval)
  if token ~= '' then
    redis.call('ZREM', lk, token)
  end
  if arrived ~= '0' and redis.call('EXISTS', pk) == 1 then
    local at = now - tonumber(back)
    local when = at + tonumber(interval)
    local f = redis.call('HMGET', pk, 'tat', 'arr')
    if when > num(f[1], NEG) then
      redis.call('HSET', pk, 'tat', f6(when))
    end
    if arrived == '2' and at > num(f[2], NEG) then
      redis.call('HSET', pk, 'arr', f6(at))
    end
  end
end

-- releases come first in KEYS (lease, pair) and ARGV (token, arrived, back, interval)
local function release_all(count, key0, arg0)
  for r = 0, count - 1 do
    local k, a = key0 + 2 * r, arg0 + 4 * r
    release(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
  end
end

if op == 'admit' then
  -- KEYS: origin, learn, (lease, pair) per release, then (pair, lease, exit) per candidate,
  --       then one scope key per named scope the request needs
  -- ARGV: op, want, token prefix, first lease id, lease ttl, origin interval, origin tolerance,
  --       releases R, reserve horizon, phase (0..1), then 4 per release, then (interval,
  --       tolerance, limit, may reserve) per candidate, then (interval, tolerance) per scope
  -- reply: now, wait, what stood in the way (1: a lease limit, + 2: a shared budget, with
  --        a candidate ready), learn version, then (candidate index, gap since the pair's
  --        previous admission, gap since the origin's previous admission on any exit by
  --        any process, when it may go: 0 now, else a reserved time) per lease
  local want = tonumber(ARGV[2])
  local prefix = ARGV[3]
  local next_id = tonumber(ARGV[4])
  local ttl = tonumber(ARGV[5])
  local ointerval = tonumber(ARGV[6])
  local otol = tonumber(ARGV[7])
  local releases = tonumber(ARGV[8])
  local horizon = tonumber(ARGV[9])
  local phase = tonumber(ARGV[10])
  release_all(releases, 3, 11)  -- first, so the places they free count now
  local kbase, abase = 2 + 2 * releases, 11 + 4 * releases
  local o = redis.call('HMGET', KEYS[1], 'tat', 'hold', 'last')
  local olast = num(o[3], NEG)
  -- n candidates and s scopes: 3n + s keys and 4n + 2s arguments are left
  local kleft, aleft = #KEYS - kbase, #ARGV - abase + 1
  local n = (2 * kleft - aleft) / 2
  local s = kleft - 3 * n
  if n < 0 or s < 0 or n ~= math.floor(n) then
    return redis.error_reply('exitlimit: admit: ' .. kleft .. ' keys and ' .. aleft ..
                             ' arguments left make no candidates and scopes')
  end
  -- the budgets every exit shares: the origin's (none while its interval is 0), then each
  -- named scope's; a request takes a token from all of them with its pair's, or from none
  local shared = {}
  if ointerval > 0 then
    shared[1] = {key = KEYS[1], interval = ointerval, tol = otol, tat = num(o[1], NEG),
                 hold = num(o[2], NEG)}
  end
  for j = 1, s do
    local key, a = KEYS[kbase + 3 * n + j], abase + 4 * n + 2 * (j - 1)
    shared[#shared + 1] = {key = key, interval = tonumber(ARGV[a]), tol = tonumber(ARGV[a + 1]),
                           tat = num(redis.call('HGET', key, 'tat'), NEG), hold = NEG}
  end
  -- when every shared budget has a token
  local function shared_ready()
    local ready = NEG
    for _, b in ipairs(shared) do
      ready = math.max(ready, b.tat - b.tol, b.hold)
    end
    return ready
  end
  local c = {}
  for i = 1, n do
    local pk, lk, ek = KEYS[kbase + 3 * i - 2], KEYS[kbase + 3 * i - 1], KEYS[kbase + 3 * i]
    local a = abase + 4 * (i - 1)
    local f = redis.call('HMGET', pk, 'tat', 'cool', 'ban', 'last', 'tol', 'ivl', 'arr')
    local dead = num(redis.call('HGET', ek, 'dead'), NEG)
    c[i] = {
      interval = tonumber(ARGV[a]), tol = tonumber(ARGV[a + 1]), limit = tonumber(ARGV[a + 2]),
      reserve = ARGV[a + 3] == '1',
      tat = num(f[1], NEG), block = math.max(num(f[2], NEG), num(f[3], NEG), dead),
      last = num(f[4], NEG), arr = num(f[7], NEG), busy = redis.call('ZCARD', lk),
      pk = pk, lk = lk,
    }
    if c[i].busy >= c[i].limit then
      -- full: leases of a process that died (expired, never renewed) free their places
      redis.call('ZREMRANGEBYSCORE', lk, '-inf', now)
      c[i].busy = redis.call('ZCARD', lk)
    end
    -- a slower rate widens the burst tolerance: keep the next token where it was,
    -- or the tokens the faster rate had not yet refilled would all be free at once
    local old_tol = tonumber(f[5])
    if old_tol and c[i].tol > old_tol then
      c[i].tat = c[i].tat + (c[i].tol - old_tol)
    end
    -- a new pace starts one new interval after the pair's last admission (or a cold
    -- path's last answer, `arr`): not sooner when slower, not an old interval later
    -- when faster (as the core's pair.py)
    local old_ivl = tonumber(f[6])
    if old_ivl and c[i].tat > NEG then
      if c[i].interval > old_ivl then
        c[i].tat = math.max(c[i].tat, math.max(c[i].last, c[i].arr) + c[i].interval)
      elseif c[i].interval < old_ivl then
        c[i].tat = c[i].tat - (old_ivl - c[i].interval)
      end
    end
  end
  local out = {}
  local wait = math.huge
  local lease_blocked = 0
  local shared_blocked = 0
  local admitted = 0
  local waiting = nil  -- the ready candidate a shared budget's token held up
  -- one lease on pair x at time `at` (now, or a reserved later time)
  local function take(i, at)
    local x = c[i]
    for _, b in ipairs(shared) do
      b.tat = math.max(b.tat, at) + b.interval
    end
    -- (another caller may have reserved a later time on the origin: no negative gap)
    local gap, ogap = at - x.last, math.max(at - olast, 0)
    olast = math.max(olast, at)
    x.tat = math.max(x.tat, at) + x.interval
    x.last = at
    x.busy = x.busy + 1
    redis.call('ZADD', x.lk, now + ttl, prefix .. ':' .. next_id)
    next_id = next_id + 1
    redis.call('HSET', x.pk, 'tat', f6(x.tat), 'last', f6(at), 'tol', f6(x.tol),
               'ivl', f6(x.interval))
    redis.call('EXPIRE', x.pk, IDLE)
    redis.call('EXPIRE', x.lk, IDLE)
    out[#out + 1] = i
    out[#out + 1] = f6(gap)
    out[#out + 1] = f6(ogap)
    out[#out + 1] = at > now and f6(at) or 0
    admitted = admitted + 1
  end
  while admitted < want do
    local best, best_load, best_tat = nil, 0, 0
    for i = 1, n do
      local x = c[i]
      local ready = math.max(x.tat - x.tol, x.block)
      if ready > now then
        wait = math.min(wait, ready)
      elseif x.busy >= x.limit then
        lease_blocked = 1
      else
        -- least loaded first, then the pair that has waited longest
        local load = x.busy / x.limit
        if best == nil or load < best_load or (load == best_load and x.tat < best_tat) then
          best, best_load, best_tat = i, load, x.tat
        end
      end
    end
    if best == nil then
      break
    end
    if #shared > 0 then
      local sready = shared_ready()
      if sready > now then
        -- a ready pair waits for the shared token: nothing goes before it, whatever
        -- other pairs' tokens say (and every other candidate would wait for it too)
        wait = sready
        shared_blocked = 2
        waiting = best
        break
      end
    end
    take(best, now)
  end
  -- Nothing now: the tokens due soon (within the horizon and half their pair's interval)
  -- are taken for this caller, each at its own time, up to `want`: processes that wake
  -- together for one token do not all call again for it, and one call serves several
  -- requests; the caller sends each at its time. A request that reached the server late
  -- moves its pair's next token later when its answer comes (release), which a
  -- reservation made before could not see: so only on pairs the caller knows warm, and at
  -- most half an interval ahead (the previous request's answer is in by then on any path
  -- faster than that).
  if admitted == 0 and horizon > 0 then
    local due, opens = {}, math.huge
    for i = 1, n do
      local x = c[i]
      local at = math.max(x.tat - x.tol, x.block, now)
      if x.reserve and x.busy < x.limit then
        local ahead = math.min(horizon, x.interval / 2)
        if at <= now + ahead then
          due[#due + 1] = {i, at}
        else  -- too far yet: ask again when it can be reserved, at the caller's own
          -- phase within the window (callers told together would all call together)
          opens = math.min(opens, at - ahead * (1 - phase))
        end
      end
    end
    table.sort(due, function(a, b) return a[2] < b[2] end)
    -- a shared token: only from half its interval before it on, so the previous
    -- request's answer (which re-anchors the budget on when it arrived) is in first
    local sahead = horizon
    for _, b in ipairs(shared) do
      sahead = math.min(sahead, b.interval / 2)
    end
    -- pair i, its own token due at `at`, takes the shared one when they all allow
    local function take_shared(i, at)
      local sready = shared_ready()
      if sready > now + sahead then
        opens = math.min(opens, sready - sahead * (1 - phase))
      elseif math.max(at, sready) <= now + horizon then
        take(i, math.max(at, sready))
      end
    end
    if waiting ~= nil then
      -- a ready pair waits for the shared token: it is the one that goes (the least
      -- loaded, then the one that waited longest), reserved if the caller knows it warm;
      -- else the caller asks again when the token is due (a cold pair never passed over)
      if c[waiting].reserve then
        take_shared(waiting, now)
      end
    elseif #shared > 0 and #due > 0 then  -- shared budgets: one, when they all allow
      take_shared(due[1][1], due[1][2])
    else
      for k = 1, math.min(#due, want) do
        take(due[k][1], due[k][2])
      end
    end
    if admitted == 0 then
      wait = math.min(wait, opens)
    else
      -- the caller holds what was reserved and asks again when a pair passed over (not
      -- known warm, beyond the horizon, or past `want`) is due, not at the reserved times:
      -- a cold pair waiting for the last reservation went late, its whole interval lost
      wait = opens
      local floor = #shared > 0 and shared_ready() or NEG
      for i = 1, n do
        local x = c[i]
        if x.busy < x.limit then
          wait = math.min(wait, math.max(x.tat - x.tol, x.block, floor))
        end
      end
    end
  end
  if admitted > 0 then
    for _, b in ipairs(shared) do
      redis.call('HSET', b.key, 'tat', f6(b.tat))
      redis.call('EXPIRE', b.key, IDLE)
    end
    redis.call('HSET', KEYS[1], 'last', f6(olast))
    redis.call('EXPIRE', KEYS[1], IDLE)
  end
  local v = redis.call('HGET', KEYS[2], 'v') or '0'
  local reply = {f6(now), wait == math.huge and 'inf' or f6(wait),
                 lease_blocked + shared_blocked, v}
  for i = 1, #out do
    reply[#reply + 1] = out[i]
  end
  return reply

elseif op == 'release' then
  -- KEYS: (lease, pair) per release   ARGV: op, then (token, arrived, back, interval) each
  release_all(#KEYS / 2, 1, 2)
  return f6(now)

elseif op == 'leave' then
  -- a process closing: its leases back, its presence gone
  -- KEYS: procs, then (lease, pair) per release   ARGV: op, process id, then 4 per release
  release_all((#KEYS - 1) / 2, 2, 3)
  redis.call('ZREM', KEYS[1], ARGV[2])
  return f6(now)

elseif op == 'hold' then
  -- KEYS: pair (or origin)   ARGV: op, field (cool/ban/hold), seconds, tolerance
  -- the latest deadline wins; the bucket is held so the pause ends with one request
  local until_ = now + tonumber(ARGV[3])
  local cur = num(redis.call('HGET', KEYS[1], ARGV[2]), NEG)
  if until_ > cur then
    redis.call('HSET', KEYS[1], ARGV[2], f6(until_))
    cur = until_
  end
  local tat = num(redis.call('HGET', KEYS[1], 'tat'), NEG)
  local held = cur + tonumber(ARGV[4])
  if held > tat then
    redis.call('HSET', KEYS[1], 'tat', f6(held))
  end
  redis.call('EXPIRE', KEYS[1], IDLE)
  return f6(cur - now)

elseif op == 'dead' then
  -- KEYS: exit   ARGV: op, seconds
  local until_ = now + tonumber(ARGV[2])
  if until_ > num(redis.call('HGET', KEYS[1], 'dead'), NEG) then
    redis.call('HSET', KEYS[1], 'dead', f6(until_))
  end
  redis.call('EXPIRE', KEYS[1], IDLE)
  return f6(now)

elseif op == 'renew' then
  -- KEYS: procs, then one lease key per token   ARGV: op, process id, ttl, tokens...
  local ttl = tonumber(ARGV[3])
  for i = 2, #KEYS do
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, ARGV[i + 2])
  end
  return presence(KEYS[1], ARGV[2], ttl)

elseif op == 'rejoin' then
  -- back after Redis was lost: leases in flight registered again, leases released
  -- meanwhile taken out, and what this process paced or held meanwhile seeded (the
  -- later deadline wins, so shared holds and bans stand and nothing bursts)
  -- KEYS: procs, L lease keys to register, S lease keys to clean, P pair keys, O learn keys
  -- ARGV: op, process id, ttl, L, S, P, L tokens, S tokens, then (tat, tol, cool, ban) per pair
  local ttl, l, s, p = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
    tonumber(ARGV[6])
  for i = 1, l do
    redis.call('ZADD', KEYS[1 + i], now + ttl, ARGV[6 + i])
    redis.call('EXPIRE', KEYS[1 + i], IDLE)
  end
  for i = 1, s do
    redis.call('ZREM', KEYS[1 + l + i], ARGV[6 + l + i])
  end
  for i = 1, p do
    local pk, a = KEYS[1 + l + s + i], 6 + l + s + 4 * (i - 1)
    local f = redis.call('HMGET', pk, 'tat', 'cool', 'ban', 'tol')
    local fields = {'tat', 'cool', 'ban'}
    local cur = {num(f[1], NEG), num(f[2], NEG), num(f[3], NEG)}
    local new = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}
    for j = 1, 3 do
      if new[j] > cur[j] then
        redis.call('HSET', pk, fields[j], f6(new[j]))
      end
    end
    if not f[4] then
      redis.call('HSET', pk, 'tol', ARGV[a + 2])
    end
    redis.call('EXPIRE', pk, IDLE)
  end
  local reply = presence(KEYS[1], ARGV[2], ttl)
  for i = 2 + l + s + p, #KEYS do
    reply[#reply + 1] = redis.call('HGET', KEYS[i], 'v') or '0'
  end
  return reply

elseif op == 'learn_get' then
  -- KEYS: learn
  local f = redis.call('HMGET', KEYS[1], 'v', 'blob')
  return {f[1] or '0', f[2] or ''}

elseif op == 'learn_put' then
  -- KEYS: learn   ARGV: op, the version this update was made from, blob, [seconds kept]
  -- compare-and-set: an update made from stale knowledge loses and gets the current state
  local f = redis.call('HMGET', KEYS[1], 'v', 'blob')
  local v = f[1] or '0'
  if v ~= ARGV[2] then
    return {0, v, f[2] or ''}
  end
  local nv = redis.call('HINCRBY', KEYS[1], 'v', 1)
  redis.call('HSET', KEYS[1], 'blob', ARGV[3])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]) or LEARN_IDLE)
  return {1, tostring(nv), ''}

elseif op == 'learn_touch' then
  -- KEYS: learn keys of origins just used   ARGV: op, seconds kept
  -- what was learned is kept that long after it was last used, not only after it changed
  local kept = 0
  for i = 1, #KEYS do
    kept = kept + redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2]) or LEARN_IDLE)
  end
  return kept

elseif op == 'time' then
  return f6(now)
end

return redis.error_reply('exitlimit: unknown operation ' .. tostring(op))
