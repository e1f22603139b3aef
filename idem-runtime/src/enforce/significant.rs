//! Stage 4, what counts as the same request: the body parsed once (JSON, or a form), the
//! key taken from it when the contract puts it there, and the fingerprint of the
//! significant content — the contract's body fields, the path parameters and the query
//! parameters the contract names — computed once from the bytes received.

use http::request::Parts;
use idem_contract::{Contract, Fingerprint};

use super::Rejection;
use super::key;
use super::read::Read;
use crate::answer;
use crate::fingerprint::{self, Fingerprints, jcs::Value};
use crate::serde_names::SerdeNames;

/// The request as idem tells it apart.
pub(crate) struct Significant {
    /// The idempotency key, as checked.
    pub(crate) key: String,
    /// The fingerprint of the significant content (`sha256:<hex>`), and the one of the
    /// rule before `null` members were left out when it differs.
    pub(crate) fingerprint: Fingerprints,
}

/// The key (the header's `header_key`, else the body's) and the fingerprint.
///
/// # Errors
///
/// 400 `body-malformed` for a body or query string that cannot be read as the contract
/// needs; the key's problems ([`key::from_body`]).
pub(crate) fn significant(
    parts: &Parts,
    read: &Read,
    names: &SerdeNames,
    header_key: Option<String>,
    contract: &Contract,
) -> Result<Significant, Rejection> {
    let needs_json = header_key.is_none() || matches!(contract.fingerprint, Fingerprint::Fields(_));
    let document = document(parts, &read.bytes, needs_json)?;
    let key = match (header_key, &document) {
        (Some(key), _) => key,
        (None, Some(document)) => {
            key::from_body(&document.value, document.is_form, names, contract)?
        }
        // (A body key always parses the body: `needs_json`.)
        (None, None) => return Err(answer::key_missing(contract).into()),
    };
    let query = query(parts, names)?;
    let params: Vec<(&str, &str)> = read
        .path_params
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let body = match &document {
        Some(document) => fingerprint::of_parsed(&names.fingerprint, &read.bytes, &document.value),
        None => fingerprint::compute_with_legacy(&names.fingerprint, &read.bytes),
    };
    let fingerprint = body
        .and_then(|body| {
            body.try_map(|fp| fingerprint::with_request_parts(fp, &params, query.clone()))
        })
        .map_err(answer::body_malformed)?;
    Ok(Significant { key, fingerprint })
}

/// The body, parsed.
struct Document {
    value: Value,
    /// Read as a form (`application/x-www-form-urlencoded`, or the query string of a GET).
    is_form: bool,
}

/// The body parsed as a form when it is one (`Form<T>`; on GET or HEAD, the query string,
/// as axum's `Form` reads it), else as JSON when `needs_json` (a field or a key must be
/// read from it), else not at all.
fn document(parts: &Parts, bytes: &[u8], needs_json: bool) -> Result<Option<Document>, Rejection> {
    let form_body = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| fingerprint::form::is_form(v.as_bytes()));
    let get_form = matches!(parts.method, http::Method::GET | http::Method::HEAD)
        && bytes.is_empty()
        && parts.uri.query().is_some();
    let form = match (get_form, form_body) {
        (true, _) => Some(parts.uri.query().unwrap_or_default().as_bytes()),
        (false, true) => Some(bytes),
        (false, false) => None,
    };
    if let Some(form) = form {
        let value = fingerprint::form::parse(form).map_err(answer::body_malformed)?;
        return Ok(Some(Document {
            value,
            is_form: true,
        }));
    }
    if !needs_json {
        return Ok(None);
    }
    let value = Value::parse(bytes).map_err(|e| {
        answer::body_malformed(format_args!("the request body is not valid JSON: {e}"))
    })?;
    Ok(Some(Document {
        value,
        is_form: false,
    }))
}

/// The significant query parameters the contract names, each with its values in order,
/// read like a form (the query string's encoding); `None` when the contract names none.
fn query(parts: &Parts, names: &SerdeNames) -> Result<Option<Vec<(String, Value)>>, Rejection> {
    if names.query.is_empty() {
        return Ok(None);
    }
    let string = parts.uri.query().unwrap_or_default();
    let all = fingerprint::form::parse(string.as_bytes()).map_err(|e| {
        answer::body_malformed(format_args!("the query string cannot be read: {e}"))
    })?;
    let Value::Object(all) = all else {
        return Err(answer::body_malformed("the query string cannot be read").into());
    };
    Ok(Some(
        all.into_iter()
            .filter(|(name, _)| names.query.iter().any(|q| q == name))
            .collect(),
    ))
}
