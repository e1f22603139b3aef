//! The `idem` command: merge contracts into an OpenAPI document, render consumer docs,
//! export contracts from source, check contracts for the errors `#[idem::contract]`
//! reports of its own (not those rustc reports on the generated code), and print the
//! JSON Schema of the `x-idempotency` extension.
//!
//! `idem ops` lists, shows and resolves the operations in a service's store, and
//! `idem monday` runs the Monday test against a service on loopback, from its published
//! contract. Those two reach stores and services, so they come with features, as
//! sqlx-cli's drivers do; `check`, `merge`, `docs`, `export` and `schema` are always
//! there, and need none of them:
//!
//! | feature | what it brings | default |
//! |---|---|---|
//! | `sqlite` | `idem ops` and `idem monday --store` on an SQLite file | on |
//! | `postgres` | the same on PostgreSQL (`postgres://…`) | on |
//! | `redis` | the same on Redis (`redis://…`) | on |
//! | `monday` | `idem monday` (the harness of `idem-testing`, an HTTP client) | on |
//! | `ops` | `idem ops` without a driver (only `memory:`); each driver turns it on | on |
//!
//! `cargo install idem-cli --no-default-features` builds the publishing commands alone,
//! in a few minutes; `--features postgres` adds one driver. In a build without them,
//! `idem ops` and `idem monday` still exist and say which feature they need.
//!
//! Exit codes: 0 on success, 1 when an input is refused or a step fails (every problem is
//! printed as `file:line:col: error: message`), 2 for a usage error (clap's convention),
//! and 3 ([`EXIT_OUTCOME_UNKNOWN`]) when `idem ops resolve` sent its resolution to the
//! store and no answer came: it may or may not have been applied.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod docs;
mod merge;
#[cfg(feature = "monday")]
pub mod monday;
#[cfg(not(all(feature = "ops", feature = "monday")))]
mod off;
#[cfg(feature = "ops")]
pub mod ops;
mod source;
#[cfg(any(feature = "ops", feature = "monday"))]
mod store;

#[cfg(not(feature = "monday"))]
use off::monday;
#[cfg(not(feature = "ops"))]
use off::ops;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use idem_contract::Target;

use idem_codegen::contracts::{self, Sourced};
use idem_codegen::error::{Error, Errors};

/// The exit code of `idem ops resolve` when the resolution was sent to the store and no
/// answer came (a timeout after sending, a connection lost while the answer was
/// awaited): it may or may not have been applied, and `idem ops show` tells which.
pub const EXIT_OUTCOME_UNKNOWN: u8 = 3;

/// Why a command did not succeed: what it prints, and its exit code.
#[derive(Debug)]
pub enum Failure {
    /// A refused input, or a step that failed before it changed anything: exit code 1.
    Failed(Errors),
    /// A change was sent to the store and no answer came, so it may or may not have been
    /// made: exit code [`EXIT_OUTCOME_UNKNOWN`].
    OutcomeUnknown(Errors),
}

impl Failure {
    /// What to print, one line (or block) each.
    pub fn errors(&self) -> &Errors {
        match self {
            Failure::Failed(errors) | Failure::OutcomeUnknown(errors) => errors,
        }
    }

    /// The process's exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Failed(_) => 1,
            Failure::OutcomeUnknown(_) => EXIT_OUTCOME_UNKNOWN,
        }
    }
}

impl From<Errors> for Failure {
    fn from(errors: Errors) -> Failure {
        Failure::Failed(errors)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure::Failed(error.into())
    }
}

