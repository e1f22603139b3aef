//! The Response Objects a contract adds: to its operation, and to its status lookup's
//! operation.

use serde_json::{Map, Value, json};

use idem_contract::extension::ClientIdentity;
use idem_contract::{Concurrency, Contract, Retryable, StatusCode};

use super::{
    EXAMPLE_OPERATION_ID, OPERATION_ID_HEADER, PROBLEM_MEDIA_TYPE, PROBLEM_SCHEMA,
    RETRY_AFTER_HEADER, STATUS_SCHEMA, STATUSES, header_ref, schema_ref,
};
use crate::problem::ProblemType;
use crate::words;

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

/// Why the server could not tell the client, in words: the header's rules, or the
/// credentials in general.
fn unidentified(identity: Option<&ClientIdentity>) -> String {
    match identity.and_then(ClientIdentity::header_name) {
        Some(name) => format!(
            "the `{name}` header is missing, empty, sent more than once, longer than 255 bytes or not visible ASCII"
        ),
        None => "the request does not carry the credentials that identify the client".to_owned(),
    }
}

/// What identifies the client, in words.
fn identity_words(identity: Option<&ClientIdentity>) -> String {
    match identity.and_then(ClientIdentity::header_name) {
        Some(name) => format!("the `{name}` header"),
        None => "the credentials that identify the client".to_owned(),
    }
}

fn unauthorized(identity: Option<&ClientIdentity>) -> String {
    format!(
        "The server could not tell which client is calling (`client-identity-missing`): {}. Keys are kept per client, so nothing ran and nothing was registered under the key. Send the request again with {}; do not retry it unchanged.",
        unidentified(identity),
        identity_words(identity)
    )
}

/// A problem answer with `status`: `description`, the headers (`Retry-After` when
/// `retry_after`), and one example per problem type of `types`.
fn problem_response(
    status: u16,
    description: String,
    retry_after: bool,
    types: &[ProblemType],
) -> Value {
    let mut headers = Map::new();
    if retry_after {
        headers.insert("Retry-After".into(), header_ref(RETRY_AFTER_HEADER));
    }
    headers.insert("Operation-Id".into(), header_ref(OPERATION_ID_HEADER));
    json!({
        "description": description,
        "headers": headers,
        "content": { PROBLEM_MEDIA_TYPE: problem_media(status, types) },
    })
}

/// The Response Objects a contract adds to its operation, by status: 400, 401, 408, 409,
/// 413, 422, 429 and 503; 202 for `concurrency = accepted`; and each other status of
/// `retryable` (such as 504), which the operation itself (or a gateway in front of it)
/// answers.
pub fn responses(contract: &Contract, identity: Option<&ClientIdentity>) -> Vec<(String, Value)> {
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
        let description = description(contract, identity, status);
        let types: Vec<ProblemType> = ProblemType::with_status(status).collect();
        out.push((
            status.to_string(),
            problem_response(
                status,
                description,
                matches!(status, 409 | 429 | 503),
                &types,
            ),
        ));
    }
    out.extend(other_retryable_responses(contract));
    out
}

/// What an answer of `status`, one of [`STATUSES`], means for this operation.
fn description(contract: &Contract, identity: Option<&ClientIdentity>, status: u16) -> String {
    match status {
        400 => "The request was refused before anything ran: the idempotency key is missing or malformed (a quoted key that is not one valid RFC 8941 string included), or the body cannot be read as the JSON or form the operation takes. Fix the request; do not retry it unchanged.".to_owned(),
        401 => unauthorized(identity),
        408 => "The request's body did not arrive within the operation's time for one attempt (`request-timeout`); the server stopped reading it and closed the connection. Nothing ran and nothing was registered under the key: send the same request again with the same key.".to_owned(),
        409 => format!(
            "{} Retry with the same key after `Retry-After`; never with a new key, which could run the operation twice. {}",
            match contract.concurrency {
                Concurrency::Conflict { .. } => "An earlier attempt with the same key is still running (`operation-in-progress`), or stopped before its outcome was recorded (`operation-outcome-unknown`).".to_owned(),
                Concurrency::Wait { limit } => format!("An earlier attempt with the same key was still running after the server waited {} for it (`operation-in-progress`), or stopped before its outcome was recorded (`operation-outcome-unknown`).", words::duration(limit)),
                Concurrency::Accepted => "An earlier attempt with the same key stopped before its outcome was recorded (`operation-outcome-unknown`).".to_owned(),
            },
            own_answer(contract, 409),
        ),
        413 => "The request body is larger than the server accepts (`body-too-large`); nothing ran and nothing was registered under the key. Make the body smaller; sending it again unchanged gets the same answer.".to_owned(),
        422 => "The idempotency key was already used with different significant content (`fingerprint-mismatch`); this request was not run. Do not retry: a retry sends exactly the first request's content, and a new business intent needs a new key.".to_owned(),
        429 => format!("The client holds as many live keys, or bytes of stored answers, as the server keeps for one client (`client-budget-exhausted`): this new key was not registered and nothing ran, so waiting for `Retry-After` (when the client's oldest key expires) and sending the same request with the same key is always safe; keys the client already holds are still answered. Any other 429 means too many requests. {}", retry_sentence(contract, 429)),
        _ => format!(
            "This attempt did not complete: the idempotency store is unavailable or full and nothing ran (`store-unavailable`, `store-full`), or the attempt ran out of time on the server (`attempt-timed-out`) or failed before it answered (`attempt-failed`) and its outcome is not known yet. {}",
            own_answer(contract, 503)
        ),
    }
}

