//! [`TransactionalStore`] for [`SqlStore`], once for every database: what differs is the
//! database's ([`TxDialect`]).

use std::time::Duration;

use async_trait::async_trait;

use super::SqlStore;
use super::dialect::TxDialect;
use crate::store::{
    OpenTransaction, OwnerToken, RecordKey, Reservation, StoreError, StoredResponse,
    TransactionalStore, UnixMillis,
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

    async fn complete_in(
        &self,
        tx: &mut OpenTransaction<DB>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let completion = self.completion(DB::COMPLETE_IN_TX, key, token, response, now)?;
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
}
