//! The builder of an [`Idem`] handle.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::{Clock, Idem, Inner};
use crate::identity::ClientIdentity;
use crate::store::{ClientBudget, Store};

/// The settings of an [`Idem`] handle, set one by one, then [`IdemBuilder::build`]: made
/// by [`Idem::builder`] or [`Idem::transactional_builder`], with the settings listed under
/// [`Idem`]'s "Default". The handle it builds cannot be changed: every clone shares them.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Idem, identity, store::MemoryStore};
///
/// let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
///     .heartbeat(Duration::from_millis(500))   // a dead instance is noticed within 0.5 s
///     .max_stored_body(256 * 1024)
///     .build();
/// assert_eq!(idem.max_stored_body(), 256 * 1024);
/// ```
#[must_use = "a builder does nothing until `build` makes the handle"]
pub struct IdemBuilder {
    pub(super) inner: Inner,
}

impl IdemBuilder {
    /// A builder over `store` (and, in the transactional mode, the same store as an
    /// `Arc<dyn TransactionalStore<Database = DB>>`, boxed) with the default settings.
    pub(super) fn new(
        store: Arc<dyn Store>,
        transactional: Option<Arc<dyn Any + Send + Sync>>,
        identity: Arc<dyn ClientIdentity>,
    ) -> IdemBuilder {
        let clock = Arc::new(Clock::new(store.clone(), Idem::DEFAULT_HEARTBEAT_LEASE));
        IdemBuilder {
            inner: Inner {
                store,
                clock,
                transactional,
                transactional_database: None,
                in_flight: None,
                identity,
                replayed_headers: Idem::DEFAULT_REPLAYED_HEADERS.into(),
                max_stored_body: Idem::DEFAULT_MAX_STORED_BODY,
                unavailable_retry_after: Idem::DEFAULT_UNAVAILABLE_RETRY_AFTER,
                heartbeat_lease: Idem::DEFAULT_HEARTBEAT_LEASE,
                client_budget: Some(ClientBudget::DEFAULT),
                allowances: Arc::default(),
                running: Arc::default(),
                names: Arc::default(),
                recoverers: Vec::new(),
                outbox: crate::outbox::Deliverers::default(),
                test_faults: false,
            },
        }
    }

    /// The headers of a result that are stored and replayed with it (names are matched
    /// case-insensitively; every value of a repeated header is kept, in order). Status and
    /// body are always replayed. The framing and session headers of
    /// [`StoredResponse::NEVER_REPLAYED`](crate::store::StoredResponse::NEVER_REPLAYED)
    /// (`content-length`, `transfer-encoding`, `set-cookie`, …) are left out even when
    /// named: a stored copy would break the replay's framing or hand a session on.
    pub fn replayed_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.inner.replayed_headers = names
            .into_iter()
            .filter(|name| !crate::store::StoredResponse::is_never_replayed(name))
            .collect();
        self
    }

    /// The largest result body that is stored, in bytes
    /// ([`Idem::DEFAULT_MAX_STORED_BODY`] unless set).
    ///
    /// A larger result is still sent whole to the client that caused it, and its outcome
    /// is recorded: a retry gets the same status and replayed headers with
    /// `Idempotent-Replayed: true`, and in place of the body a problem that gives the
    /// original body's length and SHA-256
    /// ([`StoredResponse::body_not_kept`](crate::store::StoredResponse::body_not_kept)).
    /// A warning is logged. Nothing is parked.
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.inner.max_stored_body = bytes;
        self
    }

    /// The `Retry-After` of the 503 answered when the store fails before the handler runs
    /// (sent in whole seconds, rounded up, at least 1).
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.inner.unavailable_retry_after = after;
        self
    }

    /// The lease an attempt holds in the store, renewed every third of it while the
    /// attempt runs (a heartbeat), so that an attempt whose instance died is noticed
    /// within one lease, whatever the contract's per-attempt timeout; the attempt itself
    /// still has the whole per-attempt timeout. A contract whose per-attempt timeout (or
    /// deadline) is shorter uses that. A lease under [`Idem::MIN_HEARTBEAT_LEASE`] (30 ms)
    /// is taken as that: renewals come every 10 ms at the most.
    pub fn heartbeat(mut self, lease: Duration) -> Self {
        self.inner.heartbeat_lease = lease.max(Idem::MIN_HEARTBEAT_LEASE);
        self
    }

    /// Each client's budget in the store: at most `budget.records` live records and
    /// `budget.bytes` bytes of stored results per client identity
    /// ([`ClientBudget::DEFAULT`] unless set: 10,000 records, 16 MiB; its docs give the
    /// reasoning). A new key from a client at its budget is refused before the handler
    /// runs, with 429 `client-budget-exhausted` and a `Retry-After` at the expiry of the
    /// client's oldest record; retries and replays of keys it holds are answered as
    /// always. What is counted, and how far a count may overshoot, is
    /// [`crate::store::budget`].
    pub fn client_budget(mut self, budget: ClientBudget) -> Self {
        self.inner.client_budget = Some(budget);
        self
    }

    /// No client budget: every new key is registered while the store has room (one
    /// client may then fill the store for everyone). For a store with one client, or one
    /// whose size is bounded otherwise.
    pub fn without_client_budget(mut self) -> Self {
        self.inner.client_budget = None;
        self
    }

    /// Honours the test-fault protocol (feature `testing`): a request with the header
    /// `Idem-Test-Fault` makes its attempt answer 429, 503 or 400 instead of running the
    /// handler, or die after the handler's effect (see [`TestFault`](crate::TestFault) for
    /// the table). Only for a service under the conformance harness (the `idem-testing`
    /// crate, `idem::testing`): never in production.
    #[cfg(feature = "testing")]
    pub fn test_faults(mut self) -> Self {
        self.inner.test_faults = true;
        self
    }

    /// The operation names claimed under the handle being built.
    pub(crate) fn names(&self) -> &super::Names {
        &self.inner.names
    }

    /// The recoverers the reconciler will run.
    pub(crate) fn recoverers_mut(&mut self) -> &mut Vec<crate::reconciler::Registered> {
        &mut self.inner.recoverers
    }

    /// The deliverers of staged steps, and their policy.
    pub(crate) fn deliverers_mut(&mut self) -> &mut crate::outbox::Deliverers {
        &mut self.inner.outbox
    }

    /// The handle, with these settings for good.
    ///
    /// Inside a tokio runtime, starts reading the store's clock at once (see
    /// [`Idem::now`]); otherwise the first request does.
    pub fn build(mut self) -> Idem {
        let clock = Clock::new(self.inner.store.clone(), self.inner.heartbeat_lease);
        self.inner.clock = Arc::new(clock);
        self.inner.clock.start();
        Idem {
            inner: Arc::new(self.inner),
        }
    }
}

impl fmt::Debug for IdemBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemBuilder").finish_non_exhaustive()
    }
}
