//! The Lua scripts: every state change of a lock is one script, so one
//! round trip, atomic on the server. They are sent by SHA (`EVALSHA`) and
//! loaded again on `NOSCRIPT` by [`redis::Script`].
//!
//! ## Keys of the lock named `N` (all in `N`'s cluster slot)
//!
//! | key | type | what |
//! |---|---|---|
//! | `N` | hash (`redisson`) or string (`simple`) | Redisson `RLock`'s layout: field `<client id>:<owner id>`, value the number of holds, plus fields `~<hold id>` (below) and `@<hold id>` (the holder's host, process, command and grant time: see `Holder`) per hold of ours; or redis-py `Lock`'s: the holder's token |
//! | `redisson_lock_token:{N}` | string | the fencing counter (Redisson `RFencedLock`'s key); also numbers queue tickets |
//! | `fenced_holds:{N}` | string | `simple` layout only: `<hold id>#` and what `~<hold id>` holds in the other layout: `<owner>\|<mode>\|<take>\|<max>\|<token>\|<expiry ms, server time>` |
//! | `fenced_queue:{N}` / `fenced_qexp:{N}` | sorted sets | waiters, fair or not, by ticket / by expiry; member `<ticket>\|<owner>`; `~handoff` in `qexp` while a release's hand-over to the head stands |
//! | `fenced_register:{N}` | hash | the fenced register: `v` value, `f` highest fence |
//! | `fenced_register_channel:{N}` | pub/sub | every register write publishes `1` |
//! | `fenced_rate:{N}` | string | a rate limiter's TAT, µs by the server's `TIME` |
//! | `fenced_released:{N}` | string | Cluster only: the hold id of the last release, for twice the request timeout (see [`cluster_release`]) |
//!
//! Expiry is by the server's clock (`TIME`), never a client's. Every key
//! but the counter expires with the last hold or waiter; the counter is
//! kept for a week and never issues less than the server's time in
//! microseconds, so tokens keep rising even if it is lost.

/// Functions and bindings every lock script shares. `KEYS`: lock, counter,
/// holds, queue, qexp. Each `redis.call` from Lua costs a few µs, so the
/// uncontended paths make as few as they can (5 to acquire, 4 to release).
/// A change publishes the queue's head ticket on the channel of the head's
/// client when someone queues (`<lock channel>:<client id>`, as Redisson's
/// `RFairLock` publishes on one per waiter), so only the head's process
/// wakes, and Redisson's unlock message `0` on the lock's channel
/// otherwise.
const COMMON: &str = r#"
local lock, counter, holds, queue, qexp = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function fmt(n) return string.format('%.0f', n) end

-- How soon waiters look again at a holder whose key has no expiry.
local FOREIGN_RECHECK_MS = 2000

local function parse(id, v)
  local f, m, tk, mx, tok, exp = string.match(v, '^(.*)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$')
  return {id = id, field = f, mode = tonumber(m), take = tonumber(tk), max = tonumber(mx),
          token = tonumber(tok), exp = tonumber(exp)}
end

local function encode(h)
  return h.field .. '|' .. h.mode .. '|' .. h.take .. '|' .. h.max .. '|' .. fmt(h.token) .. '|' .. fmt(h.exp)
end

-- One more than the last token, and never below the server's clock in µs.
-- `SET ... GET` makes the common case (the clock is ahead) one call.
local function next_token()
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('SET', counter, fmt(now_us), 'PX', 604800000, 'GET') or '0') or 0
  if last < now_us then return now_us end
  redis.call('SET', counter, fmt(last + 1), 'PX', 604800000)
  return last + 1
end

local function keep_until(key, ms)
  if ms > redis.call('PTTL', key) then redis.call('PEXPIRE', key, ms) end
end
"#;

