//! `orders`: the idem example service. `orders --help` lists the options.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use orders::{Config, Service, publish};

/// An order service whose `POST /orders` carries a full idempotency contract.
///
/// Clients say who they are with the `X-Client-Id` header (a stand-in for real
/// authentication) and name each business intent with an `Idempotency-Key`.
#[derive(Debug, Parser)]
#[command(version, after_help = AFTER_HELP)]
struct Args {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// The SQLite file for orders and idempotency records (created if missing); an
    /// order and its record commit in one transaction.
    #[arg(long, default_value = "orders.db")]
    db: PathBuf,
    /// Write the OpenAPI document of the service, with the contract merged in, to PATH
    /// (`.json` for JSON, otherwise YAML) and exit.
    #[arg(long, value_name = "PATH")]
    emit_openapi: Option<PathBuf>,
    /// Write the consumer docs (Markdown and HTML) into DIR and exit.
    #[arg(long, value_name = "DIR")]
    emit_docs: Option<PathBuf>,
    /// Demo: every POST /orders waits this long after writing the order, before the
    /// commit and the answer (such as `3s`; past 9s the attempt is stopped and rolled
    /// back).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    delay: Duration,
    /// Demo: the next N POST /orders answer 503, as if the payment provider were down.
    #[arg(long, value_name = "N", default_value_t = 0)]
    outage: u32,
}

const AFTER_HELP: &str = "\
Examples:
  orders                                   serve on 127.0.0.1:3000 with ./orders.db
  orders --addr 127.0.0.1:8080 --db /tmp/o.db
  orders --emit-openapi openapi.yaml       write the published contract and exit
  orders --emit-docs docs/                 write docs/operations.md and .html and exit
  orders --delay 3s                        make concurrent duplicates visible (409)
  orders --outage 1                        the next order answers 503: the key is released";

/// Durations as a contract writes them (`250ms`, `3s`, `1m`), and `0s` for none.
fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0s" || text == "0" {
        return Ok(Duration::ZERO);
    }
    text.parse::<idem::model::Duration>()
        .map(|d| d.to_std())
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();

    if args.emit_openapi.is_some() || args.emit_docs.is_some() {
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
        return ExitCode::SUCCESS;
    }

    let config = Config {
        db: args.db.clone(),
        delay: args.delay,
        outage: args.outage,
    };
    let service = match Service::open(&config).await {
        Ok(service) => service,
        Err(error) => {
            eprintln!("error: cannot open {}: {error}", args.db.display());
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
        "orders: listening on http://{addr} (database {})",
        args.db.display()
    );
    let shutdown = async {
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
    };
    match service.serve(listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
