//! Merging contracts into a document: each contracted operation gets the
//! additions of [`crate::extension`], and so does its status lookup's `get` operation when
//! the document has it; everything else stays as it was, key order included. What the
//! operation already defines wins, except where the contract is the truth (the extension
//! itself, the key parameter's `required` and `schema`, and on the status lookup a
//! schema that says no more than `type: object`, which idem's answer replaces).
//!
//! Merging is all or nothing: every target is resolved and every conflict found before
//! the tree is changed, and a merge of the same contracts into the merged document
//! changes nothing. Once merged, each contract is compared with its operation
//! ([`super::consistency`]); what looks inconsistent is returned as warnings.

use serde_json::{Map, Value};

use idem_contract::Contract;
use idem_contract::extension::ClientIdentity;

use crate::contracts::Sourced;
use crate::error::{Error, Errors, Warning};
use crate::extension::{self, EXTENSION, GENERATED_MARK};

use super::target::{Operation, Route, find_operation, lookup_operation, operations};
use super::{Document, refs};

/// What a merge publishes besides the contracts themselves.
///
/// # Default
///
/// - `client_identity`: none; the published contract then says that the server knows
///   the client from its credentials, without naming a header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeOptions {
    client_identity: Option<ClientIdentity>,
}

impl MergeOptions {
    /// The defaults.
    pub const fn new() -> MergeOptions {
        MergeOptions {
            client_identity: None,
        }
    }

    /// How the server tells clients apart (`idem::identity::header("x-client-id")` on
    /// the server is `ClientIdentity::header("X-Client-Id")` here): published in
    /// `x-idempotency`, and as a required header parameter of each contracted operation
    /// and its status lookup.
    pub fn with_client_identity(mut self, identity: ClientIdentity) -> MergeOptions {
        self.client_identity = Some(identity);
        self
    }

    /// The client identity, if set.
    pub fn client_identity(&self) -> Option<&ClientIdentity> {
        self.client_identity.as_ref()
    }
}

/// What a merge did: the operations that received a contract, in the order of the
/// contracts, and what looked inconsistent between a contract and the document.
#[derive(Clone, Debug)]
pub struct Merged {
    /// `(operation name, operation)` pairs.
    pub operations: Vec<(String, Operation)>,
    /// The status lookups' `get` operations that received their answers, in document
    /// order, each once.
    pub lookups: Vec<Operation>,
    /// Contracts that do not fit their operation, at the contract's origin: a
    /// fingerprint field or key field that the JSON request body schema does not have,
    /// a status lookup path that is not a `get` operation of the document. The merge
    /// is done all the same.
    pub warnings: Vec<Warning>,
}

/// The error for a contract whose target `message` says is not in `doc`, with how to
/// name the operation it describes instead.
pub fn unmatched(sourced: &Sourced, doc: &Document, message: &str) -> Error {
    let name = &sourced.contract.operation;
    let file_target = match sourced.origin.entry {
        Some(_) => " (or the entry's `target` in the contracts file)",
        None => "",
    };
    sourced.origin.error(format!(
        "`{name}` targets `{}`, which {} does not have: {message}\n\
         help: name the operation it describes with `--target NAME=TARGET`{file_target}: `--target {name}=OPERATION_ID`, `--target {name}=\"METHOD /path\"` or, for a webhook of an OpenAPI 3.1 document, `--target {name}=\"METHOD webhook NAME\"`",
        sourced.target,
        doc.path.display()
    ))
}

/// Merges `contracts` into `doc` with the default [`MergeOptions`].
///
/// # Errors
///
/// As [`merge_with`].
pub fn merge(doc: &mut Document, contracts: &[Sourced]) -> Result<Merged, Errors> {
    merge_with(doc, contracts, &MergeOptions::new())
}

