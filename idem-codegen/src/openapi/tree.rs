//! Reading JSON and YAML into one tree, `serde_json::Value` (with `preserve_order`, so
//! the document's key order survives), stricter than serde's defaults where OpenAPI needs
//! it:
//!
//! - a key given twice in one object is an error (serde_json keeps the last one silently;
//!   JSON RFC 8259 §4 says names SHOULD be unique, and OpenAPI tools disagree on which
//!   one wins);
//! - YAML keys that are numbers or booleans (`200:` for a response code) become strings,
//!   as OpenAPI means them;
//! - YAML merge keys (`<<: *defaults`) are applied: explicit keys win;
//! - numbers JSON cannot hold (`.nan`, `.inf`, integers past 64 bits) are errors.
//!
//! Errors raised here get the parser's line and column.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A document tree: `Value` read with the rules above. `YAML` turns on merge keys.
pub(crate) struct Tree<const YAML: bool>(pub Value);

/// A JSON document tree.
pub(crate) type JsonTree = Tree<false>;
/// A YAML document tree.
pub(crate) type YamlTree = Tree<true>;

impl<'de, const YAML: bool> serde::Deserialize<'de> for Tree<YAML> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Tree<YAML>, D::Error> {
        deserializer.deserialize_any(NodeVisitor::<YAML>).map(Tree)
    }
}

struct NodeVisitor<const YAML: bool>;

impl<'de, const YAML: bool> Visitor<'de> for NodeVisitor<YAML> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON or YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        i64::try_from(v)
            .map(Value::from)
            .map_err(|_| E::custom(format!("the integer {v} is too large for JSON tools")))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        u64::try_from(v)
            .map(Value::from)
            .map_err(|_| E::custom(format!("the integer {v} is too large for JSON tools")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| {
                E::custom(format!(
                    "`{v}` is not a JSON number; an OpenAPI document must be representable as JSON"
                ))
            })
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Tree::<YAML>(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut merged = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if YAML && key == MERGE_KEY {
                let Tree::<YAML>(value) = map.next_value()?;
                if is_mergeable(&value) {
                    merged.push(value);
                    continue;
                }
                // Not a merge (a quoted `'<<'` key with a plain value): an ordinary key.
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format!(
                        "the key `{key}` is given twice in one object; keep one"
                    )));
                }
                out.insert(key, value);
                continue;
            }
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "the key `{key}` is given twice in one object; keep one"
                )));
            }
            let Tree::<YAML>(value) = map.next_value()?;
            out.insert(key, value);
        }
        for m in merged {
            merge_into(&mut out, m);
        }
        Ok(Value::Object(out))
    }
}

/// The YAML merge key (yaml.org/type/merge.html, YAML 1.1), which PyYAML and most
/// OpenAPI tools apply. A reader cannot tell `<<` from a quoted `'<<'`, so a `<<` whose
/// value is a mapping or a list of mappings is taken as a merge.
const MERGE_KEY: &str = "<<";

fn is_mergeable(value: &Value) -> bool {
    match value {
        Value::Object(_) => true,
        Value::Array(items) => !items.is_empty() && items.iter().all(Value::is_object),
        _ => false,
    }
}

/// Inserts the keys of the merged mapping(s) that `out` lacks; earlier mappings of a
/// list win over later ones, explicit keys over all.
fn merge_into(out: &mut Map<String, Value>, merged: Value) {
    let maps = match merged {
        Value::Object(m) => vec![m],
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    for m in maps {
        for (k, v) in m {
            out.entry(k).or_insert(v);
        }
    }
}

/// Object keys: strings, or YAML scalars written as such (`200`, `true`).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, number or boolean as an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_bool<E>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i128<E>(self, v: i128) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u128<E>(self, v: u128) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(E::custom("an object key is null; write it as a string"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Result<Value, String> {
        yaml_serde::from_str::<YamlTree>(text)
            .map(|t| t.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn yaml_scalar_keys_become_strings_and_order_is_kept() {
        let v = yaml("z: 1\n200: ok\ntrue: yes\na: 2\n").unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["z", "200", "true", "a"]);
        assert_eq!(v["true"], "yes");
    }

    #[test]
    fn duplicate_keys_are_errors_with_a_line() {
        let err = yaml("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err();
        assert!(err.contains("`c` is given twice"), "{err}");
        // yaml_serde places errors raised while reading a mapping at the mapping's start.
        assert!(err.contains("line 3"), "{err}");
        let err = serde_json::from_str::<JsonTree>("{\n\"a\": 1,\n\"a\": 2}")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("`a` is given twice") && err.contains("line 3"),
            "{err}"
        );
    }

    #[test]
    fn merge_keys_are_applied_and_explicit_keys_win() {
        let v = yaml("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n").unwrap();
        assert_eq!(v["use"], serde_json::json!({"y": 3, "x": 1}));
    }

    #[test]
    fn non_json_numbers_are_errors() {
        assert!(yaml("a: .nan\n").unwrap_err().contains("not a JSON number"));
        assert!(yaml("a: 123456789012345678901234567890\n").is_err());
    }
}
