//! `idem ops`: list operations by state, show one with its attempts and resolutions, and
//! resolve a parked one, against the store of a running service (a driver feature:
//! `sqlite`, `postgres` or `redis`).
//!
//! Nothing here edits the database by hand: every change is the store's own
//! compare-and-set ([`OperatorStore::resolve`](idem_runtime::store::OperatorStore::resolve)),
//! recorded on the record (who, when, why). Every argument is checked before the store is
//! opened, and a refused command changes nothing.
//!
//! Every wait for the store is bounded (`--timeout`, [`StoreArgs`]). A resolution that was
//! sent and got no answer ends with [`EXIT_OUTCOME_UNKNOWN`] and says so: it may or may
//! not have been applied (a request held up in the network may still arrive), and
//! `idem ops show` tells. A read that gets no answer is a failure to read (exit 1).

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use http::{HeaderName, HeaderValue};
use idem_runtime::Idem;
use idem_runtime::store::{
    AttemptEnd, DEFAULT_MAX_RESULT, Inspection, ListQuery, Listed, OperationState, Record,
    RecordKey, RecordState, Resolution, ResolutionOutcome, Step, StoreError, StoredResponse,
    UnixMillis, store_now,
};
use serde_json::{Value, json};

use idem_codegen::error::{Error, Errors};

pub use crate::EXIT_OUTCOME_UNKNOWN;
use crate::Failure;
pub use crate::store::StoreArgs;
use crate::store::check_text;

/// The longest operation name, client identity or key accepted, in bytes.
const MAX_NAME: usize = 255;
/// The longest client identity accepted, in bytes.
const MAX_CLIENT: usize = 1024;
/// The longest reason and operator name accepted, in characters.
const MAX_REASON: usize = 2000;
const MAX_BY: usize = 200;
/// The largest response file read, in bytes: room for the largest result a store keeps
/// by default ([`DEFAULT_MAX_RESULT`]) written as JSON text, escapes and all, plus the
/// members around it. A larger file, or one that never ends (`/dev/zero`), is refused
/// after reading this much.
const MAX_RESPONSE_FILE: u64 = 2 * DEFAULT_MAX_RESULT as u64 + 64 * 1024;

/// `idem ops`.
#[derive(Debug, Args)]
pub struct OpsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: OpsCommand,
}

/// The subcommands of `idem ops`.
#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// List operations, by state and operation.
    #[command(
        after_help = concat!("Examples:\n  idem ops list --store orders.db --state unknown\n  idem ops list --store postgres://idem@db/orders --operation create_order --state processing --json\n\n", "Exit codes: 0 listed; 1 refused or failed (a read that got no answer within --timeout included); 2 usage error.")
    )]
    List(ListArgs),
    /// Show one operation: its record, every attempt and every operator resolution.
    #[command(
        after_help = concat!("Example:\n  idem ops show --store orders.db --operation create_order --client acme --key 7f3c\n\n", "Exit codes: 0 shown; 1 not recorded, refused or failed (a read that got no answer within --timeout included); 2 usage error.")
    )]
    Show(ShowArgs),
    /// Resolve a parked (`unknown`) operation as completed, with the result clients get
    /// from now on, or as not applied (the key is released: the client's next retry runs
    /// the handler). One compare-and-set: refused, changing nothing, when the operation
    /// is not parked any more or not at the attempt expected.
    ///
    /// The response file is JSON: `{"status": 201, "headers": {"content-type":
    /// "application/json"}, "body": {"id": 42}}`; `body` is any JSON value (sent as
    /// compact JSON), or `body_text` a string sent as it is; a header's value may be a
    /// list of values. The headers are the ones a replay sends (idem's defaults:
    /// content-type, content-encoding, content-location, location, etag, last-modified,
    /// link; more with --replayed-header); framing and session headers (content-length,
    /// transfer-encoding, connection, keep-alive, upgrade, te, trailer, set-cookie) are
    /// refused. The status is from 200 to 499; the file is a regular file of at most
    /// 2.06 MiB.
    #[command(
        after_help = concat!("Examples:\n  idem ops resolve --store orders.db --operation create_order --client acme --key 7f3c --expect-attempt 2 --as completed --response order-42.json --reason \"order 42 is in the ledger\"\n  idem ops resolve --store orders.db --operation create_order --client acme --key 7f3c --as not-applied --reason \"no order in the ledger\"\n\n", "Exit codes: 0 resolved; 1 refused or failed, the resolution not applied (a bad argument, no such record, not parked at the attempt expected, a store that cannot be reached or refused it); 2 usage error; 3 the resolution was sent and no answer came within --timeout (or the connection broke): it may or may not have been applied. Run `idem ops show` to see; resolving again with --expect-attempt is safe, as a resolution applies only to the attempt it names.")
    )]
    Resolve(ResolveArgs),
}

