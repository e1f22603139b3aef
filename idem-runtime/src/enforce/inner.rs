//! Stage 6, the handler's own extractor: run on the bytes already read, before anything
//! is registered. What it refuses (a wrong `Content-Type`, a body that does not
//! deserialize) did nothing, so it must not be stored and replayed for the whole TTL.

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use http::request::Parts;

/// The future of the handler's extractor `E` on the request rebuilt from `parts` and
/// `bytes`. Its rejection is answered as it is ([`Rejection::refused`](super::Rejection::refused)): it becomes a
/// response at once, so it need not be `Send`.
///
/// Not an `async fn`, and run outside the attempt's span: a future of its own, or a span's
/// wrapper around `E`'s, would be compiled once per handler (a third of what a contract
/// added to the build).
pub(crate) fn inner<S, E, M>(
    parts: Parts,
    bytes: Bytes,
    state: &S,
) -> impl Future<Output = Result<E, E::Rejection>>
where
    E: FromRequest<S, M>,
    S: Send + Sync,
{
    E::from_request(Request::from_parts(parts, Body::from(bytes)), state)
}
