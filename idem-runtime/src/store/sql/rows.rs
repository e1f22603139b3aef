//! What the SQL stores (SQLite and PostgreSQL) share: how a record is laid out in a row,
//! and how times and headers are written.
//!
//! Both keep one row per key in the table `idem_records`, with these columns:
//!
//! | column | type | holds |
//! |---|---|---|
//! | `operation`, `client`, `key` | text | the [`RecordKey`](crate::store::RecordKey); the primary key |
//! | `operation_id` | text | the operation id (a UUIDv7) |
//! | `fingerprint` | text | `sha256:<hex>` |
//! | `state` | text | `processing`, `completed`, `released`, `unknown` |
//! | `attempt` | integer | 1 and up |
//! | `token`, `lease_until` | text, integer | the lease, while processing |
//! | `created_at`, `expires_at` | integer | unix milliseconds |
//! | `status`, `headers`, `body` | integer, text, bytes | the stored result, once completed |
//! | `reason` | text | why it is parked, once unknown |
//! | `transactional` | boolean | whether the operation runs in the transactional mode |
//! | `history` | text | the record's history, a JSON array of events ([`crate::store::ops`]) |
//!
//! Headers are written as `store::headers` says.

use std::str::FromStr;

use bytes::Bytes;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::OperationId;
use crate::store::headers::{decode_headers, encode_headers};
use crate::store::ops::{self, Inspection, Listed, Resolve, ResolveAs};
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

/// A record from a row of [`COLUMNS`], in either database.
pub(super) fn decode<R>(row: &R) -> Result<Record, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let corrupt = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
    let missing = |column: &str| StoreError::Corrupt(format!("`{column}` is missing"));
    let operation_id: String = row.try_get("operation_id").map_err(corrupt)?;
    let operation_id = OperationId::from_str(&operation_id)
        .map_err(|e| StoreError::Corrupt(format!("`operation_id`: {e}")))?;
    let state: String = row.try_get("state").map_err(corrupt)?;
    let state = OperationState::from_str(&state).map_err(StoreError::Corrupt)?;
    let attempt: i64 = row.try_get("attempt").map_err(corrupt)?;
    let state = match state {
        OperationState::Processing => {
            let token: Option<String> = row.try_get("token").map_err(corrupt)?;
            let token = OwnerToken::from_str(&token.ok_or_else(|| missing("token"))?)
                .map_err(|e| StoreError::Corrupt(format!("`token`: {e}")))?;
            let until: Option<i64> = row.try_get("lease_until").map_err(corrupt)?;
            let until = ms_from_sql(until.ok_or_else(|| missing("lease_until"))?, "lease_until")?;
            RecordState::Processing {
                lease: Lease { token, until },
            }
        }
        OperationState::Completed => {
            let status: Option<i64> = row.try_get("status").map_err(corrupt)?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| missing("status"))?;
            let headers: Option<String> = row.try_get("headers").map_err(corrupt)?;
            let body: Option<Vec<u8>> = row.try_get("body").map_err(corrupt)?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers: decode_headers(&headers.ok_or_else(|| missing("headers"))?)?,
                    body: Bytes::from(body.unwrap_or_default()),
                },
            }
        }
        OperationState::Released => RecordState::Released,
        OperationState::Unknown => {
            let reason: Option<String> = row.try_get("reason").map_err(corrupt)?;
            RecordState::Unknown {
                reason: reason.unwrap_or_default(),
            }
        }
    };
    Ok(Record {
        operation_id,
        fingerprint: row.try_get("fingerprint").map_err(corrupt)?,
        attempt: u32::try_from(attempt).map_err(|_| missing("attempt"))?,
        created_at: ms_from_sql(row.try_get("created_at").map_err(corrupt)?, "created_at")?,
        expires_at: ms_from_sql(row.try_get("expires_at").map_err(corrupt)?, "expires_at")?,
        state,
        transactional: row.try_get("transactional").map_err(corrupt)?,
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
pub(super) fn decode_listed<R>(row: &R) -> Result<Listed, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let corrupt = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
    let key = RecordKey {
        operation: row.try_get("operation").map_err(corrupt)?,
        client: row.try_get("client").map_err(corrupt)?,
        key: row.try_get("key").map_err(corrupt)?,
    };
    Ok(Listed {
        key,
        record: decode(row)?,
    })
}

/// The record of `key` with its history, from a row of the record's columns and
/// `history`.
pub(super) fn decode_inspected<R>(key: &RecordKey, row: &R) -> Result<Inspection, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    let record = decode(row)?;
    let history: Option<String> = row
        .try_get("history")
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let events = ops::parse_history(history.as_deref())?;
    Ok(Inspection::new(key.clone(), record, &events))
}

/// The columns a resolution writes: the state, and the result's status, headers and
/// body (NULLs when not applied).
pub(super) type ResolutionColumns = (&'static str, Option<i64>, Option<String>, Option<Vec<u8>>);

/// The [`ResolutionColumns`] of `resolve`, after the result's size check.
pub(super) fn resolution_columns(
    resolve: &Resolve,
    max_result: usize,
) -> Result<ResolutionColumns, StoreError> {
    Ok(match &resolve.outcome {
        ResolveAs::Completed(response) => {
            check_size(response, max_result)?;
            (
                "completed",
                Some(i64::from(response.status)),
                Some(encode_headers(&response.headers)),
                Some(response.body.to_vec()),
            )
        }
        ResolveAs::NotApplied => ("released", None, None, None),
    })
}
