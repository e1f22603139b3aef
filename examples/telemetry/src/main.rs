//! `telemetry-example [ADDR]`: the order service of `telemetry_example::app` on ADDR
//! (`127.0.0.1:3000` by default), its spans and metrics exported over OTLP/HTTP to
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (`http://localhost:4318` when unset).
//!
//! ```text
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 cargo run -p telemetry-example
//! curl -si -X POST localhost:3000/orders -H 'x-client-id: c1' -H 'Idempotency-Key: k1' \
//!      -H 'content-type: application/json' -d '{"amount_minor": 1250}'
//! ```
//!
//! Send the same request twice: the collector receives two `idem.attempt` spans with one
//! `idem.operation_id` (`idem.outcome` `executed`, then `replayed` with
//! `http.request.resend_count` 1), and `idem_attempts_total` counts both.

use std::process::ExitCode;

fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    // The exporters send from the SDK's threads: set up outside the async runtime.
    let telemetry = match telemetry_example::install(None) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: cannot set up telemetry: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        idem::serve(listener, telemetry_example::app())
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    });
    drop(runtime);
    let flushed = telemetry.shutdown();
    match (served, flushed) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(error), _) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        (_, Err(error)) => {
            eprintln!("error: exporting telemetry failed: {error}");
            ExitCode::FAILURE
        }
    }
}
