//! The HTTP API: `POST /payments` under its idempotency contract, `GET /payments/{id}`,
//! the contract's status lookup `GET /payments/operations/{key}`, and the OpenAPI
//! document `GET /openapi.json`, built by utoipa with the contract merged in.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;

use crate::db::{self, NewPayment, Payment};
use idem::journal::{CallError, Interrupted, StepError};

use crate::provider::{ChargeError, ChargeRequest, Decline, Provider};

/// The header that says who the client is: a stand-in for real authentication.
pub const CLIENT_ID_HEADER: &str = "x-client-id";

/// The base of this service's own problem `type` URIs.
pub const PROBLEM_BASE: &str = "https://payments.example.com/problems/";

/// The largest amount, in minor units.
pub const MAX_AMOUNT_MINOR: i64 = 1_000_000_000_000;

/// The service's state.
#[derive(Clone)]
pub struct App {
    /// The database of payments (and of idem's records), for reads.
    pub db: PgPool,
    /// The payment provider's client, for charging a payment.
    pub provider: Provider,
    /// Demo settings that make the failure cases visible from a terminal.
    pub demo: Arc<Demo>,
}

/// Settings that make the failure cases visible. All off by default.
#[derive(Debug, Default)]
pub struct Demo {
    /// Every `POST /payments` waits this long after the provider charged the card and the
    /// payment is written (inside its transaction, not committed yet) before answering:
    /// the moment to kill the process.
    pub delay: Duration,
}

/// The body of `POST /payments`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePayment {
    /// The card or account to charge, such as `card_visa_4242`: 1 to 64 visible ASCII
    /// characters.
    pub source: String,
    /// An ISO 4217 code: three uppercase letters.
    pub currency: String,
    /// The amount in minor units: 1 to [`MAX_AMOUNT_MINOR`].
    pub amount_minor: i64,
}

impl CreatePayment {
    /// Every rule the payment breaks, as `(field, problem)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.source.is_empty()
            || self.source.len() > 64
            || !self.source.bytes().all(|b| b.is_ascii_graphic())
        {
            out.push(("source", "must be 1 to 64 visible ASCII characters".into()));
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            out.push(("currency", "must be an ISO 4217 code such as `EUR`".into()));
        }
        if !(1..=MAX_AMOUNT_MINOR).contains(&self.amount_minor) {
            out.push((
                "amount_minor",
                format!("must be between 1 and {MAX_AMOUNT_MINOR}"),
            ));
        }
        out
    }
}

