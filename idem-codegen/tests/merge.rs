//! What merging keeps and what it adds, on small documents written for each rule (the
//! command's own tests, `idem check` beside the macro's parser included, are in `idem-cli`).

mod common;

use std::path::Path;

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{self, Document};
use serde_json::json;

use common::{fixture, schema_errors_each};

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
    // Bare, or quoted as an RFC 8941 string with escapes.
    assert_eq!(params[0]["schema"]["maxLength"], 512);
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
    // 500 is in the contract's retry list: the operation itself may answer it.
    assert_eq!(
        statuses,
        [
            "201", "400", "401", "408", "409", "413", "422", "429", "500", "503", "5XX"
        ]
    );
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

/// The orders example's own document, merged with its contract and its identity header
/// (`X-Client-Id`, declared there through a `$ref`), is valid OpenAPI 3.1.
#[test]
fn the_orders_example_merges_into_a_valid_document() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orders");
    let found = contracts::from_sources(&[example.join("src/api.rs")]).unwrap();
    let mut doc = Document::load(&example.join("openapi.yaml")).unwrap();
    let options = openapi::MergeOptions::new().with_client_identity(
        idem_codegen::extension::parse_identity_header("X-Client-Id").unwrap(),
    );
    let merged = openapi::merge_with(&mut doc, &found, &options).unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
    assert_eq!(merged.lookups[0].label(), "GET /orders/operations/{key}");
    let lookup = &doc.root["paths"]["/orders/operations/{key}"]["get"]["responses"];
    // The example's placeholder schemas give way to what the server answers.
    assert_eq!(
        lookup["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/IdemOperationStatus"
    );
    assert_eq!(
        lookup["404"]["content"]["application/problem+json"]["schema"]["$ref"],
        "#/components/schemas/IdemProblem"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.yaml");
    doc.save(&path).unwrap();
    common::validate(&path);
}

/// With the client identity header named, the contracted operation and its status lookup
/// (a `get` of the document under another parameter name) publish it, and the lookup gets
/// its answers: a 200 schema in place of the document's bare description, 400, 401, 404
/// and 503. Nothing names the server's functions, and a second merge changes nothing.
#[test]
fn the_status_lookup_and_the_client_identity_are_published() {
    let mut doc = orders_doc();
    let options = openapi::MergeOptions::new().with_client_identity(
        idem_codegen::extension::parse_identity_header("X-Client-Id").unwrap(),
    );
    let merged = openapi::merge_with(&mut doc, &orders_contract(|_| {}), &options).unwrap();
    assert_eq!(merged.lookups.len(), 1);
    assert_eq!(merged.lookups[0].label(), "GET /orders/operations/{id}");
    let op = &doc.root["paths"]["/orders"]["post"];
    let ext = &op["x-idempotency"];
    assert_eq!(ext["operation"], "createOrder");
    assert_eq!(
        ext["client_identity"],
        json!({ "in": "header", "name": "X-Client-Id" })
    );
    assert_eq!(
        ext["status_lookup"],
        json!({ "path": "/orders/operations/{key}" })
    );
    assert_eq!(ext["recovery"], json!({ "kind": "reconcile" }));
    let text = doc.render();
    for code_name in [
        "create_order",
        "order_operation_status",
        "reconcile_create_order",
    ] {
        assert!(
            !text.contains(code_name),
            "the document names `{code_name}`"
        );
    }
    // The document declares `X-Client-Id` through a `$ref`: it is not declared twice.
    assert_eq!(
        parameter_names(op),
        [
            "#/components/parameters/ClientId",
            "X-Trace",
            "Content-Type",
            "X-Channel",
            "Idempotency-Key"
        ]
    );
    assert!(
        op["responses"]["401"]["description"]
            .as_str()
            .unwrap()
            .contains("the `X-Client-Id` header is missing")
    );
    assert!(
        op["responses"]["413"]["content"]["application/problem+json"]["examples"]["body-too-large"]
            .is_object()
    );
    // 504 is in the contract's retry list: the operation itself (or a gateway) answers it.
    assert!(
        op["responses"]["504"]["description"]
            .as_str()
            .unwrap()
            .contains("504 is retryable under this operation's contract")
    );
    assert_lookup_published(&doc);

    let once = doc.render();
    openapi::merge_with(&mut doc, &orders_contract(|_| {}), &options).unwrap();
    assert_eq!(doc.render(), once, "a second merge changes nothing");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.yaml");
    doc.save(&path).unwrap();
    common::validate(&path);
}

/// The names of `op`'s parameters, or the `$ref` of those declared by reference.
fn parameter_names(op: &serde_json::Value) -> Vec<String> {
    op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.get("name")
                .or(p.get("$ref"))
                .and_then(|v| v.as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The orders document's status lookup, as the merge published it: its own 200 with the
/// operation's state, idem's answers (400, 401, 404, 503), the client identity by `$ref`.
fn assert_lookup_published(doc: &Document) {
    let lookup = &doc.root["paths"]["/orders/operations/{id}"]["get"];
    let statuses: Vec<&String> = lookup["responses"].as_object().unwrap().keys().collect();
    assert_eq!(statuses, ["200", "400", "401", "404", "503"]);
    let ok = &lookup["responses"]["200"];
    assert_eq!(
        ok["description"], "The operation's state.",
        "its own words stay"
    );
    assert_eq!(
        ok["content"]["application/json"]["schema"],
        json!({ "$ref": "#/components/schemas/IdemOperationStatus" })
    );
    let status = &doc.root["components"]["schemas"]["IdemOperationStatus"];
    assert!(
        status["properties"]["state"]["enum"]
            .as_array()
            .unwrap()
            .contains(&json!("released"))
    );
    assert!(lookup["responses"]["404"]["content"]["application/problem+json"]["examples"]["operation-not-found"].is_object());
    assert!(lookup["responses"]["503"]["headers"]["Retry-After"].is_object());
    assert!(lookup["responses"]["400"]["content"]["application/problem+json"]["examples"]["key-missing"].is_null());
    assert_eq!(
        parameter_names(lookup),
        ["#/components/parameters/ClientId", "id"]
    );
}

/// The key header's schema accepts exactly the values the server reads as a key: bare,
/// or quoted as an RFC 8941 string.
#[test]
fn the_key_schema_accepts_what_the_server_accepts() {
    use idem_contract::{KeyFormat, KeyScope};
    let long = "a".repeat(255);
    let values = [
        "abc".to_owned(),
        "\"abc\"".to_owned(),
        "\"a\\\"b\"".to_owned(),
        "\"a\\\\b\"".to_owned(),
        "a\"b".to_owned(),
        long.clone(),
        format!("\"{long}\""),
        format!("{long}a"),
        "\"abc".to_owned(),
        "\"a b\"".to_owned(),
        "\"\"".to_owned(),
        "\"abc\";v=1".to_owned(),
        "a b".to_owned(),
        "\"a\\x\"".to_owned(),
        "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60".to_owned(),
        "\"0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60\"".to_owned(),
        "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f6".to_owned(),
    ];
    for format in [KeyFormat::Any, KeyFormat::Uuid] {
        let scope = KeyScope {
            format,
            ..KeyScope::CLIENT
        };
        let mut contract = orders_contract(|_| {}).remove(0).contract;
        contract.key_scope = scope.clone();
        let param = idem_codegen::extension::key_parameter(&contract).unwrap();
        let mut schema = param["schema"].clone();
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema".into();
        let instances: Vec<serde_json::Value> = values.iter().map(|v| json!(v)).collect();
        let Some(each) = schema_errors_each(&schema, &instances) else {
            return;
        };
        for (value, errors) in values.iter().zip(each) {
            let accepted = scope.header_key(value.as_bytes()).is_ok();
            assert_eq!(
                errors.is_empty(),
                accepted,
                "{format:?} `{value}`: the server {} it, the schema says {errors:?}",
                if accepted { "accepts" } else { "refuses" }
            );
        }
    }
}
