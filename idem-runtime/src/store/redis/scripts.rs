//! The Lua scripts of the Redis store: each change to a record is one script, which Redis
//! runs alone (see "Atomicity and fencing" in the store's module docs). Every name a
//! script touches is in `KEYS`, so that a cluster can route it, and on a cluster they
//! share one hash slot (`layout`).

use redis::Script;

use super::journal::JournalScripts;

/// How many expired names of a client's budget a registration that only counts forgets
/// at most ([`BUDGET`]): one new key adds one name, so a backlog drains.
pub(super) const FORGET_BATCH: usize = 8;

/// Lua helpers every script starts with. Times travel as decimal strings and are compared
/// as numbers (exact up to 2^53 ms, the year 287 396); the larger of two is written back
/// as the string it came in.
const PRELUDE: &str = r"
local function later(a, b)
  if tonumber(b) > tonumber(a) then return b end
  return a
end
local function expire(key, at, margin)
  redis.call('PEXPIREAT', key, string.format('%d', tonumber(at) + tonumber(margin)))
end
";

/// The client budget's accounting ([`super::super::budget`]): `names`, the client's
/// records (a sorted set of their hash names, scored by the expiry each was registered
/// with), and `sizes`, their results' sizes (a hash: a size per name, the total under
/// `*`). Both expire with the client's last record. On one server `begin` and `complete`
/// keep them in the same script as the record; on a cluster they live in the client's
/// own slot and [`COUNT`], [`ACCOUNT`] keep them beside it.
///
/// The cost is per new key, so it is kept small: the expiries are written only when they
/// must grow (once a margin, as `now` advances; `PEXPIRETIME` is Redis 7), and a registration
/// that only counts ([`ClientBudget::COUNT_ONLY`](crate::store::ClientBudget::COUNT_ONLY))
/// forgets at most [`FORGET_BATCH`] expired names, and only when the oldest has expired.
const BUDGET: &str = r"
-- Makes the client's names live at least until `at` plus a margin: when they would end
-- sooner, both until `at` plus two margins, so that the next keys find them long enough.
-- The sizes are made here (total 0) when missing, so that they always expire with the
-- names and a completion need not look at their expiry.
local function expire_past(names, sizes, at, margin)
  local want = tonumber(at) + tonumber(margin)
  if redis.call('PEXPIRETIME', names) < want then
    local until_ = string.format('%d', want + tonumber(margin))
    redis.call('PEXPIREAT', names, until_)
    redis.call('HSETNX', sizes, '*', '0')
    redis.call('PEXPIREAT', sizes, until_)
  end
end
-- The client's usage at `now` without writing (a full server refuses writes that grow
-- memory before the record's own): its live records, their bytes, the expired names.
local function budget_usage(names, sizes, now)
  local gone = redis.call('ZRANGEBYSCORE', names, '-inf', now)
  local live = redis.call('ZCARD', names) - #gone
  local bytes = tonumber(redis.call('HGET', sizes, '*') or '0')
  for _, name in ipairs(gone) do
    bytes = bytes - tonumber(redis.call('HGET', sizes, name) or '0')
  end
  return live, bytes, gone
