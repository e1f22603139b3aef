//! Stores: where keys, leases and results live.
//!
//! Two traits, [`RecordStore`] (the request path's record calls) and [`OperatorStore`]
//! (the operator's calls), [`Store`] for a backend that has both, several backends, and
//! one conformance suite (`store::conformance`, under the feature `conformance`) that
//! every backend passes:
//!
//! | backend | kind | notes |
//! |---|---|---|
//! | [`MemoryStore`] | one process | the default for tests and single-process services; lost on restart |
//! | `SqliteStore` (feature `sqlite`) | embedded, durable | survives a restart; one writer at a time; transactional |
//! | `PostgresStore` (feature `postgres`) | shared by many instances | a unique key per record; transactional |
//! | `RedisStore` (feature `redis`) | shared by many instances, on one server or a Redis Cluster | one server-side script per change; not transactional with business data |
//!
//! The two SQL stores are one implementation, `SqlStore`, over the database it speaks:
//! `SqliteStore` is `SqlStore<sqlx::Sqlite>`, `PostgresStore` is `SqlStore<sqlx::Postgres>`.
//!
//! Every backend keeps results of at most [`DEFAULT_MAX_RESULT`] bytes unless told
//! otherwise (`with_max_result`): a larger one is refused by `complete` with
//! [`StoreError::TooLarge`] and the record is left as it was; the runtime then stores what
//! [`StoredResponse::body_not_kept`] keeps of it (the status, the headers, the body's
//! length and SHA-256), which every store has room for.
//!
//! # The record
//!
//! A key lives in the namespace of a [`RecordKey`]: the contract's operation, the client's
//! identity and the key itself. Its [`Record`] moves through these states:
//!
//! | from | call | to |
//! |---|---|---|
//! | no record, or one whose TTL has passed | [`RecordStore::begin`] | processing, attempt 1, a new operation id |
//! | released, same fingerprint | [`RecordStore::begin`] | processing, attempt + 1, same operation id |
//! | processing, live lease, caller owns it | [`RecordStore::complete`] | completed, with the result |
//! | processing, live lease, caller owns it | [`RecordStore::release`] | released |
//! | processing, caller owns the lease (live or ended) | [`RecordStore::renew`] | processing, the lease moved (extended, revived, or ended now) |
//! | processing, caller owns the lease | [`RecordStore::park_unknown`] | unknown, with a reason |
//! | processing, lease ended, caller names its owner | [`RecordStore::take_over`] | processing under a new lease, attempt + 1 |
//! | unknown, at the attempt the operator saw | [`OperatorStore::resolve`] | completed with the operator's result, or released |
//!
//! Reclaims, takeovers and resolutions are also appended to the record's short history
//! (see [`ops`]), in the same atomic step; [`OperatorStore::inspect`] reads it back and
//! [`OperatorStore::list`] lists records by state.
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
//! same rules. The runtime passes the store's time, not its own: an instance whose clock
//! is 30 s ahead would otherwise see a running attempt's lease as ended, take it over and
//! run the handler a second time. [`RecordStore::clock`] reads the store's clock
//! (PostgreSQL's `clock_timestamp()`, Redis's `TIME`; `None` for memory and SQLite, which
//! share this machine's); [`StoreClock`] keeps it between readings on the monotonic clock;
//! the [`Idem`](crate::Idem) handle reads it at start and every 30 s (sooner for a lease
//! under 0.3 s) in a task of its own and gives every call [`Idem::now`](crate::Idem::now).
//!
//! Why readings now and then, rather than every statement and script reading the
//! store's clock itself: no statement, script or lease changes (a lease stays an end
//! time, the conformance suite keeps giving times), the runtime's own comparisons (an
//! attempt alive in this process, `Retry-After`, the deadline) use the same time without
//! a round trip, and a request makes no call it did not make before. The price is a
//! bounded error:
//!
//! | source | bound |
//! |---|---|
//! | the reading (the store read its clock somewhere within the round trip) | half the best of three round trips + 1 ms of resolution ([`ClockSample::error_bound`]); about 1.1 ms on loopback (0.1 ms to PostgreSQL, 0.3 ms to Redis, measured) |
//! | the drift of the monotonic clock since the reading | 500 ppm at most (NTP's limit): 15 ms over 30 s; a few ppm on a synchronised machine |
//! | between two instances | the sum of theirs |
//!
//! A step of the instance's system clock changes nothing until the next reading (only
//! the monotonic clock carries the time); a step of the store's clock (a failover to a
//! server whose clock differs) is seen within one refresh. Before the first reading
//! succeeds (the store cannot be read), the instance judges by its own clock and logs
//! it. An instance off by more than a quarter of its lease warns (see `idem::telemetry`).

