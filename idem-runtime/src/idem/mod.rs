//! The `Idem` handle: the store, the client identity and the runtime's settings.

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

use self::names::Names;
use self::running::Running;
use crate::identity::ClientIdentity;
use crate::store::{Store, StoreError, unix_now};

/// The headers replayed with a stored result unless [`Idem::with_replayed_headers`] says
/// otherwise: the representation metadata a client needs to read the body as first sent
/// (`content-encoding` among them: without it, an encoded body is meaningless bytes) and
/// the headers that point at what the operation made.
pub const DEFAULT_REPLAYED_HEADERS: [HeaderName; 7] = [
    CONTENT_TYPE,
    CONTENT_ENCODING,
    CONTENT_LOCATION,
    LOCATION,
    ETAG,
    LAST_MODIFIED,
    LINK,
];

/// The largest stored result body unless [`Idem::with_max_stored_body`] says otherwise:
/// 1 MiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

/// The lease an attempt holds in the store, renewed while it runs, unless
/// [`Idem::with_heartbeat`] says otherwise: 2 seconds. An instance that dies with an
/// attempt in flight is noticed within it.
pub const DEFAULT_HEARTBEAT_LEASE: Duration = Duration::from_secs(2);

/// The shortest lease [`Idem::with_heartbeat`] takes: 30 ms, three renewals 10 ms apart.
pub const MIN_HEARTBEAT_LEASE: Duration = Duration::from_millis(30);

/// The `Retry-After` of 503 `store-unavailable` unless
/// [`Idem::with_unavailable_retry_after`] says otherwise: 2 seconds.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(2);

/// The runtime of idem: the store that keeps keys and results, how to tell clients apart,
/// and the settings of enforcement. Cheap to clone (one `Arc`).
///
/// Put it into every request with [`Idem::layer`]; the contracted handlers (through
/// `Enforced`) and the status lookups ([`crate::Lookup`]) take it from the request's
/// extensions.
///
/// ```
/// use idem_runtime::{Idem, identity, store::MemoryStore};
///
/// let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"))
///     .with_max_stored_body(256 * 1024);
/// let app: axum::Router = axum::Router::new() /* .route(…) */ .layer(idem.layer());
/// ```
///
/// # Default
///
/// - replayed headers: `content-type`, `content-encoding`, `content-location`,
///   `location`, `etag`, `last-modified`, `link` ([`DEFAULT_REPLAYED_HEADERS`]);
/// - largest stored body: 1 MiB ([`DEFAULT_MAX_STORED_BODY`]);
/// - `Retry-After` when the store is unavailable: 2 s
///   ([`DEFAULT_UNAVAILABLE_RETRY_AFTER`]).
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    store: Arc<dyn Store>,
    /// The same store as an `Arc<dyn TransactionalStore<Database = DB>>`, boxed, when
    /// the handle was made with `Idem::transactional`.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        allow(dead_code, reason = "read only by the transactional mode")
    )]
    transactional: Option<Arc<dyn Any + Send + Sync>>,
    identity: Arc<dyn ClientIdentity>,
    replayed_headers: Arc<[HeaderName]>,
    max_stored_body: usize,
    unavailable_retry_after: Duration,
    heartbeat_lease: Duration,
    /// The attempts alive in this process (shared by every clone).
    running: Arc<Running>,
    /// The operation names claimed so far (shared by every clone).
    names: Arc<Names>,
    /// The recoverers the reconciler runs ([`Idem::recover_with`]).
    recoverers: Vec<crate::reconciler::Registered>,
    /// Whether requests may ask for a fault of the test-fault protocol (only ever set
    /// with the feature `testing`).
    test_faults: bool,
}

impl Idem {
    /// A handle over `store` that tells clients apart with `identity`, with the settings
    /// listed under "Default".
    pub fn new(store: impl Store, identity: impl ClientIdentity) -> Idem {
        Idem::with_store(Arc::new(store), None, identity)
    }

    /// A handle over a store that can also write records inside a handler's business
    /// transaction ([`SqliteStore`](crate::SqliteStore), `PostgresStore`): a contracted
    /// handler that takes the transaction ([`crate::transaction::Tx`]) runs in the
    /// transactional mode, one that does not runs as with [`Idem::new`].
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub fn transactional<S>(store: S, identity: impl ClientIdentity) -> Idem
    where
        S: crate::store::TransactionalStore,
    {
        let store = Arc::new(store);
        let typed: Arc<dyn crate::store::TransactionalStore<Database = S::Database>> =
            store.clone();
        Idem::with_store(store, Some(Arc::new(typed)), identity)
    }

