//! `idem merge`.

use idem_codegen::error::{Error, Errors};
use idem_codegen::openapi::{self, Document, NewDocument};

use crate::{MergeArgs, OpenApiArg, gather};

pub(super) fn run(args: MergeArgs) -> Result<(), Errors> {
    // Read every input first, so that the document's problems and the contracts'
    // problems are reported in one run.
    let contracts = gather(&args.inputs);
    // clap requires `--out` without `--spec`.
    let Some(out) = args.out.as_deref().or(args.spec.as_deref()) else {
        return Err(Errors(vec![Error::new("give --spec, --out or both")]));
    };
    let doc = match (&args.spec, &contracts) {
        (Some(spec), _) => Document::load(spec),
        (None, Ok(contracts)) => {
            let mut new = NewDocument::new(&args.title, &args.api_version);
            if args.openapi == OpenApiArg::V3_0 {
                new = new.openapi_3_0();
            }
            Ok(new.build(out, contracts)?)
        }
        // Without a document to read, the contracts' errors are all there is to say.
        (None, Err(e)) => return Err(e.clone()),
    };
    let (mut doc, contracts) = match (doc, contracts) {
        (Ok(doc), Ok(contracts)) => (doc, contracts),
        (doc, contracts) => {
            let mut errors = Vec::new();
            if let Err(e) = doc {
                errors.push(e);
            }
            if let Err(e) = contracts {
                errors.extend(e.0);
            }
            return Err(Errors(errors));
        }
    };
    let mut options = openapi::MergeOptions::new();
    if let Some(identity) = &args.identity_header {
        options = options.with_client_identity(identity.clone());
    }
    let merged = openapi::merge_with(&mut doc, &contracts, &options)?;
    if let Some(schema_out) = &args.schema_out {
        idem_codegen::io::write_atomic(schema_out, crate::source::schema_text().as_bytes())?;
    }
    doc.save(out)?;
    let written = if out == std::path::Path::new("-") {
        "standard output".to_owned()
    } else {
        out.display().to_string()
    };
    eprintln!(
        "merged {} into {written} (OpenAPI {}):",
        idem_codegen::words::count(merged.operations.len() as u64, "contract"),
        doc.version_text
    );
    for (name, op) in &merged.operations {
        let id = op
            .operation_id
            .as_deref()
            .map(|id| format!(" ({id})"))
            .unwrap_or_default();
        eprintln!("  {name} -> {}{id}", op.label());
    }
    // Doubts about a contract do not stop the merge: they are printed after it.
    for warning in &merged.warnings {
        eprintln!("{warning}");
    }
    Ok(())
}
