//! The Lua scripts of the Redis store: each change to a record is one script, which Redis
//! runs alone (see "Atomicity and fencing" in the store's module docs). Every name a
//! script touches is in `KEYS`, so that a cluster can route it, and on a cluster they
//! share one hash slot (`layout`).

use redis::Script;

use super::journal::JournalScripts;
use super::record::{lua_prelude, positioned};

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

/// The client budget's accounting ([`super::super::budget`]), kept by **expiry bucket**
/// rather than by record, so that a new key costs the same whatever the client holds,
/// and the accounting takes memory by the bucket, not by the record. A record counts in
/// the bucket of its registered expiry, `ceil(expiry / W)` (`W` =
/// [`COUNT_SLACK_MS`](crate::store::budget::COUNT_SLACK_MS), given to the scripts as
/// `BUCKET_MS`), until
/// the bucket's end (`bucket × W`, at most `W` after the record's expiry); it remembers
/// its bucket in its own `counted` field (`0`: not counted), where a result's size is
/// added. Two names per client:
///
/// - `ends` (a sorted set): the client's buckets, scored by their end;
/// - `counts` (a hash): `n:<bucket>` records and `s:<bucket>` bytes of results, and the
///   totals `*n`, `*s` over the buckets not yet forgotten.
///
/// A bucket is forgotten (its counts taken off the totals) once it has ended, when a new
/// bucket is opened or a count checks the budget. Both names live until the end of the
/// newest bucket plus two margins; their expiry is written only when a bucket opens.
/// On one server `begin` and `complete` keep them in the same script as the record; on a
/// cluster they live in the client's own slot and [`COUNT`], [`ACCOUNT`] keep them.
///
/// Its parts, in the order a script defines them (each script only the ones it calls:
/// a Lua function is made anew on every run of the script that defines it).
const BUDGET: [&str; 4] = [BUCKET_OF, BUDGET_CHECK, BUDGET_COUNT, BUDGET_SIZE];

/// The bucket of an expiry ([`BUDGET`]): `bucket_of`.
const BUCKET_OF: &str = r"
local function bucket_of(exp)
  return string.format('%d', math.ceil(tonumber(exp) / BUCKET_MS))
end
";

/// The budget's check ([`BUDGET`]): `budget_usage` and `budget_oldest`.
const BUDGET_CHECK: &str = r"
-- The client's usage at `now` without writing (a full server refuses writes that grow
-- memory before the record's own): its live records, their bytes, the ended buckets.
local function budget_usage(ends, counts, now)
  local gone = redis.call('ZRANGEBYSCORE', ends, '-inf', now)
  local t = redis.call('HMGET', counts, '*n', '*s')
  local live, bytes = tonumber(t[1] or '0'), tonumber(t[2] or '0')
  for _, b in ipairs(gone) do
    local c = redis.call('HMGET', counts, 'n:' .. b, 's:' .. b)
    live = live - tonumber(c[1] or '0')
    bytes = bytes - tonumber(c[2] or '0')
  end
  return live, bytes, gone
