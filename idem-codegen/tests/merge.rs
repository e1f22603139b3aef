//! What merging keeps and what it adds, on small documents written for each rule, and
//! the parity of `idem check` with the macro's parser.

mod common;

use std::path::Path;

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{self, Document};
use serde_json::json;

use common::{fixture, idem, stderr};

fn charge_contract(target: &str) -> Vec<Sourced> {
    let text = std::fs::read_to_string(fixture("stripe.contracts.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["contracts"] = json!([v["contracts"][0].clone()]);
    v["contracts"][0]["target"] = target.into();
    contracts::parse_file(Path::new("c.json"), &v.to_string()).unwrap()
}

const SPEC: &str = r##"{
    "openapi": "3.0.3",
    "info": { "title": "Charges", "version": "1" },
    "paths": {
        "/charges": {
            "post": {
                "operationId": "PostCharges",
                "parameters": [
                    { "name": "idempotency-key", "in": "header", "description": "Our own words.", "required": false, "schema": { "type": "string" } }
                ],
                "responses": {
                    "201": { "description": "Created" },
                    "409": { "description": "Our own conflict.", "content": { "application/json": { "schema": { "type": "object" } } } },
                    "5XX": { "$ref": "#/components/responses/ServerError" }
                }
            }
        }
    },
    "components": { "responses": { "ServerError": { "description": "Server error" } } }
}"##;

#[test]
fn the_operations_own_parts_win_and_gaps_are_filled() {
    let mut doc = Document::parse(Path::new("spec.json"), SPEC).unwrap();
    openapi::merge(&mut doc, &charge_contract("PostCharges")).unwrap();
    let op = &doc.root["paths"]["/charges"]["post"];
    // The existing key parameter (names are case-insensitive) is completed, not doubled.
    let params = op["parameters"].as_array().unwrap();
    assert_eq!(params.len(), 1);
    assert_eq!(params[0]["description"], "Our own words.");
    assert_eq!(params[0]["required"], true);
    assert_eq!(params[0]["schema"]["maxLength"], 255);
    // An existing 409 keeps its description and content, and gains what it lacked.
    let conflict = &op["responses"]["409"];
    assert_eq!(conflict["description"], "Our own conflict.");
    assert!(conflict["content"]["application/json"].is_object());
    assert!(conflict["content"]["application/problem+json"].is_object());
    assert!(conflict["headers"]["Retry-After"].is_object());
    // A referenced response is left alone; new statuses go in order.
    assert_eq!(
        op["responses"]["5XX"],
        json!({ "$ref": "#/components/responses/ServerError" })
    );
    let statuses: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
    assert_eq!(statuses, ["201", "400", "409", "422", "429", "503", "5XX"]);
    // The document keeps its format: JSON, four spaces, its key order.
    let text = doc.render();
    assert!(
        text.starts_with("{\n    \"openapi\": \"3.0.3\",\n    \"info\""),
        "{text}"
    );
}

#[test]
fn merging_twice_changes_nothing() {
    let mut doc = Document::parse(Path::new("spec.json"), SPEC).unwrap();
    openapi::merge(&mut doc, &charge_contract("POST /charges")).unwrap();
    let once = doc.render();
    openapi::merge(&mut doc, &charge_contract("POST /charges")).unwrap();
    assert_eq!(doc.render(), once);
}

#[test]
fn a_foreign_component_under_an_idem_name_is_refused() {
    let mut spec: serde_json::Value = serde_json::from_str(SPEC).unwrap();
    spec["components"]["schemas"] = json!({ "IdemProblem": { "type": "string" } });
    let mut doc = Document::parse(Path::new("spec.json"), &spec.to_string()).unwrap();
    let before = doc.root.clone();
    let err = openapi::merge(&mut doc, &charge_contract("PostCharges")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.json: error: `components.schemas.IdemProblem` exists and was not written by idem; idem publishes its own component under that name: rename yours"
    );
    assert_eq!(doc.root, before, "a refused merge changes nothing");
}

#[test]
fn an_ambiguous_operation_id_is_refused() {
    let mut spec: serde_json::Value = serde_json::from_str(SPEC).unwrap();
    spec["paths"]["/other"] = json!({ "put": { "operationId": "PostCharges", "responses": { "200": { "description": "ok" } } } });
    let mut doc = Document::parse(Path::new("spec.json"), &spec.to_string()).unwrap();
    let err = openapi::merge(&mut doc, &charge_contract("PostCharges"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "the operationId `PostCharges` is used by 2 operations (POST /charges, PUT /other)"
        ),
        "{err}"
    );
}

#[test]
fn a_document_without_components_gets_them_at_the_end() {
    let spec = "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /charges:\n    post:\n      responses:\n        201: {description: Created}\n";
    let mut doc = Document::parse(Path::new("spec.yaml"), spec).unwrap();
    openapi::merge(&mut doc, &charge_contract("POST /charges")).unwrap();
    let keys: Vec<&String> = doc.root.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["openapi", "info", "paths", "components"]);
    // The unquoted YAML key `201` is the status "201", kept first.
    let statuses: Vec<&String> = doc.root["paths"]["/charges"]["post"]["responses"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(statuses[0], "201");
}

/// `idem check` prints exactly what the macro's parser says, at the same places: the
/// errors are computed here with `idem_contract::parse::parse` on the attribute, and
/// compared line by line with the command's output.
#[test]
fn check_matches_the_parser() {
    let path = fixture("broken/orders.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let file = syn::parse_file(&text).unwrap();
    let mut expected = Vec::new();
    for item in &file.items {
        let attrs = match item {
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Struct(s) => &s.attrs,
            _ => continue,
        };
        for attr in attrs {
            let args = match &attr.meta {
                syn::Meta::List(list) => list.tokens.clone(),
                _ => proc_macro2::TokenStream::new(),
            };
            let parsed =
                idem_contract::parse::parse(args, syn::spanned::Spanned::span(attr), Some(item));
            for e in parsed.errors {
                let start = e.span().start();
                expected.push(format!(
                    "{}:{}:{}: error: {}",
                    path.display(),
                    start.line,
                    start.column + 1,
                    e
                ));
            }
        }
    }
    assert!(expected.len() >= 5, "{expected:#?}");
    let run = idem(
        &["check", "--src", path.to_str().unwrap()],
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
    assert_eq!(run.status.code(), Some(1));
    let printed = stderr(&run);
    assert_eq!(printed.trim_end(), expected.join("\n"));
}

#[test]
fn check_passes_good_source_and_export_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("src");
    let run = idem(&["check", "--src", src.to_str().unwrap()], dir.path());
    assert!(run.status.success(), "{}", stderr(&run));
    let said = stderr(&run);
    // The success line claims idem's own checks only, and names what needs the compiler.
    assert!(
        said.contains("checked 2 contracts in 2 Rust files: no contract errors of idem's own; fingerprint fields and the status lookup and reconcile functions are checked by the compiler (`cargo check`)"),
        "{said}"
    );
    let out = dir.path().join("contracts.json");
    let run = idem(
        &[
            "export",
            "--src",
            src.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--target",
            "new_pet=POST webhook newPet",
        ],
        dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let exported = contracts::from_file(&out).unwrap();
    let scanned = contracts::from_sources(&[src]).unwrap();
    assert_eq!(exported.len(), 2);
    for (e, s) in exported.iter().zip(&scanned) {
        assert_eq!(e.contract, s.contract);
    }
    assert_eq!(exported[1].target.to_string(), "POST webhook newPet");
    let run = idem(&["schema"], dir.path());
    let schema: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(schema["title"], "x-idempotency");
}

#[test]
fn check_says_what_it_does_not_check_and_needs_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let help = common::stdout(&idem(&["check", "--help"], dir.path()));
    assert!(!help.contains("as the compiler would"), "{help}");
    assert!(
        help.contains("Check contracts for the errors `#[idem::contract]` itself reports")
            && help.contains("(`cargo check`)"),
        "{help}"
    );
    assert!(
        help.contains("Usage: idem check <--src <PATH>|--contracts <FILE>>"),
        "{help}"
    );
    let run = idem(&["check"], dir.path());
    assert_eq!(run.status.code(), Some(2));
    assert!(
        stderr(&run).contains("the following required arguments were not provided")
            && stderr(&run).contains("<--src <PATH>|--contracts <FILE>>"),
        "{}",
        stderr(&run)
    );
}

#[test]
fn target_help_explains_the_webhook_form() {
    let dir = tempfile::tempdir().unwrap();
    for command in ["merge", "docs", "export"] {
        let help = common::stdout(&idem(&[command, "--help"], dir.path()));
        assert!(
            help.contains("--target <NAME=TARGET>")
                && help.contains(
                    "`on_new_pet='POST webhook newPet'`, where `newPet` is the webhook's key under"
                )
                && help.contains(&format!("idem {command} ")),
            "{command}: {help}"
        );
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with("idem ") && l.contains("webhook")),
            "{command} has a webhook example: {help}"
        );
    }
}

