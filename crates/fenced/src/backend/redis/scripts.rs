//! The Lua scripts: every state change of a lock is one script, so one
//! round trip, atomic on the server. They are sent by SHA (`EVALSHA`) and
//! loaded again on `NOSCRIPT` by [`redis::Script`].
//!
//! ## Keys of the lock named `N` (all in `N`'s cluster slot)
//!
//! | key | type | what |
//! |---|---|---|
//! | `N` | hash (`redisson`) or string (`simple`) | Redisson `RLock`'s layout: field `<client id>:<owner id>`, value the number of holds; or redis-py `Lock`'s: the holder's token |
//! | `redisson_lock_token:{N}` | string | the fencing counter (Redisson `RFencedLock`'s key); also numbers fair-queue tickets |
//! | `fenced_holds:{N}` | hash | per hold: `<field>\|<mode>\|<take>\|<max>\|<token>\|<expiry ms, server time>` |
//! | `fenced_queue:{N}` / `fenced_qexp:{N}` | sorted sets | fair waiters by ticket / by expiry |
//! | `fenced_register:{N}` | hash | the fenced register: `v` value, `f` highest fence |
//!
//! Expiry is by the server's clock (`TIME`), never a client's. Every key
//! but the counter expires with the last hold or waiter; the counter is
//! kept for a week and never issues less than the server's time in
//! microseconds, so tokens keep rising even if it is lost.

/// Functions and bindings every lock script shares. `KEYS`: lock, counter,
/// holds, queue, qexp.
const COMMON: &str = r#"
local lock, counter, holds, queue, qexp = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local COUNTER_TTL = 604800000

local function fmt(n) return string.format('%.0f', n) end

local function parse(id, v)
  local f, m, tk, mx, tok, exp = string.match(v, '^(.*)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$')
  return {id = id, field = f, mode = tonumber(m), take = tonumber(tk), max = tonumber(mx),
          token = tonumber(tok), exp = tonumber(exp)}
end

local function encode(h)
  return h.field .. '|' .. h.mode .. '|' .. h.take .. '|' .. h.max .. '|' .. fmt(h.token) .. '|' .. fmt(h.exp)
end

local function next_token(floor)
  local last = tonumber(redis.call('GET', counter) or '0') or 0
  local tok = math.max(last + 1, now_us, floor)
  redis.call('SET', counter, fmt(tok), 'PX', COUNTER_TTL)
  return tok
end

local function keep_until(key, ms)
  if ms > redis.call('PTTL', key) then redis.call('PEXPIRE', key, ms) end
end
"#;

/// The `redisson` layout: the lock is a hash of holder fields.
const HASH_COMMON: &str = r#"
local function drop_field(field)
  if redis.call('HINCRBY', lock, field, -1) <= 0 then redis.call('HDEL', lock, field) end
end

-- The live holds, after dropping expired ones. Fields with no hold of ours
-- are foreign holders (Redisson): exclusive until the key expires.
local function load()
  local live, mine, changed = {}, {}, false
  local raw = redis.call('HGETALL', holds)
  for i = 1, #raw, 2 do
    local h = parse(raw[i], raw[i + 1])
    if h.exp <= now or redis.call('HEXISTS', lock, h.field) == 0 then
      redis.call('HDEL', holds, h.id)
      if redis.call('HEXISTS', lock, h.field) == 1 then drop_field(h.field) end
      changed = true
    else
      table.insert(live, h)
      mine[h.field] = true
    end
  end
  local fields = redis.call('HKEYS', lock)
  if #fields > 0 then
    local ttl = redis.call('PTTL', lock)
    for _, f in ipairs(fields) do
      if not mine[f] then
        table.insert(live, {id = '', field = f, mode = 0, take = 0, max = 0, token = 0,
                            exp = now + math.max(ttl, 0)})
      end
    end
  end
  return live, changed
end

local function add_hold(h, lease)
  redis.call('HINCRBY', lock, h.field, 1)
  redis.call('HSET', holds, h.id, encode(h))
  keep_until(lock, lease)
  keep_until(holds, lease)
end

local function remove_hold(h)
  redis.call('HDEL', holds, h.id)
  if redis.call('HEXISTS', lock, h.field) == 1 then drop_field(h.field) end
end

local function hold_of(id)
  local v = redis.call('HGET', holds, id)
  if v then return parse(id, v) end
  return nil