/// The `redisson` layout: the lock is a hash; field `<owner>` counts the
/// owner's holds (Redisson's layout) and field `~<hold id>` describes one
/// hold. A field with no `~` hold of ours is a foreign holder (Redisson):
/// exclusive until the key expires.
const HASH_COMMON: &str = r#"
local function load()
  local raw = redis.call('HGETALL', lock)
  local live, changed = {}, false
  if #raw == 0 then return live, changed end
  local mine, owners, ids, records = {}, {}, {}, {}
  for i = 1, #raw, 2 do
    local f = raw[i]
    local b = string.byte(f, 1)
    if b == 64 then
      -- `@<hold id>`: who holds, beside the `~` field of the hold.
      table.insert(records, i)
    elseif b == 126 then
      ids[string.sub(f, 2)] = true
      local h = parse(string.sub(f, 2), raw[i + 1])
      if h.exp <= now then
        changed = true
        redis.call('HDEL', lock, f, '@' .. h.id)
        if redis.call('HINCRBY', lock, h.field, -1) <= 0 then redis.call('HDEL', lock, h.field) end
      else
        table.insert(live, h)
        mine[h.field] = true
      end
    else
      table.insert(owners, f)
    end
  end
  for _, i in ipairs(records) do
    local f = raw[i]
    if not ids[string.sub(f, 2)] then
      -- A record whose hold an older fenced (which knows no records)
      -- cleared when it expired: forgotten. Any other `@` field is a
      -- foreign client's.
      if string.sub(raw[i + 1], 1, 8) == 'fenced1 ' then
        redis.call('HDEL', lock, f)
        -- Older clients took it for a holder: wake them.
        changed = true
      else
        table.insert(owners, f)
      end
    end
  end
  local ttl = nil
  for _, f in ipairs(owners) do
    if not mine[f] and (not changed or redis.call('HEXISTS', lock, f) == 1) then
      ttl = ttl or redis.call('PTTL', lock)
      -- A foreign hash with no expiry (a client that sets none, or an
      -- operator's HSET): no lease to wait for, so look again in 2 s, as
      -- the simple layout does, rather than at once, again and again.
      if ttl < 0 then ttl = FOREIGN_RECHECK_MS end
      table.insert(live, {id = '', field = f, mode = 0, take = 0, max = 0, token = 0,
                          exp = now + ttl})
    end
  end
  return live, changed
end

local function add_hold(h, lease, alone)
  redis.call('HINCRBY', lock, h.field, 1)
  redis.call('HSET', lock, '~' .. h.id, encode(h), '@' .. h.id, h.holder)
  if alone then redis.call('PEXPIRE', lock, lease) else keep_until(lock, lease) end
end

local function remove_hold(h)
  if redis.call('HINCRBY', lock, h.field, -1) <= 0 then
    redis.call('HDEL', lock, '~' .. h.id, '@' .. h.id, h.field)
  else
    redis.call('HDEL', lock, '~' .. h.id, '@' .. h.id)
  end
end

local function hold_of(id)
  local v = redis.call('HGET', lock, '~' .. id)
  if v then return parse(id, v) end
  return nil
end

local function holder_of(h)
  if h.id == '' then return false end
  return redis.call('HGET', lock, '@' .. h.id)
end
"#;

/// The `simple` layout: the lock is a string holding the holder's token
/// (redis-py's layout); our hold is described beside it in the string
/// `fenced_holds:{N}` as `<hold id>#<description>`, with the same expiry.
const STRING_COMMON: &str = r#"
local function described(id)
  local raw = redis.call('GET', holds)
  if raw and string.sub(raw, 1, #id + 1) == id .. '#' then
    return parse(id, string.sub(raw, #id + 2))
  end
  return nil
end

local function load()
  local live = {}
  local cur = redis.call('GET', lock)
  if not cur then return live, false end
  local h = described(cur)
  if h and h.exp > now then
    table.insert(live, h)
  else
    local ttl = redis.call('PTTL', lock)
    if ttl < 0 then ttl = FOREIGN_RECHECK_MS end
    table.insert(live, {id = '', field = cur, mode = 0, take = 0, max = 0, token = 0, exp = now + ttl})
  end
  return live, false
end

-- redis-py's layout keeps one string per lock, and no holder.
local function holder_of(h) return false end

local function add_hold(h, lease, alone)
  redis.call('SET', lock, h.id, 'PX', lease)
  redis.call('SET', holds, h.id .. '#' .. encode(h), 'PX', lease)
end

local function remove_hold(h)
  if redis.call('GET', lock) == h.id then redis.call('DEL', lock, holds) end
end

local function hold_of(id)
  local h = described(id)
  if h then return h end
  if redis.call('GET', lock) == id then
    return {id = id, field = id, mode = 0, take = 0, max = 0, token = 0, exp = now + redis.call('PTTL', lock)}
  end
  return nil
end
"#;

/// Queue handling and the grant rule (the Lua twin of
/// `spi::grant::grantable`).
const GRANT_COMMON: &str = r#"
-- How long (ms) a release keeps the lock for the queue's head against
-- unfair requests: the head's pub/sub hop and script, with room for a
-- busy host. A head that is dead costs each release this much.
local HANDOFF_MS = 10

local function purge_queue()
  local dead = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 200)
  if #dead > 0 then
    redis.call('ZREM', qexp, unpack(dead))
    redis.call('ZREM', queue, unpack(dead))
  end
end

-- Publishes a change: the queue's head ticket when someone queues, on
-- the channel of the head's client, so that only the head wakes, with the lock
-- held for it from unfair requests for a moment (`~handoff` in `qexp`,
-- which a dead head outlives by that moment only); or Redisson's unlock
-- message '0' on the lock's channel, which wakes every waiter. (A member
-- without an owner was queued by an older fenced, which listens on the
-- lock's channel.)
local function wake(channel)
  purge_queue()
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head then
    redis.call('PUBLISH', channel, '0')
    return
  end
  redis.call('ZADD', qexp, now + HANDOFF_MS, '~handoff')
  local tk, who = string.match(head, '^(%d+)|(.+)$')
  if who then redis.call('PUBLISH', channel .. ':' .. who, tk) else redis.call('PUBLISH', channel, head) end
end

-- The queue member of a ticket (or nil): tickets are unique scores.
local function member_of(ticket)
  return redis.call('ZRANGEBYSCORE', queue, ticket, ticket, 'LIMIT', 0, 1)[1]
end

-- true, false, or nil and the holders' count of permits when a semaphore
-- request counts another number than its holders (refused).
local function grantable(live, field, mode, take, max)
  local used, conflict = 0, false
  for _, h in ipairs(live) do
    if h.mode == 2 and mode == 2 and h.max ~= max then return nil, h.max end
    if h.mode == 2 and mode == 2 then used = used + h.take
    elseif h.mode == 2 or mode == 2 then conflict = true
    elseif h.field == field then
    elseif h.mode == 1 and mode == 1 then
    else conflict = true end
  end
  if conflict then return false end
  if mode == 2 then return used + take <= max end
  return true
end
"#;

/// Acquire. ARGV: field, hold id, mode, take, max, lease ms, fair, will
/// wait, ticket (or ""), channel, queue ttl ms, whether unfair waiters
/// queue too ('1'; RedLock's masters do not: its tickets are per master),
/// the owner whose channel wakes this waiter, the holder's record.
/// Returns `{1, token}`, `{0, ticket or -1, ms until the first lease ends or
/// -1}`, or `{-2, permits}` when a semaphore request counts another number
/// of permits than the semaphore's holders.
const ACQUIRE: &str = r#"
local field, id, mode, take, max = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, fair, wait, ticket = tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8] == '1', ARGV[9]
local channel, qttl, queued, who = ARGV[10], tonumber(ARGV[11]), ARGV[12] == '1', ARGV[13]

local live, changed = load()
for _, h in ipairs(live) do
  -- A retry of an attempt whose reply was lost: the grant stands.
  if h.id == id then return {1, h.token} end
end

-- Waiters queue, fair or not; a ticket is always withdrawn on grant. A
-- fair request waits its turn. An unfair one passes the queue, except
-- while a release has just handed the lock to the queue's head: without
-- that, the releasing process, already running, re-takes the lock before
-- the woken head's script arrives, again and again.
local mine, ahead = nil, false
if fair or ticket ~= '' or queued then
  purge_queue()
  if ticket ~= '' then mine = member_of(ticket) end
  local head = redis.call('ZRANGE', queue, 0, 0)
  if mine then ahead = head[1] ~= mine else ahead = #head > 0 end
  if ahead and not fair then ahead = redis.call('ZSCORE', qexp, '~handoff') ~= false end
end

local ok, theirs = grantable(live, field, mode, take, max)
if ok == nil then
  if changed then wake(channel) end
  return {-2, theirs}
end
if ahead or not ok then
  local tk = -1
  if wait and (fair or queued) then
    if mine then tk = tonumber(ticket) else
      tk = next_token()
      mine = fmt(tk) .. '|' .. who
      redis.call('ZADD', queue, tk, mine)
    end
    redis.call('ZADD', qexp, now + qttl, mine)
    keep_until(queue, qttl)
    keep_until(qexp, qttl)
  end
  local soonest = -1
  for _, h in ipairs(live) do
    local left = h.exp - now
    if soonest < 0 or left < soonest then soonest = left end
  end
  if changed then wake(channel) end
  return {0, tk, soonest}
end

local token = next_token()
add_hold({id = id, field = field, mode = mode, take = take, max = max, token = token, exp = now + lease,
          holder = ARGV[14]}, lease, #live == 0)
if mine then
  redis.call('ZREM', queue, mine)
  redis.call('ZREM', qexp, mine, '~handoff')
  -- A shared grant may let the next in line in too; an exclusive one
  -- cannot, and its release will wake the next.
  if mode ~= 0 and redis.call('ZCARD', queue) > 0 then changed = true end
end
if changed then wake(channel) end
return {1, token}
"#;

/// The two common grants of the `redisson` layout, before any other code
/// of the script runs: a free lock and a request that does not queue with
/// nobody queued is granted in 5 calls (the hash, the clock, the counter,
/// the grant, its expiry); a free lock and the queue's head asking for it
/// exclusively (a release has just woken it) in 8 (its place looked up and
/// dropped). Anything else falls through to the general script.
const FAST_ACQUIRE_HASH: &str = r#"
local fast_head = nil
if ARGV[9] ~= '' and ARGV[3] == '0' and redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  if head == ARGV[9] .. '|' .. ARGV[13] then fast_head = head end
end
if fast_head or (ARGV[7] ~= '1' and ARGV[9] == '' and redis.call('EXISTS', KEYS[1], KEYS[4]) == 0) then
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local now = math.floor(now_us / 1000)
  local tok = now_us
  local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', now_us), 'PX', 604800000, 'GET') or '0') or 0
  if last >= now_us then
    tok = last + 1
    redis.call('SET', KEYS[2], string.format('%.0f', tok), 'PX', 604800000)
  end
  local lease = tonumber(ARGV[6])
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~' .. ARGV[2],
    ARGV[1] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[5] .. '|' .. string.format('%.0f', tok)
      .. '|' .. string.format('%.0f', now + lease), '@' .. ARGV[2], ARGV[14])
  redis.call('PEXPIRE', KEYS[1], lease)
  if fast_head then
    redis.call('ZREM', KEYS[4], fast_head)
    redis.call('ZREM', KEYS[5], fast_head, '~handoff')
  end
  return {1, tok}
end
"#;

/// The common release of the `redisson` layout: the owner's only hold,
/// exclusive, so the key's expiry is its lease and a present key means a
/// live hold. With nobody queued, the release wakes every waiter
/// (Redisson's unlock message): 4 calls; with a queue, the general
/// script's `wake()` follows (`released_fast`). ARGV as for [`RELEASE`].
/// Anything else falls through.
const FAST_RELEASE_HASH: &str = r#"
local released_fast = false
local got = redis.call('HMGET', KEYS[1], '~' .. ARGV[1], ARGV[3])
if not got[1] then return 0 end
if string.match(got[1], '|(%d+)|%d+|%d+|%d+|%d+$') == '0' and (tonumber(got[2]) or 0) <= 1 then
  redis.call('HDEL', KEYS[1], '~' .. ARGV[1], '@' .. ARGV[1], ARGV[3])
  if redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('PUBLISH', ARGV[2], '0')
    return 1
  end
  released_fast = true
end
"#;

/// What the general release needs of the fast path where the layout has
/// none.
const NO_FAST_RELEASE: &str = "local released_fast = false\n";

/// Release. ARGV: hold id, channel, owner field. Returns 1 if the hold was live.
const RELEASE: &str = r#"
if released_fast then
  wake(ARGV[2])
  return 1
end
local h = hold_of(ARGV[1])
if not h then return 0 end
remove_hold(h)
wake(ARGV[2])
if h.exp <= now then return 0 end
return 1
"#;

/// Release on a Cluster, around the release of the layout: the cluster
/// driver sends a script again, without saying so, when the connection
/// drops before the reply (as it must, to follow failovers and
/// redirects), and the second run finds nothing to release. So a release
/// that let a hold go leaves its hold id for a while (`KEYS[6]`, ARGV[4]
/// ms), and a run that finds nothing but that id says the hold was ours.
fn cluster_release(body: &str) -> String {
    format!(
        "local function release()\n{body}\nend\n\
         local r = release()\n\
         if r == 1 then redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])\n\
         elseif redis.call('GET', KEYS[6]) == ARGV[1] then r = 1 end\n\
         return r\n"
    )
}

/// Abandon: forget a queue place and any hold granted to it. ARGV: ticket
/// (or ""), hold id, channel.
const ABANDON: &str = r#"
local changed = false
local mine = ARGV[1] ~= '' and member_of(ARGV[1])
if mine then
  redis.call('ZREM', queue, mine)
  redis.call('ZREM', qexp, mine)
  changed = true
end
local h = hold_of(ARGV[2])
if h then remove_hold(h); changed = true end
if changed then wake(ARGV[3]) end
return 0
"#;

/// Status: `{last token, waiters, {field, mode, take, max, token, ms left,
/// holder or nil}...}`.
const STATUS: &str = r#"
local live = load()
purge_queue()
local out = {tonumber(redis.call('GET', counter) or '0') or 0, redis.call('ZCARD', queue)}
for _, h in ipairs(live) do
  table.insert(out, {h.field, h.mode, h.take, h.max, h.token, h.exp - now, holder_of(h)})
end
return out
"#;

/// Force release: drop every hold. ARGV: channel. Returns how many holds went.
const FORCE: &str = r#"
local live = load()
redis.call('DEL', lock, holds)
redis.call('PUBLISH', ARGV[1], '0')
return #live
"#;

/// Raise the counter to at least ARGV[1] (RedLock's token agreement).
const RAISE: &str = r#"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local want = tonumber(ARGV[1])
if want > cur then redis.call('SET', KEYS[1], string.format('%.0f', want), 'PX', 604800000) end
return 1
"#;

/// Renew many holds in one call. KEYS: (lock, holds) pairs; ARGV: (hold
/// id, lease ms) pairs. Returns 1 or 0 per hold.
fn renew(simple: bool) -> String {
    // Where a hold's description lives, and the extra check of the layout.
    let (get, set, check, extend) = if simple {
        (
            "redis.call('GET', holds); if v and string.sub(v, 1, #id + 1) == id .. '#' then \
             v = string.sub(v, #id + 2) else v = nil end",
            "redis.call('SET', holds, id .. '#' .. v, 'PX', lease)",
            "redis.call('GET', lock) == id",
            "redis.call('PEXPIRE', lock, lease)",
        )
    } else {
        (
            "redis.call('HGET', lock, '~' .. id)",
            "redis.call('HSET', lock, '~' .. id, v)",
            "true",
            "if lease > redis.call('PTTL', lock) then redis.call('PEXPIRE', lock, lease) end",
        )
    };
    format!(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {{}}
for i = 1, #ARGV / 2 do
  local lock, holds = KEYS[2 * i - 1], KEYS[2 * i]
  local id, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local ok = 0
  local v = {get}
  if v then
    local f, rest, exp = string.match(v, '^(.*)(|%d+|%d+|%d+|%d+|)(%d+)$')
    if tonumber(exp) > now and {check} then
      v = f .. rest .. string.format('%.0f', now + lease)
      {set}
      {extend}
      ok = 1
    end
  end
  out[i] = ok
end
return out
"#
    )
}

/// Fenced register write. KEYS: register. ARGV: fence (or "" for none),
/// value, the register's channel (told of the change).
/// Fences are compared as decimal strings, not Lua numbers: a double holds
/// integers exactly only up to 2^53, and a token above it must still be
/// told from its neighbours.
const REGISTER_WRITE: &str = r#"
if ARGV[1] ~= '' then
  local f = redis.call('HGET', KEYS[1], 'f') or '0'
  local want = ARGV[1]
  if #want < #f or (#want == #f and want < f) then return 0 end
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'f', want)
else
  redis.call('HSET', KEYS[1], 'v', ARGV[2])
  redis.call('HSETNX', KEYS[1], 'f', '0')
end
redis.call('PUBLISH', ARGV[3], '1')
return 1
"#;

/// Versioned compare-and-set. KEYS: register. ARGV: expected fence,
/// value, the register's channel.
/// The versions are compared as decimal strings; the caller keeps them
/// below 2^53, where the increment is exact.
const REGISTER_SWAP: &str = r#"
local f = redis.call('HGET', KEYS[1], 'f') or '0'
if f ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'f', string.format('%.0f', tonumber(f) + 1))
redis.call('PUBLISH', ARGV[3], '1')
return 1
"#;

