//! RFC 8785, the JSON Canonicalization Scheme (JCS): one byte sequence per JSON value, so
//! that equal data hashes equally whatever its spelling.
//!
//! The rules, each from RFC 8785 §3.2:
//!
//! - no whitespace between tokens;
//! - object members sorted by the UTF-16 code units of their names (§3.2.3), recursively;
//!   array order is kept;
//! - numbers are IEEE 754 doubles written as ECMAScript's `Number.prototype.toString`
//!   writes them (§3.2.2.3), through the `ryu-js` crate: `1`, `1.0` and `1e0` are all `1`,
//!   `-0` is `0`, `1e21` is `1e+21`;
//! - one deliberate departure: an integer literal beyond 2^53 that fits 64 bits is written
//!   with its exact digits instead of being rounded to the nearest double. RFC 8785 would
//!   give `9007199254740993` and `9007199254740992` one form, so an amount changed by one
//!   unit would be answered with the first request's replay instead of 422. The price:
//!   beyond 2^53, an integer literal and the same value spelt as a fraction or with an
//!   exponent (`1152921504606846976` and `1.152921504606846976e18`) have two forms;
//! - strings escaped as `JSON.stringify` escapes them (§3.2.2.2): `\"`, `\\`, `\b`, `\f`,
//!   `\n`, `\r`, `\t`, other control characters as `\u00xx` (lowercase hex), everything
//!   else as literal UTF-8;
//! - input outside I-JSON (RFC 7493) is refused: duplicate member names, numbers out of
//!   the double range, lone surrogates (§3.1).
//!
//! Nesting depth is bounded by `serde_json`'s recursion limit (128), so hostile input
//! cannot overflow the stack.

use std::cmp::Ordering;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why a text could not be canonicalised.
#[derive(Debug, thiserror::Error)]
pub enum JcsError {
    /// The text is not JSON, nests deeper than 128 levels, repeats a member name in one
    /// object, has a number outside the range of a double, or has trailing characters.
    #[error("{0}")]
    Invalid(#[source] serde_json::Error),
    /// A number is NaN or infinite: JSON cannot express it (RFC 8785 §3.2.2.3).
    #[error("a number is not finite")]
    NonFinite,
}

/// A parsed JSON value in the data model of RFC 8785: numbers are doubles, object members
/// are kept sorted by the UTF-16 code units of their names, and no name repeats.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as an IEEE 754 double.
    Number(f64),
    /// An integer literal beyond ±2^53, kept exact (see the module docs).
    Integer(i128),
    /// A string.
    String(String),
    /// An array, in its order.
    Array(Vec<Value>),
    /// An object, members sorted by [`utf16_cmp`] of their names.
    Object(Vec<(String, Value)>),
}

/// Parses and canonicalises `json` in one step.
///
/// # Errors
///
/// [`JcsError::Invalid`] when `json` is not I-JSON (see [`Value::parse`]).
pub fn canonicalize(json: &[u8]) -> Result<Vec<u8>, JcsError> {
    Value::parse(json)?.to_canonical()
}

/// Orders member names by their UTF-16 code units, as RFC 8785 §3.2.3 requires (this
/// differs from UTF-8 byte order for characters above U+FFFF against U+E000..U+FFFF).
pub fn utf16_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

impl Value {
    /// Parses one JSON text.
    ///
    /// # Errors
    ///
    /// [`JcsError::Invalid`] when the text is not JSON, has trailing characters, nests
    /// deeper than 128 levels, repeats a member name within one object, holds a lone
    /// surrogate, or has a number outside the range of a double.
    pub fn parse(json: &[u8]) -> Result<Value, JcsError> {
        serde_json::from_slice(json).map_err(JcsError::Invalid)
    }

    /// The canonical form (RFC 8785) of this value.
    ///
    /// # Errors
    ///
    /// [`JcsError::NonFinite`] when a number is NaN or infinite (only possible for a value
    /// built by hand: [`Value::parse`] never yields one).
    pub fn to_canonical(&self) -> Result<Vec<u8>, JcsError> {
        let mut out = Vec::new();
        self.write_canonical(&mut out)?;
        Ok(out)
    }

