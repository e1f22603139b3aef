//! `idem monday`: the Monday test (docs/conformance.md) against any service on loopback,
//! written in Rust or not (feature `monday`, on by default).
//!
//! The contract of one operation comes from a published OpenAPI document (its
//! `x-idempotency`) or a contracts file; the scenarios go to a base URL on loopback
//! through idem's harness (the `idem-testing` crate), business effects are counted by a
//! URL or a command the user gives, and the report is the harness's table. Proof 4 (the
//! trace) is not checked from outside the service's process, and says why; proof 5 is
//! checked through the store's operator calls when `--store` names the service's store.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use idem_contract::extension::{ClientIdentity, Extension};
use idem_contract::{KeyScope, KeySource, Target};
use idem_testing::{Evidence, Harness, OperatorCheck, Request, Verdict};
use serde_json::Value;

use crate::store::{StoreArgs, open};
use idem_codegen::error::{Error, Errors};

mod count;
mod input;

/// The largest spec, contracts file or request body read, in bytes.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// `idem monday`.
#[derive(Debug, Args)]
pub struct MondayArgs {
    /// The service's published OpenAPI document (JSON or YAML): the operation's contract
    /// is its `x-idempotency`, its route the operation's method and path.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "contracts",
        required_unless_present = "contracts"
    )]
    pub spec: Option<PathBuf>,
    /// A contracts file (`idem export`) that holds the operation's contract.
    #[arg(long, value_name = "FILE")]
    pub contracts: Option<PathBuf>,
    /// The operation: its `operationId` or its method and path (`POST /orders`) in the
    /// document; its contract's name in a contracts file.
    #[arg(long, value_name = "NAME")]
    pub operation: String,
    /// The service: `http://` on loopback (127.0.0.1, ::1 or localhost) only, since the
    /// scenarios make it fail on purpose.
    #[arg(long, value_name = "URL")]
    pub base_url: String,
    /// The method and path to send the request to (`POST /orders`), when the document's
    /// path has parameters or the contracts file names no route.
    #[arg(long, value_name = "ROUTE")]
    pub route: Option<String>,
    /// The request body, sent as `application/json`: a file, `-` for standard input, or
    /// a JSON literal (`{"amount": 1250}`).
    #[arg(long, value_name = "FILE|-|JSON")]
    pub request_body: Option<String>,
    /// A header that says who the client is, sent with every request and status lookup:
    /// `NAME=VALUE`; repeat it for each header (a tenant and a client, say). The
    /// contract's client identity header must be one of them.
    #[arg(long, value_name = "NAME=VALUE")]
    pub client_header: Vec<String>,
    /// A cookie sent with every request and status lookup (a session the service scopes
    /// its keys to): `NAME=VALUE`; repeat it for each cookie. Cookies the service sets on
    /// any answer are kept for the rest of the run too, whatever their path or port.
    #[arg(long, value_name = "NAME=VALUE")]
    pub cookie: Vec<String>,
    /// The answer header that names the operation an answer belongs to: proof 2 links the
    /// repeat to the first attempt by it.
    #[arg(long, value_name = "NAME", default_value = "Operation-Id")]
    pub operation_id_header: String,
    /// Counts the business effects: `GET URL` answers a number (the rows of the orders
    /// table, say), or JSON holding it (see `--effects-pointer`).
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "effects_command",
        required_unless_present = "effects_command"
    )]
    pub effects_url: Option<String>,
    /// Where the count is in the JSON that `--effects-url` answers: a JSON pointer
    /// (RFC 6901), `/orders` for `{"orders": 12}`, `/stats/orders` for a nested member.
    #[arg(long, value_name = "POINTER", requires = "effects_url")]
    pub effects_pointer: Option<String>,
    /// Counts the business effects: a shell command (`sh -c`) that prints a number.
    #[arg(long, value_name = "COMMAND")]
    pub effects_command: Option<String>,
    /// The status lookup's path, with `{key}` where the key goes; by default the one the
    /// contract publishes.
    #[arg(long, value_name = "PATH")]
    pub status_lookup: Option<String>,
    /// The service's store (an SQLite file, `postgres://…` or `redis://…`, as `idem ops`
    /// takes it), for proof 5: the operation read and, parked, resolved through the
    /// store's operator calls. Without it proof 5 is not checked.
    #[arg(long, value_name = "STORE")]
    pub store: Option<String>,
    /// The Redis store's prefix (`RedisStore::with_prefix`).
    #[arg(long, value_name = "PREFIX", default_value = "idem")]
    pub redis_prefix: String,
    /// The operation's name in the store (the contract's name on the server), when it
    /// is not the name the document publishes.
    #[arg(long, value_name = "NAME")]
    pub store_operation: Option<String>,
    /// The client's identity in the store, when it is not the client header's value.
    #[arg(long, value_name = "ID")]
    pub client_identity: Option<String>,
    /// How long the crash scenario waits for recovery (keep it above the service's
    /// lease): `10s`, `2500ms`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub recovery_within: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("`{text}` is not a duration: {e}"))
}

