//! Sending the scenario's request: what the scenarios do, and what a check of proof 5
//! does again after an operator's resolution ([`Evidence::resend`](crate::Evidence::resend)).

use std::fmt;

use crate::harness::Request;
use crate::jar::Jar;
use crate::seen::Seen;
use idem_runtime::TestFault;
use idem_runtime::headers::{IDEMPOTENT_REPLAYED, TEST_FAULT};

/// The request of a run, with everything every send adds to it.
#[derive(Clone)]
pub(super) struct Sender {
    pub(super) client: reqwest::Client,
    pub(super) request: Request,
    /// The service's own base URL (not the proxy's).
    pub(super) base: reqwest::Url,
    pub(super) key_header: String,
    /// The headers that say who the client is, sent with every request and lookup.
    pub(super) client_headers: Vec<(String, String)>,
    /// The header that correlates an answer with its operation (proof 2).
    pub(super) operation_id_header: String,
    /// The run's cookies, sent with every request and lookup, kept from every answer.
    pub(super) jar: Jar,
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("request", &self.request)
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// The request with `key` (and `fault`) to `base`, and the answer as it came.
    pub(super) async fn send(
        &self,
        base: &reqwest::Url,
        key: &str,
        fault: Option<TestFault>,
    ) -> Seen {
        let url = match base.join(&self.request.path) {
            Ok(url) => url,
            Err(e) => return Seen::broken(e.to_string()),
        };
        let mut builder = self
            .with_client(self.client.request(self.request.method.clone(), url))
            .body(self.request.body.clone())
            .header(self.key_header.as_str(), key);
        for (name, value) in &self.request.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(fault) = fault {
            builder = builder.header(TEST_FAULT, fault.header_value());
        }
        self.read(builder).await
    }

    /// `GET url` as the client (its headers and cookies), and the answer as it came.
    pub(super) async fn get(&self, url: reqwest::Url) -> Seen {
        self.read(self.with_client(self.client.get(url))).await
    }

    /// `builder` with the client headers and the jar's cookies.
    fn with_client(&self, mut builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (name, value) in &self.client_headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(cookies) = self.jar.header() {
            builder = builder.header(http::header::COOKIE, cookies);
        }
        builder
    }

    /// Sends `builder` and reads the answer, keeping the cookies it sets.
    async fn read(&self, builder: reqwest::RequestBuilder) -> Seen {
        let response = match builder.send().await {
            Ok(response) => response,
            Err(e) => return Seen::broken(describe_error(&e)),
        };
        for set in response.headers().get_all(http::header::SET_COOKIE) {
            if let Ok(set) = set.to_str() {
                self.jar.set(set);
            }
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut seen = Seen {
            status: Some(response.status().as_u16()),
            operation_id: header(&self.operation_id_header),
            replayed: header(IDEMPOTENT_REPLAYED).is_some_and(|v| v == "true"),
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
}

/// The `type` of a problem body.
pub(super) fn problem_type(body: &[u8]) -> Option<String> {
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