/// Publish the failure contracts of critical API commands.
///
/// idem reads the `#[idem::contract(..)]` attributes of your axum handlers (or a
/// contracts file exported from them) and publishes them: as the `x-idempotency`
/// extension, key header and problem answers of your OpenAPI document, and as docs that
/// tell API consumers how to retry each operation safely.
#[derive(Debug, Parser)]
#[command(name = "idem", version, max_term_width = 100)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Merge contracts into an OpenAPI 3.0 or 3.1 document (JSON or YAML), or write a
    /// new one.
    ///
    /// Each contracted operation gets the `x-idempotency` extension (all nine
    /// properties), the key header parameter, and the 400, 401, 409, 413, 422, 429 and 503
    /// problem answers with `Retry-After`, and its status lookup (a `get` of the document)
    /// gets its answers; the document's other parts stay as they were, key
    /// order included. A contract describes the operation whose `operationId` is its
    /// handler's name unless `--target` or the contracts file says otherwise. Nothing
    /// is written unless every contract finds its operation.
    ///
    /// Without `--spec`, a new OpenAPI document is written to `--out`, for a service
    /// that has none yet: each contract needs a route then (`--target NAME="POST
    /// /orders"`, or the contracts file's `target`), and gets an operation there.
    ///
    /// Once merged, each contract is compared with its operation, and what does not fit
    /// is printed as a warning (the merge is written all the same): a fingerprint field
    /// or key field that the JSON request body schema lacks, a status lookup path that
    /// is not a `get` operation of the document.
    #[command(
        after_help = "Examples:\n  idem merge --spec openapi.yaml --src src/\n  idem merge --spec openapi.json --contracts contracts.json --out openapi.merged.json\n  idem merge --spec openapi.yaml --src src/ --target create_order=\"POST /orders\" --schema-out x-idempotency.schema.json\n  idem merge --spec webhooks.yaml --src src/ --target on_new_pet='POST webhook newPet'\n  idem merge --src src/ --target create_order=\"POST /orders\" --out openapi.yaml --title Orders"
    )]
    Merge(MergeArgs),
    /// Render consumer docs: Markdown and/or one self-contained HTML file.
    ///
    /// One section per operation: the nine properties in plain words, how to retry it
    /// safely, what each answer means, and a worked request sequence. Writes
    /// `operations.md` and/or `operations.html` into the output folder.
    #[command(
        after_help = "Examples:\n  idem docs --src src/ --out docs/api\n  idem docs --contracts contracts.json --spec openapi.yaml --out site/ --format html --title \"Orders API: safe retries\"\n  idem docs --src src/ --spec webhooks.yaml --target on_new_pet='POST webhook newPet' --out docs/api"
    )]
    Docs(DocsArgs),
    /// Export the contracts of Rust source files as a contracts file (JSON).
    ///
    /// The file is what `idem merge --contracts` and `idem docs --contracts` read, for
    /// builds where the source is not at hand.
    #[command(
        after_help = "Examples:\n  idem export --src src/ --out contracts.json\n  idem export --src src/ --out contracts.json --target on_new_pet='POST webhook newPet'"
    )]
    Export(ExportArgs),
    /// Check contracts for the errors `#[idem::contract]` itself reports.
    ///
    /// Reads the attributes with the macro's own parser and prints every error it
    /// reports (a missing, unknown or repeated property, a bad duration, `ttl` shorter
    /// than `deadline`, a permanent status in `retryable`, …) as
    /// `path:line:col: error: message`, with the messages and positions of a compile,
    /// and exits with 1 if there is any.
    ///
    /// It does not see types, so it cannot stand in for the compiler: a fingerprint
    /// field the request body type does not have, and a status lookup or reconcile
    /// function that does not resolve or has the wrong shape, are reported by rustc on
    /// the code the macro generates (`cargo check`).
    #[command(
        after_help = "Examples:\n  idem check --src src/ --src crates/payments/src/\n  idem check --contracts contracts.json"
    )]
    Check(CheckArgs),
    /// Print the JSON Schema (draft 2020-12) of the `x-idempotency` extension.
    #[command(after_help = "Example:\n  idem schema > x-idempotency.schema.json")]
    Schema(SchemaArgs),
    /// Operate on a running service's store: list operations by state, show one with
    /// all its attempts and resolutions, resolve a parked one (a driver feature:
    /// `sqlite`, `postgres` or `redis`; all on by default).
    #[cfg(feature = "ops")]
    #[command(
        after_help = concat!("Examples:\n  idem ops list --store orders.db --state unknown\n  idem ops show --store orders.db --operation create_order --client acme --key 7f3c\n  idem ops resolve --store orders.db --operation create_order --client acme --key 7f3c --as not-applied --reason \"no order in the ledger\"\n\n", "Every wait for the store is bounded by --timeout (10s by default).\n\nExit codes: 0 done; 1 refused or failed, nothing changed (a read that got no answer included); 2 usage error; 3 `resolve` sent its resolution and no answer came: it may or may not have been applied, `idem ops show` tells.")
    )]
    Ops(ops::OpsArgs),
    /// Operate on a running service's store: not in this build, which has no store
    /// driver (`cargo install idem-cli --features sqlite`, or `postgres`, `redis`).
    #[cfg(not(feature = "ops"))]
    Ops(off::Off),
    /// Run the Monday test against a service on loopback, from the published contract
    /// of one of its operations (feature `monday`, on by default).
    ///
    /// The contract comes from the OpenAPI document's `x-idempotency` (or a contracts
    /// file). The scenarios: the answer lost after the commit, then the same request
    /// with the same key; a 429; a transient 503; a permanent 400; concurrent requests
    /// with one key; a crash after the effect. The service makes them happen when a
    /// request carries `Idem-Test-Fault: answer-429 | answer-503 | answer-400 |
    /// crash-after-effect` (idem does with `IdemBuilder::test_faults()`; a service in any
    /// language can). Business effects are counted before and after each scenario by
    /// `--effects-url` (a number in the body) or `--effects-command` (a number printed).
    /// Prints scenario × proof and exits with 1 when a proof fails. Proof 4 (the trace)
    /// is not checked from outside the service's process; proof 5 is, through the store's
    /// operator calls, with `--store`.
    #[cfg(feature = "monday")]
    #[command(
        after_help = "Examples:\n  idem monday --spec openapi.yaml --operation create_order --base-url http://127.0.0.1:3000 --request-body order.json --client-header x-client-id=monday --effects-url http://127.0.0.1:3000/admin/orders/count\n  idem monday --contracts contracts.json --operation create_order --route \"POST /orders\" --base-url http://127.0.0.1:3000 --request-body '{\"amount\": 1250}' --effects-command \"sqlite3 orders.db 'select count(*) from orders'\" --store orders.db\n  idem monday --spec openapi.yaml --operation create_order --base-url http://127.0.0.1:3000 --request-body order.json --client-header x-tenant=acme --client-header x-client-id=monday --cookie session=abc123 --operation-id-header X-Request-Id --effects-url http://127.0.0.1:3000/admin/stats --effects-pointer /orders"
    )]
    Monday(monday::MondayArgs),
    /// Run the Monday test against a service on loopback: not in this build, which
    /// leaves out the feature `monday` (`cargo install idem-cli --features monday`).
    #[cfg(not(feature = "monday"))]
    Monday(off::Off),
}

