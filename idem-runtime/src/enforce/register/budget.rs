//! The client's budget before a new key is claimed: the handle's allowance
//! ([`crate::idem::allowance`]), a count of the client's usage when it is spent, and the
//! refusal of a client at its budget.

use super::Registration;
use crate::answer;
use crate::enforce::Rejection;
use crate::idem::allowance::Admission;
use crate::store::{ClientBudget, NewRecord, OverBudget, UnixMillis};

/// The bytes of headers a result may add besides its body, for the allowance.
const HEADERS_PER_KEY: u64 = 1024;

impl Registration<'_> {
    /// The budget the claim registers under at `now`: `None` without one,
    /// [`ClientBudget::COUNT_ONLY`] while the client's allowance lasts (or for a key it
    /// holds), the budget itself near it (the store then decides).
    ///
    /// # Errors
    ///
    /// 429 `client-budget-exhausted` when the client is at its budget and does not hold
    /// the key; 503 `store-unavailable` (or `store-full`) when the store fails.
    pub(super) async fn budget(&self, now: UnixMillis) -> Result<Option<ClientBudget>, Rejection> {
        let Some(budget) = self.idem.client_budget() else {
            return Ok(None);
        };
        let allowances = self.idem.allowances();
        let client = &self.key.client;
        let admission = match allowances.take(client, now) {
            Admission::Unknown => {
                let counted = self
                    .idem
                    .store()
                    .client_usage(client, budget.records, now)
                    .await
                    .map_err(|error| self.unavailable(self.last_id, &error))?;
                let per_key = u64::try_from(self.idem.max_stored_body())
                    .unwrap_or(u64::MAX)
                    .saturating_add(HEADERS_PER_KEY);
                allowances.counted(client, &budget, &counted, per_key, now)
            }
            known => known,
        };
        match admission {
            Admission::Count => Ok(Some(ClientBudget::COUNT_ONLY)),
            Admission::Check | Admission::Unknown => Ok(Some(budget)),
            Admission::Over(over) => self.held_or_refused(&over, now).await,
        }
    }

    /// Gives the client's allowance back the key [`Registration::budget`] spent on `new`
    /// when its registration counted nothing: the key had a record or an attempt in
    /// flight. A replay or a duplicate spends no new key, so it never brings on a count.
    pub(super) fn refund(&self, new: &NewRecord, now: UnixMillis) {
        if new.budget == Some(ClientBudget::COUNT_ONLY) {
            self.idem.allowances().refund(&self.key.client, now);
        }
    }

    /// A client at its budget: a key it holds goes on (counting only: it is no new
    /// operation), any other is refused without counting again.
    async fn held_or_refused(
        &self,
        over: &OverBudget,
        now: UnixMillis,
    ) -> Result<Option<ClientBudget>, Rejection> {
        match self.idem.store().get(self.key, now).await {
            Ok(Some(_held)) => Ok(Some(ClientBudget::COUNT_ONLY)),
            Ok(None) => Err(answer::budget_exhausted(self.contract, over, now).into()),
            Err(error) => Err(self.unavailable(self.last_id, &error)),
        }
    }
}
