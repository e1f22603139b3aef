//! The fingerprint of a request: a hash of its significant content.
//!
//! The contract's [`Fingerprint`] property names the significant content: listed members
//! of the JSON body, or the whole body. That content is put into the canonical form of
//! RFC 8785 ([`jcs`]) and hashed with SHA-256, written `sha256:<64 lowercase hex digits>`.
//! The result is the same across processes, machines and releases, so a record written by
//! one instance is compared correctly by another after a restart.
//!
//! | contract | what is hashed |
//! |---|---|
//! | `fingerprint = [a, b.c]` | the canonical form of the object `{"a": …, "b.c": …}` holding the declared members found in the body (absent and `null` members are left out); the body must be a JSON object |
//! | `fingerprint = body` | the canonical form of the body if it is JSON (without its `null` members), else the bytes as received |
//!
//! A body sent as `application/x-www-form-urlencoded` is read as a form ([`form`]): its
//! names are the members, each with the array of its values, so that `[amount]` names
//! the form field `amount` and member order does not matter.
//!
//! Member order, whitespace and number spelling (`1`, `1.0`, `1e0`) do not change a
//! fingerprint; array order does.
//!
//! # Null members
//!
//! A member whose value is `null` is the same content as an absent member, as serde reads
//! both into `None`: it is left out of the significant content at any depth. With
//! `[a, b.c]`, a listed field that is `null` is left out as an absent one is, and so is a
//! `null` member inside a listed field's value (`{"a": {"x": 1, "y": null}}` is
//! `{"a": {"x": 1}}`); with `body`, every `null` member of the body. What is not
//! normalised: `null` elements of an array (`[1, null]` is not `[1]`), a body that is
//! `null` itself, an empty object or array (`{"a": {}}` is not `{}`), and a body that is
//! not JSON. Form bodies and query parameters have no `null`.
//!
//! Content without a `null` member has the fingerprint it always had. Content with one
//! had another before this rule (the `null` was hashed), so [`Fingerprints`] carries
//! that earlier fingerprint too, as `legacy`: a record written by an earlier release
//! still matches a retry of the same bytes, and the retry goes on under the record's
//! fingerprint.
//!
//! ```
//! use idem_contract::{FieldPath, Fingerprint};
//! use idem_runtime::fingerprint::compute;
//!
//! let fields = Fingerprint::Fields(vec![FieldPath::from_static("amount")].into());
//! let a = compute(&fields, br#"{"amount": 100, "note": "first"}"#)?;
//! let b = compute(&fields, br#"{"note":"second","amount":1.0e2}"#)?;
//! assert_eq!(a, b);
//! assert!(a.starts_with("sha256:"));
//! # Ok::<(), idem_runtime::fingerprint::FingerprintError>(())
//! ```

pub mod form;
pub mod jcs;

use std::borrow::Cow;

use idem_contract::Fingerprint;
use sha2::{Digest, Sha256};

use self::jcs::{JcsError, Value};

/// The prefix that names the hash function in every fingerprint.
pub const ALGORITHM_PREFIX: &str = "sha256:";

/// Why a request has no fingerprint; answered with 400 `body-malformed`.
#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    /// The contract lists fields and the body is not JSON in the I-JSON subset (see
    /// [`Value::parse`]).
    #[error("the request body is not valid JSON: {0}")]
    NotJson(#[source] JcsError),
    /// The contract lists fields and the body is JSON but not an object.
    #[error("the request body is not a JSON object, so its fingerprint fields cannot be read")]
    NotAnObject,
}

/// A request's fingerprint, and the one earlier releases gave the same request when the
/// two differ (see [Null members](self#null-members)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprints {
    /// The fingerprint: new records are written with it.
    pub current: String,
    /// The fingerprint of the rule before `null` members were left out, when the
    /// significant content holds one (otherwise it is `current`, and this is `None`): a
    /// record written with it is the same request.
    pub legacy: Option<String>,
}

impl Fingerprints {
    /// Both fingerprints passed through `f` (the path and query parameters added).
    ///
    /// # Errors
    ///
    /// `f`'s error.
    pub fn try_map<E>(self, f: impl Fn(String) -> Result<String, E>) -> Result<Fingerprints, E> {
        Ok(Fingerprints {
            current: f(self.current)?,
            legacy: self.legacy.map(f).transpose()?,
        })
    }

    /// Whether a record's fingerprint `stored` is this request's: under either rule.
    pub fn matches(&self, stored: &str) -> bool {
        self.current == stored || self.legacy.as_deref() == Some(stored)
    }
}