end
"#;

/// The `simple` layout: the lock is a string holding the holder's token.
const STRING_COMMON: &str = r#"
local function load()
  local live, changed = {}, false
  local cur = redis.call('GET', lock)
  local raw = redis.call('HGETALL', holds)
  local seen = false
  for i = 1, #raw, 2 do
    local h = parse(raw[i], raw[i + 1])
    if h.exp <= now or cur ~= h.id then
      redis.call('HDEL', holds, h.id)
      changed = true
    else
      table.insert(live, h)
      seen = true
    end
  end
  if cur and not seen then
    local ttl = redis.call('PTTL', lock)
    if ttl < 0 then ttl = 2000 end
    table.insert(live, {id = '', field = cur, mode = 0, take = 0, max = 0, token = 0, exp = now + ttl})
  end
  return live, changed
end

local function add_hold(h, lease)
  redis.call('SET', lock, h.id, 'PX', lease)
  redis.call('HSET', holds, h.id, encode(h))
  keep_until(holds, lease)
end

local function remove_hold(h)
  redis.call('HDEL', holds, h.id)
  if redis.call('GET', lock) == h.id then redis.call('DEL', lock) end
end

local function hold_of(id)
  local v = redis.call('HGET', holds, id)
  if v then return parse(id, v) end
  if redis.call('GET', lock) == id then
    return {id = id, field = id, mode = 0, take = 0, max = 0, token = 0, exp = now + redis.call('PTTL', lock)}
  end
  return nil
end
"#;

/// Queue handling and the grant rule (the Lua twin of
/// `core::machine::grantable`).
const GRANT_COMMON: &str = r#"
local function purge_queue()
  local dead = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 200)
  if #dead > 0 then
    redis.call('ZREM', qexp, unpack(dead))
    redis.call('ZREM', queue, unpack(dead))
  end
end

local function grantable(live, field, mode, take, max)
  local used = 0
  for _, h in ipairs(live) do
    if h.mode == 2 and mode == 2 then used = used + h.take
    elseif h.mode == 2 or mode == 2 then return false
    elseif h.field == field then
    elseif h.mode == 1 and mode == 1 then
    else return false end
  end
  if mode == 2 then return used + take <= max end
  return true
end
"#;

/// Acquire. ARGV: field, hold id, mode, take, max, lease ms, fair, will
/// wait, ticket (or ""), channel, token floor, queue ttl ms.
/// Returns `{1, token}` or `{0, ticket or -1, ms until the first lease ends or -1}`.
const ACQUIRE: &str = r#"
local field, id, mode, take, max = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, fair, wait, ticket = tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8] == '1', ARGV[9]
local channel, floor, qttl = ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12])

-- A retry of an attempt whose reply was lost: the grant stands.
local again = redis.call('HGET', holds, id)
if again then
  local h = parse(id, again)
  if h.exp > now then return {1, h.token} end
end

local live, changed = load()
purge_queue()
local mine = nil
if ticket ~= '' and redis.call('ZSCORE', queue, ticket) then mine = ticket end
local head = redis.call('ZRANGE', queue, 0, 0)
local ahead
if mine then ahead = head[1] ~= mine else ahead = #head > 0 end

if (fair and ahead) or not grantable(live, field, mode, take, max) then
  local tk = -1
  if fair and wait then
    if mine then tk = tonumber(mine) else
      tk = next_token(0)
      redis.call('ZADD', queue, tk, fmt(tk))
    end
    redis.call('ZADD', qexp, now + qttl, fmt(tk))
    keep_until(queue, qttl)
    keep_until(qexp, qttl)
  end
  local soonest = -1
  for _, h in ipairs(live) do
    local left = h.exp - now
    if soonest < 0 or left < soonest then soonest = left end
  end
  if changed then redis.call('PUBLISH', channel, '0') end
  return {0, tk, soonest}
end

local token = next_token(floor)
add_hold({id = id, field = field, mode = mode, take = take, max = max, token = token, exp = now + lease}, lease)
if mine then
  redis.call('ZREM', queue, mine)
  redis.call('ZREM', qexp, mine)
  if redis.call('ZCARD', queue) > 0 then changed = true end
end
if changed then redis.call('PUBLISH', channel, '0') end
return {1, token}
"#;