/// Fenced register decrement. KEYS: register. ARGV: by, the register's
/// channel. Returns the new
/// value, nil if missing or it would go below zero.
const REGISTER_DECREMENT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return nil end
local n = tonumber(v)
if not n or n ~= math.floor(n) or math.abs(n) > 9007199254740992 then
  return redis.error_reply('FENCED_NOT_INTEGER')
end
local by = tonumber(ARGV[1])
if n - by < 0 then return nil end
redis.call('HSET', KEYS[1], 'v', string.format('%.0f', n - by))
redis.call('PUBLISH', ARGV[2], '1')
return n - by
"#;

/// A counter's add: the register's integer plus ARGV[1], its version
/// (`f`) plus one, in one step. ARGV: delta, the register's channel.
/// Refuses (FENCED_NO_ADD) what Lua cannot count exactly, or what is not
/// a decimal integer: the client then changes it by compare-and-set,
/// which says why.
const REGISTER_ADD: &str = r#"
local v = redis.call('HGET', KEYS[1], 'v') or '0'
local n = string.match(v, '^%s*%-?%d+%s*$') and tonumber(v)
local limit = 9007199254740991
if not n or math.abs(n) > limit then return redis.error_reply('FENCED_NO_ADD') end
local r = n + tonumber(ARGV[1])
if math.abs(r) > limit then return redis.error_reply('FENCED_NO_ADD') end
local f = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
if not f or f >= limit then return redis.error_reply('FENCED_NO_ADD') end
redis.call('HSET', KEYS[1], 'v', string.format('%.0f', r), 'f', string.format('%.0f', f + 1))
redis.call('PUBLISH', ARGV[2], '1')
return r
"#;