end
-- When the oldest live record expires, or `none`.
local function budget_oldest(names, now, none)
  local oldest = redis.call('ZRANGEBYSCORE', names, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return tonumber(oldest[2] or none)
end
-- Forgets `gone`, the lowest-scored names of the set (a ZRANGEBYSCORE from -inf), and
-- their sizes.
local function forget(names, sizes, gone)
  if #gone == 0 then return end
  local freed = 0
  for _, name in ipairs(gone) do
    freed = freed + tonumber(redis.call('HGET', sizes, name) or '0')
    redis.call('HDEL', sizes, name)
  end
  redis.call('ZREMRANGEBYRANK', names, 0, #gone - 1)
  if freed ~= 0 then redis.call('HINCRBY', sizes, '*', -freed) end
end
-- Counts the record `member`, expiring at `exp`, after forgetting `gone`.
local function budget_count(names, sizes, member, exp, gone, margin)
  forget(names, sizes, gone)
  redis.call('ZADD', names, exp, member)
  expire_past(names, sizes, exp, margin)
end
-- The names expired at `now` that a count-only registration forgets: none unless the
-- oldest has expired, and then a bounded batch.
local function budget_gone(names, now, batch)
  local oldest = redis.call('ZRANGE', names, 0, 0, 'WITHSCORES')
  if oldest[2] and tonumber(oldest[2]) <= tonumber(now) then
    return redis.call('ZRANGEBYSCORE', names, '-inf', now, 'LIMIT', 0, batch)
  end
  return {}
end
-- Records the size of `member`'s result (a counted record's): two commands for a first
-- result, four when it replaces one.
local function budget_size(sizes, member, size)
  if redis.call('HSETNX', sizes, member, size) == 1 then
    redis.call('HINCRBY', sizes, '*', size)
  else
    local old = tonumber(redis.call('HGET', sizes, member) or '0')
    redis.call('HSET', sizes, member, size)
    redis.call('HINCRBY', sizes, '*', tonumber(size) - old)
  end
end
";

/// `client_usage`: KEYS[1] and KEYS[2] the client's records and sizes ([`BUDGET`]).
/// ARGV: now. Reads only. Returns `{live records, bytes, oldest live expiry or 0}`.
const USAGE: &str = r"
local live, bytes = budget_usage(KEYS[1], KEYS[2], ARGV[1])
return {live, bytes, budget_oldest(KEYS[1], ARGV[1], '0')}
";

/// A cluster's count of a record registered in another slot: KEYS[1] and KEYS[2] the
/// client's records and sizes ([`BUDGET`]). ARGV: the record's name, now, its expiry,
/// margin, the most expired names to forget. Returns 1.
const COUNT: &str = r"
local gone = budget_gone(KEYS[1], ARGV[2], ARGV[5])
budget_count(KEYS[1], KEYS[2], ARGV[1], ARGV[3], gone, ARGV[4])
return 1
";

/// A cluster's record of a result's size stored in another slot: KEYS[1] and KEYS[2] the
/// client's records and sizes ([`BUDGET`]). ARGV: the record's name, the result's size.
/// Returns 1.
const ACCOUNT: &str = r"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then budget_size(KEYS[2], ARGV[1], ARGV[2]) end
return 1
";

/// `begin`. ARGV: now, operation id, fingerprint, token, lease end, TTL end, holds until,
/// transactional, margin, prefix, the budget's records and bytes (both empty: no budget;
/// `count` and empty: count without checking,
/// [`ClientBudget::COUNT_ONLY`](super::ClientBudget::COUNT_ONLY)), the most expired names
/// a count forgets. Returns `{2}` when a new record was written (exactly
/// `Record::started`, which the caller builds itself), `{1, fields}` when a released
/// record was reclaimed, `{0, fields}` when it exists and may not be taken
/// (`Record::begin_over`), `{3, records, bytes, oldest expiry}` when a new operation is
/// over the client's budget.
const BEGIN: &str = r"
local now = ARGV[1]
local cur = redis.call('HMGET', KEYS[1], 'expires_at', 'state', 'fingerprint')
if (not cur[1]) or tonumber(cur[1]) <= tonumber(now) then
  local budgeted = ARGV[11] ~= ''
  local gone = {}
  if ARGV[11] == 'count' then
    gone = budget_gone(KEYS[2], now, ARGV[13])
  elseif budgeted then
    local live, bytes
    live, bytes, gone = budget_usage(KEYS[2], KEYS[3], now)
    if live >= tonumber(ARGV[11]) or bytes >= tonumber(ARGV[12]) then
      return {3, live, bytes, budget_oldest(KEYS[2], now, now)}
    end
  end
  -- HSET first, not DEL: a full server (noeviction) refuses a script's first write that
  -- may grow memory, and lets every write after any first write through.
  local exp = later(later(ARGV[6], ARGV[5]), ARGV[7])
  redis.call('HSET', KEYS[1], 'operation_id', ARGV[2], 'fingerprint', ARGV[3],
    'state', 'processing', 'attempt', '1', 'token', ARGV[4], 'lease_until', ARGV[5],
    'created_at', now, 'expires_at', exp, 'transactional', ARGV[8], 'prefix', ARGV[10],
    'counted', budgeted and '1' or '0')
  if cur[1] then
    redis.call('HDEL', KEYS[1], 'status', 'headers', 'body', 'reason', 'history')
  end
  expire(KEYS[1], exp, ARGV[9])
  if budgeted then budget_count(KEYS[2], KEYS[3], KEYS[1], exp, gone, ARGV[9]) end
  return {2}
end
if cur[2] == 'released' and cur[3] == ARGV[3] then
  local exp = later(later(cur[1], ARGV[5]), ARGV[7])
  local n = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
  remember(KEYS[1], {attempt = n, began_at = tonumber(now), after = 'released'})
  redis.call('HSET', KEYS[1], 'state', 'processing', 'token', ARGV[4],
    'lease_until', ARGV[5], 'expires_at', exp, 'transactional', ARGV[8])
  redis.call('HDEL', KEYS[1], 'status', 'headers', 'body', 'reason')
  expire(KEYS[1], exp, ARGV[9])
  return {1, redis.call('HGETALL', KEYS[1])}
end
return {0, redis.call('HGETALL', KEYS[1])}
";

/// Appends an event (a Lua table) to the record's `history`, keeping the last 32 (see
/// `store::ops`).
const HISTORY: &str = r"
local function remember(key, event)
  local h = redis.call('HGET', key, 'history')
  local events = {}
  if h then events = cjson.decode(h) end
  table.insert(events, event)
  while #events > 32 do table.remove(events, 1) end
  redis.call('HSET', key, 'history', cjson.encode(events))
end
";

/// `resolve`. ARGV: now, the attempt seen parked, the new state, status, headers, body
/// (the last three empty when not applied), the resolution's event (JSON), margin.
/// Returns `{1, fields}`, or `{0}` when the record is not parked at that attempt or its
/// TTL has passed.
const RESOLVE: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'expires_at', 'reason')
if cur[1] ~= 'unknown' or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= tonumber(ARGV[1]) then
  return {0}
