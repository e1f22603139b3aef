//! `payments`: the idem example on PostgreSQL. `payments --help` lists the options.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use payments::provider::{self, Provider};
use payments::{Config, PROVIDER_TIMEOUT, Service};
use reqwest::Url;

/// A payment service whose `POST /payments` writes the payment and its idempotency
/// record in one PostgreSQL transaction.
///
/// Clients say who they are with the `X-Client-Id` header and name each payment intent
/// with an `Idempotency-Key`.
#[derive(Debug, Parser)]
#[command(version, after_help = AFTER_HELP)]
struct Args {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:3001")]
    addr: SocketAddr,
    /// The PostgreSQL server for payments and idempotency records, as sqlx reads it
    /// (`postgres://user@host:5432/db?sslmode=disable`).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Demo: every POST /payments waits this long after the provider charged the card and
    /// the payment is written, before committing and answering (such as `5s`): the moment
    /// to kill the process (the retry finds the charge in the journal, not a second one).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    delay: Duration,
    /// The payment provider's base URL: charges are POST {URL}/charges. Without it, an
    /// in-process provider starts on a free port of 127.0.0.1 (its URL is logged).
    #[arg(long, env = "PROVIDER_URL", value_name = "URL", value_parser = parse_provider_url)]
    provider_url: Option<Url>,
}

const AFTER_HELP: &str = "\
Examples:
  DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' payments
  payments --database-url 'postgres://app@db.internal/payments' --addr 0.0.0.0:8080
  payments --delay 5s          every payment waits 5 s after its charge, before its commit: kill -9 it meanwhile
  payments --provider-url http://127.0.0.1:4000   charge at that provider, not an in-process one";

fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0s" || text == "0" {
        return Ok(Duration::ZERO);
    }
    text.parse::<idem::model::Duration>()
        .map(|d| d.to_std())
        .map_err(|e| e.to_string())
}

fn parse_provider_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| e.to_string())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must start with http:// or https://".into());
    }
    Ok(url)
}

/// The provider's client: the one at `url`, or a provider started in this process.
async fn start_provider(url: Option<Url>) -> Result<(Provider, Option<ProviderTask>), String> {
    let (url, in_process) = match url {
        Some(url) => (url, None),
        None => {
            let (url, task) = provider::spawn_in_process()
                .await
                .map_err(|e| format!("cannot start the in-process provider: {e}"))?;
            tracing::info!(%url, "payments: no --provider-url; an in-process provider listens");
            (url, Some(task))
        }
    };
    let client = Provider::new(url.clone(), PROVIDER_TIMEOUT)
        .map_err(|e| format!("cannot use the provider at {url}: {e}"))?;
    Ok((client, in_process))
}

/// The in-process provider's task.
type ProviderTask = tokio::task::JoinHandle<std::io::Result<()>>;

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
    let (provider, in_process) = match start_provider(args.provider_url).await {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        database_url: args.database_url,
        delay: args.delay,
        provider,
    };
    let service = match Service::open(&config).await {
        Ok(service) => service,
        Err(error) => {
            eprintln!("error: cannot use the database at DATABASE_URL: {error}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {}: {error}", args.addr);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().unwrap_or(args.addr);
    println!("payments: listening on http://{addr}");
    let purger = service.idem.spawn_purger(Duration::from_secs(60));
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
    };
    // `idem::serve` closes a connection whose request head has not come within 10 s.
    let served = idem::serve(listener, service.router)
        .with_graceful_shutdown(shutdown)
        .await;
    purger.abort();
    if let Some(in_process) = in_process {
        in_process.abort();
    }
    service.app.db.close().await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