/// The service's own errors, as RFC 9457 problems.
#[derive(Debug)]
pub enum ApiError {
    /// The payment breaks a rule: 422, final, stored and replayed.
    Invalid(Vec<(&'static str, String)>),
    /// The provider declined the charge: 402, final, stored and replayed.
    Declined(Decline),
    /// The charge's outcome is unknown (idem's 503 `step-outcome-unknown`): the
    /// operation keeps its key and resumes on the retry, which sends the charge again
    /// under the same downstream key.
    Interrupted(Interrupted),
    /// No such payment for this client: 404.
    NotFound,
    /// The database failed: 500, rolled back.
    Database(sqlx::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> ApiError {
        ApiError::Database(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title, errors) = match self {
            ApiError::Interrupted(interrupted) => return interrupted.into_response(),
            ApiError::Declined(decline) => return declined(&decline),
            ApiError::Invalid(errors) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-payment",
                "The payment breaks a rule",
                errors,
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "payment-not-found",
                "No such payment",
                Vec::new(),
            ),
            ApiError::Database(error) => {
                tracing::error!(%error, "payments: database error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "The payment could not be processed",
                    Vec::new(),
                )
            }
        };
        let errors: Vec<_> = errors
            .into_iter()
            .map(|(field, problem)| json!({ "field": field, "problem": problem }))
            .collect();
        let mut body = json!({
            "type": format!("{PROBLEM_BASE}{slug}"),
            "title": title,
            "status": status.as_u16(),
        });
        if !errors.is_empty() {
            body["errors"] = errors.into();
        }
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// 402 `card-declined`, with the provider's code and message.
fn declined(decline: &Decline) -> Response {
    let body = json!({
        "type": format!("{PROBLEM_BASE}card-declined"),
        "title": "The card was declined",
        "status": 402,
        "detail": decline.message,
        "code": decline.code,
    });
    let mut response = (StatusCode::PAYMENT_REQUIRED, Json(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

impl From<StepError<Decline>> for ApiError {
    fn from(error: StepError<Decline>) -> ApiError {
        match error {
            StepError::Definite(decline) => ApiError::Declined(decline),
            StepError::Interrupted(interrupted) => ApiError::Interrupted(interrupted),
        }
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn created(payment: Payment) -> Response {
    let location = HeaderValue::from_str(&format!("/payments/{}", payment.id)).ok();
    let mut response = (StatusCode::CREATED, Json(payment)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// `POST /payments`: charges the card at the provider and captures the payment, at most
/// once per idempotency key.
///
/// The charge is the journal's step `charge`: its intent is recorded before the call
/// and its outcome after, outside the transaction, and the provider deduplicates on the
/// step's downstream key, so a retry, a crash or a takeover never charges twice. The
/// payment is written in `tx`; idem commits it with the key's final state.
// utoipa's attribute comes first, so that it reads the function as written.
#[utoipa::path(
    post,
    path = "/payments",
    summary = "Capture a payment",
    request_body = CreatePayment,
    responses(
        (status = 201, description = "The payment was captured", body = Payment,
            headers(("Location" = String, description = "The payment's URL"))),
    )
)]
#[idem::contract(
    key_scope     = client,
    fingerprint   = [source, currency, amount_minor],
    ttl           = "24h",
    deadline      = ("30s", per_attempt = "10s"),
    max_attempts  = 4,
    retryable     = [429, 503, 504, timeout, connection_reset],
    concurrency   = conflict,
    status_lookup = payment_operation_status(path = "/payments/operations/{key}"),
    recovery      = resume,
)]
pub async fn create_payment(
    State(app): State<App>,
    attempt: idem::Attempt,
    mut journal: idem::Journal,
    tx: idem::PgTx,
    Json(body): Json<CreatePayment>,
) -> Result<Response, ApiError> {
    let problems = body.problems();
    if !problems.is_empty() {
        return Err(ApiError::Invalid(problems));
    }
    let request = ChargeRequest {
        amount_minor: body.amount_minor,
        currency: body.currency.clone(),
        source: body.source.clone(),
    };
    let provider = &app.provider;
    let charge = journal
        .step("charge", |key| async move {
            provider
                .charge(&request, key.as_str())
                .await
                .map_err(|error| match error {
                    ChargeError::Declined(decline) => CallError::Definite(decline),
                    ChargeError::Unknown(why) => CallError::Unknown(why),
                })
        })
        .await?;
    let operation_id = attempt.operation_id.to_string();
    let payment = db::insert(
        &mut *tx.conn().await?,
        NewPayment {
            operation_id: &operation_id,
            client: &attempt.client,
            key: &attempt.key,
            source: &body.source,
            currency: &body.currency,
            amount_minor: body.amount_minor,
            charge_id: Some(&charge.id),
            now: unix_millis(),
        },
    )
    .await?;
    if !app.demo.delay.is_zero() {
        tokio::time::sleep(app.demo.delay).await;
    }
    Ok(created(payment))
}

/// `GET /payments/{id}`: one of the client's payments.
#[utoipa::path(
    get,
    path = "/payments/{id}",
    summary = "Read a payment",
    params(("id" = String, Path, description = "The payment's id")),
    responses(
        (status = 200, description = "The payment", body = Payment),
        (status = 404, description = "No such payment for this client"),
    )
)]
pub async fn get_payment(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Payment>, ApiError> {
    let client = headers
        .get(CLIENT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::NotFound)?;
    db::by_id(&app.db, client, &id)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound)
}

/// `GET /payments/operations/{key}`: the state of the client's `create_payment`
/// operation under `key`.
#[utoipa::path(
    get,
    path = "/payments/operations/{key}",
    summary = "The state of a payment operation, by its idempotency key",
    params(("key" = String, Path, description = "The idempotency key")),
    // idem's merge describes the answers.
    responses()
)]
pub async fn payment_operation_status(
    lookup: idem::Lookup<create_payment::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// The OpenAPI document utoipa builds from the attributes above.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Payments",
        description = "Captures payments at most once per idempotency key."
    ),
    paths(create_payment, get_payment, payment_operation_status)
)]
pub struct ApiDoc;

/// The OpenAPI document this service serves at `/openapi.json`: utoipa's, with the
/// contract of `POST /payments` merged in (`x-idempotency`, the key and client
/// headers, idem's answers and the status lookup's).
///
/// # Errors
///
/// When the contract and the document disagree (no operation `create_payment`); the
/// tests make sure they do not.
pub fn openapi() -> Result<serde_json::Value, idem::codegen::Errors> {
    use utoipa::OpenApi;
    let options = idem::codegen::openapi::MergeOptions::new().with_client_identity(
        idem::model::extension::ClientIdentity::header(CLIENT_ID_HEADER),
    );
    let merged =
        idem::codegen::utoipa::merge(&ApiDoc::openapi(), [&create_payment::CONTRACT], &options)?;
    for warning in &merged.warnings {
        tracing::warn!(%warning, "payments: the contract does not fit the document");
    }
    Ok(merged.document)
}

/// The routes, with idem's layer; the caller supplies the state. `document` is what
/// `GET /openapi.json` answers ([`openapi`]).
pub fn router(idem: &idem::Idem, document: serde_json::Value) -> Router<App> {
    // Serialised once, at start-up; every request gets the same bytes.
    let document = axum::body::Bytes::from(
        serde_json::to_vec(&document).expect("a JSON value always serialises"),
    );
    Router::new()
        .route("/payments", post(create_payment))
        .route("/payments/{id}", get(get_payment))
        .route("/payments/operations/{key}", get(payment_operation_status))
        .layer(idem.layer())
        .route(
            "/openapi.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], document) }),
        )
}