/// Merges `contracts` into `doc`, publishing what `options` says besides.
///
/// # Errors
///
/// Every problem at once, and `doc` unchanged: a target that matches no operation (named
/// at the contract's origin, with the closest names and how to name another), two contracts on one operation, a
/// component idem did not write under one of idem's component names, or a `components`,
/// `parameters` or `responses` member (of a contracted operation or of its status
/// lookup) that is not of its required type.
pub fn merge_with(
    doc: &mut Document,
    contracts: &[Sourced],
    options: &MergeOptions,
) -> Result<Merged, Errors> {
    let mut errors = Vec::new();
    let mut found: Vec<(String, Operation)> = Vec::new();
    for sourced in contracts {
        match find_operation(doc, &sourced.target) {
            Ok(op) => {
                if let Some((first, _)) = found.iter().find(|(_, o)| o.pointer == op.pointer) {
                    errors.push(sourced.origin.error(format!(
                        "`{}` and `{first}` both describe `{}`: an operation has one contract; give one of them another target",
                        sourced.contract.operation,
                        op.label()
                    )));
                }
                found.push((sourced.contract.operation.to_string(), op));
            }
            Err(message) => errors.push(unmatched(sourced, doc, &message)),
        }
    }
    for (name, op) in &found {
        if let Err(message) = check_shapes(op.get(&doc.root)) {
            errors.push(Error::in_file(
                &doc.path,
                format!("`{}` (for `{name}`): {message}", op.label()),
            ));
        }
    }
    let lookups = lookups(doc, contracts, &found);
    for (lookup, i) in &lookups {
        if let Err(message) = check_shapes(lookup.get(&doc.root)) {
            errors.push(Error::in_file(
                &doc.path,
                format!(
                    "`{}` (the status lookup of `{}`): {message}",
                    lookup.label(),
                    contracts[*i].contract.operation
                ),
            ));
        }
    }
    check_components(doc, &mut errors);
    if !errors.is_empty() {
        return Err(Errors(errors));
    }
    let identity = options.client_identity();
    for (sourced, (_, op)) in contracts.iter().zip(&found) {
        let name = op.operation_id.clone().unwrap_or_else(|| op.label());
        let declared = Declared::of(&doc.root, op);
        let target = op.get_mut(&mut doc.root).expect("resolved above");
        apply(
            target.as_object_mut().expect("checked above"),
            &sourced.contract,
            &name,
            identity,
            &declared,
        );
    }
    for (lookup, i) in &lookups {
        let declared = Declared::of(&doc.root, lookup);
        let target = lookup.get_mut(&mut doc.root).expect("found above");
        apply_lookup(
            target.as_object_mut().expect("checked above"),
            &contracts[*i].contract,
            identity,
            &declared,
        );
    }
    install_components(&mut doc.root);
    let ops: Vec<Operation> = found.iter().map(|(_, op)| op.clone()).collect();
    let warnings = super::consistency::check(doc, contracts, &ops);
    Ok(Merged {
        operations: found,
        lookups: lookups.into_iter().map(|(op, _)| op).collect(),
        warnings,
    })
}

/// The status lookups of the contracts that are `get` operations of `doc`, each with
/// the index of the first contract whose lookup it is, in document order. A lookup that
/// is itself a contracted operation, or the lookup of a webhook (served by whoever
/// receives it), is left alone.
fn lookups(
    doc: &Document,
    contracts: &[Sourced],
    found: &[(String, Operation)],
) -> Vec<(Operation, usize)> {
    let all = operations(doc);
    let mut out: Vec<(Operation, usize)> = Vec::new();
    for (i, (sourced, (_, op))) in contracts.iter().zip(found).enumerate() {
        let Some(path) = &sourced.contract.status_lookup.path else {
            continue;
        };
        if !matches!(op.route, Route::Path(_)) {
            continue;
        }
        let Some(lookup) = lookup_operation(&all, path) else {
            continue;
        };
        if found.iter().any(|(_, o)| o.pointer == lookup.pointer)
            || out.iter().any(|(o, _)| o.pointer == lookup.pointer)
        {
            continue;
        }
        out.push((lookup, i));
    }
    let order = |op: &Operation| all.iter().position(|o| o.pointer == op.pointer);
    out.sort_by_key(|(op, _)| order(op));
    out
}

/// The operation's `parameters` and `responses`, where present, have the types OpenAPI
/// requires; a document that breaks this cannot be merged into without guessing.
fn check_shapes(op: Option<&Value>) -> Result<(), String> {
    let Some(op) = op.and_then(Value::as_object) else {
        return Err("the operation is not an object".into());
    };
    if op.get("parameters").is_some_and(|p| !p.is_array()) {
        return Err("`parameters` is not a list".into());
    }
    if op.get("responses").is_some_and(|r| !r.is_object()) {
        return Err("`responses` is not an object".into());
    }
    Ok(())
}

/// idem's component names are free, or hold components idem wrote.
fn check_components(doc: &Document, errors: &mut Vec<Error>) {
    let Some(components) = doc.root.get("components") else {
        return;
    };
    if !components.is_object() {
        errors.push(Error::in_file(&doc.path, "`components` is not an object"));
        return;
    }
    for (section, name, _) in extension::components() {
        match components.get(section) {
            None => {}
            Some(s) if !s.is_object() => errors.push(Error::in_file(
                &doc.path,
                format!("`components.{section}` is not an object"),
            )),
            Some(s) => {
                if let Some(existing) = s.get(name)
                    && existing.get(GENERATED_MARK) != Some(&Value::Bool(true))
                {
                    errors.push(Error::in_file(
                        &doc.path,
                        format!("`components.{section}.{name}` exists and was not written by idem; idem publishes its own component under that name: rename yours"),
                    ));
                }
            }
        }
    }
}