    /// Appends the canonical form of this value to `out`.
    ///
    /// # Errors
    ///
    /// As [`Value::to_canonical`].
    pub fn write_canonical(&self, out: &mut Vec<u8>) -> Result<(), JcsError> {
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Number(n) => write_number(out, *n)?,
            Value::Integer(n) => out.extend_from_slice(n.to_string().as_bytes()),
            Value::String(s) => write_string(out, s),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out)?;
                }
                out.push(b']');
            }
            Value::Object(members) => {
                write_object(out, members.iter().map(|(k, v)| (k.as_str(), v)))?;
            }
        }
        Ok(())
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The member at `path` (names of nested objects, outermost first), if every step is
    /// an object holding that member.
    pub fn pointer<'a, I>(&self, path: I) -> Option<&Value>
    where
        I: IntoIterator<Item = &'a str>,
    {
        path.into_iter().try_fold(self, |value, name| match value {
            Value::Object(members) => members
                .binary_search_by(|(k, _)| utf16_cmp(k, name))
                .ok()
                .map(|i| &members[i].1),
            _ => None,
        })
    }
}

/// Writes an object whose members are already sorted by [`utf16_cmp`] of their names.
pub(crate) fn write_object<'a>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'a str, &'a Value)>,
) -> Result<(), JcsError> {
    out.push(b'{');
    for (i, (name, value)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, name);
        out.push(b':');
        value.write_canonical(out)?;
    }
    out.push(b'}');
    Ok(())
}

/// An integer literal: a double up to ±2^53, where every integer is exact (RFC 8785's
/// model), and kept exact beyond (see the module docs).
#[allow(
    clippy::cast_precision_loss,
    reason = "exact up to 2^53, checked first"
)]
fn integer(v: i128) -> Value {
    const EXACT: u128 = 1 << 53;
    if v.unsigned_abs() <= EXACT {
        Value::Number(v as f64)
    } else {
        Value::Integer(v)
    }
}

/// Writes `n` as ECMAScript's `Number.prototype.toString` does (RFC 8785 §3.2.2.3).
///
/// # Errors
///
/// [`JcsError::NonFinite`] for NaN and the infinities.
pub fn write_number(out: &mut Vec<u8>, n: f64) -> Result<(), JcsError> {
    if !n.is_finite() {
        return Err(JcsError::NonFinite);
    }
    // ECMAScript prints negative zero as "0"; ryu-js does too, but say it here.
    let n = if n == 0.0 { 0.0 } else { n };
    out.extend_from_slice(ryu_js::Buffer::new().format_finite(n).as_bytes());
    Ok(())
}

