//! The published contract: the service's OpenAPI document with `create_order`'s contract
//! merged in (`--emit-openapi`), and the consumer docs (`--emit-docs`).
//!
//! The base document, `openapi.yaml` next to this crate's manifest, describes the routes;
//! idem adds the key header, the `x-idempotency` extension and the problem answers from
//! the same `create_order::CONTRACT` that the server enforces.

use std::path::{Path, PathBuf};

use idem::codegen::contracts::{Origin, Sourced};
use idem::codegen::docs::{self, DocFormat, OperationInfo};
use idem::codegen::openapi::{self, Document, Format};
use idem::codegen::{Error, Errors};
use idem::model::Target;
use idem::model::extension::ClientIdentity;

use crate::api::{CLIENT_ID_HEADER, create_order};

/// The base document, as written by hand.
pub const BASE_OPENAPI: &str = include_str!("../openapi.yaml");

/// The title of the consumer docs.
pub const DOCS_TITLE: &str = "Orders API: retrying safely";

/// The service's contracts, each with the operation it describes.
fn contracts() -> Vec<Sourced> {
    vec![Sourced {
        contract: create_order::CONTRACT,
        target: Target::OperationId("create_order".into()),
        origin: Origin {
            file: PathBuf::from(file!()),
            position: None,
            entry: None,
        },
    }]
}

/// The base document with the contracts merged in.
///
/// # Errors
///
/// When the base document or a contract is refused (a bug in this example).
pub fn document() -> Result<Document, Errors> {
    let mut doc = Document::parse(Path::new("openapi.yaml"), BASE_OPENAPI)?;
    // The header the server tells clients apart by (`identity::header` in the service).
    let options =
        openapi::MergeOptions::new().with_client_identity(ClientIdentity::header(CLIENT_ID_HEADER));
    openapi::merge_with(&mut doc, &contracts(), &options)?;
    Ok(doc)
}

/// Writes the OpenAPI document to `path` (creating its folder if missing): JSON when it
/// ends in `.json`, YAML otherwise.
///
/// # Errors
///
/// When the document cannot be built or the file cannot be written.
pub fn write_openapi(path: &Path) -> Result<(), Errors> {
    let mut doc = document()?;
    create_parent(path)?;
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        doc.format = Format::Json {
            indent: Some("  ".into()),
        };
    }
    doc.save(path)?;
    Ok(())
}

fn create_parent(path: &Path) -> Result<(), Errors> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            std::fs::create_dir_all(parent).map_err(|e| {
                Errors(vec![Error::in_file(
                    parent,
                    format!("cannot create the folder: {e}"),
                )])
            })
        }
        _ => Ok(()),
    }
}

/// Writes the consumer docs into `dir` (created if missing): `operations.md` and
/// `operations.html`. Returns the files written.
///
/// # Errors
///
/// When the docs cannot be rendered or the files cannot be written.
pub fn write_docs(dir: &Path) -> Result<Vec<PathBuf>, Errors> {
    let doc = document()?;
    let mut operations = Vec::new();
    for c in contracts() {
        let op =
            openapi::find_operation(&doc, &c.target).map_err(|m| Errors(vec![Error::new(m)]))?;
        operations.push((c.contract, OperationInfo::from_document(&doc, &op)));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        Errors(vec![Error::in_file(
            dir,
            format!("cannot create the folder: {e}"),
        )])
    })?;
    let mut written = Vec::new();
    for format in [DocFormat::Markdown, DocFormat::Html] {
        let text = docs::render(format, DOCS_TITLE, &operations)?;
        let path = dir.join(format.file_name());
        idem::codegen::io::write_atomic(&path, text.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_operation_carries_the_contract() {
        let doc = document().unwrap();
        let op = &doc.root["paths"]["/orders"]["post"];
        let extension = &op["x-idempotency"];
        assert_eq!(extension["operation"], "create_order");
        assert_eq!(extension["ttl"], "1d");
        assert_eq!(
            extension["status_lookup"]["path"],
            "/orders/operations/{key}"
        );
        let parameters = op["parameters"].as_array().unwrap();
        assert!(
            parameters
                .iter()
                .any(|p| p["name"] == "Idempotency-Key" && p["required"] == true)
        );
        for status in ["400", "409", "422", "429", "503"] {
            assert!(op["responses"][status].is_object(), "{status}");
        }
        assert_eq!(
            op["responses"]["422"]["description"]
                .as_str()
                .map(|d| d.contains("invalid-order")),
            Some(true),
            "the service's own description of 422 is kept"
        );
        assert!(doc.root["paths"]["/orders/{id}"]["get"]["x-idempotency"].is_null());
    }
}