/// What the command needs of the contract.
struct Operation {
    /// The name the store keeps its records under.
    name: String,
    method: http::Method,
    /// `None` when a contracts file names no route.
    path: Option<String>,
    key_header: String,
    status_lookup: Option<String>,
    /// The client identity header the contract publishes, if any.
    identity_header: Option<String>,
}

/// Runs `idem monday`: the report on standard output; an error when an input is
/// refused, the service cannot be reached, or a proof failed.
///
/// # Errors
///
/// As above; nothing is printed but the report and the error.
pub fn run(args: MondayArgs) -> Result<(), Errors> {
    let operation = contract(&args)?;
    let (method, path) = route(&args, &operation)?;
    let shown = format!("{method} {path}");
    let harness = harness(&args, &operation, method, path)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::new(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(run_harness(&args, &operation, harness, &shown))
}

/// The operation's contract, from `--spec` or `--contracts`.
fn contract(args: &MondayArgs) -> Result<Operation, Errors> {
    Ok(match (&args.spec, &args.contracts) {
        (Some(spec), _) => from_spec(spec, &args.operation)?,
        (None, Some(file)) => from_contracts(file, &args.operation)?,
        (None, None) => {
            return Err(
                Error::new("give the contract: `--spec FILE` or `--contracts FILE`").into(),
            );
        }
    })
}

/// Where the request goes: `--route`, or the operation's own method and path.
fn route(args: &MondayArgs, operation: &Operation) -> Result<(http::Method, String), Errors> {
    Ok(match (&args.route, &operation.path) {
        (Some(route), _) => parse_route(route)?,
        (None, None) => {
            return Err(Error::new(format!(
                "the contracts file names no route for `{}`: give it with `--route \"POST /…\"`",
                args.operation
            ))
            .into());
        }
        (None, Some(path)) if path.contains('{') => {
            return Err(Error::new(format!(
                "the path `{path}` of `{}` has parameters: give the path to send to with `--route \"{} /…\"`",
                args.operation, operation.method
            ))
            .into());
        }
        (None, Some(path)) => (operation.method.clone(), path.clone()),
    })
}

/// The harness for the request, its client, its status lookup and its effect counter
/// (proof 5's check is added once the store is open, in the runtime).
fn harness(
    args: &MondayArgs,
    operation: &Operation,
    method: http::Method,
    path: String,
) -> Result<Harness, Errors> {
    let body = match &args.request_body {
        Some(body) => read_body(body)?,
        None => Vec::new(),
    };
    let client = Client::from_args(args, operation)?;
    let mut request = Request::new(method, path);
    if !body.is_empty() {
        request = request
            .with_header("content-type", "application/json")
            .with_body(body);
    }
    let mut harness = Harness::for_url(&args.base_url)
        .map_err(|e| Error::new(e.to_string()))?
        .request(request)
        .key_header(operation.key_header.clone())
        .operation_id_header(client.operation_id_header.clone())
        .recovery_within(args.recovery_within)
        .check_trace(|evidence: Evidence| async move {
            Verdict::NotChecked(format!(
                "idem monday runs outside the service: its spans are in its own process (find the idem.attempt spans under {} in your tracing backend, or run the harness in-process with TraceCapture)",
                evidence
                    .operation_id()
                    .map_or_else(|| "its operation id".into(), |id| format!("operation {id}"))
            ))
        });
    if let Some(lookup) = args
        .status_lookup
        .clone()
        .or(operation.status_lookup.clone())
    {
        harness = harness.status_lookup(lookup);
    }
    for (name, value) in client.headers {
        harness = harness.client_header(name, value);
    }
    for (name, value) in client.cookies {
        harness = harness.cookie(name, value);
    }
    harness = match (&args.effects_url, &args.effects_command) {
        (Some(url), _) => count::by_url(harness, url, client.pointer)?,
        (None, Some(command)) => count::by_command(harness, command)?,
        (None, None) => {
            return Err(Error::new(
                "give a way to count business effects: `--effects-url URL` or `--effects-command COMMAND`",
            )
            .into());
        }
    };
    Ok(harness)
}

/// What the options say of the client and of reading the answers, every one checked
/// (all their errors reported together).
struct Client {
    /// The client headers, the contract's identity header first (its value is the
    /// identity proof 5 looks the record up under).
    headers: Vec<(String, String)>,
    cookies: Vec<(String, String)>,
    operation_id_header: String,
    pointer: Option<String>,
}

impl Client {
    fn from_args(args: &MondayArgs, operation: &Operation) -> Result<Client, Errors> {
        let headers = input::client_headers(&args.client_header, &operation.key_header);
        let cookies = input::cookies(&args.cookie);
        let operation_id_header = input::operation_id_header(&args.operation_id_header);
        let pointer = args
            .effects_pointer
            .as_deref()
            .map(input::pointer)
            .transpose();
        let (headers, cookies, operation_id_header, pointer) =
            match (headers, cookies, operation_id_header, pointer) {
                (Ok(h), Ok(c), Ok(o), Ok(p)) => (h, c, o, p),
                (h, c, o, p) => {
                    let mut all = Vec::new();
                    for errors in [h.err(), c.err(), o.err(), p.err()].into_iter().flatten() {
                        all.extend(errors.0);
                    }
                    return Err(Errors(all));
                }
            };
        Ok(Client {
            headers: identity_first(headers, operation.identity_header.as_deref())?,
            cookies,
            operation_id_header,
            pointer,
        })
    }
}

/// `headers` with the contract's identity header (`name`) first; an error without it.
fn identity_first(
    mut headers: Vec<(String, String)>,
    name: Option<&str>,
) -> Result<Vec<(String, String)>, Errors> {
    let Some(name) = name else {
        return Ok(headers);
    };
    let Some(at) = headers
        .iter()
        .position(|(n, _)| n.eq_ignore_ascii_case(name))
    else {
        return Err(Error::new(format!(
            "the contract says the client is named by the header `{name}`: give `--client-header {name}=VALUE`"
        ))
        .into());
    };
    let identity = headers.remove(at);
    headers.insert(0, identity);
    Ok(headers)
}

/// Plugs in proof 5's check (through `--store`, or not checked), runs the harness and
/// prints its report; an error naming the failed proofs.
async fn run_harness(
    args: &MondayArgs,
    operation: &Operation,
    mut harness: Harness,
    shown: &str,
) -> Result<(), Errors> {
    if let Some(store) = &args.store {
        let store = open(&StoreArgs {
            store: store.clone(),
            redis_prefix: args.redis_prefix.clone(),
            timeout: crate::store::DEFAULT_TIMEOUT,
        })
        .await?;
        let name = args
            .store_operation
            .clone()
            .unwrap_or(operation.name.clone());
        let mut check = OperatorCheck::new(store, name);
        if let Some(identity) = &args.client_identity {
            check = check.client(identity.clone());
        }
        harness = harness.check_operator(check.check());
    } else {
        harness = harness.check_operator(|_: Evidence| async {
                Verdict::NotChecked(
                    "no --store: give the service's store (an SQLite file, postgres://…, redis://…) to read and restore the operation through idem ops' calls".into(),
                )
            });
    }
    let report = harness.run().await.map_err(|e| Error::new(e.to_string()))?;
    println!(
        "idem monday: the Monday test against {shown} at {}\n",
        args.base_url
    );
    println!("{report}");
    let failed = report.failures();
    if failed.is_empty() {
        return Ok(());
    }
    let mut names = String::new();
    for (scenario, proof) in &failed {
        let _ = write!(names, "\n  {}: {}", scenario.name(), proof.name());
    }
    Err(Error::new(format!("{} proof(s) failed:{names}", failed.len())).into())
}

/// The contract and route of `name` in the OpenAPI document `file`.
fn from_spec(file: &Path, name: &str) -> Result<Operation, Errors> {
    let text = read_text(file)?;
    let root: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text)
            .map_err(|e| Error::in_file(file, format!("not a JSON document: {e}")))?
    } else {
        yaml_serde::from_str(&text)
            .map_err(|e| Error::in_file(file, format!("not a JSON or YAML document: {e}")))?
    };
    let Some(paths) = root.get("paths").and_then(Value::as_object) else {
        return Err(Error::in_file(file, "the document has no `paths`").into());
    };
    let mut contracted = Vec::new();
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for (method, op) in item {
            let Ok(parsed) = http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            else {
                continue;
            };
            let label = format!("{parsed} {path}");
            let id = op.get("operationId").and_then(Value::as_str);
            let named = id == Some(name) || label.eq_ignore_ascii_case(name.trim());
            let Some(extension) = op.get("x-idempotency") else {
                if named {
                    return Err(Error::in_file(
                        file,
                        format!("`{name}` has no `x-idempotency` extension: the document publishes no idempotency contract for it"),
                    )
                    .into());
                }
                continue;
            };
            if !named {
                contracted.push(format!("`{}`", id.map_or(label, str::to_owned)));
                continue;
            }
            let extension: Extension = serde_json::from_value(extension.clone()).map_err(|e| {
                Error::in_file(
                    file,
                    format!("the `x-idempotency` of `{name}` is not valid: {e}"),
                )
            })?;
            return Ok(Operation {
                name: extension.operation.clone(),
                method: parsed,
                path: Some(path.clone()),
                key_header: key_header(&extension.key_scope, name)?,
                status_lookup: extension.status_lookup.path.clone(),
                identity_header: extension
                    .client_identity
                    .as_ref()
                    .and_then(ClientIdentity::header_name)
                    .map(str::to_owned),
            });
        }
    }
    Err(Error::in_file(
        file,
        format!(
            "the document has no operation `{name}`; those with a contract are {}",
            if contracted.is_empty() {
                "none".into()
            } else {
                contracted.join(", ")
            }
        ),
    )
    .into())
}

