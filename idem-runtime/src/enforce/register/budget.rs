//! The client's budget before a new key is claimed: the handle's allowance
//! ([`crate::idem::allowance`]), a count of the client's usage ahead of its end (in the
//! background) or, when it is spent, one count the client's requests wait for together,
//! and the refusal of a client at its budget.

use super::Registration;
use crate::Idem;
use crate::answer;
use crate::enforce::Rejection;
use crate::idem::allowance::{Admission, Reservation};
use crate::store::{ClientBudget, OverBudget, UnixMillis};

/// The bytes of headers a result may add besides its body, for the allowance.
const HEADERS_PER_KEY: u64 = 1024;

/// What the claim registers under: the budget (`None` without one), and what the key
/// took of the client's allowance, to give back (`None` when it took nothing).
pub(super) type Budgeted = (Option<ClientBudget>, Option<Reservation>);

impl Registration<'_> {
    /// The budget the claim registers under at `now`: `None` without one,
    /// [`ClientBudget::COUNT_ONLY`] while the client's allowance lasts (or for a key it
    /// holds), the budget itself near it (the store then decides); with what the key
    /// took of the allowance.
    ///
    /// # Errors
    ///
    /// 429 `client-budget-exhausted` when the client is at its budget and does not hold
    /// the key; 503 `store-unavailable` (or `store-full`) when the store fails.
    pub(super) async fn budget(&self, now: UnixMillis) -> Result<Budgeted, Rejection> {
        let Some(budget) = self.idem.client_budget() else {
            return Ok((None, None));
        };
        let allowances = self.idem.allowances();
        let client = &self.key.client;
        let per_key = u64::try_from(self.idem.max_stored_body())
            .unwrap_or(u64::MAX)
            .saturating_add(HEADERS_PER_KEY);
        let admission = match allowances.take(client, per_key, now) {
            Admission::Unknown => {
                let usage = self.idem.store().client_usage(client, budget.records, now);
                (allowances.join(client))
                    .run(allowances, client, &budget, now, usage)
                    .await
                    .map_err(|error| self.unavailable(self.last_id, &error))?;
                allowances.after_count(client, per_key, now)
            }
            known => known,
        };
        match admission {
            Admission::Count(reservation) => {
                Ok((Some(ClientBudget::COUNT_ONLY), Some(reservation)))
            }
            Admission::Check | Admission::Unknown => Ok((Some(budget), None)),
            Admission::Over(over) => Ok((self.held_or_refused(&over, now).await?, None)),
        }
    }

    /// After a key is registered at `now`: the client is counted again in the background
    /// if its allowance is near its end ([`count_ahead`]). Not before: a registration that
    /// finds a record gives its key back ([`Registration::refund`]), and must not bring
    /// on a count.
    pub(super) fn count_ahead(&self, now: UnixMillis) {
        if let Some(budget) = self.idem.client_budget() {
            count_ahead(self.idem, &self.key.client, budget, now);
        }
    }

    /// Gives the client's allowance back what [`Registration::budget`] took for a
    /// registration that counted nothing: the key had a record or an attempt in flight.
    /// A replay or a duplicate spends no new key, so it never brings on a count.
    pub(super) fn refund(&self, reservation: Option<Reservation>) {
        if let Some(reservation) = reservation {
            self.idem.allowances().refund(&self.key.client, reservation);
        }
    }

    /// For a registration that reclaimed a released record (counted already): the key
    /// goes back to the allowance, and the bytes stay held for the attempt's result.
    pub(super) fn return_key(&self, reservation: Option<Reservation>) {
        if let Some(reservation) = reservation {
            self.idem
                .allowances()
                .return_key(&self.key.client, reservation);
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

/// Counts `client` under `budget` in a task of its own when its allowance is due to be
/// counted again at `now` ([`Allowances::due`](crate::idem::allowance::Allowances::due)),
/// so that no request waits for the count. Nothing outside a tokio runtime: the client
/// is then counted when its allowance is spent. A failed count is logged; the next one
/// comes when the allowance is spent, and a request waits for it.
fn count_ahead(idem: &Idem, client: &str, budget: ClientBudget, now: UnixMillis) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(count) = idem.allowances().due(client, now) else {
        return;
    };
    let (idem, client) = (idem.clone(), Box::<str>::from(client));
    runtime.spawn(async move {
        let now = idem.now().await;
        let usage = idem.store().client_usage(&client, budget.records, now);
        let counted = count.run(idem.allowances(), &client, &budget, now, usage);
        if let Err(error) = counted.await {
            tracing::debug!(
                error = %error,
                "idem: counting a client ahead of its allowance's end failed; it is counted \
                 when the allowance is spent"
            );
        }
    });
}
