//! The attempt a contracted handler runs in, as the handler sees it.

use crate::OperationId;

/// The attempt a contracted handler runs in: the operation's id, the client and the
/// idempotency key, as idem checked them.
///
/// Write the key (and the client) with the business record, in the same transaction: that
/// is what a reconcile function looks for when an attempt ended between its effect and
/// the record of its answer (see [`crate::recovery::UnknownOperation`]). Take it as an argument of
/// the contracted handler, anywhere in the list: `attempt: idem::Attempt`;
/// `#[idem::contract]` passes it in (it is not an extractor). Without the macro, take it
/// from [`Guard::current`](super::Guard::current).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// The contract's operation, such as `create_order`.
    pub operation: String,
    /// The operation's id: the same for every attempt of one business operation.
    pub operation_id: OperationId,
    /// The client's identity, as the application's [`crate::identity::ClientIdentity`]
    /// gave it.
    pub client: String,
    /// The idempotency key, as checked (1 to 255 visible ASCII characters).
    pub key: String,
    /// This attempt's number, the operation's attempt counter as its record keeps it (the
    /// `attempt` of the status lookup, `idem ops` and telemetry): 1 for the first; a retry
    /// after a released key, or after recovery found the operation not applied, counts
    /// one more.
    pub attempt: u32,
}
