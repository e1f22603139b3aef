//! [`OperatorStore`] for [`SqlStore`], once for every database.

use std::time::Duration;

use async_trait::async_trait;

use super::SqlStore;
use super::dialect::Dialect;
use super::rows::{decode_inspected, decode_listed, resolution_columns, row_name};
use super::statement::Statement;
use crate::OperationId;
use crate::store::ops::{self, Event};
use crate::store::{
    Delivery, Due, Inspection, ListQuery, Listed, OperatorStore, Record, RecordKey, RecordStore,
    Resolution, Step, StoreError, UnixMillis,
};

/// The record with its history unless its TTL has passed: `$1`..`$3` the key, `$4` now.
/// The history is read as text (PostgreSQL keeps it as `jsonb`).
const INSPECT: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional,
        CAST(history AS TEXT) AS history
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3 AND expires_at > $4";

/// The pause between two batches of [`Dialect::PURGE`] (where it deletes in batches), with
/// no connection held: a purge of a large backlog then leaves the database's commits to
/// the traffic. Measured (BENCHMARKS.md, "Flat as the store grows"): 1,000,000 expired
/// records of 10,000,000 purged without a pause cost PostgreSQL's new keys about a third
/// of their rate for the 5 s the purge ran; with 250 ms between batches of 5,000 the rate
/// stayed within the noise (the purge then takes about a minute).
const PURGE_PAUSE: Duration = Duration::from_millis(250);

#[async_trait]
impl<DB: Dialect> OperatorStore for SqlStore<DB> {
    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        let after = query.after.as_ref();
        let statement = Statement::<DB>::new(DB::LIST)
            .ms(now)
            .maybe_text(query.operation.as_deref())
            .maybe_text(query.state.map(|s| s.as_str()))
            .flag(query.lease_ended)
            .maybe_text(after.map(|k| k.operation.as_str()))
            .maybe_text(after.map(|k| k.client.as_str()))
            .maybe_text(after.map(|k| k.key.as_str()))
            .int(i64::from(query.page()));
        let mut conn = self.conn().await?;
        let rows = self.run(statement.fetch_all(&mut conn)).await?;
        // A row that does not parse is skipped (and named), not fatal to the listing.
        let listed = rows.iter().filter_map(|row| match decode_listed(row) {
            Err(error @ StoreError::Corrupt(_)) => {
                ops::skip_foreign(&row_name(row), &error);
                None
            }
            other => Some(other),
        });
        listed.collect()
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        let mut conn = self.conn().await?;
        let statement = Statement::<DB>::keyed(INSPECT, key).ms(now);
        let row = self.run(statement.fetch_optional(&mut conn)).await?;
        match row.as_ref().map(|row| decode_inspected(key, row)) {
            // A row that does not parse is no record to show: skipped, and named.
            Some(Err(error @ StoreError::Corrupt(_))) => {
                let name = format!(
                    "idem_records row (operation `{}`, key `{}`)",
                    key.operation, key.key
                );
                ops::skip_foreign(&name, &error);
                Ok(None)
            }
            other => other.transpose(),
        }
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolution,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let (state, status, headers, body) = resolution_columns(resolve, self.max_result)?;
        let statement = Statement::keyed(DB::RESOLVE, key)
            .int(i64::from(resolve.expected_attempt))
            .text(state)
            .maybe_int(status)
            .maybe_text(headers.as_deref())
            .maybe_bytes(body.as_deref())
            .text(&Event::resolved(resolve.expected_attempt, "", resolve, now).to_json())
            .ms(now);
        let mut conn = self.conn().await?;
        let written = self.record(&mut conn, statement).await?;
        // The connection goes back first: the record is read again on one of its own (an
        // in-memory SQLite store has but one).
        drop(conn);
        match written {
            Some(record) => Ok(record),
            None => {
                // The resolution was answered, refused: a failure to read the record
                // now leaves nothing unknown about it.
                let current = self.get(key, now).await.map_err(StoreError::known)?;
                Err(ops::refused(current.as_ref(), resolve.expected_attempt))
            }
        }
    }

    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            let mut conn = self.conn().await?;
            let statement = Statement::new(DB::PURGE).ms(now);
            let batch = self.execute(&mut conn, statement).await?;
            purged += batch;
            if DB::PURGE_BATCH.is_none_or(|limit| batch < limit) {
                // Steps are counted apart: `purged` counts records.
                self.purge_steps(&mut conn, now).await?;
                return Ok(purged);
            }
            drop(conn);
            tokio::time::sleep(PURGE_PAUSE).await;
        }
    }

    async fn due_deliveries(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError> {
        self.due(limit, now).await
    }

    async fn claim_delivery(
        &self,
        _key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.claim(operation_id, index, until, now).await
    }

    async fn settle_delivery(
        &self,
        _key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.settle(operation_id, index, claim, delivery).await
    }
}