/// The features of the command, whether this build has each, and what it brings.
const FEATURES: [(&str, bool, &str); 4] = [
    (
        "sqlite",
        cfg!(feature = "sqlite"),
        "idem ops, idem monday --store: SQLite files",
    ),
    (
        "postgres",
        cfg!(feature = "postgres"),
        "the same on PostgreSQL",
    ),
    ("redis", cfg!(feature = "redis"), "the same on Redis"),
    ("monday", cfg!(feature = "monday"), "idem monday"),
];

/// The top-level help's end: examples, and the features of this build.
fn after_help() -> String {
    let mut text = String::from(
        "Examples:\n  idem check --src src/\n  idem merge --spec openapi.yaml --src src/\n  idem docs --src src/ --out docs/api --format both\n\nRun `idem help <command>` for each command's options and an example.\n\nFeatures of this build (cargo install idem-cli --features NAME; all on by default):\n",
    );
    for (name, on, brings) in FEATURES {
        let state = if on { "on " } else { "off" };
        text.push_str(&format!("  {state}  {name:<9} {brings}\n"));
    }
    text
}

/// The long help of `--target`, shared by `merge`, `docs` and `export`.
const TARGET_HELP: &str = concat!(
    "Describe another operation than the one whose operationId is the handler's name. ",
    "NAME is the handler's name (the contract's operation); TARGET is one of:\n",
    "  - an operationId: `create_order=PostOrders`\n",
    "  - a method and a path of `paths`: `create_order='POST /orders'`\n",
    "  - a method and a webhook name, in an OpenAPI 3.1 document:\n",
    "    `on_new_pet='POST webhook newPet'`, where `newPet` is the webhook's key under\n",
    "    `webhooks` (a webhook has a name, not a path)\n",
    "Quote a TARGET that holds spaces. Repeat for several.",
);

