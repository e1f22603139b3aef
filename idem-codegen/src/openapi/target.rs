//! Finding the operation a contract describes: by `operationId`, by method and path, or
//! by method and webhook name (OpenAPI 3.1), as [`Target`] says.

use serde_json::Value;

use idem_contract::Target;
use idem_contract::file::METHODS;

use super::{Document, Version};

/// An operation of a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The keys from the document's root to the Operation Object, such as
    /// `["paths", "/v1/charges", "post"]`. A path item given as a local `$ref` is
    /// followed, so the keys may lead into `components`.
    pub pointer: Vec<String>,
    /// The HTTP method, lowercase.
    pub method: String,
    /// The path template (`/pets/{id}`) or the webhook's name.
    pub route: Route,
    /// The operation's `operationId`, if it has one.
    pub operation_id: Option<String>,
}

/// Where an operation lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// A path of `paths`.
    Path(String),
    /// A webhook of `webhooks` (OpenAPI 3.1).
    Webhook(String),
}

impl Operation {
    /// `POST /v1/charges` or `POST webhook newPet`: the target that names it by route.
    pub fn label(&self) -> String {
        let method = self.method.to_ascii_uppercase();
        match &self.route {
            Route::Path(path) => format!("{method} {path}"),
            Route::Webhook(name) => format!("{method} webhook {name}"),
        }
    }

    /// The Operation Object in `root`.
    pub fn get<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        self.pointer.iter().try_fold(root, |v, k| v.get(k))
    }

    /// The Operation Object in `root`, to change.
    pub fn get_mut<'a>(&self, root: &'a mut Value) -> Option<&'a mut Value> {
        self.pointer.iter().try_fold(root, |v, k| v.get_mut(k))
    }
}

/// Every operation of `doc`, in document order: `paths`, then `webhooks`.
pub fn operations(doc: &Document) -> Vec<Operation> {
    let mut out = Vec::new();
    for (section, webhook) in [("paths", false), ("webhooks", true)] {
        let Some(items) = doc.root.get(section).and_then(Value::as_object) else {
            continue;
        };
        for (name, item) in items {
            let Some((pointer, item)) =
                resolve(&doc.root, vec![section.to_owned(), name.clone()], item)
            else {
                continue;
            };
            for method in METHODS {
                let Some(op) = item.get(method).filter(|op| op.is_object()) else {
                    continue;
                };
                let mut pointer = pointer.clone();
                pointer.push(method.to_owned());
                out.push(Operation {
                    pointer,
                    method: method.to_owned(),
                    route: if webhook {
                        Route::Webhook(name.clone())
                    } else {
                        Route::Path(name.clone())
                    },
                    operation_id: op
                        .get("operationId")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                });
            }
        }
    }
    out
}

/// A path item, following local `$ref`s (`#/components/pathItems/x`) a few hops deep.
fn resolve<'a>(
    root: &'a Value,
    mut pointer: Vec<String>,
    mut item: &'a Value,
) -> Option<(Vec<String>, &'a Value)> {
    for _ in 0..8 {
        let Some(reference) = item.get("$ref").and_then(Value::as_str) else {
            return item.is_object().then_some((pointer, item));
        };
        let local = reference.strip_prefix("#/")?;
        pointer = local
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect();
        item = pointer.iter().try_fold(root, |v, k| v.get(k))?;
    }
    None
}

/// The operation `target` names in `doc`.
///
/// # Errors
///
/// A message for the user when no operation matches (with the closest names), when an
/// `operationId` is used by several operations, or when a webhook is named in an
/// OpenAPI 3.0 document.
pub fn find_operation(doc: &Document, target: &Target) -> Result<Operation, String> {
    let all = operations(doc);
    match target {
        Target::OperationId(id) => {
            let found: Vec<&Operation> = all
                .iter()
                .filter(|op| op.operation_id.as_deref() == Some(id))
                .collect();
            match found.as_slice() {
                [op] => Ok((*op).clone()),
                [] => {
                    let ids: Vec<&str> = all
                        .iter()
                        .filter_map(|o| o.operation_id.as_deref())
                        .collect();
                    Err(format!(
                        "no operation has the operationId `{id}`{}",
                        did_you_mean(id, &ids)
                    ))
                }
                many => Err(format!(
                    "the operationId `{id}` is used by {} operations ({}), so it names none; target one as `METHOD /path`",
                    many.len(),
                    many.iter()
                        .map(|o| o.label())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
        Target::Path { method, path } => {
            let on_path: Vec<&Operation> = all
                .iter()
                .filter(|o| o.route == Route::Path(path.clone()))
                .collect();
            if let Some(op) = on_path.iter().find(|o| &o.method == method) {
                return Ok((*op).clone());
            }
            if on_path.is_empty() && !has_key(doc, "paths", path) {
                let paths: Vec<&str> = doc
                    .root
                    .get("paths")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "the document has no path `{path}`{}",
                    did_you_mean(path, &paths)
                ));
            }
            Err(format!(
                "the path `{path}` has no `{method}` operation; it has {}",
                methods(&on_path)
            ))
        }
        Target::Webhook { method, name } => {
            if doc.version == Version::V3_0 {
                return Err(format!(
                    "webhooks are an OpenAPI 3.1 feature and this document is OpenAPI {}; target an operation of `paths`",
                    doc.version_text
                ));
            }
            let on_hook: Vec<&Operation> = all
                .iter()
                .filter(|o| o.route == Route::Webhook(name.clone()))
                .collect();
            if let Some(op) = on_hook.iter().find(|o| &o.method == method) {
                return Ok((*op).clone());
            }
            if on_hook.is_empty() && !has_key(doc, "webhooks", name) {
                let names: Vec<&str> = doc
                    .root
                    .get("webhooks")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "the document has no webhook `{name}`{}",
                    did_you_mean(name, &names)
                ));
            }
            Err(format!(
                "the webhook `{name}` has no `{method}` operation; it has {}",
                methods(&on_hook)
            ))
        }
    }
}

fn has_key(doc: &Document, section: &str, key: &str) -> bool {
    doc.root.get(section).and_then(|s| s.get(key)).is_some()
}

fn methods(ops: &[&Operation]) -> String {
    if ops.is_empty() {
        return "none (the path item is empty or an external reference)".into();
    }
    ops.iter()
        .map(|o| format!("`{}`", o.method))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `/a/{x}/b` with every parameter unnamed: `/a/{}/b`.
pub(super) fn template(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' if in_param => in_param = false,
            _ if in_param => {}
            c => out.push(c),
        }
    }
    out
}

/// The `get` operation of `all` that serves the status lookup `path`, whatever its
/// template parameters are named (`/orders/operations/{key}` is
/// `/orders/operations/{id}`).
pub(super) fn lookup_operation(all: &[Operation], path: &str) -> Option<Operation> {
    let wanted = template(path);
    all.iter()
        .find(|o| o.method == "get" && matches!(&o.route, Route::Path(p) if template(p) == wanted))
        .cloned()
}

/// ` (did you mean `x`?)` for the closest candidate, or nothing.
pub(super) fn did_you_mean(word: &str, candidates: &[&str]) -> String {
    let lower = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| {
            let d = if c.to_ascii_lowercase() == lower {
                0
            } else {
                strsim::damerau_levenshtein(word, c)
            };
            (d, *c)
        })
        .filter(|(d, c)| *d <= 3.max(c.len() / 5))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}
