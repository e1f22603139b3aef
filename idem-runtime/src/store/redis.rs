//! The Redis store: shared by many instances, not transactional with business data
//! (feature `redis`). Valkey speaks the same protocol; the conformance suite has run
//! against Redis 7 only.
//!
//! ```no_run
//! # async fn start() -> Result<(), idem_runtime::store::StoreError> {
//! use idem_runtime::{Idem, identity, store::RedisStore};
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let idem = Idem::new(store, identity::header("x-client-id"));
//! # let _ = idem;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! One Redis hash per key, named `<prefix>:<operation>:<client length>:<client>:<key>`
//! (prefix `idem` unless [`RedisStore::with_prefix`] says otherwise). The name is
//! unambiguous whatever the parts hold: `%` and `:` in the prefix and the operation are
//! written `%25` and `%3A`, so that the first two `:` end them, and the client's length
//! says where the client ends and the key begins. Its fields are
//! the columns of the SQL stores: `operation_id`, `fingerprint`, `state`, `attempt`,
//! `token` and `lease_until` while processing, `created_at`, `expires_at` (unix
//! milliseconds, decimal), `transactional` (`0`), `status`, `headers` (JSON, as the SQL
//! stores write them) and `body` once completed, `reason` once parked; `prefix` (the
//! store's prefix, so that [`OperatorStore::purge_expired`] deletes only its own records:
//! the names of prefix `a:b` also start with `a:`); `history` once the record was
//! reclaimed, taken over or resolved (the JSON array of [`super::ops`], written by the
//! same script); `step:<position>` for each step of the operation's journal, and `staged`
//! until a completion moves staged deliveries to the outbox (`<prefix>/outbox`, a sorted
//! set outside the records' names; see the journal's module, `store/redis/journal.rs`).
//!
//! [`OperatorStore::list`] scans the prefix (or the operation's names) and sorts what it
//! finds: a tool for operators and the reconciler, whose cost grows with the number of
//! records.
//!
//! # Atomicity and fencing
//!
//! Registration is one script that inserts the record when the key is free (or its TTL has
//! passed) and reclaims it when it is released with the same fingerprint; it answers with
//! the record it found, so a replay costs one round trip. `complete`, `release`, `renew`,
//! `park_unknown` and `take_over` are each one script that compares the owner token (and,
//! where the rule needs it, the lease's end) and writes only if it matches: Redis runs a
//! script alone, so the comparison and the write are one step, and an owner whose lease
//! ended cannot overwrite what a takeover decided. Time is the caller's `now`, as for
//! every store; Redis's own clock is used only to forget keys (below).
//!
//! # Expiry
//!
//! Every write sets the hash to expire (`PEXPIREAT`) at the record's `expires_at` plus
//! [`EXPIRY_MARGIN_MS`], by Redis's clock: Redis forgets records on its own, and a service
//! whose clock runs up to that margin behind Redis's never sees a record vanish before
//! its TTL. [`OperatorStore::purge_expired`] also scans the prefix and deletes what has
//! expired by the caller's clock; a service on Redis does not need to run it.
//!
//! # What it does not guarantee
//!
//! - **Not transactional with business data.** The business write (in the service's own
//!   database) and the record's completion are two writes. A process that dies between
//!   them leaves the record processing with an effect already made: after the lease ends
//!   the next retry or status lookup runs the contract's recovery (its reconcile
//!   function), which must find the effect by the operation id and answer `applied`.
//!   Handlers answer a retryable status only before their effect, as in every
//!   non-transactional mode.
//! - **Eviction.** Run Redis with `maxmemory-policy noeviction` (the default). Any other
//!   policy lets Redis drop a record under memory pressure before its TTL: the retry that
//!   follows finds no record and runs the operation a second time. With `noeviction` a
//!   full Redis refuses writes instead, and idem answers 503 (fail closed): no new key is
//!   registered, so no handler runs; an attempt already running cannot store its result,
//!   answers 503 `store-unavailable`, and its key is decided by recovery once there is
//!   room.
//!   [`RedisStore::connect`] logs a warning when the server says it evicts.
//! - **Durability and failover.** A record lives as long as Redis keeps it: without
//!   persistence (`appendonly yes`, `appendfsync always` for the strictest) a restart
//!   forgets completed keys, and an asynchronous replica promoted after a failover may lack
//!   the last writes. Either turns a retry of a forgotten key into a new operation (an
//!   attempt running across the restart finds its record gone, answers 503
//!   `attempt-timed-out`, and its retry runs again). Use
//!   the PostgreSQL store where that is not acceptable.
//! - **One server.** Every script touches one key, but [`OperatorStore::purge_expired`]
//!   scans one server: a primary (with replicas or Sentinel) is supported, Redis Cluster
//!   is not.
//!
//! # Faults
//!
//! The connection is a [`ConnectionManager`]: one multiplexed connection, re-established
//! after it breaks, without restarting the service. Every call is bounded by the call
//! timeout ([`RedisStore::with_call_timeout`], 2 s by default); a server that is down, slow
//! or refuses a write fails the call with [`StoreError::Unavailable`], which idem answers
//! with 503 and `Retry-After`, running no handler without its record. A call that timed
//! out, or whose connection broke after it was sent, may still be carried out by the
//! server: its error says so ([`StoreError::is_outcome_unknown`]). A hash that cannot be
//! read back as a record fails with [`StoreError::Corrupt`].

mod journal;

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError, Script, Value};

use super::headers::{decode_headers, encode_headers};
use super::open::Bounds;
use super::ops::{self, Event};
use super::{
    Begin, ClientUsage, DEFAULT_MAX_RESULT, Inspection, Lease, ListQuery, Listed, NewRecord,
    OperationState, OperatorStore, OverBudget, OwnerToken, Record, RecordKey, RecordState,
    RecordStore, Resolution, ResolutionOutcome, Step, StepWrite, StoreError, StoredResponse,
    UnixMillis, Usage, check_size,
    journal::{Delivery, Due},
};
use crate::OperationId;

/// How long after its `expires_at` (by Redis's clock) a record's hash is forgotten by Redis
/// itself, in milliseconds: one minute of tolerance for clocks that disagree.
pub const EXPIRY_MARGIN_MS: u64 = 60_000;

/// The prefix of every hash name unless [`RedisStore::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "idem";

