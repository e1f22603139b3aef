//! Telemetry: a span per business operation and one per attempt, with OpenTelemetry's
//! names where they exist, and no body, credential or cookie in them. Alone in its test
//! binary, so that its subscriber sees every span.

mod common;

use std::sync::{Arc, Mutex};

use idem_client::{Call, Intent, Outcome};

use common::{Script, Step, client, policy, status};

/// A span's fields, by name, as text.
type FieldList = Vec<(String, String)>;

/// The spans a test saw: name and fields.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(String, FieldList)>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>>
    tracing_subscriber::Layer<S> for Spans
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push((
            format!("{}#{}", attrs.metadata().name(), id.into_u64()),
            fields,
        ));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((format!("event:{}#0", event.metadata().level()), fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().unwrap();
        let suffix = format!("#{}", id.into_u64());
        if let Some((_, fields)) = spans
            .iter_mut()
            .rev()
            .find(|(name, _)| name.ends_with(&suffix))
        {
            values.record(&mut Fields(fields));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn spans_tell_the_operation_from_its_attempts_and_hold_no_secrets() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let script = Script::new([
        status(503),
        Step::Answer(
            201,
            vec![("operation-id", "op-5")],
            r#"{"card":"4242424242424242"}"#,
        ),
    ]);
    let call = Call::post_json(
        "http://127.0.0.1:1/orders",
        &serde_json::json!({"card": "4242424242424242"}),
    )
    .unwrap()
    .header("authorization", "Bearer s3cret-token")
    .unwrap()
    .header("cookie", "session=c00kie")
    .unwrap();
    let outcome = client(&script)
        .execute(Intent::new(policy()), &call)
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)));
    let spans = spans.0.lock().unwrap().clone();
    let named = |name: &str| -> Vec<FieldList> {
        spans
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{name}#")))
            .map(|(_, f)| f.clone())
            .collect()
    };
    let field = |fields: &[(String, String)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let operations = named("idem.operation");
    assert_eq!(operations.len(), 1, "one span for the business operation");
    assert_eq!(
        field(&operations[0], "idem.outcome").as_deref(),
        Some("\"completed\"")
    );
    assert_eq!(field(&operations[0], "idem.attempts").as_deref(), Some("2"));
    assert_eq!(
        field(&operations[0], "idem.operation_id").as_deref(),
        Some("\"op-5\"")
    );
    let attempts = named("idem.attempt");
    assert_eq!(attempts.len(), 2, "one span per attempt");
    assert_eq!(
        field(&attempts[0], "http.request.resend_count"),
        None,
        "absent on the first"
    );
    assert_eq!(
        field(&attempts[1], "http.request.resend_count").as_deref(),
        Some("1")
    );
    assert_eq!(
        field(&attempts[0], "http.response.status_code").as_deref(),
        Some("503")
    );
    let events = named("event:INFO");
    assert_eq!(
        events.len(),
        1,
        "one event for the failed attempt: {events:?}"
    );
    assert!(format!("{:?}", events[0]).contains("retryable status"));
    let everything = format!("{spans:?}");
    for secret in ["4242424242424242", "s3cret-token", "c00kie"] {
        assert!(
            !everything.contains(secret),
            "{secret} leaked into spans: {everything}"
        );
    }
}
