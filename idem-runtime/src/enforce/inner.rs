//! Stage 4, the handler's own extractor: run on the bytes already read, before anything
//! is registered. What it refuses (a wrong `Content-Type`, a body that does not
//! deserialize) did nothing, so it must not be stored and replayed for the whole TTL.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use http::request::Parts;

use super::Rejection;

/// The handler's extractor `E`, run on the request rebuilt from `parts` and `bytes`.
///
/// # Errors
///
/// `E`'s rejection, answered as it is ([`Rejection::Refused`]); it becomes a response at
/// once, so it need not be `Send`.
pub(crate) async fn inner<S, E, M>(parts: Parts, bytes: Bytes, state: &S) -> Result<E, Rejection>
where
    E: FromRequest<S, M>,
    S: Send + Sync,
{
    let request = Request::from_parts(parts, Body::from(bytes));
    E::from_request(request, state)
        .await
        .map_err(Rejection::refused)
}
