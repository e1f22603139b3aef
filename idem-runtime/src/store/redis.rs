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
//! set outside the records' names; see the journal's module, `store/redis/journal.rs`);
//! `counted`, the expiry bucket its registration counted it in for its client's budget
//! (`0`: not counted). A client's budget is two names outside the records',
//! `<prefix>/budget-ends/…` and `<prefix>/budget-counts/…`: its records and their
//! results' bytes by 10 s expiry bucket ([`super::budget::COUNT_SLACK_MS`]), so that a
//! new key costs the same whatever the client holds (the scripts' module says how).
//!
//! [`OperatorStore::list`] scans the prefix (or the operation's names) and sorts what it
//! finds: a tool for operators and the reconciler, whose cost grows with the number of
//! records.
//!
//! # Redis Cluster
//!
//! [`RedisStore::connect`] takes the seed nodes of a cluster as comma-separated URLs
//! (`redis://h1:7000,redis://h2:7001`), or one node's URL (the store sees
//! `cluster_enabled:1` and learns the others). Commands go to the master of their
//! keys' slot through the `redis` crate's cluster client, which follows `MOVED` and
//! `ASK` and refreshes its slot map when the cluster changes.
//!
//! Every name one script touches shares one hash slot. A record's name carries the hash
//! tag of its **bucket**, `<prefix>:{<bucket>}:<operation>:…`: one of 1,024, drawn from
//! the record's own operation, client and key (SHA-256), so that records — even one
//! tenant's — spread over every master. The bucket's outbox, `<prefix>/outbox/{<bucket>}`,
//! shares the tag. A client's budget names (below) carry a tag drawn from the client,
//! in a slot of their own: on a cluster the budget is kept by calls beside the
//! registration (a count after a new key, a size after its result) rather than in the
//! same script, and stays within the bounds of [`super::budget`] (the requests in
//! flight); a count that fails after its record was written is logged and the record
//! is not counted. Names on one server have no tag: a store moved from one server to a
//! cluster starts with no records (both are the same layout otherwise).
//!
//! Purge, [`OperatorStore::list`] and the reconciler scan every master (a `SCAN` on each,
//! from `CLUSTER NODES`); a master that fails is skipped with a warning, and scanned
//! again once its replica takes over. Run the cluster with
//! `cluster-require-full-coverage no`, so that a failing master stops its own slots only.
//!
//! # Failover
//!
//! Replication in Redis is asynchronous: a master that acknowledged a write and died
//! before passing it on loses it in a failover. For a claim that would mean a second
//! attempt running beside the first. So each **claim** (a new key's registration, a
//! reclaim, a takeover) can wait until replicas acknowledge it (`WAIT`,
//! [`RedisStore::with_replica_wait`]); this is on by default, one replica within
//! 500 ms, on a cluster whose masters all have replicas. A claim not acknowledged in time
//! is released and answered 503 with `Retry-After` (the retry claims again).
//!
//! - **With the wait**: a claim idem acted on survives the failover of its master
//!   (unless the master and every acknowledging replica fail at once). A completion is
//!   not waited for: one lost in the failover leaves its record `processing`, and once
//!   its lease ends the next retry or status lookup runs the contract's recovery — as
//!   after a crash between the effect and the completion, below.
//! - **Without it** (no replicas, or `with_replica_wait(None)`): a failover may lose the
//!   claims and completions of the last moments (the replication lag, usually under a
//!   millisecond); a lost claim lets a retry run the operation again.
//!
//! While a master is down and until its replica is promoted (the cluster's node timeout
//! plus an election, a few seconds), calls for its slots fail and idem answers 503 with
//! `Retry-After`; no handler runs without its record.
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
//!   forgets completed keys, and a replica promoted after a failover may lack the last
//!   writes that no claim waited for ("Failover" above). Either turns a retry of a
//!   forgotten key into a new operation (an attempt running across the restart finds its
//!   record gone, answers 503 `attempt-timed-out`, and its retry runs again). Use the
//!   PostgreSQL store where that is not acceptable.
//!
//! # Faults
//!
//! The connection ([`RedisConnection`]) is, on one server, a [`ConnectionManager`]: one
//! multiplexed connection, re-established after it breaks, without restarting the
//! service; on a cluster, a connection per node that the cluster client re-establishes. Every call is bounded by the call
//! timeout ([`RedisStore::with_call_timeout`], 2 s by default); a server that is down, slow
//! or refuses a write fails the call with [`StoreError::Unavailable`], which idem answers
//! with 503 and `Retry-After`, running no handler without its record. A call that timed
//! out, or whose connection broke after it was sent, may still be carried out by the
//! server: its error says so ([`StoreError::is_outcome_unknown`]). A hash that cannot be
//! read back as a record fails with [`StoreError::Corrupt`].

