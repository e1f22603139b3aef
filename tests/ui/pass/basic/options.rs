//! The other forms of each property, in another order, with a trailing comma; a handler
//! without state, one without arguments, and one in a module.
#![allow(dead_code)]
use axum::{Json, Router, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Deserialize)]
struct Meta {
    client_reference: String,
}

#[derive(Deserialize)]
struct Apply {
    meta: Meta,
    position: String,
}

async fn lookup() -> &'static str {
    "ok"
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::Unknown("not reconciled".into())
}

#[idem::contract(
    recovery = manual("https://runbooks.example.com/applications"),
    status_lookup = lookup(path = "/applications/operations/{key}"),
    concurrency = accepted,
    retryable = [503, connection_reset, connection_refused],
    max_attempts = 1,
    deadline = "2s",
    ttl = "7d",
    fingerprint = [meta.client_reference, position],
    key_scope = client(body = meta.client_reference),
)]
async fn apply(Json(body): Json<Apply>) -> StatusCode {
    let _ = (body.meta.client_reference, body.position);
    StatusCode::ACCEPTED
}

#[idem::contract(
    key_scope = client(header = "X-Request-Key", format = uuid),
    fingerprint = body,
    ttl = "1h",
    deadline = "30s",
    max_attempts = 10,
    retryable = [],
    concurrency = wait("5s"),
    status_lookup = lookup,
    recovery = reconcile,
)]
async fn start_process() -> StatusCode {
    StatusCode::NO_CONTENT
}

mod payments {
    use axum::http::StatusCode;

    pub async fn payment_status() -> StatusCode {
        StatusCode::OK
    }

    pub async fn reconcile_payment(_: idem::UnknownOperation) -> idem::Decision {
        idem::Decision::NotApplied
    }

    #[idem::contract(
        key_scope = client,
        fingerprint = body,
        ttl = "24h",
        deadline = "1m",
        max_attempts = 3,
        retryable = [429, 503, timeout],
        concurrency = conflict(retry_after = "3s"),
        status_lookup = self::payment_status,
        recovery = crate::payments::reconcile_payment,
    )]
    pub async fn pay(body: String) -> StatusCode {
        let _ = body;
        StatusCode::CREATED
    }
}

fn main() {
    let _app: Router = Router::new()
        .route("/applications", post(apply))
        .route("/processes", post(start_process))
        .route("/payments", post(payments::pay));
    assert_eq!(apply::CONTRACT.key_scope.header(), None);
    assert_eq!(
        start_process::CONTRACT.key_scope.header(),
        Some("X-Request-Key")
    );
    assert_eq!(
        payments::pay::CONTRACT.status_lookup.handler,
        "self::payment_status"
    );
    for contract in [
        &apply::CONTRACT,
        &start_process::CONTRACT,
        &payments::pay::CONTRACT,
    ] {
        assert!(idem::model::check(contract).is_empty(), "{contract:?}");
    }
}
