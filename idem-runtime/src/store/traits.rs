//! The two halves of a store: the request path's record calls ([`RecordStore`]) and the
//! operator's calls ([`OperatorStore`]), and [`Store`], a backend that has both.

use async_trait::async_trait;

use super::{
    Begin, ClientUsage, Inspection, Lease, ListQuery, Listed, NewRecord, OwnerToken, Record,
    RecordKey, Resolution, Step, StepWrite, StoreError, StoredResponse, UnixMillis,
    journal::{Delivery, Due},
};

/// The record calls of the request path: register a key, read its record, and end,
/// renew, park or take over the attempt that holds it.
///
/// Every method takes `now`, the current time in unix milliseconds ([`UnixMillis`]),
/// from its caller instead of reading a clock; leases and TTLs are judged against it.
/// The runtime passes the store's time ([`RecordStore::clock`], kept between readings by
/// [`crate::store::StoreClock`]), so that all instances judge by one clock.
/// Every method that changes a record does so atomically: one insert-if-absent or one
/// compare-and-set, never a read followed by a separate write. A method that fails
/// changes nothing.
///
/// Any method may also fail with [`StoreError::Unavailable`] (the backend cannot be
/// reached or failed: a connection, a lock timeout, I/O) or [`StoreError::Corrupt`] (the
/// backend holds, or answered with, data it cannot read as a record); the errors listed
/// under each method are the ones it has besides these two.
///
/// The conformance suite (`store::conformance`) states the contract of each method as
/// tests.
#[async_trait]
pub trait RecordStore: Send + Sync + 'static {
    /// Whether [`get`](RecordStore::get) is answered in this process, without a round
    /// trip (the [`MemoryStore`](crate::store::MemoryStore)). The request path then reads
    /// a key's record before the handler's extractor runs, so that a replay is answered
    /// from that one read and the extractor never runs for it; a store over a network keeps
    /// the default, `false`, where the read would cost every new key a round trip.
    fn reads_locally(&self) -> bool {
        false
    }

    /// Registers `key` as processing under `new.lease`, if it may be registered:
    ///
    /// - the key is unknown, or its record's TTL has passed at `now`: a new operation,
    ///   `new.operation_id`, attempt 1, created at `now`, expiring at `new.expires_at`;
    /// - its record is released with the same fingerprint (`new.fingerprint`): the same
    ///   operation, attempt + 1, keeping its operation id and `created_at`.
    ///
    /// Either way the record's `expires_at` is at least `new.lease.until` and
    /// `new.holds_until` (unix milliseconds; [`Record::begin_over`]). Returns
    /// [`Begin::Started`] with the record written; otherwise [`Begin::Exists`] with the
    /// record as it stands, unchanged (held, finished, parked, or released with another
    /// fingerprint).
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError>;

    /// The record of `key`, or `None` when there is none or its TTL has passed at `now`
    /// (unix milliseconds).
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError>;

    /// Stores `response` as the operation's result (state completed, the lease gone), if
    /// `token` owns a lease on `key` that is live at `now` (unix milliseconds).
    ///
    /// # Errors
    ///
    /// - [`StoreError::LeaseLost`] when the record is not processing under `token` with a
    ///   live lease (taken over, finished, parked, or the lease ended);
    /// - [`StoreError::TooLarge`] when the result is larger than the backend keeps
    ///   ([`StoredResponse::size`]); the record is left unchanged, for the runtime to park.
    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Releases `key` (state released, the lease gone) so that a retry with the same
    /// fingerprint runs again, if `token` owns a lease on it that is live at `now` (unix
    /// milliseconds).
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `token` with a
    /// live lease.
    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Moves the end of the lease that `token` owns on `key` to `until` (unix
    /// milliseconds), live lease or ended, and the record's `expires_at` to `until` if
    /// that is later. A running attempt renews its lease with it (the heartbeat), also
    /// after its lease lapsed because renewals came late: as long as its token owns the
    /// record nobody has taken it over (a takeover replaces the token first, and then
    /// fences this out). The runtime also calls it with `until = now` when an attempt has
    /// ended without an outcome, so that recovery may decide without waiting for the
    /// lease to run out. `now` is the current time in unix milliseconds.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `token`.
    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Parks the operation of `key` as unknown with `reason` (a sentence for the
    /// operator), the lease gone, if `token` owns the current lease, live or ended.
    /// Parking needs no live lease: it only stops automatic recovery, and a takeover
    /// (which replaces the token) still fences it out. `now` is the current time in unix
    /// milliseconds.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `token`.
    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// Takes over the processing record of `key` whose lease has ended at `now` (unix
    /// milliseconds) and is owned by `expected`: replaces the lease with `new_lease`,
    /// counts one more attempt, moves `expires_at` to `new_lease.until` if that is later
    /// and appends the takeover to the record's history, as one compare-and-set, so that
    /// exactly one of many concurrent callers wins. Returns the record as written.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record is not processing under `expected`, its
    /// lease is still live, or its TTL has passed (or there is no record).
    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError>;

    /// The store's own clock, read by the store (PostgreSQL's `clock_timestamp()`,
    /// Redis's `TIME`), in unix milliseconds; `None` for a store that lives on this
    /// machine and judges by its clock (memory, SQLite). The runtime reads it now and then
    /// ([`crate::store::StoreClock`]) and passes every other method the store's time as
    /// `now`, so that every instance judges leases by one clock, the store's (see "Time"
    /// in the [`store`](crate::store) docs). Never called on the request path itself.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn clock(&self) -> Result<Option<UnixMillis>, StoreError>;

    /// What `client` holds at `now` (unix milliseconds) for its budget
    /// ([`super::budget`]): its live records, counted up to `cap` (a store may stop
    /// counting there), their results' bytes, and when the oldest expires. Reads only.
    /// The runtime asks once per allowance of new keys, not for every key.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn client_usage(
        &self,
        client: &str,
        cap: u64,
        now: UnixMillis,
    ) -> Result<ClientUsage, StoreError>;

    /// The step journal of the operation `operation_id` under `key` ([`Step`]), in the
    /// order of the steps; empty when it has none (or it was purged). Reads only; `now`
    /// is the current time in unix milliseconds. Asked once by an attempt after the
    /// first, when its handler runs its first step.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn steps(
        &self,
        key: &RecordKey,
        operation_id: crate::OperationId,
        now: UnixMillis,
    ) -> Result<Vec<Step>, StoreError>;

    /// Writes a step's intent or outcome to the journal of `write.operation_id`, as
    /// [`Step::apply`] says, if `token` owns the current lease on `key` (live or ended:
    /// as for [`RecordStore::renew`]) and the record is that operation's; returns the step
    /// as it stands after the write. Committed on its own, whatever transaction the
    /// handler has open. The step lives as long as the record (it is purged with it).
    ///
    /// # Errors
    ///
    /// Nothing is written when it fails:
    ///
    /// - [`StoreError::LeaseLost`] when the record is not processing under `token`, or is
    ///   another operation's;
    /// - [`StoreError::Changed`] when the journal holds a step of another name at
    ///   `write.index`, or `write` breaks a bound ([`StepWrite::check`]);
    /// - [`StoreError::TooLarge`] for a value larger than [`Step::MAX_VALUE`].
    async fn write_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
        now: UnixMillis,
    ) -> Result<Step, StoreError>;
}

