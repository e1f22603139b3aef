//! One policy wherever the caller reads the contract from: the const the macro emits, the
//! contracts file `idem export` writes, and the `x-idempotency` of the published OpenAPI
//! document, for the orders example.

use std::path::Path;

use idem_client::RetryPolicy;
use idem_contract::extension::ClientIdentity;
use idem_contract::file::CONTRACTS_FILE_VERSION;
use idem_contract::{ContractEntry, ContractsFile};

#[test]
fn the_const_the_contracts_file_and_the_published_document_give_one_policy() {
    let identity = ClientIdentity::header(orders::api::CLIENT_ID_HEADER);
    let from_const = RetryPolicy::from_contract(&orders::api::create_order::CONTRACT)
        .with_client_identity(identity.clone());

    // What `idem export --src examples/orders/src` writes.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orders/src");
    let found = idem_codegen::contracts::from_sources(&[source]).unwrap();
    let file = ContractsFile {
        version: CONTRACTS_FILE_VERSION,
        contracts: found
            .iter()
            .map(|s| ContractEntry {
                target: None,
                contract: s.contract.clone(),
            })
            .collect(),
    };
    let text = serde_json::to_string_pretty(&file).unwrap();
    let from_file = RetryPolicy::from_contracts_file(&text, "create_order")
        .unwrap()
        .with_client_identity(identity);

    // The document the service publishes (`cargo run -p orders -- --emit-openapi`), YAML.
    let document = orders::publish::document().unwrap().render();
    let from_document = RetryPolicy::from_openapi(&document, "create_order").unwrap();
    let by_route = RetryPolicy::from_openapi(&document, "POST /orders").unwrap();
    assert_eq!(
        RetryPolicy::from_openapi(&document, "post /orders").unwrap(),
        by_route
    );
    assert!(
        RetryPolicy::from_openapi(&document, "POST /Orders").is_err(),
        "paths are exact"
    );

    // The published document names the client's header; the contract alone does not.
    assert_eq!(
        from_document.client_identity_header(),
        Some(orders::api::CLIENT_ID_HEADER)
    );
    assert_eq!(
        RetryPolicy::from_contract(&orders::api::create_order::CONTRACT).client_identity_header(),
        None
    );

    assert_eq!(from_const, from_file);
    assert_eq!(from_const, from_document);
    assert_eq!(from_document, by_route);
    assert_eq!(from_const.max_attempts(), 4);
    assert_eq!(from_const.status_lookup(), Some("/orders/operations/{key}"));
}

#[test]
fn a_source_without_the_operation_says_what_it_has() {
    let document = orders::publish::document().unwrap().render();
    let error = RetryPolicy::from_openapi(&document, "create_refund").unwrap_err();
    assert!(error.to_string().contains("`create_order`"), "{error}");
    let uncontracted = RetryPolicy::from_openapi(&document, "GET /orders/{id}").unwrap_err();
    assert!(
        uncontracted.to_string().contains("no `x-idempotency`"),
        "{uncontracted}"
    );
    let error =
        RetryPolicy::from_contracts_file("{\"version\": 1, \"contracts\": []}", "x").unwrap_err();
    assert!(
        error.to_string().contains("has none") || error.to_string().contains("none"),
        "{error}"
    );
    for garbage in ["", "{", "not: [yaml", "\u{0}\u{1}", "[1, 2]"] {
        assert!(
            RetryPolicy::from_openapi(garbage, "create_order").is_err(),
            "{garbage:?}"
        );
        assert!(
            RetryPolicy::from_contracts_file(garbage, "create_order").is_err(),
            "{garbage:?}"
        );
    }
}

/// The builder holds a hand-made policy to the macro's rules: a 402 (the same decline of
/// the same payment) is permanent, and cannot be retryable.
#[test]
fn a_built_policy_refuses_a_permanent_402() {
    use idem_contract::{Retryable, StatusCode};
    let error = RetryPolicy::builder("create_charge")
        .max_attempts(3)
        .deadline(std::time::Duration::from_secs(30))
        .retryable([
            Retryable::Status(StatusCode(402)),
            Retryable::Status(StatusCode(503)),
        ])
        .build()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("`402` (Payment Required) is a permanent answer"),
        "{error}"
    );
}
