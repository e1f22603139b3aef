//! The contract's body fields under the names serde reads them by (their serde names).
//!
//! A contract names fingerprint fields (and a body key) by their Rust names, which the
//! compiler checks against the body type. The JSON body may spell them otherwise:
//! `#[serde(rename_all = "camelCase")]` turns `customer_id` into `customerId`. Looked up
//! under its Rust name, such a field would always be absent, and every request with one
//! key would have the same (empty) fingerprint: a client bug would be answered with
//! another request's result instead of 422.
//!
//! So each field's first segment is resolved once per operation against the member names
//! serde reads ([`Contracted::body_fields`]): the name itself if serde reads it, else the
//! one name among its `rename_all` spellings (camelCase, PascalCase, kebab-case,
//! SCREAMING_SNAKE_CASE, SCREAMING-KEBAB-CASE, lowercase, UPPERCASE) that serde reads. A
//! field with no such name (a `#[serde(rename = "..")]` to something else) is a
//! configuration error: the operation answers 500 `not-configured`, naming the field and
//! the body's members, rather than fingerprint nothing. Segments after the first (members
//! of nested types) are taken as written.
//!
//! The key's header name is parsed here too, once per operation, so that no request
//! parses it again.

use std::borrow::Cow;

use heck::{ToKebabCase, ToLowerCamelCase, ToShoutyKebabCase, ToShoutySnakeCase, ToUpperCamelCase};
use http::HeaderName;
use idem_contract::{Contract, FieldPath, Fingerprint, KeySource};

/// The contract's names as a request spells them: its body fields resolved to their serde
/// names, and the key's header parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SerdeNames {
    /// The fingerprint, with serde names.
    pub(crate) fingerprint: Fingerprint,
    /// The body member that carries the key, with its serde name.
    pub(crate) key_field: Option<FieldPath>,
    /// The header that carries the key, as a [`HeaderName`] (lower-cased: header names
    /// are case-insensitive, RFC 9110 §5.1), parsed here rather than on every request;
    /// `None` when the key is in the body, or for a name no header can have (then no
    /// request carries it).
    pub(crate) key_header: Option<HeaderName>,
    /// The significant query parameters, with the names the query string spells
    /// (`rename_all` of the `Query<T>` type followed; a name serde does not read is kept
    /// as written).
    pub(crate) query: Vec<String>,
}

/// Resolves `contract`'s body fields against `members`, the names serde reads (`None`:
/// unknown, take the names as written).
///
/// # Errors
///
/// A message naming each field that the body does not have under any spelling.
pub(crate) fn resolve(
    contract: &Contract,
    members: Option<&[&str]>,
    query_members: Option<&[&str]>,
) -> Result<SerdeNames, String> {
    let query = resolve_query(contract, query_members)?;
    let mut missing = Vec::new();
    let mut resolve_path = |path: &FieldPath| match members {
        None => path.clone(),
        Some(members) => resolve_path(path, members).unwrap_or_else(|first| {
            missing.push(format!("`{first}`"));
            path.clone()
        }),
    };
    let fingerprint = match &contract.fingerprint {
        Fingerprint::Body => Fingerprint::Body,
        Fingerprint::Fields(fields) => {
            Fingerprint::Fields(Cow::Owned(fields.iter().map(&mut resolve_path).collect()))
        }
    };
    let (key_field, key_header) = match &contract.key_scope.source {
        KeySource::Body { field } => (Some(resolve_path(field)), None),
        KeySource::Header { name } => (None, HeaderName::from_bytes(name.as_bytes()).ok()),
    };
    if missing.is_empty() {
        return Ok(SerdeNames {
            fingerprint,
            key_field,
            key_header,
            query,
        });
    }
    Err(format!(
        "the contract of `{}` names {} of the JSON body, which serde reads under none of its spellings (the body's members are {}): \
         a `#[serde(rename)]` the contract cannot follow; rename the Rust field, or fingerprint the whole body with `fingerprint = body`",
        contract.operation,
        missing.join(", "),
        listed(members.unwrap_or_default())
    ))
}

