//! What a contract adds to an OpenAPI operation: the `x-idempotency`
//! extension, the key header parameter, the problem answers 400, 409, 422, 429 and 503
//! (and 202 for `concurrency = accepted`), and the shared components they refer to.
//!
//! Everything here is valid in OpenAPI 3.0 and 3.1 alike: Schema Objects use only the
//! keywords both versions share (no `const`, `$defs` or type arrays). The JSON Schema of
//! the extension itself is published separately ([`idem_contract::schema`]).

use serde_json::{Map, Value, json};

use idem_contract::key::MAX_KEY_LEN;
use idem_contract::{Concurrency, Contract, Fingerprint, KeyFormat, Retryable, StatusCode};

use crate::problem::{self, ProblemType};
use crate::words;

/// The extension's name on an Operation Object.
pub const EXTENSION: &str = "x-idempotency";

/// Marks the components idem writes, so that a later merge may replace them and never
/// replaces a component of the same name that someone else wrote.
pub const GENERATED_MARK: &str = "x-idem-generated";

/// The problem schema, `#/components/schemas/IdemProblem`.
pub const PROBLEM_SCHEMA: &str = "IdemProblem";
/// The `Retry-After` header, `#/components/headers/IdemRetryAfter`.
pub const RETRY_AFTER_HEADER: &str = "IdemRetryAfter";
/// The `Operation-Id` header, `#/components/headers/IdemOperationId`.
pub const OPERATION_ID_HEADER: &str = "IdemOperationId";
/// The `Idempotent-Replayed` header, `#/components/headers/IdemReplayed`.
pub const REPLAYED_HEADER: &str = "IdemReplayed";

/// The media type of problem answers (RFC 9457 §3).
pub const PROBLEM_MEDIA_TYPE: &str = "application/problem+json";

/// The statuses a contract adds to an operation's responses, in order.
pub const STATUSES: [u16; 5] = [400, 409, 422, 429, 503];

/// The example key and operation id used in examples.
pub const EXAMPLE_KEY: &str = "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60";
const EXAMPLE_OPERATION_ID: &str = "0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f";

/// The value of `x-idempotency`: the contract's serde form, all nine properties and the
/// operation's name, described by [`idem_contract::schema`].
pub fn extension(contract: &Contract) -> Value {
    serde_json::to_value(contract).expect("a contract always serialises")
}

/// The key header parameter (`in: header`, required), or `None` when the key is a body
/// field.
///
/// Its schema is what the server accepts: 1 to 255 visible ASCII characters,
/// or a hyphenated UUID for `format = uuid`.
pub fn key_parameter(contract: &Contract) -> Option<Value> {
    let name = contract.key_scope.header()?;
    let schema = match contract.key_scope.format {
        KeyFormat::Any => json!({
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_KEY_LEN,
            "pattern": "^[!-~]+$",
        }),
        KeyFormat::Uuid => json!({
            "type": "string",
            "format": "uuid",
            "minLength": 36,
            "maxLength": 36,
            "pattern": "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$",
        }),
    };
    Some(json!({
        "name": name,
        "in": "header",
        "required": true,
        "description": key_description(contract),
        "schema": schema,
        "example": EXAMPLE_KEY,
    }))
}

fn key_description(contract: &Contract) -> String {
    let shape = match contract.key_scope.format {
        KeyFormat::Any => {
            "1 to 255 visible ASCII characters; a UUID is a good choice. Sent bare (`abc`) or as an RFC 8941 string (`\"abc\"`), which names the same key"
        }
        KeyFormat::Uuid => {
            "a UUID in its hyphenated form, sent bare or as an RFC 8941 string (`\"…\"`), which names the same key"
        }
    };
    let significant = match &contract.fingerprint {
        Fingerprint::Body => "a different body".to_owned(),
        Fingerprint::Fields(fields) => format!(
            "different values of {}",
            words::list(
                &fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>(),
                "or"
            )
        ),
    };
    format!(
        "Idempotency key ({shape}). Create one key per business intent before the first attempt, \
         and send it unchanged on every retry of that intent: the server then runs the operation \
         at most once and answers a retry with the stored result (`Idempotent-Replayed: true`). \
         Keys are kept per client and per operation for {ttl}. The same key with {significant} \
         is refused with 422.",
        ttl = words::duration(contract.ttl),
    )
}

