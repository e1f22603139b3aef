//! The harness: its configuration, its errors, and how a run starts (the scenarios are in
//! `scenarios`).

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::jar::{Jar, cookie_problem};
use crate::report::{Report, Scenario, Verdict};
use crate::scenarios::Run;
use crate::seen::Evidence;
use crate::send::Sender;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
pub(super) type Counter = Arc<dyn Fn() -> BoxFuture<Result<u64, String>> + Send + Sync>;
type Check = Arc<dyn Fn(Evidence) -> BoxFuture<Verdict> + Send + Sync>;

/// The request the harness sends (each scenario with keys of its own).
#[derive(Clone, Debug)]
pub struct Request {
    pub(super) method: http::Method,
    pub(super) path: String,
    pub(super) body: Vec<u8>,
    pub(super) headers: Vec<(String, String)>,
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

enum Target {
    Url(reqwest::Url),
    Router(axum::Router),
}

/// The conformance harness: see [the module](super).
///
/// # Default
///
/// - key header: `Idempotency-Key`; no client header, no cookie given (those the
///   service sets are kept: [`Harness::cookie`]);
/// - proof 2 links answers by `Operation-Id`;
/// - no status lookup, no trace check, no operator check;
/// - concurrent requests: 10;
/// - a crash's recovery awaited for at most 10 s (at least one lease of the service);
/// - each answer awaited for at most 10 s.
pub struct Harness {
    target: Target,
    pub(super) request: Option<Request>,
    pub(super) key_header: String,
    pub(super) client: Vec<(String, String)>,
    pub(super) cookies: Vec<(String, String)>,
    pub(super) operation_id_header: String,
    pub(super) status_lookup: Option<String>,
    pub(super) effects: Option<Counter>,
    pub(super) concurrency: usize,
    pub(super) recovery_within: Duration,
    pub(super) answer_timeout: Duration,
    pub(super) trace: Option<Check>,
    pub(super) operator: Option<Check>,
    pub(super) scenarios: Vec<Scenario>,
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
            client: Vec::new(),
            cookies: Vec::new(),
            operation_id_header: "Operation-Id".into(),
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

    /// A header (and its value) that tells the service who the client is, sent with
    /// every request and status lookup. Call it again for each header more (a tenant and
    /// a client, say); the first one's value is the client's identity a check of proof 5
    /// looks the record up under ([`Evidence::client`]). Cookies go through
    /// [`Harness::cookie`], not a `cookie` header.
    pub fn client_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Harness {
        self.client.push((name.into(), value.into()));
        self
    }

    /// A cookie sent with every request and status lookup of the run (a session the
    /// service scopes its keys to, say); call it again for each cookie more.
    ///
    /// The run keeps one cookie jar: these cookies, and every cookie the service sets on
    /// any answer the harness reads (the lost answer too, which the proxy read), whatever
    /// its host, path or port (the run talks to one service on loopback, through the
    /// proxy's port too). A `Set-Cookie` replaces the cookie of its name; `Max-Age` of 0
    /// or less, or an `Expires` in the past, removes it.
    pub fn cookie(mut self, name: impl Into<String>, value: impl Into<String>) -> Harness {
        self.cookies.push((name.into(), value.into()));
        self
    }

    /// The answer header that names the operation an answer belongs to, by which proof 2
    /// links the repeat to the first attempt: idem's `Operation-Id` by default; a service
    /// that correlates with another header (`X-Request-Id`, say) names it here.
    pub fn operation_id_header(mut self, name: impl Into<String>) -> Harness {
        self.operation_id_header = name.into();
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
    /// Without it, proof 4 is not checked. The ready-made one reads idem's own spans:
    /// [`TraceCapture::check`](crate::TraceCapture::check).
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
    /// proof 5 is not checked. The ready-made one uses the store's operator calls (those
    /// of `idem ops`): [`OperatorCheck::check`](crate::OperatorCheck::check).
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
    /// Before the scenarios that need the test-fault protocol (429, 503, 400, crash), one
    /// probe finds out whether the service honours it ([`FaultProbe`](crate::FaultProbe)); when it does not,
    /// those scenarios are not run and their proofs are not checked, with the reason.
    ///
    /// # Errors
    ///
    /// The configuration is unusable (no request, no effect counter, a bad header or
    /// cookie), the service cannot be reached, or the effect counter fails.
    pub async fn run(self) -> Result<Report, HarnessError> {
        let request = self.request.clone().ok_or_else(|| {
            HarnessError::BadRequest("no request: call `Harness::request`".into())
        })?;
        check_request(&request, &self.key_header, &self.client)?;
        check_cookies(&self.cookies, &self.operation_id_header)?;
        let effects = self.effects.clone().ok_or(HarnessError::NoEffectCounter)?;
        let (base, _server) = self.serve().await?;
        let addr = socket_addr(&base)?;
        reach(addr).await?;
        let client = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .timeout(self.answer_timeout)
            .build()
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        let sender = Sender {
            client,
            request,
            base: base.clone(),
            key_header: self.key_header.clone(),
            client_headers: self.client.clone(),
            operation_id_header: self.operation_id_header.clone(),
            jar: Jar::new(&self.cookies),
        };
        let run = Run {
            harness: &self,
            base,
            addr,
            sender,
            effects,
        };
        // Proves the counter works before anything is sent.
        run.count().await?;
        run.all().await
    }

    /// The base URL of the service: the one given, or the router served on loopback
    /// (with the task that serves it, stopped when dropped).
    async fn serve(&self) -> Result<(reqwest::Url, Option<AbortOnDrop>), HarnessError> {
        match &self.target {
            Target::Url(url) => Ok((url.clone(), None)),
            Target::Router(router) => {
                let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
                let addr = listener.local_addr()?;
                let router = router.clone();
                let server = tokio::spawn(async move {
                    let _ = axum::serve(listener, router).await;
                });
                let url = reqwest::Url::parse(&format!("http://{addr}/"))
                    .map_err(|e| HarnessError::Client(e.to_string()))?;
                Ok((url, Some(AbortOnDrop(server))))
            }
        }
    }
}

/// The service accepts a connection within 5 s.
async fn reach(addr: SocketAddr) -> Result<(), HarnessError> {
    let why =
        match tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no connection within 5 s".into(),
        };
    Err(HarnessError::Unreachable {
        addr: addr.to_string(),
        why,
    })
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
    client: &[(String, String)],
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
    for (name, value) in client {
        if name.trim().eq_ignore_ascii_case("cookie") {
            return bad(format!(
                "the client header `{name}`: give cookies with `Harness::cookie`, one each"
            ));
        }
        headers.push((name, value));
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

/// The cookies can be sent, and the correlation header can be read.
fn check_cookies(cookies: &[(String, String)], operation_id: &str) -> Result<(), HarnessError> {
    if let Some(why) = cookies
        .iter()
        .find_map(|(name, value)| cookie_problem(name, value))
    {
        return Err(HarnessError::BadRequest(why));
    }
    if http::HeaderName::from_bytes(operation_id.as_bytes()).is_err() {
        return Err(HarnessError::BadRequest(format!(
            "`{operation_id}` (the operation id header) is not a header name"
        )));
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