end
-- The end of the oldest live bucket, or `none`.
local function budget_oldest(ends, now, none)
  local oldest = redis.call('ZRANGEBYSCORE', ends, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return tonumber(oldest[2] or none)
end
";

/// The budget's count of a new record ([`BUDGET`]): `forget` and `budget_count`; needs
/// [`BUCKET_OF`] before it.
const BUDGET_COUNT: &str = r"
-- Forgets `gone`, the oldest buckets (a ZRANGEBYSCORE from -inf).
local function forget(ends, counts, gone)
  if #gone == 0 then return end
  local records, bytes = 0, 0
  for _, b in ipairs(gone) do
    local c = redis.call('HMGET', counts, 'n:' .. b, 's:' .. b)
    records = records + tonumber(c[1] or '0')
    bytes = bytes + tonumber(c[2] or '0')
    redis.call('HDEL', counts, 'n:' .. b, 's:' .. b)
  end
  redis.call('ZREMRANGEBYRANK', ends, 0, #gone - 1)
  redis.call('HINCRBY', counts, '*n', -records)
  if bytes ~= 0 then redis.call('HINCRBY', counts, '*s', -bytes) end
end
-- Counts a record expiring at `exp` at `now` (after forgetting `gone`, the buckets a
-- check found ended, when given); returns its bucket. Two commands, unless the bucket is
-- new: then up to 8 ended buckets are forgotten and both names made to outlive it.
local function budget_count(ends, counts, exp, now, gone, margin)
  if gone then forget(ends, counts, gone) end
  local b = bucket_of(exp)
  redis.call('HINCRBY', counts, '*n', 1)
  if redis.call('HINCRBY', counts, 'n:' .. b, 1) == 1 then
    local bucket_end = tonumber(b) * BUCKET_MS
    if not gone then
      forget(ends, counts, redis.call('ZRANGEBYSCORE', ends, '-inf', now, 'LIMIT', 0, 8))
    end
    redis.call('ZADD', ends, bucket_end, b)
    local until_ = bucket_end + 2 * tonumber(margin)
    if redis.call('PEXPIRETIME', ends) < until_ then
      redis.call('PEXPIREAT', ends, string.format('%d', until_))
      redis.call('PEXPIREAT', counts, string.format('%d', until_))
    end
  end
  return b
end
";

/// The budget's count of a stored result's bytes ([`BUDGET`]): `budget_size`.
const BUDGET_SIZE: &str = r"
-- Adds a result of `size` bytes to bucket `b`, unless the bucket has ended at `now`
-- (then it is, or will be, forgotten).
local function budget_size(counts, b, size, now)
  if tonumber(b) * BUCKET_MS > tonumber(now) then
    redis.call('HINCRBY', counts, 's:' .. b, size)
    redis.call('HINCRBY', counts, '*s', size)
  end
end
";

/// `client_usage`: KEYS[1] and KEYS[2] the client's `ends` and `counts` ([`BUDGET`]).
/// ARGV: now. Reads only. Returns `{live records, bytes, end of the oldest live bucket
/// or 0}`.
const USAGE: &str = r"
local live, bytes = budget_usage(KEYS[1], KEYS[2], ARGV[1])
return {live, bytes, budget_oldest(KEYS[1], ARGV[1], '0')}
";

/// A cluster's count of a record registered in another slot: KEYS[1] and KEYS[2] the
/// client's `ends` and `counts` ([`BUDGET`]). ARGV: the record's registered expiry,
/// now, margin. Returns its bucket.
const COUNT: &str = r"
return budget_count(KEYS[1], KEYS[2], ARGV[1], ARGV[2], nil, ARGV[3])
";

/// A cluster's record of a result's size stored in another slot: KEYS[1] the client's
/// `counts` ([`BUDGET`]). ARGV: the record's bucket, the result's size, now. Returns 1.
const ACCOUNT: &str = r"
budget_size(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
return 1
";

/// The start of `begin` (ARGV as there): the key's record, read into `cur`, and the
/// answer `{0, record}` when it is live and may not be taken (`Record::begin_over`: a
/// replay, a duplicate in flight), before the functions only a new or reclaimed record
/// needs are defined.
const BEGIN_FOUND: &str = r"
local cur = record(KEYS[1])
if cur[F.expires_at] and tonumber(cur[F.expires_at]) > tonumber(ARGV[1])
    and not (cur[F.state] == 'released' and cur[F.fingerprint] == ARGV[3]) then
  return {0, cur}
end
";

/// `begin`, after [`BEGIN_FOUND`]. KEYS[2] and KEYS[3] the client's `ends` and `counts`
/// ([`BUDGET`]) when it is counted here. ARGV: now, operation id, fingerprint, token,
/// lease end, TTL end, holds until, transactional, margin, prefix, then the budget:
/// empty (none), `count` (count without checking,
/// [`ClientBudget::COUNT_ONLY`](crate::store::ClientBudget::COUNT_ONLY)), `elsewhere` (a
/// cluster counts it in the client's slot: only its bucket is written), or the records
/// and bytes to check against (ARGV[11], ARGV[12]). Returns `{2}` when a new record was
/// written (exactly `Record::started`, which the caller builds itself), `{1, record}`
/// when a released record was reclaimed, `{0, record}` when it exists and may not be
/// taken (`Record::begin_over`, answered by [`BEGIN_FOUND`]), `{3, records, bytes, oldest
/// expiry}` when a new operation is over the client's budget.
const BEGIN: &str = r"
local now = ARGV[1]
local cur_exp = cur[F.expires_at]
if (not cur_exp) or tonumber(cur_exp) <= tonumber(now) then
  local budgeted = ARGV[11] ~= ''
  local here = budgeted and ARGV[11] ~= 'elsewhere'
  local gone = nil
  if here and ARGV[11] ~= 'count' then
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
    'counted', budgeted and bucket_of(exp) or '0')
  if cur_exp then
    redis.call('HDEL', KEYS[1], 'status', 'headers', 'body', 'reason', 'history')
  end
  expire(KEYS[1], exp, ARGV[9])
  if here then budget_count(KEYS[2], KEYS[3], exp, now, gone, ARGV[9]) end
  return {2}
end
if cur[F.state] == 'released' and cur[F.fingerprint] == ARGV[3] then
  local exp = later(later(cur_exp, ARGV[5]), ARGV[7])
  local n = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
  remember(KEYS[1], {attempt = n, began_at = tonumber(now), after = 'released'})
  redis.call('HSET', KEYS[1], 'state', 'processing', 'token', ARGV[4],
    'lease_until', ARGV[5], 'expires_at', exp, 'transactional', ARGV[8])
  redis.call('HDEL', KEYS[1], 'status', 'headers', 'body', 'reason')
  expire(KEYS[1], exp, ARGV[9])
  return {1, record(KEYS[1])}
end
return {0, cur}
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
/// Returns `{1, record}`, or `{0}` when the record is not parked at that attempt or its
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
return {1, record(KEYS[1])}
";

/// The condition of `complete` and `release`: processing under ARGV[2], live at ARGV[1].
/// Leaves `cur` for the script: state, token, lease end, `counted`, `staged`.
const LIVE_OWNER: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'counted', 'staged')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[2] or tonumber(ARGV[1]) >= tonumber(cur[3]) then
  return 0
end
";

/// `complete`. KEYS[2] the outbox of the record's slot, KEYS[3] the client's `counts`
/// ([`BUDGET`]) when it shares the record's slot (one server; absent on a cluster).
/// ARGV: now, token, status, headers, body, the result's size. Returns 0 when the lease
/// is lost, else the record's bucket (`0`: not counted), so that a cluster can add the
/// result's size to it in the client's slot.
const COMPLETE: &str = r"
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[3], 'headers', ARGV[4],
  'body', ARGV[5])
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
-- `counted`: the bucket the registration counted the record in ('0', or a record
-- written before the field existed: not counted).
local counted = cur[4] or '0'
if KEYS[3] and counted ~= '0' then budget_size(KEYS[3], counted, ARGV[6], ARGV[1]) end
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
return counted
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
/// record}`, or `{0}` when the record is not processing under the expected token, its
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
return {1, record(KEYS[1])}
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
        let bucket = format!(
            "local BUCKET_MS = {}\n",
            crate::store::budget::COUNT_SLACK_MS
        );
        // `record(key)`: a script that returns a record returns `record(KEYS[1])`, the
        // values of its fields in order, never the whole hash.
        let read = lua_prelude();
        let read = read.as_str();
        // The parts in order; `BUCKET_MS` before the first of the budget's.
        let with = |parts: &[&str]| {
            let mut text = String::new();
            for part in parts {
                if BUDGET.contains(part) && !text.contains("local BUCKET_MS") {
                    text.push_str(&bucket);
                }
                text.push_str(part);
            }
            Script::new(&positioned(&text))
        };
        let [bucket_of, check, count, size] = BUDGET;
        Scripts {
            begin: with(&[
                read,
                BEGIN_FOUND,
                PRELUDE,
                HISTORY,
                bucket_of,
                check,
                count,
                BEGIN,
            ]),
            complete: with(&[size, LIVE_OWNER, COMPLETE]),
            release: with(&[LIVE_OWNER, RELEASE]),
            renew: with(&[PRELUDE, CURRENT_OWNER, RENEW]),
            park: with(&[CURRENT_OWNER, PARK]),
            take_over: with(&[PRELUDE, read, HISTORY, TAKE_OVER]),
            purge: with(&[PURGE]),
            resolve: with(&[read, HISTORY, RESOLVE]),
            usage: with(&[check, USAGE]),
            count: with(&[bucket_of, count, COUNT]),
            account: with(&[size, ACCOUNT]),
            journal: JournalScripts::new(),
        }
    }
}
