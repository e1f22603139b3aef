//! One round's claim: the record's insert-if-absent, under a fresh lease.

use idem_contract::Contract;
use tokio::time::Instant;

use super::Registration;
use crate::attempt::Held;
use crate::enforce::Rejection;
use crate::idem::allowance::Reservation;
use crate::mode::AttemptTx;
use crate::store::{
    Begin, BeginInTx, InFlight, Lease, NewRecord, OverBudget, OwnerToken, Record, StoreError,
    UnixMillis,
};
use crate::{Idem, OperationId, answer};

/// What one claim came to.
pub(super) enum Claimed {
    /// This request holds the key: run the handler.
    Held(Held),
    /// The key has a record already, as it was when the claim began (unix milliseconds):
    /// answer from it. A lease is judged at that time, not at the answer's (which a slow
    /// store may bring much later, when the record has moved on).
    Exists(Record, UnixMillis),
    /// The claim succeeded, but another instance took the record over before this one
    /// could renew its lease: look again.
    LostRace,
    /// Another attempt holds the key in a transaction not committed yet (the
    /// transactional mode's one commit), as seen at the time given.
    InFlight(InFlight, UnixMillis),
}

impl Registration<'_> {
    /// Registers the key as processing, or finds its record.
    ///
    /// # Errors
    ///
    /// 503 `store-unavailable` when the store fails (`store-full` when it is full); 429
    /// `client-budget-exhausted` when the key is new and the client is at its budget.
    pub(super) async fn claim(&mut self) -> Result<Claimed, Rejection> {
        if let Some((record, at)) = self.seen.take() {
            crate::telemetry::found_record(record.attempt);
            return Ok(Claimed::Exists(record, at));
        }
        let now = self.idem.now().await;
        let started = Instant::now();
        let mut new = new_record(
            self.idem,
            self.contract,
            self.fingerprint,
            self.transactional,
            self.operation_id.take().unwrap_or_default(),
            now,
        );
        let reservation;
        (new.budget, reservation) = self.budget(now).await?;
        if let Some(tx) = self.in_tx.clone() {
            return self.claim_in_tx(&tx, &new, reservation, now, started).await;
        }
        let record = match self.idem.store().begin(self.key, &new, now).await {
            Ok(Begin::Started(record)) => record,
            Ok(Begin::Exists(record)) => {
                self.refund(reservation);
                crate::telemetry::found_record(record.attempt);
                return Ok(Claimed::Exists(record, now));
            }
            Ok(Begin::OverBudget(over)) => return Err(self.over_budget(&over, now)),
            Err(error) => return Err(self.unavailable(self.last_id, &error)),
        };
        // A registration that waited (for a connection, a slow or returning server) may
        // have written a lease that has run out already, and another instance may take
        // the record over as if this attempt had died. Renew it before the handler runs:
        // the renewal succeeds only while this token still owns the record, so a takeover
        // that came first fences this attempt out before it does anything, and one that
        // comes later finds a live lease.
        if started.elapsed() >= self.idem.lease_for(self.contract) / 3 {
            match self.renew(new.lease.token).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost) => return Ok(Claimed::LostRace),
                Err(error) => return Err(self.unavailable(Some(record.operation_id), &error)),
            }
        }
        tracing::debug!(
            operation = %self.contract.operation,
            operation_id = %record.operation_id,
            attempt = record.attempt,
            "idem: key registered"
        );
        let held = self.held(&record, &new, reservation, started);
        self.count_ahead(now);
        Ok(Claimed::Held(held))
    }

    /// The claim of the transactional mode's one commit: the attempt's transaction begins
    /// with the key registered inside it ([`AttemptTx::register`]), and the handler runs
    /// in it; nothing is committed before the handler's answer, and no lease needs
    /// renewing (the transaction's mark on the key fences the attempt). Without SQLite's
    /// turn to begin (stage 7 did not wait for it: the key was in flight, or had a
    /// record), the key is looked at first, and the turn waited for only if it is free.
    ///
    /// # Errors
    ///
    /// As [`Registration::claim`].
    async fn claim_in_tx(
        &self,
        tx: &AttemptTx,
        new: &NewRecord,
        reservation: Option<Reservation>,
        now: UnixMillis,
        started: Instant,
    ) -> Result<Claimed, Rejection> {
        // Without the turn to begin, with one writer (SQLite): stage 7 did not wait
        // for it. A store of many writers takes no turn for this mode.
        if tx.fences_by_lock() && !tx.is_reserved().await {
            let unavailable = |error| self.unavailable(self.last_id, &error);
            if let Some(claimed) = self.unreserved(tx, now).await.map_err(unavailable)? {
                self.refund(reservation);
                return Ok(claimed);
            }
            tx.reserve().await.map_err(unavailable)?;
        }
        let until = started + self.contract.lease().to_std();
        let record = match tx.register(self.key, new, now, until).await {
            Ok(BeginInTx::Started(record)) => record,
            Ok(BeginInTx::Exists(record)) => {
                self.refund(reservation);
                crate::telemetry::found_record(record.attempt);
                return Ok(Claimed::Exists(record, now));
            }
            Ok(BeginInTx::InFlight(holder)) => {
                self.refund(reservation);
                return Ok(in_flight(holder, now));
            }
            Ok(BeginInTx::OverBudget(over)) => return Err(self.over_budget(&over, now)),
            Err(error) => return Err(self.unavailable(self.last_id, &error)),
        };
        let mut held = self.held(&record, new, reservation, started);
        self.count_ahead(now);
        held.registered_as = Some(Box::new(new.clone()));
        held.attach(tx.clone());
        Ok(Claimed::Held(held))
    }

    /// The answer to a claim that has no right to begin (stage 7 did not wait for it: the
    /// key was in flight, or had a record, which the first round answered from), if the
    /// key is still held: the attempt holding it in its transaction, or the record read
    /// after the mark, unless it may be taken over (an attempt holds the mark for a
    /// moment when it finds the record committed, and answers from it). `None`: no
    /// attempt holds it; wait for the right to begin and claim it, which finds any
    /// record.
    async fn unreserved(
        &self,
        tx: &AttemptTx,
        now: UnixMillis,
    ) -> Result<Option<Claimed>, StoreError> {
        let Some(holder) = tx.in_flight(self.key).await? else {
            return Ok(None);
        };
        let record = self.idem.store().get(self.key, now).await?;
        Ok(Some(match record.filter(|r| !r.is_reclaimable(now)) {
            Some(record) => {
                crate::telemetry::found_record(record.attempt);
                Claimed::Exists(record, now)
            }
            None => in_flight(holder, now),
        }))
    }

    /// The attempt that holds the key as `record` says, registered as `new` from
    /// `started`, holding `reservation` of its client's allowance for its result. A
    /// released record it reclaimed (another operation id than `new`'s) was counted
    /// already: its key goes back to the allowance, in either mode.
    fn held(
        &self,
        record: &Record,
        new: &NewRecord,
        reservation: Option<Reservation>,
        started: Instant,
    ) -> Held {
        if record.operation_id != new.operation_id {
            self.return_key(reservation);
        }
        let mut held = Held::start(
            self.idem,
            self.contract,
            self.key,
            new.lease.token,
            started,
            record.operation_id,
            record.attempt,
        );
        held.reserve(reservation);
        held
    }

    /// 429 `client-budget-exhausted` for a client at its budget (`over`) at `now`,
    /// remembered by its allowance.
    fn over_budget(&self, over: &OverBudget, now: UnixMillis) -> Rejection {
        self.idem.allowances().refused(&self.key.client, over, now);
        answer::budget_exhausted(self.contract, over, now).into()
    }

    /// Renews the lease of `token` for a whole lease from now.
    async fn renew(&self, token: OwnerToken) -> Result<(), StoreError> {
        let now = self.idem.now().await;
        let until = now.saturating_add(lease_ms(self.idem, self.contract));
        self.idem.store().renew(self.key, token, until, now).await
    }

    /// 503 `store-unavailable`.
    pub(super) fn unavailable(&self, id: Option<OperationId>, error: &StoreError) -> Rejection {
        answer::store_unavailable(self.idem, self.contract, id, error).into()
    }
}

