//! `recovery`: what decides an operation whose outcome is unknown.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Property 9, `recovery`: what happens to an operation whose outcome is unknown because
/// its attempt ended (a crash, a panic, the server's deadline) between the business effect
/// and the record of its result.
///
/// Written `recovery = reconcile_create_order` (a function that inspects business data
/// and decides), `recovery = manual("https://runbooks.example.com/orders")` (park the
/// operation as `unknown` for an operator, with the runbook to follow) or
/// `recovery = resume` (run the handler again; its foreign calls go through the step
/// journal). A reconcile function named `resume` is written with its path:
/// `recovery = self::resume`.
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
    /// Run the handler again as the next attempt: the calls it makes to other systems go
    /// through its step journal (`idem::Journal`), so a step already done is replayed
    /// from the journal and a step whose outcome is unknown is sent again under the same
    /// downstream key, which the other system deduplicates. Written `recovery = resume`,
    /// on a handler that takes the journal.
    Resume,
}
