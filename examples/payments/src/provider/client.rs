//! The provider's client: one `POST /charges` per call, within a timeout, its answer
//! sorted into a charge, a decline or an unknown outcome.

use std::net::IpAddr;
use std::time::Duration;

use idem::headers::IDEMPOTENCY_KEY;
use reqwest::{StatusCode, Url};
use serde::Deserialize;

use super::{CHARGES_PATH, Charge, ChargeError, ChargeRequest, Decline, MAX_KEY_LEN, is_valid_key};

/// The largest answer body the client reads, in bytes (64 KiB); a larger one is not the
/// expected answer.
const MAX_ANSWER: usize = 64 * 1024;

/// The longest provider `code` quoted in an unknown outcome's sentence, in bytes.
const MAX_QUOTED_CODE: usize = 64;

/// Why a [`Provider`] cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The base URL is not an `http://` or `https://` URL.
    #[error("the provider's URL must start with http:// or https://, not {0}:")]
    NotHttp(String),
    /// reqwest could not build its client (its TLS backend failed to start).
    #[error("the HTTP client for the provider cannot be built: {0}")]
    Client(#[from] reqwest::Error),
}

/// A client of the payment provider (the protocol is in the [module's docs](super)).
///
/// Cheap to clone: clones share one connection pool.
#[derive(Clone, Debug)]
pub struct Provider {
    http: reqwest::Client,
    charges: Url,
    timeout: Duration,
}

impl Provider {
    /// A client of the provider at `base_url` (such as `http://127.0.0.1:4000` or
    /// `https://api.provider.example/v1/`); each charge is `POST {base_url}/charges` and
    /// gets at most `timeout` from its start to its answer's last byte.
    ///
    /// Redirects are not followed (a charge is not re-sent elsewhere). System proxies
    /// (`HTTPS_PROXY`, …) are used, but for a loopback address or `localhost`.
    ///
    /// # Errors
    ///
    /// [`SetupError::NotHttp`] when `base_url` is not `http` or `https`;
    /// [`SetupError::Client`] when reqwest's client cannot start.
    pub fn new(base_url: Url, timeout: Duration) -> Result<Provider, SetupError> {
        let not_http = || SetupError::NotHttp(base_url.scheme().to_owned());
        if !matches!(base_url.scheme(), "http" | "https") {
            return Err(not_http());
        }
        let mut charges = base_url.clone();
        charges.set_query(None);
        charges.set_fragment(None);
        charges
            .path_segments_mut()
            .map_err(|()| not_http())?
            .pop_if_empty()
            .push(CHARGES_PATH);
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none());
        if is_loopback(&base_url) {
            builder = builder.no_proxy();
        }
        Ok(Provider {
            http: builder.build()?,
            charges,
            timeout,
        })
    }

    /// The URL each charge is posted to: `{base_url}/charges`.
    pub fn charges_url(&self) -> &Url {
        &self.charges
    }

    /// Charges `charge` under `idempotency_key`: the same key and the same request make
    /// at most one charge, however many times they are sent.
    ///
    /// # Errors
    ///
    /// [`ChargeError::Declined`] when the provider answers 402 (its body parsed; a body
    /// that does not parse is still a decline, with the code [`Decline::UNREADABLE`]).
    /// [`ChargeError::Unknown`] for everything else that is not a 200 or 201 with
    /// `{"id": "…"}`: no answer within the timeout, a connection refused, closed or
    /// reset, any other status (409, 422, 429, 5xx, …), or an answer body that is not the
    /// expected JSON or larger than 64 KiB. A key that is not 1 to 255 visible ASCII
    /// characters is also `Unknown`, and nothing is sent.
    pub async fn charge(
        &self,
        charge: &ChargeRequest,
        idempotency_key: &str,
    ) -> Result<Charge, ChargeError> {
        if !is_valid_key(idempotency_key) {
            return Err(ChargeError::Unknown(format!(
                "the idempotency key is not 1 to {MAX_KEY_LEN} visible ASCII characters; \
                 nothing was sent"
            )));
        }
        let mut response = self
            .http
            .post(self.charges.clone())
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .json(charge)
            .send()
            .await
            .map_err(|error| ChargeError::Unknown(self.no_answer(&error)))?;
        let status = response.status();
        let body = self.read_body(&mut response).await;
        match status {
            StatusCode::OK | StatusCode::CREATED => charge_from(status, body),
            StatusCode::PAYMENT_REQUIRED => Err(ChargeError::Declined(decline_from(body))),
            _ => Err(ChargeError::Unknown(other_status(status, body.ok()))),
        }
    }

    /// The sentence for a request that got no answer.
    fn no_answer(&self, error: &reqwest::Error) -> String {
        if error.is_timeout() {
            format!("the provider did not answer within {:?}", self.timeout)
        } else if error.is_connect() {
            format!("the provider could not be reached ({})", root_cause(error))
        } else {
            format!(
                "the connection to the provider failed before an answer ({})",
                root_cause(error)
            )
        }
    }

    /// The answer's body, at most [`MAX_ANSWER`] bytes; else a sentence saying why not
    /// (it follows "its body").
    async fn read_body(&self, response: &mut reqwest::Response) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() > MAX_ANSWER => {
                    return Err(format!("is larger than {} KiB", MAX_ANSWER / 1024));
                }
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => return Ok(body),
                Err(error) if error.is_timeout() => {
                    return Err(format!("did not end within {:?}", self.timeout));
                }
                Err(error) => return Err(format!("was cut short ({})", root_cause(&error))),
            }
        }
    }
}

/// A 200 or 201: the charge, if its body is `{"id": "…"}`.
fn charge_from(status: StatusCode, body: Result<Vec<u8>, String>) -> Result<Charge, ChargeError> {
    let body = body.map_err(|why| {
        ChargeError::Unknown(format!(
            "the provider answered {status}, but its body {why}"
        ))
    })?;
    match serde_json::from_slice::<Charge>(&body) {
        Ok(charge) if !charge.id.is_empty() => Ok(charge),
        _ => Err(ChargeError::Unknown(format!(
            "the provider answered {status} with a body that is not {{\"id\": \"…\"}}"
        ))),
    }
}

/// A 402: the provider's decline, or, when its body does not parse, a decline all the same.
fn decline_from(body: Result<Vec<u8>, String>) -> Decline {
    body.ok()
        .and_then(|body| serde_json::from_slice::<Decline>(&body).ok())
        .unwrap_or_else(|| Decline {
            code: Decline::UNREADABLE.to_owned(),
            message: "The provider declined the charge; its answer could not be read.".to_owned(),
        })
}

/// The sentence for any other status, with the provider's `code` when it has a short one
/// (never its `message`, which might quote the request).
fn other_status(status: StatusCode, body: Option<Vec<u8>>) -> String {
    #[derive(Deserialize)]
    struct Code {
        code: String,
    }
    let code = body
        .and_then(|body| serde_json::from_slice::<Code>(&body).ok())
        .map(|c| c.code)
        .filter(|code| {
            (1..=MAX_QUOTED_CODE).contains(&code.len())
                && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    match code {
        Some(code) => format!("the provider answered {status} ({code})"),
        None => format!("the provider answered {status}"),
    }
}

/// The innermost error of `error`'s chain: the one that says what happened
/// ("connection reset by peer"), without reqwest's wrapping and its URL.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// Whether `url` names this machine: `localhost` or a loopback address.
fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
