//! Registration: claim the key, or answer from what the store knows (step 6 of the
//! list in [`super`]).

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use idem_contract::{Concurrency, Contract};
use tokio::time::Instant;

use crate::answer;
use crate::attempt::Held;
use crate::reconcile::Recoverer;
use crate::recovery::{Recovered, recover};
use crate::replay::replay;
use crate::store::{
    Begin, Lease, NewRecord, OwnerToken, RecordKey, RecordState, StoreError, unix_now,
};
use crate::{Idem, OperationId};

/// How often registration looks at the store again after a concurrent change (a release,
/// a lost takeover, the end of a wait) before it answers 409.
const MAX_ROUNDS: usize = 8;

/// The first and the longest pause between two reads while waiting
/// (`concurrency = wait(..)`).
const WAIT_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(200));

/// What registration came to.
pub(crate) enum Registered {
    /// This request holds the key: run the handler.
    Run(Held),
    /// Answer without running the handler.
    Answer(Response),
}

/// Claims `key` for a request whose fingerprint is `fingerprint`, or answers: a replay, a
/// 422, the contract's concurrency answer, a recovery, a 409 for an unknown outcome, or a
/// 503 when the store fails (fail closed).
pub(crate) async fn register<F>(
    idem: &Idem,
    contract: &'static Contract,
    key: &Arc<RecordKey>,
    fingerprint: &str,
    transactional: bool,
    make_recoverer: F,
) -> Registered
where
    F: FnOnce() -> Recoverer,
{
    let mut make_recoverer = Some(make_recoverer);
    let mut wait_until: Option<Instant> = None;
    let mut last_id = None;
    let lease_len = idem.lease_for(contract);
    let lease_ms = u64::try_from(lease_len.as_millis()).unwrap_or(u64::MAX);
    for _ in 0..MAX_ROUNDS {
        let now = unix_now();
        let started = Instant::now();
        let new = NewRecord {
            operation_id: OperationId::new(),
            fingerprint: fingerprint.to_owned(),
            lease: Lease {
                token: OwnerToken::random(),
                until: now.saturating_add(lease_ms),
            },
            expires_at: now.saturating_add(contract.ttl.as_millis()),
            transactional,
            holds_until: now.saturating_add(contract.lease().as_millis()),
        };
        let record = match idem.store().begin(key, &new, now).await {
            Ok(Begin::Started(record)) => {
                // A registration that waited (for a connection, a slow or returning
                // server) may have written a lease that has run out already, and another
                // instance may take the record over as if this attempt had died. Renew it
                // before the handler runs: the renewal succeeds only while this token
                // still owns the record, so a takeover that came first fences this attempt
                // out before it does anything, and one that comes later finds a live lease.
                if started.elapsed() >= lease_len / 3 {
                    let now = unix_now();
                    let until = now.saturating_add(lease_ms);
                    match idem.store().renew(key, new.lease.token, until, now).await {
                        Ok(()) => {}
                        // Taken over meanwhile: the record is someone else's; look again.
                        Err(StoreError::LeaseLost) => continue,
                        Err(error) => {
                            return Registered::Answer(answer::store_unavailable(
                                idem,
                                contract,
                                Some(record.operation_id),
                                &error,
                            ));
                        }
                    }
                }
                tracing::debug!(
                    operation = %contract.operation,
                    operation_id = %record.operation_id,
                    attempt = record.attempt,
                    "idem: key registered"
                );
                return Registered::Run(Held::start(
                    idem,
                    contract,
                    key,
                    new.lease.token,
                    started,
                    record.operation_id,
                    record.attempt,
                ));
            }
            Ok(Begin::Exists(record)) => {
                crate::telemetry::found_record(record.attempt);
                record
            }
            Err(error) => {
                return Registered::Answer(answer::store_unavailable(
                    idem, contract, last_id, &error,
                ));
            }
        };
        let id = record.operation_id;
        last_id = Some(id);
        if record.fingerprint != fingerprint {
            return Registered::Answer(answer::fingerprint_mismatch(&record));
        }
        match &record.state {
            RecordState::Completed { response } => {
                return Registered::Answer(replay(response, id));
            }
            RecordState::Unknown { reason } => {
                return Registered::Answer(answer::outcome_unknown(id, reason));
            }
            // Released with this fingerprint: `begin` reclaims it, unless it changed in
            // between; look again.
            RecordState::Released => {}
            // Live, or ended while its attempt is still alive in this process: recovering
            // now could run the operation twice at once.
            RecordState::Processing { lease } if idem.running().holds(lease, now) => {
                let remaining_secs = lease.until.saturating_sub(now).div_ceil(1000);
                match contract.concurrency {
                    Concurrency::Conflict { retry_after } => {
                        return Registered::Answer(answer::in_progress(
                            id,
                            retry_after.as_secs_ceil(),
                        ));
                    }
                    Concurrency::Accepted => {
                        return Registered::Answer(answer::accepted(contract, key, id));
                    }
                    Concurrency::Wait { limit } => {
                        let until =
                            *wait_until.get_or_insert_with(|| Instant::now() + limit.to_std());
                        match wait_for_change(idem, key, lease.token, until).await {
                            Ok(true) => {}
                            Ok(false) => {
                                return Registered::Answer(answer::in_progress(id, remaining_secs));
                            }
                            Err(error) => {
                                return Registered::Answer(answer::store_unavailable(
                                    idem,
                                    contract,
                                    Some(id),
                                    &error,
                                ));
                            }
                        }
                    }
                }
            }
            RecordState::Processing { .. } => {
                match recover(idem, contract, key, &record, &mut make_recoverer).await {
                    Recovered::Run(attempt) => return Registered::Run(attempt),
                    Recovered::Answer(response) => return Registered::Answer(response),
                    Recovered::Lost => {}
                    Recovered::Failed(error) => {
                        return Registered::Answer(answer::store_unavailable(
                            idem,
                            contract,
                            Some(id),
                            &error,
                        ));
                    }
                }
            }
        }
    }
    Registered::Answer(answer::in_progress(last_id.unwrap_or_default(), 1))
}

/// Polls the record until it is no longer processing under `token` with a held lease
/// (finished, released, parked, taken over, ended and its attempt gone, or the record
/// gone), or until `until`. Returns whether it changed.
async fn wait_for_change(
    idem: &Idem,
    key: &RecordKey,
    token: OwnerToken,
    until: Instant,
) -> Result<bool, StoreError> {
    let mut pause = WAIT_BACKOFF.0;
    loop {
        let now = unix_now();
        let held = idem
            .store()
            .get(key, now)
            .await?
            .and_then(|r| r.lease().copied())
            .is_some_and(|l| l.token == token && idem.running().holds(&l, now));
        if !held {
            return Ok(true);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(WAIT_BACKOFF.1);
    }
}
