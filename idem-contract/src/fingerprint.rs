//! `fingerprint`: which request fields are significant.

use std::borrow::Cow;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// Property 2, `fingerprint`: the significant content of a request.
///
/// Written `fingerprint = [customer_id, currency, amount_minor, items]` (members of the
/// JSON body, nested with dots: `customer.id`) or `fingerprint = body` (the whole body).
///
/// The runtime hashes the RFC 8785 canonical JSON of the significant content with SHA-256.
/// The same key with a different fingerprint is a client bug, answered with 422. A member
/// whose value is `null` is the same content as an absent member, at any depth (the
/// `null` elements of an array are kept).
///
/// The macro checks each field against the handler's `Json<T>` body type, so a misspelt
/// field is a compile error. A field is looked up in the JSON body under the name serde
/// reads (`#[serde(rename_all)]` is followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Fingerprint {
    /// `body`: the whole body. A JSON body is canonicalised first, without its `null`
    /// members; any other body is hashed as received.
    Body,
    /// The listed members of the JSON body; members that are absent or `null` are left
    /// out.
    Fields(Cow<'static, [FieldPath]>),
}

/// A member of the JSON request body, nested with dots: `amount`, `customer.id`.
///
/// Every segment is non-empty; a segment never holds a dot.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct FieldPath(#[schemars(regex(pattern = r"^[^.]+(\.[^.]+)*$"))] Cow<'static, str>);

impl FieldPath {
    /// A path from its dotted form, for generated code. Not checked: use
    /// [`FieldPath::parse`] for input.
    pub const fn from_static(path: &'static str) -> FieldPath {
        FieldPath(Cow::Borrowed(path))
    }

    /// A path from its dotted form.
    ///
    /// # Errors
    ///
    /// Returns the text back when it is empty or has an empty segment (`a..b`, `.a`).
    pub fn parse(path: impl Into<Cow<'static, str>>) -> Result<FieldPath, String> {
        let path = path.into();
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(path.into_owned());
        }
        Ok(FieldPath(path))
    }

    /// The dotted form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl<'de> Deserialize<'de> for FieldPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<FieldPath, D::Error> {
        let text = String::deserialize(deserializer)?;
        FieldPath::parse(text).map_err(|text| {
            serde::de::Error::custom(format!("`{text}` is not a field path: write member names joined by dots, such as `customer.id`"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths() {
        assert_eq!(
            FieldPath::parse("customer.id")
                .unwrap()
                .segments()
                .collect::<Vec<_>>(),
            ["customer", "id"]
        );
        for bad in ["", ".", "a..b", ".a", "a."] {
            assert!(FieldPath::parse(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<FieldPath>("\"a..b\"").is_err());
    }

    #[test]
    fn serde_forms() {
        assert_eq!(
            serde_json::to_string(&Fingerprint::Body).unwrap(),
            "\"body\""
        );
        let f: Fingerprint =
            serde_json::from_str(r#"{"fields": ["amount", "customer.id"]}"#).unwrap();
        assert_eq!(
            f,
            Fingerprint::Fields(
                vec![
                    FieldPath::from_static("amount"),
                    FieldPath::from_static("customer.id")
                ]
                .into()
            )
        );
    }
}