/// Writes `s` as a JSON string the way `JSON.stringify` does (RFC 8785 §3.2.2.2).
fn write_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(integer(i128::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(integer(i128::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        if v.is_finite() {
            Ok(Value::Number(v))
        } else {
            Err(E::custom("a number is not finite"))
        }
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members: Vec<(String, Value)> = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value()?;
            members.push((name, value));
        }
        members.sort_by(|(a, _), (b, _)| utf16_cmp(a, b));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            // I-JSON (RFC 7493 §2.3) and RFC 8785 §3.1: member names must be unique.
            return Err(de::Error::custom("an object repeats a member name"));
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(json: &str) -> String {
        String::from_utf8(canonicalize(json.as_bytes()).unwrap()).unwrap()
    }

    fn number(bits: u64) -> Result<String, JcsError> {
        let mut out = Vec::new();
        write_number(&mut out, f64::from_bits(bits))?;
        Ok(String::from_utf8(out).unwrap())
    }

    /// RFC 8785 §3.2.2: the example of primitive serialization.
    #[test]
    fn rfc8785_primitives_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 §3.2.3: the example of member sorting by UTF-16 code units.
    #[test]
    fn rfc8785_sorting_example() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        assert_eq!(
            canon(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// RFC 8785 Appendix B: the number serialization samples, IEEE 754 bits → text.
    #[test]
    fn rfc8785_number_samples() {
        let samples: [(u64, &str); 25] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
            (0x3ff0000000000000, "1"),
        ];
        for (bits, text) in samples {
            assert_eq!(number(bits).unwrap(), text, "{bits:016x}");
        }
        for bits in [0x7fffffffffffffff, 0x7ff0000000000000, 0xfff0000000000000] {
            assert!(
                matches!(number(bits), Err(JcsError::NonFinite)),
                "{bits:016x}"
            );
        }
    }

    #[test]
    fn spelling_of_numbers_does_not_matter() {
        for spelling in ["1", "1.0", "1e0", "1E0", "10e-1", "0.1e1", "1.000"] {
            assert_eq!(canon(spelling), "1", "{spelling}");
        }
        assert_eq!(canon("-0"), "0");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("100"), "100");
        assert_eq!(canon("1e21"), "1e+21");
        // Integer literals beyond 2^53 keep their digits (the one departure from RFC 8785);
        // where a double holds them exactly, that is RFC 8785's own form.
        assert_eq!(canon("9007199254740993"), "9007199254740993");
        assert_eq!(canon("9007199254740992"), "9007199254740992");
        assert_eq!(canon("-9007199254740993"), "-9007199254740993");
        // The price: beyond 2^53, an integer and the same value spelt as a double differ.
        assert_eq!(canon("1152921504606846976"), "1152921504606846976");
        assert_eq!(canon("1.152921504606846976e18"), "1152921504606847000");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
        // A fraction is a double: it rounds as in RFC 8785.
        assert_eq!(canon("9007199254740993.0"), "9007199254740992");
    }

    #[test]
    fn member_order_and_whitespace_do_not_matter_array_order_does() {
        let a = canon(r#"{"a":1,"b":{"x":1,"y":2}}"#);
        let b = canon("{ \"b\" : {\"y\":2,\n\"x\":1} ,\t\"a\":1 }");
        assert_eq!(a, b);
        assert_eq!(a, r#"{"a":1,"b":{"x":1,"y":2}}"#);
        assert_ne!(canon("[1,2]"), canon("[2,1]"));
    }

    #[test]
    fn string_escapes_follow_json_stringify() {
        assert_eq!(
            canon(r#""\u0000\u001f\u007f\b\f\n\r\t\/\u2028""#),
            "\"\\u0000\\u001f\u{7f}\\b\\f\\n\\r\\t/\u{2028}\""
        );
    }

    #[test]
    fn refuses_what_is_not_i_json() {
        for bad in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":{"b":1,"b":1}}"#,
            "1e400",
            "-1e400",
            r#""\ud800""#,
            "[1,]",
            "{} {}",
            "",
            "NaN",
        ] {
            assert!(Value::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(Value::parse(deep.as_bytes()).is_err());
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(Value::parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn pointer_walks_objects() {
        let v = Value::parse(br#"{"customer":{"id":"c1"},"n":[1]}"#).unwrap();
        assert_eq!(
            v.pointer(["customer", "id"]),
            Some(&Value::String("c1".into()))
        );
        assert_eq!(v.pointer(["customer", "name"]), None);
        assert_eq!(v.pointer(["n", "0"]), None);
    }

    /// Builds arbitrary JSON values (finite numbers, unique member names).
    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| n.into()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            "\\PC{0,8}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes `value` with members in reverse order and whitespace between every token.
    fn scrambled(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Array(items) => format!(
                "[ {} ]",
                items.iter().map(scrambled).collect::<Vec<_>>().join(" ,\n")
            ),
            serde_json::Value::Object(members) => format!(
                "{{\t{} }}",
                members
                    .iter()
                    .rev()
                    .map(|(k, v)| format!(
                        "{} :  {}",
                        serde_json::to_string(k).unwrap(),
                        scrambled(v)
                    ))
                    .collect::<Vec<_>>()
                    .join(" , ")
            ),
            other => serde_json::to_string(other).unwrap(),
        }
    }

    /// The same data with every integer beyond 2^53 rounded to its double, as RFC 8785
    /// reads it: a double beyond 2^53 is written as an integer literal (its shortest
    /// round-trip digits), which reads back as [`Value::Integer`].
    #[allow(clippy::cast_precision_loss)]
    fn as_doubles(value: Value) -> Value {
        match value {
            Value::Integer(i) => Value::Number(i as f64),
            Value::Array(items) => Value::Array(items.into_iter().map(as_doubles).collect()),
            Value::Object(members) => Value::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k, as_doubles(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    proptest! {
        #[test]
        fn canonical_form_is_idempotent(value in arb_json()) {
            let once = canonicalize(value.to_string().as_bytes()).unwrap();
            let twice = canonicalize(&once).unwrap();
            prop_assert_eq!(once, twice);
        }

        #[test]
        fn canonical_form_ignores_member_order_and_whitespace(value in arb_json()) {
            let plain = canonicalize(value.to_string().as_bytes()).unwrap();
            let other = canonicalize(scrambled(&value).as_bytes()).unwrap();
            prop_assert_eq!(plain, other);
        }

        #[test]
        fn canonical_form_reads_back_as_the_same_data(value in arb_json()) {
            let canonical = canonicalize(value.to_string().as_bytes()).unwrap();
            prop_assert_eq!(
                as_doubles(Value::parse(&canonical).unwrap()),
                as_doubles(Value::parse(value.to_string().as_bytes()).unwrap())
            );
        }

        #[test]
        fn number_spellings_agree(n in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let plain = canonicalize(format!("{n:?}").as_bytes()).unwrap();
            let exp = canonicalize(format!("{n:e}").as_bytes()).unwrap();
            prop_assert_eq!(plain, exp);
        }
    }
}
