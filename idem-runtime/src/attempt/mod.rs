//! The attempt: run the handler under its lease, then record its answer, release the
//! key, or hand the operation to recovery.
//!
//! | the handler | without a transaction | in the transactional mode |
//! |---|---|---|
//! | answers a success or a permanent 4xx | stored, then answered | stored in the transaction, committed, then answered |
//! | answers a status the contract declares retryable | the key is released; answered as is | rolled back, released; answered as is |
//! | answers another 5xx | its outcome is unknown: the lease ends now and recovery decides on the next retry; 503 `attempt-failed` | rolled back, released; answered as is |
//! | panics | as a 5xx; 503 `attempt-failed` | rolled back, released; 503 `attempt-rolled-back` |
//! | outlasts its time | its outcome is unknown; 503 `attempt-timed-out` | rolled back, released; 503 `attempt-rolled-back` |
//!
//! Whenever the store write that an answer depends on fails (complete, release, the end
//! of the lease, park), the answer is 503 `store-unavailable`: an answer never claims a
//! state that was not recorded. When the lease was lost (recovery took the record over),
//! the answer is 503 `attempt-timed-out`, or `attempt-rolled-back` in the transactional
//! mode: the attempt that holds the record now decides.

mod current;
mod detach;
mod guard;
mod journal;
mod log;
mod recovered;
mod run;
mod settle;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transactional;
#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
#[path = "transactional_none.rs"]
mod transactional;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;
use http::response::Parts;
use idem_contract::Contract;
use tokio::time::Instant;

pub use self::current::Attempt;
pub use self::guard::Guard;
pub use self::journal::{CallError, DownstreamKey, Interrupted, Journal, StepError};
use self::journal::{Interruption, Shared};
use crate::answer::{self, with_operation_id};
use crate::idem::allowance::Reservation;
use crate::idem::running::Alive;
use crate::mode::{AttemptTx, Mode};
use crate::replay::select_headers;
use crate::store::{NewRecord, OwnerToken, RecordKey, StoreError, StoredResponse};
use crate::telemetry::Outcome;
use crate::{Idem, OperationId};

/// The longest share of a lease kept back from the handler to record its outcome: the
/// handler (and the reading of its answer's body) must end this much before the lease,
/// so that the store write that settles the attempt is made while the lease is still
/// live. A tenth of the lease, at most one second.
const SETTLE_MARGIN: Duration = Duration::from_secs(1);

/// How an attempt ended without an answer to record.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ended {
    /// The handler panicked (or its answer could not be made).
    Panicked,
    /// The handler, or the reading of its answer's body, ran out of its time.
    TimedOut,
    /// The handler's answer's body failed while it was read.
    BodyFailed,
    /// The handler answered a server error that the contract does not declare
    /// retryable.
    ServerError(u16),
}

impl Ended {
    fn describe(self) -> String {
        match self {
            Ended::Panicked => "failed before it answered".into(),
            Ended::TimedOut => "did not finish within its time".into(),
            Ended::BodyFailed => "failed while its answer was read".into(),
            Ended::ServerError(status) => format!(
                "answered {status}, a server error that the contract does not declare retryable"
            ),
        }
    }
}

/// One attempt that holds the key's lease.
pub(crate) struct Held {
    pub(crate) idem: Idem,
    pub(crate) contract: &'static Contract,
    pub(crate) key: Arc<RecordKey>,
    pub(crate) token: OwnerToken,
    /// When the attempt's time ends (the contract's lease: its per-attempt timeout, or
    /// else its deadline), on the monotonic clock. The lease in the store is shorter and
    /// renewed meanwhile ([`crate::idem::running::Running`]).
    pub(crate) deadline: Instant,
    pub(crate) operation_id: OperationId,
    pub(crate) attempt: u32,
    /// How the attempt's outcome is recorded: plain, or in its transaction.
    pub(crate) mode: Mode,
    /// How the settlement ended, first recorded first ([`Held::settled`]).
    settled: OnceLock<Outcome>,
    /// The step journal, once the handler asked for it ([`Held::journal`]).
    journal: OnceLock<Arc<Shared>>,
    /// For a transaction deferred to the handler's first write ([`Held::attach_deferred`]):
    /// whether it has begun.
    tx_opened: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The record as registered inside the attempt's transaction (the transactional
    /// mode's one commit): nothing of it is left once the transaction rolls back.
    pub(crate) registered_as: Option<Box<NewRecord>>,
    /// The bytes of the client's allowance held for this attempt's result, until the
    /// result is built ([`Held::reserve`]).
    reservation: Mutex<Option<Reservation>>,
    /// Holds the lease, even past its end, and renews it in the store, for as long as
    /// this attempt is alive ([`crate::idem::running::Running`]).
    _alive: Alive,
}

