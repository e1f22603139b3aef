//! The contracted operation as a type: what the macro implements for
//! `create_order::Operation`, and what the runtime asks of it.

use std::any::{TypeId, type_name};
use std::marker::PhantomData;

use idem_contract::Contract;

use crate::reconcile::Recoverer;

/// What a contracted handler needs of the [`Idem`](crate::Idem) handle that serves it:
/// [`Contracted::MODE`], which the macro reads from the handler's arguments, and
/// [`Idem::check_handlers`](crate::Idem::check_handlers) checks at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerMode {
    /// The handler takes no transaction: any handle serves it.
    Plain,
    /// The handler takes the transaction of a database (`idem::PgTx`, `idem::SqliteTx`):
    /// only a handle made with `Idem::transactional` over a store of that database
    /// serves it.
    Transactional {
        /// The database's name as sqlx gives it: `PostgreSQL`, `SQLite`.
        database: &'static str,
    },
}

impl HandlerMode {
    /// The mode of a handler whose arguments give the modes `args`: the first
    /// transactional one, else [`HandlerMode::Plain`].
    pub const fn of(args: &[HandlerMode]) -> HandlerMode {
        let mut i = 0;
        while i < args.len() {
            if let HandlerMode::Transactional { .. } = args[i] {
                return args[i];
            }
            i += 1;
        }
        HandlerMode::Plain
    }
}

/// The mode an argument of type `T` gives its handler, for the macro:
/// `ModeOf::<T>::MODE` is transactional for the transaction `Tx<DB>` under any name (an
/// inherent const, in `crate::transaction`), and [`HandlerMode::Plain`] for every other
/// type, through [`PlainArgument`] (inherent items are found first).
pub struct ModeOf<T: ?Sized>(PhantomData<fn() -> T>);

/// The mode of an argument that is not a transaction: [`ModeOf`]'s fallback.
pub trait PlainArgument {
    /// [`HandlerMode::Plain`].
    const MODE: HandlerMode = HandlerMode::Plain;
}

impl<T: ?Sized> PlainArgument for ModeOf<T> {}

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

    /// What the handler needs of the handle that serves it: transactional when it takes
    /// the transaction (`idem::PgTx`, `idem::SqliteTx`). The macro reads it from the
    /// handler's arguments; the default is [`HandlerMode::Plain`].
    const MODE: HandlerMode = HandlerMode::Plain;
}

/// A contracted operation `C` as plain data: what the parts of the request path that are
/// not generic need of it. Those parts are compiled once for every handler instead of
/// once per handler.
#[derive(Clone, Copy)]
pub(crate) struct OperationRef {
    /// `C::CONTRACT`.
    pub(crate) contract: &'static Contract,
    /// `C`'s type, which claims the operation's name ([`crate::idem::names`]).
    pub(crate) id: TypeId,
    /// `C`'s type name, for the message when another type holds the name.
    pub(crate) type_name: &'static str,
    /// [`Contracted::body_fields`].
    pub(crate) body_fields: fn() -> Option<&'static [&'static str]>,
    /// [`Contracted::query_fields`].
    pub(crate) query_fields: fn() -> Option<&'static [&'static str]>,
}

impl OperationRef {
    /// The operation `C`.
    pub(crate) fn of<C: Contracted>() -> OperationRef {
        OperationRef {
            contract: C::CONTRACT,
            id: TypeId::of::<C>(),
            type_name: type_name::<C>(),
            body_fields: C::body_fields,
            query_fields: C::query_fields,
        }
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
