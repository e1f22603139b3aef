//! What a contract adds to an OpenAPI document: on the contracted operation, the
//! `x-idempotency` extension, the key header parameter (and the client identity header,
//! when the publisher names it) and the problem answers 400, 401, 408, 409, 413, 422, 429 and
//! 503 (and 202 for `concurrency = accepted`, and each other status of `retryable`); on
//! the status lookup's operation, when the document has it, its answers 200, 400, 401,
//! 404 and 503; and the shared components they refer to.
//!
//! Everything here is valid in OpenAPI 3.0 and 3.1 alike: Schema Objects use only the
//! keywords both versions share (no `const`, `$defs` or type arrays). The JSON Schema of
//! the extension itself is published separately ([`idem_contract::schema`]).

mod answers;
mod components;

use serde_json::{Value, json};

use idem_contract::extension::{ClientIdentity, Extension, MAX_IDENTITY_LEN, is_header_name};
use idem_contract::key::MAX_KEY_LEN;
use idem_contract::{Contract, Fingerprint, KeyFormat};

use crate::words;

pub use answers::{lookup_responses, problem_media_type, responses};
pub use components::components;

/// The extension's name on an Operation Object.
pub const EXTENSION: &str = "x-idempotency";

/// Marks the components idem writes, so that a later merge may replace them and never
/// replaces a component of the same name that someone else wrote.
pub const GENERATED_MARK: &str = "x-idem-generated";

/// The problem schema, `#/components/schemas/IdemProblem`.
pub const PROBLEM_SCHEMA: &str = "IdemProblem";
/// The status lookup's answer, `#/components/schemas/IdemOperationStatus`.
pub const STATUS_SCHEMA: &str = "IdemOperationStatus";
/// The `Retry-After` header, `#/components/headers/IdemRetryAfter`.
pub const RETRY_AFTER_HEADER: &str = "IdemRetryAfter";
/// The `Operation-Id` header, `#/components/headers/IdemOperationId`.
pub const OPERATION_ID_HEADER: &str = "IdemOperationId";
/// The `Idempotent-Replayed` header, `#/components/headers/IdemReplayed`.
pub const REPLAYED_HEADER: &str = "IdemReplayed";

/// The media type of problem answers (RFC 9457 §3).
pub const PROBLEM_MEDIA_TYPE: &str = "application/problem+json";

/// The statuses every contract adds to its operation's responses, in order. A contract
/// also adds 202 for `concurrency = accepted`, and each status of its `retryable` list
/// that is not among these (such as 504).
pub const STATUSES: [u16; 8] = [400, 401, 408, 409, 413, 422, 429, 503];

/// The statuses added to the status lookup's operation, in order.
pub const LOOKUP_STATUSES: [u16; 5] = [200, 400, 401, 404, 503];

/// The example key and operation id used in examples.
pub const EXAMPLE_KEY: &str = "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60";
pub(crate) const EXAMPLE_OPERATION_ID: &str = "0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f";

/// The value of `x-idempotency` on the operation named `operation` (its `operationId`,
/// or else its method and path): the nine properties as [`Extension`] publishes them,
/// without the names of the server's functions, and the client identity when known.
pub fn extension(
    contract: &Contract,
    operation: &str,
    client_identity: Option<&ClientIdentity>,
) -> Value {
    serde_json::to_value(Extension::new(
        contract,
        operation,
        client_identity.cloned(),
    ))
    .expect("an extension always serialises")
}

/// `name` as the client identity header, for `--identity-header`.
///
/// # Errors
///
/// `name` is not an HTTP header name (RFC 9110 §5.1).
pub fn parse_identity_header(name: &str) -> Result<ClientIdentity, String> {
    let name = name.trim();
    if is_header_name(name) {
        Ok(ClientIdentity::header(name.to_owned()))
    } else {
        Err(format!(
            "`{name}` is not a header name: write a name such as `X-Client-Id` (letters, digits and `-`)"
        ))
    }
}

