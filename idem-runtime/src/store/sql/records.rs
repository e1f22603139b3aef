//! [`RecordStore`] for [`SqlStore`], once for every database: the statements whose SQL
//! is the same in both, and the values of a registration and a completion, which every
//! database binds in the same order.

use async_trait::async_trait;

use super::SqlStore;
use super::dialect::Dialect;
use super::rows::changed_one;
use super::statement::{Columns, Run, Statement};
use crate::store::headers::encode_headers;
use crate::store::{
    Begin, ClientUsage, Lease, NewRecord, OverBudget, OwnerToken, Record, RecordKey, RecordStore,
    Step, StepWrite, StoreError, StoredResponse, UnixMillis, Usage, check_size,
};

/// The record as it stands, expired or not (registration decides): `$1`..`$3` the key.
pub(super) const SELECT: &str =
    "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3";

/// The record unless its TTL has passed: `$1`..`$3` the key, `$4` now.
pub(super) const GET: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3 AND expires_at > $4";

/// The SQL of a completion, with the values of [`SqlStore::completion`]: the record
/// completed with the result (`$6`..`$8`, and its size `$9`) if it is processing under the token `$4` and
/// `$condition` (more SQL, `AND …`) holds. Each database's completion inside a
/// transaction adds its own condition.
macro_rules! completion_sql {
    ($condition:literal) => {
        concat!(
            "UPDATE idem_records
    SET state = 'completed', token = NULL, lease_until = NULL,
        status = $6, headers = $7, body = $8, reason = NULL, stored_bytes = $9
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4",
            $condition
        )
    };
}
pub(super) use completion_sql;

/// The SQL of a record written once, completed, at its completion (`TxDialect::
/// INSERT_COMPLETED_IN_TX`), with the values of [`SqlStore::completion`] (`$1`..`$9`) and
/// then the record's operation id, fingerprint, creation, expiry and mode (`$10`..`$14`):
/// an `INSERT … SELECT` whose `FROM`, `WHERE` and `ON CONFLICT` are the database's
/// `$rest`.
macro_rules! insert_completed_sql {
    ($rest:literal) => {
        concat!(
            "INSERT INTO idem_records
            (operation, client, key, operation_id, fingerprint, state, attempt, token,
             lease_until, created_at, expires_at, status, headers, body, reason,
             stored_bytes, transactional)
        SELECT $1, $2, $3, $10, $11, 'completed', 1, NULL, NULL, $12, $13, $6, $7, $8, NULL,
               $9, $14
        ",
            $rest
        )
    };
}
pub(super) use insert_completed_sql;

/// The SQL of a release: the record released if it is processing under the token `$4`
/// and `$condition` (more SQL, `AND …`) holds.
macro_rules! release_sql {
    ($condition:literal) => {
        concat!(
            "UPDATE idem_records
    SET state = 'released', token = NULL, lease_until = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4",
            $condition
        )
    };
}
#[cfg(feature = "sqlite")]
pub(super) use release_sql;

/// `$5` now: the owner of a live lease.
const COMPLETE: &str = completion_sql!(" AND lease_until > $5");

/// `$4` token, `$5` now: the owner of a live lease.
const RELEASE: &str = release_sql!(" AND lease_until > $5");

/// `$4` token, `$5` the lease's new end ([`Record::renewed`]): the owner, live lease or
/// ended. The later of two times is a `CASE`, the same in both databases.
const RENEW: &str = "UPDATE idem_records
    SET lease_until = $5,
        expires_at = CASE WHEN expires_at < $5 THEN $5 ELSE expires_at END
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

/// `$4` token, `$5` the reason: the current owner, live lease or ended.
const PARK: &str = "UPDATE idem_records
    SET state = 'unknown', token = NULL, lease_until = NULL, reason = $5
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

/// The client budget's count ([`crate::store::budget`]): `$1` the client, `$2` now, `$3`
/// the budget's records (counting stops there). Reads the index on the client's live
/// records in the order they expire; no row is locked. `stored_bytes >= 0`, true of every
/// record, is the predicate of PostgreSQL's partial index for this count (migration 6),
/// which no other statement states, so that no key lookup reads that index.
pub const USAGE: &str = "SELECT count(*) AS used_records,
        CAST(COALESCE(sum(stored_bytes), 0) AS BIGINT) AS used_bytes,
        COALESCE(min(expires_at), 0) AS oldest
    FROM (SELECT stored_bytes, expires_at FROM idem_records
          WHERE client = $1 AND expires_at > $2 AND stored_bytes >= 0
          ORDER BY expires_at LIMIT $3) AS live";

