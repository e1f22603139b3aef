//! The reconciler: recovery that does not wait for the client (see the module docs of
//! [`crate::recovery`], "The reconciler").

use std::sync::Arc;
use std::time::Duration;

use idem_contract::{Contract, Recovery};

use crate::Idem;
use crate::attempt::Held;
use crate::idem::IdemBuilder;
use crate::operation::Recover;
use crate::reconcile::ReconcilerPass;
use crate::reconcile::Recoverer;
use crate::recovery::{Recovered, recover};
use crate::store::{ListQuery, Listed, Record, RecordKey, StoreError, UnixMillis};

/// How many records one listing of a pass asks for.
const PAGE: u32 = 100;

/// Whether the contract's deadline (all attempts together, counted from the operation's
/// first registration) has passed at `now`, with a margin of one per-attempt lease: the
/// client has stopped retrying by its own contract.
fn past_deadline(contract: &Contract, record: &Record, now: UnixMillis) -> bool {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let deadline = ms(contract.deadline.total.to_std());
    let margin = ms(contract.lease().to_std());
    now >= record
        .created_at
        .saturating_add(deadline)
        .saturating_add(margin)
}

/// A resumable operation whose client did not come back within the deadline, taken over
/// as `attempt`: released when its journal is empty (no call to another system was made,
/// so nothing happened outside the database: a later retry runs it afresh), else parked
/// for an operator, with its steps in the reason (`idem ops show` lists them with their
/// values).
async fn abandoned(idem: &Idem, attempt: Held) -> Result<(), StoreError> {
    let now = idem.now().await;
    let steps = idem
        .store()
        .steps(&attempt.key, attempt.operation_id, now)
        .await?;
    if steps.is_empty() {
        return attempt.release().await;
    }
    let listed: Vec<String> = steps
        .iter()
        .map(|step| format!("`{}` {}", step.name, step.state.as_str()))
        .collect();
    let reason = format!(
        "the client did not come back to resume it within the contract's deadline, and its step journal holds {}: settle each step with the other system, then resolve it",
        listed.join(", ")
    );
    attempt.store_park(&reason).await?;
    tracing::warn!(
        operation = %attempt.contract.operation,
        operation_id = %attempt.operation_id,
        reason = %reason,
        "idem: a resumable operation was abandoned by its client; parked for an operator"
    );
    Ok(())
}

/// One operation's recoverer, registered with [`IdemBuilder::recover_with`](crate::IdemBuilder::recover_with).
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) contract: &'static idem_contract::Contract,
    pub(crate) make: Arc<dyn Fn() -> Recoverer + Send + Sync>,
}

impl IdemBuilder {
    /// Registers how the contracted operation `C` recovers, made from the router's state
    /// `state` (a clone is kept), so that the reconciler ([`Idem::spawn_reconciler`])
    /// recovers its operations. Registering `C` again replaces its recoverer.
    ///
    /// # Panics
    ///
    /// When another contracted operation with the same name was registered under this
    /// handle (two handlers named alike would share every key): rename one.
    pub fn recover_with<C, S>(mut self, state: &S) -> Self
    where
        C: Recover<S>,
        S: Clone + Send + Sync + 'static,
    {
        if let Err(other) = self.names().claim::<C>() {
            panic!(
                "idem: the operation `{}` is already claimed by `{other}`: two contracted handlers with one name would share every key; rename one",
                C::CONTRACT.operation
            );
        }
        let state = state.clone();
        let registered = Registered {
            contract: C::CONTRACT,
            make: Arc::new(move || C::recoverer(&state)),
        };
        let recoverers = self.recoverers_mut();
        recoverers.retain(|r| r.contract.operation != C::CONTRACT.operation);
        recoverers.push(registered);
        self
    }
}

impl Idem {
    /// One pass of the reconciler: recovers every record of the registered operations
    /// whose lease has ended (see [the reconciler](crate::recovery#the-reconciler)).
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot list the records; a failure while recovering
    /// one record is logged and counted in [`ReconcilerPass::failed`] instead.
    pub async fn reconcile(&self) -> Result<ReconcilerPass, StoreError> {
        let mut done = ReconcilerPass::default();
        for registered in self.recoverers().iter() {
            let mut after = None;
            loop {
                let now = self.now().await;
                let query = ListQuery {
                    operation: Some(registered.contract.operation.to_string()),
                    lease_ended: true,
                    after: after.take(),
                    limit: PAGE,
                    ..ListQuery::default()
                };
                let page = self.store().list(&query, now).await?;
                let full = page.len() == PAGE as usize;
                for listed in page {
                    after = Some(listed.key.clone());
                    done.found += 1;
                    self.reconcile_one(registered, listed, &mut done).await;
                }
                if !full {
                    break;
                }
            }
        }
        Ok(done)
    }