/// Whether the contract lets a client retry after `status`.
fn retryable(contract: &Contract, status: u16) -> bool {
    contract
        .retryable
        .contains(&Retryable::Status(StatusCode(status)))
}

fn retry_sentence(contract: &Contract, status: u16) -> String {
    if retryable(contract, status) {
        format!(
            "{status} is retryable under this operation's contract: wait for `Retry-After`, then send the same request with the same key."
        )
    } else {
        format!(
            "{status} is not retryable under this operation's contract: stop, and ask the status lookup before starting the operation again."
        )
    }
}

/// What a client does with `status` when the operation itself answers it (a problem
/// `type` that is not idem's, or no problem body), by the contract's `retryable`: a
/// retryable status released the key, anything else is final. For 503 the
/// list decides for idem's own answers too; idem's 409s are its concurrency response,
/// retried whatever the list says.
fn own_answer(contract: &Contract, status: u16) -> String {
    let own =
        format!("The operation itself may answer {status} too, with a problem `type` of its own.");
    match (retryable(contract, status), status) {
        (true, _) => format!(
            "{own} {status} is retryable under this operation's contract, whoever answered it: wait for `Retry-After` (or back off when there is none), then send the same request with the same key."
        ),
        (false, 503) => format!(
            "{own} 503 is not retryable under this operation's contract, whoever answered it: stop, and ask the status lookup before starting the operation again."
        ),
        (false, _) => format!(
            "A {status} with a problem `type` other than these comes from the operation itself and is final: {status} is not retryable under this operation's contract."
        ),
    }
}

/// The Response Objects a contract adds, by status: 400, 409, 422, 429, 503, and 202 for
/// `concurrency = accepted`.
pub fn responses(contract: &Contract) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if matches!(contract.concurrency, Concurrency::Accepted) {
        out.push((
            "202".to_owned(),
            json!({
                "description": "A request with this key is still running, so this duplicate was not run again. `Location` is the status lookup of the key: ask it for the outcome.",
                "headers": {
                    "Location": {
                        "description": "The status lookup of this key.",
                        "schema": { "type": "string", "format": "uri-reference" },
                    },
                    "Operation-Id": header_ref(OPERATION_ID_HEADER),
                },
            }),
        ));
    }
    for status in STATUSES {
        let description = match status {
            400 => "The request was refused before anything ran: the idempotency key is missing or malformed, the body is not valid JSON, or the client is not identified. Fix the request; do not retry it unchanged.".to_owned(),
            409 => format!(
                "{} Retry with the same key after `Retry-After`; never with a new key, which could run the operation twice. {}",
                match contract.concurrency {
                    Concurrency::Conflict { .. } => "An earlier attempt with the same key is still running (`operation-in-progress`), or stopped before its outcome was recorded (`operation-outcome-unknown`).".to_owned(),
                    Concurrency::Wait { limit } => format!("An earlier attempt with the same key was still running after the server waited {} for it (`operation-in-progress`), or stopped before its outcome was recorded (`operation-outcome-unknown`).", words::duration(limit)),
                    Concurrency::Accepted => "An earlier attempt with the same key stopped before its outcome was recorded (`operation-outcome-unknown`).".to_owned(),
                },
                own_answer(contract, 409),
            ),
            422 => "The idempotency key was already used with different significant content (`fingerprint-mismatch`); this request was not run. Do not retry: a retry sends exactly the first request's content, and a new business intent needs a new key.".to_owned(),
            429 => format!("Too many requests. {}", retry_sentence(contract, 429)),
            _ => format!(
                "This attempt did not complete: the idempotency store is unavailable and nothing ran (`store-unavailable`), or the attempt ran out of time on the server (`attempt-timed-out`) or failed before it answered (`attempt-failed`) and its outcome is not known yet. {}",
                own_answer(contract, 503)
            ),
        };
        let mut headers = Map::new();
        if matches!(status, 409 | 429 | 503) {
            headers.insert("Retry-After".into(), header_ref(RETRY_AFTER_HEADER));
        }
        headers.insert("Operation-Id".into(), header_ref(OPERATION_ID_HEADER));
        out.push((
            status.to_string(),
            json!({
                "description": description,
                "headers": headers,
                "content": { PROBLEM_MEDIA_TYPE: problem_media_type(status) },
            }),
        ));
    }
    out
}

