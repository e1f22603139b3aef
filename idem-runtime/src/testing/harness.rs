//! The harness: its configuration, the scenarios, and the proofs they check.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::proxy::Proxy;
use super::report::{Report, Scenario, ScenarioReport, Verdict};
use crate::fault::{TEST_FAULT_HEADER, TestFault};
use crate::{IDEMPOTENT_REPLAYED_HEADER, OPERATION_ID_HEADER};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Counter = Arc<dyn Fn() -> BoxFuture<Result<u64, String>> + Send + Sync>;
type Check = Arc<dyn Fn(Evidence) -> BoxFuture<Verdict> + Send + Sync>;

/// The request the harness sends (each scenario with keys of its own).
#[derive(Clone, Debug)]
pub struct Request {
    method: http::Method,
    path: String,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
}

impl Request {
    /// A request `method path` without a body.
    pub fn new(method: http::Method, path: impl Into<String>) -> Request {
        Request {
            method,
            path: path.into(),
            body: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// `POST path` with `body` as `application/json`.
    pub fn post_json(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Request {
        Request::new(http::Method::POST, path)
            .with_header("content-type", "application/json")
            .with_body(body)
    }

    /// This request with `body`.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// This request with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Why the harness could not run (its own configuration, or a service it cannot reach).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The base URL cannot be read.
    #[error("the base URL `{url}` is not a URL: {why}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why.
        why: String,
    },
    /// The base URL is not on loopback (the harness makes the service fail on purpose).
    #[error(
        "the base URL `{0}` is not on loopback: the harness runs only against 127.0.0.1, ::1 or localhost"
    )]
    NotLoopback(String),
    /// The request to send is missing or unusable.
    #[error("the request to send is unusable: {0}")]
    BadRequest(String),
    /// No way to count business effects was given.
    #[error(
        "no way to count business effects: call `Harness::count_effects` with a closure that counts them"
    )]
    NoEffectCounter,
    /// The effect counter failed.
    #[error("counting the business effects failed: {0}")]
    EffectCounter(String),
    /// The service cannot be reached.
    #[error("the service at {addr} cannot be reached: {why}")]
    Unreachable {
        /// Its address.
        addr: String,
        /// Why.
        why: String,
    },
    /// A local socket (the in-process server, the proxy) could not be opened.
    #[error("the harness could not open a local socket: {0}")]
    Io(#[from] std::io::Error),
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// One answer as the harness saw it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Its status, when a status line arrived.
    pub status: Option<u16>,
    /// Its `Operation-Id`.
    pub operation_id: Option<String>,
    /// Whether it said `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// Its `Retry-After`.
    pub retry_after: Option<String>,
    /// Its `Location`.
    pub location: Option<String>,
    /// The `type` of its problem body, if it is one.
    pub problem_type: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
    /// Why the answer is not complete (the connection broke, the time ran out).
    pub error: Option<String>,
}

impl Seen {
    fn complete(&self) -> bool {
        self.error.is_none() && self.status.is_some()
    }

    fn status(&self) -> u16 {
        self.status.unwrap_or(0)
    }

    fn success(&self) -> bool {
        self.complete() && (200..300).contains(&self.status()) && self.status() != 202
    }

    /// An answer that gives the state of an unfinished operation: 202, or a 409 / 425 /
    /// 503 that says when to come back (`Retry-After`).
    fn is_state(&self) -> bool {
        self.complete()
            && (self.status() == 202
                || (matches!(self.status(), 409 | 425 | 503) && self.retry_after.is_some()))
    }

    fn describe(&self) -> String {
        let mut out = match (self.status, &self.error) {
            (_, Some(error)) => format!("no complete answer ({error})"),
            (Some(status), None) => status.to_string(),
            (None, None) => "no answer".into(),
        };
        if let Some(t) = &self.problem_type {
            out.push_str(&format!(" {}", short_type(t)));
        }
        if self.replayed {
            out.push_str(" (replayed)");
        }
        out
    }
}

fn short_type(t: &str) -> &str {
    t.rsplit(':').next().unwrap_or(t)
}

