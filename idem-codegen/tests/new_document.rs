//! `idem merge` without `--spec`: a new, valid OpenAPI document for a service that has
//! none, validated by the independent validator (openapi-spec-validator).

mod common;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{self, NewDocument};

fn orders_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orders/src/api.rs")
}

/// A contracts file entry: the orders example's contract at `target`, after `edit`.
fn contract_at(target: &str, edit: impl FnOnce(&mut Value)) -> Vec<Sourced> {
    let scanned = contracts::from_sources(&[orders_source()]).unwrap();
    let mut contract = serde_json::to_value(&scanned[0].contract).unwrap();
    edit(&mut contract);
    let file = json!({ "version": 1, "contracts": [{ "target": target, "contract": contract }] });
    contracts::parse_file(Path::new("c.json"), &file.to_string()).unwrap()
}

#[test]
fn path_parameters_nested_fields_and_a_body_key_are_declared() {
    let found = contract_at("POST /customers/{customer_id}/sources", |c| {
        c["fingerprint"] = json!({"fields": ["customer.id", "customer.tier", "amount"]});
        c["key_scope"]["source"] = json!({"in": "body", "field": "request.reference"});
        c["status_lookup"]["path"] = json!("/customers/{customer_id}/sources/operations/{key}");
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.json");
    let mut doc = NewDocument::new("Sources", "1")
        .build(&path, &found)
        .unwrap();
    let merged = openapi::merge(&mut doc, &found).unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
    doc.save(&path).unwrap();
    common::validate(&path);
    let op = &doc.root["paths"]["/customers/{customer_id}/sources"]["post"];
    assert_eq!(
        op["parameters"][0],
        json!({"name": "customer_id", "in": "path", "required": true, "schema": {"type": "string"}})
    );
    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
    assert!(schema["properties"]["customer"]["properties"]["tier"].is_object());
    assert!(schema["properties"]["request"]["properties"]["reference"].is_object());
    let lookup = &doc.root["paths"]["/customers/{customer_id}/sources/operations/{key}"]["get"];
    let names: Vec<&Value> = lookup["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["name"])
        .collect();
    assert_eq!(names, [&json!("customer_id"), &json!("key")]);
}

#[test]
fn a_webhook_needs_openapi_3_1() {
    let found = contract_at("POST webhook orderPlaced", |_| {});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hooks.yaml");
    let errors = NewDocument::new("Hooks", "1")
        .openapi_3_0()
        .build(&path, &found)
        .unwrap_err();
    assert!(
        errors.0[0]
            .to_string()
            .contains("webhooks need OpenAPI 3.1"),
        "{errors:?}"
    );
    let mut doc = NewDocument::new("Hooks", "1").build(&path, &found).unwrap();
    openapi::merge(&mut doc, &found).unwrap();
    assert!(doc.root["webhooks"]["orderPlaced"]["post"]["x-idempotency"].is_object());
    // A webhook's status lookup is served by whoever receives it: no `paths` entry.
    assert_eq!(doc.root["paths"], json!({}));
    doc.save(&path).unwrap();
    common::validate(&path);
}
