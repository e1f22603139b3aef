//! The OpenAPI extension `x-idempotency`: a contract as the API's consumers read it.
//!
//! It holds the nine properties as the server enforces them, and nothing that names the
//! server's code. The handler is published as the operation it serves (its `operationId`,
//! or its method and path), the status lookup as its route, and recovery as its kind (a
//! reconcile function, or an operator with a runbook), never as function names.
//! [`crate::schema`] is its JSON Schema.
//!
//! ```
//! use idem_contract::extension::{ClientIdentity, Extension, RecoveryKind};
//! use idem_contract::{Concurrency, Contract, Deadline, Fingerprint, KeyScope, Recovery, StatusLookup};
//!
//! let contract = Contract {
//!     operation: "create_order".into(),
//!     key_scope: KeyScope::CLIENT,
//!     fingerprint: Fingerprint::Body,
//!     fingerprint_query: std::borrow::Cow::Borrowed(&[]),
//!     ttl: "24h".parse().unwrap(),
//!     deadline: Deadline { total: "30s".parse().unwrap(), per_attempt: None },
//!     max_attempts: 4,
//!     retryable: std::borrow::Cow::Borrowed(&[]),
//!     concurrency: Concurrency::Accepted,
//!     status_lookup: StatusLookup {
//!         handler: "order_operation_status".into(),
//!         path: Some("/orders/operations/{key}".into()),
//!     },
//!     recovery: Recovery::Reconcile { function: "reconcile_create_order".into() },
//! };
//! let published = Extension::new(&contract, "PostOrders", Some(ClientIdentity::header("X-Client-Id")));
//! assert_eq!(published.operation, "PostOrders");
//! assert_eq!(published.recovery, RecoveryKind::Reconcile);
//! let json = serde_json::to_string(&published).unwrap();
//! assert!(!json.contains("order_operation_status") && !json.contains("reconcile_create_order"));
//! ```

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    Concurrency, Contract, Deadline, Duration, FieldPath, Fingerprint, KeyScope, Recovery,
    Retryable,
};

/// The value of `x-idempotency` on one OpenAPI operation: its failure contract, in the
/// words of the API rather than of the server's code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Extension {
    /// The operation the contract is on, as the document names it: its `operationId`,
    /// or else its method and path (`POST /orders`) or, for a webhook, its method and
    /// name (`POST webhook newPet`). Keys are kept per client and per operation.
    pub operation: String,
    /// Property 1: where the client puts its key, what a key looks like, and whose
    /// namespace it lives in.
    pub key_scope: KeyScope,
    /// How the server tells clients apart (the first half of a key's namespace), when the
    /// publisher declared it. Absent: the server knows the client from its credentials,
    /// as the API's authentication says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_identity: Option<ClientIdentity>,
    /// Property 2: the significant content of a request's body (its path parameters are
    /// always significant too).
    pub fingerprint: Fingerprint,
    /// Property 2, continued: the query parameters that are significant too, by name.
    /// Absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprint_query: Vec<FieldPath>,
    /// Property 3: how long the server remembers a key and its result, from the first
    /// attempt.
    pub ttl: Duration,
    /// Property 4: the time budget of the whole operation, all attempts included, and of
    /// one attempt.
    pub deadline: Deadline,
    /// Property 5: the requests one business operation may cost, the first included.
    pub max_attempts: u32,
    /// Property 6: the outcomes after which the client may send the same request again
    /// with the same key; everything else is final.
    pub retryable: Vec<Retryable>,
    /// Property 7: the answer to a request whose key is held by an attempt that is still
    /// running.
    pub concurrency: Concurrency,
    /// Property 8: where a client learns the outcome of an operation by its key.
    pub status_lookup: LookupRoute,
    /// Property 9: what decides an operation whose outcome is unknown.
    pub recovery: RecoveryKind,
}

impl Extension {
    /// The published form of `contract`, on the operation named `operation` (see
    /// [`Extension::operation`]), with the client identity if the publisher knows it.
    pub fn new(
        contract: &Contract,
        operation: impl Into<String>,
        client_identity: Option<ClientIdentity>,
    ) -> Extension {
        Extension {
            operation: operation.into(),
            key_scope: contract.key_scope.clone(),
            client_identity,
            fingerprint: contract.fingerprint.clone(),
            fingerprint_query: contract.fingerprint_query.to_vec(),
            ttl: contract.ttl,
            deadline: contract.deadline,
            max_attempts: contract.max_attempts,
            retryable: contract.retryable.to_vec(),
            concurrency: contract.concurrency,
            status_lookup: LookupRoute {
                path: contract.status_lookup.path.as_deref().map(str::to_owned),
            },
            recovery: match &contract.recovery {
                Recovery::Reconcile { .. } => RecoveryKind::Reconcile,
                Recovery::Manual { runbook } => RecoveryKind::Manual {
                    runbook: runbook.to_string(),
                },
                Recovery::Resume => RecoveryKind::Resume,
            },
        }
    }
}

/// How the server tells clients apart: keys, and the status lookup's answers, are kept
/// per client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "in", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientIdentity {
    /// The value of a request header (1 to 255 visible ASCII characters, sent once) names
    /// the client; a request without a valid one is answered with 401
    /// `client-identity-missing`.
    Header {
        /// The header's name, such as `X-Client-Id`; matched case-insensitively.
        name: Cow<'static, str>,
    },
}

impl ClientIdentity {
    /// The identity read from the header `name`.
    pub fn header(name: impl Into<Cow<'static, str>>) -> ClientIdentity {
        ClientIdentity::Header { name: name.into() }
    }

    /// The header that names the client, if the identity is a header.
    pub fn header_name(&self) -> Option<&str> {
        match self {
            ClientIdentity::Header { name } => Some(name),
        }
    }
}

/// The longest client identity a header may carry, in bytes: the limit of the runtime's
/// `idem::identity::header`.
pub const MAX_IDENTITY_LEN: usize = 255;

/// Whether `name` can be a header name: an RFC 9110 token (§5.1, §5.6.2) of 1 to 255
/// characters.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The status lookup, as published: its route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LookupRoute {
    /// The path a client sends `GET` to, with `{key}` where its key goes
    /// (percent-encoded), such as `/orders/operations/{key}`. Absent when the contract
    /// does not publish it: ask the API's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// What decides an operation whose outcome is unknown (an attempt ended between its
/// effect and the record of its result), as published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RecoveryKind {
    /// The server inspects its business data and decides: the stored answer if the
    /// effect happened, a new run if it did not, or `unknown` for an operator if it cannot
    /// tell.
    Reconcile,
    /// The operation is parked as `unknown` until an operator resolves it.
    Manual {
        /// Where the operator's runbook is: a URL or a document reference.
        runbook: String,
    },
    /// The server runs the operation again: what it already did in other systems is not
    /// repeated (each call is journaled, and sent again only under the same downstream
    /// key, which the other system deduplicates).
    Resume,
}
