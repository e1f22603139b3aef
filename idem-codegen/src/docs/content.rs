//! What the consumer docs say about one operation, as data for the templates: the nine
//! properties in plain words, how to retry, what each answer means, and a worked request
//! sequence.

use serde::Serialize;

use idem_contract::{Contract, KeyFormat, KeySource};

use super::rich::Rich;
use crate::openapi::{Document, Operation, Route};
use crate::words;
use idem_contract::Target;

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
}

impl OperationInfo {
    /// Method, route, summary and first success status of `op` in `doc`.
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
        }
    }

    /// What a target alone says: the method and path of `POST /orders`.
    pub fn from_target(target: &Target) -> OperationInfo {
        match target {
            Target::OperationId(_) => OperationInfo::default(),
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

/// One operation's section.
#[derive(Clone, Debug, Serialize)]
pub struct Section {
    /// The operation's name.
    pub name: String,
    /// An HTML id and Markdown anchor.
    pub anchor: String,
    /// `POST /orders`, or the name when the route is unknown.
    pub heading: String,
    /// The OpenAPI summary, if known.
    pub summary: Option<String>,
    /// The nine properties.
    pub properties: Vec<PropertyText>,
    /// How to retry, in order.
    pub retry: Vec<Rich>,
    /// What each answer means.
    pub answers: Vec<Answer>,
    /// The worked request sequence.
    pub example: Vec<Step>,
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
    /// The problem `type` URI, if the answer has one.
    pub problem_type: Option<String>,
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

/// The docs section of `contract`.
pub fn section(contract: &Contract, info: &OperationInfo) -> Section {
    let name = contract.operation.to_string();
    let heading = match (&info.label, &info.method, &info.path) {
        (Some(label), _, _) => label.clone(),
        (None, Some(m), Some(p)) => format!("{m} {p}"),
        _ => name.clone(),
    };
    Section {
        anchor: anchor(&name),
        heading,
        summary: info.summary.clone(),
        properties: super::properties::properties(contract),
        retry: super::properties::retry(contract),
        answers: super::answers::answers(contract),
        example: super::answers::example(contract, info),
        name,
    }
}

/// Lowercase letters, digits and `-`.
fn anchor(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    out.insert_str(0, "op-");
    out
}

pub(super) fn header_or_field(contract: &Contract) -> (bool, String) {
    match &contract.key_scope.source {
        KeySource::Header { name } => (true, name.to_string()),
        KeySource::Body { field } => (false, field.to_string()),
    }
}

pub(super) fn key_shape(contract: &Contract) -> &'static str {
    match contract.key_scope.format {
        KeyFormat::Any => "1 to 255 visible ASCII characters (a UUID is a good choice)",
        KeyFormat::Uuid => {
            "a UUID in its hyphenated form, such as `0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60`"
        }
    }
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