    fn with_store(
        store: Arc<dyn Store>,
        transactional: Option<Arc<dyn Any + Send + Sync>>,
        identity: impl ClientIdentity,
    ) -> Idem {
        Idem {
            inner: Arc::new(Inner {
                store,
                transactional,
                identity: Arc::new(identity),
                replayed_headers: DEFAULT_REPLAYED_HEADERS.into(),
                max_stored_body: DEFAULT_MAX_STORED_BODY,
                unavailable_retry_after: DEFAULT_UNAVAILABLE_RETRY_AFTER,
                heartbeat_lease: DEFAULT_HEARTBEAT_LEASE,
                running: Arc::default(),
                names: Arc::default(),
                recoverers: Vec::new(),
                test_faults: false,
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::make_mut(&mut self.inner)
    }

    /// The headers of a result that are stored and replayed with it (names are matched
    /// case-insensitively; every value of a repeated header is kept, in order). Status and
    /// body are always replayed.
    pub fn with_replayed_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Idem {
        self.inner_mut().replayed_headers = names.into_iter().collect();
        self
    }

    /// The largest result body that is stored, in bytes.
    ///
    /// A larger result is still sent to the client that caused it, but it cannot be
    /// replayed: the operation is parked as `unknown` with a reason that says so, and an
    /// error is logged.
    pub fn with_max_stored_body(mut self, bytes: usize) -> Idem {
        self.inner_mut().max_stored_body = bytes;
        self
    }

    /// The `Retry-After` of the 503 answered when the store fails before the handler runs
    /// (sent in whole seconds, rounded up, at least 1).
    pub fn with_unavailable_retry_after(mut self, after: Duration) -> Idem {
        self.inner_mut().unavailable_retry_after = after;
        self
    }

    /// The lease an attempt holds in the store, renewed every third of it while the
    /// attempt runs (a heartbeat), so that an attempt whose instance died is noticed
    /// within one lease, whatever the contract's per-attempt timeout; the attempt itself
    /// still has the whole per-attempt timeout. A contract whose per-attempt timeout (or
    /// deadline) is shorter uses that. A lease under [`MIN_HEARTBEAT_LEASE`] (30 ms) is
    /// taken as that: renewals come every 10 ms at the most.
    pub fn with_heartbeat(mut self, lease: Duration) -> Idem {
        self.inner_mut().heartbeat_lease = lease.max(MIN_HEARTBEAT_LEASE);
        self
    }

    /// Honours the test-fault protocol (feature `testing`): a request with the header
    /// `Idem-Test-Fault` makes its attempt answer 429, 503 or 400 instead of running the
    /// handler, or die after the handler's effect (see [`TestFault`](crate::TestFault) for the table).
    /// Only for a service under the conformance harness (the `idem-testing` crate,
    /// `idem::testing`): never call it in production.
    #[cfg(feature = "testing")]
    pub fn with_test_faults(mut self) -> Idem {
        self.inner_mut().test_faults = true;
        self
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

    /// The recoverers registered for the reconciler.
    pub(crate) fn recoverers(&self) -> &[crate::reconciler::Registered] {
        &self.inner.recoverers
    }

    pub(crate) fn recoverers_mut(&mut self) -> &mut Vec<crate::reconciler::Registered> {
        &mut self.inner_mut().recoverers
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

    /// Deletes the records whose TTL has passed; returns how many.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.inner.store.purge_expired(unix_now()).await
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
    use super::*;
    use crate::identity;
    use crate::store::MemoryStore;

    #[test]
    fn defaults_and_setters() {
        let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
        assert_eq!(idem.replayed_headers(), DEFAULT_REPLAYED_HEADERS);
        assert_eq!(idem.max_stored_body(), 1024 * 1024);
        assert_eq!(idem.unavailable_retry_after_secs(), 2);
        let copy = idem.clone();
        let changed = idem
            .with_replayed_headers([ETAG])
            .with_max_stored_body(10)
            .with_unavailable_retry_after(Duration::from_millis(1500));
        assert_eq!(changed.replayed_headers(), [ETAG]);
        assert_eq!(changed.max_stored_body(), 10);
        assert_eq!(changed.unavailable_retry_after_secs(), 2);
        assert_eq!(
            copy.max_stored_body(),
            1024 * 1024,
            "clones are not changed"
        );
        assert_eq!(
            copy.with_unavailable_retry_after(Duration::ZERO)
                .unavailable_retry_after_secs(),
            1
        );
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
