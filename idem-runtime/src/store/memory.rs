//! The in-memory store: one process, nothing survives a restart.

use async_trait::async_trait;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::{
    Begin, DEFAULT_MAX_RESULT, Lease, NewRecord, OwnerToken, Record, RecordKey, RecordState, Store,
    StoreError, StoredResponse, UnixMillis, check_size,
};

/// A [`Store`] in a concurrent hash map ([`dashmap`]): the default for tests and
/// single-process services.
///
/// Every change happens under the lock of the key's shard, so `begin` is one atomic
/// insert-if-absent (the map's entry API) and every other change one compare-and-set.
/// Records are lost when the process ends: use `SqliteStore` (feature `sqlite`) for a
/// service that must replay results after a restart. Expired records stay in memory until
/// [`Store::purge_expired`] (or [`crate::Idem::spawn_purger`]) removes them.
#[derive(Debug)]
pub struct MemoryStore {
    records: DashMap<RecordKey, Record>,
    max_result: usize,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore {
            records: DashMap::new(),
            max_result: DEFAULT_MAX_RESULT,
        }
    }
}

impl MemoryStore {
    /// An empty store that keeps results of up to [`DEFAULT_MAX_RESULT`] bytes.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`]); `complete` refuses a larger one with
    /// [`StoreError::TooLarge`].
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> MemoryStore {
        self.max_result = bytes;
        self
    }

    /// How many records the store holds, expired ones included.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Applies `change` to the record of `key` under its shard's lock.
    fn update<T>(
        &self,
        key: &RecordKey,
        change: impl FnOnce(&mut Record) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.records.get_mut(key) {
            Some(mut record) => change(&mut record),
            None => Err(StoreError::LeaseLost),
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        Ok(match self.records.entry(key.clone()) {
            Entry::Vacant(vacant) => {
                let record = Record::started(new, now);
                vacant.insert(record.clone());
                Begin::Started(record)
            }
            Entry::Occupied(mut occupied) => match occupied.get().begin_over(new, now) {
                Some(record) => {
                    occupied.insert(record.clone());
                    Begin::Started(record)
                }
                None => Begin::Exists(occupied.get().clone()),
            },
        })
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        Ok(self
            .records
            .get(key)
            .filter(|r| !r.is_expired(now))
            .map(|r| r.clone()))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        self.update(key, |record| {
            if !record.is_live_owner(token, now) {
                return Err(StoreError::LeaseLost);
            }
            record.state = RecordState::Completed {
                response: response.clone(),
            };
            Ok(())
        })
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(key, |record| {
            if !record.is_live_owner(token, now) {
                return Err(StoreError::LeaseLost);
            }
            record.state = RecordState::Released;
            Ok(())
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(key, |record| {
            let _ = now;
            if record.lease().is_none_or(|l| l.token != token) {
                return Err(StoreError::LeaseLost);
            }
            *record = record.renewed(until);
            Ok(())
        })
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(key, |record| {
            if record.lease().is_none_or(|l| l.token != token) {
                return Err(StoreError::LeaseLost);
            }
            record.state = RecordState::Unknown {
                reason: reason.to_owned(),
            };
            Ok(())
        })
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        self.update(key, |record| {
            let ended = record
                .lease()
                .is_some_and(|l| l.token == expected && !l.is_live(now));
            if !ended || record.is_expired(now) {
                return Err(StoreError::LeaseLost);
            }
            *record = record.leased(new_lease);
            Ok(record.clone())
        })
    }

    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut purged = 0;
        self.records.retain(|_, record| {
            let keep = !record.is_expired(now);
            purged += u64::from(!keep);
            keep
        });
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite() {
        crate::store::conformance::run(|| async { MemoryStore::new() }).await;
    }
}
