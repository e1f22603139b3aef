//! The operation id: one server-assigned, time-ordered id per business operation.

use std::fmt;
use std::str::FromStr;

use http::HeaderValue;
use uuid::Uuid;

/// The id of one business operation: a UUIDv7 (RFC 9562 §5.7), so ids sort by the time
/// they were made.
///
/// An id is assigned when a key is first registered and kept for the life of the record:
/// every attempt of the operation (retries, a takeover by recovery, the status lookup)
/// answers with the same id, in the `Operation-Id` header and in problem bodies, so that
/// logs and traces of all attempts can be joined. An answer that registers
/// nothing (a 400 for a missing key) gets a fresh id that is not stored.
///
/// Printed in the hyphenated lowercase form: `0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OperationId(Uuid);

impl OperationId {
    /// A new id for the current time (UUIDv7: 48 bits of unix milliseconds, then random
    /// bits).
    pub fn new() -> OperationId {
        OperationId(Uuid::now_v7())
    }

    /// The id as a UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// When the id was made, unix milliseconds: the timestamp of a UUIDv7 (`None` for
    /// another version, read back from a store).
    pub fn created_at(&self) -> Option<u64> {
        let (secs, nanos) = self.0.get_timestamp()?.to_unix();
        Some(
            secs.saturating_mul(1000)
                .saturating_add(u64::from(nanos / 1_000_000)),
        )
    }

    /// An id from a UUID read back from a store.
    pub const fn from_uuid(uuid: Uuid) -> OperationId {
        OperationId(uuid)
    }

    /// The id as a header value.
    pub fn header_value(&self) -> HeaderValue {
        let mut buf = Uuid::encode_buffer();
        // A hyphenated UUID is 36 visible ASCII characters: always a valid header value.
        HeaderValue::from_str(self.0.hyphenated().encode_lower(&mut buf))
            .expect("a hyphenated UUID is a valid header value")
    }
}

impl Default for OperationId {
    fn default() -> OperationId {
        OperationId::new()
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationId({})", self.0.hyphenated())
    }
}

impl FromStr for OperationId {
    type Err = uuid::Error;

    /// Parses any form [`Uuid::parse_str`] accepts.
    fn from_str(s: &str) -> Result<OperationId, uuid::Error> {
        Uuid::parse_str(s).map(OperationId)
    }
}

impl serde::Serialize for OperationId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_and_round_trip() {
        let id = OperationId::new();
        assert_eq!(id.as_uuid().get_version_num(), 7);
        let text = id.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(text.parse::<OperationId>().unwrap(), id);
        assert_eq!(id.header_value().to_str().unwrap(), text);
    }

    #[test]
    fn ids_are_time_ordered() {
        let a = OperationId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = OperationId::new();
        assert!(a < b);
    }
}
