//! Fault points for crash tests (feature `fault-points`, never on in a service's own
//! build): a named point in the attempt where the process can be made to stop, so that a
//! test kills it with SIGKILL at exactly that moment.
//!
//! With the feature, a process whose environment has `IDEM_FAULT_POINT=<name>` prints
//! `idem: fault point <name> reached` to standard error when an attempt gets there, and
//! stops that attempt's thread for good, waiting to be killed. The points:
//!
//! | name | where |
//! |---|---|
//! | `before_commit` | the transactional mode: the handler has written, the record is not written, nothing is committed |
//! | `after_commit` | the transactional mode: the effect and the record are committed, the answer is not sent |
//! | `before_complete` | any other mode: the handler has answered (its effect is done), the record is not completed |
//! | `after_complete` | any other mode: the record is completed, the answer is not sent |

/// The variable that names the fault point to stop at.
#[cfg(feature = "fault-points")]
pub const FAULT_POINT_VAR: &str = "IDEM_FAULT_POINT";

/// Stops here for good when `IDEM_FAULT_POINT` names this point.
#[cfg(feature = "fault-points")]
pub(crate) fn point(name: &'static str) {
    if std::env::var(FAULT_POINT_VAR).is_ok_and(|v| v == name) {
        use std::io::Write;
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "idem: fault point {name} reached");
        let _ = stderr.flush();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Without the feature `fault-points`, nothing.
#[cfg(not(feature = "fault-points"))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}

/// One fault of the test-fault protocol, as the header [`TEST_FAULT`](idem_contract::headers::TEST_FAULT)
/// (`Idem-Test-Fault`) names it.
/// It applies to the attempt its request starts; a request answered from the key's
/// record (a replay, a concurrency answer) ignores it.
///
/// | header value | what the operation does |
/// |---|---|
/// | `answer-429` | the handler's position answers 429 with `Retry-After: 1` instead of running it (no effect) |
/// | `answer-503` | the same with 503: a transient refusal, no effect |
/// | `answer-400` | the same with 400: a permanent refusal, no effect |
/// | `crash-after-effect` | the handler runs (its effect happens, or is written in its transaction), then the attempt dies as its process would: nothing is recorded or committed, its lease is no longer renewed, and the connection breaks without a complete answer |
#[cfg(feature = "testing")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestFault {
    /// Answer this status from the handler's position, without running the handler.
    Answer(u16),
    /// Run the handler, then die without settling the attempt.
    CrashAfterEffect,
}

#[cfg(feature = "testing")]
impl TestFault {
    /// Every fault, with its header value.
    pub const ALL: [(&'static str, TestFault); 4] = [
        ("answer-429", TestFault::Answer(429)),
        ("answer-503", TestFault::Answer(503)),
        ("answer-400", TestFault::Answer(400)),
        ("crash-after-effect", TestFault::CrashAfterEffect),
    ];

    /// The fault a header value names (ASCII case-insensitive, surrounding blanks
    /// ignored), or `None`.
    pub fn parse(value: &[u8]) -> Option<TestFault> {
        let value = value.trim_ascii();
        TestFault::ALL
            .iter()
            .find(|(name, _)| name.as_bytes().eq_ignore_ascii_case(value))
            .map(|(_, fault)| *fault)
    }

    /// The header value that names this fault.
    pub fn header_value(self) -> &'static str {
        TestFault::ALL
            .iter()
            .find(|(_, fault)| *fault == self)
            .map_or("answer-503", |(name, _)| name)
    }
}

/// Runs `fault` in place of (or after) the handler `handler`: `Ok` is the answer to settle
/// as the handler's, `Err` the broken answer of an attempt that died (a body that fails,
/// so the connection is cut before a complete answer).
#[cfg(feature = "testing")]
pub(crate) async fn run_test_fault<F>(
    fault: TestFault,
    handler: F,
) -> Result<axum::response::Response, axum::response::Response>
where
    F: std::future::Future,
    F::Output: axum::response::IntoResponse,
{
    use axum::response::IntoResponse;
    match fault {
        TestFault::Answer(status) => {
            drop(handler);
            let status =
                http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
            let body = serde_json::json!({
                "type": "about:blank",
                "title": status.canonical_reason().unwrap_or("fault"),
                "status": status.as_u16(),
                "detail": format!("answered by the test-fault protocol ({} {})", idem_contract::headers::TEST_FAULT, fault.header_value()),
            });
            let mut response = (
                status,
                [(http::header::CONTENT_TYPE, "application/problem+json")],
                body.to_string(),
            )
                .into_response();
            if status.as_u16() == 429 || status.as_u16() == 503 {
                response.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("1"),
                );
            }
            Ok(response)
        }
        TestFault::CrashAfterEffect => {
            // The effect happens (or is written in the attempt's transaction, which dies
            // uncommitted with the attempt); its answer is never seen.
            drop(handler.await.into_response());
            let cut = futures_util::stream::once(async {
                Err::<axum::body::Bytes, _>(std::io::Error::other(
                    "idem-test-fault: crash-after-effect",
                ))
            });
            Err(axum::response::Response::new(
                axum::body::Body::from_stream(cut),
            ))
        }
    }
}

/// The fault a request asks for, when `enabled` (the handle honours the protocol): `Ok(None)`
/// without the header, `Err(detail)` for a value that names no fault.
#[cfg(feature = "testing")]
pub(crate) fn requested(
    enabled: bool,
    headers: &http::HeaderMap,
) -> Result<Option<TestFault>, String> {
    if !enabled {
        return Ok(None);
    }
    use idem_contract::headers::TEST_FAULT;
    let Some(value) = headers.get(TEST_FAULT) else {
        return Ok(None);
    };
    TestFault::parse(value.as_bytes()).map(Some).ok_or_else(|| {
        format!(
            "the header `{TEST_FAULT}` names no fault: `{}`; send one of {}",
            String::from_utf8_lossy(value.as_bytes()),
            TestFault::ALL.map(|(name, _)| name).join(", ")
        )
    })
}

/// Without the feature `testing` no fault can be asked for.
#[cfg(not(feature = "testing"))]
pub(crate) fn requested(
    _enabled: bool,
    _headers: &http::HeaderMap,
) -> Result<Option<TestFault>, String> {
    Ok(None)
}

/// Without the feature `testing` there is no fault: the attempt's optional fault is
/// always `None`.
#[cfg(not(feature = "testing"))]
#[derive(Clone, Copy, Debug)]
pub(crate) enum TestFault {}

/// Without the feature `testing`, never called: there is no fault to run.
#[cfg(not(feature = "testing"))]
pub(crate) async fn run_test_fault<F>(
    fault: TestFault,
    _handler: F,
) -> Result<axum::response::Response, axum::response::Response> {
    match fault {}
}
