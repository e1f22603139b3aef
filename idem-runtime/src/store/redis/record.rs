//! A record read from its hash: by the scripts and [`get`](super::RedisStore) as
//! `HMGET` of [`RECORD_FIELDS`] (values in that order, no names), by the operator's
//! readers as `HGETALL` (every field, `history` and the journal's steps included).
//!
//! The positional form is the request path's: a replay's registration answers with the
//! 13 values a record is made of, not the hash's every name and value, and they are
//! decoded where they lie, without a map of owned names.

use std::collections::HashMap;
use std::str::FromStr;

use bytes::Bytes;
use redis::Value;

use crate::OperationId;
use crate::store::headers::decode_headers;
use crate::store::{
    Lease, OperationState, OwnerToken, Record, RecordState, StoreError, StoredResponse,
};

/// The fields a [`Record`] is made of, in the order the scripts' `record(key)` and
/// [`get`](super::RedisStore) read them (`HMGET`). The scripts' Lua list is written from
/// this one ([`lua_prelude`]).
pub(super) const RECORD_FIELDS: [&str; 13] = [
    "operation_id",
    "fingerprint",
    "state",
    "attempt",
    "created_at",
    "expires_at",
    "transactional",
    "token",
    "lease_until",
    "status",
    "headers",
    "body",
    "reason",
];

/// The Lua that every script returning a record starts with: `record(key)`, the
/// record's values in the order of [`RECORD_FIELDS`] (`false` for a field the hash
/// lacks). The names are written into the call, not kept in a table that every run of
/// the script would make again; a script names a value's position as `F.<field>`,
/// which [`positioned`] writes as its number.
pub(super) fn lua_prelude() -> String {
    let names: Vec<String> = RECORD_FIELDS.iter().map(|f| format!("'{f}'")).collect();
    format!(
        "local function record(key) return redis.call('HMGET', key, {}) end\n",
        names.join(", ")
    )
}

/// `script` with each `F.<field>` of [`RECORD_FIELDS`] written as the field's position
/// in a record's values (1-based, as Lua counts), the longest names first so that no
/// name is taken for the start of another.
pub(super) fn positioned(script: &str) -> String {
    let mut fields: Vec<(usize, &str)> = RECORD_FIELDS.iter().copied().enumerate().collect();
    fields.sort_by_key(|(_, f)| std::cmp::Reverse(f.len()));
    let mut text = script.to_owned();
    for (i, f) in fields {
        text = text.replace(&format!("F.{f}"), &(i + 1).to_string());
    }
    text
}

/// Where a record's fields are read from.
pub(super) trait Fields {
    /// The value of field `name`, if the hash has it.
    fn field(&self, name: &str) -> Option<&[u8]>;
    /// Whether the hash has none of a record's fields (no record).
    fn is_empty(&self) -> bool;
}

/// A hash's fields by name, from `HGETALL`.
impl Fields for HashMap<String, Vec<u8>> {
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(Vec::as_slice)
    }

    fn is_empty(&self) -> bool {
        HashMap::is_empty(self)
    }
}

/// The values of [`RECORD_FIELDS`], in order, from `HMGET` (`None` for a field the hash
/// lacks).
#[derive(Debug, Default)]
pub(super) struct Positional(Vec<Option<Vec<u8>>>);

impl Positional {
    /// The `HMGET` answer `value`: one value per name of [`RECORD_FIELDS`], each a
    /// string or nil (Lua's `false`, when a script returns it).
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] for another shape.
    pub(super) fn from_value(value: Value) -> Result<Positional, StoreError> {
        let corrupt =
            || StoreError::Corrupt("a record's fields came in an unexpected shape".into());
        let Value::Array(items) = value else {
            return Err(corrupt());
        };
        if items.len() != RECORD_FIELDS.len() {
            return Err(corrupt());
        }
        items
            .into_iter()
            .map(|item| match item {
                Value::BulkString(b) => Ok(Some(b)),
                Value::SimpleString(s) => Ok(Some(s.into_bytes())),
                Value::Int(n) => Ok(Some(n.to_string().into_bytes())),
                Value::Nil | Value::Boolean(false) => Ok(None),
                _ => Err(corrupt()),
            })
            .collect::<Result<_, _>>()
            .map(Positional)
    }
}

