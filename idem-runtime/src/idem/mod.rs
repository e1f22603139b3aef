//! The `Idem` handle: the store, the client identity and the runtime's settings.

pub(crate) mod allowance;
mod builder;
mod check;
pub(crate) mod clock;
pub(crate) mod names;
pub(crate) mod running;

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::header::{
    CONTENT_ENCODING, CONTENT_LOCATION, CONTENT_TYPE, ETAG, LAST_MODIFIED, LINK, LOCATION,
};

pub use self::builder::IdemBuilder;
pub use self::check::{NotConfigured, Operations};
use self::clock::Clock;
use self::names::Names;
use self::running::Running;
use crate::identity::ClientIdentity;
use crate::store::{ClientBudget, Store, StoreError, UnixMillis};

/// The runtime of idem: the store that keeps keys and results, how to tell clients apart,
/// and the settings of enforcement. Cheap to clone (one `Arc`), and immutable once built:
/// every clone has the same settings.
///
/// [`Idem::new`] (or [`Idem::transactional`]) makes one with the settings listed under
/// "Default"; [`Idem::builder`] (or [`Idem::transactional_builder`]) changes them. Put it
/// into every request with [`Idem::layer`]; the contracted handlers (through `Enforced`)
/// and the status lookups ([`crate::Lookup`]) take it from the request's extensions.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Idem, identity, store::MemoryStore};
///
/// let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
///     .max_stored_body(256 * 1024)
///     .heartbeat(Duration::from_secs(1))
///     .build();
/// let app: axum::Router = axum::Router::new() /* .route(…) */ .layer(idem.layer());
/// ```
///
/// # Default
///
/// - replayed headers: `content-type`, `content-encoding`, `content-location`,
///   `location`, `etag`, `last-modified`, `link` ([`Idem::DEFAULT_REPLAYED_HEADERS`]);
/// - largest stored body: 64 KiB ([`Idem::DEFAULT_MAX_STORED_BODY`]);
/// - the lease an attempt holds, renewed while it runs: 2 s
///   ([`Idem::DEFAULT_HEARTBEAT_LEASE`]);
/// - `Retry-After` when the store is unavailable: 2 s
///   ([`Idem::DEFAULT_UNAVAILABLE_RETRY_AFTER`]);
/// - each client's budget in the store: 10,000 live records and 16 MiB of results
///   ([`ClientBudget::DEFAULT`]; [`IdemBuilder::client_budget`]);
/// - no operation registered with the reconciler, and no test faults.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// The same store as an `Arc<dyn TransactionalStore<Database = DB>>`, boxed, when
    /// the handle was made with `Idem::transactional`.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        allow(dead_code, reason = "read only by the transactional mode")
    )]
    transactional: Option<Arc<dyn Any + Send + Sync>>,
    /// The name of that store's database (sqlx's: `PostgreSQL`, `SQLite`).
    transactional_database: Option<&'static str>,
    /// The same store, asked by the status lookup for attempts whose records are in
    /// their transactions, not committed yet.
    in_flight: Option<Arc<dyn crate::store::InFlightProbe>>,
    identity: Arc<dyn ClientIdentity>,
    replayed_headers: Arc<[HeaderName]>,
    max_stored_body: usize,
    unavailable_retry_after: Duration,
    heartbeat_lease: Duration,
    /// Each client's budget in the store; `None`: none.
    client_budget: Option<ClientBudget>,
    /// Each client's allowance of new keys under its budget (shared by every clone).
    allowances: Arc<allowance::Allowances>,
    /// The attempts alive in this process (shared by every clone).
    running: Arc<Running>,
    /// The store's clock, by which every lease is judged (shared by every clone).
    clock: Arc<Clock>,
    /// The operation names claimed so far (shared by every clone).
    names: Arc<Names>,
    /// The recoverers the reconciler runs ([`IdemBuilder::recover_with`](crate::IdemBuilder::recover_with)).
    recoverers: Vec<crate::reconciler::Registered>,
    /// The deliverers of staged steps ([`IdemBuilder::deliver`](crate::IdemBuilder::deliver)),
    /// and how they are retried.
    outbox: crate::outbox::Deliverers,
    /// Whether requests may ask for a fault of the test-fault protocol (only ever set
    /// with the feature `testing`).
    test_faults: bool,
}

impl Idem {
    /// The headers replayed with a stored result unless [`IdemBuilder::replayed_headers`]
    /// says otherwise: the representation metadata a client needs to read the body as
    /// first sent (`content-encoding` among them: without it, an encoded body is
    /// meaningless bytes) and the headers that point at what the operation made.
    pub const DEFAULT_REPLAYED_HEADERS: [HeaderName; 7] = [
        CONTENT_TYPE,
        CONTENT_ENCODING,
        CONTENT_LOCATION,
        LOCATION,
        ETAG,
        LAST_MODIFIED,
        LINK,
    ];

