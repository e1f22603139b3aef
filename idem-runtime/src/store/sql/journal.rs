//! The step journal in SQL ([`crate::store::Step`]): one row per step in `idem_steps`,
//! keyed by the operation id and the step's position (with the record's key beside it,
//! for the outbox's join), written with one statement that checks the lease and applies
//! [`Step::apply`]'s rules, the same in both databases; staged deliveries are claimed and
//! settled with one compare-and-set each.

use super::SqlStore;
use super::dialect::Dialect;
use super::statement::{Columns, Statement};
use std::str::FromStr;

use crate::OperationId;
use crate::store::{
    Delivery, Due, OwnerToken, RecordKey, Step, StepState, StepWrite, StoreError, UnixMillis,
    step_changed,
};

/// The journal of the operation `$1`, in order.
const SELECT_STEPS: &str = "SELECT idx, name, state, value, calls, next_at FROM idem_steps
    WHERE operation_id = $1 ORDER BY idx";

/// One step: `$1` the operation id, `$2` its position.
const SELECT_STEP: &str = "SELECT idx, name, state, value, calls, next_at FROM idem_steps
    WHERE operation_id = $1 AND idx = $2";

/// The staged deliveries due at `$1` whose record is completed with a 2xx status and
/// within its TTL, the longest due first, at most `$2`: the partial index on `next_at`
/// of the staged steps, then the record by its primary key.
const DUE: &str = "SELECT s.operation, s.client, s.key, s.operation_id,
        s.idx, s.name, s.state, s.value, s.calls, s.next_at
    FROM idem_steps s JOIN idem_records r
      ON r.operation = s.operation AND r.client = s.client AND r.key = s.key
    WHERE s.state = 'staged' AND s.next_at <= $1
      AND r.operation_id = s.operation_id AND r.state = 'completed'
      AND r.status >= 200 AND r.status < 300 AND r.expires_at > $1
    ORDER BY s.next_at, s.operation_id, s.idx
    LIMIT $2";

/// A claim ([`Step::claimed`]): `$1` the operation id, `$2` the position, `$3` the
/// claim's end, `$4` now.
const CLAIM: &str = "UPDATE idem_steps SET calls = calls + 1, next_at = $3
    WHERE operation_id = $1 AND idx = $2 AND state = 'staged' AND next_at <= $4
    RETURNING idx, name, state, value, calls, next_at";

/// A settlement ([`Step::settled`]): `$1` the operation id, `$2` the position, `$3` the
/// new state, `$4` when it is next due, `$5` the claim.
const SETTLE: &str = "UPDATE idem_steps SET state = $3, next_at = $4
    WHERE operation_id = $1 AND idx = $2 AND state = 'staged' AND calls = $5
    RETURNING idx, name, state, value, calls, next_at";

/// A write ([`Step::apply`]) under the lease: `$1`..`$3` the key, `$4` the operation id,
/// `$5` the position, `$6` the name, `$7` the state, `$8` the value, `$9` the token, `$10`
/// the calls of a new step (0 for a staged delivery, else 1). The `SELECT` yields the row
/// only while the record is this operation's, processing under the token; a step of
/// another name (or kind) at the position is left alone. No row comes back when either
/// is so (then [`SELECT_STEP`] tells which).
const WRITE_STEP: &str = "INSERT INTO idem_steps
        (operation_id, idx, operation, client, key, name, state, value, calls, next_at, expires_at)
    SELECT $4, $5, $1, $2, $3, $6, $7, $8, $10, 0, expires_at FROM idem_records
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $9 AND operation_id = $4
    ON CONFLICT (operation_id, idx) DO UPDATE SET
        calls = CASE WHEN idem_steps.state = 'pending' AND excluded.state = 'pending'
                     THEN idem_steps.calls + 1 ELSE idem_steps.calls END,
        value = CASE WHEN idem_steps.state = 'pending' THEN excluded.value ELSE idem_steps.value END,
        state = CASE WHEN idem_steps.state = 'pending' THEN excluded.state ELSE idem_steps.state END,
        expires_at = CASE WHEN idem_steps.expires_at < excluded.expires_at
                          THEN excluded.expires_at ELSE idem_steps.expires_at END
    WHERE idem_steps.name = excluded.name
      AND (idem_steps.state IN ('staged', 'delivered', 'given_up'))
        = (excluded.state IN ('staged', 'delivered', 'given_up'))
    RETURNING idx, name, state, value, calls, next_at";

/// The journals of expired records, `$1` now, at most [`PURGE_BATCH`] rows a statement.
pub(super) const PURGE_STEPS: &str = "DELETE FROM idem_steps WHERE (operation_id, idx) IN (
        SELECT operation_id, idx FROM idem_steps WHERE expires_at <= $1 LIMIT 5000
    )";

