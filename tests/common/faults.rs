//! A store that fails on demand, call by call, and counts every call: the fault injection
//! of the tests (a store that is down, a step of an attempt that fails).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use idem::store::{
    Begin, ClientUsage, Lease, MemoryStore, NewRecord, OwnerToken, Record, RecordKey, RecordStore,
    Step, StepWrite, Store, StoreError, StoredResponse, UnixMillis,
};

/// One method of [`Store`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Begin,
    Get,
    Complete,
    Release,
    Renew,
    Park,
    TakeOver,
    Purge,
    /// The budget's count of a client's usage.
    ClientUsage,
    /// A read of an operation's step journal.
    Steps,
    /// A write to an operation's step journal.
    WriteStep,
}

impl Call {
    pub const ALL: [Call; 11] = [
        Call::Begin,
        Call::Get,
        Call::Complete,
        Call::Release,
        Call::Renew,
        Call::Park,
        Call::TakeOver,
        Call::Purge,
        Call::ClientUsage,
        Call::Steps,
        Call::WriteStep,
    ];
}

#[derive(Default)]
struct Faults {
    failing: Mutex<HashMap<Call, bool>>,
    counts: Mutex<HashMap<Call, usize>>,
    /// How long `begin` waits after the inner store answered (a slow round trip back).
    begin_delay: Mutex<std::time::Duration>,
}

/// Wraps a store; every call is counted, and a call set to fail returns
/// `StoreError::Unavailable` without reaching the inner store.
pub struct FaultyStore<S = MemoryStore> {
    pub inner: Arc<S>,
    faults: Arc<Faults>,
}

impl<S> Clone for FaultyStore<S> {
    fn clone(&self) -> Self {
        FaultyStore {
            inner: Arc::clone(&self.inner),
            faults: Arc::clone(&self.faults),
        }
    }
}

impl FaultyStore<MemoryStore> {
    pub fn memory() -> Self {
        FaultyStore::over(MemoryStore::new())
    }
}

impl<S: Store> FaultyStore<S> {
    pub fn over(inner: S) -> Self {
        FaultyStore {
            inner: Arc::new(inner),
            faults: Arc::default(),
        }
    }

    /// From now on, `call` fails.
    pub fn fail(&self, call: Call) {
        self.faults.failing.lock().unwrap().insert(call, true);
    }

    /// From now on, `call` reaches the inner store again.
    pub fn heal(&self, call: Call) {
        self.faults.failing.lock().unwrap().insert(call, false);
    }

    /// From now on, `begin` answers `delay` after the inner store wrote the record, as
    /// a server that is slow to answer (or a pool that was slow to give a connection,
    /// with times computed before the wait).
    pub fn delay_begin(&self, delay: std::time::Duration) {
        *self.faults.begin_delay.lock().unwrap() = delay;
    }

    /// How many times `call` was made (failed calls included).
    pub fn calls(&self, call: Call) -> usize {
        self.faults
            .counts
            .lock()
            .unwrap()
            .get(&call)
            .copied()
            .unwrap_or(0)
    }

    /// How many calls were made in all.
    pub fn total(&self) -> usize {
        Call::ALL.iter().map(|c| self.calls(*c)).sum()
    }

    fn enter(&self, call: Call) -> Result<(), StoreError> {
        *self.faults.counts.lock().unwrap().entry(call).or_default() += 1;
        if self
            .faults
            .failing
            .lock()
            .unwrap()
            .get(&call)
            .copied()
            .unwrap_or(false)
        {
            return Err(StoreError::unavailable(format!(
                "injected failure of {call:?}"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl<S: Store> RecordStore for FaultyStore<S> {
    /// As the wrapped store: over the memory store, the record is read before the
    /// extractor (and that read fails on demand as any `get`).
    fn reads_locally(&self) -> bool {
        self.inner.reads_locally()
    }

    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        self.enter(Call::Begin)?;
        let begun = self.inner.begin(key, new, now).await;
        let delay = *self.faults.begin_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        begun
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        self.enter(Call::Get)?;
        self.inner.get(key, now).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.enter(Call::Complete)?;
        self.inner.complete(key, token, response, now).await
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.enter(Call::Release)?;
        self.inner.release(key, token, now).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.enter(Call::Renew)?;
        self.inner.renew(key, token, until, now).await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.enter(Call::Park)?;
        self.inner.park_unknown(key, token, reason, now).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        self.enter(Call::TakeOver)?;
        self.inner.take_over(key, expected, new_lease, now).await
    }

    async fn clock(&self) -> Result<Option<UnixMillis>, StoreError> {
        self.inner.clock().await
    }

    async fn client_usage(
        &self,
        client: &str,
        cap: u64,
        now: UnixMillis,
    ) -> Result<ClientUsage, StoreError> {
        self.enter(Call::ClientUsage)?;
        self.inner.client_usage(client, cap, now).await
    }

    async fn steps(
        &self,
        key: &RecordKey,
        operation_id: idem::OperationId,
        now: UnixMillis,
    ) -> Result<Vec<Step>, StoreError> {
        self.enter(Call::Steps)?;
        self.inner.steps(key, operation_id, now).await
    }

    async fn write_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.enter(Call::WriteStep)?;
        self.inner.write_step(key, token, write, now).await
    }
}

// The operator's calls are not on the request path: forwarded, never failed; but the
// purge, which is counted and fails on demand as the record calls do.
idem_runtime::forward_store! {
    impl[S: Store] OperatorStore for FaultyStore<S> {
        forward |this| &*this.inner;

        async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
            self.enter(Call::Purge)?;
            self.inner.purge_expired(now).await
        }
    }
}
