//! The service's own errors, as RFC 9457 problem details.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::model::FieldErrors;

/// The base of this service's problem `type` URIs (idem's own problems have theirs).
pub const PROBLEM_BASE: &str = "https://orders.example.com/problems/";

/// What can go wrong in the order service itself.
#[derive(Debug)]
pub enum ApiError {
    /// The order breaks business rules: 422, stored and replayed like a success. It
    /// lists at most [`crate::model::MAX_FIELD_ERRORS`] of them and counts the rest
    /// (`more_errors`).
    InvalidOrder(FieldErrors),
    /// No such order for this client: 404.
    NotFound,
    /// The payment provider is down (the `--outage` demo): 503, which the contract
    /// declares retryable, so the key is released and a retry runs again.
    ProviderUnavailable,
    /// The database failed: 500. The order was not written.
    Database(sqlx::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> ApiError {
        ApiError::Database(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title, extra) = match self {
            ApiError::InvalidOrder(errors) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-order",
                "The order breaks a business rule",
                json!({ "errors": errors.errors, "more_errors": errors.more }),
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "order-not-found",
                "No such order",
                json!({}),
            ),
            ApiError::ProviderUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "provider-unavailable",
                "The payment provider is unavailable; retry with the same key",
                json!({}),
            ),
            ApiError::Database(error) => {
                tracing::error!(%error, "orders: database error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "The order could not be processed",
                    json!({}),
                )
            }
        };
        let mut body = json!({
            "type": format!("{PROBLEM_BASE}{slug}"),
            "title": title,
            "status": status.as_u16(),
        });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let mut response = (status, Json(body)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}
