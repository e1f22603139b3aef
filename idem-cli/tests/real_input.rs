//! Merging into real OpenAPI documents written by others: Stripe's
//! API (OpenAPI 3.0, 4 MB of YAML), the OpenAPI Initiative's expanded pet store (3.0) and
//! its webhook example (3.1). Each merge runs the `idem` binary, and its result must parse
//! with a typed model of its version (openapiv3 for 3.0, oas3 for 3.1), keep every
//! original path, operation and key in its order, carry the extension on exactly the
//! contracted operations, and pass the independent Python validator.

mod common;

use std::collections::BTreeSet;

use idem_codegen::openapi::{Document, operations};
use serde_json::Value;

use common::{copy_of, fixture, idem, stderr, validate};

/// Every operation of a document as `(label, operationId)`.
fn operation_set(doc: &Document) -> BTreeSet<(String, Option<String>)> {
    operations(doc)
        .into_iter()
        .map(|op| (op.label(), op.operation_id))
        .collect()
}

/// The labels of the operations that carry `x-idempotency`.
fn contracted(doc: &Document) -> BTreeSet<String> {
    operations(doc)
        .into_iter()
        .filter(|op| {
            op.get(&doc.root)
                .is_some_and(|o| o.get("x-idempotency").is_some())
        })
        .map(|op| op.label())
        .collect()
}

/// Checks that `merged` keeps all of `orig`: every key (in the same order), every array
/// item, every scalar; additions only where `may_add` allows.
fn assert_kept(
    orig: &Value,
    merged: &Value,
    path: &mut Vec<String>,
    may_add: &dyn Fn(&[String]) -> bool,
) {
    match (orig, merged) {
        (Value::Object(o), Value::Object(m)) => {
            let mut last = None;
            for (k, v) in o {
                let at = m.keys().position(|mk| mk == k);
                let Some(at) = at else {
                    panic!("/{} lost the key `{k}`", path.join("/"));
                };
                assert!(
                    last < Some(at),
                    "/{} changed the order of `{k}`",
                    path.join("/")
                );
                last = Some(at);
                path.push(k.clone());
                assert_kept(v, &m[k], path, may_add);
                path.pop();
            }
            if m.len() > o.len() {
                assert!(
                    may_add(path),
                    "/{} gained keys outside a contracted operation: {:?}",
                    path.join("/"),
                    m.keys().filter(|k| !o.contains_key(*k)).collect::<Vec<_>>()
                );
            }
        }
        (Value::Array(o), Value::Array(m)) => {
            assert!(m.len() >= o.len(), "/{} lost items", path.join("/"));
            for (i, (ov, mv)) in o.iter().zip(m).enumerate() {
                path.push(i.to_string());
                assert_kept(ov, mv, path, may_add);
                path.pop();
            }
            if m.len() > o.len() {
                assert!(
                    may_add(path),
                    "/{} gained items outside a contracted operation",
                    path.join("/")
                );
            }
        }
        _ => assert_eq!(orig, merged, "/{} changed", path.join("/")),
    }
}

/// Merges with the binary and checks everything the issue asks for. Returns the merged
/// document.
fn merge_and_check(
    name: &str,
    args: &[&str],
    expected: &[&str],
) -> (Document, std::path::PathBuf, tempfile::TempDir) {
    let (dir, spec) = copy_of(name);
    let out = dir.path().join(format!("merged-{name}"));
    let schema = dir.path().join("x-idempotency.schema.json");
    let mut all = vec![
        "merge",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--schema-out",
        schema.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let run = idem(&all, dir.path());
    assert!(run.status.success(), "idem merge failed:\n{}", stderr(&run));

    let orig = Document::load(&spec).unwrap();
    let merged = Document::load(&out).unwrap();
    assert_eq!(merged.version, orig.version);
    assert_eq!(
        operation_set(&merged),
        operation_set(&orig),
        "the operations changed"
    );
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(contracted(&merged), expected);

    let pointers: Vec<Vec<String>> = operations(&merged)
        .into_iter()
        .filter(|op| expected.contains(&op.label()))
        .map(|op| op.pointer)
        .collect();
    let had_components = orig.root.get("components").is_some();
    let may_add = |path: &[String]| {
        pointers.iter().any(|p| path.starts_with(p))
            || matches!(path, [c] if c == "components")
            || matches!(path, [c, s] if c == "components" && (s == "schemas" || s == "headers"))
            || (path.is_empty() && !had_components)
    };
    assert_kept(&orig.root, &merged.root, &mut Vec::new(), &may_add);

    // The extension's JSON Schema is published beside the document, not inside it.
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&schema).unwrap()).unwrap();
    assert_eq!(schema["title"], "x-idempotency");
    validate(&out);
    (merged, out, dir)
}