/// The fingerprint of `body` under the contract's `spec`.
///
/// # Errors
///
/// With `Fingerprint::Fields`: [`FingerprintError::NotJson`] when the body is not JSON
/// and [`FingerprintError::NotAnObject`] when it is not an object. With
/// `Fingerprint::Body` this never fails.
pub fn compute(spec: &Fingerprint, body: &[u8]) -> Result<String, FingerprintError> {
    compute_with_legacy(spec, body).map(|both| both.current)
}

/// [`compute`], with the fingerprint that earlier releases gave the same body when it
/// differs ([`Fingerprints::legacy`]).
///
/// # Errors
///
/// As [`compute`].
pub fn compute_with_legacy(
    spec: &Fingerprint,
    body: &[u8],
) -> Result<Fingerprints, FingerprintError> {
    match spec {
        Fingerprint::Body => Ok(of_body(body, None)),
        Fingerprint::Fields(_) => {
            let doc = Value::parse(body).map_err(FingerprintError::NotJson)?;
            of_parsed(spec, body, &doc)
        }
    }
}

/// The fingerprints of `body` whose JSON has already been parsed into `doc`.
pub(crate) fn of_parsed(
    spec: &Fingerprint,
    body: &[u8],
    doc: &Value,
) -> Result<Fingerprints, FingerprintError> {
    match spec {
        Fingerprint::Body => Ok(of_body(body, Some(doc))),
        Fingerprint::Fields(fields) => {
            if !matches!(doc, Value::Object(_)) {
                return Err(FingerprintError::NotAnObject);
            }
            let mut selected: Vec<(&str, &Value)> = fields
                .iter()
                .filter_map(|path| Some((path.as_str(), doc.pointer(path.segments())?)))
                .collect();
            selected.sort_by(|(a, _), (b, _)| jcs::utf16_cmp(a, b));
            selected.dedup_by(|(a, _), (b, _)| a == b);
            let legacy = selected
                .iter()
                .any(|(_, v)| v.is_null() || has_null_member(v))
                .then(|| of_members(selected.iter().map(|(k, v)| (*k, *v))))
                .transpose()?;
            let present: Vec<(&str, Cow<'_, Value>)> = selected
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (*k, without_null_members(v)))
                .collect();
            let current = of_members(present.iter().map(|(k, v)| (*k, &**v)))?;
            Ok(Fingerprints { current, legacy })
        }
    }
}

/// The hash of the object of `members`, sorted by name.
fn of_members<'a>(
    members: impl Iterator<Item = (&'a str, &'a Value)>,
) -> Result<String, FingerprintError> {
    let mut canonical = Vec::new();
    jcs::write_object(&mut canonical, members).map_err(FingerprintError::NotJson)?;
    Ok(hash(&canonical))
}

/// Whether an object of `value`, at any depth (inside arrays too), has a `null` member.
fn has_null_member(value: &Value) -> bool {
    match value {
        Value::Object(members) => members
            .iter()
            .any(|(_, v)| v.is_null() || has_null_member(v)),
        Value::Array(items) => items.iter().any(has_null_member),
        _ => false,
    }
}

/// `value` without the `null` members of its objects, at any depth; the `null` elements
/// of arrays are kept. Borrowed when there is none.
fn without_null_members(value: &Value) -> Cow<'_, Value> {
    if !has_null_member(value) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(stripped(value))
}

fn stripped(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), stripped(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(stripped).collect()),
        other => other.clone(),
    }
}

/// The fingerprint of a request with path parameters: the body's fingerprint
/// (`body_fingerprint`, from [`compute`]) and the parameters, `(name, value)` with values
/// percent-decoded, hashed together as the canonical form of
/// `{"body": "<body fingerprint>", "path": {"<name>": "<value>", …}}`.
///
/// The parameters name the resource the intent is about (`/customers/{customer}/sources`),
/// so the same key and body on another resource's path is another request (422). A
/// request without path parameters keeps the body's fingerprint as it is, so that records
/// written before path parameters counted still match.
///
/// # Errors
///
/// None in practice: strings always have a canonical form. The type is the one of
/// [`compute`], whose error it shares.
pub fn with_path_params(
    body_fingerprint: String,
    params: &[(&str, &str)],
) -> Result<String, FingerprintError> {
    with_request_parts(body_fingerprint, params, None)
}