/// Where contracts come from: at least one `--src` or `--contracts`.
#[derive(Debug, Args)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("inputs").args(["src", "contracts"]).required(true).multiple(true)))]
pub struct Inputs {
    /// A Rust file, or a folder searched for `.rs` files (hidden folders and `target/`
    /// are skipped). Repeat for several.
    #[arg(long, value_name = "PATH")]
    pub src: Vec<PathBuf>,
    /// A contracts file written by `idem export`. Repeat for several.
    #[arg(long, value_name = "FILE")]
    pub contracts: Vec<PathBuf>,
    /// Describe another operation than the one whose operationId is the handler's
    /// name. Repeat for several.
    #[arg(long, value_name = "NAME=TARGET", value_parser = parse_target, long_help = TARGET_HELP)]
    pub target: Vec<(String, Target)>,
}

/// `idem merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The OpenAPI document to merge into. Without it, a new OpenAPI document is
    /// written to `--out`: one operation per contract at the route its `--target` names,
    /// and a `get` operation at each status lookup path.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Where to write the merged document, in the input's format (a new document: YAML
    /// for `.yaml` and `.yml`, JSON otherwise); `-` for standard output. By default the
    /// `--spec` document is updated in place.
    #[arg(long, value_name = "FILE", required_unless_present = "spec")]
    pub out: Option<PathBuf>,
    /// The `info.title` of a new document (without `--spec`).
    #[arg(
        long,
        value_name = "TITLE",
        default_value = "API",
        conflicts_with = "spec"
    )]
    pub title: String,
    /// The `info.version` of a new document (without `--spec`): the API's version.
    #[arg(
        long,
        value_name = "VERSION",
        default_value = "0.1.0",
        conflicts_with = "spec"
    )]
    pub api_version: String,
    /// The OpenAPI version of a new document (without `--spec`).
    #[arg(long, value_enum, default_value = "3.1", conflicts_with = "spec")]
    pub openapi: OpenApiArg,
    /// Also write the JSON Schema of `x-idempotency` to this file.
    #[arg(long, value_name = "FILE")]
    pub schema_out: Option<PathBuf>,
    /// The request header that says who the client is (`identity::header(..)` on the
    /// server), published in `x-idempotency` and as a required header of each operation.
    #[arg(long, value_name = "NAME", value_parser = idem_codegen::extension::parse_identity_header)]
    pub identity_header: Option<idem_contract::extension::ClientIdentity>,
    /// The contracts.
    #[command(flatten)]
    pub inputs: Inputs,
}

/// The OpenAPI versions `idem merge` writes a new document in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpenApiArg {
    /// OpenAPI 3.0.3.
    #[value(name = "3.0")]
    V3_0,
    /// OpenAPI 3.1.0.
    #[value(name = "3.1")]
    V3_1,
}

/// The formats of `idem docs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// `operations.md`.
    Markdown,
    /// `operations.html`.
    Html,
    /// Both.
    Both,
}

/// `idem docs`.
#[derive(Debug, Args)]
pub struct DocsArgs {
    /// The folder to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Which docs to write.
    #[arg(long, value_enum, default_value = "both")]
    pub format: FormatArg,
    /// The page title [default: the `--spec` document's `info.title` and ": retrying
    /// safely", or "Retrying these operations safely"].
    #[arg(long, value_name = "TITLE")]
    pub title: Option<String>,
    /// The request header that says who the client is (`identity::header(..)` on the
    /// server); by default the one a merged `--spec` publishes, if any.
    #[arg(long, value_name = "NAME", value_parser = idem_codegen::extension::parse_identity_header)]
    pub identity_header: Option<idem_contract::extension::ClientIdentity>,
    /// An OpenAPI document to take each operation's method, path, summary and success
    /// status from.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// The contracts.
    #[command(flatten)]
    pub inputs: Inputs,
}