/// The additions on one operation are complete, and publish no name of the server's
/// code.
fn assert_additions(op: &Value, header: Option<&str>) {
    let ext = &op["x-idempotency"];
    assert!(ext["status_lookup"].get("handler").is_none(), "{ext}");
    assert!(ext["recovery"].get("function").is_none(), "{ext}");
    match op.get("operationId") {
        Some(id) => assert_eq!(&ext["operation"], id),
        None => assert!(ext["operation"].is_string()),
    }
    for key in [
        "key_scope",
        "fingerprint",
        "ttl",
        "deadline",
        "max_attempts",
        "retryable",
        "concurrency",
        "status_lookup",
        "recovery",
    ] {
        assert!(ext.get(key).is_some(), "x-idempotency lacks `{key}`");
    }
    if let Some(header) = header {
        let params = op["parameters"].as_array().unwrap();
        let key = params
            .iter()
            .find(|p| p["name"] == header)
            .expect("the key parameter");
        assert_eq!(key["in"], "header");
        assert_eq!(key["required"], true);
        // 255 characters, or quoted as an RFC 8941 string with its escapes.
        assert!(key["schema"]["maxLength"].as_u64().unwrap() <= 2 + 2 * 255);
        assert!(key["schema"]["pattern"].is_string());
    }
    for status in ["400", "401", "408", "409", "413", "422", "429", "503"] {
        let r = &op["responses"][status];
        assert!(r["description"].is_string(), "{status} has a description");
        assert!(
            r["content"]["application/problem+json"]["schema"]["$ref"].is_string(),
            "{status} is problem+json"
        );
        assert_eq!(
            r["headers"]["Retry-After"].is_object(),
            matches!(status, "409" | "429" | "503"),
            "{status} Retry-After"
        );
    }
}

#[test]
fn stripe_six_operations() {
    let contracts = fixture("stripe.contracts.json");
    let (merged, out, _dir) = merge_and_check(
        "stripe-2023-09-05.spec3.yaml",
        &["--contracts", contracts.to_str().unwrap()],
        &[
            "POST /v1/charges",
            "POST /v1/customers",
            "POST /v1/payment_intents",
            "POST /v1/payouts",
            "POST /v1/refunds",
            "POST /v1/transfers",
        ],
    );
    for path in [
        "/v1/charges",
        "/v1/customers",
        "/v1/payment_intents",
        "/v1/payouts",
        "/v1/refunds",
        "/v1/transfers",
    ] {
        let op = &merged.root["paths"][path]["post"];
        assert_additions(op, Some("Idempotency-Key"));
        // Stripe's own answers are kept and learn the replay headers.
        assert_eq!(
            op["responses"]["200"]["description"],
            "Successful response."
        );
        assert!(op["responses"]["200"]["headers"]["Idempotent-Replayed"].is_object());
        assert!(op["responses"]["default"]["content"]["application/json"].is_object());
    }
    // A UUID key, bare or quoted.
    let uuid_key = &merged.root["paths"]["/v1/customers"]["post"]["parameters"][0]["schema"];
    assert_eq!(uuid_key["maxLength"], 38);
    assert!(
        uuid_key["pattern"]
            .as_str()
            .is_some_and(|p| p.contains("[0-9A-Fa-f]{12}")),
        "{uuid_key}"
    );
    // Each extension is an instance of the published JSON Schema.
    let schema: Value = serde_json::from_slice(&idem(&["schema"], _dir.path()).stdout).unwrap();
    for path in ["/v1/charges", "/v1/customers", "/v1/payment_intents"] {
        common::assert_schema_valid(
            &schema,
            &merged.root["paths"][path]["post"]["x-idempotency"],
        );
    }
    assert!(merged.root["paths"]["/v1/payment_intents"]["post"]["responses"]["202"]["headers"]["Location"].is_object());
    // A typed OpenAPI 3.0 model reads the result.
    let text = std::fs::read_to_string(&out).unwrap();
    let typed: openapiv3::OpenAPI =
        yaml_serde::from_str(&text).expect("openapiv3 reads the merged document");
    assert_eq!(
        typed.paths.paths.len(),
        merged.root["paths"].as_object().unwrap().len()
    );
    let charges = typed.paths.paths["/v1/charges"]
        .as_item()
        .unwrap()
        .post
        .as_ref()
        .unwrap();
    assert!(charges.extensions.contains_key("x-idempotency"));
    // YAML 1.1 readers (PyYAML, used by most validators) read the same data: Stripe's
    // enum value 'off' stays a string, not `false`.
    if let Some(py) = common::read_with_pyyaml(&out) {
        assert_eq!(
            py, merged.root,
            "PyYAML reads the merged document differently"
        );
    }
}