mod cluster;
mod connection;
mod journal;
mod layout;
mod record;
mod scripts;

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};

use super::headers::encode_headers;
use super::open::Bounds;
use super::ops::{self, Event};
use super::{
    Begin, ClientUsage, DEFAULT_MAX_RESULT, Inspection, Lease, ListQuery, Listed, NewRecord,
    OperatorStore, OverBudget, OwnerToken, Record, RecordKey, RecordStore, Resolution,
    ResolutionOutcome, Step, StepWrite, StoreError, StoredResponse, UnixMillis, Usage, check_size,
    journal::{Delivery, Due},
};
use crate::OperationId;
pub use connection::RedisConnection;
use connection::Waits;
use layout::Layout;
use record::{Positional, RECORD_FIELDS, decode, fields, flagged};
use scripts::Scripts;

/// How long after its `expires_at` (by Redis's clock) a record's hash is forgotten by Redis
/// itself, in milliseconds: one minute of tolerance for clocks that disagree.
pub const EXPIRY_MARGIN_MS: u64 = 60_000;

/// The prefix of every hash name unless [`RedisStore::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "idem";

/// The bound on every call unless [`RedisStore::with_call_timeout`] says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How many names one `SCAN` step of [`OperatorStore::purge_expired`] asks for.
const SCAN_BATCH: usize = 500;

/// A [`Store`](super::Store) in Redis (or Valkey), shared by every instance of a service:
/// see the [module docs](self) for the layout, the guarantees and what Redis's
/// configuration does to them.
///
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    layout: Layout,
    max_result: usize,
    call_timeout: Duration,
    replica_wait: Option<ReplicaWait>,
    topology: std::sync::Arc<std::sync::Mutex<cluster::Topology>>,
    scripts: std::sync::Arc<Scripts>,
}

/// How a claim waits for replicas ([`RedisStore::with_replica_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaWait {
    /// How many replicas must acknowledge the claim.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

