//! After a merge, each contract is compared with the document it now describes, for what
//! the compiler cannot see: the document may be out of date with the handler, or the
//! contract (from a contracts file) with the code. What is found is a warning, not an
//! error: the document may be right and the comparison too simple.
//!
//! - A fingerprint field, or the body member that holds the key, must be a property of
//!   the operation's JSON request body schema. `$ref`s into the document are followed,
//!   and so are `allOf` (and `anyOf`/`oneOf`, whose branches count together); nested
//!   paths `a.b` go through nested object properties. Where the schema cannot be read
//!   to the end (an external `$ref`, no `properties`, a form body), nothing is said.
//! - The status lookup's `path` must be a path of the document, with a `get` operation.
//!   Templates match whatever their parameters are named: `/orders/operations/{key}` is
//!   `/orders/operations/{id}`. Webhooks are not checked: the routes of whoever receives
//!   them are not in the sender's `paths`.

use serde_json::Value;

use idem_contract::{Fingerprint, KeySource};

use crate::contracts::Sourced;
use crate::error::Warning;

use super::Document;
use super::refs;
use super::target::{Operation, Route, did_you_mean, operations, template};

/// Recursion limit through `allOf`/`anyOf`/`oneOf` and `$ref`s: deeper is a cycle.
const MAX_DEPTH: usize = 32;

/// The warnings for `contracts`, each merged into the operation of `found` at the same
/// index.
pub(super) fn check(doc: &Document, contracts: &[Sourced], found: &[Operation]) -> Vec<Warning> {
    let mut out = Vec::new();
    let all = operations(doc);
    for (sourced, op) in contracts.iter().zip(found) {
        let name = &sourced.contract.operation;
        let mut warn = |message: String| out.push(sourced.origin.warning(message));
        let mut fields: Vec<(&str, &str)> = Vec::new();
        if let KeySource::Body { field } = &sourced.contract.key_scope.source {
            fields.push(("the key field", field.as_str()));
        }
        if let Fingerprint::Fields(list) = &sourced.contract.fingerprint {
            fields.extend(list.iter().map(|f| ("the fingerprint field", f.as_str())));
        }
        match op.get(&doc.root).and_then(|o| body_media(&doc.root, o)) {
            Some(BodyMedia::Read { kind, schema }) => {
                for (what, path) in &fields {
                    if kind == "form" && path.contains('.') {
                        warn(format!(
                            "`{name}`: {what} `{path}` is nested, but `{}` takes a form body (`application/x-www-form-urlencoded`), whose fields are flat; name the form field itself",
                            op.label(),
                        ));
                    } else if let Some(missing) =
                        schema.and_then(|s| missing_member(&doc.root, s, path))
                    {
                        warn(format!(
                            "`{name}`: {what} `{path}` is not in the {kind} request body of `{}` in {}: {missing}; the document or the contract is out of date",
                            op.label(),
                            doc.path.display(),
                        ));
                    }
                }
            }
            Some(BodyMedia::Unread(media)) if !fields.is_empty() => {
                warn(format!(
                    "`{name}`: the contract reads fields of the request body, but `{}` takes only {media}: idem reads the fields of JSON and `application/x-www-form-urlencoded` bodies; write `fingerprint = body` (the bytes as received) and take the key from a header",
                    op.label(),
                ));
            }
            _ => {}
        }
        if let Some(operation) = op.get(&doc.root) {
            for query in sourced.contract.fingerprint_query.iter() {
                if !declares_query_parameter(&doc.root, operation, query.as_str()) {
                    warn(format!(
                        "`{name}`: the significant query parameter `{query}` is not a query parameter of `{}` in {}; the document or the contract is out of date",
                        op.label(),
                        doc.path.display(),
                    ));
                }
            }
        }
        if let (Some(path), Route::Path(_)) = (&sourced.contract.status_lookup.path, &op.route)
            && let Some(problem) = lookup_problem(doc, &all, path)
        {
            warn(format!(
                "`{name}`: the status lookup `GET {path}` {problem}; the published contract sends clients there after a lost answer"
            ));
        }
    }
    out
}