/// The fingerprint of a request whose contract also names significant query
/// parameters: as [`with_path_params`], with a member `"query"` holding each named
/// parameter that the query string has, with the array of its values in order
/// (`{"body": …, "path": {…}, "query": {"expand": ["customer"]}}`). `query` is `None`
/// when the contract names none, and the form is then that of [`with_path_params`].
///
/// # Errors
///
/// None in practice, as for [`with_path_params`].
pub fn with_request_parts(
    body_fingerprint: String,
    params: &[(&str, &str)],
    query: Option<Vec<(String, Value)>>,
) -> Result<String, FingerprintError> {
    if params.is_empty() && query.is_none() {
        return Ok(body_fingerprint);
    }
    let mut path: Vec<(String, Value)> = params
        .iter()
        .map(|(name, value)| ((*name).to_owned(), Value::String((*value).to_owned())))
        .collect();
    path.sort_by(|(a, _), (b, _)| jcs::utf16_cmp(a, b));
    // "body" sorts before "path", and "path" before "query".
    let mut members = vec![
        ("body".to_owned(), Value::String(body_fingerprint)),
        ("path".to_owned(), Value::Object(path)),
    ];
    if let Some(mut query) = query {
        query.sort_by(|(a, _), (b, _)| jcs::utf16_cmp(a, b));
        query.dedup_by(|(a, _), (b, _)| a == b);
        members.push(("query".to_owned(), Value::Object(query)));
    }
    let request = Value::Object(members);
    let canonical = request.to_canonical().map_err(FingerprintError::NotJson)?;
    Ok(hash(&canonical))
}

/// `fingerprint = body`: the canonical JSON without its `null` members if the body is
/// JSON, else the raw bytes.
fn of_body(body: &[u8], doc: Option<&Value>) -> Fingerprints {
    let parsed;
    let doc = match doc {
        Some(doc) => Some(doc),
        None => {
            parsed = Value::parse(body).ok();
            parsed.as_ref()
        }
    };
    let of = |value: &Value| match value.to_canonical() {
        Ok(canonical) => hash(&canonical),
        Err(_) => hash(body),
    };
    match doc {
        Some(doc) => Fingerprints {
            current: of(&without_null_members(doc)),
            legacy: has_null_member(doc).then(|| of(doc)),
        },
        None => Fingerprints {
            current: hash(body),
            legacy: None,
        },
    }
}

