//! Stage 2, the idempotency key: from its header (before the body is read), or from a
//! member of the body (once the body is parsed, [`super::significant`]).

use http::HeaderMap;
use idem_contract::{Contract, KeyScope, KeySource};

use super::Rejection;
use crate::answer;
use crate::fingerprint::jcs::Value;
use crate::serde_names::SerdeNames;

/// The key from the contract's header (`names.key_header`, parsed once per operation), or
/// `None` when the contract reads it from the body. The header's name is matched
/// case-insensitively (RFC 9110 §5.1).
///
/// # Errors
///
/// 400 `key-missing` without the header; 400 `key-malformed` for a header sent twice or
/// a key the contract's rules refuse ([`KeyScope::header_key`]).
pub(crate) fn from_header(
    headers: &HeaderMap,
    names: &SerdeNames,
    contract: &Contract,
) -> Result<Option<String>, Rejection> {
    let KeySource::Header { name } = &contract.key_scope.source else {
        return Ok(None);
    };
    let Some(header) = &names.key_header else {
        return Err(answer::key_missing(contract).into());
    };
    let mut values = headers.get_all(header).iter();
    let Some(value) = values.next() else {
        return Err(answer::key_missing(contract).into());
    };
    if values.next().is_some() {
        return Err(answer::key_malformed_because(&format!(
            "the `{name}` header is sent more than once; send one key"
        ))
        .into());
    }
    match contract.key_scope.header_key(value.as_bytes()) {
        Ok(key) => Ok(Some(key)),
        Err(error) => Err(answer::key_malformed(&error).into()),
    }
}

/// The key from the body member the contract names (`doc` is the parsed body); it must be
/// a JSON string, or a form field sent once.
///
/// # Errors
///
/// 400 `key-missing` when the member is absent, `null` or an empty form field;
/// 400 `key-malformed` when it is not a string, is sent twice, or breaks the key rules.
pub(crate) fn from_body(
    doc: &Value,
    is_form: bool,
    names: &SerdeNames,
    contract: &Contract,
) -> Result<String, Rejection> {
    let Some(field) = &names.key_field else {
        return Err(answer::key_missing(contract).into());
    };
    match doc.pointer(field.segments()) {
        None | Some(Value::Null) => Err(answer::key_missing(contract).into()),
        Some(Value::String(key)) => checked(key.as_bytes(), &contract.key_scope),
        // A form field: the array of its values.
        Some(Value::Array(values)) if is_form => match values.as_slice() {
            [Value::String(key)] => checked(key.as_bytes(), &contract.key_scope),
            [] => Err(answer::key_missing(contract).into()),
            _ => Err(answer::key_malformed_because(&format!(
                "the idempotency key `{field}` is sent more than once; send one key"
            ))
            .into()),
        },
        Some(_) => Err(answer::key_malformed_because(&format!(
            "the idempotency key `{field}` must be a JSON string"
        ))
        .into()),
    }
}

/// Checks a key against the key rules (`KeyScope::validate_key`).
fn checked(key: &[u8], scope: &KeyScope) -> Result<String, Rejection> {
    scope
        .validate_key(key)
        .map_err(|e| answer::key_malformed(&e))?;
    // Visible ASCII only, so this is valid UTF-8.
    Ok(String::from_utf8_lossy(key).into_owned())
}

#[cfg(test)]
mod tests {
    use idem_contract::FieldPath;
    use idem_contract::problem::ProblemType;
    use proptest::prelude::*;

    use super::*;

    fn problem(rejection: Rejection) -> ProblemType {
        match rejection {
            Rejection::Problem(problem) => problem.kind(),
            other => panic!("not a problem: {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn visible_ascii_keys_up_to_255_bytes_are_accepted(key in "[!-~]{1,255}") {
            prop_assert_eq!(checked(key.as_bytes(), &KeyScope::CLIENT).ok(), Some(key.clone()));
        }

        #[test]
        fn keys_with_any_other_character_are_refused(
            prefix in "[!-~]{0,10}",
            bad in "[^!-~]",
            suffix in "[!-~]{0,10}",
        ) {
            let key = format!("{prefix}{bad}{suffix}");
            let refused = checked(key.as_bytes(), &KeyScope::CLIENT).unwrap_err();
            prop_assert_eq!(problem(refused), ProblemType::KeyMalformed);
        }
    }

    #[test]
    fn header_keys() {
        let contract = &Contract::PLACEHOLDER;
        let names = crate::serde_names::resolve(contract, None, None).unwrap();
        let mut headers = HeaderMap::new();
        let missing = from_header(&headers, &names, contract).unwrap_err();
        assert_eq!(problem(missing), ProblemType::KeyMissing);
        headers.append("IDEMPOTENCY-KEY", "k1".parse().unwrap());
        assert_eq!(
            from_header(&headers, &names, contract).unwrap().as_deref(),
            Some("k1")
        );
        headers.append("idempotency-key", "k2".parse().unwrap());
        let twice = from_header(&headers, &names, contract).unwrap_err();
        assert_eq!(problem(twice), ProblemType::KeyMalformed);
    }

    /// A header the contract names, in any case, parsed once with the operation's names;
    /// a name no header can have finds no key in any request.
    #[test]
    fn header_keys_under_another_name() {
        let mut contract = Contract::PLACEHOLDER;
        contract.key_scope.source = KeySource::Header {
            name: "X-Request-Key".into(),
        };
        let names = crate::serde_names::resolve(&contract, None, None).unwrap();
        let mut headers = HeaderMap::new();
        headers.append("idempotency-key", "k0".parse().unwrap());
        let missing = from_header(&headers, &names, &contract).unwrap_err();
        assert_eq!(problem(missing), ProblemType::KeyMissing);
        headers.append("x-request-key", "k1".parse().unwrap());
        assert_eq!(
            from_header(&headers, &names, &contract).unwrap().as_deref(),
            Some("k1")
        );
        contract.key_scope.source = KeySource::Header {
            name: "not a header".into(),
        };
        let names = crate::serde_names::resolve(&contract, None, None).unwrap();
        assert_eq!(names.key_header, None);
        let missing = from_header(&headers, &names, &contract).unwrap_err();
        assert_eq!(problem(missing), ProblemType::KeyMissing);
    }

    #[test]
    fn body_keys() {
        let mut contract = Contract::PLACEHOLDER;
        contract.key_scope.source = KeySource::Body {
            field: FieldPath::from_static("ref.id"),
        };
        let names = crate::serde_names::resolve(&contract, None, None).unwrap();
        assert_eq!(
            from_header(&HeaderMap::new(), &names, &contract).unwrap(),
            None
        );
        let key = |json: &str| {
            from_body(
                &Value::parse(json.as_bytes()).unwrap(),
                false,
                &names,
                &contract,
            )
        };
        assert_eq!(key(r#"{"ref":{"id":"k-1"}}"#).unwrap(), "k-1");
        for missing in [r#"{}"#, r#"{"ref":{"id":null}}"#, r#"{"ref":"k"}"#] {
            assert_eq!(
                problem(key(missing).unwrap_err()),
                ProblemType::KeyMissing,
                "{missing}"
            );
        }
        for malformed in [r#"{"ref":{"id":7}}"#, r#"{"ref":{"id":"a b"}}"#] {
            let refused = key(malformed).unwrap_err();
            assert_eq!(problem(refused), ProblemType::KeyMalformed, "{malformed}");
        }
    }
}