#[test]
fn petstore_post_pets() {
    let src = fixture("src/pets.rs");
    let (merged, out, _dir) = merge_and_check(
        "petstore-expanded.3.0.yaml",
        &[
            "--src",
            src.to_str().unwrap(),
            "--target",
            "addPet=POST /pets",
        ],
        &["POST /pets"],
    );
    let op = &merged.root["paths"]["/pets"]["post"];
    assert_additions(op, Some("Idempotency-Key"));
    assert_eq!(op["x-idempotency"]["operation"], "addPet");
    // Existing answers are kept as they were, plus the replay headers.
    assert_eq!(op["responses"]["200"]["description"], "pet response");
    let typed: openapiv3::OpenAPI =
        yaml_serde::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(typed.paths.paths.len(), 2);
}

#[test]
fn webhook_example_3_1() {
    let src = fixture("src/webhooks.rs");
    let (merged, out, _dir) = merge_and_check(
        "webhook-example.3.1.yaml",
        &[
            "--src",
            src.to_str().unwrap(),
            "--target",
            "new_pet=POST webhook newPet",
        ],
        &["POST webhook newPet"],
    );
    let op = &merged.root["webhooks"]["newPet"]["post"];
    assert_additions(op, Some("X-Delivery-Key"));
    assert_eq!(op["x-idempotency"]["recovery"]["kind"], "manual");
    // A typed OpenAPI 3.1 model reads the result.
    let typed = oas3::from_yaml(std::fs::read_to_string(&out).unwrap())
        .expect("oas3 reads the merged 3.1 document");
    let hook = typed
        .webhooks
        .get("newPet")
        .and_then(|w| w.post.as_ref())
        .expect("the webhook operation");
    assert!(hook.extensions.contains_key("idempotency"));
}

#[test]
fn webhook_example_3_1_single_contract() {
    let (dir, spec) = copy_of("webhook-example.3.1.yaml");
    let contracts = dir.path().join("hooks.json");
    let file = std::fs::read_to_string(fixture("stripe.contracts.json")).unwrap();
    let mut value: Value = serde_json::from_str(&file).unwrap();
    let entry = value["contracts"][1].clone();
    value["contracts"] = Value::Array(vec![entry]);
    value["contracts"][0]["target"] = "POST webhook newPet".into();
    std::fs::write(&contracts, value.to_string()).unwrap();
    let run = idem(
        &[
            "merge",
            "--spec",
            spec.to_str().unwrap(),
            "--contracts",
            contracts.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    // Without --out the document is updated in place.
    let merged = Document::load(&spec).unwrap();
    let op = &merged.root["webhooks"]["newPet"]["post"];
    assert_additions(op, Some("Idempotency-Key"));
    let typed = oas3::from_yaml(std::fs::read_to_string(&spec).unwrap())
        .expect("oas3 reads the merged 3.1 document");
    let hook = typed
        .webhooks
        .get("newPet")
        .and_then(|w| w.post.as_ref())
        .expect("the webhook operation");
    assert!(
        hook.extensions.contains_key("idempotency"),
        "{:?}",
        hook.extensions.keys().collect::<Vec<_>>()
    );
    validate(&spec);
    // Merging again changes nothing: the result is a fixed point.
    let before = std::fs::read(&spec).unwrap();
    let again = idem(
        &[
            "merge",
            "--spec",
            spec.to_str().unwrap(),
            "--contracts",
            contracts.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(std::fs::read(&spec).unwrap(), before);
}