/// The schema of a key as a client may write it: bare (1 to 255 visible ASCII
/// characters, the first not `"`) or quoted as an RFC 8941 sf-string (`"abc"`, with
/// `\"` and `\\` as escapes), which names the same key; for `format = uuid`, a hyphenated
/// UUID, bare or quoted.
fn key_schema(format: KeyFormat) -> Value {
    match format {
        KeyFormat::Any => json!({
            "type": "string",
            "minLength": 1,
            "maxLength": 2 + 2 * MAX_KEY_LEN,
            "pattern": format!("^(?:[!#-~][!-~]{{0,{}}}|\"(?:[!#-\\[\\]-~]|\\\\[\"\\\\]){{1,{MAX_KEY_LEN}}}\")$", MAX_KEY_LEN - 1),
        }),
        KeyFormat::Uuid => {
            let uuid =
                "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}";
            json!({
                "type": "string",
                "minLength": 36,
                "maxLength": 38,
                "pattern": format!("^(?:{uuid}|\"{uuid}\")$"),
            })
        }
    }
}

/// The key header parameter (`in: header`, required), or `None` when the key is a body
/// field.
///
/// Its schema is what the server accepts: 1 to 255 visible ASCII characters, or a
/// hyphenated UUID for `format = uuid`, each bare or as an RFC 8941 string.
pub fn key_parameter(contract: &Contract) -> Option<Value> {
    let name = contract.key_scope.header()?;
    Some(json!({
        "name": name,
        "in": "header",
        "required": true,
        "description": key_description(contract),
        "schema": key_schema(contract.key_scope.format),
        "example": EXAMPLE_KEY,
    }))
}

/// How a client writes the key, in words: bare or quoted, both naming the same key.
pub(crate) fn key_shape(format: KeyFormat) -> &'static str {
    match format {
        KeyFormat::Any => {
            "1 to 255 visible ASCII characters (a UUID is a good choice), sent bare (`abc`) or as an RFC 8941 string (`\"abc\"`, with `\\\"` and `\\\\` as its escapes): both name the same key, and a quoted value that is not one valid RFC 8941 string is refused with 400 (`key-malformed`)"
        }
        KeyFormat::Uuid => {
            "a UUID in its hyphenated form, such as `0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60`, sent bare or as an RFC 8941 string (`\"0191f6a4-…\"`): both name the same key, and a quoted value that is not one valid RFC 8941 string is refused with 400 (`key-malformed`)"
        }
    }
}

fn key_description(contract: &Contract) -> String {
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
        "Idempotency key: {shape}. Create one key per business intent before the first attempt, \
         and send it unchanged on every retry of that intent: the server then runs the operation \
         at most once and answers a retry with the stored result (`Idempotent-Replayed: true`). \
         Keys are kept per client and per operation for {ttl}. The same key with {significant} \
         is refused with 422.",
        shape = key_shape(contract.key_scope.format),
        ttl = words::duration(contract.ttl),
    )
}

/// The client identity header parameter (`in: header`, required), or `None` when the
/// identity is not a header.
///
/// Its schema is what `idem::identity::header` accepts: 1 to 255 visible ASCII
/// characters.
pub fn identity_parameter(identity: &ClientIdentity) -> Option<Value> {
    let name = identity.header_name()?;
    Some(json!({
        "name": name,
        "in": "header",
        "required": true,
        "description": "Who the client is. Keys, and what the status lookup answers, are kept per client: send the same value on every attempt of an operation and when asking the status lookup about it. Without a valid value the answer is 401 (`client-identity-missing`) and nothing runs.",
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDENTITY_LEN,
            "pattern": "^[!-~]+$",
        },
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    // What the patterns accept is checked with a JSON Schema validator in
    // `tests/merge.rs`; here, their text.
    #[test]
    fn key_schemas_accept_both_forms() {
        let any = key_schema(KeyFormat::Any);
        assert_eq!(any["maxLength"], 512);
        assert_eq!(
            any["pattern"],
            "^(?:[!#-~][!-~]{0,254}|\"(?:[!#-\\[\\]-~]|\\\\[\"\\\\]){1,255}\")$"
        );
        let uuid = key_schema(KeyFormat::Uuid);
        assert_eq!(uuid["maxLength"], 38);
    }

    #[test]
    fn identity_headers_are_header_names() {
        assert!(parse_identity_header("X-Client-Id").is_ok());
        assert!(parse_identity_header(" x-client-id ").is_ok());
        for bad in ["", "X Client", "X-Client-Id:", "Ünicode"] {
            assert!(parse_identity_header(bad).is_err(), "{bad:?}");
        }
    }
}