/// How many rows one [`PURGE_STEPS`] deletes at most.
pub(super) const PURGE_BATCH: u64 = 5000;

impl<DB: Dialect> SqlStore<DB> {
    /// [`crate::store::RecordStore::steps`].
    pub(super) async fn read_steps(
        &self,
        operation_id: OperationId,
    ) -> Result<Vec<Step>, StoreError> {
        let mut conn = self.conn().await?;
        let statement = Statement::<DB>::new(SELECT_STEPS).text(&operation_id.to_string());
        let rows = self.run(statement.fetch_all(&mut conn)).await?;
        rows.iter().map(decode_step).collect()
    }

    /// [`crate::store::RecordStore::write_step`].
    pub(super) async fn write_one_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
    ) -> Result<Step, StoreError> {
        write.check()?;
        let id = write.operation_id.to_string();
        let statement = Statement::<DB>::keyed(WRITE_STEP, key)
            .text(&id)
            .int(i64::from(write.index))
            .text(&write.name)
            .text(write.state.as_str())
            .maybe_text(write.state.value())
            .token(token)
            .int(i64::from(!write.state.is_delivery()));
        let mut conn = self.conn().await?;
        if let Some(row) = self.run(statement.fetch_optional(&mut conn)).await? {
            return decode_step(&row);
        }
        let statement = Statement::<DB>::new(SELECT_STEP)
            .text(&id)
            .int(i64::from(write.index));
        let existing = self.run(statement.fetch_optional(&mut conn)).await?;
        match existing.as_ref().map(decode_step).transpose()? {
            Some(step)
                if step.name != write.name
                    || step.state.is_delivery() != write.state.is_delivery() =>
            {
                Err(step_changed(&step, write))
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// [`crate::store::OperatorStore::due_deliveries`].
    pub(super) async fn due(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError> {
        let mut conn = self.conn().await?;
        let statement = Statement::<DB>::new(DUE).ms(now).int(i64::from(limit));
        let rows = self.run(statement.fetch_all(&mut conn)).await?;
        rows.iter().map(decode_due).collect()
    }

    /// [`crate::store::OperatorStore::claim_delivery`].
    pub(super) async fn claim(
        &self,
        operation_id: OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        let statement = Statement::<DB>::new(CLAIM)
            .text(&operation_id.to_string())
            .int(i64::from(index))
            .ms(until)
            .ms(now);
        self.one_step(statement).await
    }

    /// [`crate::store::OperatorStore::settle_delivery`].
    pub(super) async fn settle(
        &self,
        operation_id: OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
    ) -> Result<Step, StoreError> {
        let (state, next_at) = delivery.settles_as();
        let statement = Statement::<DB>::new(SETTLE)
            .text(&operation_id.to_string())
            .int(i64::from(index))
            .text(state)
            .ms(next_at)
            .int(i64::from(claim));
        self.one_step(statement).await
    }

    /// Runs `statement`, one compare-and-set on a step: the step it returns, or
    /// `LeaseLost` when it changed nothing.
    async fn one_step(&self, statement: Statement<DB>) -> Result<Step, StoreError> {
        let mut conn = self.conn().await?;
        match self.run(statement.fetch_optional(&mut conn)).await? {
            Some(row) => decode_step(&row),
            None => Err(StoreError::LeaseLost),
        }
    }

    /// Deletes the journals of records expired at `now`; how many steps.
    pub(super) async fn purge_steps(
        &self,
        conn: &mut DB::Connection,
        now: UnixMillis,
    ) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            let statement = Statement::<DB>::new(PURGE_STEPS).ms(now);
            let batch = self.run(statement.execute(conn)).await?;
            purged += batch;
            if batch < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }
}

/// A step from a row of `idx, name, state, value, calls`.
fn decode_step(row: &impl Columns) -> Result<Step, StoreError> {
    let number = |column: &str| -> Result<u32, StoreError> {
        u32::try_from(row.int(column)?)
            .map_err(|_| StoreError::Corrupt(format!("the journal's `{column}` is out of range")))
    };
    Ok(Step {
        index: number("idx")?,
        name: row.text("name")?,
        state: StepState::from_parts(&row.text("state")?, row.maybe_text("value")?)?,
        calls: number("calls")?,
        next_at: u64::try_from(row.int("next_at")?)
            .map_err(|_| StoreError::Corrupt("the journal's `next_at` is negative".into()))?,
    })
}

/// A due delivery from a row of [`DUE`].
fn decode_due(row: &impl Columns) -> Result<Due, StoreError> {
    let operation_id = OperationId::from_str(&row.text("operation_id")?)
        .map_err(|e| StoreError::Corrupt(format!("the journal's `operation_id`: {e}")))?;
    Ok(Due {
        key: RecordKey::new(
            row.text("operation")?,
            row.text("client")?,
            row.text("key")?,
        ),
        operation_id,
        step: decode_step(row)?,
    })
}