/// The bound on every call unless [`RedisStore::with_call_timeout`] says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How many names one `SCAN` step of [`OperatorStore::purge_expired`] asks for.
const SCAN_BATCH: usize = 500;

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

/// The client budget's accounting ([`super::budget`]), for `begin` and `complete`: KEYS[2]
/// the client's records (a sorted set of their hash names, scored by the expiry each was
/// registered with), KEYS[3] their results' sizes (a hash: a size per name, the total
/// under `*`). Both expire with the client's last record.
const BUDGET: &str = r"
local function budget_expire(margin)
  local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if top[2] then
    expire(KEYS[2], top[2], margin)
    expire(KEYS[3], top[2], margin)
  end
end
-- The client's usage at `now` without writing (a full server refuses writes that grow
-- memory before the record's own): its live records, their bytes, the expired names.
local function budget_usage(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  local live = redis.call('ZCARD', KEYS[2]) - #gone
  local bytes = tonumber(redis.call('HGET', KEYS[3], '*') or '0')
  for _, name in ipairs(gone) do
    bytes = bytes - tonumber(redis.call('HGET', KEYS[3], name) or '0')
  end
  return live, bytes, gone
end
-- Counts the record KEYS[1], expiring at `exp`, after forgetting the expired ones.
local function budget_count(now, exp, gone, margin)
  local freed = 0
  for _, name in ipairs(gone) do
    freed = freed + tonumber(redis.call('HGET', KEYS[3], name) or '0')
    redis.call('HDEL', KEYS[3], name)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if freed ~= 0 then redis.call('HINCRBY', KEYS[3], '*', -freed) end
  redis.call('ZADD', KEYS[2], exp, KEYS[1])
  budget_expire(margin)
end
";

/// `client_usage`: KEYS[1] and KEYS[2] the client's records and sizes ([`BUDGET`]).
/// ARGV: now. Reads only. Returns `{live records, bytes, oldest live expiry or 0}`.
const USAGE: &str = r"
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local live = redis.call('ZCARD', KEYS[1]) - #gone
local bytes = tonumber(redis.call('HGET', KEYS[2], '*') or '0')
for _, name in ipairs(gone) do
  bytes = bytes - tonumber(redis.call('HGET', KEYS[2], name) or '0')
end
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
return {live, bytes, tonumber(oldest[2] or '0')}
";

/// `begin`. ARGV: now, operation id, fingerprint, token, lease end, TTL end, holds until,
/// transactional, margin, prefix, the budget's records and bytes (empty: no budget).
/// Returns `{2}` when a new record was written (exactly `Record::started`, which the
/// caller builds itself), `{1, fields}` when a released record was reclaimed, `{0,
/// fields}` when it exists and may not be taken (`Record::begin_over`), `{3, records,
/// bytes, oldest expiry}` when a new operation is over the client's budget.
const BEGIN: &str = r"
local now = ARGV[1]
local cur = redis.call('HMGET', KEYS[1], 'expires_at', 'state', 'fingerprint')
if (not cur[1]) or tonumber(cur[1]) <= tonumber(now) then
  local budgeted = ARGV[11] ~= ''
  local gone = {}
  if budgeted then
    local live, bytes
    live, bytes, gone = budget_usage(now)
    if live >= tonumber(ARGV[11]) or bytes >= tonumber(ARGV[12]) then
      local oldest = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      return {3, live, bytes, tonumber(oldest[2] or now)}
    end
  end
  -- HSET first, not DEL: a full server (noeviction) refuses a script's first write that
  -- may grow memory, and lets every write after any first write through.
  local exp = later(later(ARGV[6], ARGV[5]), ARGV[7])
  redis.call('HSET', KEYS[1], 'operation_id', ARGV[2], 'fingerprint', ARGV[3],
    'state', 'processing', 'attempt', '1', 'token', ARGV[4], 'lease_until', ARGV[5],
    'created_at', now, 'expires_at', exp, 'transactional', ARGV[8], 'prefix', ARGV[10])
  if cur[1] then
    redis.call('HDEL', KEYS[1], 'status', 'headers', 'body', 'reason', 'history')
  end
  expire(KEYS[1], exp, ARGV[9])
  if budgeted then budget_count(now, exp, gone, ARGV[9]) end
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
const LIVE_OWNER: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[2] or tonumber(ARGV[1]) >= tonumber(cur[3]) then
  return 0
end
";

/// `complete`. ARGV: now, token, status, headers, body, the result's size, margin.
/// Returns 1, or 0 when the lease is lost. The size is counted for the client's budget
/// when the record is counted (KEYS[2], KEYS[3]: [`BUDGET`]).
const COMPLETE: &str = r"
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[3], 'headers', ARGV[4],
  'body', ARGV[5])
redis.call('HDEL', KEYS[1], 'token', 'lease_until')
if redis.call('ZSCORE', KEYS[2], KEYS[1]) then
  local old = tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or '0')
  redis.call('HSET', KEYS[3], KEYS[1], ARGV[6])
  redis.call('HINCRBY', KEYS[3], '*', tonumber(ARGV[6]) - old)
  budget_expire(ARGV[7])
end
-- The operation's staged deliveries (its journal's `staged` positions) become due with
-- a success; after anything else they never go.
local staged = redis.call('HGET', KEYS[1], 'staged')
if staged then
  local status = tonumber(ARGV[3])
  if status >= 200 and status < 300 then
    for index in string.gmatch(staged, '%d+') do
      redis.call('ZADD', KEYS[4], 0, index .. ':' .. KEYS[1])
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
struct Scripts {
    begin: Script,
    complete: Script,
    release: Script,
    renew: Script,
    park: Script,
    take_over: Script,
    purge: Script,
    resolve: Script,
    usage: Script,
    journal: journal::JournalScripts,
}

impl Scripts {
    fn new() -> Scripts {
        let with = |parts: &[&str]| Script::new(&parts.concat());
        Scripts {
            begin: with(&[PRELUDE, HISTORY, BUDGET, BEGIN]),
            complete: with(&[PRELUDE, BUDGET, LIVE_OWNER, COMPLETE]),
            release: with(&[LIVE_OWNER, RELEASE]),
            renew: with(&[PRELUDE, CURRENT_OWNER, RENEW]),
            park: with(&[CURRENT_OWNER, PARK]),
            take_over: with(&[PRELUDE, HISTORY, TAKE_OVER]),
            purge: with(&[PURGE]),
            resolve: with(&[HISTORY, RESOLVE]),
            usage: with(&[USAGE]),
            journal: journal::JournalScripts::new(),
        }
    }
}

