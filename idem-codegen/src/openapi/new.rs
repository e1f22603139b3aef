//! A new OpenAPI document for a service that has none: one operation per contract, at the
//! method and path its target names, and a `get` operation at each declared status
//! lookup path, ready for [`super::merge`] to add the contracts to.
//!
//! ```
//! use std::path::Path;
//! use idem_codegen::{contracts, openapi::{self, Document, NewDocument}};
//!
//! let file = r#"{"version": 1, "contracts": [{"target": "POST /orders", "contract": {
//!   "operation": "create_order",
//!   "key_scope": {"per": "client", "source": {"in": "header", "name": "Idempotency-Key"}},
//!   "fingerprint": {"fields": ["customer_id", "amount_minor"]},
//!   "ttl": "24h", "deadline": {"total": "30s"}, "max_attempts": 4,
//!   "retryable": [429, 503, "timeout"],
//!   "concurrency": {"response": "conflict", "retry_after": "1s"},
//!   "status_lookup": {"handler": "order_status", "path": "/orders/operations/{key}"},
//!   "recovery": {"kind": "manual", "runbook": "https://runbooks.example.com/orders"}}}]}"#;
//! let found = contracts::parse_file(Path::new("contracts.json"), file)?;
//! let mut doc = NewDocument::new("Orders", "1.0.0").build(Path::new("openapi.json"), &found)?;
//! openapi::merge(&mut doc, &found)?;
//! assert_eq!(doc.root["openapi"], "3.1.0");
//! let op = &doc.root["paths"]["/orders"]["post"];
//! assert_eq!(op["operationId"], "create_order");
//! assert_eq!(op["x-idempotency"]["max_attempts"], 4);
//! assert!(doc.root["paths"]["/orders/operations/{key}"]["get"]["responses"]["200"].is_object());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use serde_json::{Map, Value, json};

use idem_contract::{FieldPath, Fingerprint, KeySource, Target};

use crate::contracts::Sourced;
use crate::error::Errors;

use super::{Document, Format, Version};

/// What a new document says of the API itself: its `info` and its OpenAPI version.
///
/// # Default
///
/// OpenAPI 3.1.0 (the version utoipa writes too); [`NewDocument::openapi_3_0`] for 3.0.3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewDocument {
    title: String,
    version: String,
    openapi: Version,
}

impl NewDocument {
    /// A document whose `info.title` is `title` and `info.version` is `version` (the API's
    /// version, such as `1.0.0`; not the OpenAPI version).
    pub fn new(title: impl Into<String>, version: impl Into<String>) -> NewDocument {
        NewDocument {
            title: title.into(),
            version: version.into(),
            openapi: Version::V3_1,
        }
    }

    /// Writes OpenAPI 3.0.3 instead of 3.1.0, for tools that read only 3.0.
    pub fn openapi_3_0(mut self) -> NewDocument {
        self.openapi = Version::V3_0;
        self
    }

