//! OpenAPI documents as they are on disk: loaded from JSON or YAML into one tree that
//! keeps every key and its order, checked to be OpenAPI 3.0 or 3.1, merged into
//! ([`merge`]), and saved back in the format they came in.
//!
//! The tree is `serde_json::Value` with `preserve_order` rather than a typed model: the
//! typed models (`openapiv3` for 3.0, `oas3` for 3.1) drop what they do not know and
//! reorder keys, and merging must keep every other part of a document intact.
//! Comments in YAML are not part of the data and are not kept.

mod consistency;
mod guard;
mod merge;
mod new;
pub(crate) mod refs;
mod target;
pub(crate) mod tree;
mod yaml;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, position_of};

pub use merge::{MergeOptions, Merged, merge, merge_with, unmatched};
pub use new::NewDocument;
pub use target::{Operation, Route, find_operation, operations};

/// The format a document is written in; a merged document is saved in the same one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON, indented with `indent` (the input's own indentation), or on one line when
    /// `indent` is `None`.
    Json {
        /// One level of indentation, such as two spaces or a tab.
        indent: Option<String>,
    },
    /// YAML.
    Yaml,
}

/// The OpenAPI version family of a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// OpenAPI 3.0.x: Schema Objects are an extended subset of JSON Schema draft 4
    /// (`nullable`, `example`; no `const`, no `$defs`, no type arrays), no webhooks.
    V3_0,
    /// OpenAPI 3.1.x: Schema Objects are JSON Schema 2020-12; `webhooks` exist.
    V3_1,
}

/// An OpenAPI 3.0 or 3.1 document and how it was written.
#[derive(Clone, Debug)]
pub struct Document {
    /// The document's tree; an object.
    pub root: Value,
    /// The format it was read from and is written in.
    pub format: Format,
    /// Its OpenAPI version family.
    pub version: Version,
    /// The `openapi` field as written, such as `3.0.3`.
    pub version_text: String,
    /// The file it was read from, for messages.
    pub path: PathBuf,
    crlf: bool,
    bom: bool,
}

impl Document {
    /// Reads and checks the document at `path`; see [`Document::parse`].
    ///
    /// # Errors
    ///
    /// The file cannot be read, is too large ([`crate::io::MAX_INPUT_BYTES`]), is not
    /// UTF-8, or [`Document::parse`] refuses it.
    pub fn load(path: &Path) -> Result<Document, Error> {
        let text = crate::io::read_text(path)?;
        Document::parse(path, &text)
    }

    /// Parses `text` (the contents of `path`, named in errors) as an OpenAPI 3.0 or 3.1
    /// document. The format is taken from the extension (`.json`, `.yaml`, `.yml`), or
    /// else from the first character (`{` is JSON).
    ///
    /// # Errors
    ///
    /// The text is empty, is not valid JSON or YAML (with the parser's line and column),
    /// nests deeper than 128 levels (YAML flow collections deeper than
    /// 1000 levels are refused before parsing, in linear time), has a key
    /// twice in one object, or is not an OpenAPI
    /// 3.0 or 3.1 document (a Swagger 2.0 document is named as such).
    pub fn parse(path: &Path, text: &str) -> Result<Document, Error> {
        let bom = text.starts_with('\u{feff}');
        let text = text.trim_start_matches('\u{feff}');
        if text.trim().is_empty() {
            return Err(Error::in_file(
                path,
                "the file is empty: expected an OpenAPI 3.0 or 3.1 document in JSON or YAML",
            ));
        }
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let json = match ext.as_deref() {
            Some("json") => true,
            Some("yaml" | "yml") => false,
            _ => text.trim_start().starts_with('{'),
        };
        let (root, format) = if json {
            let tree = serde_json::from_str::<tree::JsonTree>(text).map_err(|e| {
                Error::at(
                    path,
                    e.line(),
                    e.column(),
                    format!("invalid JSON: {}", strip_position(&e.to_string())),
                )
            })?;
            (
                tree.0,
                Format::Json {
                    indent: json_indent(text),
                },
            )
        } else {
            if let Some(p) = guard::too_deep(text) {
                return Err(Error::at(
                    path,
                    p.line,
                    p.column,
                    format!(
                        "invalid YAML: flow collections are nested deeper than {} levels",
                        guard::MAX_FLOW_DEPTH
                    ),
                ));
            }
            let tree =
                yaml_serde::from_str::<tree::YamlTree>(text).map_err(|e| match e.location() {
                    Some(l) => Error::at(
                        path,
                        l.line(),
                        l.column(),
                        format!("invalid YAML: {}", strip_position(&e.to_string())),
                    ),
                    None => Error::in_file(path, format!("invalid YAML: {e}")),
                })?;
            (tree.0, Format::Yaml)
        };
        let (version, version_text) = detect_version(path, text, &root)?;
        Ok(Document {
            root,
            format,
            version,
            version_text,
            path: path.to_owned(),
            crlf: text.find('\n').is_some_and(|i| text[..i].ends_with('\r')),
            bom,
        })
    }

    /// The document as text in its format: JSON with its own indentation, YAML in
    /// a layout that YAML 1.1 and 1.2 readers read alike; line endings (`\r\n` or `\n`) and a byte order mark as in the
    /// input.
    pub fn render(&self) -> String {
        let mut text = match &self.format {
            Format::Json { indent: None } => {
                let mut s = self.root.to_string();
                s.push('\n');
                s
            }
            Format::Json {
                indent: Some(indent),
            } => {
                let mut buf = Vec::new();
                let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
                let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
                serde::Serialize::serialize(&self.root, &mut ser)
                    .expect("a JSON value always serialises");
                let mut s = String::from_utf8(buf).expect("serde_json writes UTF-8");
                s.push('\n');
                s
            }
            Format::Yaml => yaml::to_yaml(&self.root),
        };
        if self.crlf {
            text = text.replace('\n', "\r\n");
        }
        if self.bom {
            text.insert(0, '\u{feff}');
        }
        text
    }