/// The orders fixture's contract as a contracts file entry for `createOrder`, after
/// `edit`.
fn orders_contract(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<Sourced> {
    let scanned = contracts::from_sources(&[fixture("orders/api.rs")]).unwrap();
    let mut contract = serde_json::to_value(&scanned[0].contract).unwrap();
    edit(&mut contract);
    let file =
        json!({ "version": 1, "contracts": [{ "target": "createOrder", "contract": contract }] });
    contracts::parse_file(Path::new("c.json"), &file.to_string()).unwrap()
}

fn orders_doc() -> Document {
    let text = std::fs::read_to_string(fixture("orders/openapi.yaml")).unwrap();
    Document::parse(Path::new("orders.yaml"), &text).unwrap()
}

#[test]
fn a_contract_that_fits_its_document_has_no_warnings() {
    // Fields through `allOf` and a nested `$ref` (`shipping.zip`); the lookup path under
    // another parameter name (`{key}` in the contract, `{id}` in the document).
    let mut doc = orders_doc();
    let merged = openapi::merge(&mut doc, &orders_contract(|_| {})).unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
}

/// The request body's media type decides how its fields are read: a form body's fields
/// are checked against its schema (and must be flat); a body idem cannot read fields of
/// (here `multipart/form-data`) is warned about when the contract names fields.
#[test]
fn a_fingerprint_that_does_not_fit_the_media_type_is_warned_about() {
    let with_media = |media: &str| {
        let mut doc = orders_doc();
        let body = &mut doc.root["paths"]["/orders"]["post"]["requestBody"]["content"];
        let schema = body["application/json"].clone();
        *body = json!({ media: schema });
        doc
    };
    let mut doc = with_media("application/x-www-form-urlencoded");
    let merged = openapi::merge(
        &mut doc,
        &orders_contract(|c| {
            c["fingerprint"] = json!({ "fields": ["customer_id", "amount", "shipping.zip"] });
        }),
    )
    .unwrap();
    let warnings: Vec<String> = merged.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "c.json: warning: contract 1: `create_order`: the fingerprint field `amount` is not in the form request body of `POST /orders` in orders.yaml: the body has no property `amount` (it has `customer_id`, `currency`, `amount_minor`, `items` and `shipping`); the document or the contract is out of date",
            "c.json: warning: contract 1: `create_order`: the fingerprint field `shipping.zip` is nested, but `POST /orders` takes a form body (`application/x-www-form-urlencoded`), whose fields are flat; name the form field itself",
        ]
    );

    let mut doc = with_media("multipart/form-data");
    let merged = openapi::merge(&mut doc, &orders_contract(|_| {})).unwrap();
    let warnings: Vec<String> = merged.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "c.json: warning: contract 1: `create_order`: the contract reads fields of the request body, but `POST /orders` takes only `multipart/form-data`: idem reads the fields of JSON and `application/x-www-form-urlencoded` bodies; write `fingerprint = body` (the bytes as received) and take the key from a header"
        ]
    );
    let mut doc = with_media("multipart/form-data");
    let merged = openapi::merge(
        &mut doc,
        &orders_contract(|c| {
            c["fingerprint"] = json!("body");
        }),
    )
    .unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
}

