//! Answering from a record that exists: the key's operation is known.

use super::Registration;
use crate::answer;
use crate::attempt::Held;
use crate::enforce::Rejection;
use crate::recovery::{Recovered, recover};
use crate::replay::replay;
use crate::store::{Record, RecordState, UnixMillis};

/// What to do after looking at the record.
pub(super) enum Next {
    /// Recovery found the operation not applied: this request holds the key now (boxed:
    /// the rare path, and an attempt is large).
    Run(Box<Held>),
    /// The record changed meanwhile (released, taken over, the wait ended): look again.
    LookAgain,
}

impl Registration<'_> {
    /// Answers from `record` as it was at `now`, or says what to do next.
    ///
    /// | the record | the answer |
    /// |---|---|
    /// | another fingerprint (under either rule: see `crate::fingerprint`) | 422 `fingerprint-mismatch`; nothing runs |
    /// | completed | its stored result, replayed |
    /// | unknown (parked) | 409 `operation-outcome-unknown` |
    /// | released | look again: the claim reclaims it |
    /// | processing, its attempt alive | the contract's `concurrency` ([`super::concurrency`]) |
    /// | processing, its lease ended | recovery decides ([`crate::recovery`]) |
    pub(super) async fn answer_from(
        &mut self,
        record: &Record,
        now: UnixMillis,
    ) -> Result<Next, Rejection> {
        let id = record.operation_id;
        if record.fingerprint != self.fingerprint {
            // A record of an earlier release, whose rule hashed `null` members: the same
            // request, which goes on under the record's fingerprint (so that a released
            // record is claimed again).
            match self.legacy {
                Some(legacy) if record.fingerprint == legacy => self.fingerprint = legacy,
                _ => return Err(answer::fingerprint_mismatch(self.contract, record).into()),
            }
        }
        match &record.state {
            RecordState::Completed { response } => {
                Err(Rejection::Replayed(Box::new(replay(response, id))))
            }
            RecordState::Unknown { reason } => Err(answer::outcome_unknown(id, reason).into()),
            RecordState::Released => Ok(Next::LookAgain),
            // Live, or ended while its attempt is still alive in this process: recovering
            // now could run the operation twice at once.
            RecordState::Processing { lease } if self.idem.running().holds(lease, now) => {
                self.concurrency(id, lease, now).await
            }
            RecordState::Processing { .. } => self.recover(record).await,
        }
    }

    /// Takes the ended lease over and has recovery decide.
    async fn recover(&mut self, record: &Record) -> Result<Next, Rejection> {
        let recovered = recover(
            self.idem,
            self.contract,
            self.key,
            record,
            &mut self.make_recoverer,
        )
        .await;
        match recovered {
            Recovered::Run(held) => Ok(Next::Run(Box::new(held))),
            Recovered::Answer(response) => Err(Rejection::Recovered(Box::new(response))),
            Recovered::Lost => Ok(Next::LookAgain),
            Recovered::Failed(error) => Err(self.unavailable(Some(record.operation_id), &error)),
        }
    }
}