/// A state as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// An attempt holds the key (or held it, and its lease ended).
    Processing,
    /// Finished; the result is replayed.
    Completed,
    /// Released; the next retry runs.
    Released,
    /// Parked for an operator.
    Unknown,
}

impl From<StateArg> for OperationState {
    fn from(state: StateArg) -> OperationState {
        match state {
            StateArg::Processing => OperationState::Processing,
            StateArg::Completed => OperationState::Completed,
            StateArg::Released => OperationState::Released,
            StateArg::Unknown => OperationState::Unknown,
        }
    }
}

/// `idem ops list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only operations in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only this operation's records (the contract's operation name).
    #[arg(long, value_name = "NAME")]
    pub operation: Option<String>,
    /// At most this many records (1 to 100000; read from the store 1000 at a time).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,
    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The operation's key.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The contract's operation name, such as `create_order`.
    #[arg(long, value_name = "NAME")]
    pub operation: String,
    /// The client's identity, as the service's `ClientIdentity` gives it.
    #[arg(long, value_name = "CLIENT")]
    pub client: String,
    /// The idempotency key, as the client meant it.
    #[arg(long, value_name = "KEY")]
    pub key: String,
}

/// `idem ops show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation.
    #[command(flatten)]
    pub key: KeyArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What a parked operation is resolved as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ResolveArg {
    /// The effect happened: store `--response` as the result.
    Completed,
    /// The effect did not happen: release the key.
    NotApplied,
}

/// `idem ops resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation.
    #[command(flatten)]
    pub key: KeyArgs,
    /// The decision.
    #[arg(long = "as", value_enum, value_name = "OUTCOME")]
    pub outcome: ResolveArg,
    /// With `--as completed`: the JSON file of the result (status, headers, body).
    #[arg(long, value_name = "FILE", required_if_eq("outcome", "completed"))]
    pub response: Option<PathBuf>,
    /// A header the service replays besides idem's defaults (its
    /// `IdemBuilder::replayed_headers`), allowed in the response file; repeatable.
    #[arg(long = "replayed-header", value_name = "NAME")]
    pub replayed_headers: Vec<String>,
    /// Why, in your words (recorded and shown by `idem ops show`).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Who decides [default: $USER, or else $LOGNAME].
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// The attempt `idem ops show` showed parked: refused if the operation ran again
    /// since [default: the attempt parked now].
    #[arg(long, value_name = "N")]
    pub expect_attempt: Option<u32>,
}

/// Runs `idem ops`.
///
/// # Errors
///
/// [`Failure::Failed`]: a refused argument, a store that cannot be reached or fails, a
/// key with no record, a record that is not parked at the attempt expected, each with its
/// message; nothing changed. [`Failure::OutcomeUnknown`]: a resolution was sent and no
/// answer came; the message says how to see whether it was applied.
pub fn run(args: OpsArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::new(format!("cannot start the async runtime: {e}")))?;
    let outcome = runtime.block_on(async move {
        match args.command {
            OpsCommand::List(args) => Ok(list(args).await?),
            OpsCommand::Show(args) => Ok(show(args).await?),
            OpsCommand::Resolve(args) => resolve(args).await,
        }
    });
    // A call given up on may leave a blocking task behind (a name lookup that does not
    // answer): the command ends all the same.
    runtime.shutdown_timeout(Duration::from_millis(100));
    outcome
}

