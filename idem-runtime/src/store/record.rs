//! The record of one key and the values that make it.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, header};
use idem_contract::problem::{PROBLEM_JSON, RESULT_BODY_NOT_KEPT};
use sha2::{Digest, Sha256};

use super::UnixMillis;
use super::budget::{ClientBudget, OverBudget};
use crate::OperationId;

/// The namespace and name of one key: two clients with one key, or
/// one client's key on two operations, are different records.
///
/// Its `Debug` output hides the client identity and the key, which may be credentials or
/// personal data.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// The contract's operation, such as `create_order`.
    pub operation: String,
    /// The client's identity, as [`crate::identity::ClientIdentity`] gave it.
    pub client: String,
    /// The idempotency key as the client sent it (1 to 255 visible ASCII characters).
    pub key: String,
}

impl RecordKey {
    /// A record key from its three parts.
    pub fn new(
        operation: impl Into<String>,
        client: impl Into<String>,
        key: impl Into<String>,
    ) -> RecordKey {
        RecordKey {
            operation: operation.into(),
            client: client.into(),
            key: key.into(),
        }
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordKey")
            .field("operation", &self.operation)
            .field("client", &format_args!("<{} bytes>", self.client.len()))
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .finish()
    }
}

/// The owner of a lease: a random UUIDv4 (122 random bits), made fresh for every attempt
/// and every takeover.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A new random token: a UUIDv4 from a cryptographically secure generator seeded by
    /// the operating system (`rand`'s thread-local generator, through `uuid`).
    pub fn random() -> OwnerToken {
        OwnerToken(uuid::Uuid::new_v4().as_u128())
    }

    /// A token from its number, as a store reads it back.
    pub const fn from_u128(value: u128) -> OwnerToken {
        OwnerToken(value)
    }

    /// The token as a number.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

/// Printed as 32 lowercase hexadecimal digits.
impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

impl FromStr for OwnerToken {
    type Err = std::num::ParseIntError;

    /// Parses the form [`Display`](fmt::Display) prints.
    fn from_str(s: &str) -> Result<OwnerToken, Self::Err> {
        u128::from_str_radix(s, 16).map(OwnerToken)
    }
}

/// The right of one attempt to hold a key: its owner and when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Who holds the lease.
    pub token: OwnerToken,
    /// When the lease ends, in unix milliseconds: the registration time plus the
    /// contract's lease (the per-attempt timeout, or else the deadline).
    pub until: UnixMillis,
}

impl Lease {
    /// Whether the lease is still live at `now` (it ends at `until`, exclusive).
    pub const fn is_live(&self, now: UnixMillis) -> bool {
        now < self.until
    }
}

/// The state of an operation, as clients see it in problem bodies and status lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperationState {
    /// An attempt holds the key, or held it and its outcome is not known yet.
    Processing,
    /// The operation finished; its result is stored and replayed.
    Completed,
    /// The last attempt answered a retryable status; a retry with the same key and the
    /// same content runs again.
    Released,
    /// Recovery could not decide, or the contract asks for manual recovery: an operator
    /// must resolve the operation.
    Unknown,
}

impl OperationState {
    /// The name used in JSON and in stores: `processing`, `completed`, `released`,
    /// `unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OperationState::Processing => "processing",
            OperationState::Completed => "completed",
            OperationState::Released => "released",
            OperationState::Unknown => "unknown",
        }
    }
}

impl FromStr for OperationState {
    type Err = String;

    fn from_str(s: &str) -> Result<OperationState, String> {
        match s {
            "processing" => Ok(OperationState::Processing),
            "completed" => Ok(OperationState::Completed),
            "released" => Ok(OperationState::Released),
            "unknown" => Ok(OperationState::Unknown),
            other => Err(format!("`{other}` is not an operation state")),
        }
    }
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A replayable result: the status, the selected headers and the body, byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The HTTP status code.
    pub status: u16,
    /// The headers selected for replay, in order, repeated names included
    /// ([`crate::IdemBuilder::replayed_headers`]).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body as sent; empty for an empty body.
    pub body: Bytes,
}