/// The other statuses the contract retries (such as 504), which come from the operation
/// itself or a gateway: the server released the key, so the retry runs the operation again.
fn other_retryable_responses(contract: &Contract) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut others: Vec<u16> = contract
        .retryable
        .iter()
        .filter_map(|r| match r {
            Retryable::Status(s) if !STATUSES.contains(&s.as_u16()) => Some(s.as_u16()),
            _ => None,
        })
        .collect();
    others.sort_unstable();
    others.dedup();
    for status in others {
        let ours: Vec<ProblemType> = ProblemType::with_status(status).collect();
        let own_types = if ours.is_empty() {
            String::new()
        } else {
            let slugs: Vec<String> = ours.iter().map(|p| format!("`{}`", p.slug())).collect();
            format!(
                " The idempotency layer's own {status}s ({}) are final: stop, and report them to the API's provider.",
                words::list(&slugs, "and")
            )
        };
        let description = format!(
            "{} from the operation itself, or from a gateway in front of it. {status} is retryable under this operation's contract: the server released the key, so wait for `Retry-After` when the answer carries it (or back off), then send the same request with the same key.{own_types}",
            words::status(StatusCode(status)),
        );
        let mut response = json!({
            "description": description,
            "headers": { "Operation-Id": header_ref(OPERATION_ID_HEADER) },
        });
        if !ours.is_empty() {
            response["content"] = json!({ PROBLEM_MEDIA_TYPE: problem_media(status, &ours) });
        }
        out.push((status.to_string(), response));
    }
    out
}

/// The Response Objects added to the status lookup's `get` operation, by status: 200
/// with the operation's state ([`super::STATUS_SCHEMA`]), 400 `key-malformed`, 401
/// `client-identity-missing`, 404 `operation-not-found` and 503 `store-unavailable`.
pub fn lookup_responses(
    contract: &Contract,
    identity: Option<&ClientIdentity>,
) -> Vec<(String, Value)> {
    let ttl = words::duration(contract.ttl);
    vec![
        (
            "200".to_owned(),
            json!({
                "description": "The operation under this key, for this client: its `state` and, once it is `completed`, its stored answer in `response`. Not cached (`Cache-Control: no-store`).",
                "headers": { "Operation-Id": header_ref(OPERATION_ID_HEADER) },
                "content": { "application/json": { "schema": schema_ref(STATUS_SCHEMA) } },
            }),
        ),
        (
            "400".to_owned(),
            problem_response(
                400,
                "The key in the path is not a key this operation accepts (`key-malformed`), so no operation can have it. Ask with the key exactly as the requests sent it, percent-encoded.".to_owned(),
                false,
                &[ProblemType::KeyMalformed],
            ),
        ),
        (
            "401".to_owned(),
            problem_response(
                401,
                format!(
                    "The server could not tell which client is asking (`client-identity-missing`): {}. Operations are kept per client: ask with {} that the operation's requests carried.",
                    unidentified(identity),
                    identity_words(identity)
                ),
                false,
                &[ProblemType::ClientIdentityMissing],
            ),
        ),
        (
            "404".to_owned(),
            problem_response(
                404,
                format!(
                    "No operation has this key for this client (`operation-not-found`, `new_key_safe: true`): no attempt with it reached the server, or its lifetime ({ttl}) has passed. Within that lifetime nothing happened under this key, so sending the request again with the same key cannot run the operation twice."
                ),
                false,
                &[ProblemType::OperationNotFound],
            ),
        ),
        (
            "503".to_owned(),
            problem_response(
                503,
                "The idempotency store cannot be reached (`store-unavailable`): the state is not known now. Ask again after `Retry-After`.".to_owned(),
                true,
                &[ProblemType::StoreUnavailable],
            ),
        ),
    ]
}

/// The `application/problem+json` Media Type Object of `status` on a contracted
/// operation, with one example per problem type answered with it.
pub fn problem_media_type(status: u16) -> Value {
    let types: Vec<ProblemType> = ProblemType::with_status(status).collect();
    problem_media(status, &types)
}

/// The `application/problem+json` Media Type Object with one example per problem type of
/// `types` (a rate limiter's generic example when there are none).
fn problem_media(status: u16, types: &[ProblemType]) -> Value {
    let mut examples = Map::new();
    for p in types {
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
