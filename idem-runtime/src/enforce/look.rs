//! Stage 5, look: the key's record read once before the handler's extractor runs, where
//! that read costs no round trip — the store reads in this process
//! ([`RecordStore::reads_locally`](crate::store::RecordStore::reads_locally)). Over a
//! network a read here would cost every new key a round trip of its own, so the record
//! is read by registration instead (on PostgreSQL's transactional mode, by the
//! statement that takes the key's lock). A completed key with this request's fingerprint is replayed here: the
//! extractor never runs for a replay, and a read registers nothing, so nothing needs
//! undoing. Any other record (another fingerprint included, so that the extractor still
//! answers a malformed request first, as on every store) is handed on to registration
//! (stage 8), which answers from it without reading it again.

use idem_contract::Contract;

use super::Rejection;
use crate::Idem;
use crate::answer;
use crate::fingerprint::Fingerprints;
use crate::replay::replay;
use crate::store::{Record, RecordKey, RecordState, StoreError, UnixMillis};

/// A record read before the key is claimed, at the time given (unix milliseconds): the
/// claim answers from it without registering anything.
pub(crate) type Seen = Option<(Record, UnixMillis)>;

/// Reads the key's record now, where that costs no extra round trip (see the module
/// docs), and replays a completed key with this request's fingerprint from it.
///
/// # Errors
///
/// The replay; 503 `store-unavailable` when the record cannot be read.
pub(crate) async fn look(
    idem: &Idem,
    contract: &'static Contract,
    key: &RecordKey,
    fingerprint: &Fingerprints,
) -> Result<Seen, Rejection> {
    if !idem.store().reads_locally() {
        return Ok(None);
    }
    let seen = seen(idem, key)
        .await
        .map_err(|error| answer::store_unavailable(idem, contract, None, &error))?;
    let Some((record, _)) = &seen else {
        return Ok(seen);
    };
    match &record.state {
        RecordState::Completed { response } if is_same_request(record, fingerprint) => {
            crate::telemetry::found_record(record.attempt);
            Err(Rejection::Replayed(Box::new(replay(
                response,
                record.operation_id,
            ))))
        }
        // Another request under the key (422 at registration) may also be one the
        // extractor refuses (no `Content-Type`, say): the extractor answers first, as on
        // every store.
        _ => Ok(seen),
    }
}

/// The key's record, read now, unless a registration may take it over (its TTL has
/// passed, or it is released).
pub(crate) async fn seen(idem: &Idem, key: &RecordKey) -> Result<Seen, StoreError> {
    let now = idem.now().await;
    let record = idem.store().get(key, now).await?;
    Ok(record
        .filter(|record| !record.is_reclaimable(now))
        .map(|record| (record, now)))
}

/// Whether `record` was written for this request: the same fingerprint, under the current
/// rule or the earlier one (see `crate::fingerprint`).
pub(crate) fn is_same_request(record: &Record, fingerprint: &Fingerprints) -> bool {
    record.fingerprint == fingerprint.current
        || fingerprint
            .legacy
            .as_deref()
            .is_some_and(|legacy| record.fingerprint == legacy)
}