/// Release. ARGV: hold id, channel. Returns 1 if the hold was live.
const RELEASE: &str = r#"
local h = hold_of(ARGV[1])
if not h then return 0 end
remove_hold(h)
redis.call('PUBLISH', ARGV[2], '0')
if h.exp <= now then return 0 end
return 1
"#;

/// Abandon: forget a queue place and any hold granted to it. ARGV: ticket
/// (or ""), hold id, channel.
const ABANDON: &str = r#"
local changed = false
if ARGV[1] ~= '' then
  if redis.call('ZREM', queue, ARGV[1]) > 0 then changed = true end
  redis.call('ZREM', qexp, ARGV[1])
end
local h = hold_of(ARGV[2])
if h then remove_hold(h); changed = true end
if changed then redis.call('PUBLISH', ARGV[3], '0') end
return 0
"#;

/// Status: `{last token, waiters, {field, mode, take, max, token, ms left}...}`.
const STATUS: &str = r#"
local live = load()
purge_queue()
local out = {tonumber(redis.call('GET', counter) or '0') or 0, redis.call('ZCARD', queue)}
for _, h in ipairs(live) do
  table.insert(out, {h.field, h.mode, h.take, h.max, h.token, h.exp - now})
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
fn renew(layout_check: &str) -> String {
    format!(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {{}}
for i = 1, #ARGV / 2 do
  local lock, holds = KEYS[2 * i - 1], KEYS[2 * i]
  local id, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local ok = 0
  local v = redis.call('HGET', holds, id)
  if v then
    local f, rest, exp = string.match(v, '^(.*)(|%d+|%d+|%d+|%d+|)(%d+)$')
    if tonumber(exp) > now and {layout_check} then
      redis.call('HSET', holds, id, f .. rest .. string.format('%.0f', now + lease))
      for _, k in ipairs({{lock, holds}}) do
        if lease > redis.call('PTTL', k) then redis.call('PEXPIRE', k, lease) end
      end
      ok = 1
    end
  end
  out[i] = ok
end
return out
"#
    )
}

/// Fenced register write. KEYS: register. ARGV: fence (or "" for none), value.
const REGISTER_WRITE: &str = r#"
if ARGV[1] ~= '' then
  local f = tonumber(redis.call('HGET', KEYS[1], 'f') or '0') or 0
  local want = tonumber(ARGV[1])
  if want < f then return 0 end
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'f', string.format('%.0f', want))
else
  redis.call('HSET', KEYS[1], 'v', ARGV[2])
  redis.call('HSETNX', KEYS[1], 'f', '0')
end
return 1
"#;

/// Fenced register decrement. KEYS: register. ARGV: by. Returns the new
/// value, nil if missing or it would go below zero.
const REGISTER_DECREMENT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return nil end
local n = tonumber(v)
if not n or n ~= math.floor(n) then return redis.error_reply('FENCED_NOT_INTEGER') end
local by = tonumber(ARGV[1])
if n - by < 0 then return nil end
redis.call('HSET', KEYS[1], 'v', string.format('%.0f', n - by))
return n - by
"#;

/// The scripts of one layout.
pub(super) struct Scripts {
    pub(super) acquire: redis::Script,
    pub(super) release: redis::Script,
    pub(super) abandon: redis::Script,
    pub(super) status: redis::Script,
    pub(super) force: redis::Script,
    pub(super) renew: redis::Script,
    pub(super) raise: redis::Script,
    pub(super) register_write: redis::Script,
    pub(super) register_decrement: redis::Script,
}

impl Scripts {
    pub(super) fn new(simple: bool) -> Scripts {
        let layout = if simple { STRING_COMMON } else { HASH_COMMON };
        let with =
            |body: &str| redis::Script::new(&format!("{COMMON}{layout}{GRANT_COMMON}{body}"));
        let check = if simple {
            "redis.call('GET', lock) == id"
        } else {
            "redis.call('HEXISTS', lock, f) == 1"
        };
        Scripts {
            acquire: with(ACQUIRE),
            release: with(RELEASE),
            abandon: with(ABANDON),
            status: with(STATUS),
            force: with(FORCE),
            renew: redis::Script::new(&renew(check)),
            raise: redis::Script::new(RAISE),
            register_write: redis::Script::new(REGISTER_WRITE),
            register_decrement: redis::Script::new(REGISTER_DECREMENT),
        }
    }
}