/// A significant query parameter the operation does not declare is warned about; once
/// declared (here on the path item), it is not.
#[test]
fn significant_query_parameters_must_be_declared() {
    let found = orders_contract(|c| c["fingerprint_query"] = json!(["expand"]));
    let mut doc = orders_doc();
    let merged = openapi::merge(&mut doc, &found).unwrap();
    let warnings: Vec<String> = merged.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "c.json: warning: contract 1: `create_order`: the significant query parameter `expand` is not a query parameter of `POST /orders` in orders.yaml; the document or the contract is out of date"
        ]
    );
    assert_eq!(
        doc.root["paths"]["/orders"]["post"]["x-idempotency"]["fingerprint_query"],
        json!(["expand"]),
        "published in the extension"
    );
    let mut doc = orders_doc();
    doc.root["paths"]["/orders"]["parameters"] =
        json!([{ "name": "expand", "in": "query", "schema": { "type": "string" } }]);
    let merged = openapi::merge(&mut doc, &found).unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
}

#[test]
fn contracts_that_do_not_fit_their_document_are_warned_about() {
    let found = orders_contract(|c| {
        c["key_scope"]["source"] = json!({ "in": "body", "field": "client_ref" });
        // `items` is an array: what lies under it cannot be told, so `items.sku` is
        // not reported.
        c["fingerprint"] =
            json!({ "fields": ["customer_id", "amount", "shipping.zipp", "items.sku"] });
        c["status_lookup"]["path"] = "/orders/operation/{key}".into();
    });
    let mut doc = orders_doc();
    let merged = openapi::merge(&mut doc, &found).unwrap();
    assert!(
        doc.root["paths"]["/orders"]["post"]["x-idempotency"].is_object(),
        "the merge is done all the same"
    );
    let warnings: Vec<String> = merged.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "c.json: warning: contract 1: `create_order`: the key field `client_ref` is not in the JSON request body of `POST /orders` in orders.yaml: the body has no property `client_ref` (it has `customer_id`, `currency`, `amount_minor`, `items` and `shipping`); the document or the contract is out of date",
            "c.json: warning: contract 1: `create_order`: the fingerprint field `amount` is not in the JSON request body of `POST /orders` in orders.yaml: the body has no property `amount` (it has `customer_id`, `currency`, `amount_minor`, `items` and `shipping`); the document or the contract is out of date",
            "c.json: warning: contract 1: `create_order`: the fingerprint field `shipping.zipp` is not in the JSON request body of `POST /orders` in orders.yaml: `shipping` has no property `zipp` (did you mean `zip`?); the document or the contract is out of date",
            "c.json: warning: contract 1: `create_order`: the status lookup `GET /orders/operation/{key}` is not a path of orders.yaml (did you mean `/orders/operations/{id}`?); the published contract sends clients there after a lost answer",
        ]
    );
    // A path without a `get` is named as such.
    let mut doc = orders_doc();
    let item = doc.root["paths"]["/orders/operations/{id}"]
        .as_object_mut()
        .unwrap();
    let get = item.remove("get").unwrap();
    item.insert("delete".into(), get);
    let merged = openapi::merge(&mut doc, &orders_contract(|_| {})).unwrap();
    let warnings: Vec<&str> = merged.warnings.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(
        warnings,
        [
            "contract 1: `create_order`: the status lookup `GET /orders/operations/{key}` is not an operation of orders.yaml: its path `/orders/operations/{id}` has no `get`; the published contract sends clients there after a lost answer"
        ]
    );
}