fn install_components(root: &mut Value) {
    let root = root
        .as_object_mut()
        .expect("an OpenAPI document is an object");
    let components = root
        .entry("components")
        .or_insert_with(|| Value::Object(Map::new()));
    for (section, name, value) in extension::components() {
        let section = components
            .as_object_mut()
            .expect("checked")
            .entry(section)
            .or_insert_with(|| Value::Object(Map::new()));
        section
            .as_object_mut()
            .expect("checked")
            .insert(name.to_owned(), value);
    }
}

/// The header parameters an operation declares besides its own inline ones, by name.
#[derive(Default)]
struct Declared {
    /// Through a `$ref` in the operation's `parameters`.
    by_ref: Vec<String>,
    /// Anywhere: the operation's parameters and its path item's, `$ref`s followed.
    any: Vec<String>,
}

impl Declared {
    fn of(root: &Value, op: &Operation) -> Declared {
        let item = op.pointer[..op.pointer.len().saturating_sub(1)]
            .iter()
            .try_fold(root, |v, k| v.get(k));
        let mut out = Declared::default();
        for (object, own) in [(op.get(root), true), (item, false)] {
            let Some(params) = object
                .and_then(|o| o.get("parameters"))
                .and_then(Value::as_array)
            else {
                continue;
            };
            for p in params {
                let Some(resolved) = refs::resolve(root, p) else {
                    continue;
                };
                if resolved.get("in").and_then(Value::as_str) != Some("header") {
                    continue;
                }
                let Some(name) = resolved.get("name").and_then(Value::as_str) else {
                    continue;
                };
                if own && p.get("$ref").is_some() {
                    out.by_ref.push(name.to_owned());
                }
                out.any.push(name.to_owned());
            }
        }
        out
    }

