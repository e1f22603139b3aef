//! The scripted transport shared by the paused-clock tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tokio::time::Instant;

use idem_client::transport::SendFuture;
use idem_client::{
    Answer, Backoff, Call, Client, Jitter, RetryBudget, RetryPolicy, Transport, TransportError,
};
use idem_contract::{Retryable, StatusCode as Status, TransportFailure};

/// One scripted step.
#[derive(Clone)]
pub enum Step {
    Answer(u16, Vec<(&'static str, &'static str)>, &'static str),
    Fail(TransportError),
    Hang,
}

pub fn status(code: u16) -> Step {
    Step::Answer(code, vec![], "")
}

pub fn with_retry_after(code: u16, seconds: &'static str) -> Step {
    Step::Answer(code, vec![("retry-after", seconds)], "")
}

pub fn problem(code: u16, slug: &'static str, retry_after: &'static str) -> Step {
    let body: &'static str = Box::leak(
        format!(
            r#"{{"type":"tag:idem.rs,2026:problem:{slug}","status":{code},"new_key_safe":false}}"#
        )
        .into_boxed_str(),
    );
    Step::Answer(
        code,
        vec![
            ("content-type", "application/problem+json"),
            ("retry-after", retry_after),
        ],
        body,
    )
}

/// A request as sent, and when.
pub type Sent = (Instant, Request<Bytes>);

/// Answers from a script, and records what was sent and when.
#[derive(Clone, Default)]
pub struct Script {
    steps: Arc<Mutex<VecDeque<Step>>>,
    lookups: Arc<Mutex<VecDeque<Step>>>,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Script {
        let script = Script::default();
        script.steps.lock().unwrap().extend(steps);
        script
    }

    /// The status lookup's next answer; the last one given answers every later lookup
    /// (none: 404).
    pub fn with_lookup(self, step: Step) -> Script {
        self.lookups.lock().unwrap().push_back(step);
        self
    }

    /// The status lookups sent (`GET`).
    pub fn lookups(&self) -> Vec<Sent> {
        self.sent()
            .into_iter()
            .filter(|(_, r)| r.method() == http::Method::GET)
            .collect()
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// The business requests sent (the status lookup's `GET` left out).
    pub fn posts(&self) -> Vec<Sent> {
        self.sent()
            .into_iter()
            .filter(|(_, r)| r.method() == http::Method::POST)
            .collect()
    }
}

impl Transport for Script {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        let lookup = request.method() == http::Method::GET;
        self.sent.lock().unwrap().push((Instant::now(), request));
        let step = if lookup {
            let mut lookups = self.lookups.lock().unwrap();
            if lookups.len() > 1 {
                lookups.pop_front().unwrap()
            } else {
                lookups.front().cloned().unwrap_or(status(404))
            }
        } else {
            self.steps
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(status(500))
        };
        Box::pin(async move {
            match step {
                Step::Answer(code, headers, body) => {
                    let mut map = HeaderMap::new();
                    for (name, value) in headers {
                        map.insert(name, HeaderValue::from_static(value));
                    }
                    Ok(Answer {
                        status: StatusCode::from_u16(code).unwrap(),
                        headers: map,
                        body: Bytes::from_static(body.as_bytes()),
                    })
                }
                Step::Fail(error) => Err(error),
                Step::Hang => std::future::pending().await,
            }
        })
    }
}

pub fn policy() -> RetryPolicy {
    RetryPolicy::builder("create_order")
        .max_attempts(4)
        .deadline(Duration::from_secs(30))
        .per_attempt(Duration::from_secs(5))
        .retryable([
            Retryable::Status(Status(429)),
            Retryable::Status(Status(503)),
            Retryable::Transport(TransportFailure::Timeout),
            Retryable::Transport(TransportFailure::ConnectionReset),
        ])
        .status_lookup("/orders/operations/{key}")
        .build()
        .unwrap()
        .with_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
}

pub fn call() -> Call {
    Call::post_json(
        "http://127.0.0.1:1/orders",
        &serde_json::json!({"amount": 1}),
    )
    .unwrap()
    .header("x-client-id", "acme")
    .unwrap()
}

pub fn client(script: &Script) -> Client<Script> {
    Client::with_transport(script.clone())
        .with_budget(RetryBudget::unlimited())
        .with_jitter(Jitter::seeded(7))
}

/// A status lookup's 200 report in `state` (`completed` with a stored 201
/// `{"id":"ord_7"}`, `processing` with `retry_after`).
pub fn report(state: &str, retry_after: u64) -> Step {
    let mut body = serde_json::json!({
        "operation": "create_order", "operation_id": "op-1", "key": "k", "state": state,
        "attempt": 1, "created_at": "x", "expires_at": "y", "new_key_safe": state == "released",
    });
    match state {
        "completed" => {
            body["response"] = serde_json::json!({
                "status": 201,
                "headers": {"content-type": "application/json"},
                "body": {"id": "ord_7"}
            })
        }
        "processing" => body["retry_after"] = retry_after.into(),
        "unknown" => body["reason"] = "lease_expired".into(),
        _ => {}
    }
    let body: &'static str = Box::leak(body.to_string().into_boxed_str());
    Step::Answer(200, vec![("content-type", "application/json")], body)
}
