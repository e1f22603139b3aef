//! The start-up check of the contracted handlers a handle serves: what their first
//! request would otherwise find, as 500 `not-configured`.

use std::fmt;

use super::Idem;
use crate::operation::{Contracted, HandlerMode};

/// The contracted operations that [`Idem::check_handlers`] checks: one operation type
/// (`create_order::Operation`), or a tuple of up to twelve of them.
pub trait Operations {
    /// Checks each operation against `idem`, adding what is wrong to `problems`.
    fn check_each(idem: &Idem, problems: &mut Vec<String>);
}

impl<C: Contracted> Operations for C {
    fn check_each(idem: &Idem, problems: &mut Vec<String>) {
        idem.check_one::<C>(problems);
    }
}

macro_rules! operations_tuple {
    ($($c:ident),+) => {
        impl<$($c: Contracted),+> Operations for ($($c,)+) {
            fn check_each(idem: &Idem, problems: &mut Vec<String>) {
                $(idem.check_one::<$c>(problems);)+
            }
        }
    };
}

operations_tuple!(C1);
operations_tuple!(C1, C2);
operations_tuple!(C1, C2, C3);
operations_tuple!(C1, C2, C3, C4);
operations_tuple!(C1, C2, C3, C4, C5);
operations_tuple!(C1, C2, C3, C4, C5, C6);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7, C8);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7, C8, C9);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7, C8, C9, C10);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11);
operations_tuple!(C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12);

/// Why [`Idem::check_handlers`] refused: the contracted handlers this handle cannot
/// serve, each problem with what to change. Its `Debug` is its message, so that a `main`
/// that returns it prints what to do.
#[derive(Clone, PartialEq, Eq)]
pub struct NotConfigured {
    problems: Vec<String>,
}

impl NotConfigured {
    /// Every problem found, one sentence each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for NotConfigured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("idem cannot serve these contracted handlers as configured:")?;
        for problem in &self.problems {
            write!(f, "\n- {problem}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NotConfigured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for NotConfigured {}

impl Idem {
    /// Checks, at start-up and without a request, that this handle can serve the
    /// contracted operations `Ops` (`create_order::Operation`, or a tuple of them: every
    /// contracted handler of the service), and claims their names. What it finds would
    /// otherwise be answered 500 `not-configured` at each one's first request:
    ///
    /// - a handler that takes the transaction (`idem::PgTx`, `idem::SqliteTx`) under a
    ///   handle made with `Idem::new`, or made with `Idem::transactional` over another
    ///   database ([`Contracted::MODE`]);
    /// - two contracted handlers with one name, which would share every key;
    /// - a fingerprint field or a body key that the body type does not have under any
    ///   name serde reads (`#[serde(rename = "..")]`).
    ///
    /// The router's `.layer(idem.layer())` is not checked: the router and the handle meet
    /// only at run time, where a request without the layer logs an error.
    ///
    /// ```
    /// # use idem_runtime::{Idem, identity, store::MemoryStore, enforce::Contracted};
    /// # struct CreateOrder;
    /// # impl Contracted for CreateOrder { const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER; }
    /// let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    /// // With the macro: `idem.check_handlers::<(create_order::Operation, order_status::Operation)>()?`.
    /// idem.check_handlers::<CreateOrder>()?;
    /// # Ok::<(), idem_runtime::NotConfigured>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NotConfigured`], with every problem found and what to change.
    pub fn check_handlers<Ops: Operations>(&self) -> Result<(), NotConfigured> {
        let mut problems = Vec::new();
        Ops::check_each(self, &mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(NotConfigured { problems })
        }
    }

    /// Adds what keeps this handle from serving `C` to `problems`.
    fn check_one<C: Contracted>(&self, problems: &mut Vec<String>) {
        let operation = &C::CONTRACT.operation;
        match self.names().claim::<C>() {
            Err(other) => problems.push(format!(
                "two contracted handlers are named `{operation}` (the other is `{other}`): they would share every idempotency key; rename one of them"
            )),
            Ok(claim) => {
                if let Err(why) = claim.names.as_ref() {
                    problems.push(format!("`{operation}`: {why}"));
                }
            }
        }
        if let HandlerMode::Transactional { database } = C::MODE
            && let Some(problem) = self.transaction_problem(operation, database)
        {
            problems.push(problem);
        }
    }

    /// Why this handle cannot give `operation` the transaction of `database`, if it
    /// cannot.
    fn transaction_problem(&self, operation: &str, database: &str) -> Option<String> {
        let store = match database {
            "PostgreSQL" => "`idem::PostgresStore`",
            "SQLite" => "`idem::SqliteStore`",
            _ => "store",
        };
        match self.transactional_database() {
            Some(served) if served == database => None,
            Some(served) => Some(format!(
                "`{operation}` takes the transaction of {database}, but this handle is transactional over a {served} store: build it with `Idem::transactional(store, ..)` over the {database} {store} that holds the business data"
            )),
            None => Some(format!(
                "`{operation}` takes the transaction of {database}, but this handle was made without a transactional store (`Idem::new`): build it with `Idem::transactional(store, ..)` over the {database} {store} that holds the business data"
            )),
        }
    }
}