async fn list(args: ListArgs) -> Result<(), Errors> {
    if let Some(op) = &args.operation {
        check_text("--operation", op, MAX_NAME)?;
    }
    let store = crate::store::open(&args.store).await?;
    // The store's clock, by which the service's instances judge leases and TTLs.
    let now = store_now(&*store)
        .await
        .map_err(|e| read_failed(&args.store, &e))?;
    let mut found: Vec<Listed> = Vec::new();
    // Page by page, each after the last key of the one before.
    while found.len() < args.limit as usize {
        let remaining = u32::try_from(args.limit as usize - found.len()).unwrap_or(u32::MAX);
        let query = ListQuery {
            operation: args.operation.clone(),
            state: args.state.map(OperationState::from),
            limit: remaining.min(idem_runtime::store::ops::MAX_LIST_LIMIT),
            after: found.last().map(|l| l.key.clone()),
            ..ListQuery::default()
        };
        let page = store
            .list(&query, now)
            .await
            .map_err(|e| read_failed(&args.store, &e))?;
        let last_page = page.len() < query.page() as usize;
        found.extend(page);
        if last_page {
            break;
        }
    }
    if args.json {
        let all: Vec<Value> = found.iter().map(listed_json).collect();
        println!("{}", Value::Array(all));
        return Ok(());
    }
    if found.is_empty() {
        println!("no operations found");
        return Ok(());
    }
    println!(
        "{:<20} {:<16} {:<24} {:<10} {:>7}  {:<24}  DETAIL",
        "OPERATION", "CLIENT", "KEY", "STATE", "ATTEMPT", "CREATED"
    );
    for Listed { key, record } in &found {
        println!(
            "{:<20} {:<16} {:<24} {:<10} {:>7}  {:<24}  {}",
            key.operation,
            key.client,
            key.key,
            record.state.kind(),
            record.attempt,
            time(record.created_at),
            detail(record, now)
        );
    }
    if found.len() == args.limit as usize {
        println!(
            "(the first {} shown: narrow with --operation and --state, or raise --limit)",
            args.limit
        );
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Result<(), Errors> {
    let key = record_key(&args.key)?;
    let store = crate::store::open(&args.store).await?;
    // The store's clock, by which the service's instances judge leases and TTLs.
    let now = store_now(&*store)
        .await
        .map_err(|e| read_failed(&args.store, &e))?;
    let shown = store
        .inspect(&key, now)
        .await
        .map_err(|e| read_failed(&args.store, &e))?
        .ok_or_else(|| not_found(&key))?;
    let steps = store
        .steps(&key, shown.record.operation_id, now)
        .await
        .map_err(|e| read_failed(&args.store, &e))?;
    if args.json {
        let mut out = inspection_json(&shown);
        out["steps"] = steps.iter().map(step_json).collect();
        println!("{out}");
        return Ok(());
    }
    print_inspection(&key, &shown, now);
    print_steps(&steps);
    if shown.resolutions.is_empty() {
        println!("resolutions:  none");
    } else {
        println!("resolutions:");
        for r in &shown.resolutions {
            let outcome = match r.completed_status {
                Some(status) => format!("completed (status {status})"),
                None => "not applied".to_owned(),
            };
            println!(
                "  {} by {}: attempt {} resolved as {outcome}: {:?} (parked: {:?})",
                time(r.at),
                r.by,
                r.attempt,
                r.reason,
                r.parked
            );
        }
    }
    let record = &shown.record;
    if matches!(record.state, RecordState::Unknown { .. }) {
        println!(
            "resolve it with: idem ops resolve --store … --operation {} --client {} --key {} --expect-attempt {} --as completed --response FILE --reason \"…\"  (or --as not-applied)",
            key.operation, key.client, key.key, record.attempt
        );
    }
    Ok(())
}

async fn resolve(args: ResolveArgs) -> Result<(), Failure> {
    let key = record_key(&args.key)?;
    check_text("--reason", &args.reason, MAX_REASON)?;
    let by = operator(&args)?;
    if args.expect_attempt == Some(0) {
        return Err(Error::new("--expect-attempt counts from 1").into());
    }
    let replayed = replayed_headers(&args.replayed_headers)?;
    let outcome = match (args.outcome, &args.response) {
        (ResolveArg::Completed, Some(file)) => {
            ResolutionOutcome::Completed(read_response(file, &replayed)?)
        }
        (ResolveArg::Completed, None) => {
            return Err(Error::new(
                "--as completed needs --response FILE: the result clients get from now on",
            )
            .into());
        }
        (ResolveArg::NotApplied, Some(_)) => {
            return Err(Error::new(
                "--response goes with --as completed only: a not-applied operation has no result",
            )
            .into());
        }
        (ResolveArg::NotApplied, None) => ResolutionOutcome::NotApplied,
    };
    let store = crate::store::open(&args.store).await?;
    // The store's clock, by which the service's instances judge leases and TTLs.
    let now = store_now(&*store)
        .await
        .map_err(|e| read_failed(&args.store, &e))?;
    let expected_attempt = match args.expect_attempt {
        Some(n) => n,
        None => store
            .get(&key, now)
            .await
            .map_err(|e| {
                Error::new(format!(
                    "cannot read {} to find the attempt to resolve (--expect-attempt N skips this read), so nothing was resolved: {}",
                    describe(&key),
                    read_failed(&args.store, &e).message
                ))
            })?
            .ok_or_else(|| not_found(&key))?
            .attempt,
    };
    let resolution = Resolution {
        expected_attempt,
        outcome,
        by,
        reason: args.reason.clone(),
    };
    let resolved = store.resolve(&key, &resolution, now).await;
    resolved_or_why(&args, &key, &resolution, resolved, now)
}

/// Prints what a resolution did, or says why it was not applied, or that whether it was
/// applied is unknown.
fn resolved_or_why(
    args: &ResolveArgs,
    key: &RecordKey,
    resolution: &Resolution,
    resolved: Result<Record, StoreError>,
    now: UnixMillis,
) -> Result<(), Failure> {
    let error = match resolved {
        Ok(record) => {
            let outcome = match &record.state {
                RecordState::Completed { response } => {
                    format!("completed (status {})", response.status)
                }
                _ => "not applied: the key is released, the client's next retry runs".to_owned(),
            };
            println!(
                "resolved {} (attempt {}) as {outcome}, by {} at {}",
                describe(key),
                record.attempt,
                resolution.by,
                time(now)
            );
            return Ok(());
        }
        Err(e) if e.is_outcome_unknown() => {
            return Err(Failure::OutcomeUnknown(
                outcome_unknown(args, key, resolution.expected_attempt, &e).into(),
            ));
        }
        Err(StoreError::NotFound) => not_found(key),
        Err(StoreError::Changed(why)) => {
            Error::new(format!("{} was not resolved: {why}", describe(key)))
        }
        Err(StoreError::TooLarge { size, limit }) => Error::in_file(
            args.response.as_deref().unwrap_or(Path::new("-")),
            format!(
                "the response is {size} bytes (body and headers); the store keeps results of at most {limit} bytes"
            ),
        ),
        Err(e @ StoreError::Unavailable(_)) => Error::new(format!(
            "{}: the resolution was not applied (it was not sent, or the store refused it)",
            store_failed(&args.store, &e).message
        )),
        Err(e) => store_failed(&args.store, &e),
    };
    Err(error.into())
}

/// A resolution sent with no answer: it may or may not have been applied; how to see.
fn outcome_unknown(args: &ResolveArgs, key: &RecordKey, attempt: u32, error: &StoreError) -> Error {
    let store = idem_runtime::store::redact_url(&args.store.store);
    let mut show = vec!["idem", "ops", "show", "--store", store.as_ref()];
    let redis = store
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("redis"));
    if redis && args.store.redis_prefix != "idem" {
        show.extend(["--redis-prefix", args.store.redis_prefix.as_str()]);
    }
    show.extend([
        "--operation",
        key.operation.as_str(),
        "--client",
        key.client.as_str(),
        "--key",
        key.key.as_str(),
    ]);
    let show: Vec<String> = show.into_iter().map(shell_word).collect();
    // What was lost, without the words every store error starts with.
    let why = std::error::Error::source(error)
        .and_then(std::error::Error::source)
        .map_or_else(|| error.to_string(), ToString::to_string);
    Error::new(format!(
        "the resolution of {} may or may not have been applied: it was sent to the store {store} and no answer came ({why})\n\
         run `{}` to see; the request may still be on its way, so a record still parked may change yet: resolving it again with --expect-attempt {attempt} is safe, as a resolution applies only to the attempt it names",
        describe(key),
        show.join(" ")
    ))
}

/// `word` as one word of a POSIX shell command line: as it is when it holds nothing the
/// shell reads specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A read that failed, naming the store without its password: whether its answer was
/// lost or the store refused, nothing was read, and a read changes nothing.
fn read_failed(args: &StoreArgs, error: &StoreError) -> Error {
    Error::new(format!(
        "could not read from the store {}: {error}",
        idem_runtime::store::redact_url(&args.store)
    ))
}

/// A store call that failed, naming the store without its password.
fn store_failed(args: &StoreArgs, error: &StoreError) -> Error {
    Error::new(format!(
        "the store {} failed: {error}",
        idem_runtime::store::redact_url(&args.store)
    ))
}

fn not_found(key: &RecordKey) -> Error {
    Error::new(format!(
        "no operation {} is recorded: never registered, or its TTL has passed (check --operation, --client and --key; `idem ops list` shows what is there)",
        describe(key)
    ))
}

fn describe(key: &RecordKey) -> String {
    format!(
        "`{}` with client `{}` and key `{}`",
        key.operation, key.client, key.key
    )
}

fn record_key(args: &KeyArgs) -> Result<RecordKey, Error> {
    check_text("--operation", &args.operation, MAX_NAME)?;
    check_text("--client", &args.client, MAX_CLIENT)?;
    check_text("--key", &args.key, MAX_NAME)?;
    if !args.key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::new(
            "--key holds a character an idempotency key cannot have: keys are 1 to 255 visible ASCII characters",
        ));
    }
    Ok(RecordKey::new(&args.operation, &args.client, &args.key))
}