/// Whether the operation declares the query parameter `name` (its own `parameters`, or
/// those of its path item, `$ref`s followed).
fn declares_query_parameter(root: &Value, operation: &Value, name: &str) -> bool {
    let declared = |list: Option<&Value>| {
        list.and_then(Value::as_array).is_some_and(|params| {
            params
                .iter()
                .filter_map(|p| refs::resolve(root, p))
                .any(|p| {
                    p.get("in").and_then(Value::as_str) == Some("query")
                        && p.get("name").and_then(Value::as_str) == Some(name)
                })
        })
    };
    declared(operation.get("parameters"))
        || root
            .get("paths")
            .and_then(Value::as_object)
            .is_some_and(|paths| {
                paths.values().any(|item| {
                    item.as_object()
                        .is_some_and(|methods| methods.values().any(|m| std::ptr::eq(m, operation)))
                        && declared(item.get("parameters"))
                })
            })
}

/// The request body of an operation, as idem reads its fields.
enum BodyMedia<'a> {
    /// A body idem reads fields of: `kind` is `JSON` or `form`, with its schema if any.
    Read {
        kind: &'static str,
        schema: Option<&'a Value>,
    },
    /// A body of other media types only, named for the warning.
    Unread(String),
}

/// The operation's request body: JSON (`application/json`, else a `+json` media type)
/// first, then a form (`application/x-www-form-urlencoded`), else the media types it
/// has. `None` without a request body.
fn body_media<'a>(root: &'a Value, op: &'a Value) -> Option<BodyMedia<'a>> {
    let body = refs::resolve(root, op.get("requestBody")?)?;
    let content = body.get("content")?.as_object()?;
    let essence = |media: &str| {
        media
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let json = content
        .iter()
        .find(|(m, _)| essence(m) == "application/json")
        .or_else(|| content.iter().find(|(m, _)| essence(m).ends_with("+json")));
    if let Some((_, media)) = json {
        return Some(BodyMedia::Read {
            kind: "JSON",
            schema: media.get("schema"),
        });
    }
    if let Some((_, media)) = content
        .iter()
        .find(|(m, _)| essence(m) == "application/x-www-form-urlencoded")
    {
        return Some(BodyMedia::Read {
            kind: "form",
            schema: media.get("schema"),
        });
    }
    if content.is_empty() {
        return None;
    }
    let names: Vec<String> = content.keys().map(|m| format!("`{m}`")).collect();
    Some(BodyMedia::Unread(names.join(", ")))
}

/// Why the dotted member `path` is not in `schema`, or `None` when it is or when the
/// schema cannot tell.
fn missing_member(root: &Value, schema: &Value, path: &str) -> Option<String> {
    let mut schema = schema;
    let mut parent: Option<&str> = None;
    for segment in path.split('.') {
        let props = properties(root, schema)?;
        match props.iter().find(|(n, _)| *n == segment) {
            Some((_, s)) => schema = s,
            None => {
                let names: Vec<&str> = props.iter().map(|(n, _)| *n).collect();
                let owner = parent.map_or_else(|| "the body".to_owned(), |p| format!("`{p}`"));
                let hint = match did_you_mean(segment, &names) {
                    h if !h.is_empty() => h,
                    _ if names.len() <= 12 => format!(
                        " (it has {})",
                        crate::words::list(
                            &names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>(),
                            "and"
                        )
                    ),
                    _ => String::new(),
                };
                return Some(format!("{owner} has no property `{segment}`{hint}"));
            }
        }
        parent = Some(segment);
    }
    None
}

/// The properties `schema` declares, its `$ref`, `allOf`, `anyOf` and `oneOf` included;
/// `None` when that cannot be told (a reference that does not resolve, a branch that
/// allows any object) or when there are none.
fn properties<'a>(root: &'a Value, schema: &'a Value) -> Option<Vec<(&'a str, &'a Value)>> {
    let mut out = Vec::new();
    collect(root, schema, 0, &mut out)?;
    (!out.is_empty()).then_some(out)
}

