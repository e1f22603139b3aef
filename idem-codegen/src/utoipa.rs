//! Contracts merged into the OpenAPI document a service builds with
//! [utoipa](https://docs.rs/utoipa), so that the `/openapi.json` it serves carries
//! `x-idempotency`, the key header and idem's answers, with no file and no command:
//! build the document once at start-up and serve the JSON [`merge`] returns.
//!
//! Each contract describes the operation whose `operationId` is its handler's name,
//! which is what `#[utoipa::path]` writes unless told otherwise (`operation_id = ..`).
//! The merge is the one `idem merge` does ([`crate::openapi::merge_with`]): the
//! document's own parts win, the same contracts merged twice change nothing, and what
//! does not fit is returned as warnings.
//!
//! ```
//! use idem_codegen::openapi::MergeOptions;
//! use utoipa::OpenApi;
//!
//! #[derive(serde::Deserialize, utoipa::ToSchema)]
//! struct CreateOrder { customer_id: String, amount_minor: i64 }
//!
//! /// Create an order.
//! #[utoipa::path(post, path = "/orders", request_body = CreateOrder,
//!     responses((status = 201, description = "Created")))]
//! async fn create_order() {}
//!
//! #[derive(OpenApi)]
//! #[openapi(paths(create_order))]
//! struct ApiDoc;
//!
//! // In a service, the contract is the const the macro emits: `&create_order::CONTRACT`.
//! let contract: idem_contract::Contract = serde_json::from_str(r#"{
//!   "operation": "create_order",
//!   "key_scope": {"per": "client", "source": {"in": "header", "name": "Idempotency-Key"}},
//!   "fingerprint": {"fields": ["customer_id", "amount_minor"]},
//!   "ttl": "24h", "deadline": {"total": "30s"}, "max_attempts": 4,
//!   "retryable": [429, 503, "timeout"],
//!   "concurrency": {"response": "conflict", "retry_after": "1s"},
//!   "status_lookup": {"handler": "order_status"},
//!   "recovery": {"kind": "manual", "runbook": "https://runbooks.example.com/orders"}}"#)?;
//!
//! let merged = idem_codegen::utoipa::merge(&ApiDoc::openapi(), [&contract], &MergeOptions::new())?;
//! assert!(merged.warnings.is_empty());
//! // Serve `axum::Json(merged.document)` at `/openapi.json`.
//! let op = &merged.document["paths"]["/orders"]["post"];
//! assert_eq!(op["x-idempotency"]["max_attempts"], 4);
//! assert_eq!(op["parameters"][0]["name"], "Idempotency-Key");
//! assert!(op["responses"]["409"].is_object());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::PathBuf;

use serde_json::Value;
use utoipa::openapi::OpenApi;

use idem_contract::{Contract, Target};

use crate::contracts::{Origin, Sourced};
use crate::error::{Error, Errors, Warning};
use crate::openapi::{self, Document, MergeOptions, Operation};

/// The name errors give the document, which has no file.
pub const DOCUMENT: &str = "the utoipa OpenApi document";

/// What [`merge`] made: the document to serve, and what the merge reported.
#[derive(Clone, Debug)]
pub struct Merged {
    /// The document with the contracts merged in, as the JSON to serve at
    /// `/openapi.json` (`axum::Json(merged.document)`).
    ///
    /// It is JSON rather than utoipa's `OpenApi` because utoipa cannot read back every
    /// document it writes: a schema without `type` (what it writes for a
    /// `serde_json::Value` field, and what idem's status lookup schema uses for a stored
    /// body that may be any JSON) does not deserialise
    /// ([juhaku/utoipa#1192](https://github.com/juhaku/utoipa/issues/1192)). Swagger UI
    /// and other viewers take the JSON as it is.
    pub document: Value,
    /// `(operation name, operation)` pairs, in the order of the contracts.
    pub operations: Vec<(String, Operation)>,
    /// Contracts that do not fit their operation (a fingerprint field the request body
    /// schema lacks, a status lookup path that is not a `get` of the document). The
    /// merge is done all the same; log them, or fail a test on them.
    pub warnings: Vec<Warning>,
}

/// Merges `contracts` into the document `openapi` describes, each into the operation
/// whose `operationId` is its handler's name (the contract's `operation`).
///
/// # Errors
///
/// Every problem at once, as [`openapi::merge_with`] reports them (a contract whose
/// operation is not in the document, two contracts on one operation, a component of
/// idem's name that idem did not write), each named by its contract and [`DOCUMENT`]
/// in place of files; and a document that is not OpenAPI 3.0 or 3.1.
pub fn merge<'a>(
    openapi: &OpenApi,
    contracts: impl IntoIterator<Item = &'a Contract>,
    options: &MergeOptions,
) -> Result<Merged, Errors> {
    let path = PathBuf::from(DOCUMENT);
    let text = serde_json::to_string(openapi).map_err(|e| {
        Errors(vec![Error::in_file(
            &path,
            format!("utoipa's document does not serialise: {e}"),
        )])
    })?;
    let mut doc = Document::parse(&path, &text).map_err(|e| Errors(vec![e]))?;
    let sourced: Vec<Sourced> = contracts
        .into_iter()
        .map(|contract| Sourced {
            contract: contract.clone(),
            target: Target::OperationId(contract.operation.to_string()),
            origin: Origin {
                file: PathBuf::from(format!("the contract of `{}`", contract.operation)),
                position: None,
                entry: None,
            },
        })
        .collect();
    let report = openapi::merge_with(&mut doc, &sourced, options)?;
    Ok(Merged {
        document: doc.root,
        operations: report.operations,
        warnings: report.warnings,
    })
}