    /// Writes [`Document::render`] to `path` (`-` for standard output), atomically: on
    /// failure `path` is untouched.
    ///
    /// # Errors
    ///
    /// The file cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        crate::io::write_atomic(path, self.render().as_bytes())
    }
}

/// serde_json and yaml_serde end their messages with " at line L column C"; the
/// position is printed in front instead.
fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    }
}

/// The indentation of the first indented line, or `None` for JSON on one line.
fn json_indent(text: &str) -> Option<String> {
    let body = text.trim();
    if !body.contains('\n') {
        return None;
    }
    let indent = body
        .lines()
        .skip(1)
        .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
        .find(|ws| !ws.is_empty())
        .unwrap_or("  ");
    Some(indent.to_owned())
}

/// The `openapi` field: `3.0.x` or `3.1.x`.
fn detect_version(path: &Path, text: &str, root: &Value) -> Result<(Version, String), Error> {
    let at_key = |key: &str, message: String| match key_line(text, key) {
        Some(line) => Error::at(path, line, 1, message),
        None => Error::in_file(path, message),
    };
    let Some(object) = root.as_object() else {
        return Err(Error::in_file(
            path,
            "not an OpenAPI document: the top level is not an object with an `openapi` field",
        ));
    };
    if let Some(swagger) = object.get("swagger") {
        return Err(at_key(
            "swagger",
            format!(
                "this is a Swagger {} document; idem merges into OpenAPI 3.0 and 3.1 only: convert it to OpenAPI 3 first",
                swagger
                    .as_str()
                    .map_or_else(|| swagger.to_string(), str::to_owned)
            ),
        ));
    }
    let Some(field) = object.get("openapi") else {
        return Err(Error::in_file(
            path,
            "not an OpenAPI document: it has no `openapi` field (such as `openapi: 3.1.0`)",
        ));
    };
    let Some(text_version) = field.as_str() else {
        return Err(at_key(
            "openapi",
            format!(
                "the `openapi` field is `{field}`, not a string: quote it, such as `openapi: \"3.0.3\"`"
            ),
        ));
    };
    let version = if is_version(text_version, "3.0") {
        Version::V3_0
    } else if is_version(text_version, "3.1") {
        Version::V3_1
    } else {
        return Err(at_key(
            "openapi",
            format!(
                "OpenAPI `{text_version}` is not supported: idem merges into OpenAPI 3.0.x and 3.1.x documents"
            ),
        ));
    };
    Ok((version, text_version.to_owned()))
}

fn is_version(text: &str, family: &str) -> bool {
    text.strip_prefix(family)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|patch| {
            !patch.is_empty()
                && patch
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        })
}

/// The line of a top-level key, found in the text (the tree has no positions): `key:`
/// at the start of a line, or `"key"` in JSON.
fn key_line(text: &str, key: &str) -> Option<usize> {
    let yaml = format!("{key}:");
    let json = format!("\"{key}\"");
    text.lines()
        .position(|l| l.starts_with(&yaml) || l.trim_start().starts_with(&json))
        .map(|i| i + 1)
        .or_else(|| text.find(&json).map(|o| position_of(text, o).line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, text: &str) -> Result<Document, String> {
        Document::parse(Path::new(name), text).map_err(|e| e.to_string())
    }

    #[test]
    fn versions() {
        assert_eq!(
            parse("a.yaml", "openapi: 3.0.3\n").unwrap().version,
            Version::V3_0
        );
        assert_eq!(
            parse("a.json", "{\"openapi\": \"3.1.0\"}").unwrap().version,
            Version::V3_1
        );
        let e = parse("a.yaml", "info: {}\nswagger: '2.0'\n").unwrap_err();
        assert_eq!(
            e,
            "a.yaml:2:1: error: this is a Swagger 2.0 document; idem merges into OpenAPI 3.0 and 3.1 only: convert it to OpenAPI 3 first"
        );
        assert!(
            parse("a.yaml", "openapi: 3.0\n")
                .unwrap_err()
                .contains("a.yaml:1:1: error: the `openapi` field is `3.0`, not a string")
        );
        assert!(
            parse("a.yaml", "openapi: 3.2.0\n")
                .unwrap_err()
                .contains("not supported")
        );
        assert!(parse("a.yaml", "openapi: 3.10.0\n").is_err());
        assert!(
            parse("a.yaml", "- 1\n")
                .unwrap_err()
                .contains("not an OpenAPI document")
        );
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse("a.yaml", "openapi: 3.0.0\npaths:\n  /a: [\n").unwrap_err();
        assert!(e.starts_with("a.yaml:4:1: error: invalid YAML: "), "{e}");
        let e = parse(
            "a.json",
            "{\n  \"openapi\": \"3.0.0\",\n  \"paths\": {,}\n}",
        )
        .unwrap_err();
        assert!(e.starts_with("a.json:3:13: error: invalid JSON: "), "{e}");
        assert!(
            parse("a.json", " \n")
                .unwrap_err()
                .contains("the file is empty")
        );
    }

    #[test]
    fn json_keeps_its_indentation_order_and_line_endings() {
        let text = "{\r\n    \"openapi\": \"3.0.0\",\r\n    \"b\": 1,\r\n    \"a\": [\r\n        1\r\n    ]\r\n}\r\n";
        assert_eq!(parse("a.json", text).unwrap().render(), text);
        let compact = "{\"openapi\":\"3.1.0\",\"z\":{},\"a\":null}\n";
        assert_eq!(parse("x", compact).unwrap().render(), compact);
    }
}