    /// Recovers one record whose lease has ended, counting what came of it in `done`.
    async fn reconcile_one(
        &self,
        registered: &Registered,
        listed: Listed,
        done: &mut ReconcilerPass,
    ) {
        let Some(lease) = listed.record.lease() else {
            return;
        };
        let now = self.now().await;
        if self.running().holds(lease, now) {
            done.alive += 1;
            return;
        }
        let contract = registered.contract;
        let resumes = matches!(contract.recovery, Recovery::Resume);
        if resumes && !past_deadline(contract, &listed.record, now) {
            // Only the client's retry can run the handler again (the request is not
            // kept): within the contract's deadline, it may still come.
            done.waiting += 1;
            return;
        }
        let key: Arc<RecordKey> = Arc::new(listed.key);
        let make = Arc::clone(&registered.make);
        let mut recoverer = Some(move || make());
        match recover(self, contract, &key, &listed.record, &mut recoverer).await {
            Recovered::Run(attempt) if resumes => match abandoned(self, attempt).await {
                Ok(()) => done.recovered += 1,
                Err(_) => done.failed += 1,
            },
            Recovered::Run(attempt) => match attempt.release().await {
                Ok(()) => done.recovered += 1,
                Err(_) => done.failed += 1,
            },
            Recovered::Answer(_) => done.recovered += 1,
            Recovered::Lost => done.lost += 1,
            Recovered::Failed(error) => {
                tracing::warn!(
                    operation = %contract.operation,
                    error = %error,
                    "idem: the reconciler could not recover an operation; the next pass tries again"
                );
                done.failed += 1;
            }
        }
    }

    /// Spawns a tokio task that runs [`Idem::reconcile`] every `every` (the first time
    /// after one period), logging what it did and its failures, until the handle it
    /// returns is aborted or the runtime stops. Every instance of a service may run one:
    /// each ended lease is recovered by exactly one of them.
    pub fn spawn_reconciler(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        if self.recoverers().is_empty() {
            tracing::warn!(
                "idem: the reconciler has no operation to recover: register each with `IdemBuilder::recover_with` first"
            );
        }
        let idem = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match idem.reconcile().await {
                    Ok(done) if done.found > 0 => tracing::info!(
                        found = done.found,
                        recovered = done.recovered,
                        lost = done.lost,
                        alive = done.alive,
                        waiting = done.waiting,
                        failed = done.failed,
                        "idem: reconciled operations whose lease had ended"
                    ),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(error = %error, "idem: the reconciler cannot list records");
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::StatusCode;

    use super::*;
    use crate::identity;
    use crate::operation::Contracted;
    use crate::reconcile::{Decision, UnknownOperation};
    use crate::store::{
        Lease, MemoryStore, NewRecord, OwnerToken, RecordState, Store, UnixMillis, unix_now,
    };

    struct CreateOrder;
    impl Contracted for CreateOrder {
        const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER;
    }

    /// The router's state: how many times recovery ran, and what it decides (by the
    /// key's first letter: `a`pplied, `n`ot applied, `u`nknown, `l`ater).
    #[derive(Clone, Default)]
    struct State {
        calls: Arc<AtomicUsize>,
    }

    impl Recover<State> for CreateOrder {
        fn recoverer(state: &State) -> Recoverer {
            Recoverer::reconcile_with(
                state.clone(),
                |state: State, op: UnknownOperation| async move {
                    state.calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    match op.key.as_bytes()[0] {
                        b'a' => Decision::applied((StatusCode::CREATED, "order 1")),
                        b'n' => Decision::NotApplied,
                        b'u' => Decision::unknown("the ledger does not say"),
                        _ => Decision::cannot_decide_now("the ledger is down"),
                    }
                },
            )
        }
    }

    fn operation() -> String {
        CreateOrder::CONTRACT.operation.to_string()
    }

    /// A record whose attempt died: processing under a lease that ended at `now`.
    async fn abandoned(store: &dyn Store, key: &str, now: UnixMillis) {
        let new = NewRecord {
            operation_id: crate::OperationId::new(),
            fingerprint: "sha256:a".into(),
            lease: Lease {
                token: OwnerToken::random(),
                until: now - 1,
            },
            expires_at: now + 86_400_000,
            transactional: false,
            holds_until: now - 1,
            budget: None,
        };
        store
            .begin(&RecordKey::new(operation(), "acme", key), &new, now - 1_000)
            .await
            .unwrap();
    }

    fn idem(store: Arc<dyn Store>, state: &State) -> Idem {
        Idem::builder(store, identity::header("x-client-id"))
            .recover_with::<CreateOrder, _>(state)
            .build()
    }

    async fn state_of(store: &dyn Store, key: &str) -> RecordState {
        store
            .get(&RecordKey::new(operation(), "acme", key), unix_now())
            .await
            .unwrap()
            .unwrap()
            .state
    }

    /// Each decision is recorded as the status lookup records it, with the recoverer
    /// called once per operation, and a live lease is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_ended_lease_is_recovered_once_and_recorded() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let now = unix_now();
        for key in ["applied", "not-applied", "unknown", "later"] {
            abandoned(&*store, key, now).await;
        }
        let live = NewRecord {
            operation_id: crate::OperationId::new(),
            fingerprint: "sha256:a".into(),
            lease: Lease {
                token: OwnerToken::random(),
                until: now + 60_000,
            },
            expires_at: now + 86_400_000,
            transactional: false,
            holds_until: now,
            budget: None,
        };
        let running = RecordKey::new(operation(), "acme", "alive");
        store.begin(&running, &live, now).await.unwrap();
        let state = State::default();
        let idem = idem(Arc::clone(&store), &state);

        let done = idem.reconcile().await.unwrap();
        assert_eq!(
            (done.found, done.recovered, done.failed),
            (4, 4, 0),
            "{done:?}"
        );
        assert_eq!(
            state.calls.load(Ordering::SeqCst),
            4,
            "one call per operation"
        );
        let RecordState::Completed { response } = state_of(&*store, "applied").await else {
            panic!("applied is completed");
        };
        assert_eq!(
            (response.status, &response.body[..]),
            (201, &b"order 1"[..])
        );
        assert_eq!(
            state_of(&*store, "not-applied").await,
            RecordState::Released
        );
        assert_eq!(
            state_of(&*store, "unknown").await,
            RecordState::Unknown {
                reason: "the ledger does not say".into()
            }
        );
        assert!(matches!(
            state_of(&*store, "later").await,
            RecordState::Processing { .. }
        ));
        assert!(matches!(
            state_of(&*store, "alive").await,
            RecordState::Processing { .. }
        ));
        let shown = store
            .inspect(&RecordKey::new(operation(), "acme", "unknown"), unix_now())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            shown.record.attempt, 2,
            "the takeover is the second attempt"
        );

        // "cannot decide now" is asked again at the next pass, and only it.
        let done = idem.reconcile().await.unwrap();
        assert_eq!((done.found, done.recovered), (1, 1), "{done:?}");
        assert_eq!(state.calls.load(Ordering::SeqCst), 5);
    }