fn collect<'a>(
    root: &'a Value,
    schema: &'a Value,
    depth: usize,
    out: &mut Vec<(&'a str, &'a Value)>,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let object = schema.as_object()?;
    // In OpenAPI 3.1 the members beside a `$ref` apply too; in 3.0 there are none.
    if let Some(reference) = object.get("$ref") {
        collect(
            root,
            refs::target(root, reference.as_str()?)?,
            depth + 1,
            out,
        )?;
    }
    if let Some(props) = object.get("properties") {
        for (name, s) in props.as_object()? {
            if !out.iter().any(|(n, _)| n == name) {
                out.push((name, s));
            }
        }
    }
    if let Some(all) = object.get("allOf") {
        for s in all.as_array()? {
            collect(root, s, depth + 1, out)?;
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = object.get(key) {
            for s in branches.as_array()? {
                // A branch without properties allows members nobody listed.
                let mut branch = Vec::new();
                collect(root, s, depth + 1, &mut branch)?;
                if branch.is_empty() {
                    return None;
                }
                for (name, s) in branch {
                    if !out.iter().any(|(n, _)| *n == name) {
                        out.push((name, s));
                    }
                }
            }
        }
    }
    Some(())
}

/// What is wrong with the status lookup `path` in `doc`, if anything can be told.
fn lookup_problem(doc: &Document, all: &[Operation], path: &str) -> Option<String> {
    let paths = doc.root.get("paths").and_then(Value::as_object)?;
    let wanted = template(path);
    let Some((key, item)) = paths.iter().find(|(p, _)| template(p) == wanted) else {
        let keys: Vec<&str> = paths.keys().map(String::as_str).collect();
        return Some(format!(
            "is not a path of {}{}",
            doc.path.display(),
            did_you_mean(path, &keys)
        ));
    };
    let on_path: Vec<&Operation> = all
        .iter()
        .filter(|o| o.route == Route::Path(key.clone()))
        .collect();
    // A path item behind an external `$ref` has operations nobody here can see.
    if on_path.is_empty() && item.get("$ref").is_some() {
        return None;
    }
    if on_path.iter().any(|o| o.method == "get") {
        return None;
    }
    Some(format!(
        "is not an operation of {}: its path `{key}` has no `get`",
        doc.path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_ignore_parameter_names() {
        assert_eq!(
            template("/orders/operations/{key}"),
            template("/orders/operations/{id}")
        );
        assert_eq!(template("/a/{x}.json/{y}"), "/a/{}.json/{}");
        assert_ne!(
            template("/orders/{id}"),
            template("/orders/operations/{id}")
        );
    }

    #[test]
    fn properties_follow_refs_and_combinators() {
        let root = json!({
            "components": { "schemas": {
                "Base": { "type": "object", "properties": { "id": {}, "meta": { "$ref": "#/components/schemas/Meta" } } },
                "Meta": { "properties": { "tag": {} } },
                "Pet": { "allOf": [ { "$ref": "#/components/schemas/Base" }, { "properties": { "name": {} } }, { "required": ["name"] } ] },
                "Either": { "oneOf": [ { "properties": { "a": {} } }, { "properties": { "b": {} } } ] },
                "Loose": { "anyOf": [ { "properties": { "a": {} } }, { "type": "object" } ] },
                "Far": { "$ref": "other.yaml#/Pet" },
            } }
        });
        let pet = json!({ "$ref": "#/components/schemas/Pet" });
        assert_eq!(missing_member(&root, &pet, "name"), None);
        assert_eq!(missing_member(&root, &pet, "meta.tag"), None);
        assert_eq!(
            missing_member(&root, &pet, "nmae").as_deref(),
            Some("the body has no property `nmae` (did you mean `name`?)")
        );
        assert_eq!(
            missing_member(&root, &pet, "meta.colour").as_deref(),
            Some("`meta` has no property `colour` (it has `tag`)")
        );
        // Past a member without properties nothing can be told.
        assert_eq!(missing_member(&root, &pet, "id.x"), None);
        let either = json!({ "$ref": "#/components/schemas/Either" });
        assert_eq!(missing_member(&root, &either, "b"), None);
        assert!(missing_member(&root, &either, "c").is_some());
        for unknown in ["Loose", "Far"] {
            let s = json!({ "$ref": format!("#/components/schemas/{unknown}") });
            assert_eq!(missing_member(&root, &s, "anything"), None, "{unknown}");
        }
    }
}
