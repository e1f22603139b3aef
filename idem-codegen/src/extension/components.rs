//! The shared components the additions refer to.

use serde_json::{Value, json};

use super::{
    EXAMPLE_KEY, EXAMPLE_OPERATION_ID, GENERATED_MARK, OPERATION_ID_HEADER, PROBLEM_SCHEMA,
    REPLAYED_HEADER, RETRY_AFTER_HEADER, STATUS_SCHEMA,
};
use crate::problem::{self, ProblemType};
use crate::words;

/// What `state` means, shared by the problem schema and the status lookup's answer.
const STATE: &str = "The state of the operation the key names: `processing` (an attempt is running, or stopped before its outcome was recorded and the server has not settled it yet), `completed` (finished; its answer is stored and replayed), `released` (the last attempt took no effect, for example it answered a retryable status or was rolled back; the same request with the same key runs the operation again), or `unknown` (an attempt stopped before its outcome was recorded and the server could not tell whether it took effect; an operator resolves it).";

/// What `new_key_safe` means: the one rule about new keys.
const NEW_KEY_SAFE: &str = "Whether nothing can have taken effect under this key, so that sending the business operation again cannot run it twice. `true`: nothing ran, or what ran was undone; send it again, with the same key while the server remembers it. `false`: it may have taken effect, or still may: keep the key, retry with it or ask the status lookup, and never start the operation again with a new key.";

/// The components the additions refer to, as `(section, name, value)`: the problem
/// schema, the status lookup's answer and three headers. Each carries
/// [`GENERATED_MARK`].
pub fn components() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("schemas", PROBLEM_SCHEMA, problem_schema()),
        ("schemas", STATUS_SCHEMA, status_schema()),
        (
            "headers",
            RETRY_AFTER_HEADER,
            json!({
                "description": "How long to wait before the next attempt (RFC 9110 §10.2.3): a number of seconds, or an HTTP date. Never wait past the operation's deadline.",
                "schema": { "type": "string" },
                "example": "1",
                GENERATED_MARK: true,
            }),
        ),
        (
            "headers",
            OPERATION_ID_HEADER,
            json!({
                "description": "The operation id: assigned by the server, time-ordered, the same on every attempt of one business operation. Quote it when asking about an operation.",
                "schema": { "type": "string" },
                "example": EXAMPLE_OPERATION_ID,
                GENERATED_MARK: true,
            }),
        ),
        (
            "headers",
            REPLAYED_HEADER,
            json!({
                "description": "`true` when this answer is the stored result of an earlier attempt with the same key, replayed byte for byte (a body larger than the server keeps is replaced by a problem of type `tag:idem.rs,2026:problem:result-body-not-kept` that gives its length and SHA-256, with the same status); absent on the first answer.",
                "schema": { "type": "string", "enum": ["true"] },
                "example": "true",
                GENERATED_MARK: true,
            }),
        ),
    ]
}

/// `#/components/schemas/IdemProblem`: a problem detail (RFC 9457) of idem's.
fn problem_schema() -> Value {
    let slugs: Vec<String> = ProblemType::ALL
        .iter()
        .map(|p| format!("`{}`", p.slug()))
        .collect();
    json!({
        "type": "object",
        "description": "A problem detail (RFC 9457) from an operation with an idempotency contract. Answers about a known operation (409, 422, and 503 but `store-unavailable`) also carry `operation_id` and `state`; answers of the idempotency layer carry `new_key_safe`. Other members may appear and are to be ignored.",
        "properties": {
            "type": {
                "type": "string",
                "format": "uri-reference",
                "description": format!("A URI naming the problem: `{}` followed by one of {}; or another URI for answers that do not come from the idempotency layer (such as a rate limiter's 429, or a 503 of the operation itself).", problem::TYPE_PREFIX, words::list(&slugs, "or")),
                "example": format!("{}operation-in-progress", problem::TYPE_PREFIX),
            },
            "title": { "type": "string", "description": "A short summary of the problem type." },
            "status": { "type": "integer", "minimum": 100, "maximum": 599, "description": "The HTTP status of the answer." },
            "detail": { "type": "string", "description": "What happened, for a person." },
            "instance": { "type": "string", "format": "uri-reference", "description": "A URI for this occurrence." },
            "operation_id": { "type": "string", "description": "The operation id: assigned by the server, time-ordered, the same on every attempt of one business operation.", "example": EXAMPLE_OPERATION_ID },
            "state": { "type": "string", "enum": ["processing", "completed", "released", "unknown"], "description": STATE, "example": "processing" },
            "new_key_safe": { "type": "boolean", "description": NEW_KEY_SAFE },
        },
        GENERATED_MARK: true,
    })
}

/// `#/components/schemas/IdemOperationStatus`: the status lookup's answer.
fn status_schema() -> Value {
    json!({
        "type": "object",
        "description": "What the status lookup knows about the client's operation under one key. Other members may appear and are to be ignored.",
        "required": ["operation_id", "key", "state", "attempt", "created_at", "expires_at", "new_key_safe"],
        "properties": {
            "operation": { "type": "string", "description": "The server's name for the operation the key belongs to (keys are kept per client and per operation)." },
            "operation_id": { "type": "string", "description": "The operation id: assigned by the server, time-ordered, the same on every attempt of the operation; the `Operation-Id` of its answers.", "example": EXAMPLE_OPERATION_ID },
            "key": { "type": "string", "description": "The idempotency key, as the server read it (without the quotes of an RFC 8941 string).", "example": EXAMPLE_KEY },
            "state": { "type": "string", "enum": ["processing", "completed", "released", "unknown"], "description": STATE, "example": "completed" },
            "attempt": { "type": "integer", "minimum": 1, "description": "How many attempts have run under this key: 1 for the first, plus one for each that ran again after a release or a recovery. Duplicates answered with 409 or 202 do not count.", "example": 1 },
            "created_at": { "type": "string", "format": "date-time", "description": "When the first attempt registered the key (RFC 3339, UTC).", "example": "2026-11-29T18:00:00.123Z" },
            "expires_at": { "type": "string", "format": "date-time", "description": "When the server forgets the key and its answer; after it, the key starts a new operation.", "example": "2026-11-30T18:00:00.123Z" },
            "new_key_safe": { "type": "boolean", "description": format!("{NEW_KEY_SAFE} `true` only in the state `released`."), "example": false },
            "retry_after": { "type": "integer", "minimum": 1, "description": "In the state `processing`: the seconds until the running attempt's time is up; ask again, or retry with the same key, after it.", "example": 2 },
            "reason": { "type": "string", "description": "In the state `unknown`: why, or the runbook an operator follows." },
            "response": {
                "type": "object",
                "description": "In the state `completed`: the stored answer, the one a retry with the same key gets replayed.",
                "required": ["status", "headers"],
                "properties": {
                    "status": { "type": "integer", "minimum": 100, "maximum": 599, "description": "Its status.", "example": 201 },
                    "headers": {
                        "type": "object",
                        "description": "The headers stored with it, by lowercase name (repeated ones joined with `, `), such as `location`: where the operation's result is.",
                        "additionalProperties": { "type": "string" },
                        "example": { "content-type": "application/json", "location": "/orders/ord_7" },
                    },
                    "body": { "description": "Its body, when it is JSON; left out otherwise." },
                },
            },
        },
        GENERATED_MARK: true,
    })
}
