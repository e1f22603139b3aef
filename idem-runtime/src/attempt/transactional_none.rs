//! Without a SQL store there is no transactional mode: the transactional arm of
//! [`crate::mode::Mode`] is uninhabited, and so are these.

use axum::response::Response;

use super::{Ended, Held};
use crate::mode::AttemptTx;

impl Held {
    /// Never called: no attempt has a transaction.
    pub(super) async fn settle_in_transaction(&self, tx: &AttemptTx, _: Response) -> Response {
        match *tx {}
    }

    /// Never called: no attempt has a transaction.
    pub(super) async fn roll_back_ended(&self, tx: &AttemptTx, _: Ended) -> Response {
        match *tx {}
    }

    /// Never called: no attempt has a transaction.
    pub(super) async fn roll_back_interrupted(
        &self,
        tx: &AttemptTx,
        _: crate::problem::Problem,
    ) -> Response {
        match *tx {}
    }
}