end
local event = cjson.decode(ARGV[7])
event['parked'] = cur[4] or ''
remember(KEYS[1], event)
if ARGV[3] == 'completed' then
  redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[4], 'headers', ARGV[5],
    'body', ARGV[6])
else
  redis.call('HSET', KEYS[1], 'state', 'released')
end
redis.call('HDEL', KEYS[1], 'reason')
return {1, redis.call('HGETALL', KEYS[1])}
";

/// The condition of `complete` and `release`: processing under ARGV[2], live at ARGV[1].
/// Leaves `cur` for the script: state, token, lease end, `counted`, `staged`.
const LIVE_OWNER: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'counted', 'staged')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[2] or tonumber(ARGV[1]) >= tonumber(cur[3]) then
  return 0
end
";

/// `complete`. KEYS[2] the outbox of the record's slot, KEYS[3] and KEYS[4] the client's
/// records and sizes ([`BUDGET`]) when they share the record's slot (one server; absent
/// on a cluster). ARGV: now, token, status, headers, body, the result's size. Returns 1,
/// or 0 when the lease is lost. The size is counted for the client's budget when the
/// record is counted.
const COMPLETE: &str = r"
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[3], 'headers', ARGV[4],
  'body', ARGV[5])
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
-- `counted`: the registration counted the record for its client's budget (a record
-- written before the field existed is not counted for its result's size).
if KEYS[4] and cur[4] == '1' then budget_size(KEYS[4], KEYS[1], ARGV[6]) end
-- The operation's staged deliveries (its journal's `staged` positions) become due with
-- a success; after anything else they never go.
local staged = cur[5]
if staged then
  local status = tonumber(ARGV[3])
  if status >= 200 and status < 300 then
    for index in string.gmatch(staged, '%d+') do
      redis.call('ZADD', KEYS[2], 0, index .. ':' .. KEYS[1])
    end
  end
  redis.call('HDEL', KEYS[1], 'staged')
