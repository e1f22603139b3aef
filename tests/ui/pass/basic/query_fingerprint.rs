//! Significant query parameters: `fingerprint = ([..], query = [..])`, checked against
//! the handler's `Query<T>`.
use axum::{Json, extract::Query, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateExport {
    amount: u64,
}

#[derive(Deserialize)]
struct ExportOptions {
    expand: Option<String>,
    format: Option<String>,
}

async fn export_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = ([amount], query = [expand, format]),
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = export_status,
    recovery = manual("https://runbooks.example.com/exports"),
)]
async fn create_export(
    Query(options): Query<ExportOptions>,
    Json(export): Json<CreateExport>,
) -> StatusCode {
    let _ = (options.expand, options.format, export.amount);
    StatusCode::CREATED
}

fn main() {
    assert_eq!(create_export::CONTRACT.fingerprint_query.len(), 2);
    let _: axum::Router = axum::Router::new().route("/exports", axum::routing::post(create_export));
}
