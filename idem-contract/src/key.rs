//! `key_scope`: where the idempotency key comes from, and the namespace it lives in.

use std::borrow::Cow;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::fingerprint::FieldPath;

/// The longest key accepted, in bytes (every accepted byte is one visible ASCII character).
pub const MAX_KEY_LEN: usize = 255;

/// Property 1, `key_scope`: where the client puts its key, what a key looks like, and the
/// namespace it lives in.
///
/// Written `key_scope = client` (header `Idempotency-Key`, any visible ASCII key) or with
/// options: `key_scope = client(header = "X-Request-Key")`,
/// `key_scope = client(body = client_reference)`, `key_scope = client(format = uuid)`.
///
/// Keys live in the namespace of the client's identity (given by the application) and the
/// operation: two clients that pick the same key never see each other's results, and one
/// client's key on two operations names two operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyScope {
    /// Whose namespace the key lives in, besides the operation.
    pub per: Namespace,
    /// Where the key is read from.
    pub source: KeySource,
    /// What a valid key looks like.
    #[serde(default)]
    pub format: KeyFormat,
}

/// The namespace of a key, besides the operation itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Namespace {
    /// `client`: the client's identity, as the application establishes it.
    Client,
}

/// Where the key is read from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "in", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeySource {
    /// A request header; names are matched case-insensitively (RFC 9110 §5.1).
    Header {
        /// The header name, such as `Idempotency-Key`.
        name: Cow<'static, str>,
    },
    /// A string member of the JSON request body, such as a client reference.
    Body {
        /// The path of the member, such as `client_reference`.
        field: FieldPath,
    },
}

/// What a valid key looks like, besides the rules every key follows (1 to 255 visible
/// ASCII characters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// `any`: any 1 to 255 visible ASCII characters (`!` to `~`).
    #[default]
    Any,
    /// `uuid`: a UUID in its hyphenated form (RFC 9562), any version.
    Uuid,
}

/// Why a key was refused; every case is answered with 400 before any store call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    TooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// The key has a byte outside visible ASCII (`!` to `~`): a space, a control
    /// character, or a non-ASCII character.
    NotVisibleAscii {
        /// The byte offset of the first such byte.
        at: usize,
    },
    /// The key is not in the declared format.
    Format {
        /// The declared format.
        expected: KeyFormat,
    },
    /// The header value starts with `"`, so it is read as an RFC 8941 sf-string (the
    /// IETF draft's form of the key), and it is not a valid one, or has parameters.
    Quoted {
        /// What is wrong, such as `unterminated string at index 4`.
        why: String,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => f.write_str("the idempotency key is empty"),
            KeyError::TooLong { len } => {
                write!(f, "the idempotency key is {len} bytes long; the limit is {MAX_KEY_LEN} visible ASCII characters")
            }
            KeyError::NotVisibleAscii { at } => write!(
                f,
                "the idempotency key has a character that is not visible ASCII at byte {at}; keys use `!` to `~` only"
            ),
            KeyError::Format { expected: KeyFormat::Uuid } => {
                f.write_str("the idempotency key must be a hyphenated UUID, such as `0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60`")
            }
            KeyError::Format { expected: KeyFormat::Any } => f.write_str("the idempotency key is malformed"),
            KeyError::Quoted { why } => write!(
                f,
                "the idempotency key starts with `\"`, so it is read as an RFC 8941 string (`\"abc\"`), but {why}; send the key bare (`abc`) or as one quoted string"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

impl KeyScope {
    /// The default scope: per client, key in the `Idempotency-Key` header, any format.
    pub const CLIENT: KeyScope = KeyScope {
        per: Namespace::Client,
        source: KeySource::Header {
            name: Cow::Borrowed(crate::headers::IDEMPOTENCY_KEY),
        },
        format: KeyFormat::Any,
    };

    /// The header that carries the key, if the key is in a header.
    pub fn header(&self) -> Option<&str> {
        match &self.source {
            KeySource::Header { name } => Some(name),
            KeySource::Body { .. } => None,
        }
    }

    /// The key a header value names, checked against the key rules
    /// ([`KeyScope::validate_key`]).
    ///
    /// The key is compared as the client meant it: a value that starts with `"` is an
    /// RFC 8941 sf-string (§3.3.3), the form of the IETF draft "The Idempotency-Key HTTP
    /// Header Field", and names the key it quotes, so `Idempotency-Key: "abc"` and
    /// `Idempotency-Key: abc` name the same key (`\"` and `\\` are its escapes). Any
    /// other value is the key as it is.
    ///
    /// ```
    /// use idem_contract::KeyScope;
    ///
    /// let scope = KeyScope::CLIENT;
    /// assert_eq!(scope.header_key(b"abc").unwrap(), "abc");
    /// assert_eq!(scope.header_key(br#""abc""#).unwrap(), "abc");
    /// assert_eq!(scope.header_key(br#""a\"b""#).unwrap(), "a\"b");
    /// assert!(scope.header_key(br#""abc"#).is_err()); // unterminated
    /// assert!(scope.header_key(br#""abc";v=1"#).is_err()); // parameters
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyError::Quoted`] for a quoted value that is not one valid sf-string without
    /// parameters; otherwise the first key rule the key breaks.
    pub fn header_key(&self, value: &[u8]) -> Result<String, KeyError> {
        let key: std::borrow::Cow<'_, [u8]> = if value.first() == Some(&b'"') {
            let quoted = |why: String| KeyError::Quoted { why };
            let text =
                std::str::from_utf8(value).map_err(|_| quoted("it is not ASCII".to_owned()))?;
            let item = sfv::Parser::new(text)
                .parse::<sfv::Item>()
                .map_err(|e| quoted(e.to_string()))?;
            if !item.params.is_empty() {
                return Err(quoted(
                    "parameters follow it (`;…`, RFC 8941 §3.1.2), and a key has none".to_owned(),
                ));
            }
            match item.bare_item {
                sfv::BareItem::String(s) => s.as_str().as_bytes().to_vec().into(),
                _ => return Err(quoted("it is not a string".to_owned())),
            }
        } else {
            value.into()
        };
        self.validate_key(&key)?;
        // Visible ASCII only, so this is valid UTF-8.
        Ok(String::from_utf8_lossy(&key).into_owned())
    }

    /// The key a status lookup names in its path (percent-decoded): read as the header
    /// would read it ([`KeyScope::header_key`]) when the key comes from a header, and as
    /// written when it is a body member (a body key is never quoted).
    ///
    /// # Errors
    ///
    /// As [`KeyScope::header_key`], or the first key rule a body key breaks.
    pub fn lookup_key(&self, path_key: &[u8]) -> Result<String, KeyError> {
        match self.source {
            KeySource::Header { .. } => self.header_key(path_key),
            KeySource::Body { .. } => {
                self.validate_key(path_key)?;
                Ok(String::from_utf8_lossy(path_key).into_owned())
            }
        }
    }

    /// How `key` is written in a status lookup's path so that
    /// [`KeyScope::lookup_key`] reads it back: as it is, or, for a header key that
    /// itself starts with `"`, as an RFC 8941 sf-string.
    pub fn key_for_lookup<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        match self.source {
            KeySource::Header { .. } if key.starts_with('"') => {
                format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\"")).into()
            }
            _ => key.into(),
        }
    }

    /// Checks a key against the key rules: 1 to [`MAX_KEY_LEN`] bytes, all of them
    /// visible ASCII, and the declared [`KeyFormat`].
    ///
    /// # Errors
    ///
    /// Returns the first rule the key breaks, in the order empty, too long, not visible
    /// ASCII, wrong format.
    pub fn validate_key(&self, key: &[u8]) -> Result<(), KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        if let Some(at) = key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii { at });
        }
        match self.format {
            KeyFormat::Any => Ok(()),
            KeyFormat::Uuid if is_hyphenated_uuid(key) => Ok(()),
            KeyFormat::Uuid => Err(KeyError::Format {
                expected: KeyFormat::Uuid,
            }),
        }
    }
}