/// A [`Store`](super::Store) in Redis (or Valkey), shared by every instance of a service:
/// see the [module docs](self) for the layout, the guarantees and what Redis's
/// configuration does to them.
///
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    max_result: usize,
    call_timeout: Duration,
    scripts: std::sync::Arc<Scripts>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("max_result", &self.max_result)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` for TLS where the `redis` crate is built with it) and checks that it
    /// answers.
    ///
    /// # Default
    ///
    /// - prefix [`DEFAULT_PREFIX`], results of up to [`DEFAULT_MAX_RESULT`] bytes;
    /// - every call bounded by [`DEFAULT_CALL_TIMEOUT`]; a new connection waits at most
    ///   1 s, and a broken one is re-established in the background (a few tries, 100 to
    ///   500 ms apart, then again at the next call).
    ///
    /// Logs a warning when the server's `maxmemory-policy` is not `noeviction` (see
    /// "What it does not guarantee" in the [module docs](self)); a server that refuses
    /// `CONFIG GET` (a managed service) is not checked.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is malformed or the server cannot be
    /// reached, refuses the login or does not answer within the call timeout.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_within(url, None).await
    }

    /// [`RedisStore::connect`], bounded by `bounds` when given
    /// (`store::OpenOptions::timeout`): connecting and each answer the connection
    /// awaits take at most `bounds.limit`, every call `bounds.call`, and the socket
    /// probes a silent peer (TCP keepalive after `bounds.limit` idle; on Linux, data
    /// unacknowledged for `bounds.limit` closes the connection).
    pub(crate) async fn connect_within(
        url: &str,
        bounds: Option<Bounds>,
    ) -> Result<RedisStore, StoreError> {
        let (connect, response, call) = match bounds {
            Some(b) => (b.limit, b.limit, b.call),
            None => (
                Duration::from_secs(1),
                DEFAULT_CALL_TIMEOUT,
                DEFAULT_CALL_TIMEOUT,
            ),
        };
        let mut info = url
            .into_connection_info()
            .map_err(StoreError::unavailable)?;
        if let Some(bounds) = bounds {
            info = info.set_tcp_settings(probing(bounds.limit));
        }
        let client = redis::Client::open(info).map_err(StoreError::unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_millis(500));
        let conn = tokio::time::timeout(call, ConnectionManager::new_with_config(client, config))
            .await
            .map_err(|_| StoreError::unavailable("the Redis server did not answer in time"))?
            .map_err(StoreError::unavailable)?;
        let store = RedisStore::from_connection(conn).with_call_timeout(call);
        // The connection alone proves little: a server that wants a password accepts it
        // without one and refuses every command after (`NOAUTH`).
        let mut conn = store.conn.clone();
        let _: Value = store
            .bounded(redis::cmd("PING").query_async(&mut conn))
            .await?;
        store.warn_if_evicting().await;
        Ok(store)
    }

    /// A store over a connection the application configured (its own timeouts, TLS,
    /// credentials). Runs no command.
    pub fn from_connection(conn: ConnectionManager) -> RedisStore {
        RedisStore {
            conn,
            prefix: DEFAULT_PREFIX.to_owned(),
            max_result: DEFAULT_MAX_RESULT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            scripts: std::sync::Arc::new(Scripts::new()),
        }
    }

    /// The same store, naming its hashes `<prefix>:…`: several services (or tests) can
    /// share one Redis database without seeing each other's keys. Any text works; the
    /// characters `SCAN` patterns treat specially are escaped where it matters, and
    /// [`OperatorStore::purge_expired`] deletes only records written under this very prefix.
    ///
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisStore {
        self.prefix = prefix.into();
        self
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`]; [`DEFAULT_MAX_RESULT`] unless set): a larger one is
    /// refused with [`StoreError::TooLarge`] before anything is sent.
    /// At least [`StoredResponse::MAX_NOT_KEPT_SIZE`] bytes are kept whatever `bytes`
    /// says, so that what is kept of a result too large always fits.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> RedisStore {
        self.max_result = bytes.max(StoredResponse::MAX_NOT_KEPT_SIZE);
        self
    }

    /// The same store, failing every call that takes longer than `timeout` with
    /// [`StoreError::Unavailable`] ([`DEFAULT_CALL_TIMEOUT`] unless set). A call that timed
    /// out may still have been carried out by the server: its error says so
    /// ([`StoreError::is_outcome_unknown`]), and idem treats its outcome as unknown, as
    /// for any store failure.
    #[must_use]
    pub fn with_call_timeout(mut self, timeout: Duration) -> RedisStore {
        self.call_timeout = timeout;
        self
    }

    /// The connection, to share it with the application.
    pub fn connection(&self) -> &ConnectionManager {
        &self.conn
    }

    /// The name of the hash that holds `key`'s record (the layout of the
    /// [module docs](self)).
    pub fn hash_name(&self, key: &RecordKey) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            segment(&self.prefix),
            segment(&key.operation),
            key.client.len(),
            key.client,
            key.key
        )
    }

    /// The names of `client`'s budget accounting ([`super::budget`]): its records, by
    /// expiry, and their results' sizes. `<prefix>/budget/<client length>:<client>` and
    /// `<prefix>/budget-bytes/…`: outside the prefix's records (`<prefix>:…`), so that
    /// listing and purging never meet them.
    fn budget_names(&self, client: &str) -> (String, String) {
        let prefix = segment(&self.prefix);
        (
            format!("{prefix}/budget/{}:{client}", client.len()),
            format!("{prefix}/budget-bytes/{}:{client}", client.len()),
        )
    }

    async fn warn_if_evicting(&self) {
        let mut conn = self.conn.clone();
        let answer: Result<Result<Vec<String>, RedisError>, _> = tokio::time::timeout(
            self.call_timeout,
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query_async(&mut conn),
        )
        .await;
        if let Ok(Ok(pair)) = answer
            && let Some(policy) = pair.get(1)
            && policy != "noeviction"
        {
            tracing::warn!(
                policy = %policy,
                "idem: the Redis server evicts keys under memory pressure (maxmemory-policy {policy}); \
                 an evicted record turns a retry into a second effect: set maxmemory-policy noeviction"
            );
        }
    }

    /// Runs `call` under the call timeout, mapping Redis's errors to the store's. A
    /// call that times out may have been sent ([`StoreError::outcome_unknown`]), as may
    /// one whose connection failed ([`store_error`]).
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(store_error(error)),
            Err(_) => Err(StoreError::outcome_unknown(format!(
                "the Redis server did not answer within {} ms",
                self.call_timeout.as_millis()
            ))),
        }
    }

    /// Runs a script that answers 1 (done) or 0 (the lease is lost).
    async fn fenced(&self, invocation: redis::ScriptInvocation<'_>) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let done: i64 = self.bounded(invocation.invoke_async(&mut conn)).await?;
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        }
    }
}

