//! The mode an attempt runs in: plain, or transactional (its handler takes the
//! transaction, [`crate::transaction::Tx`], and idem commits the business writes with
//! the key's final state).
//!
//! One type in every feature set: without the SQL stores (features `sqlite` and
//! `postgres`) the transactional arm holds an uninhabited type, so the request path
//! matches on the mode and needs no `cfg` of its own.

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
mod none;

use http::Extensions;

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
pub(crate) use self::none::AttemptTx;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use crate::transaction::AttemptTx;

/// How an attempt's outcome is recorded.
pub(crate) enum Mode {
    /// Two writes: the handler's effect, then the record of its answer.
    Plain,
    /// The handler's writes and the record commit in the attempt's transaction.
    Transactional(AttemptTx),
}

impl Mode {
    /// The mode of a request: transactional when the handler took the transaction (its
    /// extractor left it in the request's `extensions`).
    pub(crate) fn of(extensions: &Extensions) -> Mode {
        AttemptTx::find(extensions).map_or(Mode::Plain, Mode::Transactional)
    }

    /// Whether the attempt runs in the transactional mode.
    pub(crate) fn is_transactional(&self) -> bool {
        matches!(self, Mode::Transactional(_))
    }

    /// The attempt's transaction when the key is registered inside it, one commit for the
    /// key and the business writes: the transactional mode, unless the contract resumes
    /// (`recovery = resume`: its step journal is written beside the transaction, and
    /// needs the record committed before the first step).
    pub(crate) fn one_commit(&self, contract: &idem_contract::Contract) -> Option<AttemptTx> {
        let resumes = matches!(contract.recovery, idem_contract::Recovery::Resume);
        match self {
            Mode::Transactional(tx) => (!resumes).then(|| tx.clone()),
            Mode::Plain => None,
        }
    }

    /// Whether the attempt takes no turn to begin its transaction: the one-commit mode
    /// on a database whose transactions do not fence by its one write lock
    /// (PostgreSQL), where many transactions are open at once and the key's only read is
    /// the first statement of the attempt's transaction (`enforce`'s stage 7).
    pub(crate) fn takes_no_turn(&self, contract: &idem_contract::Contract) -> bool {
        match self {
            Mode::Transactional(tx) => !tx.fences_by_lock() && self.one_commit(contract).is_some(),
            Mode::Plain => false,
        }
    }

    /// Whether the attempt's transaction holds the database's only write lock (SQLite):
    /// no other connection can write until it ends.
    pub(crate) fn holds_the_write_lock(&self) -> bool {
        match self {
            Mode::Plain => false,
            Mode::Transactional(tx) => tx.fences_by_lock(),
        }
    }
}
