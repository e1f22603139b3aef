//! What [`Enforced`](super::Enforced) answers when the handler does not run.

use axum::response::{IntoResponse, Response};
use idem_contract::problem::ProblemType;

use crate::answer;
use crate::problem::Problem;

/// Why a contracted handler's extraction ([`Enforced`](super::Enforced)) answered instead
/// of handing the request to the handler. Every variant is a complete answer
/// ([`IntoResponse`]) that carries the `Operation-Id` header.
///
/// Nothing was registered for [`Rejection::Refused`] and for the problems of the first
/// stages (`not-configured`, `client-identity-missing`, `key-missing`, `key-malformed`,
/// `body-malformed`, `body-too-large`): the fixed request runs under the same key. The
/// others answer from the key's record.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// One of idem's problems (RFC 9457), [`Problem::kind`] says which: before anything
    /// is registered, `not-configured`, `key-missing`, `key-malformed`, `body-malformed`,
    /// `body-too-large`; from the record, `fingerprint-mismatch`,
    /// `operation-in-progress`, `operation-outcome-unknown`, `store-unavailable`.
    Problem(Box<Problem>),
    /// The operation is completed: its stored result, replayed with
    /// `Idempotent-Replayed: true`.
    Replayed(Box<Response>),
    /// `concurrency = accepted` while another attempt runs: 202 with a `Location` at the
    /// status lookup.
    Accepted(Box<Response>),
    /// Recovery decided about an earlier attempt whose outcome was unknown, and this is
    /// its answer: the result it found applied (replayed), 409
    /// `operation-outcome-unknown` (parked for an operator), 503 `recovery-pending`, or
    /// 503 `store-unavailable` when its decision could not be recorded.
    Recovered(Box<Response>),
    /// Refused before anything was registered, with the refusal's own answer: the client
    /// identity's (typically 401), axum's for the path parameters, or the handler's own
    /// extractor's (a wrong `Content-Type`, a body that does not deserialize).
    Refused(Box<Response>),
}

impl Rejection {
    /// The problem of the stage that refused the request.
    pub(crate) fn problem(problem: Problem) -> Rejection {
        Rejection::Problem(Box::new(problem))
    }

    /// A refusal answered as it is, with a fresh `Operation-Id` unless it has one.
    pub(crate) fn refused(response: impl IntoResponse) -> Rejection {
        Rejection::Refused(Box::new(answer::with_fresh_id(response.into_response())))
    }

    /// The problem type, for a [`Rejection::Problem`] (or an answer that is one).
    pub fn problem_type(&self) -> Option<ProblemType> {
        match self {
            Rejection::Problem(problem) => Some(problem.kind()),
            Rejection::Replayed(r)
            | Rejection::Accepted(r)
            | Rejection::Recovered(r)
            | Rejection::Refused(r) => r.extensions().get::<ProblemType>().copied(),
        }
    }
}

impl From<Problem> for Rejection {
    fn from(problem: Problem) -> Rejection {
        Rejection::problem(problem)
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::Problem(problem) => problem.into_response(),
            Rejection::Replayed(r)
            | Rejection::Accepted(r)
            | Rejection::Recovered(r)
            | Rejection::Refused(r) => *r,
        }
    }
}
