//! Writing a document tree as YAML that reads back the same in YAML 1.2 parsers (Rust's
//! yaml_serde, JavaScript's yaml) and in YAML 1.1 parsers (Python's PyYAML, which most
//! OpenAPI validators use).
//!
//! yaml_serde's own writer targets YAML 1.2 only: it writes the string `'off'` as plain
//! `off` and the string `2023-09-05` unquoted, which a YAML 1.1 reader turns into
//! `false` and a date. Stripe's document has such enum values, so this writer quotes every
//! plain scalar that either version could read as something other than a string.
//!
//! Layout: block mappings and sequences indented by two spaces (sequences indented under
//! their key, the common OpenAPI style), multi-line strings as literal blocks, `{}` and
//! `[]` for empty collections.

use serde_json::{Map, Number, Value};

/// The YAML text of `value`, ending with a newline.
pub(crate) fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0, false),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0, false),
        scalar => {
            write_inline(&mut out, scalar, 0);
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// Writes the entries of `map` at indentation `n`; the first one continues the current
/// line when `inline` (after a sequence's `- `).
fn write_map(out: &mut String, map: &Map<String, Value>, n: usize, inline: bool) {
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 || !inline {
            indent(out, n);
        }
        // Implicit keys are limited to 1024 characters (YAML 1.2 §7.4.2).
        if key.chars().count() > 1000 {
            out.push_str("? ");
            write_string(out, key, n + 2, true);
            out.push('\n');
            indent(out, n);
        } else {
            write_string(out, key, n, true);
        }
        out.push(':');
        write_value_after_key(out, value, n);
    }
}

fn write_value_after_key(out: &mut String, value: &Value, n: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, n + 2, false);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, n + 2, false);
        }
        scalar => {
            out.push(' ');
            write_inline(out, scalar, n + 2);
            out.push('\n');
        }
    }
}

/// Writes the items of `items` as `- ` entries at indentation `n`.
fn write_seq(out: &mut String, items: &[Value], n: usize, inline: bool) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline {
            indent(out, n);
        }
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => write_map(out, map, n + 2, true),
            Value::Array(inner) if !inner.is_empty() => write_seq(out, inner, n + 2, true),
            scalar => {
                write_inline(out, scalar, n + 2);
                out.push('\n');
            }
        }
    }
}

/// A scalar or an empty collection; `n` is the indentation of a literal block's lines.
fn write_inline(out: &mut String, value: &Value, n: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(num) => write_number(out, num),
        Value::String(s) => write_string(out, s, n, false),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
}

/// Integers as they are; floats always with a `.` and a signed exponent, the only float
/// form YAML 1.1 resolves (`1e300` would be read as a string there).
fn write_number(out: &mut String, num: &Number) {
    let text = num.to_string();
    if !num.is_f64() {
        out.push_str(&text);
        return;
    }
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (text.as_str(), None),
    };
    out.push_str(mantissa);
    if !mantissa.contains('.') {
        out.push_str(".0");
    }
    if let Some(e) = exponent {
        out.push('e');
        if !e.starts_with(['+', '-']) {
            out.push('+');
        }
        out.push_str(e);
    }
}

/// Characters that no plain or single-quoted scalar may hold: C0 and C1 controls (tab
/// included), DEL, the line breaks of YAML 1.1 (NEL, LS, PS), the byte order mark and the
/// non-characters that PyYAML refuses.
fn needs_escape(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}' | '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}')
}

/// Plain scalars that YAML 1.1 or 1.2 would not read as a string.
fn is_reserved_word(s: &str) -> bool {
    matches!(
        s,
        "~" | "null"
            | "Null"
            | "NULL"
            | "y"
            | "Y"
            | "yes"
            | "Yes"
            | "YES"
            | "n"
            | "N"
            | "no"
            | "No"
            | "NO"
            | "true"
            | "True"
            | "TRUE"
            | "false"
            | "False"
            | "FALSE"
            | "on"
            | "On"
            | "ON"
            | "off"
            | "Off"
            | "OFF"
            | "<<"
            | "="
    )
}

fn can_be_plain(s: &str) -> bool {
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) else {
        return false;
    };
    // Indicators (YAML 1.2 §5.3), and the starts of numbers, dates and `.inf`/`.nan`.
    !"-?:,[]{}#&*!|>'\"%@`.+ ".contains(first)
        && !first.is_ascii_digit()
        && !last.is_whitespace()
        && last != ':'
        && !s.contains(": ")
        && !s.contains(" #")
        && !s
            .chars()
            .any(|c| needs_escape(c) || c.is_whitespace() && c != ' ')
        && !is_reserved_word(s)
}

