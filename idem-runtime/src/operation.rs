//! The contracted operation as a type: what the macro implements for
//! `create_order::Operation`, and what the runtime asks of it.

use idem_contract::Contract;

use crate::reconcile::Recoverer;

/// An operation that the macro made from a contracted handler: `create_order::Operation`.
///
/// Implemented by `#[idem::contract(..)]`; write it by hand only for a handler without
/// the macro.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a contracted operation",
    note = "`#[idem::contract(..)]` on `async fn create_order` makes `create_order::Operation`: name that type"
)]
pub trait Contracted: Send + Sync + 'static {
    /// The operation's contract.
    const CONTRACT: &'static Contract;

    /// The member names of the JSON body type as serde reads them (after `rename` and
    /// `rename_all`), when the handler takes `Json<T>` of a struct: the fingerprint's
    /// fields and a body key are looked up under these names. `None` (the default) takes
    /// the contract's field names as they are. The macro implements it with
    /// [`crate::__private::serde_fields`].
    fn body_fields() -> Option<&'static [&'static str]> {
        None
    }

    /// The field names of the handler's `Query<T>` type as serde reads them, when it
    /// takes one: the contract's significant query parameters are looked up under these
    /// names. `None` (the default) takes the names as written.
    fn query_fields() -> Option<&'static [&'static str]> {
        None
    }
}

/// How a contracted operation recovers, given the router's state `S`.
///
/// The macro implements it from `recovery = ..`: a reconcile function gets the
/// handler's `State<T>` (through `FromRef<S>`), `manual(..)` needs no state.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot recover with the router state `{S}`",
    note = "the reconcile function's state type must be reachable from the router's state through `axum::extract::FromRef`"
)]
pub trait Recover<S>: Contracted {
    /// The recoverer, made from the router's state.
    fn recoverer(state: &S) -> Recoverer;
}
