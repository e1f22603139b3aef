//! Stages 7 and 9, the mode's two moments around registration: the right to begin the
//! attempt's transaction is taken before the key is registered, and the transaction
//! begins once the key is held, unless the key was registered inside it (the
//! transactional mode's one commit, `register/claim.rs`). The plain mode does neither.

use idem_contract::Contract;

use super::Rejection;
use super::look::{Seen, seen};
use crate::Idem;
use crate::answer;
use crate::attempt::Held;
use crate::mode::Mode;
use crate::store::RecordKey;

/// Takes the right to begin the transaction before anything is registered: with
/// SQLite's one writer the wait happens here, where a client that gives up leaves
/// nothing behind, and it is not charged to the attempt's lease. A duplicate of a key
/// that is held or finished is answered from its record without waiting: the record
/// read is returned, for the claim to answer from.
///
/// On PostgreSQL an attempt that registers its key in its transaction takes no turn
/// (the pool's own wait for a connection is its only bound: it makes no statement beside
/// its transaction while it is open), and reads nothing here: the key's record is read
/// by the first statement of its transaction, with the key's lock (stage 8). `looked`
/// is what stage 5 read (a store that reads in this process), handed on to the claim.
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
) -> Result<Seen, Rejection> {
    let Mode::Transactional(tx) = mode else {
        return Ok(looked);
    };
    let unavailable = |error| answer::store_unavailable(idem, contract, None, &error);
    if mode.takes_no_turn(contract) || looked.is_some() {
        return Ok(looked);
    }
    let one_commit = mode.one_commit(contract).is_some();
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