/// The contract of `name` in the contracts file `file`.
fn from_contracts(file: &Path, name: &str) -> Result<Operation, Errors> {
    let all = idem_codegen::contracts::from_file(file)?;
    let Some(found) = all.iter().find(|s| s.contract.operation == name) else {
        let names: Vec<String> = all
            .iter()
            .map(|s| format!("`{}`", s.contract.operation))
            .collect();
        return Err(Error::in_file(
            file,
            format!(
                "no contract is named `{name}`; the file holds {}",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            ),
        )
        .into());
    };
    let (method, path) = match &found.target {
        Target::Path { method, path } => (
            http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|_| Error::in_file(file, format!("`{method}` is not a method")))?,
            Some(path.clone()),
        ),
        // No route in the file: `--route` gives it.
        _ => (http::Method::POST, None),
    };
    Ok(Operation {
        name: found.contract.operation.to_string(),
        method,
        path,
        key_header: key_header(&found.contract.key_scope, name)?,
        status_lookup: found
            .contract
            .status_lookup
            .path
            .as_deref()
            .map(str::to_owned),
        identity_header: None,
    })
}

fn key_header(scope: &KeyScope, name: &str) -> Result<String, Errors> {
    match &scope.source {
        KeySource::Header { name } => Ok(name.to_string()),
        KeySource::Body { field } => Err(Error::new(format!(
            "the key of `{name}` is the body field `{field}`: idem monday sends the key in a header only"
        ))
        .into()),
    }
}