/// Who resolves: `--by`, else `$USER`, else `$LOGNAME`.
fn operator(args: &ResolveArgs) -> Result<String, Error> {
    let by = match &args.by {
        Some(by) => by.clone(),
        None => std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .map_err(|_| {
                Error::new(
                    "say who resolves with --by NAME: neither $USER nor $LOGNAME is set (as UTF-8)",
                )
            })?,
    };
    check_text("--by", &by, MAX_BY)?;
    Ok(by)
}

/// The headers a response file may set: idem's default replayed headers and the ones
/// `--replayed-header` names, never one of [`StoredResponse::NEVER_REPLAYED`].
fn replayed_headers(extra: &[String]) -> Result<Vec<HeaderName>, Error> {
    let mut names = Idem::DEFAULT_REPLAYED_HEADERS.to_vec();
    for name in extra {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Error::new(format!("--replayed-header `{name}` is not a header name")))?;
        if StoredResponse::is_never_replayed(&header) {
            return Err(Error::new(format!(
                "--replayed-header `{header}` is a framing or session header, which a stored result never carries"
            )));
        }
        names.push(header);
    }
    Ok(names)
}

/// The bytes of a response file: a regular file of at most [`MAX_RESPONSE_FILE`] bytes,
/// read with that cap whatever its size claims.
fn read_capped(file: &Path) -> Result<Vec<u8>, Error> {
    use std::io::Read as _;
    let err = |message: String| Error::in_file(file, message);
    let meta = std::fs::metadata(file).map_err(|e| err(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(err(
            "it is not a regular file (a directory, a device or a pipe): write the response to a file".into(),
        ));
    }
    let opened = std::fs::File::open(file).map_err(|e| err(format!("cannot read it: {e}")))?;
    let mut bytes = Vec::new();
    opened
        .take(MAX_RESPONSE_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_RESPONSE_FILE {
        return Err(err(format!(
            "it is larger than {MAX_RESPONSE_FILE} bytes, the most a response file may be"
        )));
    }
    Ok(bytes)
}

/// The result in a response file (see `idem ops resolve --help`), whose headers are
/// among `replayed`.
fn read_response(file: &Path, replayed: &[HeaderName]) -> Result<StoredResponse, Error> {
    let err = |message: String| Error::in_file(file, message);
    let bytes = read_capped(file)?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        err(format!(
            "not JSON ({e}): write {{\"status\": 201, \"headers\": {{\"content-type\": \"application/json\"}}, \"body\": {{…}}}}"
        ))
    })?;
    let Value::Object(fields) = value else {
        return Err(err(
            "the response must be a JSON object with `status`, `headers` and `body`".into(),
        ));
    };
    for name in fields.keys() {
        if !["status", "headers", "body", "body_text"].contains(&name.as_str()) {
            return Err(err(format!(
                "unknown field `{name}`: expected `status`, `headers`, `body` or `body_text`"
            )));
        }
    }
    let status = fields.get("status").ok_or_else(|| {
        err("`status` is missing: the HTTP status clients get, such as 201".into())
    })?;
    let status = status
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (200..=499).contains(s))
        .ok_or_else(|| {
            err(format!(
                "`status` is {status}: a completed operation's result has a status from 200 to 499 (a 5xx is never stored as final)"
            ))
        })?;
    Ok(StoredResponse {
        status,
        headers: response_headers(file, fields.get("headers"), replayed)?,
        body: response_body(file, &fields)?.into(),
    })
}

