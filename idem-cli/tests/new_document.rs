//! `idem merge` without `--spec`: a new, valid OpenAPI document for a service that has
//! none, validated by the independent validator (openapi-spec-validator).

mod common;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{Document, NewDocument};

use common::{idem, stderr};

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

/// `idem docs` from the sources `src` and `openapi.yaml` in `dir`, into `dir/out`.
fn render_docs(dir: &Path, src: &str, out: &str) {
    let docs = idem(
        &["docs", "--src", src, "--spec", "openapi.yaml", "--out", out],
        dir,
    );
    assert!(docs.status.success(), "{}", stderr(&docs));
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    Document::parse(path, &text).unwrap().root
}

#[test]
fn merge_without_a_spec_writes_a_valid_document_in_each_format_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let src = orders_source();
    for (file, openapi) in [
        ("openapi.yaml", "3.1"),
        ("openapi.json", "3.1"),
        ("openapi30.yml", "3.0"),
    ] {
        let out = idem(
            &[
                "merge",
                "--src",
                src.to_str().unwrap(),
                "--target",
                "create_order=POST /orders",
                "--out",
                file,
                "--title",
                "Orders",
                "--api-version",
                "2.1.0",
                "--openapi",
                openapi,
                "--identity-header",
                "X-Client-Id",
            ],
            dir.path(),
        );
        assert!(out.status.success(), "{}", stderr(&out));
        // Every field the contract reads is in the body schema: no warnings.
        assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
        let path = dir.path().join(file);
        common::validate(&path);
        let root = read(&path);
        let expected = if openapi == "3.0" { "3.0.3" } else { "3.1.0" };
        assert_eq!(root["openapi"], expected, "{file}");
        assert_eq!(root["info"], json!({"title": "Orders", "version": "2.1.0"}));
        let op = &root["paths"]["/orders"]["post"];
        assert_eq!(op["operationId"], "create_order");
        assert_eq!(op["x-idempotency"]["operation"], "create_order");
        assert_eq!(
            op["x-idempotency"]["client_identity"]["name"],
            "X-Client-Id"
        );
        let body = &op["requestBody"]["content"]["application/json"]["schema"]["properties"];
        for field in ["customer_id", "currency", "amount_minor", "items"] {
            assert!(body[field].is_object(), "{file}: {field} in {body}");
        }
        for status in [
            "2XX", "400", "401", "408", "409", "413", "422", "429", "503",
        ] {
            assert!(op["responses"][status].is_object(), "{file}: {status}");
        }
        let lookup = &root["paths"]["/orders/operations/{key}"]["get"];
        assert_eq!(lookup["parameters"][0]["name"], "key");
        assert_eq!(lookup["parameters"][0]["in"], "path");
        assert_eq!(
            lookup["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/IdemOperationStatus"
        );
    }
    // The YAML file is YAML, the JSON file JSON.
    let yaml = std::fs::read_to_string(dir.path().join("openapi.yaml")).unwrap();
    assert!(yaml.starts_with("openapi: "), "{yaml}");
    let json = std::fs::read_to_string(dir.path().join("openapi.json")).unwrap();
    assert!(json.starts_with("{\n  \"openapi\""), "{json}");
}

#[test]
fn a_new_document_can_be_merged_into_again_and_docs_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = orders_source();
    let src = src.to_str().unwrap();
    let new = [
        "merge",
        "--src",
        src,
        "--target",
        "create_order=POST /orders",
        "--out",
        "openapi.yaml",
    ];
    assert!(idem(&new, dir.path()).status.success());
    let first = std::fs::read(dir.path().join("openapi.yaml")).unwrap();
    // Once written, it is an ordinary document: merging the same contracts into it
    // (by operationId now) changes nothing.
    let again = idem(
        &["merge", "--spec", "openapi.yaml", "--src", src],
        dir.path(),
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(
        std::fs::read(dir.path().join("openapi.yaml")).unwrap(),
        first
    );
    render_docs(dir.path(), src, "site");
    let page = std::fs::read_to_string(dir.path().join("site/operations.md")).unwrap();
    assert!(page.contains("POST /orders"), "{page}");
}

