//! Stores: where keys, leases and results live.
//!
//! One trait, [`Store`], several backends, one conformance suite (`store::conformance`, under the feature
//! `conformance`) that every
//! backend passes:
//!
//! | backend | kind | notes |
//! |---|---|---|
//! | [`MemoryStore`] | one process | the default for tests and single-process services; lost on restart |
//! | `SqliteStore` (feature `sqlite`) | embedded, durable | survives a restart; one writer at a time; transactional |
//! | `PostgresStore` (feature `postgres`) | shared by many instances | a unique key per record; transactional |
//! | `RedisStore` (feature `redis`) | shared by many instances | one server-side script per change; not transactional with business data |
//!
//! Every backend keeps results of at most [`DEFAULT_MAX_RESULT`] bytes unless told
//! otherwise (`with_max_result`): a larger one is refused by `complete` with
//! [`StoreError::TooLarge`] and the record is left as it was, for the runtime to park.
//!
//! # The record
//!
//! A key lives in the namespace of a [`RecordKey`]: the contract's operation, the client's
//! identity and the key itself. Its [`Record`] moves through these states:
//!
//! | from | call | to |
//! |---|---|---|
//! | no record, or one whose TTL has passed | [`Store::begin`] | processing, attempt 1, a new operation id |
//! | released, same fingerprint | [`Store::begin`] | processing, attempt + 1, same operation id |
//! | processing, live lease, caller owns it | [`Store::complete`] | completed, with the result |
//! | processing, live lease, caller owns it | [`Store::release`] | released |
//! | processing, caller owns the lease (live or ended) | [`Store::renew`] | processing, the lease moved (extended, revived, or ended now) |
//! | processing, caller owns the lease | [`Store::park_unknown`] | unknown, with a reason |
//! | processing, lease ended, caller names its owner | [`Store::take_over`] | processing under a new lease, attempt + 1 |
//! | unknown, at the attempt the operator saw | [`Store::resolve`] | completed with the operator's result, or released |
//!
//! Reclaims, takeovers and resolutions are also appended to the record's short history
//! (see [`ops`]), in the same atomic step; [`Store::inspect`] reads it back and
//! [`Store::list`] lists records by state.
//!
//! Every record expires `ttl` after its first attempt (`expires_at`); after that the key
//! names a new operation and `begin` replaces the record. A record never expires while
//! a lease on it may still be live: `begin` and `take_over` move `expires_at` to the end
//! of the lease they grant when that is later (a retry near the end of the TTL holds its
//! lease past it), so a duplicate of a running attempt is never taken for a new
//! operation and the status lookup never reports a running attempt as not found.
//!
//! # Fencing
//!
//! Each attempt holds a [`Lease`]: a random [`OwnerToken`] and the time the lease ends.
//! `complete` and `release` succeed only for the token of a lease that is still live;
//! `take_over` succeeds only for the token of a lease that has ended, and replaces it, so a
//! worker whose lease ran out can never overwrite what recovery decided. `renew` and
//! `park_unknown` need the current token, live lease or ended: as long as the token owns
//! the record nobody has taken it over, and a takeover (which replaces the token) fences
//! them out from then on.
//!
//! # Time
//!
//! Every method takes `now` in unix milliseconds ([`UnixMillis`]) instead of reading a
//! clock, so that tests control time and all instances of a service judge leases by the
//! same rules.

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod headers;
pub mod memory;
mod open;
pub mod ops;
#[cfg(feature = "postgres")]
pub mod postgres;
mod record;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transactional;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

use std::sync::Arc;

use async_trait::async_trait;

pub use memory::MemoryStore;
pub use open::{MAX_URL_LEN, OpenError, OpenOptions, open, redact_url};
pub use ops::{
    AttemptEnd, AttemptSummary, Inspection, ListQuery, Listed, OperatorResolution, Resolve,
    ResolveAs,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use record::{
    Begin, Lease, NewRecord, OperationState, OwnerToken, Record, RecordKey, RecordState,
    StoredResponse,
};
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use transactional::{OpenTransaction, Reservation, TransactionalStore};

/// The largest result a store keeps unless told otherwise, in bytes (1 MiB), counted as
/// [`StoredResponse::size`] counts: the body and the selected headers' names and values.
pub const DEFAULT_MAX_RESULT: usize = 1024 * 1024;

/// `Err(TooLarge)` when `response` is larger than `limit` bytes: the check every backend
/// makes before it writes a result.
pub(crate) fn check_size(response: &StoredResponse, limit: usize) -> Result<(), StoreError> {
    let size = response.size();
    if size > limit {
        Err(StoreError::TooLarge { size, limit })
    } else {
        Ok(())
    }
}

/// A point in time: milliseconds since the unix epoch, UTC.
pub type UnixMillis = u64;

/// The current time in unix milliseconds, from the system clock.
pub fn unix_now() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's token does not own the lease the call needs: for `complete` and
    /// `release`, a live lease; for `park_unknown`, the current lease; for `take_over`,
    /// the current lease, ended. Someone else took over, the record was finished, or (for
    /// `take_over`) the lease has not ended yet.
    #[error("the lease is lost: another attempt or recovery holds the record")]
    LeaseLost,
    /// The backend cannot be reached or failed (a connection, a lock timeout, I/O).
    #[error("the store is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend holds data it cannot read back as a record.
    #[error("the store holds a record it cannot read: {0}")]
    Corrupt(String),
    /// The result is larger than the backend keeps.
    #[error("the result is {size} bytes; the store keeps at most {limit} bytes")]
    TooLarge {
        /// The result's size in bytes ([`StoredResponse::size`]).
        size: usize,
        /// The backend's limit in bytes.
        limit: usize,
    },
    /// The transaction handed to the handler is no longer the one that began: the
    /// database aborted it (a failed statement, a conflict clause that rolls back) or the
    /// handler ended it (the transactional mode).
    #[error("the attempt's transaction has ended: {0}")]
    TransactionEnded(String),
    /// [`Store::resolve`]: there is no record under the key (never registered, or its
    /// TTL has passed).
    #[error("no operation is recorded under this key (never registered, or its TTL has passed)")]
    NotFound,
    /// [`Store::resolve`]: the record is not parked at the attempt the operator saw; the
    /// message says where it stands.
    #[error("{0}")]
    Changed(String),
}