/// The claim's answer when `holder` holds the key in its transaction at `now`, noted in
/// the attempt's span as a record found at the holder's attempt.
fn in_flight(holder: InFlight, now: UnixMillis) -> Claimed {
    crate::telemetry::found_record(holder.attempt);
    Claimed::InFlight(holder, now)
}

/// The record a new attempt registers at `now` as operation `operation_id`, with a
/// fresh owner token; its budget is the claim's ([`Registration::budget`]).
fn new_record(
    idem: &Idem,
    contract: &Contract,
    fingerprint: &str,
    transactional: bool,
    operation_id: OperationId,
    now: UnixMillis,
) -> NewRecord {
    NewRecord {
        operation_id,
        fingerprint: fingerprint.to_owned(),
        lease: Lease {
            token: OwnerToken::random(),
            until: now.saturating_add(lease_ms(idem, contract)),
        },
        expires_at: now.saturating_add(contract.ttl.as_millis()),
        transactional,
        holds_until: now.saturating_add(contract.lease().as_millis()),
        budget: None,
    }
}

/// The lease an attempt holds in the store at a time, in milliseconds.
fn lease_ms(idem: &Idem, contract: &Contract) -> u64 {
    u64::try_from(idem.lease_for(contract).as_millis()).unwrap_or(u64::MAX)
}