/// What one scenario observed, handed to a plugged-in check of proof 4 or 5.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// The scenario.
    pub scenario: Scenario,
    /// Its idempotency key.
    pub key: String,
    /// The answers, in the order they arrived (a lost answer as the proxy read it).
    pub answers: Vec<Seen>,
    /// The business effects counted during the scenario.
    pub effects: u64,
    /// The status lookup's answer at the end, if a lookup was configured and answered
    /// 200 with JSON.
    pub lookup: Option<serde_json::Value>,
}

impl Evidence {
    /// The distinct `Operation-Id`s of the answers, in order.
    pub fn operation_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for id in self.answers.iter().filter_map(|a| a.operation_id.clone()) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
}

enum Target {
    Url(reqwest::Url),
    Router(axum::Router),
}

/// The conformance harness: see [the module](super).
///
/// # Default
///
/// - key header: `Idempotency-Key`; no client header;
/// - no status lookup, no trace check, no operator check;
/// - concurrent requests: 10;
/// - a crash's recovery awaited for at most 10 s (at least one lease of the service);
/// - each answer awaited for at most 10 s.
pub struct Harness {
    target: Target,
    request: Option<Request>,
    key_header: String,
    client: Option<(String, String)>,
    status_lookup: Option<String>,
    effects: Option<Counter>,
    concurrency: usize,
    recovery_within: Duration,
    answer_timeout: Duration,
    trace: Option<Check>,
    operator: Option<Check>,
    scenarios: Vec<Scenario>,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("request", &self.request)
            .field("key_header", &self.key_header)
            .field("status_lookup", &self.status_lookup)
            .field("scenarios", &self.scenarios)
            .finish_non_exhaustive()
    }
}

impl Harness {
    fn with_target(target: Target) -> Harness {
        Harness {
            target,
            request: None,
            key_header: "Idempotency-Key".into(),
            client: None,
            status_lookup: None,
            effects: None,
            concurrency: 10,
            recovery_within: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(10),
            trace: None,
            operator: None,
            scenarios: Scenario::ALL.to_vec(),
        }
    }

    /// A harness that serves `router` itself, on `127.0.0.1` (real sockets), while it
    /// runs.
    pub fn for_router(router: axum::Router) -> Harness {
        Harness::with_target(Target::Router(router))
    }

    /// A harness against the service at `base` (`http://127.0.0.1:3000`); the request's
    /// path is joined to it.
    ///
    /// # Errors
    ///
    /// [`HarnessError::BadUrl`] when `base` is not an `http` URL with a host,
    /// [`HarnessError::NotLoopback`] when its host is not a loopback address.
    pub fn for_url(base: &str) -> Result<Harness, HarnessError> {
        let bad = |why: &str| HarnessError::BadUrl {
            url: base.chars().take(200).collect(),
            why: why.into(),
        };
        let url = reqwest::Url::parse(base.trim()).map_err(|e| bad(&e.to_string()))?;
        if url.scheme() != "http" {
            return Err(bad(
                "the scheme must be `http` (the proxy speaks plain HTTP/1.1)",
            ));
        }
        let loopback = match url.host_str() {
            Some(host) => match host_ip(host) {
                Some(ip) => ip.is_loopback(),
                None => host.eq_ignore_ascii_case("localhost"),
            },
            None => return Err(bad("it has no host")),
        };
        if !loopback {
            return Err(HarnessError::NotLoopback(base.chars().take(200).collect()));
        }
        Ok(Harness::with_target(Target::Url(url)))
    }

    /// The request to send (required).
    pub fn request(mut self, request: Request) -> Harness {
        self.request = Some(request);
        self
    }

    /// The header that carries the idempotency key.
    pub fn key_header(mut self, name: impl Into<String>) -> Harness {
        self.key_header = name.into();
        self
    }

    /// The header (and its value) that tells the service who the client is, sent with
    /// every request and status lookup.
    pub fn client_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Harness {
        self.client = Some((name.into(), value.into()));
        self
    }

    /// The status lookup's path, with `{key}` where the key goes
    /// (`/orders/operations/{key}`).
    pub fn status_lookup(mut self, path: impl Into<String>) -> Harness {
        self.status_lookup = Some(path.into());
        self
    }

