//! The step journal in SQL ([`crate::store::Step`]): one row per step in `idem_steps`,
//! keyed by the operation id and the step's position, written with one statement that
//! checks the lease and applies [`Step::apply`]'s rules, the same in both databases.

use super::SqlStore;
use super::dialect::Dialect;
use super::statement::{Columns, Statement};
use crate::OperationId;
use crate::store::{
    OwnerToken, RecordKey, Step, StepState, StepWrite, StoreError, UnixMillis, step_changed,
};

/// The journal of the operation `$1`, in order.
const SELECT_STEPS: &str = "SELECT idx, name, state, value, calls FROM idem_steps
    WHERE operation_id = $1 ORDER BY idx";

/// One step: `$1` the operation id, `$2` its position.
const SELECT_STEP: &str = "SELECT idx, name, state, value, calls FROM idem_steps
    WHERE operation_id = $1 AND idx = $2";

/// A write ([`Step::apply`]) under the lease: `$1`..`$3` the key, `$4` the operation id,
/// `$5` the position, `$6` the name, `$7` the state, `$8` the value, `$9` the token. The
/// `SELECT` yields the row only while the record is this operation's, processing under
/// the token; a step of another name at the position is left alone. No row comes back
/// when either is so (then [`SELECT_STEP`] tells which).
const WRITE_STEP: &str = "INSERT INTO idem_steps (operation_id, idx, name, state, value, calls, expires_at)
    SELECT $4, $5, $6, $7, $8, 1, expires_at FROM idem_records
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
    RETURNING idx, name, state, value, calls";

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
            .token(token);
        let mut conn = self.conn().await?;
        if let Some(row) = self.run(statement.fetch_optional(&mut conn)).await? {
            return decode_step(&row);
        }
        let statement = Statement::<DB>::new(SELECT_STEP)
            .text(&id)
            .int(i64::from(write.index));
        let existing = self.run(statement.fetch_optional(&mut conn)).await?;
        match existing.as_ref().map(decode_step).transpose()? {
            Some(step) if step.name != write.name => Err(step_changed(&step, write)),
            _ => Err(StoreError::LeaseLost),
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
    })
}