impl Held {
    /// The attempt that holds `key` under `token`, from `started` (on the monotonic
    /// clock): it counts as running in this process and renews its lease until dropped.
    #[allow(clippy::too_many_arguments, reason = "the fields of one attempt")]
    pub(crate) fn start(
        idem: &Idem,
        contract: &'static Contract,
        key: &Arc<RecordKey>,
        token: OwnerToken,
        started: Instant,
        operation_id: OperationId,
        attempt: u32,
    ) -> Held {
        Held {
            idem: idem.clone(),
            contract,
            key: Arc::clone(key),
            token,
            deadline: started + contract.lease().to_std(),
            operation_id,
            attempt,
            mode: Mode::Plain,
            settled: OnceLock::new(),
            journal: OnceLock::new(),
            tx_opened: None,
            registered_as: None,
            reservation: Mutex::new(None),
            _alive: idem
                .running()
                .enter(idem, key, token, idem.lease_for(contract), started),
        }
    }

    /// Attaches the attempt's transaction. With a store whose transaction holds the only
    /// write lock (SQLite), the heartbeat pauses: no other writer can act on the record
    /// until the transaction ends, and the renewal would wait for that lock. It pauses
    /// too when the key was registered inside the transaction: no other connection sees
    /// the record, and the transaction's mark on the key fences the attempt.
    pub(crate) fn attach(&mut self, tx: AttemptTx) {
        if tx.fences_by_lock() || self.registered_as.is_some() {
            self.idem.running().pause(self.token);
        }
        self.mode = Mode::Transactional(tx);
    }

