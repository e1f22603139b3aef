//! What sends one request: reqwest, with its own retries turned off so that exactly one
//! layer retries, or anything else that implements [`Transport`] (a test's script).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};

use idem_contract::TransportFailure;

/// The largest answer body read: 16 MiB. A longer body is a transport failure
/// ([`TransportError::TooLarge`]), never a truncated answer.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// One answer, read whole.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// Why an attempt got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// No connection could be opened: nothing was sent.
    #[error("the connection could not be opened: {0}")]
    Refused(String),
    /// The connection closed or failed after the request may have been sent.
    #[error("the connection failed before the answer: {0}")]
    Reset(String),
    /// No answer within the per-attempt timeout.
    #[error("no answer within the per-attempt timeout")]
    Timeout,
    /// The answer's body is over [`MAX_ANSWER_BYTES`]. The server answered, so the
    /// operation may have run; the client does not retry it (the same answer would come
    /// again).
    #[error("the answer's body is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}

impl TransportError {
    /// The contract's name for this failure (`retryable = [timeout, ..]`).
    pub fn failure(&self) -> TransportFailure {
        match self {
            TransportError::Refused(_) => TransportFailure::ConnectionRefused,
            TransportError::Reset(_) | TransportError::TooLarge => {
                TransportFailure::ConnectionReset
            }
            TransportError::Timeout => TransportFailure::Timeout,
        }
    }

    /// Whether the request cannot have reached the server.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, TransportError::Refused(_))
    }
}

/// The future of [`Transport::send`].
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, TransportError>> + Send + 'a>>;

/// Sends one request and reads its answer. It must not retry: the client does.
pub trait Transport: Send + Sync {
    /// Sends `request` once. The client bounds it with the per-attempt timeout.
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_>;
}

/// reqwest, with `reqwest::retry` turned off.
#[derive(Clone, Debug)]
pub struct Reqwest {
    client: reqwest::Client,
}

impl Reqwest {
    /// A client from `builder`, with reqwest's own retries turned off
    /// (`retry(reqwest::retry::never())`: reqwest 0.13 retries some protocol-level
    /// refusals by default, which would stack with this client's retries).
    ///
    /// # Errors
    ///
    /// reqwest cannot build the client (its TLS backend fails to load, say).
    pub fn new(builder: reqwest::ClientBuilder) -> Result<Reqwest, reqwest::Error> {
        Ok(Reqwest {
            client: builder.retry(reqwest::retry::never()).build()?,
        })
    }

    /// The reqwest client, for requests outside a contract.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl Transport for Reqwest {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::from))
                .map_err(|e| TransportError::Refused(format!("the request is invalid: {e}")))?;
            let mut response = self.client.execute(request).await.map_err(classify)?;
            let status = response.status();
            let headers = std::mem::take(response.headers_mut());
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(classify)? {
                if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(TransportError::TooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Answer {
                status,
                headers,
                body: body.into(),
            })
        })
    }
}

/// The URL is left out of the message: its query may hold credentials.
fn classify(error: reqwest::Error) -> TransportError {
    let error = error.without_url();
    let message = error_chain(&error);
    if error.is_timeout() {
        TransportError::Timeout
    } else if error.is_connect() {
        TransportError::Refused(message)
    } else {
        TransportError::Reset(message)
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}