impl Fields for Positional {
    fn field(&self, name: &str) -> Option<&[u8]> {
        let at = RECORD_FIELDS.iter().position(|f| *f == name)?;
        self.0.get(at)?.as_deref()
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// A hash's fields, from `HGETALL` (a flat array of names and values, or a map).
///
/// # Errors
///
/// [`StoreError::Corrupt`] for another shape, or a name that is not UTF-8.
pub(super) fn fields(value: Value) -> Result<HashMap<String, Vec<u8>>, StoreError> {
    let corrupt = || StoreError::Corrupt("the record is not a list of fields".into());
    let bytes = |v: Value| match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        _ => Err(corrupt()),
    };
    let pairs: Vec<(Value, Value)> = match value {
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err(corrupt());
            }
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((name, value));
            }
            pairs
        }
        Value::Map(pairs) => pairs,
        Value::Nil => Vec::new(),
        _ => return Err(corrupt()),
    };
    pairs
        .into_iter()
        .map(|(name, value)| {
            let name = String::from_utf8(bytes(name)?).map_err(|_| corrupt())?;
            Ok((name, bytes(value)?))
        })
        .collect()
}

/// A record from its hash's fields; `None` for a hash with none of them (no record).
///
/// # Errors
///
/// [`StoreError::Corrupt`] when a field the record's state needs is missing, not UTF-8,
/// or does not parse.
pub(super) fn decode(fields: &impl Fields) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let text = |name: &str| -> Result<&str, StoreError> {
        let value = fields
            .field(name)
            .ok_or_else(|| StoreError::Corrupt(format!("`{name}` is missing")))?;
        std::str::from_utf8(value)
            .map_err(|_| StoreError::Corrupt(format!("`{name}` is not UTF-8")))
    };
    fn number<T: FromStr>(name: &str, text: &str) -> Result<T, StoreError> {
        text.parse()
            .map_err(|_| StoreError::Corrupt(format!("`{name}` is not a number: `{text}`")))
    }
    let operation_id = OperationId::from_str(text("operation_id")?)
        .map_err(|e| StoreError::Corrupt(format!("`operation_id`: {e}")))?;
    let state = match OperationState::from_str(text("state")?).map_err(StoreError::Corrupt)? {
        OperationState::Processing => RecordState::Processing {
            lease: Lease {
                token: OwnerToken::from_str(text("token")?)
                    .map_err(|e| StoreError::Corrupt(format!("`token`: {e}")))?,
                until: number("lease_until", text("lease_until")?)?,
            },
        },
        OperationState::Completed => RecordState::Completed {
            response: StoredResponse {
                status: number("status", text("status")?)?,
                headers: decode_headers(text("headers")?)?,
                body: Bytes::copy_from_slice(fields.field("body").unwrap_or_default()),
            },
        },
        OperationState::Released => RecordState::Released,
        OperationState::Unknown => RecordState::Unknown {
            reason: fields
                .field("reason")
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .unwrap_or_default(),
        },
    };
    Ok(Some(Record {
        operation_id,
        fingerprint: text("fingerprint")?.to_owned(),
        attempt: number("attempt", text("attempt")?)?,
        created_at: number("created_at", text("created_at")?)?,
        expires_at: number("expires_at", text("expires_at")?)?,
        state,
        transactional: text("transactional")? == "1",
    }))
}