/// The `headers` of a response file, each value of a list its own header.
fn response_headers(
    file: &Path,
    headers: Option<&Value>,
    replayed: &[HeaderName],
) -> Result<Vec<(HeaderName, HeaderValue)>, Error> {
    let err = |message: String| Error::in_file(file, message);
    let mut out = Vec::new();
    match headers {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            refuse_unreplayed(file, map, replayed)?;
            for (name, value) in map {
                let header = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| err(format!("`{name}` is not a header name")))?;
                let values = match value {
                    Value::String(s) => vec![s.as_str()],
                    Value::Array(items) => items
                        .iter()
                        .map(|v| v.as_str().ok_or(()))
                        .collect::<Result<_, _>>()
                        .map_err(|()| {
                            err(format!("the values of header `{name}` must be strings"))
                        })?,
                    _ => {
                        return Err(err(format!(
                            "the value of header `{name}` must be a string or a list of strings"
                        )));
                    }
                };
                for v in values {
                    let v = HeaderValue::from_str(v).map_err(|_| {
                        err(format!(
                            "the value of header `{name}` is not a valid header value"
                        ))
                    })?;
                    out.push((header.clone(), v));
                }
            }
        }
        Some(_) => {
            return Err(err(
                "`headers` must be an object: {\"content-type\": \"application/json\"}".into(),
            ));
        }
    }
    Ok(out)
}

