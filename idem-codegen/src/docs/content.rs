//! What the consumer docs say about one operation, as data for the templates: the nine
//! properties in plain words, how to retry, what each answer means, and a worked request
//! sequence.

use serde::Serialize;

use idem_contract::extension::ClientIdentity;
use idem_contract::{Contract, KeySource, Target};

use serde_json::Value;

use super::diagram::Diagram;
use super::rich::Rich;
use crate::extension::EXTENSION;
use crate::openapi::{Document, Operation, Route, refs};
use crate::words;

/// What the docs know about an operation besides its contract, from the OpenAPI document
/// or the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperationInfo {
    /// The method, uppercase, such as `POST`.
    pub method: Option<String>,
    /// The path, such as `/v1/charges`, or a webhook's name.
    pub path: Option<String>,
    /// The operation's `summary`.
    pub summary: Option<String>,
    /// Its first 2xx answer with the reason phrase, such as `201 Created`.
    pub success: Option<String>,
    /// The section's heading when it is not `METHOD path`, such as
    /// `POST webhook newPet`.
    pub label: Option<String>,
    /// The operation's `operationId`, the name consumers know it by.
    pub operation_id: Option<String>,
    /// The other header parameters the operation requires (its own and its path's, with
    /// `$ref`s followed), each with an example value, in the document's order: what a
    /// client sends besides the idempotency key. `Accept`, `Content-Type` and
    /// `Authorization` are left out, as OpenAPI ignores them as parameters.
    pub headers: Vec<HeaderExample>,
    /// How the server tells clients apart, when the publisher says: from the operation's
    /// `x-idempotency` in a merged document, or `idem docs --identity-header`.
    pub identity: Option<ClientIdentity>,
}

/// A required header of an operation and a value to show in the worked example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderExample {
    /// The header's name, as the document writes it.
    pub name: String,
    /// The parameter's `example`, the first of its `examples`, its schema's `example` or
    /// first `examples` item; else a placeholder such as `<your X-Client-Id>`.
    pub value: String,
    /// Whether `value` is a placeholder.
    pub placeholder: bool,
}

impl OperationInfo {
    /// Method, route, `operationId`, summary, first success status and required headers
    /// of `op` in `doc`, and the client identity its `x-idempotency` publishes, if the
    /// document is merged.
    pub fn from_document(doc: &Document, op: &Operation) -> OperationInfo {
        let object = op.get(&doc.root);
        let success = object
            .and_then(|o| o.get("responses"))
            .and_then(|r| r.as_object())
            .and_then(|r| {
                r.keys()
                    .filter_map(|k| k.parse::<u16>().ok())
                    .find(|s| (200..300).contains(s))
            })
            .map(|s| crate::words::status(idem_contract::StatusCode(s)));
        OperationInfo {
            method: Some(op.method.to_ascii_uppercase()),
            path: Some(match &op.route {
                Route::Path(p) => p.clone(),
                Route::Webhook(name) => format!("<your URL for the {name} webhook>"),
            }),
            summary: object
                .and_then(|o| o.get("summary"))
                .and_then(|s| s.as_str())
                .map(str::to_owned),
            success,
            label: matches!(op.route, Route::Webhook(_)).then(|| op.label()),
            operation_id: op.operation_id.clone(),
            headers: required_headers(doc, op),
            identity: object
                .and_then(|o| o.get(EXTENSION))
                .and_then(|e| e.get("client_identity"))
                .and_then(|i| serde_json::from_value(i.clone()).ok()),
        }
    }

    /// The same, with `identity` as the client identity.
    pub fn with_identity(mut self, identity: ClientIdentity) -> OperationInfo {
        self.identity = Some(identity);
        self
    }

