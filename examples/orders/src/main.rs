//! `orders`: the idem example service. `orders --help` lists the options.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use orders::{Backend, Config, Service, publish};
use tracing_subscriber::prelude::*;

/// An order service whose `POST /orders` carries a full idempotency contract.
///
/// Clients say who they are with the `X-Client-Id` header (a stand-in for real
/// authentication) and name each business intent with an `Idempotency-Key`.
#[derive(Debug, Parser)]
#[command(version, after_help = AFTER_HELP)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where idem's records and the orders live.
    #[arg(long, value_enum, default_value_t = StoreArg::Sqlite)]
    store: StoreArg,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// The SQLite file (created if missing): orders and idempotency records with `--store
    /// sqlite`, orders only with `--store memory`; unused otherwise.
    #[arg(long, default_value = "orders.db")]
    db: PathBuf,
    /// The PostgreSQL server of `--store postgres` (records and orders) and `--store
    /// redis` (orders), such as `postgres://user@host/db?sslmode=disable`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The Redis server of `--store redis` (records), or the seed nodes of a Redis
    /// Cluster, comma-separated (`redis://h1:7000,redis://h2:7001`).
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// On a Redis Cluster with replicas: how long each claim waits for one replica to
    /// acknowledge it before answering 503 (`0s`: no claim waits).
    #[arg(
        long,
        env = "REDIS_REPLICA_WAIT",
        value_name = "DURATION",
        value_parser = parse_duration,
        default_value = "500ms"
    )]
    replica_wait: Duration,
    /// Write the OpenAPI document of the service, with the contract merged in, to PATH
    /// (`.json` for JSON, otherwise YAML) and exit.
    #[arg(long, value_name = "PATH")]
    emit_openapi: Option<PathBuf>,
    /// Write the consumer docs (Markdown and HTML) into DIR and exit.
    #[arg(long, value_name = "DIR")]
    emit_docs: Option<PathBuf>,
    /// Demo: every POST /orders waits this long after writing the order, before the
    /// commit and the answer (such as `3s`; past 9s the attempt is stopped, and in the
    /// transactional stores rolled back).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    delay: Duration,
    /// Demo: the next N POST /orders answer 503, as if the payment provider were down.
    #[arg(long, value_name = "N", default_value_t = 0)]
    outage: u32,
    /// Each client's budget of live idempotency records (default 10000): a new key from
    /// a client that holds this many is answered 429 `client-budget-exhausted`.
    #[arg(long, value_name = "N", env = "ORDERS_CLIENT_BUDGET_RECORDS")]
    client_budget_records: Option<u64>,
    /// Each client's budget of stored answer bytes (default 16 MiB).
    #[arg(long, value_name = "BYTES", env = "ORDERS_CLIENT_BUDGET_BYTES")]
    client_budget_bytes: Option<u64>,
}

/// The client budget the flags ask for, or idem's default.
fn client_budget(args: &Args) -> idem::store::ClientBudget {
    let default = idem::store::ClientBudget::DEFAULT;
    idem::store::ClientBudget::new(
        args.client_budget_records.unwrap_or(default.records),
        args.client_budget_bytes.unwrap_or(default.bytes),
    )
}

/// What to do instead of serving.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the Monday test: start the service with a temporary SQLite file, run idem's
    /// conformance harness against its `POST /orders` (a lost answer, 429, 503, 400,
    /// concurrent requests with one key, a crash midway), print the report, and exit
    /// non-zero if a proof failed.
    Monday,
}

/// The values of `--store`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StoreArg {
    /// Records in memory, lost when the process stops (a retry after a restart runs
    /// again); orders in the SQLite file `--db`. Not transactional: the handler writes
    /// the order itself. One process only.
    Memory,
    /// Records and orders in the SQLite file `--db`; an order and its record commit in
    /// one transaction. One process.
    Sqlite,
    /// Records and orders in PostgreSQL (`DATABASE_URL`), in one transaction; any number
    /// of processes may share the database.
    Postgres,
    /// Records in Redis (`REDIS_URL`; run it with `maxmemory-policy noeviction`), orders
    /// in PostgreSQL (`DATABASE_URL`); not transactional: the handler writes the order
    /// itself. Any number of processes may share them.
    Redis,
}