/// A Redis error as a store error: a value of the wrong type under one of idem's names is
/// a record that cannot be read; a server over its `maxmemory` is full
/// ([`StoreError::full`]); everything else (I/O, timeouts, a full server, a read-only
/// replica, a script error) is the store failing. An I/O error (a connection that broke,
/// closed or timed out) may have come after the command was sent, unless it is a refused
/// connection: the outcome of such a call is unknown ([`StoreError::outcome_unknown`]).
/// An answer the server gave (an error reply) is known.
fn store_error(error: RedisError) -> StoreError {
    if error.code() == Some("WRONGTYPE") {
        StoreError::Corrupt(format!(
            "a value under idem's prefix is not a record: {error}"
        ))
    } else if error.code() == Some("OOM") {
        // `-OOM command not allowed when used memory > 'maxmemory'`: reached, and full.
        StoreError::full(error)
    } else if error.is_timeout() {
        StoreError::outcome_unknown(format!("the Redis server did not answer in time ({error})"))
    } else if error.is_io_error() && !error.is_connection_refusal() {
        StoreError::outcome_unknown(error)
    } else {
        StoreError::unavailable(error)
    }
}

/// The socket settings of a bounded connection: keepalive probes after `limit` idle
/// and, on Linux, the connection closed when sent data stays unacknowledged for `limit`
/// (`TCP_USER_TIMEOUT`), so that a silent peer is noticed by the socket too.
fn probing(limit: Duration) -> redis::io::tcp::TcpSettings {
    let keepalive = redis::io::tcp::socket2::TcpKeepalive::new().with_time(limit);
    let settings = redis::io::tcp::TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(limit);
    settings
}

/// `result`, unless it is [`StoreError::Corrupt`] (a value under the name that is not
/// a record, or a record that does not parse): then the value is skipped with a warning
/// that names it ([`ops::skip_foreign`]), and `None`.
fn skip_foreign<T>(name: &[u8], result: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error @ StoreError::Corrupt(_)) => {
            ops::skip_foreign(
                &format!("the Redis name `{}`", String::from_utf8_lossy(name)),
                &error,
            );
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// A hash's fields, from `HGETALL` (a flat array of names and values, or a map).
fn fields(value: Value) -> Result<HashMap<String, Vec<u8>>, StoreError> {
    let corrupt = || StoreError::Corrupt("the record is not a list of fields".into());
    let bytes = |v: Value| match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        _ => Err(corrupt()),
    };
    let pairs: Vec<(Value, Value)> = match value {
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err(corrupt());
            }
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((name, value));
            }
            pairs
        }
        Value::Map(pairs) => pairs,
        Value::Nil => Vec::new(),
        _ => return Err(corrupt()),
    };
    pairs
        .into_iter()
        .map(|(name, value)| {
            let name = String::from_utf8(bytes(name)?).map_err(|_| corrupt())?;
            Ok((name, bytes(value)?))
        })
        .collect()
}

/// A record from its hash's fields; `None` for an empty hash (no record).
fn decode(fields: &HashMap<String, Vec<u8>>) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let text = |name: &str| -> Result<&str, StoreError> {
        let value = fields
            .get(name)
            .ok_or_else(|| StoreError::Corrupt(format!("`{name}` is missing")))?;
        std::str::from_utf8(value)
            .map_err(|_| StoreError::Corrupt(format!("`{name}` is not UTF-8")))
    };
    fn number<T: FromStr>(name: &str, text: &str) -> Result<T, StoreError> {
        text.parse()
            .map_err(|_| StoreError::Corrupt(format!("`{name}` is not a number: `{text}`")))
    }
    let operation_id = OperationId::from_str(text("operation_id")?)
        .map_err(|e| StoreError::Corrupt(format!("`operation_id`: {e}")))?;
    let state = match OperationState::from_str(text("state")?).map_err(StoreError::Corrupt)? {
        OperationState::Processing => RecordState::Processing {
            lease: Lease {
                token: OwnerToken::from_str(text("token")?)
                    .map_err(|e| StoreError::Corrupt(format!("`token`: {e}")))?,
                until: number("lease_until", text("lease_until")?)?,
            },
        },
        OperationState::Completed => RecordState::Completed {
            response: StoredResponse {
                status: number("status", text("status")?)?,
                headers: decode_headers(text("headers")?)?,
                body: Bytes::from(fields.get("body").cloned().unwrap_or_default()),
            },
        },
        OperationState::Released => RecordState::Released,
        OperationState::Unknown => RecordState::Unknown {
            reason: fields
                .get("reason")
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .unwrap_or_default(),
        },
    };
    Ok(Some(Record {
        operation_id,
        fingerprint: text("fingerprint")?.to_owned(),
        attempt: number("attempt", text("attempt")?)?,
        created_at: number("created_at", text("created_at")?)?,
        expires_at: number("expires_at", text("expires_at")?)?,
        state,
        transactional: text("transactional")? == "1",
    }))
}

/// A script's `{flag}` or `{flag, fields}` answer: the flag, and the record if sent.
fn flagged(value: Value) -> Result<(i64, Option<Record>), StoreError> {
    let corrupt = || StoreError::Corrupt("a script answered in an unexpected shape".into());
    let Value::Array(mut items) = value else {
        return Err(corrupt());
    };
    let record = match items.len() {
        1 => None,
        2 => decode(&fields(items.pop().ok_or_else(corrupt)?)?)?,
        _ => return Err(corrupt()),
    };
    match items.first() {
        Some(Value::Int(flag)) => Ok((*flag, record)),
        _ => Err(corrupt()),
    }
}