#[test]
fn merge_prints_warnings_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("orders.yaml");
    std::fs::copy(fixture("orders/openapi.yaml"), &spec).unwrap();
    let src = dir.path().join("api.rs");
    let text = std::fs::read_to_string(fixture("orders/api.rs")).unwrap();
    std::fs::write(&src, text.replace("shipping.zip", "shipping.zipcode")).unwrap();
    let run = idem(
        &[
            "merge",
            "--spec",
            "orders.yaml",
            "--src",
            "api.rs",
            "--target",
            "create_order=createOrder",
        ],
        dir.path(),
    );
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let said = stderr(&run);
    assert!(
        said.contains("api.rs:6:1: warning: `create_order`: the fingerprint field `shipping.zipcode` is not in the JSON request body of `POST /orders` in orders.yaml: `shipping` has no property `zipcode` (it has `street` and `zip`); the document or the contract is out of date"),
        "{said}"
    );
    assert!(
        std::fs::read_to_string(&spec)
            .unwrap()
            .contains("x-idempotency:"),
        "the document was merged"
    );
}

#[test]
fn help_has_an_example_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    for command in ["merge", "docs", "export", "check", "schema"] {
        let run = idem(&[command, "--help"], dir.path());
        assert!(run.status.success());
        let help = String::from_utf8_lossy(&run.stdout);
        assert!(
            help.contains("Example") && help.contains(&format!("idem {command}")),
            "{command}: {help}"
        );
    }
}

#[test]
fn docs_writes_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let spec = common::data_dir().join("petstore-expanded.3.0.yaml");
    let out = dir.path().join("site");
    let run = idem(
        &[
            "docs",
            "--src",
            fixture("src/pets.rs").to_str().unwrap(),
            "--spec",
            spec.to_str().unwrap(),
            "--target",
            "addPet=POST /pets",
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let md = std::fs::read_to_string(out.join("operations.md")).unwrap();
    assert!(
        md.contains("## POST /pets") && md.contains("HTTP/1.1 200 OK"),
        "{md}"
    );
    assert!(
        std::fs::read_to_string(out.join("operations.html"))
            .unwrap()
            .starts_with("<!DOCTYPE html>")
    );
}