pub mod budget;
mod clock;
mod forward;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod headers;
mod journal;
pub mod memory;
mod open;
pub mod ops;
mod record;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
mod traits;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transactional;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use budget::{ClientBudget, ClientUsage, OverBudget, Usage};
pub use clock::{ClockSample, StoreClock, sample_clock, store_now};
pub use journal::{Delivery, Due, Step, StepState, StepWrite, step_changed};
pub use memory::MemoryStore;
pub use open::{MAX_URL_LEN, OpenError, OpenOptions, open, redact_url};
pub use ops::{
    AttemptEnd, AttemptSummary, Inspection, ListQuery, Listed, Resolution, ResolutionOutcome,
    ResolutionRecord,
};
pub(crate) use record::BeginInTx;
pub use record::{
    Begin, InFlight, Lease, NewRecord, OperationState, OwnerToken, Record, RecordKey, RecordState,
    StoredResponse,
};
#[cfg(feature = "redis")]
pub use redis::{RedisConnection, RedisStore, ReplicaWait};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sql::SqlStore;
#[cfg(feature = "postgres")]
pub use sql::postgres::{self, PostgresStore};
#[cfg(feature = "sqlite")]
pub use sql::sqlite::{self, SqliteStore};
pub(crate) use traits::InFlightProbe;
pub use traits::{OperatorStore, RecordStore, Store};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use transactional::{KeyMark, OpenTransaction, Registered, Reservation, TransactionalStore};

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
    ///
    /// [`StoreError::is_outcome_unknown`] tells the two kinds apart for a caller that
    /// must say what a write did (`idem ops resolve`): the call failed before it was
    /// sent, or the backend answered that it failed (nothing changed), or it was sent
    /// and its answer never came (it may or may not have taken effect). The request
    /// path treats both alike: it answers 503 and recovery decides the key.
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
    /// [`OperatorStore::resolve`]: there is no record under the key (never registered, or
    /// its TTL has passed).
    #[error("no operation is recorded under this key (never registered, or its TTL has passed)")]
    NotFound,
    /// [`OperatorStore::resolve`]: the record is not parked at the attempt the operator
    /// saw; the message says where it stands.
    #[error("{0}")]
    Changed(String),
}

impl StoreError {
    /// A [`StoreError::Unavailable`] from any error.
    pub fn unavailable(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::Unavailable(err.into())
    }

    /// A [`StoreError::Unavailable`] for a call that was sent and whose answer never
    /// came: a timeout after sending, a connection that broke or closed while the
    /// answer was awaited. Whether it took effect is unknown
    /// ([`StoreError::is_outcome_unknown`]).
    pub fn outcome_unknown(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::Unavailable(Box::new(OutcomeUnknown(err.into())))
    }

    /// A [`StoreError::Unavailable`] for a backend that answered that it is full (Redis
    /// over its `maxmemory`, PostgreSQL out of disk, SQLite's `SQLITE_FULL`): it can be
    /// reached, and refused the write; nothing changed. [`StoreError::is_full`] tells it
    /// apart, and the request path answers 503 `store-full` instead of
    /// `store-unavailable`.
    pub fn full(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::Unavailable(Box::new(StoreFull(err.into())))
    }

    /// Whether the backend answered that it is full ([`StoreError::full`]).
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Unavailable(source) if source.is::<StoreFull>())
    }

    /// Whether the call was sent and its answer never came
    /// ([`StoreError::outcome_unknown`]): a write may or may not have taken effect, and
    /// only reading the record again tells (a request held up in the network may still
    /// arrive). `false` for every other error, whose call either never reached the
    /// backend or was answered with a failure, and for a [`StoreError::Unavailable`]
    /// made by [`StoreError::unavailable`].
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, StoreError::Unavailable(source) if source.is::<OutcomeUnknown>())
    }

    /// The same error with its outcome known: for the failed read that follows a write
    /// the backend answered (a refused resolution), which changed nothing either way.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
    pub(crate) fn known(self) -> StoreError {
        match self {
            StoreError::Unavailable(source) => match source.downcast::<OutcomeUnknown>() {
                Ok(unknown) => StoreError::Unavailable(unknown.0),
                Err(source) => StoreError::Unavailable(source),
            },
            other => other,
        }
    }
}

/// The source of a [`StoreError::Unavailable`] whose backend answered that it is full
/// ([`StoreError::full`]).
#[derive(Debug)]
struct StoreFull(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for StoreFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the store is full: {}", self.0)
    }
}

impl std::error::Error for StoreFull {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The source of a [`StoreError::Unavailable`] whose call was sent and whose answer
/// never came ([`StoreError::outcome_unknown`]).
#[derive(Debug)]
struct OutcomeUnknown(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (the call was sent and its answer lost)", self.0)
    }
}

impl std::error::Error for OutcomeUnknown {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn an_unknown_outcome_is_unavailable_and_says_so() {
        let unknown = StoreError::outcome_unknown("no answer within 10 ms");
        assert!(matches!(unknown, StoreError::Unavailable(_)));
        assert!(unknown.is_outcome_unknown());
        assert_eq!(
            unknown.to_string(),
            "the store is unavailable: no answer within 10 ms (the call was sent and its answer lost)"
        );
        assert!(!StoreError::unavailable("refused").is_outcome_unknown());
        assert!(!StoreError::LeaseLost.is_outcome_unknown());
        assert!(!StoreError::Changed("moved on".into()).is_outcome_unknown());
    }

    #[test]
    fn a_full_store_is_unavailable_and_says_it_is_full() {
        let full = StoreError::full("OOM command not allowed");
        assert!(matches!(full, StoreError::Unavailable(_)));
        assert!(full.is_full());
        assert!(!full.is_outcome_unknown());
        assert_eq!(
            full.to_string(),
            "the store is unavailable: the store is full: OOM command not allowed"
        );
        assert!(!StoreError::unavailable("refused").is_full());
    }

    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
    #[test]
    fn a_known_error_keeps_its_message_without_the_unknown() {
        let known = StoreError::outcome_unknown("reset").known();
        assert!(!known.is_outcome_unknown());
        assert_eq!(known.to_string(), "the store is unavailable: reset");
        assert!(matches!(StoreError::NotFound.known(), StoreError::NotFound));
    }
}
