//! idem's telemetry, exported with OpenTelemetry over OTLP/HTTP.
//!
//! - **Spans**: `tracing-opentelemetry` turns every `tracing` span into an OpenTelemetry
//!   span, with its fields as attributes. idem's `idem.attempt` span (one per request to
//!   a contracted handler) arrives as a child of the HTTP server span this service opens
//!   for every request ([`server_span`]), with `http.route`, `http.request.resend_count`,
//!   `idem.operation_id`, `idem.outcome`, `error.type`, …
//! - **Metrics**: idem counts through the `metrics` facade; `metrics-exporter-opentelemetry`
//!   is the recorder that hands each counter and histogram to an OpenTelemetry meter.
//! - **Export**: both go to an OTLP/HTTP endpoint (protobuf), `http://127.0.0.1:4318` by
//!   default, or `OTEL_EXPORTER_OTLP_ENDPOINT`, as any OpenTelemetry Collector, Jaeger or
//!   Grafana agent reads it.
//!
//! See `idem::telemetry` for every name and what is never recorded.

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::{Idem, MemoryStore, identity};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The service's name in every exported span and metric (`service.name`).
pub const SERVICE_NAME: &str = "idem-telemetry-example";

/// The body of `POST /orders`.
#[derive(Deserialize)]
pub struct CreateOrder {
    /// The amount, in minor units.
    pub amount_minor: u64,
}

/// `POST /orders`: one order per idempotency key.
#[idem::contract(
    key_scope     = client,
    fingerprint   = [amount_minor],
    ttl           = "24h",
    deadline      = "30s",
    max_attempts  = 3,
    retryable     = [429, 503, timeout],
    concurrency   = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery      = manual("https://runbooks.example.com/orders"),
)]
pub async fn create_order(
    attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> (StatusCode, Json<serde_json::Value>) {
    // The handler's own logs are children of idem's attempt span.
    tracing::info!("writing the order");
    (
        StatusCode::CREATED,
        Json(json!({ "id": attempt.operation_id, "amount_minor": order.amount_minor })),
    )
}

/// `GET /orders/operations/{key}`: the status lookup.
pub async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// The service: its routes, an HTTP server span per request, and idem's layer on the
/// memory store (clients named by the `x-client-id` header).
pub fn app() -> Router {
    let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .layer(idem.layer())
        .route_layer(middleware::from_fn(server_span))
}

/// The HTTP server span of a request (OpenTelemetry's HTTP server conventions: named
/// `{method} {route}`, kind `server`), around idem's attempt span.
pub async fn server_span(request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "HTTP request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// What [`install`] set up; [`Telemetry::shutdown`] sends what is still buffered.
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

/// An error of [`install`].
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Installs, for the whole process, a `tracing` subscriber (logs on stderr, and spans to
/// OpenTelemetry) and a `metrics` recorder (to OpenTelemetry), both exported over
/// OTLP/HTTP to `endpoint` (such as `http://127.0.0.1:4318`), or, when `None`, where the
/// `OTEL_EXPORTER_OTLP_*` variables say.
///
/// The exporters send from the SDK's own threads; call it outside an async context, or
/// in `spawn_blocking`, as [`Telemetry::shutdown`].
///
/// # Errors
///
/// An exporter cannot be built, or a subscriber or recorder is installed already.
pub fn install(endpoint: Option<&str>) -> Result<Telemetry, Error> {
    let resource = Resource::builder().with_service_name(SERVICE_NAME).build();

    let mut spans = opentelemetry_otlp::SpanExporter::builder().with_http();
    let mut counts = opentelemetry_otlp::MetricExporter::builder().with_http();
    if let Some(endpoint) = endpoint {
        let base = endpoint.trim_end_matches('/');
        spans = spans.with_endpoint(format!("{base}/v1/traces"));
        counts = counts.with_endpoint(format!("{base}/v1/metrics"));
    }
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans.build()?)
        .with_resource(resource.clone())
        .build();
    let meter = SdkMeterProvider::builder()
        .with_periodic_exporter(counts.build()?)
        .with_resource(resource)
        .build();

    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("idem")))
        .try_init()?;

    use opentelemetry::metrics::MeterProvider as _;
    let recorder = metrics_exporter_opentelemetry::Recorder::with_meter(meter.meter("idem"));
    metrics::set_global_recorder(recorder)?;
    idem::telemetry::describe_metrics();

    Ok(Telemetry { tracer, meter })
}

impl Telemetry {
    /// Exports what is still buffered and stops the exporters. Blocks: call it outside
    /// an async context, or in `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// An export failed.
    pub fn shutdown(self) -> Result<(), Error> {
        let traced = self.tracer.shutdown();
        let counted = self.meter.shutdown();
        traced?;
        counted?;
        Ok(())
    }
}