    fn has(&self, name: &str) -> bool {
        self.any.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// Adds the client identity parameter unless the operation (or its path item) already
/// declares a header of that name: its owner's words and schema stay.
fn add_identity(
    op: &mut Map<String, Value>,
    identity: Option<&ClientIdentity>,
    declared: &Declared,
) {
    let Some(param) = identity.and_then(extension::identity_parameter) else {
        return;
    };
    if !declared.has(param["name"].as_str().unwrap_or_default()) {
        add_parameter(op, param, declared);
    }
}

/// The additions of one contract to its Operation Object, named `name` in the extension.
fn apply(
    op: &mut Map<String, Value>,
    contract: &Contract,
    name: &str,
    identity: Option<&ClientIdentity>,
    declared: &Declared,
) {
    op.insert(
        EXTENSION.to_owned(),
        extension::extension(contract, name, identity),
    );
    if let Some(param) = extension::key_parameter(contract) {
        add_parameter(op, param, declared);
    }
    add_identity(op, identity, declared);
    let ours = extension::responses(contract, identity);
    let responses = entry_before(op, "responses", &[], || Value::Object(Map::new()));
    let responses = responses.as_object_mut().expect("checked");
    // The operation's own answers may be replays: document the headers they carry then.
    for (status, response) in responses.iter_mut() {
        if ours.iter().any(|(s, _)| s == status) {
            continue;
        }
        if let Some(response) = response.as_object_mut().filter(|r| !r.contains_key("$ref")) {
            add_headers(response, &extension::replay_headers());
        }
    }
    for (status, response) in ours {
        match responses.get_mut(&status) {
            None => {
                let at = status_position(responses, &status);
                responses.shift_insert(at, status, response);
            }
            Some(existing) => complete_response(existing, response),
        }
    }
}

/// The additions of a contract to its status lookup's Operation Object: the client
/// identity parameter and the lookup's answers. A schema of the lookup's own that says no
/// more than `type: object` gives way to idem's, which describes what the server answers.
fn apply_lookup(
    op: &mut Map<String, Value>,
    contract: &Contract,
    identity: Option<&ClientIdentity>,
    declared: &Declared,
) {
    add_identity(op, identity, declared);
    let responses = entry_before(op, "responses", &[], || Value::Object(Map::new()));
    let responses = responses.as_object_mut().expect("checked");
    for (status, response) in extension::lookup_responses(contract, identity) {
        match responses.get_mut(&status) {
            None => {
                let at = status_position(responses, &status);
                responses.shift_insert(at, status, response);
            }
            Some(existing) => {
                replace_open_schemas(existing, &response);
                complete_response(existing, response);
            }
        }
    }
}

/// In `existing` (not a `$ref`), each media type of `ours` whose schema says no more than
/// `type: object` (or nothing at all) takes the schema of `ours`, and its examples when
/// it has none.
fn replace_open_schemas(existing: &mut Value, ours: &Value) {
    let Some(content) = existing
        .as_object_mut()
        .filter(|r| !r.contains_key("$ref"))
        .and_then(|r| r.get_mut("content"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let Some(our_content) = ours.get("content").and_then(Value::as_object) else {
        return;
    };
    for (media, mine) in content.iter_mut() {
        let Some(theirs) = our_content.get(media) else {
            continue;
        };
        let Some(mine) = mine.as_object_mut() else {
            continue;
        };
        if mine.get("schema").is_none_or(is_open_schema) {
            mine.insert("schema".into(), theirs["schema"].clone());
            if !mine.contains_key("example")
                && !mine.contains_key("examples")
                && let Some(examples) = theirs.get("examples")
            {
                mine.insert("examples".into(), examples.clone());
            }
        }
    }
}

/// A schema that says nothing about an object's members: `{}`, or `type: object` with at
/// most a title and a description.
fn is_open_schema(schema: &Value) -> bool {
    schema.as_object().is_some_and(|s| {
        s.iter().all(|(k, v)| match k.as_str() {
            "type" => v == "object",
            "title" | "description" => true,
            _ => false,
        })
    })
}

/// The member `key` of `op`, created before the first of `before` that exists (or at the
/// end) when missing.
fn entry_before<'a>(
    op: &'a mut Map<String, Value>,
    key: &str,
    before: &[&str],
    make: impl FnOnce() -> Value,
) -> &'a mut Value {
    if !op.contains_key(key) {
        let at = before
            .iter()
            .filter_map(|b| op.keys().position(|k| k == b))
            .min()
            .unwrap_or(op.len());
        op.shift_insert(at, key.to_owned(), make());
    }
    op.get_mut(key).expect("inserted")
}

/// Adds the key parameter, or completes a parameter of the same name in the header
/// (names are case-insensitive, RFC 9110 §5.1): its own description and other members
/// are kept, `required` and `schema` become the contract's. A `$ref` parameter of that
/// name is left as it is (parameters are unique by name and location).
fn add_parameter(op: &mut Map<String, Value>, param: Value, declared: &Declared) {
    let name = param["name"].as_str().unwrap_or_default().to_owned();
    let params = entry_before(op, "parameters", &["requestBody", "responses"], || {
        Value::Array(Vec::new())
    });
    let params = params.as_array_mut().expect("checked");
    let same = |p: &Value| {
        p.get("in").and_then(Value::as_str) == Some("header")
            && p.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.eq_ignore_ascii_case(&name))
    };
    if declared
        .by_ref
        .iter()
        .any(|n| n.eq_ignore_ascii_case(&name))
    {
        return;
    }
    match params.iter_mut().find(|p| same(p)) {
        Some(Value::Object(existing)) => {
            for (k, v) in param.as_object().expect("an object").clone() {
                if k == "description" && existing.contains_key("description") {
                    continue;
                }
                if k == "example" && existing.contains_key("examples") {
                    continue;
                }
                existing.insert(k, v);
            }
        }
        Some(_) => {}
        None => params.push(param),
    }
}

/// Adds the members of `ours` that `existing` lacks: its description stays, headers and
/// the problem media type are added when missing. A `$ref` response is left as it is.
fn complete_response(existing: &mut Value, ours: Value) {
    let Some(existing) = existing.as_object_mut().filter(|r| !r.contains_key("$ref")) else {
        return;
    };
    let Value::Object(ours) = ours else { return };
    for (k, v) in ours {
        match (k.as_str(), existing.get_mut(&k)) {
            (_, None) => {
                existing.insert(k, v);
            }
            ("headers", Some(_)) => {
                let headers: Vec<(&str, Value)> = v
                    .as_object()
                    .map(|h| h.iter().map(|(k, v)| (k.as_str(), v.clone())).collect())
                    .unwrap_or_default();
                add_headers(existing, &headers);
            }
            ("content", Some(Value::Object(content))) => {
                if let Value::Object(v) = v {
                    for (media, m) in v {
                        content.entry(media).or_insert(m);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Adds `headers` that a Response Object lacks (names compared case-insensitively).
fn add_headers(response: &mut Map<String, Value>, headers: &[(&str, Value)]) {
    let map = response
        .entry("headers")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(map) = map.as_object_mut() else {
        return;
    };
    for (name, value) in headers {
        if !map.keys().any(|k| k.eq_ignore_ascii_case(name)) {
            map.insert((*name).to_owned(), value.clone());
        }
    }
}

/// Where a new status goes among the existing ones: before the first larger status,
/// range (`5XX`) or `default`.
fn status_position(responses: &Map<String, Value>, status: &str) -> usize {
    responses
        .keys()
        .position(|k| {
            k == "default"
                || (k.len() == 3 && k.as_str() > status && k.as_bytes()[0].is_ascii_digit())
                || (k.len() == 3 && k.ends_with("XX") && k.as_bytes()[0] > status.as_bytes()[0])
        })
        .unwrap_or(responses.len())
}