end
return 1
";

/// `release`. ARGV: now, token.
const RELEASE: &str = r"
redis.call('HSET', KEYS[1], 'state', 'released')
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
return 1
";

/// The condition of `renew` and `park_unknown`: processing under ARGV[2], live or not.
const CURRENT_OWNER: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires_at')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[2] then
  return 0
end
";

/// `renew`. ARGV: now, token, until, margin.
const RENEW: &str = r"
local exp = later(cur[3], ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until', ARGV[3], 'expires_at', exp)
expire(KEYS[1], exp, ARGV[4])
return 1
";

/// `park_unknown`. ARGV: now, token, reason.
const PARK: &str = r"
redis.call('HSET', KEYS[1], 'state', 'unknown', 'reason', ARGV[3])
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
return 1
";

/// `take_over`. ARGV: now, expected token, new token, new lease end, margin. Returns `{1,
/// fields}`, or `{0}` when the record is not processing under the expected token, its
/// lease is live, or its TTL has passed.
const TAKE_OVER: &str = r"
local now = tonumber(ARGV[1])
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'expires_at')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[2] or now < tonumber(cur[3])
    or tonumber(cur[4]) <= now then
  return {0}
end
local exp = later(cur[4], ARGV[4])
local n = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
remember(KEYS[1], {attempt = n, began_at = now, after = 'lease-ended',
  lease_until = tonumber(cur[3])})
redis.call('HSET', KEYS[1], 'token', ARGV[3], 'lease_until', ARGV[4], 'expires_at', exp)
expire(KEYS[1], exp, ARGV[5])
return {1, redis.call('HGETALL', KEYS[1])}
";

/// `purge_expired`, for one batch of names. ARGV: now, prefix. Deletes only the records
/// this prefix wrote (`SCAN` for `a:*` also finds prefix `a:b`'s names). Returns how many
/// were deleted.
const PURGE: &str = r"
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok == 'hash' then
    local cur = redis.call('HMGET', key, 'expires_at', 'prefix')
    local exp = cur[1]
    if exp and cur[2] == ARGV[2] and tonumber(exp) <= tonumber(ARGV[1]) then
      redis.call('DEL', key)
      n = n + 1
    end
  end
end
return n
";

/// The scripts, loaded by their SHA-1 (`EVALSHA`, falling back to `EVAL` once per server
/// that lacks them).
pub(super) struct Scripts {
    pub(super) begin: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) park: Script,
    pub(super) take_over: Script,
    pub(super) purge: Script,
    pub(super) resolve: Script,
    pub(super) usage: Script,
    pub(super) count: Script,
    pub(super) account: Script,
    pub(super) journal: JournalScripts,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let with = |parts: &[&str]| Script::new(&parts.concat());
        Scripts {
            begin: with(&[PRELUDE, HISTORY, BUDGET, BEGIN]),
            complete: with(&[BUDGET, LIVE_OWNER, COMPLETE]),
            release: with(&[LIVE_OWNER, RELEASE]),
            renew: with(&[PRELUDE, CURRENT_OWNER, RENEW]),
            park: with(&[CURRENT_OWNER, PARK]),
            take_over: with(&[PRELUDE, HISTORY, TAKE_OVER]),
            purge: with(&[PURGE]),
            resolve: with(&[HISTORY, RESOLVE]),
            usage: with(&[BUDGET, USAGE]),
            count: with(&[BUDGET, COUNT]),
            account: with(&[BUDGET, ACCOUNT]),
            journal: JournalScripts::new(),
        }
    }
}