    /// Attaches the attempt's transaction, deferred to the handler's first write through
    /// it (a step journal on a store whose transaction holds the only write lock,
    /// SQLite): the heartbeat goes on, and the journal records steps, until it begins;
    /// then the heartbeat pauses and the journal refuses further steps (they could not
    /// be recorded before their call while the lock is held).
    pub(crate) async fn attach_deferred(&mut self, tx: AttemptTx) {
        let opened = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (idem, token, flag) = (self.idem.clone(), self.token, Arc::clone(&opened));
        let on_open = Box::new(move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            idem.running().pause(token);
        });
        tx.defer(self.deadline, on_open).await;
        self.tx_opened = Some(opened);
        self.mode = Mode::Transactional(tx);
    }

    /// When the handler, and the reading of its answer, must be done: the end of the
    /// lease less [`SETTLE_MARGIN`] (a tenth of the lease when that is less).
    pub(crate) fn handler_deadline(&self) -> Instant {
        let lease = self.contract.lease().to_std();
        self.deadline - SETTLE_MARGIN.min(lease / 10)
    }

    /// The attempt's step journal, for its handler.
    pub(crate) fn journal(&self) -> Journal {
        let shared = self.journal.get_or_init(|| {
            Arc::new(Shared {
                idem: self.idem.clone(),
                key: Arc::clone(&self.key),
                token: self.token,
                operation_id: self.operation_id,
                attempt: self.attempt,
                interrupted: OnceLock::new(),
                refused: (self.mode.holds_the_write_lock() && self.tx_opened.is_none()).then_some(
                    "the attempt's transaction holds SQLite's only write lock, so the journal cannot record a step before its call: declare `recovery = resume`, so that the transaction begins at the handler's first write",
                ),
                tx_opened: self.tx_opened.clone(),
            })
        });
        Journal::new(Arc::clone(shared))
    }

    /// Why a step of the attempt could not finish, if one could not.
    fn interruption(&self) -> Option<Interruption> {
        self.journal
            .get()
            .and_then(|shared| shared.interruption().cloned())
    }

    /// How the settlement ended, as far as it recorded one (`crate::telemetry`): the
    /// handler's answer stored (`executed`), a released key, a rollback, a parked
    /// operation. `None` when idem answered with a problem of its own.
    pub(crate) fn settled(&self) -> Option<Outcome> {
        self.settled.get().copied()
    }

    /// Releases the key (a status lookup found the operation not applied).
    pub(crate) async fn release(&self) -> Result<(), StoreError> {
        let released = self.store_release().await;
        match &released {
            Ok(()) => self.log_outcome(Outcome::Released, 0),
            Err(error) => self.log_store_failure("release", error),
        }
        released
    }

    /// Renews this attempt's lease, lapsed or not (its renewals came late, or paused
    /// while a transaction held SQLite's write lock): the owner token still owning the
    /// record means nobody took it over, so the attempt may still record its outcome.
    async fn revive(&self) -> Result<(), StoreError> {
        let now = self.idem.now().await;
        let until = now.saturating_add(
            u64::try_from(self.idem.lease_for(self.contract).as_millis()).unwrap_or(u64::MAX),
        );
        self.idem
            .store()
            .renew(&self.key, self.token, until, now)
            .await
    }

    /// Stores `stored` as the result; a lapsed lease is revived once first. A result
    /// larger than the store keeps is stored as [`StoredResponse::body_not_kept`] says.
    async fn store_complete(&self, stored: &StoredResponse) -> Result<(), StoreError> {
        match self.store_complete_once(stored).await {
            Err(StoreError::TooLarge { limit, .. }) => {
                self.log_body_not_kept(stored, limit);
                self.store_complete_once(&stored.body_not_kept(limit)).await
            }
            other => other,
        }
    }

    async fn store_complete_once(&self, stored: &StoredResponse) -> Result<(), StoreError> {
        let now = self.idem.now().await;
        let completed = self
            .idem
            .store()
            .complete(&self.key, self.token, stored, now)
            .await;
        match completed {
            Err(StoreError::LeaseLost) => {
                self.revive().await?;
                let now = self.idem.now().await;
                self.idem
                    .store()
                    .complete(&self.key, self.token, stored, now)
                    .await
            }
            other => other,
        }
    }

    async fn store_release(&self) -> Result<(), StoreError> {
        let now = self.idem.now().await;
        self.idem.store().release(&self.key, self.token, now).await
    }

    /// Parks the operation as unknown with `reason`, under this attempt's lease.
    pub(crate) async fn store_park(&self, reason: &str) -> Result<(), StoreError> {
        let now = self.idem.now().await;
        self.idem
            .store()
            .park_unknown(&self.key, self.token, reason, now)
            .await
    }

    /// The answer when the store write of `step` failed: 503 `attempt-timed-out` when
    /// the lease was lost (recovery holds the record now), else 503 `store-unavailable`.
    fn write_failed(&self, step: &'static str, error: &StoreError) -> Response {
        self.log_store_failure(step, error);
        match error {
            StoreError::LeaseLost => answer::attempt_timed_out(self.contract, self.operation_id),
            other => {
                answer::store_unavailable(&self.idem, self.contract, Some(self.operation_id), other)
                    .into_response()
            }
        }
    }

    /// The result to store: `status`, the headers replay keeps, `body`.
    /// The record of the handler's answer: its status, the headers replay lets through
    /// and its body, or, for a body larger than the handle keeps, what
    /// [`StoredResponse::body_not_kept`] keeps of it.
    ///
    /// What the result does not take of the bytes held for it in the client's
    /// allowance goes back to it: the store keeps this result, or less.
    fn stored(&self, status: u16, headers: &HeaderMap, body: Bytes) -> StoredResponse {
        let stored = StoredResponse {
            status,
            headers: select_headers(headers, self.idem.replayed_headers()),
            body,
        };
        let limit = self.idem.max_stored_body();
        let stored = if stored.body.len() <= limit {
            stored
        } else {
            self.log_body_not_kept(&stored, limit);
            stored.body_not_kept(limit)
        };
        let reservation = (self.reservation.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(reservation) = reservation {
            let size = u64::try_from(stored.size()).unwrap_or(u64::MAX);
            self.idem
                .allowances()
                .settle(&self.key.client, reservation, size);
        }
        stored
    }

    /// Holds `reservation` of the client's allowance for this attempt's result, until
    /// the result is built.
    pub(crate) fn reserve(&mut self, reservation: Option<Reservation>) {
        *self
            .reservation
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = reservation;
    }

    /// Logs that the body of `stored` is larger than `limit` and will not be replayed.
    fn log_body_not_kept(&self, stored: &StoredResponse, limit: usize) {
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            status = stored.status,
            size = stored.body.len(),
            limit,
            "idem: the answer's body is larger than idem keeps; a replay has its status and headers, and a problem body that gives the original's length and SHA-256"
        );
    }

    /// The handler's answer, rebuilt from its buffered parts, with the `Operation-Id`.
    fn answer(&self, parts: Parts, body: Bytes) -> Response {
        let response = Response::from_parts(parts, axum::body::Body::from(body));
        with_operation_id(response, self.operation_id)
    }
}
