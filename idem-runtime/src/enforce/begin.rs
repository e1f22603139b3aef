//! Stages 7 and 9, the mode's two moments around registration: the right to begin the
//! attempt's transaction is taken before the key is registered, and the transaction
//! begins once the key is held, unless the key was registered inside it (the
//! transactional mode's one commit, `register/claim.rs`). The plain mode does neither.

use idem_contract::Contract;

use super::Rejection;
use super::look::{Seen, seen};
use crate::attempt::Held;
use crate::mode::{AttemptTx, Mode};
use crate::store::{InFlight, RecordKey};
use crate::{Idem, OperationId, answer};

/// Takes the right to begin the transaction before anything is registered: with
/// SQLite's one writer the wait happens here, where a client that gives up leaves
/// nothing behind, and it is not charged to the attempt's lease. A duplicate of a key
/// that is held or finished is answered from its record without waiting: the record
/// read is returned, for the claim to answer from.
///
/// On PostgreSQL an attempt that registers its key in its transaction takes no turn
/// (the pool's own wait for a connection is its only bound: it makes no statement beside
/// its transaction while it is open), and reads nothing here: the key's record is read
/// by the first statement of its transaction, with the key's lock (stage 8). On SQLite
/// such an attempt marks the key in flight first, as operation `id` (which its record
/// then takes), and reads it under the mark ([`marked`]). `looked` is what stage 5 read
/// (a store that reads in this process), handed on to the claim.
///
/// # Errors
///
/// 503 `store-unavailable` when the record cannot be read or the wait is over first.
pub(crate) async fn reserve(
    mode: &Mode,
    idem: &Idem,
    contract: &Contract,
    key: &RecordKey,
    looked: Seen,
    id: OperationId,
) -> Result<Seen, Rejection> {
    let Mode::Transactional(tx) = mode else {
        return Ok(looked);
    };
    let unavailable = |error| answer::store_unavailable(idem, contract, None, &error);
    if mode.takes_no_turn(contract) || looked.is_some() {
        return Ok(looked);
    }
    let one_commit = mode.one_commit(contract).is_some();
    if one_commit && let Some(seen) = marked(tx, idem, contract, key, id).await? {
        return Ok(seen);
    }
    if tx.try_reserve().await {
        return Ok(None);
    }
    let found = seen(idem, key).await.map_err(unavailable)?;
    // An attempt that registered the key in its transaction (SQLite's, here) is
    // answered from its mark on the key, at once too.
    let in_flight =
        found.is_none() && one_commit && tx.in_flight(key).await.map_err(unavailable)?.is_some();
    if found.is_none() && !in_flight {
        tx.reserve().await.map_err(unavailable)?;
    }
    Ok(found)
}

/// The one commit's turn on a store that marks keys in this process (SQLite's one
/// writer): the key marked in flight as operation `id`, then its record read under the
/// mark, which makes the read hold (no attempt of this process can register the key
/// while the mark is held, and one that did before has committed). A record no
/// registration may take is handed on to the claim, and the mark let go; a key without
/// a record waits for its turn holding the mark, which registers it without a read or a
/// write of its own before the handler ([`AttemptTx::reserve_marked`]); a record to take
/// over waits for its turn without the mark, for the claim to register it under the
/// lock. A key another attempt has marked waits for nothing: its record, if it has one
/// no registration may take, or that attempt, is the claim's answer. `None` for a store
/// that keeps no such marks.
///
/// # Errors
///
/// 503 `store-unavailable` when the record cannot be read or the wait is over first.
async fn marked(
    tx: &AttemptTx,
    idem: &Idem,
    contract: &Contract,
    key: &RecordKey,
    id: OperationId,
) -> Result<Option<Seen>, Rejection> {
    let unavailable = |error| answer::store_unavailable(idem, contract, None, &error);
    let now = idem.now().await;
    let attempt = InFlight {
        operation_id: id,
        attempt: 1,
        until: now.saturating_add(contract.lease().as_millis()),
    };
    let Some(mark) = tx.mark(key, attempt) else {
        return Ok(None);
    };
    let record = idem.store().get(key, now).await.map_err(unavailable)?;
    match (record, mark.ok()) {
        (Some(record), _) if !record.is_reclaimable(now) => Ok(Some(Some((record, now)))),
        // Another attempt holds the mark: the claim answers from it, without waiting.
        (_, None) => Ok(Some(None)),
        (Some(_), Some(mark)) => {
            #[allow(
                clippy::drop_non_drop,
                reason = "without a SQL store the mark is uninhabited and this arm never runs"
            )]
            drop(mark);
            tx.reserve().await.map_err(unavailable)?;
            Ok(Some(None))
        }
        (None, Some(mark)) => {
            tx.reserve_marked(mark).await.map_err(unavailable)?;
            Ok(Some(None))
        }
    }
}

/// Begins the attempt's transaction now that `held` holds the key, and attaches it.
///
/// # Errors
///
/// 503 `store-unavailable` when it cannot begin; the key is given back first, since
/// nothing ran.
pub(crate) async fn begin(
    mode: Mode,
    mut held: Held,
    contract: &Contract,
) -> Result<Held, Rejection> {
    let Mode::Transactional(tx) = mode else {
        return Ok(held);
    };
    if held.mode.is_transactional() {
        // Begun with the key registered inside it (stage 8).
        return Ok(held);
    }
    if tx.fences_by_lock() && matches!(contract.recovery, idem_contract::Recovery::Resume) {
        // SQLite's one write lock under a step journal: the steps before the handler's
        // first write are recorded while the lock is free.
        held.attach_deferred(tx).await;
        return Ok(held);
    }
    if let Err(error) = tx.begin(held.deadline).await {
        let _ = held.release().await;
        let id = Some(held.operation_id);
        return Err(answer::store_unavailable(&held.idem, contract, id, &error).into());
    }
    held.attach(tx);
    Ok(held)
}
