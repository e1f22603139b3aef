//! `application/x-www-form-urlencoded` bodies, read into the value the fingerprint is
//! computed from.
//!
//! A form body is a list of `name=value` pairs (the WHATWG URL standard's
//! `application/x-www-form-urlencoded` parser: `&` between pairs, `+` for a space,
//! percent-escapes). Its canonical value is an object with one member per name, in the
//! order of RFC 8785 (member order does not matter), whose value is the array of that
//! name's values in the order they came (repeated names keep their order):
//! `b=2&a=1&a=3` is `{"a": ["1", "3"], "b": ["2"]}`.

use std::collections::BTreeMap;

use percent_encoding::percent_decode;

use super::jcs::{self, Value};

/// Why a form body has no canonical value; answered with 400 `body-malformed`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the form body has a name or a value that is not UTF-8 once percent-decoded (at pair {pair})"
)]
pub struct FormError {
    /// The position of the pair, from 1.
    pub pair: usize,
}

/// Whether `content_type` (a `Content-Type` value) is `application/x-www-form-urlencoded`.
pub fn is_form(content_type: &[u8]) -> bool {
    let essence = content_type
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default();
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
}

/// The canonical value of a form `body` (see the module docs).
///
/// # Errors
///
/// [`FormError`] for a name or a value that is not UTF-8 once decoded: two different
/// bodies must never read as the same content.
pub fn parse(body: &[u8]) -> Result<Value, FormError> {
    let mut members: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let pairs = body.split(|b| *b == b'&').filter(|pair| !pair.is_empty());
    for (i, pair) in pairs.enumerate() {
        let (name, value) = match pair.iter().position(|b| *b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &b""[..]),
        };
        let decode = |part: &[u8]| {
            let spaced: Vec<u8> = part
                .iter()
                .map(|b| if *b == b'+' { b' ' } else { *b })
                .collect();
            percent_decode(&spaced)
                .decode_utf8()
                .map(|text| text.into_owned())
                .map_err(|_| FormError { pair: i + 1 })
        };
        members
            .entry(decode(name)?)
            .or_default()
            .push(Value::String(decode(value)?));
    }
    let mut object: Vec<(String, Value)> = members
        .into_iter()
        .map(|(name, values)| (name, Value::Array(values)))
        .collect();
    object.sort_by(|(a, _), (b, _)| jcs::utf16_cmp(a, b));
    Ok(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(body: &str) -> String {
        String::from_utf8(parse(body.as_bytes()).unwrap().to_canonical().unwrap()).unwrap()
    }

    #[test]
    fn member_order_does_not_matter_and_repeated_names_keep_their_order() {
        assert_eq!(canonical("b=2&a=1&a=3"), r#"{"a":["1","3"],"b":["2"]}"#);
        assert_eq!(canonical("a=1&b=2&a=3"), canonical("b=2&a=1&a=3"));
        assert_ne!(canonical("a=3&a=1"), canonical("a=1&a=3"));
    }

    #[test]
    fn escapes_and_spaces_are_decoded() {
        assert_eq!(
            canonical("name=J%C3%B6rg+M&x"),
            r#"{"name":["Jörg M"],"x":[""]}"#
        );
        assert_eq!(canonical("a=%20"), canonical("a=+"));
        assert_eq!(canonical(""), "{}");
        assert_eq!(canonical("&&a=1&"), r#"{"a":["1"]}"#);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused() {
        assert_eq!(parse(b"a=1&b=%FF"), Err(FormError { pair: 2 }));
        assert_eq!(parse(b"a=\xff"), Err(FormError { pair: 1 }));
    }

    #[test]
    fn the_media_type_is_recognised() {
        for yes in [
            "application/x-www-form-urlencoded",
            "Application/X-WWW-Form-Urlencoded; charset=utf-8",
        ] {
            assert!(is_form(yes.as_bytes()), "{yes}");
        }
        for no in ["application/json", "multipart/form-data", ""] {
            assert!(!is_form(no.as_bytes()), "{no}");
        }
    }

    proptest::proptest! {
        /// No body makes the reader panic.
        #[test]
        fn any_body_is_read_or_refused(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse(&body);
        }
    }
}
