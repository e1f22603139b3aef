//! The example's export, end to end, without a collector: a stand-in OTLP/HTTP receiver on
//! 127.0.0.1 takes what the exporters send, and the protobuf payloads are read for idem's
//! names (attribute keys and string values travel as plain UTF-8 in protobuf).

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;

/// What the stand-in receiver got: path, content type, body.
type Received = Arc<Mutex<Vec<(String, String, Bytes)>>>;

async fn receive(
    State(received): State<Received>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    received
        .lock()
        .unwrap()
        .push((uri.path().to_owned(), content_type, body));
    StatusCode::OK
}

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_reach_an_otlp_endpoint() {
    let received = Received::default();
    let receiver = serve(
        Router::new()
            .route("/v1/traces", post(receive))
            .route("/v1/metrics", post(receive))
            .with_state(Arc::clone(&received)),
    )
    .await;
    let endpoint = format!("http://{receiver}");
    let telemetry =
        tokio::task::spawn_blocking(move || telemetry_example::install(Some(&endpoint)))
            .await
            .unwrap()
            .expect("install telemetry");

    let service = serve(telemetry_example::app()).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let key = "key-NEVER-EXPORTED";
    let mut ids = Vec::new();
    for _ in 0..2 {
        let answer = http
            .post(format!("http://{service}/orders"))
            .header("x-client-id", "client-NEVER-EXPORTED")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(r#"{"amount_minor": 987654}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201);
        ids.push(
            answer.headers()["operation-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(ids[0], ids[1], "a replay answers for the same operation");

    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap()
        .expect("the exports succeed");

    let received = received.lock().unwrap();
    let of = |path: &str| -> Vec<Bytes> {
        received
            .iter()
            .filter(|(p, content_type, _)| {
                p == path && content_type.as_str() == "application/x-protobuf"
            })
            .map(|(_, _, body)| body.clone())
            .collect()
    };
    let traces = of("/v1/traces").concat();
    let metrics = of("/v1/metrics").concat();
    assert!(!traces.is_empty(), "spans were exported over OTLP/HTTP");
    assert!(!metrics.is_empty(), "metrics were exported over OTLP/HTTP");
    for name in [
        "idem.attempt",
        "POST /orders",
        "http.route",
        "/orders",
        "http.request.resend_count",
        "idem.operation_id",
        ids[0].as_str(),
        "idem.outcome",
        "executed",
        "replayed",
        // The operation's final outcome: a span event (OpenTelemetry names it by its
        // message) with its fields as attributes.
        "idem.final_outcome",
        "completed",
        telemetry_example::SERVICE_NAME,
    ] {
        assert!(contains(&traces, name), "the exported spans name `{name}`");
    }
    for name in [
        "idem_attempts_total",
        "idem_attempt_duration_seconds",
        "idem_operations_total",
        "create_order",
        "executed",
        "replayed",
        "completed",
    ] {
        assert!(
            contains(&metrics, name),
            "the exported metrics name `{name}`"
        );
    }
    for secret in ["NEVER-EXPORTED", "987654"] {
        assert!(!contains(&traces, secret), "a span holds `{secret}`");
        assert!(!contains(&metrics, secret), "a metric holds `{secret}`");
    }
}