/// Refuses the headers of `map` that a replay would not send, naming all of them: the
/// framing and session headers ([`StoredResponse::NEVER_REPLAYED`]), then any other
/// that is not among `replayed`.
fn refuse_unreplayed(
    file: &Path,
    map: &serde_json::Map<String, Value>,
    replayed: &[HeaderName],
) -> Result<(), Error> {
    let parsed = || {
        map.keys()
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
    };
    let framing: Vec<String> = parsed()
        .filter(StoredResponse::is_never_replayed)
        .map(|n| format!("`{n}`"))
        .collect();
    if !framing.is_empty() {
        return Err(Error::in_file(
            file,
            format!(
                "{} never stored with a result: framing and session headers would break the replay's connection or hand a session to whoever sends the key; remove them",
                list_is_are(&framing)
            ),
        ));
    }
    let other: Vec<String> = parsed()
        .filter(|n| !replayed.contains(n))
        .map(|n| format!("`{n}`"))
        .collect();
    if other.is_empty() {
        return Ok(());
    }
    let allowed: Vec<&str> = replayed.iter().map(HeaderName::as_str).collect();
    Err(Error::in_file(
        file,
        format!(
            "{} not replayed by the service (it replays {}); remove them, or name each with --replayed-header if the service's `IdemBuilder::replayed_headers` has it",
            list_is_are(&other),
            allowed.join(", ")
        ),
    ))
}