    /// The document for `contracts`, to be written at `path` (whose extension chooses
    /// the format: YAML for `.yaml` and `.yml`, JSON indented by two spaces otherwise).
    ///
    /// Each contract gets an operation at its target's method and path, with its
    /// handler's name as `operationId`; its JSON request body lists the fields the
    /// contract reads (fingerprint fields and a key field), without types, so that the
    /// service's own schema can be filled in later. Each answer but idem's is one `2XX`
    /// response. Each declared status lookup path gets a `get` operation. Every path
    /// parameter is declared, as a string.
    ///
    /// # Errors
    ///
    /// Every contract whose target is not a method and a path (a new document has no
    /// `operationId` to find), or a webhook in an OpenAPI 3.0 document; the error says
    /// how to name the route with `--target`.
    pub fn build(&self, path: &Path, contracts: &[Sourced]) -> Result<Document, Errors> {
        let mut paths = Map::new();
        let mut webhooks = Map::new();
        let mut errors = Vec::new();
        for sourced in contracts {
            let name = &sourced.contract.operation;
            let operation = operation(sourced);
            let lookup = sourced.contract.status_lookup.path.as_deref();
            let route = match &sourced.target {
                Target::Path { path, .. } => Some(path.as_str()),
                _ => None,
            };
            for (what, route) in [("route", route), ("status lookup path", lookup)] {
                if let Some(Err(problem)) = route.map(template_parameters) {
                    errors.push(sourced.origin.error(format!(
                        "`{name}`'s {what} `{}` is not an OpenAPI path template: {problem}",
                        route.unwrap_or_default()
                    )));
                }
            }
            match &sourced.target {
                Target::Path { method, path } => {
                    insert(&mut paths, path, method, with_path_parameters(path, operation));
                }
                Target::Webhook { method, name } if self.openapi == Version::V3_1 => {
                    insert(&mut webhooks, name, method, operation);
                }
                Target::Webhook { .. } => errors.push(sourced.origin.error(format!(
                    "`{name}` targets `{}`, but webhooks need OpenAPI 3.1: leave out `--openapi 3.0`",
                    sourced.target
                ))),
                Target::OperationId(_) => errors.push(sourced.origin.error(format!(
                    "`{name}` has no method and path, and a new document has no operation to find it by: name its route with `--target {name}=\"METHOD /path\"`, such as `--target {name}=\"POST /orders\"`"
                ))),
            }
        }
        if !errors.is_empty() {
            return Err(Errors(errors));
        }
        for sourced in contracts {
            let Some(lookup) = &sourced.contract.status_lookup.path else {
                continue;
            };
            if !matches!(sourced.target, Target::Path { .. }) {
                continue;
            }
            let item = paths
                .entry(lookup.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            let item = item.as_object_mut().expect("path items are objects");
            if !item.contains_key("get") {
                let op = json!({
                    "summary": format!("The state of an operation of `{}`, by its idempotency key", sourced.contract.operation),
                    "responses": {},
                });
                item.insert("get".into(), with_path_parameters(lookup, op));
            }
        }
        let mut root = Map::new();
        let (openapi, version) = match self.openapi {
            Version::V3_0 => ("3.0.3", Version::V3_0),
            Version::V3_1 => ("3.1.0", Version::V3_1),
        };
        root.insert("openapi".into(), openapi.into());
        root.insert(
            "info".into(),
            json!({"title": self.title, "version": self.version}),
        );
        root.insert("paths".into(), Value::Object(paths));
        if !webhooks.is_empty() {
            root.insert("webhooks".into(), Value::Object(webhooks));
        }
        let yaml = matches!(
            path.extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("yaml" | "yml")
        );
        Ok(Document {
            root: Value::Object(root),
            format: if yaml {
                Format::Yaml
            } else {
                Format::Json {
                    indent: Some("  ".into()),
                }
            },
            version,
            version_text: openapi.to_owned(),
            path: path.to_owned(),
            crlf: false,
            bom: false,
        })
    }
}

/// The parameters of the path template `path`, in order, or why it is not a path
/// template of `paths` (OpenAPI 3.1 §4.8.8): it must start with `/`, hold no query or
/// fragment, and name each parameter once, between braces.
fn template_parameters(path: &str) -> Result<Vec<&str>, String> {
    if !path.starts_with('/') {
        return Err("it must start with `/`".into());
    }
    if path.contains(['?', '#']) {
        return Err("a path holds no query (`?`) or fragment (`#`)".into());
    }
    let mut names: Vec<&str> = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err("a `}` closes no `{`".into());
        }
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err("a `{` is not closed".into());
        };
        let name = &after[..close];
        if name.is_empty() || name.contains('{') {
            return Err("each parameter is a name between `{` and `}`".into());
        }
        if names.contains(&name) {
            return Err(format!("the parameter `{name}` appears twice"));
        }
        names.push(name);
        rest = &after[close + 1..];
    }
    Ok(names)
}

/// `map[key][method] = op`.
fn insert(map: &mut Map<String, Value>, key: &str, method: &str, op: Value) {
    let item = map
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    item.as_object_mut()
        .expect("path items are objects")
        .insert(method.to_owned(), op);
}

/// The Operation Object of a contract before the merge.
fn operation(sourced: &Sourced) -> Value {
    let contract = &sourced.contract;
    let mut op = Map::new();
    op.insert("operationId".into(), contract.operation.to_string().into());
    let mut fields: Vec<Vec<String>> = Vec::new();
    if let Fingerprint::Fields(paths) = &contract.fingerprint {
        fields.extend(paths.iter().map(segments));
    }
    if let KeySource::Body { field } = &contract.key_scope.source {
        fields.push(segments(field));
    }
    // `fingerprint = body` reads the body too, but says nothing of its members.
    if matches!(contract.fingerprint, Fingerprint::Body) || !fields.is_empty() {
        let mut schema = json!({"type": "object"});
        for field in &fields {
            add_field(&mut schema, field);
        }
        op.insert(
            "requestBody".into(),
            json!({"required": true, "content": {"application/json": {"schema": schema}}}),
        );
    }
    op.insert(
        "responses".into(),
        json!({"2XX": {"description": "The operation's answer. A retry with the same key and request gets it again, byte for byte, with `Idempotent-Replayed: true`."}}),
    );
    Value::Object(op)
}

fn segments(path: &FieldPath) -> Vec<String> {
    path.segments().map(str::to_owned).collect()
}

/// Adds the member at `segments` (outermost first) to an object schema, nesting objects.
fn add_field(schema: &mut Value, segments: &[String]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    let object = schema.as_object_mut().expect("object schemas");
    let properties = object
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .expect("properties are objects");
    let member = properties.entry(first.clone()).or_insert_with(|| {
        if rest.is_empty() {
            json!({"description": "Read by the idempotency contract."})
        } else {
            json!({"type": "object"})
        }
    });
    if !rest.is_empty() {
        add_field(member, rest);
    }
}

/// `op` with a required string parameter for each `{name}` of `path`.
/// `path` is a valid template: [`NewDocument::build`] checked every route first.
fn with_path_parameters(path: &str, mut op: Value) -> Value {
    let names = template_parameters(path).unwrap_or_default();
    if names.is_empty() {
        return op;
    }
    let parameters: Vec<Value> = names
        .iter()
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    op.as_object_mut()
        .expect("operations are objects")
        .shift_insert(1, "parameters".into(), Value::Array(parameters));
    op
}
