//! Stage 3, read: the path parameters and the body, each read once, before anything is
//! registered. The body must arrive within the attempt's time (the contract's
//! `per_attempt`, else its total deadline): a connection that trickles it in holds
//! nothing of idem's, and is answered 408 and closed when that time is up.

use axum::RequestExt;
use axum::body::Body;
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams, Request};
use bytes::Bytes;
use http::request::Parts;
use http_body_util::BodyExt;
use idem_contract::Contract;

use super::Rejection;
use crate::answer;

/// What the request carries besides its headers.
pub(crate) struct Read {
    /// The route's path parameters, name and value, in the route's order: they name the
    /// resource the intent is about, so they are always significant.
    pub(crate) path_params: Vec<(String, String)>,
    /// The whole body.
    pub(crate) bytes: Bytes,
}

/// Reads the path parameters and the body.
///
/// # Errors
///
/// axum's rejection of the path parameters (a value that is not valid UTF-8);
/// 413 `body-too-large` past axum's `DefaultBodyLimit`; 400 `body-malformed` for a body
/// cut short; 408 `request-timeout` for a body that has not arrived within the
/// contract's time for one attempt.
pub(crate) async fn read(
    parts: &mut Parts,
    body: Body,
    contract: &Contract,
) -> Result<Read, Rejection> {
    let path_params = match RawPathParams::from_request_parts(parts, &()).await {
        Ok(params) => params
            .iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
        Err(RawPathParamsRejection::MissingPathParams(_)) => Vec::new(),
        Err(rejection) => return Err(Rejection::refused(rejection)),
    };
    let body = limited(parts, body);
    let limit = contract.deadline.attempt_timeout().to_std();
    let bytes = tokio::time::timeout(limit, body.collect())
        .await
        .map_err(|_elapsed| answer::body_timed_out(limit))?
        .map_err(|error| answer::body_unreadable(&error))?
        .to_bytes();
    Ok(Read { path_params, bytes })
}

/// `body` under the request's own `DefaultBodyLimit` (axum's `RequestExt::with_limited_body`
/// reads it from the extensions of `parts`, lent and given back: not cloned, which would
/// copy every extension of every request).
fn limited(parts: &mut Parts, body: Body) -> Body {
    let mut request = Request::new(body);
    std::mem::swap(request.extensions_mut(), &mut parts.extensions);
    let (mut lent, body) = request.with_limited_body().into_parts();
    std::mem::swap(&mut lent.extensions, &mut parts.extensions);
    body
}
