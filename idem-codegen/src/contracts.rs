//! Gathering contracts for a command: from Rust source ([`crate::scan`]) and from
//! contracts files ([`idem_contract::ContractsFile`], as `idem export` writes them), each
//! with the operation it describes and where it came from.

use std::path::{Path, PathBuf};

use idem_contract::file::CONTRACTS_FILE_VERSION;
use idem_contract::{Contract, ContractEntry, ContractsFile, Location, Target};

use crate::error::{Error, Errors, Position, Warning};

/// Where a contract came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The source file or contracts file.
    pub file: PathBuf,
    /// The attribute's position in a source file.
    pub position: Option<Position>,
    /// The entry's index in a contracts file, from 1.
    pub entry: Option<usize>,
}

impl Origin {
    /// `src/orders.rs:12:1` or `contracts.json, contract 2`.
    pub fn label(&self) -> String {
        match (self.position, self.entry) {
            (Some(p), _) => format!("{}:{}:{}", self.file.display(), p.line, p.column),
            (None, Some(n)) => format!("{}, contract {n}", self.file.display()),
            (None, None) => self.file.display().to_string(),
        }
    }

    /// An error about the contract from here.
    pub fn error(&self, message: impl Into<String>) -> Error {
        let message = message.into();
        match (self.position, self.entry) {
            (Some(p), _) => Error::at(&self.file, p.line, p.column, message),
            (None, Some(n)) => Error::in_file(&self.file, format!("contract {n}: {message}")),
            (None, None) => Error::in_file(&self.file, message),
        }
    }

    /// A warning about the contract from here, placed like [`Origin::error`].
    pub fn warning(&self, message: impl Into<String>) -> Warning {
        let e = self.error(message);
        Warning {
            file: e.file,
            position: e.position,
            message: e.message,
        }
    }
}

/// A valid contract, the operation it describes, and where it came from.
#[derive(Clone, Debug)]
pub struct Sourced {
    /// The contract; [`idem_contract::check()`] found nothing wrong with it.
    pub contract: Contract,
    /// The OpenAPI operation it describes.
    pub target: Target,
    /// Where it came from.
    pub origin: Origin,
}

/// The contracts of the Rust files and folders `paths`, each targeting the `operationId`
/// equal to its operation name.
///
/// # Errors
///
/// Every contract error and every file that cannot be read or parsed.
pub fn from_sources(paths: &[PathBuf]) -> Result<Vec<Sourced>, Errors> {
    let scan = crate::scan::scan(paths);
    if !scan.errors.is_empty() {
        return Err(Errors(scan.errors));
    }
    Ok(scan
        .contracts
        .into_iter()
        .map(|found| Sourced {
            target: Target::OperationId(found.contract.operation.to_string()),
            contract: found.contract,
            origin: Origin {
                file: found.file,
                position: Some(found.position),
                entry: None,
            },
        })
        .collect())
}

/// The contracts of the contracts file `path` (JSON).
///
/// # Errors
///
/// The file cannot be read, is not a contracts file (with line and column: an unknown
/// field, a malformed duration), has another version, or holds contracts that break the
/// compile-time rules (every violation is listed).
pub fn from_file(path: &Path) -> Result<Vec<Sourced>, Errors> {
    let text = crate::io::read_text(path)?;
    parse_file(path, &text)
}

/// [`from_file`] on the text of `path`.
///
/// # Errors
///
/// As [`from_file`].
pub fn parse_file(path: &Path, text: &str) -> Result<Vec<Sourced>, Errors> {
    if text.trim().is_empty() {
        return Err(Error::in_file(
            path,
            "the file is empty: expected a contracts file as `idem export` writes it",
        )
        .into());
    }
    let file: ContractsFile =
        serde_json::from_str(text.trim_start_matches('\u{feff}')).map_err(|e| {
            let message = e.to_string();
            let message = message
                .rfind(" at line ")
                .map_or(message.as_str(), |i| &message[..i]);
            Error::at(
                path,
                e.line(),
                e.column(),
                format!("not a contracts file: {message}"),
            )
        })?;
    if file.version != CONTRACTS_FILE_VERSION {
        return Err(Error::in_file(
            path,
            format!("the contracts file has version {}, and this idem reads version {CONTRACTS_FILE_VERSION}", file.version),
        )
        .into());
    }
    let mut errors = Vec::new();
    let mut out = Vec::new();
    for (i, ContractEntry { target, contract }) in file.contracts.into_iter().enumerate() {
        let origin = Origin {
            file: path.to_owned(),
            position: None,
            entry: Some(i + 1),
        };
        let violations = idem_contract::check(&contract);
        if violations.is_empty() {
            out.push(Sourced {
                target: target
                    .unwrap_or_else(|| Target::OperationId(contract.operation.to_string())),
                contract,
                origin,
            });
        } else {
            for v in violations {
                errors.push(origin.error(format!(
                    "`{}`, {}: {}",
                    contract.operation,
                    describe(v.at),
                    v.message
                )));
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(Errors(errors))
    }
}

/// The part of a contract a violation points at, in the file's own vocabulary.
fn describe(at: Location) -> String {
    match at {
        Location::Property(p) => format!("`{p}`"),
        Location::Retryable(i) => format!("`retryable[{i}]`"),
        Location::FingerprintField(i) => format!("`fingerprint.fields[{i}]`"),
        Location::PerAttempt => "`deadline.per_attempt`".into(),
        Location::Operation => "`operation`".into(),
    }
}

/// Applies `--target OPERATION=TARGET` overrides: the contract whose operation name is
/// `OPERATION` describes `TARGET`.
///
/// # Errors
///
/// An override names no contract's operation, or names an operation that several
/// contracts share.
pub fn retarget(contracts: &mut [Sourced], overrides: &[(String, Target)]) -> Result<(), Errors> {
    let mut errors = Vec::new();
    for (operation, target) in overrides {
        let matching: Vec<usize> = (0..contracts.len())
            .filter(|&i| contracts[i].contract.operation == operation.as_str())
            .collect();
        match matching.as_slice() {
            [i] => contracts[*i].target = target.clone(),
            [] => {
                let names: Vec<String> = contracts.iter().map(|c| format!("`{}`", c.contract.operation)).collect();
                errors.push(Error::new(format!(
                    "`--target {operation}={target}`: no contract has the operation `{operation}`; the operations are {}",
                    if names.is_empty() { "none".to_owned() } else { crate::words::list(&names, "and") }
                )));
            }
            _ => errors.push(Error::new(format!(
                "`--target {operation}={target}`: {} contracts have the operation `{operation}`; give each a `target` in a contracts file instead",
                matching.len()
            ))),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Errors(errors))
    }
}

/// Two contracts that describe the same target (before it is resolved in a document).
///
/// # Errors
///
/// One error per duplicate, at the second contract.
pub fn check_unique(contracts: &[Sourced]) -> Result<(), Errors> {
    let mut errors = Vec::new();
    for (i, c) in contracts.iter().enumerate() {
        if let Some(first) = contracts[..i].iter().find(|o| o.target == c.target) {
            errors.push(c.origin.error(format!(
                "`{}` targets `{}`, which `{}` ({}) targets too: an operation has one contract",
                c.contract.operation,
                c.target,
                first.contract.operation,
                first.origin.label()
            )));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Errors(errors))
    }
}