/// `path` with its first segment under the name serde reads it by, or that segment when
/// serde reads it under none of its spellings.
fn resolve_path<'p>(path: &'p FieldPath, members: &[&'p str]) -> Result<FieldPath, &'p str> {
    let mut segments = path.segments();
    let first = segments.next().unwrap_or_default();
    let serde_name = serde_name(first, members).ok_or(first)?;
    let joined = std::iter::once(serde_name)
        .chain(segments)
        .collect::<Vec<_>>()
        .join(".");
    Ok(FieldPath::parse(joined).unwrap_or_else(|_| path.clone()))
}

/// The contract's significant query parameters under the names serde reads them by.
fn resolve_query(contract: &Contract, members: Option<&[&str]>) -> Result<Vec<String>, String> {
    let mut missing = Vec::new();
    let query = contract
        .fingerprint_query
        .iter()
        .map(|name| {
            let name = name.as_str();
            let Some(members) = members else {
                return name.to_owned();
            };
            serde_name(name, members).map_or_else(
                || {
                    missing.push(format!("`{name}`"));
                    name.to_owned()
                },
                str::to_owned,
            )
        })
        .collect();
    if missing.is_empty() {
        return Ok(query);
    }
    Err(format!(
        "the contract of `{}` names the query parameter {}, which serde reads under none of its spellings (the query type's fields are {}): \
         a `#[serde(rename)]` the contract cannot follow; rename the Rust field",
        contract.operation,
        missing.join(", "),
        listed(members.unwrap_or_default())
    ))
}

/// `members` in backticks, separated by commas.
fn listed(members: &[&str]) -> String {
    let members: Vec<String> = members.iter().map(|m| format!("`{m}`")).collect();
    members.join(", ")
}

/// `name` if serde reads it, else the one `rename_all` spelling of it that serde reads.
fn serde_name<'m>(name: &str, members: &[&'m str]) -> Option<&'m str> {
    if let Some(found) = members.iter().find(|m| **m == name) {
        return Some(found);
    }
    let spellings = [
        name.to_lower_camel_case(),
        name.to_upper_camel_case(),
        name.to_kebab_case(),
        name.to_shouty_snake_case(),
        name.to_shouty_kebab_case(),
        name.to_lowercase(),
        name.to_uppercase(),
    ];
    let mut found = members.iter().filter(|m| spellings.iter().any(|s| s == *m));
    match (found.next(), found.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(fields: &'static [FieldPath]) -> Contract {
        Contract {
            fingerprint: Fingerprint::Fields(Cow::Borrowed(fields)),
            ..Contract::PLACEHOLDER
        }
    }

    const FIELDS: &[FieldPath] = &[
        FieldPath::from_static("customer_id"),
        FieldPath::from_static("amount_minor"),
        FieldPath::from_static("items.sku"),
    ];

    fn names(wire: &SerdeNames) -> Vec<String> {
        let Fingerprint::Fields(fields) = &wire.fingerprint else {
            panic!()
        };
        fields.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn names_serde_reads_are_kept() {
        let wire = resolve(
            &contract(FIELDS),
            Some(&["customer_id", "amount_minor", "items"]),
            None,
        )
        .unwrap();
        assert_eq!(names(&wire), ["customer_id", "amount_minor", "items.sku"]);
    }

    #[test]
    fn rename_all_spellings_are_followed() {
        let camel = resolve(
            &contract(FIELDS),
            Some(&["customerId", "amountMinor", "items"]),
            None,
        )
        .unwrap();
        assert_eq!(names(&camel), ["customerId", "amountMinor", "items.sku"]);
        let kebab = resolve(
            &contract(FIELDS),
            Some(&["customer-id", "AMOUNT_MINOR", "items"]),
            None,
        )
        .unwrap();
        assert_eq!(names(&kebab), ["customer-id", "AMOUNT_MINOR", "items.sku"]);
    }

    #[test]
    fn unknown_members_are_a_configuration_error() {
        let error = resolve(
            &contract(FIELDS),
            Some(&["cust", "amountMinor", "items"]),
            None,
        )
        .unwrap_err();
        assert!(
            error.contains("names `customer_id` of the JSON body"),
            "{error}"
        );
        assert!(error.contains("`cust`, `amountMinor`, `items`"), "{error}");
    }

    #[test]
    fn unknown_bodies_take_the_names_as_written() {
        let wire = resolve(&contract(FIELDS), None, None).unwrap();
        assert_eq!(names(&wire), ["customer_id", "amount_minor", "items.sku"]);
    }
}