#[test]
fn a_contract_without_a_route_is_refused_with_how_to_name_it_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let src = orders_source();
    let out = idem(
        &[
            "merge",
            "--src",
            src.to_str().unwrap(),
            "--out",
            "openapi.yaml",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let message = stderr(&out);
    assert!(message.contains("api.rs:"), "{message}");
    assert!(
        message.contains("`create_order` has no method and path")
            && message.contains("--target create_order=\"POST /orders\""),
        "{message}"
    );
    assert!(!dir.path().join("openapi.yaml").exists());
}

#[test]
fn new_document_options_are_usage_errors_beside_a_spec_and_out_is_required_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = orders_source();
    let src = src.to_str().unwrap();
    for args in [
        vec!["merge", "--src", src, "--spec", "a.yaml", "--title", "X"],
        vec![
            "merge",
            "--src",
            src,
            "--spec",
            "a.yaml",
            "--openapi",
            "3.0",
        ],
        vec!["merge", "--src", src],
        vec!["merge", "--src", src, "--out", "o.json", "--openapi", "2.0"],
    ] {
        let out = idem(&args, dir.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let missing = idem(&["merge", "--src", src], dir.path());
    assert!(
        stderr(&missing).contains("--out <FILE>"),
        "{}",
        stderr(&missing)
    );
}

/// The README's "your own service": its two publishing commands, on its crate.
#[test]
fn the_readmes_own_service_publishes_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/transfers/src");
    let src = src.to_str().unwrap();
    let merge = idem(
        &[
            "merge",
            "--src",
            src,
            "--target",
            "create_transfer=POST /transfers",
            "--identity-header",
            "x-client-id",
            "--out",
            "openapi.yaml",
            "--title",
            "Transfers",
        ],
        dir.path(),
    );
    assert!(merge.status.success(), "{}", stderr(&merge));
    assert!(!stderr(&merge).contains("warning"), "{}", stderr(&merge));
    common::validate(&dir.path().join("openapi.yaml"));
    render_docs(dir.path(), src, "docs");
    let html = std::fs::read_to_string(dir.path().join("docs/operations.html")).unwrap();
    assert!(
        html.contains("Transfers"),
        "the title comes from info.title"
    );
    let markdown = std::fs::read_to_string(dir.path().join("docs/operations.md")).unwrap();
    assert!(markdown.contains("## POST /transfers"), "{markdown}");
    assert!(
        markdown.contains("x-client-id"),
        "the identity header is documented"
    );
}

#[test]
fn a_route_that_is_not_a_path_template_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/transfers/src");
    for (route, problem) in [
        ("POST /t/{id", "a `{` is not closed"),
        ("POST /t/id}", "a `}` closes no `{`"),
        ("POST /t/{}", "each parameter is a name"),
        ("POST /t/{a}/{a}", "the parameter `a` appears twice"),
        ("POST /t?x=1", "no query"),
    ] {
        let target = format!("create_transfer={route}");
        let out = idem(
            &[
                "merge",
                "--src",
                src.to_str().unwrap(),
                "--target",
                &target,
                "--out",
                "x.json",
            ],
            dir.path(),
        );
        assert_eq!(out.status.code(), Some(1), "{route}: {}", stderr(&out));
        let message = stderr(&out);
        assert!(
            message.contains("main.rs:")
                && message.contains("is not an OpenAPI path template")
                && message.contains(problem),
            "{route}: {message}"
        );
        assert!(!dir.path().join("x.json").exists(), "{route}");
    }
    // A contract's status lookup path is checked the same way.
    let found = contract_at("POST /orders", |c| {
        c["status_lookup"]["path"] = json!("/orders/{id/operations/{key}");
    });
    let errors = NewDocument::new("Orders", "1")
        .build(Path::new("o.json"), &found)
        .unwrap_err();
    assert!(
        errors.0[0].to_string().contains("status lookup path"),
        "{errors:?}"
    );
}