/// What the budget's count found: the client's usage and its oldest live record's expiry.
#[derive(Clone, Copy, Debug)]
pub struct Counted {
    usage: Usage,
    oldest: UnixMillis,
}

impl Counted {
    /// The count as [`RecordStore::client_usage`] answers it.
    pub fn client_usage(self) -> ClientUsage {
        ClientUsage {
            usage: self.usage,
            oldest_expiry: (self.usage.records > 0).then_some(self.oldest),
        }
    }

    /// The count from a row with the columns of [`USAGE`].
    pub fn read(row: &impl Columns) -> Result<Counted, StoreError> {
        let non_negative = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(Counted {
            usage: Usage {
                records: non_negative(row.int("used_records")?),
                bytes: non_negative(row.int("used_bytes")?),
            },
            oldest: non_negative(row.int("oldest")?),
        })
    }
}

/// A registration on its way to the database: the key, the record it would write, and
/// the time, as [`RecordStore::begin`] hands them to [`Dialect::register`].
pub struct Registration<'a> {
    /// The key to register.
    pub key: &'a RecordKey,
    /// The record to write.
    pub new: &'a NewRecord,
    /// The current time, unix milliseconds.
    pub now: UnixMillis,
}

impl Registration<'_> {
    /// `sql` with the values of the registration: `$1`..`$3` the key, `$4` the operation
    /// id, `$5` the fingerprint, `$6` the token, `$7` the lease's end, `$8` now, `$9` the
    /// end of the TTL, `$10` the mode, `$11` the end of the attempt's time
    /// ([`NewRecord::holds_until`]).
    pub fn statement<DB: Run>(&self, sql: &'static str) -> Statement<DB> {
        let new = self.new;
        Statement::keyed(sql, self.key)
            .text(&new.operation_id.to_string())
            .text(&new.fingerprint)
            .token(new.lease.token)
            .ms(new.lease.until)
            .ms(self.now)
            .ms(new.expires_at)
            .flag(new.transactional)
            .ms(new.holds_until)
    }

    /// The budget the registration is counted against: `None` without one, and for
    /// [`ClientBudget::COUNT_ONLY`](crate::store::ClientBudget::COUNT_ONLY), which
    /// refuses nothing, so that nothing needs counting.
    pub fn counted_budget(&self) -> Option<crate::store::ClientBudget> {
        self.new.budget.filter(|b| !b.refuses_nothing())
    }

    /// The budget's count of the client, `$1`..`$3` of [`USAGE`]: `None` without a
    /// budget to count against ([`Registration::counted_budget`]).
    pub fn usage<DB: Run>(&self) -> Option<Statement<DB>> {
        let budget = self.counted_budget()?;
        Some(
            Statement::new(USAGE)
                .text(&self.key.client)
                .ms(self.now)
                .int(i64::try_from(budget.records).unwrap_or(i64::MAX)),
        )
    }

    /// The refusal a client with `counted` gets under the registration's budget, if it
    /// is at its budget; `None` when it has room or there is no budget.
    pub fn over(&self, counted: &Counted) -> Option<OverBudget> {
        let budget = self.new.budget?;
        (!budget.admits(&counted.usage)).then_some(OverBudget {
            usage: counted.usage,
            retry_at: counted.oldest,
        })
    }

    /// Whether taking `existing` starts a new operation (its TTL has passed), which the
    /// budget counts; a reclaim of a released key does not.
    pub fn is_new_over(&self, existing: &Record) -> bool {
        existing.is_expired(self.now)
    }

    /// Whether the registration may take `existing` ([`Record::begin_over`]): its TTL
    /// has passed, or it is released with the same fingerprint. Otherwise `begin`
    /// answers with `existing`, unchanged.
    pub fn may_take(&self, existing: &Record) -> bool {
        existing.begin_over(self.new, self.now).is_some()
    }
}

