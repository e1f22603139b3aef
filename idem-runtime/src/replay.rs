//! Buffering a result to store it, and replaying a stored one.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, response::Parts};
use http_body_util::BodyExt;

use crate::OperationId;
use crate::answer::with_operation_id;
use crate::store::StoredResponse;

use crate::header::IDEMPOTENT_REPLAYED;

/// A handler's answer, read so that it can be stored.
pub(crate) enum Captured {
    /// The whole body.
    Buffered {
        /// Status and headers.
        parts: Parts,
        /// The body.
        body: Bytes,
    },
    /// The body failed while it was read: the handler's answer is lost, nothing of it can
    /// be sent or stored.
    Failed(axum::Error),
}

/// Reads the whole body of `response`. A body larger than idem keeps is read whole too:
/// its length and SHA-256 are recorded ([`StoredResponse::body_not_kept`]), and the first
/// answer is sent only once its record is written, so it is held until then either way.
pub(crate) async fn capture(response: Response) -> Captured {
    let (parts, body) = response.into_parts();
    match body.collect().await {
        // Trailers are not replayed; HTTP/1.1 answers rarely carry them.
        Ok(collected) => Captured::Buffered {
            parts,
            body: collected.to_bytes(),
        },
        Err(error) => Captured::Failed(error),
    }
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
    // A record written before these headers were refused may still hold one.
    for (name, value) in &stored.headers {
        if !StoredResponse::is_never_replayed(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    with_operation_id(response, id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    async fn body_of(response: Response) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn captures_the_whole_body() {
        let stream =
            stream::iter(["ab", "cd", "e"].map(|s| Ok::<_, std::io::Error>(Bytes::from(s))));
        let response = Response::new(Body::from_stream(stream));
        match capture(response).await {
            Captured::Buffered { body, .. } => assert_eq!(body, "abcde"),
            Captured::Failed(error) => panic!("{error}"),
        }
    }

    #[tokio::test]
    async fn a_failing_body_is_not_captured() {
        let stream = stream::iter([
            Ok(Bytes::from("ab")),
            Err(std::io::Error::other("disk on fire")),
        ]);
        let response = Response::new(Body::from_stream(stream));
        match capture(response).await {
            Captured::Failed(error) => assert!(error.to_string().contains("disk on fire")),
            _ => panic!("a failing body is not stored"),
        }
    }

    /// A record that holds a framing or session header (written before they were
    /// refused) is replayed without it.
    #[test]
    fn a_replay_never_sends_framing_or_session_headers() {
        let stored = StoredResponse {
            status: 201,
            headers: StoredResponse::NEVER_REPLAYED
                .iter()
                .map(|name| (name.clone(), HeaderValue::from_static("5")))
                .chain([(
                    HeaderName::from_static("location"),
                    HeaderValue::from_static("/orders/1"),
                )])
                .collect(),
            body: Bytes::from_static(b"{}"),
        };
        let response = replay(&stored, OperationId::new());
        for name in StoredResponse::NEVER_REPLAYED {
            assert!(!response.headers().contains_key(&name), "{name}");
        }
        assert_eq!(response.headers()["location"], "/orders/1");
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