impl StoredResponse {
    /// The size in bytes of the body and the selected headers' names and values.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len())
                .sum::<usize>()
    }

    /// What is kept of this result when its body is larger than `limit` bytes (the
    /// handle's [`crate::IdemBuilder::max_stored_body`], or a store's `with_max_result`):
    /// the same status, the replayed headers that do not describe the body, and in place
    /// of the body a problem (RFC 9457) of type
    /// [`RESULT_BODY_NOT_KEPT`](idem_contract::problem::RESULT_BODY_NOT_KEPT) that gives
    /// the original body's length in bytes and its SHA-256. A retry then gets a known
    /// outcome, with its status, instead of a parked operation.
    ///
    /// The headers dropped are the ones about the representation that is no longer sent
    /// (`content-type`, `content-encoding`, `content-language`, `content-length`,
    /// `content-range`, `etag`, `last-modified` and the digest fields); `location`,
    /// `content-location` and `link`, which point at what the operation made, stay. If
    /// even they would take the result past `limit`, they go too: the result is then at
    /// most [`StoredResponse::MAX_NOT_KEPT_SIZE`] bytes.
    pub fn body_not_kept(&self, limit: usize) -> StoredResponse {
        let detail = format!(
            "the operation's answer (status {}) had a body of {} bytes, larger than the {limit} bytes the server keeps for a replay: this replay has its status and headers, not its body",
            self.status,
            self.body.len()
        );
        let problem = serde_json::json!({
            "type": RESULT_BODY_NOT_KEPT,
            "title": "Result body not kept",
            "status": self.status,
            "detail": detail,
            "original_body_length": self.body.len(),
            "original_body_sha256": hex::encode(Sha256::digest(&self.body)),
        });
        let content_type = (header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        let mut kept = StoredResponse {
            status: self.status,
            headers: std::iter::once(content_type)
                .chain(
                    self.headers
                        .iter()
                        .filter(|(name, _)| !describes_the_body(name))
                        .cloned(),
                )
                .collect(),
            body: Bytes::from(problem.to_string()),
        };
        if kept.size() > limit.max(StoredResponse::MAX_NOT_KEPT_SIZE) {
            kept.headers.truncate(1);
        }
        kept
    }

    /// The largest result [`StoredResponse::body_not_kept`] gives when the headers it
    /// keeps do not fit: 1 KiB. Every store keeps at least this much.
    pub const MAX_NOT_KEPT_SIZE: usize = 1024;

    /// The headers a stored result never carries, whoever asks: they frame a message
    /// or describe a connection (`content-length`, `transfer-encoding`, `connection`,
    /// `keep-alive`, `proxy-connection`, `upgrade`, `te`, `trailer`; RFC 9110 §6.4,
    /// §7.6.1, RFC 9112 §6-7), so a stored copy would break the replay's framing, or
    /// hand a session to whoever sends the key (`set-cookie`). A replay drops them,
    /// [`crate::IdemBuilder::replayed_headers`] leaves them out, and `idem ops resolve`
    /// refuses a response file that sets them.
    pub const NEVER_REPLAYED: [HeaderName; 9] = [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::UPGRADE,
        header::TE,
        header::TRAILER,
        header::SET_COOKIE,
    ];

    /// Whether `name` is one of [`StoredResponse::NEVER_REPLAYED`].
    pub fn is_never_replayed(name: &HeaderName) -> bool {
        StoredResponse::NEVER_REPLAYED.contains(name)
    }
}

/// Whether `name` describes a response's body (its representation), so that it would be
/// false of the body that stands in for one not kept.
fn describes_the_body(name: &HeaderName) -> bool {
    const DIGESTS: [&str; 4] = ["content-digest", "repr-digest", "digest", "content-md5"];
    [
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_LANGUAGE,
        header::CONTENT_LENGTH,
        header::CONTENT_RANGE,
        header::ETAG,
        header::LAST_MODIFIED,
    ]
    .contains(name)
        || DIGESTS.contains(&name.as_str())
}

/// Where a record stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// An attempt holds (or held) the key under this lease.
    Processing {
        /// The current lease.
        lease: Lease,
    },
    /// The operation finished with this result.
    Completed {
        /// The result to replay.
        response: StoredResponse,
    },
    /// The last attempt answered a retryable status; the key may be claimed again with the
    /// same fingerprint.
    Released,
    /// Parked for an operator.
    Unknown {
        /// Why: the reconcile function's reason, or the runbook of `manual(..)`.
        reason: String,
    },
}

impl RecordState {
    /// The state's name.
    pub const fn kind(&self) -> OperationState {
        match self {
            RecordState::Processing { .. } => OperationState::Processing,
            RecordState::Completed { .. } => OperationState::Completed,
            RecordState::Released => OperationState::Released,
            RecordState::Unknown { .. } => OperationState::Unknown,
        }
    }
}