/// A script's `{flag}` or `{flag, record}` answer (the record as `record(key)` reads
/// it): the flag, and the record if sent.
///
/// # Errors
///
/// [`StoreError::Corrupt`] for another shape, or a record that does not decode.
pub(super) fn flagged(value: Value) -> Result<(i64, Option<Record>), StoreError> {
    let corrupt = || StoreError::Corrupt("a script answered in an unexpected shape".into());
    let Value::Array(mut items) = value else {
        return Err(corrupt());
    };
    let record = match items.len() {
        1 => None,
        2 => decode(&Positional::from_value(items.pop().ok_or_else(corrupt)?)?)?,
        _ => return Err(corrupt()),
    };
    match items.first() {
        Some(Value::Int(flag)) => Ok((*flag, record)),
        _ => Err(corrupt()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn unreadable_hashes_are_corrupt_not_panics() {
        let mut hash = HashMap::new();
        hash.insert("state".to_owned(), b"processing".to_vec());
        assert!(matches!(decode(&hash), Err(StoreError::Corrupt(_))));
        hash.insert("operation_id".to_owned(), b"not an id".to_vec());
        assert!(matches!(decode(&hash), Err(StoreError::Corrupt(_))));
        assert!(matches!(decode(&HashMap::new()), Ok(None)));
        assert!(matches!(
            fields(Value::Array(vec![Value::Int(1)])),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            flagged(Value::Int(3)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn positional_answers_of_the_wrong_shape_are_corrupt() {
        // Too few values, a nested array, not an array.
        let short = Value::Array(vec![bulk("x"); RECORD_FIELDS.len() - 1]);
        assert!(matches!(
            Positional::from_value(short),
            Err(StoreError::Corrupt(_))
        ));
        let mut nested = vec![Value::Nil; RECORD_FIELDS.len()];
        nested[2] = Value::Array(vec![]);
        assert!(matches!(
            Positional::from_value(Value::Array(nested)),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            Positional::from_value(bulk("x")),
            Err(StoreError::Corrupt(_))
        ));
        // Every value absent: no record. A flag with a record that lacks its state's
        // fields: corrupt.
        let absent = Positional::from_value(Value::Array(vec![Value::Nil; 13])).unwrap();
        assert!(matches!(decode(&absent), Ok(None)));
        let mut partial = vec![Value::Nil; RECORD_FIELDS.len()];
        partial[2] = bulk("completed");
        let answer = Value::Array(vec![Value::Int(0), Value::Array(partial)]);
        assert!(matches!(flagged(answer), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn both_readings_of_a_hash_decode_to_the_same_record() {
        let values = [
            "0190e4a0-0000-7000-8000-000000000001",
            "sha256:abc",
            "completed",
            "2",
            "1000",
            "2000",
            "0",
            "",
            "",
            "201",
            r#"[["content-type","application/json"]]"#,
            r#"{"id":"ord_1"}"#,
            "",
        ];
        let hash: HashMap<String, Vec<u8>> = RECORD_FIELDS
            .iter()
            .zip(values)
            .filter(|(_, v)| !v.is_empty())
            .map(|(f, v)| ((*f).to_owned(), v.as_bytes().to_vec()))
            .collect();
        let positional = Value::Array(
            values
                .iter()
                .map(|v| if v.is_empty() { Value::Nil } else { bulk(v) })
                .collect(),
        );
        let by_name = decode(&hash).unwrap().unwrap();
        let (flag, by_position) = flagged(Value::Array(vec![Value::Int(0), positional])).unwrap();
        assert_eq!(flag, 0);
        assert_eq!(by_position, Some(by_name.clone()));
        assert_eq!(by_name.attempt, 2);
        let RecordState::Completed { response } = &by_name.state else {
            panic!("completed, not {:?}", by_name.state);
        };
        assert_eq!(response.status, 201);
        assert_eq!(&response.body[..], br#"{"id":"ord_1"}"#);
    }

    #[test]
    fn the_lua_list_names_every_field_in_order() {
        let lua = lua_prelude();
        assert!(lua.contains(
            "redis.call('HMGET', key, 'operation_id', 'fingerprint', 'state', 'attempt', \
             'created_at', 'expires_at', 'transactional', 'token', 'lease_until', 'status', \
             'headers', 'body', 'reason')"
        ));
        assert_eq!(
            positioned("cur[F.expires_at] cur[F.state] cur[F.status] cur[F.fingerprint]"),
            "cur[6] cur[3] cur[10] cur[2]"
        );
    }
}
