//! [`TransactionalStore`] for [`SqlStore`], once for every database: what differs is the
//! database's ([`TxDialect`]).

use std::time::Duration;

use async_trait::async_trait;

use super::SqlStore;
use super::dialect::TxDialect;
use super::records::Registration;
use crate::store::{
    InFlight, KeyMark, NewRecord, OpenTransaction, OwnerToken, RecordKey, Registered, Reservation,
    StoreError, StoredResponse, TransactionalStore, UnixMillis,
};

#[async_trait]
impl<DB: TxDialect> TransactionalStore for SqlStore<DB> {
    type Database = DB;

    async fn reserve(&self) -> Result<Reservation, StoreError> {
        DB::reserve(self).await
    }

    fn try_reserve(&self) -> Option<Reservation> {
        DB::try_reserve(self)
    }

    async fn begin_transaction(
        &self,
        reservation: Reservation,
        within: Duration,
    ) -> Result<OpenTransaction<DB>, StoreError> {
        DB::begin_transaction(self, reservation, within).await
    }

    async fn begin_registered(
        &self,
        reservation: Reservation,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
        within: Duration,
    ) -> Result<Registered<DB>, StoreError> {
        let registration = Registration { key, new, now };
        DB::begin_registered(self, reservation, registration, within).await
    }

    fn mark(&self, key: &RecordKey, attempt: InFlight) -> Option<Result<KeyMark, InFlight>> {
        DB::mark(self, key, attempt)
    }

    async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError> {
        DB::in_flight(self, key).await
    }

    async fn complete_in(
        &self,
        tx: &mut OpenTransaction<DB>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let completion = match (&tx.unwritten, DB::INSERT_COMPLETED_IN_TX) {
            (Some(record), Some(insert)) => self
                .completion(insert, key, token, response, now)?
                .text(&record.operation_id.to_string())
                .text(&record.fingerprint)
                .ms(record.created_at)
                .ms(record.expires_at)
                .flag(record.transactional),
            (Some(_), None) => {
                return Err(StoreError::Corrupt(
                    "a record left for the completion to write, on a database that cannot".into(),
                ));
            }
            (None, _) if tx.registered => {
                self.completion(DB::COMPLETE_REGISTERED_IN_TX, key, token, response, now)?
            }
            (None, _) => self.completion(DB::COMPLETE_IN_TX, key, token, response, now)?,
        };
        DB::complete_in(self, tx, completion).await
    }

    async fn release_in(
        &self,
        tx: &mut OpenTransaction<DB>,
        key: &RecordKey,
        token: OwnerToken,
    ) -> Result<bool, StoreError> {
        DB::release_in(self, tx, key, token).await
    }

    fn fences_by_lock(&self) -> bool {
        DB::FENCES_BY_LOCK
    }

    fn fault(&self, error: sqlx::Error) -> StoreError {
        DB::fault(self, error)
    }

    fn rollback_failed(&self, error: sqlx::Error) -> StoreError {
        DB::rollback_failed(self, error)
    }

    fn completion_abandoned(&self) {
        DB::completion_abandoned(self);
    }
}