const AFTER_HELP: &str = "\
Examples:
  orders                                   serve on 127.0.0.1:3000 with ./orders.db
  orders --addr 127.0.0.1:8080 --db /tmp/o.db
  DATABASE_URL=postgres://postgres@127.0.0.1/postgres?sslmode=disable orders --store postgres
                                           records and orders in PostgreSQL; start several
                                           on other --addr to share one database
  orders --store memory                    records in memory (lost on restart),
                                           orders in ./orders.db
  orders monday                            run the Monday test against a fresh service
  orders --emit-openapi openapi.yaml       write the published contract and exit
  orders --emit-docs docs/                 write docs/operations.md and .html and exit
  orders --delay 3s                        make concurrent duplicates visible (409)
  orders --outage 1                        the next order answers 503: the key is released";

/// The backend that `args` name; an error message when a server's URL is missing.
fn backend(args: &Args) -> Result<Backend, String> {
    let database_url = || {
        args.database_url.clone().ok_or_else(|| {
            format!(
                "--store {} needs a PostgreSQL server: set DATABASE_URL (or --database-url)",
                args.store.name()
            )
        })
    };
    Ok(match args.store {
        StoreArg::Sqlite => Backend::Sqlite {
            db: args.db.clone(),
        },
        StoreArg::Memory => Backend::Memory {
            db: args.db.clone(),
        },
        StoreArg::Postgres => Backend::Postgres {
            url: database_url()?,
        },
        StoreArg::Redis => Backend::Redis {
            redis_url: args.redis_url.clone(),
            database_url: database_url()?,
            replica_wait: args.replica_wait,
        },
    })
}

/// `orders monday`: the report on standard output; non-zero when a proof failed or the
/// test could not run.
async fn monday(trace: &idem::testing::TraceCapture) -> ExitCode {
    println!(
        "orders monday: the Monday test against POST /orders (a fresh service, its embedded SQLite store, a {} ms lease)",
        orders::monday::LEASE.as_millis()
    );
    match orders::monday::run(trace).await {
        Ok(monday) => {
            println!("service database: {} (temporary)\n", monday.db.display());
            println!("{}", monday.report);
            if monday.report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Durations as a contract writes them (`250ms`, `3s`, `1m`), and `0s` for none.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0s" || text == "0" {
        return Ok(Duration::ZERO);
    }
    text.parse::<idem::model::Duration>()
        .map(|d| d.to_std())
        .map_err(|e| e.to_string())
}

impl StoreArg {
    /// The value as written on the command line.
    fn name(self) -> &'static str {
        match self {
            StoreArg::Memory => "memory",
            StoreArg::Sqlite => "sqlite",
            StoreArg::Postgres => "postgres",
            StoreArg::Redis => "redis",
        }
    }
}

/// Logs to stderr; with `monday`, also captures idem's spans (proof 4) in the returned
/// capture, for the whole process (the service runs on other threads).
fn init_logging(args: &Args) -> idem::testing::TraceCapture {
    // `monday` prints a report: the service's own logs only when something is wrong.
    let default_filter = match args.command {
        Some(Command::Monday) => "error",
        None => "info,sqlx=warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let trace = idem::testing::TraceCapture::new();
    let capture = matches!(args.command, Some(Command::Monday)).then(|| trace.clone());
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .with(capture)
        .init();
    trace
}

/// `--emit-openapi` and `--emit-docs`: writes what they ask for.
fn emit(args: &Args) -> ExitCode {
    if let Some(path) = &args.emit_openapi {
        if let Err(error) = publish::write_openapi(path) {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.emit_docs {
        match publish::write_docs(dir) {
            Ok(files) => files.iter().for_each(|f| println!("wrote {}", f.display())),
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => return std::future::pending().await,
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("orders: shutting down");
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let trace = init_logging(&args);
    if let Some(Command::Monday) = args.command {
        return monday(&trace).await;
    }
    if args.emit_openapi.is_some() || args.emit_docs.is_some() {
        return emit(&args);
    }
    let backend = match backend(&args) {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        backend,
        delay: args.delay,
        outage: args.outage,
    };
    let budget = client_budget(&args);
    let service = match Service::open_with(&config, |idem| idem.client_budget(budget)).await {
        Ok(service) => service,
        Err(error) => {
            eprintln!(
                "error: cannot start with --store {}: {error}",
                args.store.name()
            );
            return ExitCode::FAILURE;
        }
    };
    let listener = match Service::bind(args.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {}: {error}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().unwrap_or(args.addr);
    println!(
        "orders: listening on http://{addr} ({})",
        config.backend.describe()
    );
    match service.serve(listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
