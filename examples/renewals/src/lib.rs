//! Subscription renewals on PostgreSQL: a renewal extends what the subscription has paid
//! for, at most once per idempotency key, however many instances serve it.

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    routing::{get, post},
};
use idem::sqlx::{self, PgPool, Row, postgres::PgRow};
use serde::{Deserialize, Serialize};

/// What the handler and the reconcile function share.
#[derive(Clone)]
pub struct App {
    /// The pool of the store: the business tables live in idem's database.
    pub pool: PgPool,
    /// How long one renewal extends a subscription, in days.
    pub days: i64,
}

/// The business tables, beside idem's own in the same database. Several instances start
/// together: the advisory lock keeps their `CREATE TABLE`s from racing.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(7262)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS subscriptions (
            id         TEXT   PRIMARY KEY,
            paid_until BIGINT NOT NULL
        )",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS renewals (
            operation_id TEXT   PRIMARY KEY,
            subscription TEXT   NOT NULL,
            plan         TEXT   NOT NULL,
            paid_until   BIGINT NOT NULL
        )",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The body of `POST /subscriptions/{subscription}/renewals`.
#[derive(Deserialize)]
pub struct Renew {
    /// The plan renewed.
    pub plan: String,
    /// A coupon, if any: absent and `null` are the same request.
    pub coupon: Option<String>,
}

/// A renewal, as the client gets it (and gets it again on a retry).
#[derive(Serialize)]
pub struct Renewal {
    /// `ren_<operation id>`.
    pub id: String,
    /// The subscription renewed.
    pub subscription: String,
    /// The plan renewed.
    pub plan: String,
    /// Until when the subscription is paid, in unix seconds.
    pub paid_until: i64,
}

impl Renewal {
    fn from_row(row: &PgRow) -> Result<Renewal, sqlx::Error> {
        let operation_id: String = row.try_get("operation_id")?;
        Ok(Renewal {
            id: format!("ren_{operation_id}"),
            subscription: row.try_get("subscription")?,
            plan: row.try_get("plan")?,
            paid_until: row.try_get("paid_until")?,
        })
    }
}

/// `POST /subscriptions/{subscription}/renewals`: extends the subscription by
/// `app.days`, at most once per key. The renewal and the key's final state commit in one
/// transaction; a process killed midway leaves neither.
#[idem::contract(
    key_scope     = client,                        // the Idempotency-Key header, per client
    fingerprint   = [plan, coupon],                // and the path's subscription
    ttl           = "24h",
    deadline      = ("30s", per_attempt = "10s"),
    max_attempts  = 4,
    retryable     = [429, 503, timeout],
    concurrency   = conflict,                      // a duplicate in flight gets 409 + Retry-After
    status_lookup = renewal_status(path = "/renewals/operations/{key}"),
    recovery      = reconcile_renewal,             // decides an unknown outcome, below
)]
pub async fn renew_subscription(
    State(app): State<App>,
    attempt: idem::Attempt,
    tx: idem::PgTx, // before the body extractor
    Path(subscription): Path<String>,
    Json(renew): Json<Renew>, // the body extractor comes last
) -> Result<(StatusCode, Json<Renewal>), (StatusCode, String)> {
    let failed = |e: sqlx::Error| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut conn = tx.conn().await.map_err(failed)?;
    let paid_until: i64 = sqlx::query_scalar(
        "INSERT INTO subscriptions (id, paid_until)
         VALUES ($1, EXTRACT(EPOCH FROM now())::BIGINT + $2 * 86400)
         ON CONFLICT (id) DO UPDATE SET paid_until =
             GREATEST(subscriptions.paid_until, EXTRACT(EPOCH FROM now())::BIGINT) + $2 * 86400
         RETURNING paid_until",
    )
    .bind(&subscription)
    .bind(app.days)
    .fetch_one(&mut *conn)
    .await
    .map_err(failed)?;
    let row = sqlx::query(
        "INSERT INTO renewals (operation_id, subscription, plan, paid_until)
         VALUES ($1, $2, $3, $4) RETURNING *",
    )
    .bind(attempt.operation_id.to_string()) // what the reconcile function looks for
    .bind(&subscription)
    .bind(&renew.plan)
    .bind(paid_until)
    .fetch_one(&mut *conn)
    .await
    .map_err(failed)?;
    // No commit: idem commits the renewal with the key's final state, or rolls both back.
    let renewal = Renewal::from_row(&row).map_err(failed)?;
    Ok((StatusCode::CREATED, Json(renewal)))
}

/// What became of an operation whose outcome is unknown (its instance died, its attempt
/// ran out of time): the renewal written under its operation id, if it committed.
pub async fn reconcile_renewal(app: App, op: idem::UnknownOperation) -> idem::Decision {
    let found = sqlx::query("SELECT * FROM renewals WHERE operation_id = $1")
        .bind(op.operation_id.to_string())
        .fetch_optional(&app.pool)
        .await;
    match found.and_then(|row| row.as_ref().map(Renewal::from_row).transpose()) {
        // It committed: the answer the first attempt would have given.
        Ok(Some(renewal)) => idem::Decision::applied((StatusCode::CREATED, Json(renewal))),
        // Nothing committed (the transaction rolled back): the retry runs it again.
        Ok(None) => idem::Decision::NotApplied,
        // The database cannot be read now: ask again at the next retry.
        Err(error) => idem::Decision::cannot_decide_now(error.to_string()),
    }
}

/// `GET /renewals/operations/{key}`: what became of the client's renewal under `key`.
pub async fn renewal_status(
    lookup: idem::Lookup<renew_subscription::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// The service's routes, under the idem handle `idem`.
pub fn router(idem: &idem::Idem, app: App) -> Router {
    Router::new()
        .route(
            "/subscriptions/{subscription}/renewals",
            post(renew_subscription),
        )
        .route("/renewals/operations/{key}", get(renewal_status))
        .with_state(app)
        .layer(idem.layer())
}