/// Deletes a register and tells its watchers. KEYS: register. ARGV:
/// the register's channel. Returns 1 if it was there.
const REGISTER_DELETE: &str = r#"
local n = redis.call('DEL', KEYS[1])
if n == 1 then redis.call('PUBLISH', ARGV[1], '1') end
return n
"#;

/// A rate limiter's decision (see `spi::rate`) by the server's clock.
/// KEYS: the limiter's key, its TAT in µs. ARGV: cost, tolerance (µs).
/// Returns 0 when granted, else the µs to wait. The times stay below
/// 2^53, where Lua's numbers are exact; `TIME` in a script is allowed
/// since Redis replicates scripts by their effects.
const RATE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tat < now then tat = now end
local nxt = tat + tonumber(ARGV[1])
local from = nxt - tonumber(ARGV[2])
if from > now then return from - now end
redis.call('SET', KEYS[1], string.format('%.0f', nxt), 'PX', math.floor((nxt - now) / 1000) + 1)
return 0
"#;

/// The scripts of one layout.
pub(super) struct Scripts {
    pub(super) acquire: redis::Script,
    pub(super) release: redis::Script,
    /// [`cluster_release`] of `release`.
    pub(super) release_cluster: redis::Script,
    pub(super) abandon: redis::Script,
    pub(super) status: redis::Script,
    pub(super) force: redis::Script,
    pub(super) renew: redis::Script,
    pub(super) raise: redis::Script,
    pub(super) register_write: redis::Script,
    pub(super) register_decrement: redis::Script,
    pub(super) register_swap: redis::Script,
    pub(super) rate: redis::Script,
    pub(super) register_add: redis::Script,
    pub(super) register_delete: redis::Script,
}