/// `8-4-4-4-12` hexadecimal digits (RFC 9562 §4).
fn is_hyphenated_uuid(key: &[u8]) -> bool {
    key.len() == 36
        && key.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Whether `name` is a valid HTTP field name: a non-empty token (RFC 9110 §5.1, §5.6.2).
pub fn is_field_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules_from_design_section_4() {
        let scope = KeyScope::CLIENT;
        assert_eq!(scope.validate_key(b""), Err(KeyError::Empty));
        assert_eq!(scope.validate_key(&[b'a'; 255]), Ok(()));
        assert_eq!(
            scope.validate_key(&[b'a'; 256]),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            scope.validate_key("🦀".repeat(128).as_bytes()),
            Err(KeyError::TooLong { len: 512 })
        );
        assert_eq!(
            scope.validate_key("k🦀".as_bytes()),
            Err(KeyError::NotVisibleAscii { at: 1 })
        );
        assert_eq!(
            scope.validate_key(b"a b"),
            Err(KeyError::NotVisibleAscii { at: 1 })
        );
        assert_eq!(
            scope.validate_key(b"a\tb"),
            Err(KeyError::NotVisibleAscii { at: 1 })
        );
        assert_eq!(scope.validate_key(b"!~"), Ok(()));
    }

    #[test]
    fn uuid_format() {
        let scope = KeyScope {
            format: KeyFormat::Uuid,
            ..KeyScope::CLIENT
        };
        assert_eq!(
            scope.validate_key(b"0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60"),
            Ok(())
        );
        assert!(
            scope
                .validate_key(b"0191f6a46c1e7c3a9d5e1b2c3d4e5f60")
                .is_err()
        );
        assert!(scope.validate_key(b"order-1").is_err());
    }

    #[test]
    fn field_names() {
        assert!(is_field_name("Idempotency-Key"));
        assert!(!is_field_name(""));
        assert!(!is_field_name("Bad Header"));
        assert!(!is_field_name("Key:"));
    }

    proptest::proptest! {
        /// Every valid key, quoted as an RFC 8941 sf-string (`"` and `\` escaped), names
        /// the same key as its bare form.
        #[test]
        fn a_quoted_key_names_its_bare_key(key in "[!-~]{1,255}") {
            let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
            proptest::prop_assert_eq!(KeyScope::CLIENT.header_key(quoted.as_bytes()), Ok(key.clone()));
            let bare = KeyScope::CLIENT.header_key(key.as_bytes());
            if !key.starts_with('"') {
                proptest::prop_assert_eq!(bare, Ok(key));
            }
        }

        /// No header value makes the key reader panic.
        #[test]
        fn any_value_is_read_or_refused(value in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = KeyScope::CLIENT.header_key(&value);
        }
    }
}
