//! `recovery`: what decides an operation whose outcome is unknown.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Property 9, `recovery`: what happens to an operation whose outcome is unknown because
/// its attempt ended (a crash, a panic, the server's deadline) between the business effect
/// and the record of its result.
///
/// Written `recovery = reconcile_create_order` (a function that inspects business data
/// and decides) or `recovery = manual("https://runbooks.example.com/orders")` (park the
/// operation as `unknown` for an operator, with the runbook to follow).
///
/// Recovery runs once per expired lease, when the key is next seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Recovery {
    /// A reconcile function that inspects business data and decides.
    Reconcile {
        /// The function's path as written, such as `reconcile_create_order`.
        function: Cow<'static, str>,
    },
    /// Park the operation as `unknown` until an operator resolves it.
    Manual {
        /// Where the operator's runbook is: a URL or a document reference.
        runbook: Cow<'static, str>,
    },
}