/// A multi-line string that a literal block (`|`) holds exactly: no characters that
/// need escapes, a first line that starts with text (the block's indentation is found
/// from it) and a last line that ends with text (trailing spaces would be ambiguous).
fn literal_ok(s: &str) -> bool {
    let trimmed = s.trim_end_matches('\n');
    s.contains('\n')
        && trimmed.chars().next().is_some_and(|c| !c.is_whitespace())
        && trimmed.chars().last().is_some_and(|c| !c.is_whitespace())
        && !s.chars().any(|c| c != '\n' && needs_escape(c))
}

/// Writes a string: plain when that reads back as the same string in YAML 1.1 and 1.2,
/// else a literal block (multi-line values), single quotes, or double quotes with
/// escapes. Keys are never literal blocks.
fn write_string(out: &mut String, s: &str, n: usize, key: bool) {
    if can_be_plain(s) {
        out.push_str(s);
    } else if !key && literal_ok(s) {
        let trailing = s.len() - s.trim_end_matches('\n').len();
        out.push_str(match trailing {
            0 => "|-",
            1 => "|",
            _ => "|+",
        });
        out.push('\n');
        let mut lines: Vec<&str> = s.split('\n').collect();
        if trailing > 0 {
            // The piece after the last line break is empty.
            lines.pop();
        }
        for (i, line) in lines.iter().enumerate() {
            if !line.is_empty() {
                indent(out, n);
                out.push_str(line);
            }
            if i + 1 < lines.len() {
                out.push('\n');
            }
        }
    } else if !s.chars().any(|c| needs_escape(c) || c == '\n') {
        out.push('\'');
        out.push_str(&s.replace('\'', "''"));
        out.push('\'');
    } else {
        write_double_quoted(out, s);
    }
}

fn write_double_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if needs_escape(c) && (c as u32) <= 0xff => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openapi::tree::YamlTree;
    use proptest::prelude::*;
    use serde_json::json;

    fn read(text: &str) -> Value {
        yaml_serde::from_str::<YamlTree>(text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
            .0
    }

    #[test]
    fn strings_that_look_like_other_things_are_quoted() {
        let v = json!({"enum": ["off", "on", "yes", "y", "2023-09-05", "1.0.0", "null", "~", "<<", "=", ".inf", "+1", "-", "a: b", "x #y", "#x", "", " x", "x "]});
        let text = to_yaml(&v);
        for line in text.lines().skip(1) {
            let item = line.trim_start().strip_prefix("- ").unwrap();
            assert!(item.starts_with('\''), "{item} should be quoted");
        }
        assert_eq!(read(&text), v);
    }

    #[test]
    fn layout() {
        let v = json!({"openapi": "3.0.0", "paths": {"/a": {"post": {"tags": ["x", "y"], "x": {}}}}, "list": [{"a": 1, "b": [1, [2, 3]]}], "e": [], "f": 1.5, "g": 1e300, "d": "line one\nline two\n"});
        let text = to_yaml(&v);
        assert_eq!(
            text,
            "openapi: '3.0.0'\npaths:\n  /a:\n    post:\n      tags:\n        - x\n        - 'y'\n      x: {}\nlist:\n  - a: 1\n    b:\n      - 1\n      - - 2\n        - 3\ne: []\nf: 1.5\ng: 1.0e+300\nd: |\n  line one\n  line two\n"
        );
        assert_eq!(read(&text), v);
    }

    #[test]
    fn hard_strings_round_trip() {
        for s in [
            "a\n\n",
            "\nleading",
            " a\nb",
            "a\nb ",
            "tab\tin",
            "nel\u{85}x",
            "ls\u{2028}",
            "bom\u{feff}",
            "c\u{1}",
            "quote'\"\\",
            "é ü 🦀",
            "a\r\nb",
            "\n",
            "\n\n",
            "x\n  indented\n\nend\n\n\n",
        ] {
            let v = json!({"k": s, s: [s]});
            let text = to_yaml(&v);
            assert_eq!(read(&text), v, "{text}");
        }
        let long_key = "k".repeat(2000);
        let v = json!({long_key: 1});
        assert_eq!(read(&to_yaml(&v)), v);
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".*".prop_map(Value::String),
            "[a-z0-9 :#'\"\n-]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (".*".prop_filter("not a merge key", |k| k != "<<"), inner),
                    0..6
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn round_trips_through_yaml_serde(v in any_json()) {
            let doc = json!({"root": v});
            let text = to_yaml(&doc);
            let back = yaml_serde::from_str::<YamlTree>(&text).map(|t| t.0);
            prop_assert_eq!(back.as_ref().ok(), Some(&doc), "{}", text);
        }
    }
}