/// The refusal in a registration script's answer `{3, records, bytes, oldest expiry}`,
/// if it is one.
fn over_budget(answer: &Value) -> Option<OverBudget> {
    let Value::Array(items) = answer else {
        return None;
    };
    let number = |i: usize| match items.get(i) {
        Some(Value::Int(n)) => Some(u64::try_from(*n).unwrap_or(0)),
        _ => None,
    };
    if items.len() != 4 || number(0) != Some(3) {
        return None;
    }
    Some(OverBudget {
        usage: Usage {
            records: number(1)?,
            bytes: number(2)?,
        },
        retry_at: number(3)?,
    })
}

/// A part of a hash name that must not contain `:`: `%` and `:` percent-encoded.
fn segment(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([':', '%']) {
        std::borrow::Cow::Owned(text.replace('%', "%25").replace(':', "%3A"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// `SCAN` patterns treat `*`, `?`, `[`, `]` and `\` specially.
fn escape_pattern(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[async_trait]
impl RecordStore for RedisStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let mut conn = self.conn.clone();
        let (records, bytes) = self.budget_names(&key.client);
        let mut invocation = self.scripts.begin.key(self.hash_name(key));
        invocation.key(records).key(bytes);
        invocation
            .arg(now)
            .arg(new.operation_id.to_string())
            .arg(&new.fingerprint)
            .arg(new.lease.token.to_string())
            .arg(new.lease.until)
            .arg(new.expires_at)
            .arg(new.holds_until)
            .arg(if new.transactional { "1" } else { "0" })
            .arg(EXPIRY_MARGIN_MS)
            .arg(&self.prefix)
            .arg(
                new.budget
                    .map(|b| b.records.to_string())
                    .unwrap_or_default(),
            )
            .arg(new.budget.map(|b| b.bytes.to_string()).unwrap_or_default());
        let answer: Value = self.bounded(invocation.invoke_async(&mut conn)).await?;
        if let Some(over) = over_budget(&answer) {
            return Ok(Begin::OverBudget(over));
        }
        match flagged(answer)? {
            (2, None) => Ok(Begin::Started(Record::started(new, now))),
            (1, Some(record)) => Ok(Begin::Started(record)),
            (0, Some(record)) => Ok(Begin::Exists(record)),
            _ => Err(StoreError::Corrupt(
                "the registration script answered in an unexpected shape".into(),
            )),
        }
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let answer: Value = self
            .bounded(
                redis::cmd("HGETALL")
                    .arg(self.hash_name(key))
                    .query_async(&mut conn),
            )
            .await?;
        Ok(decode(&fields(answer)?)?.filter(|record| !record.is_expired(now)))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        let (records, bytes) = self.budget_names(&key.client);
        let mut invocation = self.scripts.complete.key(self.hash_name(key));
        invocation
            .key(records)
            .key(bytes)
            .key(self.outbox_name())
            .arg(now)
            .arg(token.to_string())
            .arg(response.status)
            .arg(encode_headers(&response.headers))
            .arg(response.body.as_ref())
            .arg(response.size())
            .arg(EXPIRY_MARGIN_MS);
        self.fenced(invocation).await
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.release.key(self.hash_name(key));
        invocation.arg(now).arg(token.to_string());
        self.fenced(invocation).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.renew.key(self.hash_name(key));
        invocation
            .arg(now)
            .arg(token.to_string())
            .arg(until)
            .arg(EXPIRY_MARGIN_MS);
        self.fenced(invocation).await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut invocation = self.scripts.park.key(self.hash_name(key));
        invocation.arg(now).arg(token.to_string()).arg(reason);
        self.fenced(invocation).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.take_over.key(self.hash_name(key));
        invocation
            .arg(now)
            .arg(expected.to_string())
            .arg(new_lease.token.to_string())
            .arg(new_lease.until)
            .arg(EXPIRY_MARGIN_MS);
        let answer: Value = self.bounded(invocation.invoke_async(&mut conn)).await?;
        match flagged(answer)? {
            (1, Some(record)) => Ok(record),
            (0, None) => Err(StoreError::LeaseLost),
            _ => Err(StoreError::Corrupt(
                "the takeover script answered in an unexpected shape".into(),
            )),
        }
    }

    /// Redis's `TIME`: the server's seconds and microseconds.
    async fn clock(&self) -> Result<Option<UnixMillis>, StoreError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (u64, u64) = self
            .bounded(redis::cmd("TIME").query_async(&mut conn))
            .await?;
        Ok(Some(
            secs.saturating_mul(1000).saturating_add(micros / 1000),
        ))
    }

    async fn client_usage(
        &self,
        client: &str,
        _cap: u64,
        now: UnixMillis,
    ) -> Result<ClientUsage, StoreError> {
        let mut conn = self.conn.clone();
        let (records, bytes) = self.budget_names(client);
        let mut invocation = self.scripts.usage.key(records);
        invocation.key(bytes).arg(now);
        let answer: Vec<i64> = self.bounded(invocation.invoke_async(&mut conn)).await?;
        let [live, bytes, oldest] = answer[..] else {
            return Err(StoreError::Corrupt(
                "the usage script answered in an unexpected shape".into(),
            ));
        };
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(ClientUsage {
            usage: Usage {
                records: count(live),
                bytes: count(bytes),
            },
            oldest_expiry: (oldest > 0).then(|| count(oldest)),
        })
    }

    async fn steps(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
        _now: UnixMillis,
    ) -> Result<Vec<Step>, StoreError> {
        self.read_steps(key, operation_id).await
    }

    async fn write_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.write_one_step(key, token, write).await
    }
}

#[async_trait]
impl OperatorStore for RedisStore {
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}:*", escape_pattern(&segment(&self.prefix)));
        let mut cursor: u64 = 0;
        let mut purged = 0;
        loop {
            // Names as bytes: a foreign name that is not UTF-8 must not fail the purge.
            let (next, names): (u64, Vec<Vec<u8>>) = self
                .bounded(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(SCAN_BATCH)
                        .query_async(&mut conn),
                )
                .await?;
            if !names.is_empty() {
                let mut invocation = self.scripts.purge.prepare_invoke();
                for name in &names {
                    invocation.key(name);
                }
                invocation.arg(now).arg(&self.prefix);
                let n: u64 = self.bounded(invocation.invoke_async(&mut conn)).await?;
                purged += n;
            }
            if next == 0 {
                return Ok(purged);
            }
            cursor = next;
        }
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        let mut conn = self.conn.clone();
        let pattern = match &query.operation {
            Some(op) => format!(
                "{}:{}:*",
                escape_pattern(&segment(&self.prefix)),
                escape_pattern(&segment(op))
            ),
            None => format!("{}:*", escape_pattern(&segment(&self.prefix))),
        };
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        loop {
            let (next, names): (u64, Vec<Vec<u8>>) = self
                .bounded(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(SCAN_BATCH)
                        .query_async(&mut conn),
                )
                .await?;
            for name in names {
                let Some(key) = self.key_of(&name) else {
                    continue;
                };
                let answer: Result<Value, StoreError> = self
                    .bounded(redis::cmd("HGETALL").arg(&name).query_async(&mut conn))
                    .await;
                // A value that is not a record (another program's, a manual `SET`) is
                // skipped and named, never fatal to the listing.
                let Some(fields) = skip_foreign(&name, answer.and_then(fields))? else {
                    continue;
                };
                // Names of a longer prefix (`a:b` under `a`) are another store's.
                if fields.get("prefix").map(Vec::as_slice) != Some(self.prefix.as_bytes()) {
                    continue;
                }
                if let Some(Some(record)) = skip_foreign(&name, decode(&fields))?
                    && query.matches(&key, &record, now)
                {
                    found.push(Listed { key, record });
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        found.sort_by(|a, b| ops::order(&a.key).cmp(&ops::order(&b.key)));
        found.truncate(query.page() as usize);
        Ok(found)
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        let mut conn = self.conn.clone();
        let name = self.hash_name(key);
        let answer: Result<Value, StoreError> = self
            .bounded(redis::cmd("HGETALL").arg(&name).query_async(&mut conn))
            .await;
        // A value under the record's name that is not a record is no record to show.
        let Some(fields) = skip_foreign(name.as_bytes(), answer.and_then(fields))? else {
            return Ok(None);
        };
        let decoded = skip_foreign(name.as_bytes(), decode(&fields))?;
        let Some(record) = decoded.flatten().filter(|r| !r.is_expired(now)) else {
            return Ok(None);
        };
        let history = fields
            .get("history")
            .map(|h| String::from_utf8_lossy(h).into_owned());
        let events = ops::parse_history(history.as_deref())?;
        Ok(Some(Inspection::new(key.clone(), record, &events)))
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolution,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.resolve.key(self.hash_name(key));
        invocation
            .arg(now)
            .arg(resolve.expected_attempt.to_string());
        match &resolve.outcome {
            ResolutionOutcome::Completed(response) => {
                check_size(response, self.max_result)?;
                invocation
                    .arg("completed")
                    .arg(response.status)
                    .arg(encode_headers(&response.headers))
                    .arg(response.body.as_ref());
            }
            ResolutionOutcome::NotApplied => {
                invocation.arg("released").arg("").arg("").arg("");
            }
        }
        invocation
            .arg(Event::resolved(resolve.expected_attempt, "", resolve, now).to_json())
            .arg(EXPIRY_MARGIN_MS);
        let answer: Value = self.bounded(invocation.invoke_async(&mut conn)).await?;
        match flagged(answer)? {
            (1, Some(record)) => Ok(record),
            (0, None) => {
                // The resolution was answered, refused: a failure to read the record
                // now leaves nothing unknown about it.
                let current = self.get(key, now).await.map_err(StoreError::known)?;
                Err(ops::refused(current.as_ref(), resolve.expected_attempt))
            }
            _ => Err(StoreError::Corrupt(
                "the resolution script answered in an unexpected shape".into(),
            )),
        }
    }

    async fn due_deliveries(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError> {
        self.due(limit, now).await
    }

    async fn claim_delivery(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.claim(key, operation_id, index, until, now).await
    }

    async fn settle_delivery(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.settle(key, operation_id, index, claim, delivery).await
    }
}

impl RedisStore {
    /// The [`RecordKey`] a hash name of this store's layout holds, or `None` for a name
    /// of another layout or prefix.
    fn key_of(&self, name: &[u8]) -> Option<RecordKey> {
        let name = std::str::from_utf8(name).ok()?;
        let rest = name
            .strip_prefix(&*segment(&self.prefix))?
            .strip_prefix(':')?;
        let (operation, rest) = rest.split_once(':')?;
        let (len, rest) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let client = rest.get(..len)?;
        let key = rest.get(len..)?.strip_prefix(':')?;
        let operation = operation.replace("%3A", ":").replace("%25", "%");
        Some(RecordKey::new(operation, client, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store on a connection that is never made (nothing listens on port 1).
    fn unconnected() -> RedisStore {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid URL");
        let conn = ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
            .expect("a lazy connection");
        RedisStore::from_connection(conn)
    }

    #[tokio::test]
    async fn hash_names_are_unambiguous() {
        let store = unconnected();
        let a = RecordKey::new("op", "a:1", "k");
        let b = RecordKey::new("op", "a", "1:k");
        assert_ne!(store.hash_name(&a), store.hash_name(&b));
        assert_eq!(store.hash_name(&a), "idem:op:3:a:1:k");
        let store = store.with_prefix("svc");
        assert_eq!(store.hash_name(&b), "svc:op:1:a:1:k");
    }

    #[tokio::test]
    async fn malformed_urls_are_unavailable_not_panics() {
        let long = format!("redis://{}:6379", "h".repeat(100_000));
        for url in [
            "",
            "not a url",
            "http://127.0.0.1:6379",
            "redis://[::1",
            "redis://127.0.0.1:99999",
            long.as_str(),
        ] {
            assert!(
                matches!(
                    RedisStore::connect(url).await,
                    Err(StoreError::Unavailable(_))
                ),
                "{:.60}",
                url
            );
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unavailable_within_the_call_timeout() {
        let store = unconnected().with_call_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let k = RecordKey::new("op", "c", "k");
        assert!(matches!(
            store.get(&k, 0).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A refused connection and an answer the server gave are known failures; a timeout
    /// or a connection lost while the answer was awaited leaves the outcome unknown.
    #[test]
    fn errors_say_whether_the_call_may_have_been_carried_out() {
        use std::io::{Error, ErrorKind};

        let io = |kind: ErrorKind| store_error(RedisError::from(Error::from(kind)));
        assert!(!io(ErrorKind::ConnectionRefused).is_outcome_unknown());
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::BrokenPipe,
            ErrorKind::UnexpectedEof,
        ] {
            assert!(io(kind).is_outcome_unknown(), "{kind:?}");
        }
        let timed_out = io(ErrorKind::TimedOut);
        assert!(timed_out.is_outcome_unknown());
        assert!(
            timed_out
                .to_string()
                .contains("the Redis server did not answer in time"),
            "{timed_out}"
        );
        let read_only = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        let refused = store_error(read_only);
        assert!(matches!(refused, StoreError::Unavailable(_)));
        assert!(!refused.is_outcome_unknown());
    }

    #[test]
    fn scan_patterns_are_escaped() {
        assert_eq!(escape_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(escape_pattern("idem"), "idem");
    }

    #[test]
    fn unreadable_hashes_are_corrupt_not_panics() {
        let mut hash = HashMap::new();
        hash.insert("state".to_owned(), b"processing".to_vec());
        assert!(matches!(decode(&hash), Err(StoreError::Corrupt(_))));
        hash.insert("operation_id".to_owned(), b"not an id".to_vec());
        assert!(matches!(decode(&hash), Err(StoreError::Corrupt(_))));
        assert!(matches!(decode(&HashMap::new()), Ok(None)));
        assert!(matches!(
            fields(Value::Array(vec![Value::Int(1)])),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            flagged(Value::Int(3)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite() {
        let Some(url) = crate::store::conformance::redis::url_or_skip("the Redis store").await
        else {
            return;
        };
        crate::store::conformance::run(|| {
            let url = url.clone();
            async move { crate::store::conformance::redis::scratch_store(&url).await }
        })
        .await;
    }

    /// The store's clock is the server's `TIME`, read in one round trip.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_clock_is_the_servers() {
        let Some(url) = crate::store::conformance::redis::url_or_skip("the Redis clock").await
        else {
            return;
        };
        let store = crate::store::conformance::redis::scratch_store(&url).await;
        crate::store::conformance::the_clock_is_the_servers(
            std::sync::Arc::new(store),
            Duration::from_millis(250),
        )
        .await;
    }

    /// RESP3 answers `HGETALL` with a map, not a flat array: the whole suite again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite_over_resp3() {
        let Some(url) = crate::store::conformance::redis::url_or_skip("the Redis store").await
        else {
            return;
        };
        let url = if url.contains('?') {
            format!("{url}&protocol=resp3")
        } else {
            format!("{}/?protocol=resp3", url.trim_end_matches('/'))
        };
        crate::store::conformance::run(|| {
            let url = url.clone();
            async move { crate::store::conformance::redis::scratch_store(&url).await }
        })
        .await;
    }

    #[tokio::test]
    async fn foreign_values_under_record_names_are_corrupt() {
        let Some(url) = crate::store::conformance::redis::url_or_skip("the Redis store").await
        else {
            return;
        };
        let store = crate::store::conformance::redis::scratch_store(&url).await;
        let mut conn = store.connection().clone();
        let k = RecordKey::new("op", "c", "string");
        let _: () = redis::cmd("SET")
            .arg(store.hash_name(&k))
            .arg("not a record")
            .query_async(&mut conn)
            .await
            .unwrap();
        let new = crate::store::conformance::new_record("sha256:a", 1);
        assert!(matches!(
            store.get(&k, 1).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            store.begin(&k, &new, 1).await,
            Err(StoreError::Corrupt(_))
        ));
        let h = RecordKey::new("op", "c", "hash");
        let _: () = redis::cmd("HSET")
            .arg(store.hash_name(&h))
            .arg("state")
            .arg("completed")
            .arg("expires_at")
            .arg("99999999999999")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(
            store.get(&h, 1).await,
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            store.begin(&h, &new, 1).await,
            Err(StoreError::Corrupt(_))
        ));
        // Purging skips what is not a record and deletes nothing it cannot read, nor a
        // hash this store did not write (it has no `prefix` field).
        assert_eq!(store.purge_expired(u64::MAX / 2).await.unwrap(), 0);
        let left: bool = redis::cmd("EXISTS")
            .arg(store.hash_name(&k))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left, "a value that is not a record is left alone");
    }
}

/// Hostile deployments on the shared test server, each under scratch prefixes of its own.
#[cfg(test)]
mod hostile {
    use super::*;
    use crate::store::conformance::redis::{scratch_prefix, url_or_skip};
    use crate::store::conformance::{T0, TTL, new_record};
    use http::{HeaderName, HeaderValue};

    async fn store(url: &str, prefix: &str) -> RedisStore {
        RedisStore::connect(url)
            .await
            .expect("the Redis test server")
            .with_prefix(prefix)
    }

    async fn exists(store: &RedisStore, name: &str) -> bool {
        let mut conn = store.connection().clone();
        redis::cmd("EXISTS")
            .arg(name)
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    fn response(body: &[u8]) -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![],
            body: Bytes::copy_from_slice(body),
        }
    }

    #[tokio::test]
    async fn prefixes_that_extend_another_with_a_colon_have_their_own_names() {
        let a = unconnected_with("a");
        let b = unconnected_with("a:b:3");
        assert_ne!(
            a.hash_name(&RecordKey::new("b", "x:1", "c:k")),
            b.hash_name(&RecordKey::new("x", "c", "k"))
        );
        assert_eq!(
            b.hash_name(&RecordKey::new("x", "c", "k")),
            "a%3Ab%3A3:x:1:c:k"
        );
        let percent = unconnected_with("a%3Ab");
        assert_ne!(
            percent.hash_name(&RecordKey::new("x", "c", "k")),
            unconnected_with("a:b").hash_name(&RecordKey::new("x", "c", "k"))
        );
        assert_eq!(
            unconnected_with("a").hash_name(&RecordKey::new("o:p", "c", "k")),
            "a:o%3Ap:1:c:k"
        );
    }

    fn unconnected_with(prefix: &str) -> RedisStore {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid URL");
        let conn = ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
            .expect("a lazy connection");
        RedisStore::from_connection(conn).with_prefix(prefix)
    }

    /// Clients and keys full of the characters Redis patterns, hash tags and the name
    /// layout care about: every pair is its own record, completed and replayed as its own.
    #[tokio::test]
    async fn hostile_clients_and_keys_are_independent_records() {
        let Some(url) = url_or_skip("hostile Redis keys").await else {
            return;
        };
        let store = store(&url, &scratch_prefix()).await;
        let long = "k".repeat(254) + "*";
        let clients = [
            "a", "a:1", "a:", ":", "*", "?", "[a-z]", "\\", "a b", "{tag}", "{", "}", "\\*", "2:ab",
        ];
        let keys = [
            "k",
            "1:k",
            ":k",
            "k:",
            "*",
            "?",
            "[",
            "]",
            "[k]",
            "\\",
            "a b",
            "{tag}",
            "{}",
            "\\*",
            long.as_str(),
        ];
        let mut all = Vec::new();
        for client in clients {
            for key in keys {
                all.push(RecordKey::new("op", client, key));
            }
        }
        let mut names: Vec<String> = all.iter().map(|k| store.hash_name(k)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "every pair has a name of its own");
        for (i, k) in all.iter().enumerate() {
            let new = new_record(&format!("sha256:{i}"), T0);
            let Begin::Started(record) = store.begin(k, &new, T0).await.unwrap() else {
                panic!("{k:?} is new");
            };
            let RecordState::Processing { lease } = record.state else {
                panic!("{k:?} is processing");
            };
            store
                .complete(k, lease.token, &response(format!("{i}").as_bytes()), T0)
                .await
                .unwrap();
        }
        for (i, k) in all.iter().enumerate() {
            let record = store.get(k, T0 + 1).await.unwrap().expect("kept");
            assert_eq!(record.fingerprint, format!("sha256:{i}"), "{k:?}");
            let RecordState::Completed { response } = record.state else {
                panic!("{k:?} is completed");
            };
            assert_eq!(response.body, format!("{i}").as_bytes(), "{k:?}");
        }
        // Nothing has expired: purging deletes nothing, whatever the names hold.
        assert_eq!(store.purge_expired(T0 + 1).await.unwrap(), 0);
        for name in &names {
            assert!(exists(&store, name).await, "{name}");
        }
        assert_eq!(
            store.purge_expired(T0 + TTL).await.unwrap(),
            all.len() as u64
        );
    }

    /// A store purging `p` never deletes what stores under `p:b`, `p*`, `p?`, `p[`, `p\`
    /// wrote, expired or not; each of them deletes only its own.
    #[tokio::test]
    async fn purging_a_prefix_never_deletes_another_prefixs_records() {
        let Some(url) = url_or_skip("Redis prefixes").await else {
            return;
        };
        let base = scratch_prefix();
        let prefixes = [
            base.clone(),
            format!("{base}:b"),
            format!("{base}:op"),
            format!("{base}*"),
            format!("{base}?"),
            format!("{base}["),
            format!("{base}\\"),
            format!("{base}:"),
        ];
        let mut stores = Vec::new();
        for prefix in &prefixes {
            let s = store(&url, prefix).await;
            let k = RecordKey::new("op", "c", "k");
            s.begin(&k, &new_record("sha256:a", T0), T0).await.unwrap();
            stores.push((s.hash_name(&k), s));
        }
        for (i, (_, purging)) in stores.iter().enumerate() {
            assert_eq!(
                purging.purge_expired(T0 + TTL).await.unwrap(),
                1,
                "{} deletes its own record only",
                prefixes[i]
            );
            for (j, (name, other)) in stores.iter().enumerate() {
                assert_eq!(
                    exists(other, name).await,
                    j > i,
                    "{name} after purging {}",
                    prefixes[i]
                );
            }
        }
    }

    /// A name under the prefix that is not UTF-8 (written by something else) does not
    /// make every purge fail.
    #[tokio::test]
    async fn a_foreign_name_that_is_not_utf8_does_not_stop_the_purge() {
        let Some(url) = url_or_skip("Redis binary names").await else {
            return;
        };
        let store = store(&url, &scratch_prefix()).await;
        let mut name = format!("{}:", store.prefix).into_bytes();
        name.extend_from_slice(b"\xff\xfe");
        let mut conn = store.connection().clone();
        let _: () = redis::cmd("HSET")
            .arg(&name)
            .arg("expires_at")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let k = RecordKey::new("op", "c", "k");
        store
            .begin(&k, &new_record("sha256:a", T0), T0)
            .await
            .unwrap();
        assert_eq!(store.purge_expired(T0 + TTL).await.unwrap(), 1);
        let left: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left, "a hash idem did not write is left alone");
        let _: () = redis::cmd("DEL")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// A result of exactly the default limit, with every byte value in the body and a
    /// header value that is not UTF-8, comes back byte for byte; one byte more is refused
    /// before anything is written.
    #[tokio::test]
    async fn a_result_at_the_limit_round_trips_byte_for_byte() {
        let Some(url) = url_or_skip("large Redis results").await else {
            return;
        };
        let store = store(&url, &scratch_prefix()).await;
        let headers = vec![
            (
                HeaderName::from_static("x-raw"),
                HeaderValue::from_bytes(b"\x80\xff \xe9t\xe9 \"{}\"").unwrap(),
            ),
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/octet-stream"),
            ),
        ];
        let head: usize = headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum();
        let body: Vec<u8> = (0..DEFAULT_MAX_RESULT - head)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let big = StoredResponse {
            status: 200,
            headers,
            body: Bytes::from(body),
        };
        assert_eq!(big.size(), DEFAULT_MAX_RESULT);
        let k = RecordKey::new("op", "c", "big");
        let new = new_record("sha256:a", T0);
        store.begin(&k, &new, T0).await.unwrap();
        let mut over = big.clone();
        over.body = Bytes::from([big.body.as_ref(), b"x"].concat());
        assert!(matches!(
            store.complete(&k, new.lease.token, &over, T0).await,
            Err(StoreError::TooLarge { .. })
        ));
        store.complete(&k, new.lease.token, &big, T0).await.unwrap();
        let record = store.get(&k, T0).await.unwrap().unwrap();
        let RecordState::Completed { response } = record.state else {
            panic!("completed");
        };
        assert_eq!(response.status, 200);
        assert_eq!(response.headers, big.headers);
        assert!(
            response.body == big.body,
            "the body comes back byte for byte"
        );
        // And through the registration script's answer (a replay).
        let Begin::Exists(again) = store
            .begin(&k, &new_record("sha256:a", T0), T0)
            .await
            .unwrap()
        else {
            panic!("exists");
        };
        assert_eq!(again.state, RecordState::Completed { response: big });
    }
}
