//! Buffering a result to store it, and replaying a stored one.

use axum::body::{Body, HttpBody};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, stream};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, response::Parts};
use http_body_util::BodyExt;

use crate::OperationId;
use crate::answer::with_operation_id;
use crate::store::StoredResponse;

use idem_contract::headers::IDEMPOTENT_REPLAYED;

/// A handler's answer, read so that it can be stored.
pub(crate) enum Captured {
    /// The whole body, within the limit.
    Buffered {
        /// Status and headers.
        parts: Parts,
        /// The body.
        body: Bytes,
    },
    /// The body is larger than the limit: the response, rebuilt to send what was read and
    /// then the rest.
    TooLarge(Response),
    /// The body failed while it was read: the handler's answer is lost, nothing of it can
    /// be sent or stored.
    Failed(axum::Error),
}

/// Reads the body of `response`, up to `limit` bytes.
pub(crate) async fn capture(response: Response, limit: usize) -> Captured {
    let (parts, mut body) = response.into_parts();
    if usize::try_from(HttpBody::size_hint(&body).lower()).unwrap_or(usize::MAX) > limit {
        return Captured::TooLarge(Response::from_parts(parts, body));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                // Trailers are not replayed; HTTP/1.1 answers rarely carry them.
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                size = size.saturating_add(data.len());
                chunks.push(data);
                if size > limit {
                    let rest =
                        stream::iter(chunks.into_iter().map(Ok)).chain(body.into_data_stream());
                    return Captured::TooLarge(Response::from_parts(
                        parts,
                        Body::from_stream(rest),
                    ));
                }
            }
            Some(Err(error)) => return Captured::Failed(error),
        }
    }
    let body = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => {
            let mut all = BytesMut::with_capacity(size);
            chunks.iter().for_each(|c| all.extend_from_slice(c));
            all.freeze()
        }
    };
    Captured::Buffered { parts, body }
}

/// The values of the headers `names` in `headers`, in the order of `names`, every value
/// of a repeated header in order.
pub(crate) fn select_headers(
    headers: &HeaderMap,
    names: &[HeaderName],
) -> Vec<(HeaderName, HeaderValue)> {
    names
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name)
                .iter()
                .map(move |value| (name.clone(), value.clone()))
        })
        .collect()
}

/// The replay of a stored result: its status, its stored headers and its body byte for
/// byte, with `Idempotent-Replayed: true` and the `Operation-Id`.
pub(crate) fn replay(stored: &StoredResponse, id: OperationId) -> Response {
    let mut response = Response::new(Body::from(stored.body.clone()));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        headers.append(name.clone(), value.clone());
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    with_operation_id(response, id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    async fn body_of(response: Response) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn captures_within_the_limit() {
        let stream =
            stream::iter(["ab", "cd", "e"].map(|s| Ok::<_, std::io::Error>(Bytes::from(s))));
        let response = Response::new(Body::from_stream(stream));
        match capture(response, 5).await {
            Captured::Buffered { body, .. } => assert_eq!(body, "abcde"),
            _ => panic!("five bytes fit a limit of five"),
        }
    }

    #[tokio::test]
    async fn past_the_limit_the_whole_body_is_still_sent() {
        let stream =
            stream::iter(["ab", "cd", "ef"].map(|s| Ok::<_, std::io::Error>(Bytes::from(s))));
        let response = Response::new(Body::from_stream(stream));
        match capture(response, 3).await {
            Captured::TooLarge(response) => assert_eq!(body_of(response).await, "abcdef"),
            _ => panic!("six bytes do not fit a limit of three"),
        }
        match capture("0123456789".into_response(), 3).await {
            Captured::TooLarge(response) => assert_eq!(body_of(response).await, "0123456789"),
            _ => panic!("a known size past the limit is refused before reading"),
        }
    }

    #[tokio::test]
    async fn a_failing_body_is_not_captured() {
        let stream = stream::iter([
            Ok(Bytes::from("ab")),
            Err(std::io::Error::other("disk on fire")),
        ]);
        let response = Response::new(Body::from_stream(stream));
        match capture(response, 100).await {
            Captured::Failed(error) => assert!(error.to_string().contains("disk on fire")),
            _ => panic!("a failing body is not stored"),
        }
    }

    #[tokio::test]
    async fn replay_is_byte_for_byte() {
        let stored = StoredResponse {
            status: 201,
            headers: vec![
                (
                    HeaderName::from_static("location"),
                    HeaderValue::from_static("/orders/1"),
                ),
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static("</a>"),
                ),
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static("</b>"),
                ),
            ],
            body: Bytes::from_static(b"{\"id\": 1}\n"),
        };
        let id = OperationId::new();
        let response = replay(&stored, id);
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["location"], "/orders/1");
        assert_eq!(response.headers().get_all("link").iter().count(), 2);
        assert_eq!(response.headers()[IDEMPOTENT_REPLAYED], "true");
        assert_eq!(body_of(response).await, stored.body);
        let selected = select_headers(
            &HeaderMap::from_iter(stored.headers.clone()),
            &[
                HeaderName::from_static("link"),
                HeaderName::from_static("etag"),
            ],
        );
        assert_eq!(selected, stored.headers[1..]);
    }
}