fn hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = [0u8; 64];
    // 32 bytes always fit 64 hexadecimal digits; the digits are ASCII.
    let digits = match hex::encode_to_slice(digest, &mut hex) {
        Ok(()) => std::str::from_utf8(&hex).unwrap_or_default(),
        Err(_) => "",
    };
    let mut out = String::with_capacity(ALGORITHM_PREFIX.len() + 64);
    out.push_str(ALGORITHM_PREFIX);
    out.push_str(digits);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_params_are_significant_and_order_free() {
        let body = compute(&Fingerprint::Body, br#"{"a":1}"#).unwrap();
        assert_eq!(
            with_path_params(body.clone(), &[]).unwrap(),
            body,
            "no parameters: the body's"
        );
        let one = with_path_params(body.clone(), &[("customer", "cus_1")]).unwrap();
        let two = with_path_params(body.clone(), &[("customer", "cus_2")]).unwrap();
        assert_ne!(one, two);
        assert_ne!(one, body);
        let ab = with_path_params(body.clone(), &[("a", "1"), ("b", "2")]).unwrap();
        let ba = with_path_params(body.clone(), &[("b", "2"), ("a", "1")]).unwrap();
        assert_eq!(ab, ba, "the order of the parameters does not matter");
        // Stable across releases: the canonical form below, hashed with SHA-256.
        let expected = hash(br#"{"body":"sha256:015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862","path":{"customer":"cus_1"}}"#);
        assert_eq!(one, expected);
    }
    use idem_contract::FieldPath;

    fn fields(paths: &[&'static str]) -> Fingerprint {
        Fingerprint::Fields(
            paths
                .iter()
                .map(|p| FieldPath::from_static(p))
                .collect::<Vec<_>>()
                .into(),
        )
    }

    #[test]
    fn known_answer() {
        // sha256 of the empty object `{}`.
        assert_eq!(
            compute(&fields(&["absent"]), b"{}").unwrap(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn whole_body_equivalences() {
        let body = Fingerprint::Body;
        let a = compute(&body, br#"{"a":1,"b":{"x":1,"y":2}}"#).unwrap();
        let b = compute(&body, b"{ \"b\": {\"y\": 2, \"x\": 1},\n \"a\": 1 }").unwrap();
        assert_eq!(a, b);
        assert_ne!(
            compute(&body, b"[1,2]").unwrap(),
            compute(&body, b"[2,1]").unwrap()
        );
        let one = compute(&body, b"1").unwrap();
        assert_eq!(one, compute(&body, b"1.0").unwrap());
        assert_eq!(one, compute(&body, b"1e0").unwrap());
    }

    #[test]
    fn whole_body_that_is_not_json_is_hashed_raw() {
        let body = Fingerprint::Body;
        assert_eq!(
            compute(&body, b"plain text").unwrap(),
            compute(&body, b"plain text").unwrap()
        );
        assert_ne!(
            compute(&body, b"plain text").unwrap(),
            compute(&body, b"plain  text").unwrap()
        );
        assert_eq!(
            compute(&body, b"").unwrap(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn declared_fields_only() {
        let spec = fields(&["amount", "customer.id"]);
        let a = compute(
            &spec,
            br#"{"amount":100,"customer":{"id":"c1","name":"A"},"note":"x"}"#,
        );
        let b = compute(
            &spec,
            br#"{"customer":{"name":"B","id":"c1"},"amount":100.0}"#,
        );
        assert_eq!(a.unwrap(), b.unwrap());
        let c = compute(&spec, br#"{"amount":900,"customer":{"id":"c1"}}"#).unwrap();
        assert_ne!(
            c,
            compute(&spec, br#"{"amount":100,"customer":{"id":"c1"}}"#).unwrap()
        );
    }

    #[test]
    fn a_null_field_is_an_absent_one() {
        let spec = fields(&["a", "b"]);
        let absent = compute_with_legacy(&spec, br#"{"a":1}"#).unwrap();
        let null = compute_with_legacy(&spec, br#"{"a":1,"b":null}"#).unwrap();
        assert_eq!(absent.current, null.current);
        assert_eq!(absent.legacy, None, "no null: one rule");
        assert_eq!(
            absent.current,
            compute(&fields(&["a"]), br#"{"a":1}"#).unwrap()
        );
        // The rule before: the null was hashed. Stable: the canonical forms, hashed.
        assert_eq!(null.legacy, Some(hash(br#"{"a":1,"b":null}"#)));
        assert_eq!(null.current, hash(br#"{"a":1}"#));
        assert!(null.matches(&hash(br#"{"a":1,"b":null}"#)));
        assert!(null.matches(&absent.current));
        assert!(!absent.matches(&hash(br#"{"a":1,"b":null}"#)));
    }

    #[test]
    fn nested_null_members_are_absent_ones_but_null_elements_are_kept() {
        let spec = fields(&["customer", "customer.id", "items"]);
        let one = compute(
            &spec,
            br#"{"customer":{"id":"c1","name":null},"items":[{"sku":"a","note":null}]}"#,
        )
        .unwrap();
        let two = compute(&spec, br#"{"customer":{"id":"c1"},"items":[{"sku":"a"}]}"#).unwrap();
        assert_eq!(one, two);
        // A path through a null is absent, as through a missing member.
        let through = fields(&["customer.id"]);
        assert_eq!(
            compute(&through, br#"{"customer":null}"#).unwrap(),
            compute(&through, br#"{}"#).unwrap()
        );
        // Not normalised: array elements, empty objects.
        let items = fields(&["items"]);
        assert_ne!(
            compute(&items, br#"{"items":[1,null]}"#).unwrap(),
            compute(&items, br#"{"items":[1]}"#).unwrap()
        );
        let customer = fields(&["customer"]);
        assert_ne!(
            compute(&customer, br#"{"customer":{}}"#).unwrap(),
            compute(&customer, br#"{}"#).unwrap()
        );
    }

    #[test]
    fn a_whole_body_leaves_its_null_members_out() {
        let body = Fingerprint::Body;
        let null = compute_with_legacy(&body, br#"{"a":1,"b":{"c":null},"d":[null]}"#).unwrap();
        let absent = compute_with_legacy(&body, br#"{"a":1,"b":{},"d":[null]}"#).unwrap();
        assert_eq!(null.current, absent.current);
        assert_eq!(null.current, hash(br#"{"a":1,"b":{},"d":[null]}"#));
        assert_eq!(
            null.legacy,
            Some(hash(br#"{"a":1,"b":{"c":null},"d":[null]}"#))
        );
        assert_eq!(absent.legacy, None);
        // A body that is null itself is kept as it is.
        assert_eq!(compute(&body, b"null").unwrap(), hash(b"null"));
    }

    #[test]
    fn fields_need_a_json_object() {
        let spec = fields(&["a"]);
        assert!(matches!(
            compute(&spec, b"not json"),
            Err(FingerprintError::NotJson(_))
        ));
        assert!(matches!(
            compute(&spec, br#"{"a":1,"a":2}"#),
            Err(FingerprintError::NotJson(_))
        ));
        assert!(matches!(
            compute(&spec, b"[1]"),
            Err(FingerprintError::NotAnObject)
        ));
    }
}