/// `idem export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A Rust file, or a folder searched for `.rs` files. Repeat for several.
    #[arg(long, value_name = "PATH", required = true)]
    pub src: Vec<PathBuf>,
    /// The contracts file to write; `-` for standard output.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Record another target than the operationId equal to the handler's name. Repeat
    /// for several.
    #[arg(long, value_name = "NAME=TARGET", value_parser = parse_target, long_help = TARGET_HELP)]
    pub target: Vec<(String, Target)>,
}

/// `idem check`: at least one `--src` or `--contracts`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("inputs").args(["src", "contracts"]).required(true).multiple(true)))]
pub struct CheckArgs {
    /// A Rust file, or a folder searched for `.rs` files. Repeat for several.
    #[arg(long, value_name = "PATH")]
    pub src: Vec<PathBuf>,
    /// A contracts file to check too. Repeat for several.
    #[arg(long, value_name = "FILE")]
    pub contracts: Vec<PathBuf>,
}

/// `idem schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Write to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `OPERATION=TARGET`.
fn parse_target(text: &str) -> Result<(String, Target), String> {
    let (operation, target) = text.split_once('=').ok_or_else(|| {
        format!("`{text}` is not OPERATION=TARGET, such as `create_order=\"POST /orders\"`")
    })?;
    let operation = operation.trim();
    if operation.is_empty() {
        return Err(format!("`{text}` names no operation before `=`"));
    }
    let target = target.trim().parse::<Target>().map_err(|e| e.to_string())?;
    Ok((operation.to_owned(), target))
}

/// Runs the command line of this process and returns its exit code.
pub fn main() -> ExitCode {
    let parsed = Cli::command()
        .after_help(after_help())
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to standard output with 0; usage errors exit with 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    warnings_to_stderr();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            for e in failure.errors().iter() {
                eprintln!("{e}");
            }
            ExitCode::from(failure.exit_code())
        }
    }
}

/// The warnings of idem's runtime (a store skipping a value that is not a record, a
/// reconciler's failure) go to standard error as they happen, one line each, without
/// timestamps: the operator sees what a command passed over.
#[cfg(any(feature = "ops", feature = "monday"))]
fn warnings_to_stderr() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .without_time()
        .with_target(false)
        .try_init();
}

/// Without the store drivers and `monday`, nothing of the runtime logs.
#[cfg(not(any(feature = "ops", feature = "monday")))]
fn warnings_to_stderr() {}

/// Runs a parsed command line.
///
/// # Errors
///
/// Every problem found, and whether what the command sent was applied is unknown
/// ([`Failure::OutcomeUnknown`]) or nothing was changed ([`Failure::Failed`]).
pub fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Merge(args) => Ok(merge::run(args)?),
        Command::Docs(args) => Ok(docs::run(args)?),
        Command::Export(args) => Ok(source::export(args)?),
        Command::Check(args) => Ok(source::check(args)?),
        Command::Schema(args) => Ok(source::schema(args)?),
        Command::Ops(args) => ops::run(args),
        Command::Monday(args) => Ok(monday::run(args)?),
    }
}

/// The contracts of `inputs`, retargeted and checked for duplicate targets; every
/// problem of every input is reported together.
fn gather(inputs: &Inputs) -> Result<Vec<Sourced>, Errors> {
    let mut all = Vec::new();
    let mut errors = Vec::new();
    if !inputs.src.is_empty() {
        match contracts::from_sources(&inputs.src) {
            Ok(found) => all.extend(found),
            Err(e) => errors.extend(e.0),
        }
    }
    for file in &inputs.contracts {
        match contracts::from_file(file) {
            Ok(found) => all.extend(found),
            Err(e) => errors.extend(e.0),
        }
    }
    if !errors.is_empty() {
        return Err(Errors(errors));
    }
    if all.is_empty() {
        let looked: Vec<String> = inputs
            .src
            .iter()
            .chain(&inputs.contracts)
            .map(|p| format!("`{}`", p.display()))
            .collect();
        return Err(Error::new(format!(
            "no contracts found in {}: contracts are `#[idem::contract(..)]` attributes on handlers, or entries of a contracts file",
            idem_codegen::words::list(&looked, "and")
        ))
        .into());
    }
    contracts::retarget(&mut all, &inputs.target)?;
    contracts::check_unique(&all)?;
    Ok(all)
}