    /// What a target alone says: the method and path of `POST /orders`.
    pub fn from_target(target: &Target) -> OperationInfo {
        match target {
            Target::OperationId(id) => OperationInfo {
                operation_id: Some(id.clone()),
                ..OperationInfo::default()
            },
            Target::Path { method, path } => OperationInfo {
                method: Some(method.to_ascii_uppercase()),
                path: Some(path.clone()),
                ..OperationInfo::default()
            },
            Target::Webhook { method, name } => OperationInfo {
                method: Some(method.to_ascii_uppercase()),
                path: Some(format!("<your URL for the {name} webhook>")),
                label: Some(target.to_string()),
                ..OperationInfo::default()
            },
        }
    }
}

/// The required header parameters of `op`: the operation's own, then its path item's
/// that the operation does not override (same name and location).
fn required_headers(doc: &Document, op: &Operation) -> Vec<HeaderExample> {
    let root = &doc.root;
    let item_pointer = &op.pointer[..op.pointer.len().saturating_sub(1)];
    let item = item_pointer.iter().try_fold(root, |v, k| v.get(k));
    let lists = [op.get(root), item].map(|o| {
        o.and_then(|o| o.get("parameters"))
            .and_then(|p| p.as_array())
            .map(|p| {
                p.iter()
                    .filter_map(|p| refs::resolve(root, p))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    });
    let is_header = |p: &Value| p.get("in").and_then(Value::as_str) == Some("header");
    let name = |p: &Value| p.get("name").and_then(Value::as_str).map(str::to_owned);
    let mut out: Vec<HeaderExample> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for p in lists.iter().flatten().copied().filter(|p| is_header(p)) {
        let Some(n) = name(p) else { continue };
        let lower = n.to_ascii_lowercase();
        if seen.contains(&lower) {
            continue;
        }
        seen.push(lower.clone());
        if p.get("required") != Some(&Value::Bool(true))
            || matches!(lower.as_str(), "accept" | "content-type" | "authorization")
        {
            continue;
        }
        out.push(match example_value(root, p) {
            Some(value) => HeaderExample {
                name: n,
                value,
                placeholder: false,
            },
            None => HeaderExample {
                value: format!("<your {n}>"),
                name: n,
                placeholder: true,
            },
        });
    }
    out
}

/// An example value of the parameter `p`, on one line.
fn example_value(root: &Value, p: &Value) -> Option<String> {
    let first_example = |examples: &Value| -> Option<Value> {
        examples
            .as_object()?
            .values()
            .find_map(|e| refs::resolve(root, e)?.get("value").cloned())
    };
    let schema = p.get("schema").and_then(|s| refs::resolve(root, s));
    let value = p
        .get("example")
        .cloned()
        .or_else(|| p.get("examples").and_then(first_example))
        .or_else(|| schema.and_then(|s| s.get("example")).cloned())
        .or_else(|| {
            schema
                .and_then(|s| s.get("examples"))
                .and_then(Value::as_array)
                .and_then(|e| e.first())
                .cloned()
        })?;
    let text = match value {
        Value::String(s) => s,
        Value::Null => return None,
        other => other.to_string(),
    };
    // A header value is one line of visible characters.
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// One operation's section.
#[derive(Clone, Debug, Serialize)]
pub struct Section {
    /// The operation's name: its `operationId` when known, else its method and path.
    pub name: String,
    /// Whether `name` is an `operationId`.
    pub named_by_id: bool,
    /// An HTML id and Markdown anchor, unique on the page.
    pub anchor: String,
    /// `POST /orders`, or the name when the route is unknown.
    pub heading: String,
    /// The OpenAPI summary, if known.
    pub summary: Option<String>,
    /// The nine properties.
    pub properties: Vec<PropertyText>,
    /// How to retry, in order.
    pub retry: Vec<Rich>,
    /// When a new key is safe: the one rule, stated once.
    pub new_key: Rich,
    /// What each answer means.
    pub answers: Vec<Answer>,
    /// The status lookup's route (`GET /orders/operations/{key}`), if published.
    pub lookup: Option<String>,
    /// What each answer of the status lookup means.
    pub lookup_answers: Vec<Answer>,
    /// The worked request sequence.
    pub example: Vec<Step>,
    /// The lost answer as a sequence diagram, for the HTML page.
    pub diagram: Diagram,
}

/// One property in plain words.
#[derive(Clone, Debug, Serialize)]
pub struct PropertyText {
    /// Its name for people, such as `Key lifetime`.
    pub title: &'static str,
    /// Its member of `x-idempotency`, such as `ttl`.
    pub key: &'static str,
    /// What it means for a client.
    pub text: Rich,
}

/// One row of the answers table.
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    /// The status or situation, such as `409 Conflict`.
    pub answer: Rich,
    /// The problem `type`: one of idem's URIs as code, or words such as "any other"
    /// for answers of the service itself; `None` when the answer has none.
    pub problem_type: Option<Rich>,
    /// What it means.
    pub meaning: Rich,
    /// What the client does.
    pub action: Rich,
}

/// One step of the worked example.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// What happens.
    pub text: Rich,
    /// The HTTP exchange, if any.
    pub http: Option<String>,
}

/// The docs section of `contract`, on the operation `info` describes.
///
/// The section names the operation as the API does (its `operationId`, or its method
/// and path), never by the server's function names; only when nothing else is known
/// does it fall back on the contract's operation name.
pub fn section(contract: &Contract, info: &OperationInfo) -> Section {
    let heading = match (&info.label, &info.method, &info.path) {
        (Some(label), _, _) => Some(label.clone()),
        (None, Some(m), Some(p)) => Some(format!("{m} {p}")),
        _ => None,
    };
    let name = info
        .operation_id
        .clone()
        .or_else(|| heading.clone())
        .unwrap_or_else(|| contract.operation.to_string());
    let heading = heading.unwrap_or_else(|| name.clone());
    Section {
        anchor: anchor(&name),
        named_by_id: info.operation_id.is_some(),
        summary: info.summary.clone(),
        properties: super::properties::properties(contract, info),
        retry: super::properties::retry(contract),
        new_key: super::properties::new_key(contract),
        answers: super::answers::answers(contract, info),
        lookup: lookup_path(contract).map(|p| format!("GET {p}")),
        lookup_answers: super::answers::lookup_answers(contract, info),
        example: super::answers::example(contract, info, &name),
        diagram: super::diagram::lost_answer(contract, info, &name),
        heading,
        name,
    }
}

/// `op-` and the name in lowercase letters, digits and single `-`s.
fn anchor(name: &str) -> String {
    let mut out = String::from("op");
    let mut gap = true;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            if gap {
                out.push('-');
                gap = false;
            }
            out.push(c.to_ascii_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

pub(super) fn header_or_field(contract: &Contract) -> (bool, String) {
    match &contract.key_scope.source {
        KeySource::Header { name } => (true, name.to_string()),
        KeySource::Body { field } => (false, field.to_string()),
    }
}

pub(super) fn key_shape(contract: &Contract) -> &'static str {
    crate::extension::key_shape(contract.key_scope.format)
}

/// How the client identity is sent, as rich text: `the `X-Client-Id` header`, or
/// `your credentials` when the publisher did not name a header.
pub(super) fn identity_words(info: &OperationInfo) -> Rich {
    match identity_header(info) {
        Some(name) => Rich::new("the ").code(name).text(" header"),
        None => Rich::new("your credentials"),
    }
}

/// The client identity header, if the publisher named one.
pub(super) fn identity_header(info: &OperationInfo) -> Option<&str> {
    info.identity.as_ref().and_then(ClientIdentity::header_name)
}

pub(super) fn lookup_path(contract: &Contract) -> Option<String> {
    contract.status_lookup.path.as_deref().map(str::to_owned)
}

pub(super) fn retryable_words(contract: &Contract) -> Vec<String> {
    contract
        .retryable
        .iter()
        .map(|r| words::retryable(*r))
        .collect()
}
