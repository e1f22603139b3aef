#![allow(unused)]
use axum::{Json, extract::Query, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateExport {
    amount: u64,
}

#[derive(Deserialize)]
struct ExportOptions {
    expand: Option<String>,
}

async fn export_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = ([amount], query = [expand]),
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = export_status,
    recovery = manual("https://runbooks.example.com/exports"),
)]
async fn create_export(Json(export): Json<CreateExport>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