    /// The largest stored result body unless [`IdemBuilder::max_stored_body`] says
    /// otherwise: 64 KiB.
    ///
    /// Why this size: the answers of the commands idem guards are small — a created
    /// resource's representation, or a 422 that lists a bounded number of broken rules
    /// (the orders example's largest answer, a 422 of 20 field errors, is under 3 KiB) —
    /// while every stored answer is kept for its key's whole TTL in a store that all
    /// clients share: 64 KiB leaves twenty times the room real answers need, and caps what
    /// one key can take at a sixteenth of the 1 MiB the stores accept
    /// ([`crate::store::DEFAULT_MAX_RESULT`]). A larger answer is still sent whole the
    /// first time; its replay has the same status and headers and a problem body that
    /// gives the original's length and SHA-256 ([`crate::store::StoredResponse::body_not_kept`]).
    pub const DEFAULT_MAX_STORED_BODY: usize = 64 * 1024;

    /// The lease an attempt holds in the store, renewed while it runs, unless
    /// [`IdemBuilder::heartbeat`] says otherwise: 2 seconds. An instance that dies with
    /// an attempt in flight is noticed within it.
    pub const DEFAULT_HEARTBEAT_LEASE: Duration = Duration::from_secs(2);

    /// The shortest lease [`IdemBuilder::heartbeat`] takes: 30 ms, three renewals 10 ms
    /// apart.
    pub const MIN_HEARTBEAT_LEASE: Duration = Duration::from_millis(30);

    /// The `Retry-After` of 503 `store-unavailable` unless
    /// [`IdemBuilder::unavailable_retry_after`] says otherwise: 2 seconds.
    pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(2);

    /// A handle over `store` that tells clients apart with `identity`, with the settings
    /// listed under "Default".
    pub fn new(store: impl Store, identity: impl ClientIdentity) -> Idem {
        Idem::builder(store, identity).build()
    }

    /// The builder of a handle over `store` that tells clients apart with `identity`,
    /// starting from the settings listed under "Default".
    pub fn builder(store: impl Store, identity: impl ClientIdentity) -> IdemBuilder {
        IdemBuilder::new(Arc::new(store), None, Arc::new(identity))
    }

    /// A handle over a store that can also write records inside a handler's business
    /// transaction ([`SqliteStore`](crate::store::SqliteStore),
    /// [`PostgresStore`](crate::store::PostgresStore)): a contracted handler that takes
    /// the transaction ([`crate::transaction::Tx`]) runs in the transactional mode, one
    /// that does not runs as with [`Idem::new`]. The settings are those listed under
    /// "Default".
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub fn transactional<S>(store: S, identity: impl ClientIdentity) -> Idem
    where
        S: crate::store::TransactionalStore,
    {
        Idem::transactional_builder(store, identity).build()
    }

    /// The builder of a handle in the transactional mode ([`Idem::transactional`]).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub fn transactional_builder<S>(store: S, identity: impl ClientIdentity) -> IdemBuilder
    where
        S: crate::store::TransactionalStore,
    {
        let store = Arc::new(store);
        let typed: Arc<dyn crate::store::TransactionalStore<Database = S::Database>> =
            store.clone();
        let typed: Arc<dyn Any + Send + Sync> = Arc::new(typed);
        let probe: Arc<dyn crate::store::InFlightProbe> = store.clone();
        let mut builder = IdemBuilder::new(store, Some(typed), Arc::new(identity));
        builder.inner.in_flight = Some(probe);
        builder.inner.transactional_database = Some(<S::Database as sqlx::Database>::NAME);
        builder
    }

    /// Whether this handle honours the test-fault protocol.
    pub(crate) fn test_faults(&self) -> bool {
        self.inner.test_faults
    }

    /// The lease an attempt of `contract` holds in the store at a time.
    pub fn lease_for(&self, contract: &idem_contract::Contract) -> Duration {
        self.inner.heartbeat_lease.min(contract.lease().to_std())
    }

