//! Client identity: the first half of a key's namespace.
//!
//! Keys live per client and per operation: two clients that pick the same key never see
//! each other's results. idem does not authenticate anyone; the application says who the
//! client is, from whatever its authentication left in the request (a header, a verified
//! token's subject, an extension put there by an auth middleware).
//!
//! ```
//! use axum::response::{IntoResponse, Response};
//! use http::{StatusCode, request::Parts};
//! use idem_runtime::identity::{self, ClientIdentity};
//!
//! // A stand-in for real authentication: the `X-Client-Id` header.
//! let by_header = identity::header("x-client-id");
//!
//! // Anything the auth middleware put in the extensions.
//! #[derive(Clone)]
//! struct Account(String);
//! let by_account = |parts: &Parts| -> Result<String, Response> {
//!     parts
//!         .extensions
//!         .get::<Account>()
//!         .map(|a| a.0.clone())
//!         .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())
//! };
//! # fn takes(_: impl ClientIdentity) {}
//! # takes(by_header);
//! # takes(by_account);
//! ```

use axum::response::{IntoResponse, Response};
use http::HeaderName;
use http::request::Parts;

use crate::problem::{Problem, ProblemType};

/// The longest client identity [`header`] accepts, in bytes: the limit the published
/// contract states (`idem_contract::extension::MAX_IDENTITY_LEN`), one constant.
pub use idem_contract::extension::MAX_IDENTITY_LEN;

/// Says who the client of a request is.
///
/// Implemented for closures `Fn(&Parts) -> Result<String, Response>` (annotate the
/// argument, `|parts: &Parts|`, so the closure accepts any lifetime) and by [`header`].
///
/// The identity is a namespace, not a secret: it is stored next to each key and given to
/// reconcile functions, but never logged by idem. Return a stable identifier (an account
/// id), not a credential such as a bearer token.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say who the client is",
    note = "a client identity is `idem::identity::header(\"x-client-id\")` or a closure `|parts: &http::request::Parts| -> Result<String, axum::response::Response>`"
)]
pub trait ClientIdentity: Send + Sync + 'static {
    /// The client's identity, or the answer to give when there is none (which is sent as
    /// is, with an `Operation-Id` header added).
    ///
    /// # Errors
    ///
    /// The response to send instead of running the operation, typically 401.
    #[allow(
        clippy::result_large_err,
        reason = "a response is what axum rejects with"
    )]
    fn identify(&self, parts: &Parts) -> Result<String, Response>;
}

impl<F> ClientIdentity for F
where
    F: Fn(&Parts) -> Result<String, Response> + Send + Sync + 'static,
{
    fn identify(&self, parts: &Parts) -> Result<String, Response> {
        self(parts)
    }
}

/// The identity is the value of the header `name` (matched case-insensitively).
///
/// A missing header, an empty value, a value longer than [`MAX_IDENTITY_LEN`] bytes, a
/// value sent more than once or one that is not visible ASCII (`!` to `~`: a space or a
/// tab inside it included; around it they are not part of the value, RFC 9110 §5.5) is
/// answered with 401 `client-identity-missing` (see [`crate::problem`]).
///
/// # Panics
///
/// When `name` is not a valid header name: a programming error, found at start-up.
pub fn header(name: &str) -> HeaderIdentity {
    HeaderIdentity {
        name: HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("`{name}` is not a valid header name")),
    }
}

/// A [`ClientIdentity`] read from one request header; made by [`header`].
#[derive(Clone, Debug)]
pub struct HeaderIdentity {
    name: HeaderName,
}

impl ClientIdentity for HeaderIdentity {
    fn identify(&self, parts: &Parts) -> Result<String, Response> {
        let refuse = |why: &str| {
            Problem::new(
                ProblemType::ClientIdentityMissing,
                format!("the `{}` header {why}", self.name),
            )
            .into_response()
        };
        let mut values = parts.headers.get_all(&self.name).iter();
        let value = values.next().ok_or_else(|| refuse("is missing"))?;
        if values.next().is_some() {
            return Err(refuse("is sent more than once"));
        }
        // Spaces and tabs around a field value are not part of it (RFC 9110 §5.5); any
        // other byte must be visible ASCII.
        let value = value
            .to_str()
            .map_err(|_| refuse("is not visible ASCII"))?
            .trim_matches([' ', '\t']);
        if value.is_empty() {
            return Err(refuse("is empty"));
        }
        if let Some(at) = value.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(refuse(&format!(
                "has a space or a tab at byte {at}; an identity is visible ASCII only"
            )));
        }
        if value.len() > MAX_IDENTITY_LEN {
            return Err(refuse(&format!("is longer than {MAX_IDENTITY_LEN} bytes")));
        }
        Ok(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &[u8])]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn header_identity() {
        let id = header("X-Client-Id");
        assert_eq!(
            id.identify(&parts(&[("x-client-id", b"acme")])).unwrap(),
            "acme"
        );
        assert_eq!(
            id.identify(&parts(&[("X-CLIENT-ID", b" acme ")])).unwrap(),
            "acme"
        );
        for bad in [
            parts(&[]),
            parts(&[("x-client-id", b"")]),
            parts(&[("x-client-id", b"\xe9")]),
            parts(&[("x-client-id", "a".repeat(256).as_bytes())]),
            parts(&[("x-client-id", b"a"), ("x-client-id", b"b")]),
            parts(&[("x-client-id", b"acme corp")]),
            parts(&[("x-client-id", b"acme\tcorp")]),
            parts(&[("x-client-id", b" \t ")]),
        ] {
            let response = id.identify(&bad).unwrap_err();
            assert_eq!(response.status(), 401);
            assert_eq!(
                response.headers()[http::header::CONTENT_TYPE],
                crate::problem::PROBLEM_JSON
            );
        }
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn closures_are_identities() {
        let fixed = |_: &Parts| -> Result<String, Response> { Ok("tenant".into()) };
        assert_eq!(fixed.identify(&parts(&[])).unwrap(), "tenant");
    }
}