impl Scripts {
    pub(super) fn new(simple: bool) -> Scripts {
        let layout = if simple { STRING_COMMON } else { HASH_COMMON };
        let with =
            |body: &str| redis::Script::new(&format!("{COMMON}{layout}{GRANT_COMMON}{body}"));
        // The `redisson` layout's hot paths run before the shared code.
        // (`instead` stands in for it in the `simple` layout.)
        let fast_text = |fast: &str, instead: &str, body: &str| {
            let fast = if simple { instead } else { fast };
            format!("{fast}{COMMON}{layout}{GRANT_COMMON}{body}")
        };
        let fast = |fast: &str, instead: &str, body: &str| {
            redis::Script::new(&fast_text(fast, instead, body))
        };
        let release = fast_text(FAST_RELEASE_HASH, NO_FAST_RELEASE, RELEASE);
        Scripts {
            acquire: fast(FAST_ACQUIRE_HASH, "", ACQUIRE),
            release: redis::Script::new(&release),
            release_cluster: redis::Script::new(&cluster_release(&release)),
            abandon: with(ABANDON),
            status: with(STATUS),
            force: with(FORCE),
            renew: redis::Script::new(&renew(simple)),
            raise: redis::Script::new(RAISE),
            register_write: redis::Script::new(REGISTER_WRITE),
            register_decrement: redis::Script::new(REGISTER_DECREMENT),
            register_swap: redis::Script::new(REGISTER_SWAP),
            rate: redis::Script::new(RATE),
            register_add: redis::Script::new(REGISTER_ADD),
            register_delete: redis::Script::new(REGISTER_DELETE),
        }
    }
}