    /// The store.
    ///
    /// A `&dyn Store` rather than the `Arc` the handle keeps: a call through the `Arc`
    /// would go through the forwarding impls of `Arc<T>` and box its future twice. The
    /// request path calls its [`RecordStore`](crate::store::RecordStore) half, operators
    /// and the reconciler its [`OperatorStore`](crate::store::OperatorStore) half.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The store as a transactional store of the database `DB`, if the handle was made
    /// with [`Idem::transactional`] over such a store.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn transactional_store<DB: sqlx::Database>(
        &self,
    ) -> Option<Arc<dyn crate::store::TransactionalStore<Database = DB>>> {
        self.inner
            .transactional
            .as_ref()?
            .downcast_ref::<Arc<dyn crate::store::TransactionalStore<Database = DB>>>()
            .cloned()
    }

    /// The attempt that holds `key` in a transaction not committed yet (the
    /// transactional mode's one commit), if one does; never one for a handle made
    /// without `Idem::transactional`.
    pub(crate) async fn in_flight(
        &self,
        key: &crate::store::RecordKey,
    ) -> Result<Option<crate::store::InFlight>, crate::store::StoreError> {
        match &self.inner.in_flight {
            Some(probe) => probe.in_flight(key).await,
            None => Ok(None),
        }
    }

    /// The name of the database whose transactions this handle shares with handlers
    /// (sqlx's: `PostgreSQL`, `SQLite`), when it was made with `Idem::transactional`.
    pub(crate) fn transactional_database(&self) -> Option<&'static str> {
        self.inner.transactional_database
    }

    /// How clients are told apart.
    pub fn identity(&self) -> &dyn ClientIdentity {
        &*self.inner.identity
    }

    /// The headers replayed with a stored result.
    pub fn replayed_headers(&self) -> &[HeaderName] {
        &self.inner.replayed_headers
    }

    /// The attempts alive in this process.
    pub(crate) fn running(&self) -> &Arc<Running> {
        &self.inner.running
    }

    /// The operation names claimed under this handle.
    pub(crate) fn names(&self) -> &Names {
        &self.inner.names
    }

    /// The deliverers of staged steps, and their policy.
    pub(crate) fn deliverers(&self) -> &crate::outbox::Deliverers {
        &self.inner.outbox
    }

    /// The recoverers registered for the reconciler.
    pub(crate) fn recoverers(&self) -> &[crate::reconciler::Registered] {
        &self.inner.recoverers
    }

    /// Each client's budget in the store ([`IdemBuilder::client_budget`]), or `None`
    /// when there is none.
    pub fn client_budget(&self) -> Option<ClientBudget> {
        self.inner.client_budget
    }

    /// Each client's allowance of new keys under its budget.
    pub(crate) fn allowances(&self) -> &allowance::Allowances {
        &self.inner.allowances
    }

    /// The largest stored result body, in bytes.
    pub fn max_stored_body(&self) -> usize {
        self.inner.max_stored_body
    }

    /// The `Retry-After` of 503 `store-unavailable`, in whole seconds (rounded up, at
    /// least 1).
    pub fn unavailable_retry_after_secs(&self) -> u64 {
        let d = self.inner.unavailable_retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }

    /// The current time on the store's clock, unix milliseconds: what the runtime passes
    /// every store call as `now`. Read from the store at start and every 30 s, and carried
    /// on this process's monotonic clock between readings (see "Time" in the
    /// [`store`](crate::store) docs); this instance's system clock for a store on this
    /// machine (memory, SQLite). A call before the first reading waits for it.
    pub async fn now(&self) -> UnixMillis {
        self.inner.clock.now().await
    }

    /// Deletes the records whose TTL has passed; returns how many.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.now().await;
        self.inner.store.purge_expired(now).await
    }

    /// Spawns a tokio task that calls [`Idem::purge_expired`] every `every` (the first
    /// time after one period), logging failures, until the handle it returns is aborted
    /// or the runtime stops.
    pub fn spawn_purger(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let idem = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match idem.purge_expired().await {
                    Ok(purged) => tracing::debug!(purged, "idem: purged expired records"),
                    Err(error) => {
                        tracing::warn!(error = %error, "idem: purging expired records failed");
                    }
                }
            }
        })
    }
}

impl fmt::Debug for Idem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idem")
            .field("replayed_headers", &self.inner.replayed_headers)
            .field("max_stored_body", &self.inner.max_stored_body)
            .field(
                "unavailable_retry_after",
                &self.inner.unavailable_retry_after,
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use http::header::ETAG;

    use super::*;
    use crate::identity;
    use crate::store::MemoryStore;

    #[test]
    fn defaults_and_settings() {
        let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
        assert_eq!(idem.replayed_headers(), Idem::DEFAULT_REPLAYED_HEADERS);
        assert_eq!(idem.max_stored_body(), 64 * 1024);
        assert_eq!(idem.unavailable_retry_after_secs(), 2);
        let changed = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
            .replayed_headers([ETAG])
            .max_stored_body(10)
            .unavailable_retry_after(Duration::from_millis(1500))
            .build();
        assert_eq!(changed.replayed_headers(), [ETAG]);
        let framing = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
            .replayed_headers([ETAG, http::header::SET_COOKIE, http::header::CONTENT_LENGTH])
            .build();
        assert_eq!(
            framing.replayed_headers(),
            [ETAG],
            "never a session or framing header"
        );
        assert_eq!(changed.max_stored_body(), 10);
        assert_eq!(changed.unavailable_retry_after_secs(), 2, "rounded up");
        let zero = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
            .unavailable_retry_after(Duration::ZERO)
            .build();
        assert_eq!(zero.unavailable_retry_after_secs(), 1, "at least 1");
    }

    #[test]
    fn a_heartbeat_under_the_minimum_is_the_minimum() {
        let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
            .heartbeat(Duration::from_millis(1))
            .build();
        let contract = idem_contract::Contract::PLACEHOLDER;
        assert_eq!(idem.lease_for(&contract), Idem::MIN_HEARTBEAT_LEASE);
    }

    #[tokio::test(start_paused = true)]
    async fn purger_purges() {
        let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
        let handle = idem.spawn_purger(Duration::from_secs(60));
        tokio::time::sleep(Duration::from_secs(61)).await;
        handle.abort();
        assert!(idem.purge_expired().await.is_ok());
    }
}