/// The operator's calls: list records, inspect one with its history, resolve a parked
/// operation, and purge what has expired. For operators (`idem ops`), the reconciler and
/// the purger, not for the request path: backends may scan.
///
/// Every method takes `now`, the current time in unix milliseconds ([`UnixMillis`]), from
/// its caller; a record whose TTL has passed at `now` is neither listed, inspected nor
/// resolved. Any method may also fail with [`StoreError::Unavailable`] (the backend cannot
/// be reached or failed) or [`StoreError::Corrupt`] (it holds data it cannot read as a
/// record); the errors listed under each method are the ones it has besides these two.
#[async_trait]
pub trait OperatorStore: Send + Sync + 'static {
    /// The records that `query` asks for (an operation, a state, only ended leases)
    /// whose TTL has not passed at `now`, ordered by operation, client and key (bytewise),
    /// at most [`ListQuery::page`] of them, starting after [`ListQuery::after`]: the next
    /// page starts after the last key of this one.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError>;

    /// The record of `key` with the history of its attempts and resolutions, or `None`
    /// when there is none or its TTL has passed at `now`.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`] (a record or a
    /// history that cannot be read).
    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError>;

    /// Resolves the parked operation of `key` as an operator decided (`resolve`: the
    /// attempt seen parked, completed with a result or not applied, who and why), as one
    /// compare-and-set on the record being parked (`unknown`) at
    /// `resolve.expected_attempt` with its TTL not passed at `now`: completed with the
    /// operator's result, or released (not applied), and the resolution (who, when, why)
    /// appended to the record's history. Returns the record as written.
    ///
    /// # Errors
    ///
    /// Nothing is written when it fails:
    ///
    /// - [`StoreError::NotFound`] when there is no record (or its TTL has passed);
    /// - [`StoreError::Changed`] when it is not parked at that attempt (the message says
    ///   where it stands);
    /// - [`StoreError::TooLarge`] for a result larger than the backend keeps.
    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolution,
        now: UnixMillis,
    ) -> Result<Record, StoreError>;

    /// Deletes every record whose TTL has passed at `now`, with its history; returns how
    /// many.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError>;

    /// At most `limit` staged deliveries ([`StepState::Staged`](super::StepState::Staged))
    /// that are due at `now` (their [`Step::next_at`] has come) and whose operation's
    /// record is completed with a success (status 200 to 299) and its TTL not passed, the
    /// longest due first. Reads only; a delivery whose operation is not completed (yet,
    /// or ever) is not listed.
    ///
    /// # Errors
    ///
    /// Only [`StoreError::Unavailable`] and [`StoreError::Corrupt`].
    async fn due_deliveries(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError>;

    /// Claims the staged delivery at position `index` of the journal of `operation_id`
    /// under `key` until `until` (unix milliseconds), as [`Step::claimed`] says, as one
    /// compare-and-set, so that one of many workers sends it. Returns the step as
    /// claimed; its [`Step::calls`] numbers the claim.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when it is not staged or not due at `now` (another worker
    /// claimed or settled it), or there is no such step.
    async fn claim_delivery(
        &self,
        key: &RecordKey,
        operation_id: crate::OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError>;

    /// Settles the claim numbered `claim` of the delivery at position `index`, as
    /// [`Step::settled`] says, as one compare-and-set. Returns the step as written.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the step is no longer staged under that claim.
    #[allow(
        clippy::too_many_arguments,
        reason = "one delivery's coordinates and outcome"
    )]
    async fn settle_delivery(
        &self,
        key: &RecordKey,
        operation_id: crate::OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
        now: UnixMillis,
    ) -> Result<Step, StoreError>;
}

/// A backend that keeps idempotency records: both halves, [`RecordStore`] (the request
/// path) and [`OperatorStore`] (operators, the reconciler and the purger).
///
/// Used as `Arc<dyn Store>` by [`crate::Idem`]. Implemented for every type that
/// implements both halves: a backend implements those two, never this one.
pub trait Store: RecordStore + OperatorStore {}

impl<T: RecordStore + OperatorStore + ?Sized> Store for T {}

/// What a store knows of attempts that hold a key in a transaction not committed yet
/// (the transactional mode's one commit), whose records no other connection can see:
/// every `TransactionalStore` (features `sqlite`, `postgres`), for the status lookup.
#[async_trait]
pub(crate) trait InFlightProbe: Send + Sync {
    /// The attempt that holds `key` so, if one does.
    async fn in_flight(&self, key: &RecordKey) -> Result<Option<super::InFlight>, StoreError>;
}
