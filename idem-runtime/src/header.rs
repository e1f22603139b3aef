//! The header names of `idem_contract::headers` as [`HeaderName`]s, parsed once at
//! compile time: a lookup or an insert by a `&str` name checks and hashes the name's
//! characters on every call, on every request.

use http::HeaderName;
use idem_contract::headers;

/// `Operation-Id` ([`headers::OPERATION_ID`]).
pub(crate) const OPERATION_ID: HeaderName = HeaderName::from_static(headers::OPERATION_ID);

/// `Idempotent-Replayed` ([`headers::IDEMPOTENT_REPLAYED`]).
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName =
    HeaderName::from_static(headers::IDEMPOTENT_REPLAYED);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_the_contracts() {
        assert_eq!(OPERATION_ID.as_str(), headers::OPERATION_ID);
        assert_eq!(IDEMPOTENT_REPLAYED.as_str(), headers::IDEMPOTENT_REPLAYED);
    }
}
