//! HTTP status codes and transport failures, as named in `retryable`.

use std::borrow::Cow;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An HTTP status code (RFC 9110 §15), as written in a contract: `429`, `503`.
///
/// The value is not checked on construction; [`crate::check()`](fn@crate::check) refuses codes outside
/// 100–599 and codes that cannot be retried.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct StatusCode(pub u16);

/// The client-error statuses that are permanent: sending the same request again gets the
/// same answer (a 402 is the same decline of the same payment). Together with every 2xx
/// and 3xx they can never be retryable.
pub const PERMANENT_CLIENT_ERRORS: [u16; 10] = [400, 401, 402, 403, 404, 405, 410, 413, 415, 422];

impl StatusCode {
    /// The status as a number.
    pub const fn as_u16(self) -> u16 {
        self.0
    }

    /// Whether the code is a status code at all: 100 to 599 (RFC 9110 §15).
    pub const fn is_valid(self) -> bool {
        self.0 >= 100 && self.0 <= 599
    }

    /// Whether the answer is permanent: any 2xx or 3xx, or one of
    /// [`PERMANENT_CLIENT_ERRORS`]. A permanent answer stops the client at once.
    pub fn is_permanent(self) -> bool {
        (200..400).contains(&self.0) || PERMANENT_CLIENT_ERRORS.contains(&self.0)
    }

    /// The reason phrase of the status (RFC 9110 §15), or `""` for an unassigned code.
    pub const fn reason(self) -> &'static str {
        match self.0 {
            100 => "Continue",
            101 => "Switching Protocols",
            200 => "OK",
            201 => "Created",
            202 => "Accepted",
            204 => "No Content",
            301 => "Moved Permanently",
            302 => "Found",
            303 => "See Other",
            304 => "Not Modified",
            307 => "Temporary Redirect",
            308 => "Permanent Redirect",
            400 => "Bad Request",
            401 => "Unauthorized",
            402 => "Payment Required",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            409 => "Conflict",
            410 => "Gone",
            413 => "Content Too Large",
            415 => "Unsupported Media Type",
            422 => "Unprocessable Content",
            425 => "Too Early",
            429 => "Too Many Requests",
            500 => "Internal Server Error",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            _ => "",
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A failure in which no HTTP answer arrived.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TransportFailure {
    /// `timeout`: no answer came within the per-attempt timeout. The request may have
    /// been processed; retrying with the same key is what makes that safe.
    Timeout,
    /// `connection_reset`: the connection was closed or reset after the request was sent
    /// and before the answer arrived.
    ConnectionReset,
    /// `connection_refused`: the connection could not be opened, so nothing was sent.
    ConnectionRefused,
}

impl TransportFailure {
    /// Every transport failure, in declaration order.
    pub const ALL: [TransportFailure; 3] = [
        TransportFailure::Timeout,
        TransportFailure::ConnectionReset,
        TransportFailure::ConnectionRefused,
    ];

    /// The name written in `retryable = [..]`.
    pub const fn name(self) -> &'static str {
        match self {
            TransportFailure::Timeout => "timeout",
            TransportFailure::ConnectionReset => "connection_reset",
            TransportFailure::ConnectionRefused => "connection_refused",
        }
    }

    /// The failure called `name` in a contract, if any.
    pub fn from_name(name: &str) -> Option<TransportFailure> {
        TransportFailure::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of `retryable`: an HTTP status, or a failure with no answer at all.
///
/// Serialised as a number (`503`) or a name (`"timeout"`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(untagged)]
pub enum Retryable {
    /// An HTTP status that lets the client try again with the same key.
    Status(StatusCode),
    /// A transport failure that lets the client try again with the same key.
    Transport(TransportFailure),
}

impl fmt::Display for Retryable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retryable::Status(s) => s.fmt(f),
            Retryable::Transport(t) => t.fmt(f),
        }
    }
}

/// The list of `retryable` outcomes.
pub type RetryableList = Cow<'static, [Retryable]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanence_follows_design_section_3() {
        for code in [
            200, 201, 204, 301, 304, 400, 401, 402, 403, 404, 405, 410, 413, 415, 422,
        ] {
            assert!(StatusCode(code).is_permanent(), "{code}");
        }
        for code in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(!StatusCode(code).is_permanent(), "{code}");
        }
        assert!(!StatusCode(99).is_valid());
        assert!(!StatusCode(600).is_valid());
    }

    #[test]
    fn serde_forms() {
        let list: Vec<Retryable> =
            serde_json::from_str(r#"[503, "timeout", "connection_reset"]"#).unwrap();
        assert_eq!(
            list,
            [
                Retryable::Status(StatusCode(503)),
                Retryable::Transport(TransportFailure::Timeout),
                Retryable::Transport(TransportFailure::ConnectionReset)
            ]
        );
        assert!(serde_json::from_str::<Retryable>(r#""teapot""#).is_err());
    }
}