impl<DB: Dialect> SqlStore<DB> {
    /// The record of `key` as it stands, expired or not, read on `conn`.
    pub(super) async fn select(
        &self,
        conn: &mut DB::Connection,
        key: &RecordKey,
    ) -> Result<Option<Record>, StoreError> {
        self.record(conn, Statement::keyed(SELECT, key)).await
    }

    /// The refusal of `registration` under its budget, counted on `conn`: `None` when
    /// the client has room or there is no budget.
    #[cfg_attr(
        not(feature = "sqlite"),
        allow(
            dead_code,
            reason = "only SQLite's registration counts the budget apart"
        )
    )]
    pub(super) async fn over_budget(
        &self,
        conn: &mut DB::Connection,
        registration: &Registration<'_>,
    ) -> Result<Option<OverBudget>, StoreError> {
        let Some(statement) = registration.usage::<DB>() else {
            return Ok(None);
        };
        let row = self.run(statement.fetch_optional(conn)).await?;
        let counted = row.as_ref().map(Counted::read).transpose()?;
        Ok(counted.and_then(|counted| registration.over(&counted)))
    }

    /// `sql` with the values of a completion, once `response` is known to fit: `$1`..`$3`
    /// the key, `$4` the token, `$5` now, `$6`..`$8` the result's status, headers and
    /// body, `$9` its size ([`StoredResponse::size`], counted by the client budget).
    ///
    /// # Errors
    ///
    /// [`StoreError::TooLarge`] when the result is larger than the store keeps.
    pub(super) fn completion(
        &self,
        sql: &'static str,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<Statement<DB>, StoreError> {
        check_size(response, self.max_result)?;
        Ok(Statement::keyed(sql, key)
            .token(token)
            .ms(now)
            .int(i64::from(response.status))
            .text(&encode_headers(&response.headers))
            .maybe_bytes(Some(response.body.as_ref()))
            .int(i64::try_from(response.size()).unwrap_or(i64::MAX)))
    }
}

#[async_trait]
impl<DB: Dialect> RecordStore for SqlStore<DB> {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let mut conn = self.conn().await?;
        DB::register(self, &mut conn, Registration { key, new, now }).await
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn().await?;
        self.record(&mut conn, Statement::keyed(GET, key).ms(now))
            .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let statement = self.completion(COMPLETE, key, token, response, now)?;
        changed_one(self.execute(&mut conn, statement).await?)
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.change_one(Statement::keyed(RELEASE, key).token(token).ms(now))
            .await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.change_one(Statement::keyed(RENEW, key).token(token).ms(until))
            .await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.change_one(Statement::keyed(PARK, key).token(token).text(reason))
            .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let statement = Statement::keyed(DB::TAKE_OVER, key)
            .token(expected)
            .ms(now)
            .token(new_lease.token)
            .ms(new_lease.until);
        let mut conn = self.conn().await?;
        self.record(&mut conn, statement)
            .await?
            .ok_or(StoreError::LeaseLost)
    }

    async fn clock(&self) -> Result<Option<UnixMillis>, StoreError> {
        let Some(sql) = DB::CLOCK else {
            return Ok(None);
        };
        let mut conn = self.conn().await?;
        let row = self
            .run(Statement::<DB>::new(sql).fetch_optional(&mut conn))
            .await?;
        let ms = row
            .ok_or_else(|| StoreError::Corrupt("the clock's statement answered no row".into()))?
            .int("now_ms")?;
        Ok(Some(u64::try_from(ms).unwrap_or(0)))
    }

    async fn client_usage(
        &self,
        client: &str,
        cap: u64,
        now: UnixMillis,
    ) -> Result<ClientUsage, StoreError> {
        let statement = Statement::<DB>::new(USAGE)
            .text(client)
            .ms(now)
            .int(i64::try_from(cap).unwrap_or(i64::MAX));
        let mut conn = self.conn().await?;
        let row = self.run(statement.fetch_optional(&mut *conn)).await?;
        let counted = row.as_ref().map(Counted::read).transpose()?;
        Ok(counted.map_or_else(ClientUsage::default, Counted::client_usage))
    }

    async fn steps(
        &self,
        _key: &RecordKey,
        operation_id: crate::OperationId,
        _now: UnixMillis,
    ) -> Result<Vec<Step>, StoreError> {
        self.read_steps(operation_id).await
    }

    async fn write_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.write_one_step(key, token, write).await
    }
}