    /// How to count the operation's business effects (required): the harness counts
    /// before and after each scenario, so the count must cover at least every effect of
    /// this operation (rows in the orders table, say).
    pub fn count_effects<F, Fut, E>(mut self, count: F) -> Harness
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, E>> + Send + 'static,
        E: fmt::Display,
    {
        let count = Arc::new(count);
        self.effects = Some(Arc::new(move || {
            let fut = count();
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
        }));
        self
    }

    /// The check of proof 4 (the trace shows both physical attempts and one final
    /// outcome), given what a scenario observed: reads the spans of its operation id
    /// wherever they are collected and says [`Verdict::Pass`] or [`Verdict::Fail`].
    /// Without it, proof 4 is not checked.
    pub fn check_trace<F, Fut>(mut self, check: F) -> Harness
    where
        F: Fn(Evidence) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        self.trace = Some(Arc::new(move |e| Box::pin(check(e))));
        self
    }

    /// The check of proof 5 (an operator can restore the state without editing the
    /// database): asks the operator's tooling about the scenario's operation. Without it,
    /// proof 5 is not checked.
    pub fn check_operator<F, Fut>(mut self, check: F) -> Harness
    where
        F: Fn(Evidence) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        self.operator = Some(Arc::new(move |e| Box::pin(check(e))));
        self
    }

    /// How many requests with one key the concurrent scenario sends at once (at least 2).
    pub fn concurrency(mut self, requests: usize) -> Harness {
        self.concurrency = requests.max(2);
        self
    }

    /// How long the crash scenario waits for recovery to decide (keep it above the
    /// service's lease).
    pub fn recovery_within(mut self, within: Duration) -> Harness {
        self.recovery_within = within;
        self
    }

    /// How long each answer is awaited.
    pub fn answer_timeout(mut self, timeout: Duration) -> Harness {
        self.answer_timeout = timeout;
        self
    }

    /// Only these scenarios (in [`Scenario::ALL`]'s order).
    pub fn scenarios(mut self, only: impl IntoIterator<Item = Scenario>) -> Harness {
        let only: Vec<Scenario> = only.into_iter().collect();
        self.scenarios = Scenario::ALL
            .into_iter()
            .filter(|s| only.contains(s))
            .collect();
        self
    }

    /// Runs the scenarios and returns the report.
    ///
    /// # Errors
    ///
    /// The configuration is unusable (no request, no effect counter, a bad header), the
    /// service cannot be reached, or the effect counter fails.
    pub async fn run(self) -> Result<Report, HarnessError> {
        let request = self.request.clone().ok_or_else(|| {
            HarnessError::BadRequest("no request: call `Harness::request`".into())
        })?;
        check_request(&request, &self.key_header, self.client.as_ref())?;
        let effects = self.effects.clone().ok_or(HarnessError::NoEffectCounter)?;
        let (base, _server) = match &self.target {
            Target::Url(url) => (url.clone(), None),
            Target::Router(router) => {
                let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
                let addr = listener.local_addr()?;
                let router = router.clone();
                let server = tokio::spawn(async move {
                    let _ = axum::serve(listener, router).await;
                });
                let url = reqwest::Url::parse(&format!("http://{addr}/"))
                    .map_err(|e| HarnessError::Client(e.to_string()))?;
                (url, Some(AbortOnDrop(server)))
            }
        };
        let addr = socket_addr(&base)?;
        match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(HarnessError::Unreachable {
                    addr: addr.to_string(),
                    why: e.to_string(),
                });
            }
            Err(_) => {
                return Err(HarnessError::Unreachable {
                    addr: addr.to_string(),
                    why: "no connection within 5 s".into(),
                });
            }
        }
        let client = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .timeout(self.answer_timeout)
            .build()
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        let run = Run {
            harness: &self,
            request,
            base,
            addr,
            client,
            effects,
        };
        // Proves the counter works before anything is sent.
        run.count().await?;
        let mut scenarios = Vec::new();
        for scenario in &self.scenarios {
            scenarios.push(run.scenario(*scenario).await?);
        }
        Ok(Report { scenarios })
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn check_request(
    request: &Request,
    key_header: &str,
    client: Option<&(String, String)>,
) -> Result<(), HarnessError> {
    let bad = |why: String| Err(HarnessError::BadRequest(why));
    if request.path.is_empty() || !request.path.starts_with('/') {
        return bad(format!(
            "the path `{}` must start with `/`",
            request.path.chars().take(200).collect::<String>()
        ));
    }
    if reqwest::Url::parse("http://127.0.0.1/")
        .and_then(|u| u.join(&request.path))
        .is_err()
    {
        return bad("the path cannot be joined to the base URL".into());
    }
    let mut headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    headers.push((key_header, "key"));
    if let Some((n, v)) = client {
        headers.push((n, v));
    }
    for (name, value) in headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return bad(format!("`{name}` is not a header name"));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return bad(format!("the value of `{name}` is not a header value"));
        }
    }
    Ok(())
}