    /// Two reconcilers (two instances) on one store, racing over many abandoned
    /// operations: the recoverer runs once per operation, and every one is decided.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_reconcilers_recover_each_operation_once() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        racing(store).await;
    }

    /// The same race on SQLite, PostgreSQL and Redis, whose takeover is a compare-and-set
    /// in the database (a script in Redis).
    #[cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_reconcilers_recover_each_operation_once_on_shared_stores() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = crate::store::SqliteStore::open(dir.path().join("race.db"))
            .await
            .unwrap();
        racing(Arc::new(sqlite)).await;
        if let Some(pool) =
            crate::store::conformance::postgres::scratch_pool("reconciler race").await
        {
            let pg = crate::store::PostgresStore::from_pool(pool).await.unwrap();
            racing(Arc::new(pg)).await;
        }
        if let Some(url) = crate::store::conformance::redis::url_or_skip("reconciler race").await {
            let redis = crate::store::conformance::redis::scratch_store(&url).await;
            racing(Arc::new(redis)).await;
        }
    }

    async fn racing(store: Arc<dyn Store>) {
        let now = unix_now();
        let keys: Vec<String> = (0..30).map(|i| format!("a{i:02}")).collect();
        for key in &keys {
            abandoned(&*store, key, now).await;
        }
        let state = State::default();
        let first = idem(Arc::clone(&store), &state);
        let second = idem(Arc::clone(&store), &state);
        let (a, b) = tokio::join!(
            tokio::spawn(async move { first.reconcile().await.unwrap() }),
            tokio::spawn(async move { second.reconcile().await.unwrap() }),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        // Both passes list (nearly) every record and contend for each one: the takeover's
        // compare-and-set decides who recovers it.
        for pass in [a, b] {
            assert_eq!(
                pass.found,
                pass.recovered + pass.lost + pass.alive + pass.failed
            );
        }
        assert_eq!(a.recovered + b.recovered, 30, "{a:?} {b:?}");
        assert_eq!(
            state.calls.load(Ordering::SeqCst),
            30,
            "one recovery call per operation"
        );
        for key in &keys {
            assert!(matches!(
                state_of(&*store, key).await,
                RecordState::Completed { .. }
            ));
        }
    }

    /// The spawned reconciler recovers without any request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_spawned_reconciler_recovers_without_a_request() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        abandoned(&*store, "applied", unix_now()).await;
        let state = State::default();
        let handle = idem(Arc::clone(&store), &state).spawn_reconciler(Duration::from_millis(20));
        for _ in 0..100 {
            if matches!(
                state_of(&*store, "applied").await,
                RecordState::Completed { .. }
            ) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.abort();
        assert!(matches!(
            state_of(&*store, "applied").await,
            RecordState::Completed { .. }
        ));
        assert_eq!(state.calls.load(Ordering::SeqCst), 1);
    }
}