impl ReplicaWait {
    /// One replica within 500 ms: what a cluster with replicas gets unless told
    /// otherwise.
    pub const DEFAULT: ReplicaWait = ReplicaWait {
        replicas: 1,
        timeout: Duration::from_millis(500),
    };
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.layout.prefix())
            .field("cluster", &self.layout.cluster())
            .field("max_result", &self.max_result)
            .field("call_timeout", &self.call_timeout)
            .field("replica_wait", &self.replica_wait)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://` for TLS where the `redis` crate is built with it) and checks that it
    /// answers. Several URLs, comma-separated, are seed nodes of one Redis Cluster; one
    /// URL of a node in cluster mode is a cluster too (see "Redis Cluster" in the
    /// [module docs](self)).
    ///
    /// # Default
    ///
    /// - prefix [`DEFAULT_PREFIX`], results of up to [`DEFAULT_MAX_RESULT`] bytes;
    /// - every call bounded by [`DEFAULT_CALL_TIMEOUT`]; a new connection waits at most
    ///   1 s, and a broken one is re-established in the background (a few tries, 100 to
    ///   500 ms apart, then again at the next call);
    /// - on a cluster whose masters all have a replica, every claim waits for one
    ///   ([`ReplicaWait::DEFAULT`]); elsewhere no claim waits.
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
        let (waits, call) = match bounds {
            Some(b) => (
                Waits {
                    connect: b.limit,
                    response: b.limit,
                },
                b.call,
            ),
            None => (
                Waits {
                    connect: Duration::from_secs(1),
                    response: DEFAULT_CALL_TIMEOUT,
                },
                DEFAULT_CALL_TIMEOUT,
            ),
        };
        let conn = RedisConnection::open(url, waits, bounds.map(|b| probing(b.limit))).await?;
        let mut store = RedisStore::over(conn).with_call_timeout(call);
        // The connection alone proves little: a server that wants a password accepts it
        // without one and refuses every command after (`NOAUTH`).
        let mut conn = store.conn.clone();
        let _: Value = store
            .bounded(redis::cmd("PING").query_async(&mut conn))
            .await?;
        if store.layout.cluster() {
            let masters = store.bounded(conn.masters()).await?;
            if !masters.is_empty() && masters.iter().all(|m| m.replicas > 0) {
                store.replica_wait = Some(ReplicaWait::DEFAULT);
            }
        }
        store.warn_if_evicting().await;
        Ok(store)
    }

    /// A store over a connection to one server that the application configured (its
    /// own timeouts, TLS, credentials). Runs no command.
    pub fn from_connection(conn: ConnectionManager) -> RedisStore {
        RedisStore::over(RedisConnection::Server(conn))
    }

    /// A store over a connection to a Redis Cluster that the application configured.
    /// Runs no command; no claim waits for a replica unless
    /// [`RedisStore::with_replica_wait`] says so.
    pub fn from_cluster(conn: ClusterConnection) -> RedisStore {
        RedisStore::over(RedisConnection::Cluster(conn))
    }

    fn over(conn: RedisConnection) -> RedisStore {
        RedisStore {
            layout: Layout::new(DEFAULT_PREFIX.to_owned(), conn.is_cluster()),
            conn,
            max_result: DEFAULT_MAX_RESULT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            replica_wait: None,
            topology: std::sync::Arc::default(),
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
        self.layout = Layout::new(prefix.into(), self.layout.cluster());
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

    /// The same store, making every claim (a new key's registration, a reclaim, a
    /// takeover) wait until `wait.replicas` replicas of the master that holds it have
    /// acknowledged it (`WAIT`), at most `wait.timeout`; `None`: no claim waits. A claim
    /// not acknowledged in time is released and fails with [`StoreError::Unavailable`]
    /// (idem answers 503 with `Retry-After`; the retry claims the key again). What it
    /// guarantees: "Failover" in the [module docs](self).
    #[must_use]
    pub fn with_replica_wait(mut self, wait: Option<ReplicaWait>) -> RedisStore {
        self.replica_wait = wait;
        self
    }

    /// How claims wait for replicas ([`RedisStore::with_replica_wait`]).
    pub fn replica_wait(&self) -> Option<ReplicaWait> {
        self.replica_wait
    }

    /// The connection, to share it with the application.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    /// The name of the hash that holds `key`'s record (the layout of the
    /// [module docs](self)).
    pub fn hash_name(&self, key: &RecordKey) -> String {
        self.layout.record(key)
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

#[async_trait]
impl RecordStore for RedisStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let begun = if self.layout.cluster() {
            self.begin_in_cluster(key, new, now).await?
        } else {
            self.register(key, new, new.budget, now).await?
        };
        if let Begin::Started(_) = begun {
            self.acknowledged(key, new.lease.token, now).await?;
        }
        Ok(begun)
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let answer: Value = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(self.hash_name(key))
                    .arg(&RECORD_FIELDS[..])
                    .query_async(&mut conn),
            )
            .await?;
        Ok(decode(&Positional::from_value(answer)?)?.filter(|record| !record.is_expired(now)))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        let mut invocation = self.scripts.complete.key(self.hash_name(key));
        invocation.key(self.layout.outbox(key));
        if !self.layout.cluster() {
            invocation.key(self.layout.budget(&key.client).1);
        }
        invocation
            .arg(now)
            .arg(token.to_string())
            .arg(response.status)
            .arg(encode_headers(&response.headers))
            .arg(response.body.as_ref())
            .arg(response.size());
        let mut conn = self.conn.clone();
        let answer: Value = self.bounded(invocation.invoke_async(&mut conn)).await?;
        let bucket = match answer {
            Value::Int(0) => return Err(StoreError::LeaseLost),
            Value::BulkString(bucket) => bucket,
            Value::SimpleString(bucket) => bucket.into_bytes(),
            _ => {
                return Err(StoreError::Corrupt(
                    "the completion script answered in an unexpected shape".into(),
                ));
            }
        };
        if self.layout.cluster() && bucket != b"0" {
            let bucket = String::from_utf8_lossy(&bucket);
            self.account_in_cluster(key, &bucket, response.size(), now)
                .await;
        }
        Ok(())
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
            (1, Some(record)) => {
                self.acknowledged(key, new_lease.token, now).await?;
                Ok(record)
            }
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
        let (records, bytes) = self.layout.budget(client);
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
        let mut purged = 0;
        let mut scan = self.scan(&self.layout.pattern(None)).await?;
        while let Some(names) = self.next_names(&mut scan).await? {
            for batch in self.by_slot(names) {
                let mut invocation = self.scripts.purge.prepare_invoke();
                for name in &batch {
                    invocation.key(name);
                }
                invocation.arg(now).arg(self.layout.prefix());
                let mut conn = self.conn.clone();
                let n: u64 = self.bounded(invocation.invoke_async(&mut conn)).await?;
                purged += n;
            }
        }
        Ok(purged)
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        let mut found = Vec::new();
        let mut scan = self
            .scan(&self.layout.pattern(query.operation.as_deref()))
            .await?;
        while let Some(names) = self.next_names(&mut scan).await? {
            for name in names {
                if let Some(listed) = self.listed(&name, query, now).await? {
                    found.push(listed);
                }
            }
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
    /// The record named `name` when it is one of this store's and `query` wants it at
    /// `now`. A value that is not a record (another program's, a manual `SET`) is
    /// skipped and named, never fatal to the listing.
    async fn listed(
        &self,
        name: &[u8],
        query: &ListQuery,
        now: UnixMillis,
    ) -> Result<Option<Listed>, StoreError> {
        let Some(key) = self.layout.key_of(name) else {
            return Ok(None);
        };
        let mut conn = self.conn.clone();
        let answer: Result<Value, StoreError> = self
            .bounded(redis::cmd("HGETALL").arg(name).query_async(&mut conn))
            .await;
        let Some(fields) = skip_foreign(name, answer.and_then(fields))? else {
            return Ok(None);
        };
        // Names of a longer prefix (`a:b` under `a`) are another store's.
        if fields.get("prefix").map(Vec::as_slice) != Some(self.layout.prefix().as_bytes()) {
            return Ok(None);
        }
        match skip_foreign(name, decode(&fields))? {
            Some(Some(record)) if query.matches(&key, &record, now) => {
                Ok(Some(Listed { key, record }))
            }
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store on a connection that is never made (nothing listens on port 1).
    fn unconnected() -> RedisStore {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid URL");
        let conn = ConnectionManager::new_lazy_with_config(
            client,
            redis::aio::ConnectionManagerConfig::new(),
        )
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
        assert_eq!(layout::escape_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(layout::escape_pattern("idem"), "idem");
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
    use crate::store::RecordState;
    use crate::store::budget::COUNT_SLACK_MS;
    use crate::store::conformance::redis::{scratch_prefix, url_or_skip};
    use crate::store::conformance::{T0, TTL, new_record};
    use crate::store::{ClientBudget, NewRecord};
    use bytes::Bytes;
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
        let conn = ConnectionManager::new_lazy_with_config(
            client,
            redis::aio::ConnectionManagerConfig::new(),
        )
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
        let mut name = format!("{}:", store.layout.prefix()).into_bytes();
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

    /// A claim that no replica acknowledges within the wait (here: one server without
    /// replicas, asked for one) is released, not left processing, and fails as
    /// unavailable; the retry claims the key again (as attempt 2).
    #[tokio::test]
    async fn a_claim_no_replica_acknowledged_is_released_and_unavailable() {
        let Some(url) = url_or_skip("a claim without its replica").await else {
            return;
        };
        let store = store(&url, &scratch_prefix())
            .await
            .with_replica_wait(Some(ReplicaWait {
                replicas: 1,
                timeout: Duration::from_millis(50),
            }));
        let k = RecordKey::new("op", "c", "unacknowledged");
        for attempt in 1..=2 {
            let begun = store.begin(&k, &new_record("sha256:a", T0), T0).await;
            match begun {
                Err(StoreError::Unavailable(why)) => {
                    assert!(why.to_string().contains("0 of the 1 replica(s)"), "{why}")
                }
                other => panic!("attempt {attempt}: {other:?}"),
            }
            let record = store.get(&k, T0).await.unwrap().expect("the record");
            assert_eq!(record.attempt, attempt);
            assert_eq!(record.state, RecordState::Released, "not left processing");
        }
    }

    /// What `c`'s budget names hold: its buckets, its records and bytes (the totals),
    /// and how long each name lives (unix milliseconds).
    async fn accounting(store: &RedisStore) -> (i64, i64, i64, i64, i64) {
        let (ends, counts) = store.layout.budget("c");
        let mut conn = store.connection().clone();
        let (buckets, totals, ends_until, counts_until): (i64, Vec<Option<i64>>, i64, i64) =
            redis::pipe()
                .cmd("ZCARD")
                .arg(&ends)
                .cmd("HMGET")
                .arg(&counts)
                .arg("*n")
                .arg("*s")
                .cmd("PEXPIRETIME")
                .arg(&ends)
                .cmd("PEXPIRETIME")
                .arg(&counts)
                .query_async(&mut conn)
                .await
                .unwrap();
        let total = |i: usize| totals.get(i).copied().flatten().unwrap_or(0);
        (buckets, total(0), total(1), ends_until, counts_until)
    }

    /// The accounting is by expiry bucket: twenty records registered over 20 ms fall in
    /// two 10 s buckets; their results' bytes are added to their buckets; the names
    /// outlive the newest bucket; a bucket stops counting at its end, and is forgotten
    /// when a new one opens.
    #[tokio::test]
    async fn the_budget_counts_by_expiry_bucket() {
        let Some(url) = url_or_skip("the budget's names").await else {
            return;
        };
        let store = store(&url, &scratch_prefix()).await;
        let counting = |now| NewRecord {
            budget: Some(ClientBudget::COUNT_ONLY),
            ..new_record("sha256:a", now)
        };
        let result = response(b"0123456789");
        let size = i64::try_from(result.size()).unwrap();
        for i in 0..20 {
            let k = RecordKey::new("op", "c", format!("k{i}"));
            let new = counting(T0 + i);
            store.begin(&k, &new, T0 + i).await.unwrap();
            store
                .complete(&k, new.lease.token, &result, T0 + i)
                .await
                .unwrap();
        }
        // T0 + TTL ends a bucket: the first record is in it, the other 19 in the next.
        let (buckets, records, bytes, ends_until, counts_until) = accounting(&store).await;
        assert_eq!((buckets, records, bytes), (2, 20, 20 * size));
        let newest_end = i64::try_from(T0 + TTL + COUNT_SLACK_MS + EXPIRY_MARGIN_MS).unwrap();
        assert!(
            ends_until >= newest_end && counts_until == ends_until,
            "{ends_until} {counts_until}"
        );
        let usage = |at| {
            let store = store.clone();
            async move {
                let u = store.client_usage("c", 100, at).await.unwrap();
                (u.usage.records, u.usage.bytes, u.oldest_expiry)
            }
        };
        let each = u64::try_from(size).unwrap();
        assert_eq!(usage(T0 + 30).await, (20, 20 * each, Some(T0 + TTL)));
        assert_eq!(
            usage(T0 + TTL).await,
            (19, 19 * each, Some(T0 + TTL + COUNT_SLACK_MS)),
            "the first bucket has ended"
        );
        // Both buckets ended: a new key opens a third and forgets them.
        let later = T0 + TTL + 2 * COUNT_SLACK_MS;
        let k = RecordKey::new("op", "c", "after");
        store.begin(&k, &counting(later), later).await.unwrap();
        let (buckets, records, bytes, ..) = accounting(&store).await;
        assert_eq!((buckets, records, bytes), (1, 1, 0));
        assert_eq!(usage(later).await.0, 1);
    }

    /// A scratch store of `begin`'s edges, and a connection to write its hashes by hand
    /// (an older version's, a hostile one's); none without a Redis.
    async fn edges() -> Option<(RedisStore, RedisConnection)> {
        let url = url_or_skip("begin's edges").await?;
        let store = store(&url, &scratch_prefix()).await;
        let conn = store.connection().clone();
        Some((store, conn))
    }

    /// `HSET` of `fields` in `k`'s hash.
    fn hset(store: &RedisStore, k: &RecordKey, fields: &[(&str, &str)]) -> redis::Cmd {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(store.hash_name(k));
        for (f, v) in fields {
            cmd.arg(*f).arg(*v);
        }
        cmd
    }

    /// `HGET` of field `f` of `k`'s hash.
    fn hget(store: &RedisStore, k: &RecordKey, f: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(store.hash_name(k)).arg(f.to_owned());
        cmd
    }

    /// `begin` at the end of a record's TTL: a record that ends exactly now is a new
    /// operation and its old result goes; a millisecond before, it is answered as it stands.
    #[tokio::test]
    async fn begin_at_the_end_of_a_records_ttl() {
        let Some((store, mut conn)) = edges().await else {
            return;
        };
        let now = T0 + 1_000;

        // Completed, its TTL ending exactly now: a new operation, its old result gone.
        let k = RecordKey::new("op", "c", "ends-now");
        let old = new_record("sha256:a", now - TTL);
        store.begin(&k, &old, now - TTL).await.unwrap();
        store
            .complete(&k, old.lease.token, &response(b"old"), now - TTL)
            .await
            .unwrap();
        let _: () = hset(
            &store,
            &k,
            &[("expires_at", &now.to_string()), ("history", "[]")],
        )
        .query_async(&mut conn)
        .await
        .unwrap();
        let fresh = new_record("sha256:b", now);
        match store.begin(&k, &fresh, now).await.unwrap() {
            Begin::Started(r) => {
                assert_eq!((r.attempt, r.operation_id), (1, fresh.operation_id));
            }
            other => panic!("a record ending now is not live: {other:?}"),
        }
        for f in ["status", "body", "headers", "history"] {
            let v: Option<Vec<u8>> = hget(&store, &k, f).query_async(&mut conn).await.unwrap();
            assert!(v.is_none(), "`{f}` of the old operation kept");
        }
        // One millisecond before its end, the same hash is live: answered as it stands.
        let again = new_record("sha256:b", now);
        match store.begin(&k, &again, now - 1).await.unwrap() {
            Begin::Exists(r) => assert_eq!(r.operation_id, fresh.operation_id),
            other => panic!("a live record was taken: {other:?}"),
        }
    }

    /// `begin` over a released record (the same request reclaims it, another is answered)
    /// and a parked one (never taken).
    #[tokio::test]
    async fn begin_over_released_and_parked_records() {
        let Some((store, mut conn)) = edges().await else {
            return;
        };
        let now = T0 + 1_000;

        // Released: the same fingerprint reclaims it (attempt 2, its own id, history
        // kept), another is answered with it; an unknown (parked) one is never taken.
        let k = RecordKey::new("op", "c", "released");
        let first = new_record("sha256:a", now);
        store.begin(&k, &first, now).await.unwrap();
        store.release(&k, first.lease.token, now).await.unwrap();
        let other = new_record("sha256:other", now);
        match store.begin(&k, &other, now).await.unwrap() {
            Begin::Exists(r) => assert!(matches!(r.state, RecordState::Released)),
            other => panic!("another request took a released key: {other:?}"),
        }
        let same = new_record("sha256:a", now);
        match store.begin(&k, &same, now + 1).await.unwrap() {
            Begin::Started(r) => {
                assert_eq!((r.attempt, r.operation_id), (2, first.operation_id));
                assert!(
                    matches!(r.state, RecordState::Processing { lease } if lease.token == same.lease.token)
                );
            }
            other => panic!("the same request did not reclaim it: {other:?}"),
        }
        let history: Option<String> = hget(&store, &k, "history")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            history.is_some_and(|h| h.contains("released")),
            "the reclaim is in the history"
        );
        store
            .park_unknown(&k, same.lease.token, "test", now + 2)
            .await
            .unwrap();
        match store
            .begin(&k, &new_record("sha256:a", now), now + 3)
            .await
            .unwrap()
        {
            Begin::Exists(r) => assert!(matches!(r.state, RecordState::Unknown { .. })),
            other => panic!("a parked record was taken: {other:?}"),
        }
    }

    /// `begin` over a processing record whose lease ended (a duplicate, not a new run)
    /// and one past its TTL, its hash still there (a new operation).
    #[tokio::test]
    async fn begin_over_an_ended_lease_and_an_ended_ttl() {
        let Some((store, _)) = edges().await else {
            return;
        };
        let now = T0 + 1_000;

        // Processing, its lease ended but the record live: a duplicate, never a new run;
        // past its TTL (the hash still there, within the expiry margin): a new operation.
        let k = RecordKey::new("op", "c", "lease-ended");
        let held = new_record("sha256:a", now);
        store.begin(&k, &held, now).await.unwrap();
        match store
            .begin(&k, &new_record("sha256:a", now), held.lease.until + 1)
            .await
            .unwrap()
        {
            Begin::Exists(r) => assert!(matches!(r.state, RecordState::Processing { .. })),
            other => panic!("an ended lease was taken by begin: {other:?}"),
        }
        let past = held.expires_at + 1;
        match store
            .begin(&k, &new_record("sha256:a", past), past)
            .await
            .unwrap()
        {
            Begin::Started(r) => assert_eq!(r.attempt, 1),
            other => panic!("an expired record was answered: {other:?}"),
        }
    }

    /// `begin` over hashes idem did not write: one without `expires_at` (no live record),
    /// one with a hostile `expires_at` (an error, the hash left as it was).
    #[tokio::test]
    async fn begin_over_hashes_it_did_not_write() {
        let Some((store, mut conn)) = edges().await else {
            return;
        };
        let now = T0 + 1_000;

        // A hash an older version wrote without `expires_at`: no live record.
        let k = RecordKey::new("op", "c", "no-expiry");
        let _: () = hset(
            &store,
            &k,
            &[("state", "completed"), ("fingerprint", "sha256:a")],
        )
        .query_async(&mut conn)
        .await
        .unwrap();
        assert!(matches!(
            store
                .begin(&k, &new_record("sha256:a", now), now)
                .await
                .unwrap(),
            Begin::Started(_)
        ));

        // A hostile `expires_at`: an error, and the hash left as it was.
        let k = RecordKey::new("op", "c", "hostile");
        let _: () = hset(
            &store,
            &k,
            &[
                ("state", "completed"),
                ("expires_at", "soon"),
                ("body", "x"),
            ],
        )
        .query_async(&mut conn)
        .await
        .unwrap();
        assert!(
            store
                .begin(&k, &new_record("sha256:a", now), now)
                .await
                .is_err()
        );
        let body: Option<String> = hget(&store, &k, "body")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(body.as_deref(), Some("x"));
    }

    /// `begin` answers a live record before it looks at the budget, in every mode; past
    /// its TTL the checked budget refuses and the others start.
    #[tokio::test]
    async fn begin_answers_a_live_record_before_the_budget() {
        let Some((store, _)) = edges().await else {
            return;
        };
        let now = T0 + 1_000;

        // A live record is answered before the budget is looked at, in every mode; past
        // its TTL, the checked budget refuses and the count-only one counts.
        for (i, budget) in [
            None,
            Some(ClientBudget::COUNT_ONLY),
            Some(ClientBudget::new(0, 0)),
        ]
        .into_iter()
        .enumerate()
        {
            let k = RecordKey::new("op", format!("budget{i}"), "live");
            let held = new_record("sha256:a", now);
            store.begin(&k, &held, now).await.unwrap();
            let dup = NewRecord {
                budget,
                ..new_record("sha256:a", now)
            };
            assert!(
                matches!(
                    store.begin(&k, &dup, now + 1).await.unwrap(),
                    Begin::Exists(_)
                ),
                "{budget:?}"
            );
            let past = held.expires_at;
            let late = NewRecord {
                budget,
                ..new_record("sha256:a", past)
            };
            let begun = store.begin(&k, &late, past).await.unwrap();
            match budget {
                Some(b) if !b.refuses_nothing() => {
                    assert!(matches!(begun, Begin::OverBudget(_)), "{begun:?}");
                }
                _ => assert!(matches!(begun, Begin::Started(_)), "{begun:?}"),
            }
        }
    }
}

/// The store on a Redis Cluster of the tests' own (3 masters, a replica each).
#[cfg(test)]
mod on_a_cluster {
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::store::conformance::redis::{OwnCluster, scratch_prefix};
    use crate::store::conformance::{T0, created, new_record};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite() {
        let Some(cluster) = OwnCluster::start(3, 1) else {
            return;
        };
        let probe = RedisStore::connect(&cluster.url())
            .await
            .expect("the cluster");
        assert!(probe.connection().is_cluster());
        assert_eq!(probe.replica_wait(), Some(ReplicaWait::DEFAULT));
        let store = cluster.store().await;
        crate::store::conformance::run(|| {
            let store = store.clone();
            async move { store.with_prefix(scratch_prefix()) }
        })
        .await;
    }

    /// One node's URL is enough: the store finds the cluster behind it, registers keys
    /// of every slot (no `MOVED` reaches the caller), spreads one client's records over
    /// every master, and lists and purges them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_seed_reaches_every_master() {
        let Some(cluster) = OwnCluster::start(3, 0) else {
            return;
        };
        let store = RedisStore::connect(&cluster.node_url(1))
            .await
            .expect("the cluster")
            .with_prefix(scratch_prefix());
        assert!(store.connection().is_cluster());
        assert_eq!(store.replica_wait(), None, "no replicas, no wait");
        let mut masters = BTreeSet::new();
        for i in 0..60 {
            let key = RecordKey::new("op", "one-tenant", format!("k{i}"));
            let new = NewRecord {
                expires_at: T0 + 1000,
                ..new_record("sha256:a", T0)
            };
            assert!(matches!(
                store.begin(&key, &new, T0).await,
                Ok(Begin::Started(_))
            ));
            store
                .complete(&key, new.lease.token, &created(), T0)
                .await
                .expect("complete");
            masters.insert(cluster.master_of(&store.hash_name(&key)));
        }
        assert_eq!(masters.len(), 3, "one client's records on every master");
        let all = ListQuery {
            limit: 1000,
            ..ListQuery::default()
        };
        let listed = store.list(&all, T0 + 1).await.expect("list");
        assert_eq!(listed.len(), 60);
        let purged = store.purge_expired(T0 + 3_600_000).await.expect("purge");
        assert_eq!(purged, 60);
        assert!(store.list(&all, T0 + 1).await.unwrap().is_empty());
    }

    /// A master killed with SIGKILL: its slots fail (never a second registration) until
    /// its replica takes over; then every key registered before the kill is still there
    /// (each claim waited for the replica), new keys register again, and the operator's
    /// listing covers the new master.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failover_loses_no_acknowledged_claim() {
        let Some(mut cluster) = OwnCluster::start(3, 1) else {
            return;
        };
        let store = cluster.store().await.with_prefix(scratch_prefix());
        let keys: Vec<RecordKey> = (0..90)
            .map(|i| RecordKey::new("op", "c", format!("k{i}")))
            .collect();
        for key in &keys {
            let new = new_record("sha256:a", T0);
            assert!(matches!(
                store.begin(key, &new, T0).await,
                Ok(Begin::Started(_))
            ));
        }
        let victim = cluster.master_of(&store.hash_name(&keys[0]));
        let dead: Vec<&RecordKey> = keys
            .iter()
            .filter(|k| cluster.master_of(&store.hash_name(k)) == victim)
            .collect();
        cluster.kill(victim);
        let started = Instant::now();
        // The dead master's keys fail as unavailable, or are found: never started again.
        match store
            .begin(dead[0], &new_record("sha256:a", T0 + 1), T0 + 1)
            .await
        {
            Ok(Begin::Exists(_)) | Err(StoreError::Unavailable(_)) => {}
            other => panic!("a key of the dead master: {other:?}"),
        }
        cluster.wait_for_failover(Duration::from_secs(20));
        eprintln!("failover after {:?}", started.elapsed());
        let mut registered_again = 0;
        for key in &keys {
            let new = new_record("sha256:a", T0 + 2);
            let answer = retry_unavailable(|| store.begin(key, &new, T0 + 2)).await;
            match answer {
                Begin::Exists(record) => assert_eq!(record.attempt, 1),
                other => {
                    registered_again += 1;
                    eprintln!("{key:?}: {other:?}");
                }
            }
        }
        assert_eq!(
            registered_again, 0,
            "a claim acknowledged by a replica survives"
        );
        let fresh = RecordKey::new("op", "c", "after-failover");
        let new = new_record("sha256:a", T0 + 3);
        let answer = retry_unavailable(|| store.begin(&fresh, &new, T0 + 3)).await;
        assert!(matches!(answer, Begin::Started(_)));
        let all = ListQuery {
            limit: 1000,
            ..ListQuery::default()
        };
        let listed = store.list(&all, T0 + 3).await.expect("list");
        assert_eq!(listed.len(), keys.len() + 1);
    }

    /// `call` until it answers other than unavailable, for 10 s at most (the cluster
    /// client learns the new master within a few tries).
    async fn retry_unavailable<F, Fut>(call: F) -> Begin
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Begin, StoreError>>,
    {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match call().await {
                Ok(begun) => return begun,
                Err(error) if Instant::now() < deadline => {
                    eprintln!("retrying: {error}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("still failing after 10 s: {error}"),
            }
        }
    }
}
