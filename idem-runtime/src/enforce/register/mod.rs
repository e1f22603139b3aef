//! Stage 8, register: claim the key with one insert-if-absent, or answer from what the
//! store knows — a replay, 422, the contract's concurrency answer, a recovery, 409 for an
//! unknown outcome, or 503 when the store fails (fail closed).

mod budget;
mod claim;
mod concurrency;
mod existing;

use std::sync::Arc;

use idem_contract::Contract;
use tokio::time::Instant;

use self::claim::Claimed;
use self::existing::Next;
use super::Rejection;
use crate::attempt::Held;
use crate::enforce::look::Seen;
use crate::fingerprint::Fingerprints;
use crate::mode::{AttemptTx, Mode};
use crate::reconcile::Recoverer;
use crate::store::RecordKey;
use crate::{Idem, OperationId, answer};

/// How often registration looks at the store again after a concurrent change (a release,
/// a lost takeover, the end of a wait) before it answers 409.
const MAX_ROUNDS: usize = 8;

/// Makes the contract's recoverer (from the router's state), when a round takes an ended
/// lease over: the one part of registration that depends on the handler's types, passed
/// as a trait object so that registration is compiled once for every handler.
pub(crate) type MakeRecoverer<'a> = &'a (dyn Fn() -> Recoverer + Sync);

/// One registration of a key, across its rounds.
pub(crate) struct Registration<'a> {
    idem: &'a Idem,
    contract: &'static Contract,
    key: &'a Arc<RecordKey>,
    /// The request's fingerprint; the legacy one instead once a record written with it
    /// was found (the request goes on under the record's fingerprint).
    fingerprint: &'a str,
    /// The fingerprint of the rule before `null` members were left out, when it differs.
    legacy: Option<&'a str>,
    /// Whether the attempt runs in the transactional mode (recorded with the key).
    transactional: bool,
    /// The attempt's transaction when the key is registered inside it (the
    /// transactional mode's one commit, [`Mode::one_commit`]).
    in_tx: Option<AttemptTx>,
    /// The record stage 5 or 7 read, for the first round to answer from.
    seen: Seen,
    /// The operation id the first new record takes (stage 7 may have marked the key in
    /// flight with it); later rounds' records take fresh ones.
    operation_id: Option<OperationId>,
    /// Makes the contract's recoverer; taken by the round that wins a takeover.
    make_recoverer: Option<MakeRecoverer<'a>>,
    /// When a `concurrency = wait(..)` wait ends, once it has begun.
    wait_until: Option<Instant>,
    /// The operation id of the last record seen.
    last_id: Option<OperationId>,
}

/// What the stages before registration hand on to it.
pub(crate) struct Looked {
    /// The record stage 5 or 7 read, if it read one no registration may take.
    pub(crate) seen: Seen,
    /// The operation id a new record takes.
    pub(crate) operation_id: OperationId,
}

/// Claims `key` for a request whose fingerprints are `fingerprint`: the attempt that
/// holds it, or the answer to give instead (see the module docs); the first round
/// answers from `looked.seen`, the record stage 5 or 7 read, when there is one.
pub(crate) async fn register(
    idem: &Idem,
    contract: &'static Contract,
    key: &Arc<RecordKey>,
    fingerprint: &Fingerprints,
    looked: Looked,
    mode: &Mode,
    make_recoverer: MakeRecoverer<'_>,
) -> Result<Held, Rejection> {
    let mut registration = Registration {
        idem,
        contract,
        key,
        fingerprint: &fingerprint.current,
        legacy: fingerprint.legacy.as_deref(),
        transactional: mode.is_transactional(),
        in_tx: mode.one_commit(contract),
        seen: looked.seen,
        operation_id: Some(looked.operation_id),
        make_recoverer: Some(make_recoverer),
        wait_until: None,
        last_id: None,
    };
    for _ in 0..MAX_ROUNDS {
        let (record, now) = match registration.claim().await? {
            Claimed::Held(held) => return Ok(held),
            Claimed::Exists(record, now) => (record, now),
            Claimed::LostRace => continue,
            Claimed::InFlight(holder, now) => {
                registration.last_id = Some(holder.operation_id);
                match registration.in_flight(&holder, now).await? {
                    Next::Run(held) => return Ok(*held),
                    Next::LookAgain => continue,
                }
            }
        };
        registration.last_id = Some(record.operation_id);
        match registration.answer_from(&record, now).await? {
            Next::Run(held) => return Ok(*held),
            Next::LookAgain => {}
        }
    }
    let id = registration.last_id.unwrap_or_default();
    Err(answer::in_progress(id, 1).into())
}
