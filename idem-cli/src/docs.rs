//! `idem docs`.

use idem_codegen::docs::{self, DocFormat, OperationInfo};
use idem_codegen::error::{Error, Errors};
use idem_codegen::openapi::{Document, find_operation};

use crate::{DocsArgs, FormatArg, gather};

pub(super) fn run(args: DocsArgs) -> Result<(), Errors> {
    let contracts = gather(&args.inputs)?;
    let doc = args.spec.as_deref().map(Document::load).transpose()?;
    let mut operations = Vec::new();
    let mut errors = Vec::new();
    for c in contracts {
        let info = match &doc {
            Some(doc) => match find_operation(doc, &c.target) {
                Ok(op) => OperationInfo::from_document(doc, &op),
                Err(message) => {
                    errors.push(idem_codegen::openapi::unmatched(&c, doc, &message));
                    continue;
                }
            },
            None => OperationInfo::from_target(&c.target),
        };
        let info = match &args.identity_header {
            Some(identity) => info.with_identity(identity.clone()),
            None => info,
        };
        operations.push((c.contract, info));
    }
    if !errors.is_empty() {
        return Err(Errors(errors));
    }
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| docs::default_title(doc.as_ref()));
    let formats: &[DocFormat] = match args.format {
        FormatArg::Markdown => &[DocFormat::Markdown],
        FormatArg::Html => &[DocFormat::Html],
        FormatArg::Both => &[DocFormat::Markdown, DocFormat::Html],
    };
    let rendered = formats
        .iter()
        .map(|f| docs::render(*f, &title, &operations).map(|text| (*f, text)))
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Error::in_file(&args.out, format!("cannot create the folder: {e}")))?;
    for (format, text) in rendered {
        let path = args.out.join(format.file_name());
        idem_codegen::io::write_atomic(&path, text.as_bytes())?;
        eprintln!(
            "wrote {} ({})",
            path.display(),
            idem_codegen::words::count(operations.len() as u64, "operation")
        );
    }
    Ok(())
}
