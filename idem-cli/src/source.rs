//! `idem export`, `idem check` and `idem schema`.

use idem_contract::file::CONTRACTS_FILE_VERSION;
use idem_contract::{ContractEntry, ContractsFile, Target};

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::error::Errors;

use crate::{CheckArgs, ExportArgs, Inputs, SchemaArgs, gather};

pub(super) fn export(args: ExportArgs) -> Result<(), Errors> {
    let inputs = Inputs {
        src: args.src,
        contracts: Vec::new(),
        target: args.target,
    };
    let found = gather(&inputs)?;
    let file = ContractsFile {
        version: CONTRACTS_FILE_VERSION,
        contracts: found
            .iter()
            .map(|s| ContractEntry {
                // The default target is left out, so the file reads like the source.
                target: (s.target != Target::OperationId(s.contract.operation.to_string()))
                    .then(|| s.target.clone()),
                contract: s.contract.clone(),
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&file).expect("a contracts file always serialises");
    text.push('\n');
    idem_codegen::io::write_atomic(&args.out, text.as_bytes())?;
    eprintln!(
        "exported {} to {}",
        idem_codegen::words::count(found.len() as u64, "contract"),
        args.out.display()
    );
    Ok(())
}

pub(super) fn check(args: CheckArgs) -> Result<(), Errors> {
    // clap requires `--src` or `--contracts` (the `inputs` group of `CheckArgs`).
    let scan = idem_codegen::scan::scan(&args.src);
    let mut errors = scan.errors;
    let mut found: Vec<Sourced> = scan
        .contracts
        .into_iter()
        .map(|f| Sourced {
            target: Target::OperationId(f.contract.operation.to_string()),
            contract: f.contract,
            origin: contracts::Origin {
                file: f.file,
                position: Some(f.position),
                entry: None,
            },
        })
        .collect();
    for file in &args.contracts {
        match contracts::from_file(file) {
            Ok(more) => found.extend(more),
            Err(e) => errors.extend(e.0),
        }
    }
    if errors.is_empty() {
        contracts::check_unique(&found)?;
    }
    if !errors.is_empty() {
        return Err(Errors(errors));
    }
    if found.is_empty() {
        eprintln!(
            "warning: no contracts found ({} read); contracts are `#[idem::contract(..)]` attributes on handlers",
            idem_codegen::words::count(scan.files as u64, "Rust file")
        );
    } else {
        eprintln!(
            "checked {} in {}: no contract errors of idem's own; fingerprint fields and the status lookup and reconcile functions are checked by the compiler (`cargo check`)",
            idem_codegen::words::count(found.len() as u64, "contract"),
            idem_codegen::words::count(scan.files as u64, "Rust file")
        );
    }
    Ok(())
}

/// The JSON Schema of `x-idempotency`, pretty-printed, with a final newline.
pub(super) fn schema_text() -> String {
    let mut text =
        serde_json::to_string_pretty(&idem_contract::schema()).expect("a schema always serialises");
    text.push('\n');
    text
}

pub(super) fn schema(args: SchemaArgs) -> Result<(), Errors> {
    let out = args.out.unwrap_or_else(|| "-".into());
    idem_codegen::io::write_atomic(&out, schema_text().as_bytes())?;
    Ok(())
}