/// What a store knows about one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The operation's id, assigned at the first registration and kept for the life of
    /// the record.
    pub operation_id: OperationId,
    /// The fingerprint of the significant content (`sha256:<hex>`).
    pub fingerprint: String,
    /// How many times the key has been claimed: 1 at the first attempt, plus one for every
    /// reclaim after a release and every takeover by recovery.
    pub attempt: u32,
    /// When the key was first registered, in unix milliseconds.
    pub created_at: UnixMillis,
    /// When the key is forgotten, in unix milliseconds: `created_at` plus the contract's
    /// TTL, or the end of the latest lease granted on the record if that is later.
    pub expires_at: UnixMillis,
    /// Where the operation stands.
    pub state: RecordState,
    /// Whether the operation runs in the transactional mode (its handler takes the
    /// transaction, [`crate::transaction`]): an attempt of it that ended without its
    /// commit took no effect in the database.
    pub transactional: bool,
}

impl Record {
    /// Whether the record's TTL has passed at `now`: the key then names a new operation.
    pub const fn is_expired(&self, now: UnixMillis) -> bool {
        self.expires_at <= now
    }

    /// Whether a registration at `now` may take this record over without an attempt's
    /// lease: its TTL has passed, or it is released (for a request with its
    /// fingerprint). Such a record does not answer a duplicate by itself; the attempt
    /// that takes it does.
    pub fn is_reclaimable(&self, now: UnixMillis) -> bool {
        self.is_expired(now) || matches!(self.state, RecordState::Released)
    }

    /// The first record of a key, as `begin` writes it.
    pub fn started(new: &NewRecord, now: UnixMillis) -> Record {
        Record {
            operation_id: new.operation_id,
            fingerprint: new.fingerprint.clone(),
            attempt: 1,
            created_at: now,
            expires_at: new.expires_at.max(new.lease.until).max(new.holds_until),
            state: RecordState::Processing { lease: new.lease },
            transactional: new.transactional,
        }
    }

    /// What `begin` writes over this record, if it may: a fresh record when the TTL has
    /// passed, the same operation as a new attempt when the record is released with the
    /// same fingerprint, and nothing otherwise. Backends that cannot run Rust inside their
    /// atomic step (SQL, Lua) encode these same rules.
    ///
    /// The record written never expires before its lease ends: a reclaim near the end of
    /// the TTL moves `expires_at` to the lease's end, so that a duplicate of the running
    /// attempt is not taken for a new operation.
    pub fn begin_over(&self, new: &NewRecord, now: UnixMillis) -> Option<Record> {
        if self.is_expired(now) {
            return Some(Record::started(new, now));
        }
        if matches!(self.state, RecordState::Released) && self.fingerprint == new.fingerprint {
            let leased = self.leased(new.lease);
            return Some(Record {
                transactional: new.transactional,
                expires_at: leased.expires_at.max(new.holds_until),
                ..leased
            });
        }
        None
    }

    /// This record as the next attempt under `lease`: one more attempt, processing, and
    /// kept at least until the lease ends (what a reclaim and a takeover write).
    pub fn leased(&self, lease: Lease) -> Record {
        Record {
            attempt: self.attempt.saturating_add(1),
            expires_at: self.expires_at.max(lease.until),
            state: RecordState::Processing { lease },
            ..self.clone()
        }
    }

    /// This record with its lease ending at `until`, kept at least until then (what
    /// `renew` writes).
    pub fn renewed(&self, until: UnixMillis) -> Record {
        let mut record = self.clone();
        if let RecordState::Processing { lease } = &mut record.state {
            lease.until = until;
            record.expires_at = record.expires_at.max(until);
        }
        record
    }

    /// The lease, if the record is processing.
    pub const fn lease(&self) -> Option<&Lease> {
        match &self.state {
            RecordState::Processing { lease } => Some(lease),
            _ => None,
        }
    }

    /// Whether `token` owns a lease that is live at `now`: the condition of `complete` and
    /// `release`.
    pub fn is_live_owner(&self, token: OwnerToken, now: UnixMillis) -> bool {
        self.lease()
            .is_some_and(|l| l.token == token && l.is_live(now))
    }
}

/// What `begin` registers for a new attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRecord {
    /// A fresh operation id, used if a new operation starts.
    pub operation_id: OperationId,
    /// The request's fingerprint.
    pub fingerprint: String,
    /// The attempt's lease.
    pub lease: Lease,
    /// `now` plus the contract's TTL, used if a new operation starts (a reclaimed record
    /// keeps its own, moved to the end of `lease` if that is later).
    pub expires_at: UnixMillis,
    /// Whether the attempt runs in the transactional mode ([`Record::transactional`]).
    pub transactional: bool,
    /// When the attempt's time ends (its per-attempt timeout), in unix milliseconds: the
    /// record is kept at least until then, whether it is new or reclaimed. The lease is
    /// shorter and renewed while the attempt runs; this floor keeps the record when the
    /// renewals pause (a transaction that holds SQLite's write lock).
    pub holds_until: UnixMillis,
    /// The client's budget, checked when the key is new to the client (or its TTL has
    /// passed); `None`: no budget, nothing counted ([`super::budget`]).
    pub budget: Option<ClientBudget>,
}

