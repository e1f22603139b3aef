//! Snapshots of what consumers read: the additions of one contract to an OpenAPI
//! operation, and the Markdown and HTML docs (reviewed as a consumer reads them; insta
//! fails on any change until the new snapshot is accepted).

mod common;

use idem_codegen::docs::{self, DocFormat, OperationInfo};
use idem_codegen::openapi::{self, Document, find_operation};
use idem_codegen::{contracts, scan};

use common::{data_dir, fixture};

/// The pet store contracts from the source fixtures, with their operations in the
/// pet store document (`new_pet` documented by its target alone).
fn pet_store() -> (Document, Vec<contracts::Sourced>) {
    let doc = Document::load(&data_dir().join("petstore-expanded.3.0.yaml")).unwrap();
    let mut found =
        contracts::from_sources(&[fixture("src/pets.rs"), fixture("src/webhooks.rs")]).unwrap();
    contracts::retarget(
        &mut found,
        &[("addPet".into(), "POST /pets".parse().unwrap())],
    )
    .unwrap();
    (doc, found)
}

#[test]
fn extension_of_one_contract() {
    let (mut doc, found) = pet_store();
    let add_pet: Vec<_> = found
        .into_iter()
        .filter(|s| s.contract.operation == "addPet")
        .collect();
    openapi::merge(&mut doc, &add_pet).unwrap();
    insta::assert_json_snapshot!("post_pets_operation", doc.root["paths"]["/pets"]["post"]);
    insta::assert_json_snapshot!("components", doc.root["components"]);
}

fn rendered(format: DocFormat) -> String {
    let (doc, found) = pet_store();
    let operations: Vec<_> = found
        .into_iter()
        .map(|s| {
            let info = match find_operation(&doc, &s.target) {
                Ok(op) => OperationInfo::from_document(&doc, &op),
                Err(_) => OperationInfo::from_target(&"POST webhook newPet".parse().unwrap()),
            };
            (s.contract, info)
        })
        .collect();
    docs::render(format, "Pet store: retrying safely", &operations).unwrap()
}

#[test]
fn markdown_docs() {
    insta::assert_snapshot!("operations_md", rendered(DocFormat::Markdown));
}

#[test]
fn html_docs() {
    let html = rendered(DocFormat::Html);
    // One self-contained file: no external scripts, styles, fonts or images.
    for external in ["<script", "<link", "src=", "@import", "url("] {
        assert!(!html.contains(external), "the HTML refers to `{external}`");
    }
    insta::assert_snapshot!("operations_html", html);
}

#[test]
fn html_escapes_every_value() {
    // A contract from a file can hold any text: it must come out as text, not markup.
    let file = std::fs::read_to_string(fixture("stripe.contracts.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&file).unwrap();
    let c = &mut v["contracts"][3]["contract"];
    c["operation"] = "<script>alert(1)</script>".into();
    c["recovery"]["runbook"] = "javascript:alert(2)".into();
    c["fingerprint"] = serde_json::json!({ "fields": ["a<b>", "x&y"] });
    let found = contracts::parse_file(std::path::Path::new("c.json"), &v.to_string()).unwrap();
    let ops: Vec<_> = found
        .into_iter()
        .map(|s| (s.contract, OperationInfo::default()))
        .collect();
    let html = docs::render(DocFormat::Html, "T <i>", &ops).unwrap();
    assert!(
        !html.contains("<script>alert(1)"),
        "unescaped operation name"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"));
    assert!(
        !html.contains("href=\"javascript:"),
        "a javascript: URL became a link"
    );
    assert!(html.contains("<code>a&lt;b&gt;</code>"));
    assert!(html.contains("<title>T &lt;i&gt;</title>"));
    let md = docs::render(DocFormat::Markdown, "T", &ops).unwrap();
    assert!(
        md.contains("`javascript:alert(2)`"),
        "a javascript: URL is code in Markdown"
    );
}

#[test]
fn scan_reports_positions_like_the_compiler() {
    let scan = scan::scan(&[fixture("src")]);
    assert!(scan.errors.is_empty(), "{:?}", scan.errors);
    let positions: Vec<_> = scan
        .contracts
        .iter()
        .map(|f| {
            (
                f.contract.operation.to_string(),
                f.position.line,
                f.position.column,
            )
        })
        .collect();
    assert_eq!(
        positions,
        [("addPet".to_owned(), 8, 1), ("new_pet".to_owned(), 7, 1)]
    );
}
