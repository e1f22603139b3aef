//! Problem details (RFC 9457) for every answer that idem itself gives.
//!
//! Each case has a stable `type` URI, `tag:idem.rs,2026:problem:<slug>` (a `tag:` URI,
//! RFC 4151: a name that is stable and needs no web server behind it). Bodies are
//! `application/problem+json` with the members `type`, `title`, `status` and `detail`
//! of RFC 9457 §3.1 and, where the operation is known, the extension members
//! `operation_id`, `state` (`processing`, `completed`, `released`, `unknown`) and
//! `new_key_safe`: whether the client may safely start a new operation with a *new* key,
//! which is true only when this key cannot have had an effect.
//!
//! The cases, their statuses and members are listed once, in
//! [`idem_contract::problem`] (re-exported here), which the published OpenAPI responses
//! and consumer docs read too.
//!
//! `Retry-After` is in whole seconds, rounded up (RFC 9110 §10.2.3). Every answer carries
//! the `Operation-Id` header as well.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

use crate::OperationId;
use crate::header::OPERATION_ID;
use crate::store::OperationState;

pub use idem_contract::problem::{PROBLEM_JSON, ProblemType, TYPE_PREFIX};

/// One problem answer: the [`ProblemType`], a `detail` for this occurrence, and the
/// operation's id, state and whether a new key is safe.
///
/// Built with `with_*` setters; turned into the response with [`IntoResponse`].
#[derive(Clone, Debug)]
pub struct Problem {
    kind: ProblemType,
    detail: String,
    operation_id: Option<OperationId>,
    state: Option<OperationState>,
    new_key_safe: Option<bool>,
    retry_after_secs: Option<u64>,
}

impl Problem {
    /// A problem of `kind` with the human-readable `detail` of this occurrence
    /// (RFC 9457 §3.1.4). `new_key_safe` starts at the case's value in the table.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            detail: detail.into(),
            operation_id: None,
            state: None,
            new_key_safe: kind.new_key_safe(),
            retry_after_secs: None,
        }
    }

    /// Sets the operation id (the `operation_id` member and the `Operation-Id` header).
    pub fn with_operation_id(mut self, id: OperationId) -> Problem {
        self.operation_id = Some(id);
        self
    }

    /// Sets the operation's state (the `state` member).
    pub fn with_state(mut self, state: OperationState) -> Problem {
        self.state = Some(state);
        self
    }

    /// Sets whether a new key is safe (the `new_key_safe` member).
    pub fn with_new_key_safe(mut self, safe: bool) -> Problem {
        self.new_key_safe = Some(safe);
        self
    }

    /// Sets `Retry-After`, in whole seconds; `0` is sent as `1` so that a client never
    /// retries in a tight loop.
    pub fn with_retry_after_secs(mut self, secs: u64) -> Problem {
        self.retry_after_secs = Some(secs.max(1));
        self
    }

    /// The case.
    pub fn kind(&self) -> ProblemType {
        self.kind
    }

    /// The `detail` member.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The operation id the problem names, if any.
    pub fn operation_id(&self) -> Option<OperationId> {
        self.operation_id
    }

    /// The `Retry-After` in seconds, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_secs
    }

    /// The body, as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let mut body = serde_json::Map::new();
        body.insert("type".into(), self.kind.type_uri().into());
        body.insert("title".into(), self.kind.title().into());
        body.insert("status".into(), self.kind.status().into());
        body.insert("detail".into(), self.detail.clone().into());
        if let Some(id) = self.operation_id {
            body.insert("operation_id".into(), id.to_string().into());
        }
        if let Some(state) = self.state {
            body.insert("state".into(), state.as_str().into());
        }
        if let Some(safe) = self.new_key_safe {
            body.insert("new_key_safe".into(), safe.into());
        }
        serde_json::Value::Object(body)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_json().to_string();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(id) = self.operation_id {
            headers.insert(OPERATION_ID, id.header_value());
        }
        // The case, for the attempt's telemetry (`crate::telemetry`).
        response.extensions_mut().insert(self.kind);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_uris_are_stable_and_distinct() {
        let uris: std::collections::HashSet<_> =
            ProblemType::ALL.iter().map(|k| k.type_uri()).collect();
        assert_eq!(uris.len(), ProblemType::ALL.len());
        assert_eq!(
            ProblemType::FingerprintMismatch.type_uri(),
            "tag:idem.rs,2026:problem:fingerprint-mismatch"
        );
        for kind in ProblemType::ALL {
            assert!(kind.type_uri().starts_with(TYPE_PREFIX));
            assert!(kind.type_uri().ends_with(kind.slug()));
        }
    }

    #[test]
    fn body_and_headers() {
        let id = OperationId::new();
        let response = Problem::new(ProblemType::OperationInProgress, "still running")
            .with_operation_id(id)
            .with_state(OperationState::Processing)
            .with_retry_after_secs(0)
            .into_response();
        assert_eq!(response.status(), 409);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[OPERATION_ID], id.to_string().as_str());
        let json = Problem::new(ProblemType::OperationInProgress, "still running")
            .with_operation_id(id)
            .with_state(OperationState::Processing)
            .to_json();
        assert_eq!(json["status"], 409);
        assert_eq!(json["state"], "processing");
        assert_eq!(json["new_key_safe"], false);
        assert_eq!(json["operation_id"], id.to_string());
    }
}