/// An attempt that holds a key in a transaction not committed yet
/// (`TransactionalStore::begin_registered` (features `sqlite`, `postgres`)): no other connection can see its record,
/// so this is what a duplicate and the status lookup are told of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// The attempt's operation id.
    pub operation_id: OperationId,
    /// The attempt's number in its operation (1 for a new one).
    pub attempt: u32,
    /// When the attempt's time ends, unix milliseconds: it has committed or rolled back
    /// by then.
    pub until: UnixMillis,
}

impl InFlight {
    /// The record the attempt has written and not committed, as far as it is known
    /// outside its transaction: processing until `until`, registered at its operation
    /// id's time (a UUIDv7's), expiring `ttl_ms` after that. Its fingerprint is not known
    /// (empty) and its lease's token is nil.
    pub fn record(&self, ttl_ms: u64) -> Record {
        let created_at = self.operation_id.created_at().unwrap_or(0);
        Record {
            operation_id: self.operation_id,
            fingerprint: String::new(),
            attempt: self.attempt,
            created_at,
            expires_at: created_at.saturating_add(ttl_ms).max(self.until),
            state: RecordState::Processing {
                lease: Lease {
                    token: OwnerToken::from_u128(0),
                    until: self.until,
                },
            },
            transactional: true,
        }
    }
}

/// What registering a key inside an attempt's transaction came to (the transactional
/// mode's one commit; `TransactionalStore::begin_registered` with the transaction kept
/// by the attempt).
#[derive(Debug)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(dead_code, reason = "made only by the transactional mode")
)]
pub(crate) enum BeginInTx {
    /// The key is registered inside the open transaction: the record as written.
    Started(Record),
    /// The key has a committed record this attempt may not take.
    Exists(Record),
    /// Another attempt holds the key in a transaction not ended yet.
    InFlight(InFlight),
    /// The key is new to the client, and the client is at its budget.
    OverBudget(OverBudget),
}

/// The outcome of [`RecordStore::begin`](super::RecordStore::begin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The caller holds the key now, as written in the record: a new operation (attempt
    /// 1, the new operation id) or a reclaimed released one (attempt + 1, its own id).
    Started(Record),
    /// The key is held or finished: the record as it stands, unchanged.
    Exists(Record),
    /// The key is new to the client, and the client is at its budget
    /// ([`NewRecord::budget`]): nothing was written.
    OverBudget(OverBudget),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(body: &[u8]) -> StoredResponse {
        StoredResponse {
            status: 422,
            headers: vec![
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::LOCATION, HeaderValue::from_static("/orders/7")),
                (header::ETAG, HeaderValue::from_static("\"v1\"")),
            ],
            body: Bytes::copy_from_slice(body),
        }
    }

    #[test]
    fn a_body_not_kept_keeps_the_status_length_and_digest() {
        let big = response(&[b'x'; 5000]);
        let kept = big.body_not_kept(4096);
        assert_eq!(kept.status, 422);
        assert_eq!(
            kept.headers,
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)),
                (header::LOCATION, HeaderValue::from_static("/orders/7")),
            ],
            "the location stays; what described the old body goes"
        );
        let problem: serde_json::Value = serde_json::from_slice(&kept.body).unwrap();
        assert_eq!(problem["type"], RESULT_BODY_NOT_KEPT);
        assert_eq!(problem["status"], 422);
        assert_eq!(problem["original_body_length"], 5000);
        assert_eq!(
            problem["original_body_sha256"],
            hex::encode(Sha256::digest([b'x'; 5000]))
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("5000 bytes") && detail.contains("4096"),
            "{detail}"
        );
    }

    #[test]
    fn headers_that_do_not_fit_are_dropped_too() {
        let mut big = response(b"");
        let link = HeaderValue::from_str(&"l".repeat(4000)).unwrap();
        big.headers.push((header::LINK, link));
        let kept = big.body_not_kept(0);
        assert_eq!(kept.headers.len(), 1, "only the problem's content type");
        assert!(
            kept.size() <= StoredResponse::MAX_NOT_KEPT_SIZE,
            "{}",
            kept.size()
        );
    }
}