/// The `application/problem+json` Media Type Object of `status`, with one example per
/// problem type answered with it.
pub fn problem_media_type(status: u16) -> Value {
    let mut examples = Map::new();
    for p in ProblemType::with_status(status) {
        let mut value = json!({
            "type": p.type_uri().to_owned(),
            "title": p.title(),
            "status": p.status(),
            "detail": capitalise(p.meaning()),
        });
        if let Some(state) = p.state() {
            value["operation_id"] = EXAMPLE_OPERATION_ID.into();
            value["state"] = state.into();
        }
        if let Some(safe) = p.new_key_safe() {
            value["new_key_safe"] = safe.into();
        }
        examples.insert(
            p.slug().to_owned(),
            json!({ "summary": p.title(), "value": value }),
        );
    }
    if examples.is_empty() {
        examples.insert(
            "too-many-requests".to_owned(),
            json!({
                "summary": "Too Many Requests",
                "value": { "type": "about:blank", "title": "Too Many Requests", "status": status },
            }),
        );
    }
    json!({ "schema": schema_ref(PROBLEM_SCHEMA), "examples": examples })
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect::<String>() + ".",
        None => String::new(),
    }
}

/// `{"$ref": "#/components/headers/<name>"}`
pub fn header_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/headers/{name}") })
}

/// `{"$ref": "#/components/schemas/<name>"}`
pub fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The headers every answer of a contracted operation may carry, added to the
/// operation's own responses: `Operation-Id` and `Idempotent-Replayed`.
pub fn replay_headers() -> [(&'static str, Value); 2] {
    [
        ("Operation-Id", header_ref(OPERATION_ID_HEADER)),
        ("Idempotent-Replayed", header_ref(REPLAYED_HEADER)),
    ]
}

/// The components the additions refer to, as `(section, name, value)`: the problem
/// schema and three headers. Each carries [`GENERATED_MARK`].
pub fn components() -> Vec<(&'static str, &'static str, Value)> {
    let slugs: Vec<String> = ProblemType::ALL
        .iter()
        .map(|p| format!("`{}`", p.slug()))
        .collect();
    vec![
        (
            "schemas",
            PROBLEM_SCHEMA,
            json!({
                "type": "object",
                "description": "A problem detail (RFC 9457) from an operation with an idempotency contract. Answers about a known operation (409, 422, 503) also carry `operation_id`, `state` and `new_key_safe`. Other members may appear and are to be ignored.",
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
                    "state": { "type": "string", "description": "The state of the operation the key names: `processing` (an attempt is running), `completed` (finished; its result is stored), or `unknown` (an attempt stopped before its outcome was recorded; the server is finding out).", "example": "processing" },
                    "new_key_safe": { "type": "boolean", "description": "Whether the client may start the business operation again with a new key without risking it twice. `false` means: keep the key, retry it or ask the status lookup." },
                },
                GENERATED_MARK: true,
            }),
        ),
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
                "description": "`true` when this answer is the stored result of an earlier attempt with the same key, replayed byte for byte; absent on the first answer.",
                "schema": { "type": "string", "enum": ["true"] },
                "example": "true",
                GENERATED_MARK: true,
            }),
        ),
    ]
}
