//! Stage 6 and 8, the mode's two moments around registration: the right to begin the
//! attempt's transaction is taken before the key is registered, and the transaction
//! begins once the key is held, unless the key was registered inside it (the
//! transactional mode's one commit, `register/claim.rs`). The plain mode does neither.

use idem_contract::Contract;

use super::Rejection;
use crate::Idem;
use crate::answer;
use crate::attempt::Held;
use crate::mode::Mode;
use crate::store::{RecordKey, RecordState};

/// Takes the right to begin the transaction before anything is registered: with
/// SQLite's one writer the wait happens here, where a client that gives up leaves
/// nothing behind, and it is not charged to the attempt's lease. A duplicate of a key
/// that is held or finished is answered from its record without waiting.
///
/// # Errors
///
/// 503 `store-unavailable` when the record cannot be read or the wait is over first.
pub(crate) async fn reserve(
    mode: &Mode,
    idem: &Idem,
    contract: &Contract,
    key: &RecordKey,
) -> Result<(), Rejection> {
    let Mode::Transactional(tx) = mode else {
        return Ok(());
    };
    // A store of many writers (PostgreSQL) holds back a share of its pool for the
    // statements an attempt makes beside its transaction; one that registers its key in
    // its transaction makes none while it is open (no renewals, no journal), so it takes
    // no turn: the pool's own wait for a connection is its only bound.
    if !tx.fences_by_lock() && mode.one_commit(contract).is_some() {
        return Ok(());
    }
    if tx.try_reserve().await {
        return Ok(());
    }
    let unavailable = |error| answer::store_unavailable(idem, contract, None, &error);
    let now = idem.now().await;
    let answered_from_record = match idem.store().get(key, now).await {
        Ok(Some(record)) => !matches!(record.state, RecordState::Released),
        // An attempt that registered the key in its transaction (SQLite's, here) is
        // answered from its mark on the key, at once too.
        Ok(None) if mode.one_commit(contract).is_some() => match tx.in_flight(key).await {
            Ok(holder) => holder.is_some(),
            Err(error) => return Err(unavailable(error).into()),
        },
        Ok(None) => false,
        Err(error) => return Err(unavailable(error).into()),
    };
    if !answered_from_record {
        tx.reserve().await.map_err(unavailable)?;
    }
    Ok(())
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
        // Begun with the key registered inside it (stage 7).
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