/// `POST /orders`.
fn parse_route(route: &str) -> Result<(http::Method, String), Errors> {
    let bad = || {
        Error::new(format!(
            "`--route {route}` is not a method and a path: write `--route \"POST /orders\"`"
        ))
    };
    let (method, path) = route.trim().split_once(' ').ok_or_else(bad)?;
    let method =
        http::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| bad())?;
    let path = path.trim();
    if !path.starts_with('/') {
        return Err(bad().into());
    }
    Ok((method, path.to_owned()))
}

fn read_text(file: &Path) -> Result<String, Errors> {
    let bytes = read_file(file)?;
    String::from_utf8(bytes).map_err(|_| Error::in_file(file, "not UTF-8 text").into())
}

fn read_file(file: &Path) -> Result<Vec<u8>, Errors> {
    let mut out = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut out))
        .map_err(|e| Error::in_file(file, format!("cannot read it: {e}")))?;
    if out.len() as u64 > MAX_FILE {
        return Err(Error::in_file(file, format!("larger than {MAX_FILE} bytes")).into());
    }
    Ok(out)
}

/// `--request-body`: a JSON literal, `-` (standard input) or a file; checked as JSON.
fn read_body(arg: &str) -> Result<Vec<u8>, Errors> {
    let trimmed = arg.trim_start();
    let (bytes, from) = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        (arg.as_bytes().to_vec(), "the JSON given".to_owned())
    } else if arg == "-" {
        let mut out = Vec::new();
        std::io::stdin()
            .take(MAX_FILE + 1)
            .read_to_end(&mut out)
            .map_err(|e| {
                Error::new(format!(
                    "cannot read the request body from standard input: {e}"
                ))
            })?;
        (out, "standard input".to_owned())
    } else {
        let path = Path::new(arg);
        (read_file(path)?, format!("`{}`", path.display()))
    };
    if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
        return Err(Error::new(format!("the request body ({from}) is not JSON: {e}")).into());
    }
    Ok(bytes)
}
