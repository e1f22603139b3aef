//! `idem merge`, `idem check`, `idem docs`, `idem export` and `idem schema` from the
//! command line: what they print, write and refuse, and the parity of `idem check` with
//! the macro's parser. What merging itself keeps and adds is tested in `idem-codegen`.

mod common;

use std::path::Path;

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::openapi::{self, Document};
use serde_json::json;

use common::{assert_schema_valid, fixture, idem, schema_errors, stderr};

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
    let html = std::fs::read_to_string(out.join("operations.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // Without `--title`, the document's `info.title` names the page.
    assert!(
        md.starts_with("# Swagger Petstore: retrying safely\n"),
        "{md}"
    );
    assert!(html.contains("<title>Swagger Petstore: retrying safely</title>"));
}

/// `idem merge --identity-header` publishes the header; `idem docs` on the merged
/// document reads it from there, and `--title` still wins.
#[test]
fn the_identity_header_goes_from_merge_to_docs() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("orders.yaml");
    std::fs::copy(fixture("orders/openapi.yaml"), &spec).unwrap();
    let api = fixture("orders/api.rs");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--src".into(),
            api.to_str().unwrap().into(),
            "--target".into(),
            "create_order=createOrder".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let merge: Vec<String> = [
        "merge",
        "--spec",
        spec.to_str().unwrap(),
        "--identity-header",
        "X-Caller",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(args(&[]))
    .collect();
    let run = idem(
        &merge.iter().map(String::as_str).collect::<Vec<_>>(),
        dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let merged = Document::load(&spec).unwrap();
    let op = &merged.root["paths"]["/orders"]["post"];
    assert_eq!(op["x-idempotency"]["client_identity"]["name"], "X-Caller");
    assert!(
        op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "X-Caller" && p["required"] == true)
    );
    common::validate(&spec);

    let out = dir.path().join("docs");
    let docs: Vec<String> = [
        "docs",
        "--spec",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--format",
        "markdown",
        "--title",
        "Orders for partners",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(args(&[]))
    .collect();
    let run = idem(
        &docs.iter().map(String::as_str).collect::<Vec<_>>(),
        dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let md = std::fs::read_to_string(out.join("operations.md")).unwrap();
    assert!(md.starts_with("# Orders for partners\n"), "{md}");
    assert!(
        md.contains("The server knows which client you are from the `X-Caller` header"),
        "{md}"
    );
    assert!(md.contains("X-Caller: <your X-Caller>"), "{md}");

    let bad = idem(
        &[
            "merge",
            "--spec",
            spec.to_str().unwrap(),
            "--identity-header",
            "X Caller",
            "--src",
            api.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("is not a header name"),
        "{}",
        stderr(&bad)
    );
}

/// The extension is an instance of the schema `idem schema` prints; the old form, which
/// named the server's functions, is not.
#[test]
fn the_extension_fits_its_published_schema() {
    let dir = tempfile::tempdir().unwrap();
    let run = idem(&["schema"], dir.path());
    assert!(run.status.success(), "{}", stderr(&run));
    let schema: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let mut doc = orders_doc();
    openapi::merge(&mut doc, &orders_contract(|_| {})).unwrap();
    let ext = doc.root["paths"]["/orders"]["post"]["x-idempotency"].clone();
    assert_schema_valid(&schema, &ext);
    let mut old = ext.clone();
    old["status_lookup"]["handler"] = "order_operation_status".into();
    old["recovery"]["function"] = "reconcile_create_order".into();
    if let Some(errors) = schema_errors(&schema, &old) {
        assert!(
            errors.contains("handler") && errors.contains("function"),
            "the schema takes the server's function names: {errors:?}"
        );
    }
}
