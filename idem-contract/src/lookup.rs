//! `status_lookup`: how a client learns the outcome of an operation by its key.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The placeholder for the key in a status lookup path.
pub const KEY_PLACEHOLDER: &str = "{key}";

/// Everything but RFC 3986's unreserved characters is percent-encoded in the key's path
/// segment, so any visible ASCII key makes one segment (RFC 3986 §2.3, §3.3).
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `key` as one path segment of a status lookup URL: every byte but RFC 3986's
/// unreserved characters percent-encoded. The server's `Location` (202) and the client's
/// lookup write keys this way.
///
/// ```
/// assert_eq!(idem_contract::lookup::encode_key("order 1/\"a\""), "order%201%2F%22a%22");
/// ```
pub fn encode_key(key: &str) -> String {
    percent_encoding::utf8_percent_encode(key, PATH_SEGMENT).to_string()
}

/// Property 8, `status_lookup`: the handler a client calls to learn the outcome of an
/// operation by its key after an answer was lost.
///
/// Written `status_lookup = operation_status` or, with the route it is served on,
/// `status_lookup = operation_status(path = "/orders/operations/{key}")`. The route is
/// published in the OpenAPI extension and the consumer docs, and it is the `Location` of
/// `concurrency = accepted`, which therefore needs it.
///
/// The macro checks that `handler` names an async function whose output is a response,
/// at the path's own span.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusLookup {
    /// The handler's path as written, such as `order_operation_status`.
    pub handler: Cow<'static, str>,
    /// The route it answers on, with `{key}` where the key goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Cow<'static, str>>,
}

impl StatusLookup {
    /// The lookup URL of `key`: the path with `{key}` replaced by the key, percent-encoded
    /// by the caller. `None` when no path is declared.
    pub fn path_for(&self, encoded_key: &str) -> Option<String> {
        self.path
            .as_deref()
            .map(|p| p.replace(KEY_PLACEHOLDER, encoded_key))
    }
}

/// Whether `path` is a usable status lookup route: it starts with `/`, holds `{key}`
/// exactly once, and has no whitespace.
pub fn is_lookup_path(path: &str) -> bool {
    path.starts_with('/')
        && path.matches(KEY_PLACEHOLDER).count() == 1
        && !path.contains(char::is_whitespace)
}