fn socket_addr(url: &reqwest::Url) -> Result<SocketAddr, HarnessError> {
    let port = url.port_or_known_default().unwrap_or(80);
    let ip = url
        .host_str()
        .and_then(host_ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    Ok(SocketAddr::new(ip, port))
}

/// The address a URL's host names (`[::1]` is IPv6), if it is one.
fn host_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn new_key() -> String {
    format!("monday-{}", uuid::Uuid::now_v7())
}

/// One run of the harness.
struct Run<'h> {
    harness: &'h Harness,
    request: Request,
    base: reqwest::Url,
    addr: SocketAddr,
    client: reqwest::Client,
    effects: Counter,
}

impl Run<'_> {
    async fn count(&self) -> Result<u64, HarnessError> {
        (self.effects)().await.map_err(HarnessError::EffectCounter)
    }

    async fn send(&self, base: &reqwest::Url, key: &str, fault: Option<TestFault>) -> Seen {
        let url = match base.join(&self.request.path) {
            Ok(url) => url,
            Err(e) => {
                return Seen {
                    error: Some(e.to_string()),
                    ..Seen::default()
                };
            }
        };
        let mut builder = self
            .client
            .request(self.request.method.clone(), url)
            .body(self.request.body.clone())
            .header(self.harness.key_header.as_str(), key);
        for (name, value) in &self.request.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some((name, value)) = &self.harness.client {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(fault) = fault {
            builder = builder.header(TEST_FAULT_HEADER, fault.header_value());
        }
        let response = match builder.send().await {
            Ok(response) => response,
            Err(e) => {
                return Seen {
                    error: Some(describe_error(&e)),
                    ..Seen::default()
                };
            }
        };
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut seen = Seen {
            status: Some(response.status().as_u16()),
            operation_id: header(OPERATION_ID_HEADER),
            replayed: header(IDEMPOTENT_REPLAYED_HEADER).is_some_and(|v| v == "true"),
            retry_after: header("retry-after"),
            location: header("location"),
            ..Seen::default()
        };
        match response.bytes().await {
            Ok(body) => seen.body = body.to_vec(),
            Err(e) => seen.error = Some(format!("the answer was cut: {}", describe_error(&e))),
        }
        seen.problem_type = problem_type(&seen.body);
        seen
    }

    async fn lookup(&self, key: &str) -> Option<serde_json::Value> {
        let path = self.harness.status_lookup.as_ref()?;
        let path = path.replace("{key}", key);
        let url = self.base.join(&path).ok()?;
        let mut builder = self.client.get(url);
        if let Some((name, value)) = &self.harness.client {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let response = builder.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        serde_json::from_slice(&response.bytes().await.ok()?).ok()
    }

    async fn scenario(&self, scenario: Scenario) -> Result<ScenarioReport, HarnessError> {
        let key = new_key();
        let before = self.count().await?;
        let (answers, [one, linked, result]) = match scenario {
            Scenario::LostAnswer => self.lost_answer(&key, before).await?,
            Scenario::TooManyRequests => self.refused(&key, before, 429).await?,
            Scenario::Transient503 => self.refused(&key, before, 503).await?,
            Scenario::Permanent400 => self.refused(&key, before, 400).await?,
            Scenario::Concurrent => self.concurrent(&key, before).await?,
            Scenario::Crash => self.crash(&key, before).await?,
        };
        let effects = self.count().await?.saturating_sub(before);
        let lookup = self.lookup(&key).await;
        let linked = with_lookup(scenario, linked, &answers, lookup.as_ref());
        let evidence = Evidence {
            scenario,
            key: key.clone(),
            answers,
            effects,
            lookup,
        };
        let trace = match &self.harness.trace {
            Some(check) => check(evidence.clone()).await,
            None => Verdict::NotChecked(format!(
                "no trace check plugged in (Harness::check_trace); the answers show {} request(s) under {}",
                evidence.answers.len(),
                ids_summary(&evidence.operation_ids())
            )),
        };
        let operator = match &self.harness.operator {
            Some(check) => check(evidence.clone()).await,
            None => Verdict::NotChecked(match &evidence.lookup {
                Some(found) => format!(
                    "no operator check plugged in (Harness::check_operator); {}",
                    lookup_summary(found)
                ),
                None => {
                    "no operator check plugged in (Harness::check_operator), no status lookup read"
                        .into()
                }
            }),
        };
        Ok(ScenarioReport {
            scenario,
            key,
            proofs: [one, linked, result, trace, operator],
        })
    }

    /// The answer is lost on the way back; the same request again.
    async fn lost_answer(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let proxy = Proxy::start(self.addr).await?;
        let via = reqwest::Url::parse(&format!("http://{}/", proxy.addr()))
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        let first = self.send(&via, key, None).await;
        let lost = proxy.exchanges().into_iter().next();
        drop(proxy);
        let retry = self.send(&self.base, key, None).await;
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(effects, 1, "2 requests with one key, the first answer lost");
        let Some(lost) = lost else {
            let why = format!(
                "the proxy got no answer from the service for the first request ({})",
                first.describe()
            );
            return Ok((
                vec![first, retry],
                [one, Verdict::Fail(why.clone()), Verdict::Fail(why)],
            ));
        };
        let lost_seen = Seen {
            status: Some(lost.status),
            operation_id: lost.operation_id.clone(),
            replayed: lost.replayed,
            body: lost.body.clone(),
            problem_type: problem_type(&lost.body),
            ..Seen::default()
        };
        let linked = same_operation(&[&lost_seen, &retry]);
        let result =
            if retry.complete() && retry.status == lost_seen.status && retry.body == lost_seen.body
            {
                Verdict::Pass(format!(
                    "the lost {} came back byte for byte{}",
                    lost.status,
                    if retry.replayed {
                        " (Idempotent-Replayed: true)"
                    } else {
                        ""
                    }
                ))
            } else if retry.is_state() {
                Verdict::Pass(format!("the state of the operation: {}", retry.describe()))
            } else {
                Verdict::Fail(format!(
                    "the lost answer was {}, the retry got {}{}",
                    lost.status,
                    retry.describe(),
                    if retry.status == lost_seen.status {
                        " with another body: not the stored result"
                    } else {
                        ""
                    }
                ))
            };
        Ok((vec![lost_seen, retry], [one, linked, result]))
    }

    /// The operation refuses with `status` (the test fault); the same request again,
    /// without the fault.
    async fn refused(&self, key: &str, before: u64, status: u16) -> Result<Outcome, HarnessError> {
        let fault = TestFault::Answer(status);
        let first = self.send(&self.base, key, Some(fault)).await;
        let mid = self.count().await?.saturating_sub(before);
        let wait = first
            .retry_after
            .as_deref()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, |s| Duration::from_secs(s.min(1)));
        tokio::time::sleep(wait).await;
        let retry = self.send(&self.base, key, None).await;
        let after = self.count().await?.saturating_sub(before);
        let permanent = status == 400;
        let one = if mid != 0 {
            Verdict::Fail(format!("{mid} effect(s) behind the {status} refusal"))
        } else if permanent {
            exactly(after, 0, "a permanent 400 and its retry with one key")
        } else {
            exactly(after, 1, &format!("a {status} and its retry with one key"))
        };
        let linked = same_operation(&[&first, &retry]);
        let result = if first.status != Some(status) {
            Verdict::Fail(format!(
                "the fault `{}` was not answered {status}: got {}",
                fault.header_value(),
                first.describe()
            ))
        } else if !permanent && first.retry_after.is_none() {
            Verdict::Fail(format!("the {status} has no Retry-After"))
        } else if permanent {
            if retry.complete() && retry.status == Some(400) && retry.body == first.body {
                Verdict::Pass(format!(
                    "the 400 is final: replayed to the retry{}",
                    if retry.replayed {
                        " (Idempotent-Replayed: true)"
                    } else {
                        ""
                    }
                ))
            } else {
                Verdict::Fail(format!(
                    "the permanent 400 was not replayed: the retry got {}",
                    retry.describe()
                ))
            }
        } else if retry.success() {
            Verdict::Pass(format!(
                "{status} with Retry-After: {}, then {} on the retry",
                first.retry_after.as_deref().unwrap_or(""),
                retry.describe()
            ))
        } else {
            Verdict::Fail(format!(
                "the retry after the {status} got {}, not the result",
                retry.describe()
            ))
        };
        Ok((vec![first, retry], [one, linked, result]))
    }

    /// Concurrent requests with one key, then one more once they have all answered.
    async fn concurrent(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let n = self.harness.concurrency;
        let all = futures_util::future::join_all((0..n).map(|_| self.send(&self.base, key, None)));
        let mut answers = all.await;
        let last = self.settled(key).await;
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(effects, 1, &format!("{n} requests with one key at once"));
        let (mut results, mut replayed, mut states, mut other) = (Vec::new(), 0, 0, Vec::new());
        for (i, a) in answers.iter().enumerate() {
            if a.success() {
                results.push(&a.body);
                replayed += usize::from(a.replayed);
            } else if a.is_state() {
                states += 1;
            } else {
                other.push(format!("request {}: {}", i + 1, a.describe()));
            }
        }
        let answered = results.len();
        results.sort();
        results.dedup();
        let result = if !other.is_empty() {
            Verdict::Fail(format!(
                "neither the result nor a state: {}",
                other.join("; ")
            ))
        } else if results.len() > 1 {
            Verdict::Fail(format!("{} different results for one key", results.len()))
        } else if !last.success() {
            Verdict::Fail(format!(
                "after they all answered, the same request got {}",
                last.describe()
            ))
        } else if results.first().is_some_and(|r| **r != last.body) {
            Verdict::Fail("after they all answered, the same request got another result".into())
        } else {
            Verdict::Pass(format!(
                "one result in {answered} answer(s) ({replayed} replayed), {states} state answer(s) (409/202 with Retry-After), then {}",
                last.describe()
            ))
        };
        answers.push(last);
        let refs: Vec<&Seen> = answers.iter().collect();
        let linked = same_operation(&refs);
        Ok((answers, [one, linked, result]))
    }

    /// The same request until it is not answered with a state, within the recovery time.
    async fn settled(&self, key: &str) -> Seen {
        let until = Instant::now() + self.harness.recovery_within;
        loop {
            let seen = self.send(&self.base, key, None).await;
            if !seen.is_state() || Instant::now() >= until {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The attempt dies after its effect; the same request until recovery decides.
    async fn crash(&self, key: &str, before: u64) -> Result<Outcome, HarnessError> {
        let started = Instant::now();
        let first = self
            .send(&self.base, key, Some(TestFault::CrashAfterEffect))
            .await;
        let until = started + self.harness.recovery_within;
        let mut answers = vec![first];
        loop {
            let seen = self.send(&self.base, key, None).await;
            let done = !seen.is_state() && seen.complete();
            answers.push(seen);
            if done || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let took = started.elapsed();
        let effects = self.count().await?.saturating_sub(before);
        let one = exactly(
            effects,
            1,
            "a crash after the effect and the retries with its key",
        );
        let refs: Vec<&Seen> = answers.iter().skip(1).collect();
        let linked = same_operation(&refs);
        let first = &answers[0];
        let last = answers.last().unwrap_or(first);
        let result = if first.complete() {
            Verdict::Fail(format!(
                "the fault `crash-after-effect` was not honoured: the first request got {}",
                first.describe()
            ))
        } else if last.success() {
            Verdict::Pass(format!(
                "recovery decided within {} ms: {} after {} state answer(s)",
                took.as_millis(),
                last.describe(),
                answers.len() - 2
            ))
        } else if last.is_state() {
            Verdict::Fail(format!(
                "no result within {} ms: still {} after {} retries (the key is blocked)",
                took.as_millis(),
                last.describe(),
                answers.len() - 1
            ))
        } else {
            Verdict::Fail(format!(
                "after the crash the retry got {}, not the result",
                last.describe()
            ))
        };
        Ok((answers, [one, linked, result]))
    }
}

/// Proof 2 with what the status lookup says: it names the answers' operation; after a
/// crash (whose attempt sent no answer, so no `Operation-Id`) it alone shows that the
/// retries continued the crashed attempt's operation: its attempt count is 2 or more.
fn with_lookup(
    scenario: Scenario,
    linked: Verdict,
    answers: &[Seen],
    lookup: Option<&serde_json::Value>,
) -> Verdict {
    let Verdict::Pass(evidence) = linked else {
        return linked;
    };
    let crash = scenario == Scenario::Crash;
    let Some(found) = lookup else {
        return if crash {
            Verdict::NotChecked(format!(
                "{evidence}, but the crashed attempt sent none: its link to the retries shows only in a status lookup (Harness::status_lookup)"
            ))
        } else {
            Verdict::Pass(evidence)
        };
    };
    let id = found.get("operation_id").and_then(|v| v.as_str());
    let first = answers.iter().find_map(|a| a.operation_id.as_deref());
    if let (Some(id), Some(first)) = (id, first)
        && id != first
    {
        return Verdict::Fail(format!(
            "{evidence}, but the status lookup names operation {id}"
        ));
    }
    if crash {
        match found.get("attempt").and_then(serde_json::Value::as_u64) {
            Some(n) if n >= 2 => {}
            Some(n) => {
                return Verdict::Fail(format!(
                    "{evidence}, but the status lookup counts {n} attempt(s): the crashed attempt is not part of this operation"
                ));
            }
            None => {
                return Verdict::NotChecked(format!(
                    "{evidence}; the status lookup gives no attempt count, so the crashed attempt's link is not shown"
                ));
            }
        }
    }
    Verdict::Pass(format!("{evidence}; {}", lookup_summary(found)))
}

/// The answers, and the verdicts on proofs 1 to 3.
type Outcome = (Vec<Seen>, [Verdict; 3]);

fn exactly(effects: u64, expected: u64, what: &str) -> Verdict {
    if effects == expected {
        Verdict::Pass(format!("{effects} effect(s) for {what}"))
    } else {
        Verdict::Fail(format!(
            "{effects} effect(s) for {what}, expected {expected}"
        ))
    }
}

/// Every complete answer carries one and the same `Operation-Id`.
fn same_operation(answers: &[&Seen]) -> Verdict {
    let complete: Vec<&&Seen> = answers.iter().filter(|a| a.complete()).collect();
    if complete.is_empty() {
        return Verdict::Fail("no complete answer to link".into());
    }
    if let Some(missing) = complete.iter().find(|a| a.operation_id.is_none()) {
        return Verdict::Fail(format!(
            "an answer ({}) has no Operation-Id",
            missing.describe()
        ));
    }
    let mut ids: Vec<&str> = complete
        .iter()
        .filter_map(|a| a.operation_id.as_deref())
        .collect();
    ids.dedup();
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > 1 {
        return Verdict::Fail(format!(
            "{} answers under {} different Operation-Ids: {}",
            complete.len(),
            distinct.len(),
            distinct.join(", ")
        ));
    }
    Verdict::Pass(format!(
        "{} answers under one Operation-Id {}",
        complete.len(),
        distinct[0]
    ))
}

fn ids_summary(ids: &[String]) -> String {
    match ids {
        [] => "no Operation-Id".into(),
        [one] => format!("Operation-Id {one}"),
        many => format!("{} Operation-Ids", many.len()),
    }
}

fn lookup_summary(found: &serde_json::Value) -> String {
    format!(
        "status lookup: state {}, attempt {}",
        found.get("state").and_then(|v| v.as_str()).unwrap_or("?"),
        found
            .get("attempt")
            .map_or_else(|| "?".into(), |v| v.to_string())
    )
}

fn problem_type(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value.get("type")?.as_str().map(str::to_owned)
}

fn describe_error(error: &reqwest::Error) -> String {
    let mut out = if error.is_timeout() {
        "timed out".to_owned()
    } else if error.is_connect() {
        "could not connect".to_owned()
    } else {
        "the connection broke".to_owned()
    };
    let mut source = std::error::Error::source(error);
    if let Some(s) = source.take() {
        out.push_str(&format!(": {s}"));
    }
    out
}
