//! A record in a row and back: how its times are written, how a row is read as a record
//! (through [`Columns`], in either database), and the columns an operator's resolution
//! writes. The layout is in [`super`].

use std::str::FromStr;

use bytes::Bytes;

use super::statement::Columns;
use crate::OperationId;
use crate::store::headers::{decode_headers, encode_headers};
use crate::store::ops::{self, Inspection, Listed, Resolution, ResolutionOutcome};
use crate::store::{
    Lease, OperationState, OwnerToken, Record, RecordKey, RecordState, StoreError, StoredResponse,
    UnixMillis, check_size,
};

/// Unix milliseconds as SQL's signed 64-bit integer (good until the year 292 million).
pub(super) fn sql_ms(ms: UnixMillis) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn ms_from_sql(ms: i64, column: &str) -> Result<UnixMillis, StoreError> {
    u64::try_from(ms).map_err(|_| StoreError::Corrupt(format!("`{column}` is negative")))
}

/// A record from a row of the record's columns, in either database.
pub(super) fn decode(row: &impl Columns) -> Result<Record, StoreError> {
    let missing = |column: &str| StoreError::Corrupt(format!("`{column}` is missing"));
    let operation_id = OperationId::from_str(&row.text("operation_id")?)
        .map_err(|e| StoreError::Corrupt(format!("`operation_id`: {e}")))?;
    let state = OperationState::from_str(&row.text("state")?).map_err(StoreError::Corrupt)?;
    let attempt = row.int("attempt")?;
    let state = match state {
        OperationState::Processing => {
            let token = row.maybe_text("token")?.ok_or_else(|| missing("token"))?;
            let token = OwnerToken::from_str(&token)
                .map_err(|e| StoreError::Corrupt(format!("`token`: {e}")))?;
            let until = row.maybe_int("lease_until")?;
            let until = ms_from_sql(until.ok_or_else(|| missing("lease_until"))?, "lease_until")?;
            RecordState::Processing {
                lease: Lease { token, until },
            }
        }
        OperationState::Completed => {
            let status = row
                .maybe_int("status")?
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| missing("status"))?;
            let headers = row
                .maybe_text("headers")?
                .ok_or_else(|| missing("headers"))?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers: decode_headers(&headers)?,
                    body: Bytes::from(row.maybe_bytes("body")?.unwrap_or_default()),
                },
            }
        }
        OperationState::Released => RecordState::Released,
        OperationState::Unknown => RecordState::Unknown {
            reason: row.maybe_text("reason")?.unwrap_or_default(),
        },
    };
    Ok(Record {
        operation_id,
        fingerprint: row.text("fingerprint")?,
        attempt: u32::try_from(attempt).map_err(|_| missing("attempt"))?,
        created_at: ms_from_sql(row.int("created_at")?, "created_at")?,
        expires_at: ms_from_sql(row.int("expires_at")?, "expires_at")?,
        state,
        transactional: row.flag("transactional")?,
    })
}

/// `Ok` when a compare-and-set changed the one row it names, else the lease is lost.
pub(super) fn changed_one(rows_affected: u64) -> Result<(), StoreError> {
    if rows_affected == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// A listed record from a row of `operation`, `client`, `key` and the record's columns.
pub(super) fn decode_listed(row: &impl Columns) -> Result<Listed, StoreError> {
    let key = RecordKey {
        operation: row.text("operation")?,
        client: row.text("client")?,
        key: row.text("key")?,
    };
    Ok(Listed {
        key,
        record: decode(row)?,
    })
}

/// How a warning names a row of `idem_records` that does not parse: its operation and
/// key (the client, an identity idem never logs, by its length).
pub(super) fn row_name(row: &impl Columns) -> String {
    let column = |name| row.text(name).unwrap_or_else(|_| "?".into());
    let client = row.text("client").map_or(0, |c| c.len());
    format!(
        "idem_records row (operation `{}`, key `{}`, client of {client} bytes)",
        column("operation"),
        column("key")
    )
}

/// The record of `key` with its history, from a row of the record's columns and
/// `history`.
pub(super) fn decode_inspected(
    key: &RecordKey,
    row: &impl Columns,
) -> Result<Inspection, StoreError> {
    let record = decode(row)?;
    let events = ops::parse_history(row.maybe_text("history")?.as_deref())?;
    Ok(Inspection::new(key.clone(), record, &events))
}

/// The columns a resolution writes: the state, and the result's status, headers and
/// body (NULLs when not applied).
pub(super) type ResolutionColumns = (&'static str, Option<i64>, Option<String>, Option<Vec<u8>>);

/// The [`ResolutionColumns`] of `resolve`, after the result's size check.
pub(super) fn resolution_columns(
    resolve: &Resolution,
    max_result: usize,
) -> Result<ResolutionColumns, StoreError> {
    Ok(match &resolve.outcome {
        ResolutionOutcome::Completed(response) => {
            check_size(response, max_result)?;
            (
                "completed",
                Some(i64::from(response.status)),
                Some(encode_headers(&response.headers)),
                Some(response.body.to_vec()),
            )
        }
        ResolutionOutcome::NotApplied => ("released", None, None, None),
    })
}
