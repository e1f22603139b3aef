//! A handler that takes `idem::Journal` (passed in by the macro, anywhere in its
//! arguments) under `recovery = resume`, and runs a call to another system as a step.
use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use idem::journal::{CallError, StepError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Default)]
struct App;

#[derive(Deserialize)]
struct CreatePayment {
    source: String,
    amount_minor: i64,
}

#[derive(Serialize, Deserialize)]
struct Charge {
    id: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Decline {
    code: String,
}

impl App {
    async fn charge(&self, amount_minor: i64, key: &str) -> Result<Charge, CallError<Decline>> {
        let _ = (amount_minor, key);
        Ok(Charge { id: "ch_1".into() })
    }
}

async fn payment_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = [source, amount_minor],
    ttl = "24h",
    deadline = ("30s", per_attempt = "10s"),
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = payment_status,
    recovery = resume,
)]
async fn create_payment(
    mut journal: idem::Journal,
    State(app): State<App>,
    attempt: idem::Attempt,
    Json(payment): Json<CreatePayment>,
) -> Result<(StatusCode, Json<Charge>), StatusCode> {
    let _ = (attempt.operation_id, payment.source);
    let app = &app;
    match journal
        .step("charge", |key| async move {
            app.charge(payment.amount_minor, key.as_str()).await
        })
        .await
    {
        Ok(charge) => Ok((StatusCode::CREATED, Json(charge))),
        Err(StepError::Definite(_decline)) => Err(StatusCode::PAYMENT_REQUIRED),
        Err(StepError::Interrupted(_)) => Err(StatusCode::SERVICE_UNAVAILABLE),
    }
}

fn main() {
    let _app: Router = Router::new()
        .route("/payments", post(create_payment))
        .with_state(App);
    assert!(matches!(
        create_payment::CONTRACT.recovery,
        idem::model::Recovery::Resume
    ));
}