impl StoreError {
    /// A [`StoreError::Unavailable`] from any error.
    pub fn unavailable(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::Unavailable(err.into())
    }
}

/// A backend that keeps idempotency records.
///
/// Used as `Arc<dyn Store>`. Every method takes `now` in unix milliseconds. Every method
/// that changes a record does so atomically: one insert-if-absent, one compare-and-set,
/// never a read followed by a separate write.
///
/// The conformance suite (`store::conformance`) states the contract of each method as
/// tests.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Registers `key` as processing under `new.lease`, atomically, if it may be
    /// registered: when the key is unknown, when its record's TTL has passed (a new
    /// operation with `new.operation_id`, attempt 1, created at `now`), or when the record
    /// is released with the same fingerprint (the same operation, attempt + 1, its own
    /// `operation_id` and `created_at`). Either way the record's `expires_at` is at least
    /// `new.lease.until` ([`Record::begin_over`]). Returns [`Begin::Started`] with the
    /// record written; otherwise [`Begin::Exists`] with the record as it stands, unchanged.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError>;

    /// The record of `key`, or `None` when there is none or its TTL has passed at `now`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError>;

    /// Stores `response` as the operation's result (state completed), if `token` owns a
    /// lease that is live at `now`.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when it does not; [`StoreError::TooLarge`] when the
    /// result is larger than the backend keeps (the record is then left unchanged);
    /// [`StoreError::Unavailable`].
    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Releases the key (state released) so that a retry with the same fingerprint runs
    /// again, if `token` owns a lease that is live at `now`.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when it does not; [`StoreError::Unavailable`].
    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Moves the end of the lease that `token` owns to `until`, live lease or ended, and
    /// the record's `expires_at` to `until` if that is later. A running attempt renews
    /// its lease with it (the heartbeat), also after its lease lapsed because renewals
    /// came late: as long as its token owns the record nobody has taken it over (a
    /// takeover replaces the token first, and then fences this out). The runtime also
    /// calls it with `until = now` when an attempt has ended without an outcome, so that
    /// recovery may decide without waiting for the lease to run out.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `token`;
    /// [`StoreError::Unavailable`].
    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Parks the operation as unknown with `reason`, if `token` owns the current lease,
    /// live or ended. Parking needs no live lease: it only stops automatic recovery, and
    /// a takeover (which replaces the token) still fences it out.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `token`;
    /// [`StoreError::Unavailable`].
    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Takes over a processing record whose lease has ended at `now` and is owned by
    /// `expected`: replaces the lease with `new_lease`, counts one more attempt and moves
    /// `expires_at` to `new_lease.until` if that is later, as one compare-and-set, so that
    /// exactly one of many concurrent callers wins. Returns the record as written.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `expected`, its
    /// lease is still live, or its TTL has passed; [`StoreError::Unavailable`].
    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError>;

    /// Deletes every record whose TTL has passed at `now`; returns how many.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`].
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError>;

    /// The records that `query` asks for whose TTL has not passed at `now`, ordered by
    /// operation, client and key (bytewise), at most [`ListQuery::page`] of them. The
    /// next page starts after the last key of this one. For operators and the
    /// reconciler, not for the request path: backends may scan.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError>;

    /// The record of `key` with the history of its attempts and resolutions, or `None`
    /// when there is none or its TTL has passed at `now`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError>;

    /// Resolves a parked operation as an operator decided, as one compare-and-set on the
    /// record being parked (`unknown`) at `resolve.expected_attempt` and its TTL not
    /// passed: completed with the operator's result, or released (not applied), and the
    /// resolution (who, when, why) appended to the record's history. Returns the record
    /// as written.
    ///
    /// # Errors
    ///
    /// [`StoreError::NotFound`] when there is no record; [`StoreError::Changed`] when it
    /// is not parked at that attempt (the message says where it stands), and nothing
    /// was written; [`StoreError::TooLarge`] for a result larger than the backend keeps;
    /// [`StoreError::Unavailable`].
    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolve,
        now: UnixMillis,
    ) -> Result<Record, StoreError>;
}

#[async_trait]
impl<T: Store + ?Sized> Store for Arc<T> {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        (**self).begin(key, new, now).await
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        (**self).get(key, now).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        (**self).complete(key, token, response, now).await
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        (**self).release(key, token, now).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        (**self).renew(key, token, until, now).await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        (**self).park_unknown(key, token, reason, now).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        (**self).take_over(key, expected, new_lease, now).await
    }

    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        (**self).purge_expired(now).await
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        (**self).list(query, now).await
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        (**self).inspect(key, now).await
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolve,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        (**self).resolve(key, resolve, now).await
    }
}
