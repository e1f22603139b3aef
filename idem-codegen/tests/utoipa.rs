//! Contracts merged into a document built by utoipa, in the service itself: the result is
//! valid for the independent validator (openapi-spec-validator), and nothing utoipa
//! built is lost.

mod common;

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{OpenApi, ToSchema};

use idem_codegen::openapi::MergeOptions;
use idem_contract::Contract;

/// An order to create.
#[allow(dead_code)]
#[derive(Deserialize, ToSchema)]
struct CreateOrder {
    customer_id: String,
    amount_minor: i64,
    currency: String,
    shipping: Address,
}

#[allow(dead_code)]
#[derive(Deserialize, ToSchema)]
struct Address {
    zip: String,
}

/// The order as created.
#[allow(dead_code)]
#[derive(serde::Serialize, ToSchema)]
struct Order {
    id: String,
}

/// Create an order.
#[utoipa::path(post, path = "/orders", request_body = CreateOrder,
    responses((status = 201, description = "The order was created", body = Order)))]
#[allow(dead_code)]
async fn create_order() {}

/// The state of an order operation, by its idempotency key.
#[utoipa::path(get, path = "/orders/operations/{key}",
    params(("key" = String, Path, description = "The idempotency key")),
    responses((status = 200, description = "The operation's state")))]
#[allow(dead_code)]
async fn order_status() {}

/// Read an order.
#[utoipa::path(get, path = "/orders/{id}", params(("id" = String, Path)),
    responses((status = 200, description = "The order", body = Order)))]
#[allow(dead_code)]
async fn get_order() {}

#[derive(OpenApi)]
#[openapi(
    info(title = "Orders", version = "1.0.0"),
    paths(create_order, order_status, get_order)
)]
struct ApiDoc;

fn contract(edit: impl FnOnce(&mut Value)) -> Contract {
    let mut value = json!({
      "operation": "create_order",
      "key_scope": {"per": "client", "source": {"in": "header", "name": "Idempotency-Key"}},
      "fingerprint": {"fields": ["customer_id", "amount_minor", "currency", "shipping.zip"]},
      "ttl": "24h", "deadline": {"total": "30s", "per_attempt": "5s"}, "max_attempts": 4,
      "retryable": [429, 503, 504, "timeout"],
      "concurrency": {"response": "conflict", "retry_after": "1s"},
      "status_lookup": {"handler": "order_status", "path": "/orders/operations/{key}"},
      "recovery": {"kind": "reconcile", "function": "reconcile_order"}
    });
    edit(&mut value);
    serde_json::from_value(value).unwrap()
}

fn options() -> MergeOptions {
    MergeOptions::new().with_client_identity(
        idem_codegen::extension::parse_identity_header("X-Client-Id").unwrap(),
    )
}

#[test]
fn a_utoipa_document_gets_the_contract_and_stays_valid() {
    let contract = contract(|_| {});
    let merged = idem_codegen::utoipa::merge(&ApiDoc::openapi(), [&contract], &options()).unwrap();
    assert!(merged.warnings.is_empty(), "{:?}", merged.warnings);
    assert_eq!(merged.operations[0].1.label(), "POST /orders");
    let json = &merged.document;
    let op = &json["paths"]["/orders"]["post"];
    assert_eq!(op["x-idempotency"]["operation"], "create_order");
    assert_eq!(
        op["x-idempotency"]["client_identity"]["name"],
        "X-Client-Id"
    );
    let names: Vec<&Value> = op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["name"])
        .collect();
    assert_eq!(names, [&json!("Idempotency-Key"), &json!("X-Client-Id")]);
    for status in [
        "201", "400", "401", "409", "413", "422", "429", "503", "504",
    ] {
        assert!(op["responses"][status].is_object(), "{status}");
    }
    // The operation's own answer is kept and documents the replay headers.
    assert_eq!(
        op["responses"]["201"]["description"],
        "The order was created"
    );
    assert!(op["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
    // The status lookup gets its answers; the schema utoipa wrote for nothing gives way.
    let lookup = &json["paths"]["/orders/operations/{key}"]["get"]["responses"];
    assert!(lookup["404"].is_object());
    // utoipa's own schemas are still there, beside idem's.
    let schemas = &json["components"]["schemas"];
    for name in [
        "CreateOrder",
        "Address",
        "Order",
        "IdemProblem",
        "IdemOperationStatus",
    ] {
        assert!(schemas[name].is_object(), "{name}");
    }
    assert!(json["components"]["headers"]["IdemRetryAfter"].is_object());
    // Untouched operations are untouched.
    assert_eq!(
        json["paths"]["/orders/{id}"],
        serde_json::to_value(ApiDoc::openapi()).unwrap()["paths"]["/orders/{id}"]
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, serde_json::to_vec_pretty(json).unwrap()).unwrap();
    common::validate(&path);
}

#[test]
fn merging_again_changes_nothing_and_utoipas_own_parts_are_kept() {
    let contract = contract(|_| {});
    let original = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let once = idem_codegen::utoipa::merge(&ApiDoc::openapi(), [&contract], &options()).unwrap();
    // The same merge into the merged document (as a file, as `idem merge` would).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("served.json");
    std::fs::write(&path, serde_json::to_vec(&once.document).unwrap()).unwrap();
    let mut doc = idem_codegen::openapi::Document::load(&path).unwrap();
    let sourced = vec![idem_codegen::contracts::Sourced {
        contract: contract.clone(),
        target: idem_contract::Target::OperationId("create_order".into()),
        origin: idem_codegen::contracts::Origin {
            file: path.clone(),
            position: None,
            entry: None,
        },
    }];
    idem_codegen::openapi::merge_with(&mut doc, &sourced, &options()).unwrap();
    assert_eq!(doc.root, once.document);
    // Everything utoipa wrote is still there, unchanged but for idem's additions.
    assert_eq!(once.document["info"], original["info"]);
    for (name, schema) in original["components"]["schemas"].as_object().unwrap() {
        assert_eq!(
            &once.document["components"]["schemas"][name], schema,
            "{name}"
        );
    }
    let ours = &once.document["paths"]["/orders"]["post"];
    let theirs = &original["paths"]["/orders"]["post"];
    assert_eq!(ours["requestBody"], theirs["requestBody"]);
    assert_eq!(ours["summary"], theirs["summary"]);
}

#[test]
fn a_contract_without_its_operation_is_refused_with_how_to_name_it() {
    let contract = contract(|c| c["operation"] = json!("place_order"));
    let errors =
        idem_codegen::utoipa::merge(&ApiDoc::openapi(), [&contract], &options()).unwrap_err();
    let message = errors.0[0].to_string();
    assert!(message.contains("`place_order`"), "{message}");
    assert!(message.contains("the utoipa OpenApi document"), "{message}");
}

#[test]
fn a_field_the_body_schema_lacks_is_a_warning() {
    let contract = contract(|c| {
        c["fingerprint"] = json!({"fields": ["customer_id", "amount"]});
    });
    let merged = idem_codegen::utoipa::merge(&ApiDoc::openapi(), [&contract], &options()).unwrap();
    assert_eq!(merged.warnings.len(), 1, "{:?}", merged.warnings);
    assert!(
        merged.warnings[0].message.contains("`amount`"),
        "{:?}",
        merged.warnings
    );
}