/// `a is` or `a, b are`.
fn list_is_are(names: &[String]) -> String {
    match names {
        [one] => format!("{one} is"),
        many => format!("{} are", many.join(", ")),
    }
}

/// The body of a response file: `body` as compact JSON, or `body_text` as it is.
fn response_body(file: &Path, fields: &serde_json::Map<String, Value>) -> Result<Vec<u8>, Error> {
    let err = |message: String| Error::in_file(file, message);
    let body = match (fields.get("body"), fields.get("body_text")) {
        (Some(_), Some(_)) => {
            return Err(err("give `body` or `body_text`, not both".into()));
        }
        (Some(body), None) => serde_json::to_vec(body).map_err(|e| err(e.to_string()))?,
        (None, Some(Value::String(text))) => text.clone().into_bytes(),
        (None, Some(_)) => return Err(err("`body_text` must be a string".into())),
        (None, None) => Vec::new(),
    };
    Ok(body)
}

/// A time in unix milliseconds as RFC 3339, UTC.
fn time(ms: UnixMillis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A record's state in a few words.
fn detail(record: &Record, now: UnixMillis) -> String {
    match &record.state {
        RecordState::Processing { lease } if lease.is_live(now) => {
            format!("lease until {}", time(lease.until))
        }
        RecordState::Processing { lease } => format!(
            "lease ended {}: recovery runs at the next retry, status lookup or reconciler pass",
            time(lease.until)
        ),
        RecordState::Completed { response } => format!("status {}", response.status),
        RecordState::Released => "the next retry runs".to_owned(),
        RecordState::Unknown { reason } => format!("parked: {reason}"),
    }
}

fn ended(end: &AttemptEnd, now: UnixMillis) -> String {
    match end {
        AttemptEnd::Running { lease_until } if *lease_until > now => {
            format!("running, lease until {}", time(*lease_until))
        }
        AttemptEnd::Running { lease_until } => {
            format!(
                "lease ended {} without an outcome (not recovered yet)",
                time(*lease_until)
            )
        }
        AttemptEnd::LeaseEnded { at } => format!(
            "lease ended {} without an outcome; recovery took over",
            time(*at)
        ),
        AttemptEnd::Released => "released (a retryable answer, or not applied)".to_owned(),
        AttemptEnd::Completed { status } => format!("completed, status {status}"),
        AttemptEnd::Parked { reason } => format!("parked as unknown: {reason}"),
        AttemptEnd::NotRecorded => "(not recorded: the history keeps the last events)".to_owned(),
        _ => "(unknown)".to_owned(),
    }
}

/// The record of `shown` and its attempts, as `idem ops show` prints them.
fn print_inspection(key: &RecordKey, shown: &Inspection, now: UnixMillis) {
    let record = &shown.record;
    println!("operation     {}", key.operation);
    println!("client        {}", key.client);
    println!("key           {}", key.key);
    println!("operation id  {}", record.operation_id);
    println!(
        "state         {} ({})",
        record.state.kind(),
        detail(record, now)
    );
    println!("fingerprint   {}", record.fingerprint);
    println!("created       {}", time(record.created_at));
    println!("expires       {}", time(record.expires_at));
    println!("attempts:");
    for a in &shown.attempts {
        let began = a.began_at.map_or("(not recorded)".to_owned(), time);
        let how = match shown
            .resolutions
            .iter()
            .rev()
            .find(|r| r.attempt == a.attempt)
        {
            Some(r) => format!(
                "parked as unknown: {}; resolved by {} at {} as {}",
                r.parked,
                r.by,
                time(r.at),
                r.completed_status
                    .map_or("not applied".to_owned(), |s| format!(
                        "completed (status {s})"
                    ))
            ),
            None => ended(&a.ended, now),
        };
        println!("  #{:<3} began {began}  {how}", a.attempt);
    }
}

/// The operation's step journal, when it has one: each call to another system, where it
/// stands, how many times it was sent, and its recorded value or error.
fn print_steps(steps: &[Step]) {
    if steps.is_empty() {
        return;
    }
    println!(
        "steps (the step journal; a pending step is sent again, under the same downstream key, when the operation resumes):"
    );
    for step in steps {
        let value = step
            .state
            .value()
            .map(|v| format!("  {}", v.escape_debug()))
            .unwrap_or_default();
        println!(
            "  {:<3} {:<24} {:<8} sent {}×{value}",
            step.index + 1,
            step.name,
            step.state.as_str(),
            step.calls
        );
    }
}

fn step_json(step: &Step) -> Value {
    let value = step
        .state
        .value()
        .map(|v| serde_json::from_str::<Value>(v).unwrap_or_else(|_| Value::String(v.to_owned())));
    json!({
        "index": step.index,
        "name": step.name,
        "state": step.state.as_str(),
        "calls": step.calls,
        "value": value,
    })
}

fn end_json(end: &AttemptEnd) -> Value {
    match end {
        AttemptEnd::Running { lease_until } => json!({"running": {"lease_until": lease_until}}),
        AttemptEnd::LeaseEnded { at } => json!({"lease_ended": at}),
        AttemptEnd::Released => json!("released"),
        AttemptEnd::Completed { status } => json!({"completed": status}),
        AttemptEnd::Parked { reason } => json!({"parked": reason}),
        _ => Value::Null,
    }
}

fn record_json(key: &RecordKey, record: &Record) -> Value {
    let mut out = json!({
        "operation": key.operation,
        "client": key.client,
        "key": key.key,
        "operation_id": record.operation_id.to_string(),
        "state": record.state.kind().as_str(),
        "attempt": record.attempt,
        "fingerprint": record.fingerprint,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
    });
    match &record.state {
        RecordState::Processing { lease } => out["lease_until"] = json!(lease.until),
        RecordState::Completed { response } => out["status"] = json!(response.status),
        RecordState::Unknown { reason } => out["reason"] = json!(reason),
        RecordState::Released => {}
    }
    out
}

fn listed_json(listed: &Listed) -> Value {
    record_json(&listed.key, &listed.record)
}

fn inspection_json(shown: &Inspection) -> Value {
    let mut out = record_json(&shown.key, &shown.record);
    out["attempts"] = shown
        .attempts
        .iter()
        .map(|a| json!({"attempt": a.attempt, "began_at": a.began_at, "ended": end_json(&a.ended)}))
        .collect();
    out["resolutions"] = shown
        .resolutions
        .iter()
        .map(|r| {
            json!({
                "attempt": r.attempt,
                "at": r.at,
                "by": r.by,
                "reason": r.reason,
                "parked": r.parked,
                "as": if r.completed_status.is_some() { "completed" } else { "not-applied" },
                "status": r.completed_status,
            })
        })
        .collect();
    out
}
