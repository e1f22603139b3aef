//! The in-memory store: one process, nothing survives a restart.
//!
//! Records are kept compact, because a service keeps every completed key for the whole
//! TTL (a day of traffic): one table per operation, so the operation's name is kept once;
//! the client and the key in one allocation; the fingerprint as its 32 bytes; a result as
//! one buffer holding its status, headers and body, which a replay slices without copying.
//! The tables are split into [`SHARDS`] shards, each under its own lock: a shard that
//! grows is rehashed under its lock, and with many small shards that pause stays short
//! (with the map's default of 4 × cores shards, a table of a million records stalled
//! every request to a shard for tens of milliseconds as it doubled).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use http::{HeaderName, HeaderValue};

use super::budget::{ClientUsage, OverBudget, Tallies};
use super::ops::{self, Event};
use super::{
    Begin, DEFAULT_MAX_RESULT, Delivery, Due, Inspection, Lease, ListQuery, Listed, NewRecord,
    OperatorStore, OwnerToken, Record, RecordKey, RecordState, RecordStore, Resolution,
    ResolutionOutcome, Step, StepState, StepWrite, StoreError, StoredResponse, UnixMillis,
    check_size,
};
use crate::OperationId;

/// How many shards (each a hash map under its own lock) one operation's table has.
pub const SHARDS: usize = 256;

/// A [`Store`](super::Store) in memory: the default for tests and single-process services.
///
/// Every change happens under the lock of the key's shard, so `begin` is one atomic
/// insert-if-absent and every other change one compare-and-set. Records are lost when the
/// process ends: use `SqliteStore` (feature `sqlite`) for a service that must replay
/// results after a restart. Expired records stay in memory until
/// [`OperatorStore::purge_expired`] (or [`crate::Idem::spawn_purger`]) removes them.
///
/// A record's slot is at most 128 bytes, beside one allocation for the client and the key
/// and one for a completed result (its status, headers and body, exactly sized); a
/// client's budget is counted by expiry bucket (`super::budget`), not by record.
#[derive(Debug)]
pub struct MemoryStore {
    /// One table per operation, by the operation's name.
    tables: RwLock<HashMap<Box<str>, Arc<Table>>>,
    max_result: usize,
    /// The history of the records that have one (`store::ops`), by operation and
    /// [`compact_key`]; locked only while the record's shard is (tables first), and only
    /// by reclaims, takeovers, resolutions and purges, never for a new key.
    history: DashMap<HistoryKey, Vec<Event>>,
    /// Each client's usage, for its budget ([`super::budget`]); locked after the tables.
    tallies: Tallies,
    /// The step journals ([`super::journal`]), by operation id; an entry is locked only
    /// while its record's shard is (tables first), or by a purge.
    journals: DashMap<OperationId, Journal>,
    /// The operations with a staged delivery ([`StepState::Staged`]); locked only when
    /// no journal is.
    outbox: DashMap<OperationId, ()>,
}

/// One operation's step journal, with its record's key and the end of its record's TTL
/// when last written.
#[derive(Debug, Default)]
struct Journal {
    key: Option<RecordKey>,
    expires_at: UnixMillis,
    steps: Vec<Step>,
}

/// A record's operation and [`compact_key`]: where its history is kept.
type HistoryKey = (Box<str>, Box<[u8]>);

/// The records of one operation, by [`compact_key`].
type Table = DashMap<Box<[u8]>, Slot>;

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore {
            tables: RwLock::default(),
            max_result: DEFAULT_MAX_RESULT,
            history: DashMap::new(),
            tallies: Tallies::default(),
            journals: DashMap::new(),
            outbox: DashMap::new(),
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
    /// At least [`StoredResponse::MAX_NOT_KEPT_SIZE`] bytes are kept whatever `bytes`
    /// says, so that what is kept of a result too large always fits.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> MemoryStore {
        self.max_result = bytes.max(StoredResponse::MAX_NOT_KEPT_SIZE);
        self
    }

    /// How many records the store holds, expired ones included.
    pub fn len(&self) -> usize {
        self.tables_now().iter().map(|t| t.len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tables as they are now.
    fn tables_now(&self) -> Vec<Arc<Table>> {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        tables.values().cloned().collect()
    }

    /// The table of `operation`, if it has one.
    fn table(&self, operation: &str) -> Option<Arc<Table>> {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        tables.get(operation).cloned()
    }

    /// The table of `operation`, made if it has none yet.
    fn table_or_new(&self, operation: &str) -> Arc<Table> {
        if let Some(table) = self.table(operation) {
            return table;
        }
        let mut tables = self.tables.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            tables
                .entry(operation.into())
                .or_insert_with(|| Arc::new(DashMap::with_shard_amount(SHARDS))),
        )
    }

    /// Applies `change` to the slot of `key` under its shard's lock; `LeaseLost` when the
    /// key has no record.
    fn update<T>(
        &self,
        key: &RecordKey,
        change: impl FnOnce(&mut Slot) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let Some(table) = self.table(&key.operation) else {
            return Err(StoreError::LeaseLost);
        };
        let name = compact_key(key);
        match table.get_mut(&*name) {
            Some(mut slot) => change(&mut slot),
            None => Err(StoreError::LeaseLost),
        }
    }

    /// Counts `record`, a new operation of `key`'s client, if its budget
    /// ([`NewRecord::budget`]) admits it: the bucket it is counted in
    /// ([`Slot::counted`]); with no budget, counts nothing (bucket 0).
    fn admit(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        record: &Record,
        now: UnixMillis,
    ) -> Result<u32, OverBudget> {
        let Some(budget) = &new.budget else {
            return Ok(0);
        };
        self.tallies
            .admit(&key.client, record.expires_at, budget, now)
    }
}

#[async_trait]
impl RecordStore for MemoryStore {
    /// `true`: a record is a lookup in this process's map.
    fn reads_locally(&self) -> bool {
        true
    }

    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let table = self.table_or_new(&key.operation);
        Ok(match table.entry(compact_key(key)) {
            Entry::Vacant(vacant) => {
                let record = Record::started(new, now);
                let counted = match self.admit(key, new, &record, now) {
                    Ok(counted) => counted,
                    Err(over) => return Ok(Begin::OverBudget(over)),
                };
                vacant.insert(Slot::from_record(&record, counted));
                Begin::Started(record)
            }
            Entry::Occupied(mut occupied) => {
                let current = occupied.get().to_record()?;
                match current.begin_over(new, now) {
                    Some(record) => {
                        // A new operation is counted anew; a reclaimed one stays where
                        // it was counted.
                        let counted = if current.is_expired(now) {
                            match self.admit(key, new, &record, now) {
                                Ok(counted) => counted,
                                Err(over) => return Ok(Begin::OverBudget(over)),
                            }
                        } else {
                            occupied.get().counted
                        };
                        self.note_begin(key, &current, &record, now);
                        occupied.insert(Slot::from_record(&record, counted));
                        Begin::Started(record)
                    }
                    None => Begin::Exists(current),
                }
            }
        })
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let Some(table) = self.table(&key.operation) else {
            return Ok(None);
        };
        match table.get(&*compact_key(key)) {
            Some(slot) if !slot.is_expired(now) => slot.to_record().map(Some),
            _ => Ok(None),
        }
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        let encoded = encode_response(response)?;
        self.update(key, |slot| {
            if !slot.is_live_owner(token, now) {
                return Err(StoreError::LeaseLost);
            }
            slot.state = SlotState::Completed(encoded);
            let size = u64::try_from(response.size()).unwrap_or(u64::MAX);
            self.tallies.stored(&key.client, slot.counted, size);
            Ok(())
        })
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(key, |slot| {
            if !slot.is_live_owner(token, now) {
                return Err(StoreError::LeaseLost);
            }
            slot.state = SlotState::Released;
            Ok(())
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(key, |slot| {
            if slot.lease().is_none_or(|l| l.token != token) {
                return Err(StoreError::LeaseLost);
            }
            *slot = Slot::from_record(&slot.to_record()?.renewed(until), slot.counted);
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
        self.update(key, |slot| {
            if slot.lease().is_none_or(|l| l.token != token) {
                return Err(StoreError::LeaseLost);
            }
            slot.state = SlotState::Unknown(reason.into());
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
        self.update(key, |slot| {
            let ended = slot
                .lease()
                .is_some_and(|l| l.token == expected && !l.is_live(now));
            if !ended || slot.is_expired(now) {
                return Err(StoreError::LeaseLost);
            }
            let current = slot.to_record()?;
            let record = current.leased(new_lease);
            let ended_at = current.lease().map_or(now, |l| l.until);
            self.note(key, Event::taken_over(record.attempt, now, ended_at));
            *slot = Slot::from_record(&record, slot.counted);
            Ok(record)
        })
    }

    /// This process's clock: the records live here.
    async fn clock(&self) -> Result<Option<UnixMillis>, StoreError> {
        Ok(None)
    }

    async fn client_usage(
        &self,
        client: &str,
        _cap: u64,
        now: UnixMillis,
    ) -> Result<ClientUsage, StoreError> {
        Ok(self.tallies.usage(client, now))
    }

    async fn steps(
        &self,
        _key: &RecordKey,
        operation_id: OperationId,
        _now: UnixMillis,
    ) -> Result<Vec<Step>, StoreError> {
        Ok(self
            .journals
            .get(&operation_id)
            .map(|journal| journal.steps.clone())
            .unwrap_or_default())
    }

    async fn write_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        write.check()?;
        // Under the record's shard lock: the fence and the write are one step.
        self.update(key, |slot| {
            if slot.lease().is_none_or(|l| l.token != token)
                || slot.operation_id != write.operation_id
            {
                return Err(StoreError::LeaseLost);
            }
            let step = self.journal_write(key, slot.expires_at, write)?;
            // After the journal's lock is let go: the outbox is never locked while a
            // journal is (see `purge_expired`).
            if matches!(step.state, StepState::Staged(_)) {
                self.outbox.insert(write.operation_id, ());
            }
            Ok(step)
        })
    }
}

impl MemoryStore {
    /// Applies `write` to its journal (called under the record's shard lock); the step
    /// as it stands.
    fn journal_write(
        &self,
        key: &RecordKey,
        expires_at: UnixMillis,
        write: &StepWrite,
    ) -> Result<Step, StoreError> {
        let mut journal = self.journals.entry(write.operation_id).or_default();
        journal.expires_at = journal.expires_at.max(expires_at);
        if journal.key.is_none() {
            journal.key = Some(key.clone());
        }
        let at = usize::try_from(write.index).unwrap_or(usize::MAX);
        if at > journal.steps.len() {
            return Err(StoreError::Changed(format!(
                "step {} was written before step {}",
                at + 1,
                journal.steps.len() + 1
            )));
        }
        let existing = journal.steps.get(at).cloned();
        match Step::apply(existing.as_ref(), write)? {
            Some(step) if at < journal.steps.len() => journal.steps[at] = step,
            Some(step) => journal.steps.push(step),
            None => {}
        }
        journal.steps.get(at).cloned().ok_or_else(|| {
            StoreError::Corrupt("a journal step vanished while it was written".into())
        })
    }

    /// Whether `key`'s record is the operation `id`, completed with a 2xx status and
    /// within its TTL at `now`: its staged deliveries may go.
    fn completed_ok(&self, key: &RecordKey, id: OperationId, now: UnixMillis) -> bool {
        let Some(table) = self.table(&key.operation) else {
            return false;
        };
        let Some(slot) = table.get(&*compact_key(key)) else {
            return false;
        };
        if slot.operation_id != id || slot.is_expired(now) {
            return false;
        }
        match &slot.state {
            SlotState::Completed(encoded) => {
                decode_response(encoded).is_ok_and(|r| (200..300).contains(&r.status))
            }
            _ => false,
        }
    }

    /// Applies `change` to step `index` of the journal of `id`; `LeaseLost` when there is
    /// no such step or `change` declines. The outbox forgets the operation once none of
    /// its steps is staged.
    fn change_delivery(
        &self,
        id: OperationId,
        index: u32,
        change: impl FnOnce(&Step) -> Option<Step>,
    ) -> Result<Step, StoreError> {
        let (step, staged_left) = {
            let mut journal = self.journals.get_mut(&id).ok_or(StoreError::LeaseLost)?;
            let at = usize::try_from(index).unwrap_or(usize::MAX);
            let current = journal.steps.get(at).ok_or(StoreError::LeaseLost)?;
            let step = change(current).ok_or(StoreError::LeaseLost)?;
            journal.steps[at] = step.clone();
            let left = journal
                .steps
                .iter()
                .any(|s| matches!(s.state, StepState::Staged(_)));
            (step, left)
        };
        if !staged_left {
            self.outbox.remove(&id);
        }
        Ok(step)
    }
}

#[async_trait]
impl OperatorStore for MemoryStore {
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut purged = 0;
        for (operation, table) in self.tables_named() {
            let mut gone = Vec::new();
            let any_history = !self.history.is_empty();
            table.retain(|name, slot| {
                let keep = !slot.is_expired(now);
                purged += u64::from(!keep);
                if !keep && any_history {
                    gone.push(name.clone());
                }
                keep
            });
            // Outside the table's locks (tables are locked first); a record begun
            // under the key meanwhile has no history yet that this could drop.
            for name in gone {
                self.history.remove(&(operation.clone(), name));
            }
        }
        self.tallies.purge(now);
        self.journals.retain(|_, journal| journal.expires_at > now);
        // The outbox's lock, then a journal's: never the other way round.
        self.outbox.retain(|id, ()| self.journals.contains_key(id));
        Ok(purged)
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        let mut found = Vec::new();
        for (operation, table) in self.tables_named() {
            if query
                .operation
                .as_deref()
                .is_some_and(|op| op != &*operation)
            {
                continue;
            }
            for entry in table.iter() {
                let Some(key) = split_key(&operation, entry.key()) else {
                    continue;
                };
                let record = entry.value().to_record()?;
                if query.matches(&key, &record, now) {
                    found.push(Listed { key, record });
                }
            }
        }
        found.sort_by(|a, b| ops::order(&a.key).cmp(&ops::order(&b.key)));
        found.truncate(query.page() as usize);
        Ok(found)
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        let Some(table) = self.table(&key.operation) else {
            return Ok(None);
        };
        let name = compact_key(key);
        let Some(slot) = table.get(&*name) else {
            return Ok(None);
        };
        if slot.is_expired(now) {
            return Ok(None);
        }
        let record = slot.to_record()?;
        let history = self
            .history
            .get(&(key.operation.as_str().into(), name))
            .map(|h| h.clone())
            .unwrap_or_default();
        drop(slot);
        Ok(Some(Inspection::new(key.clone(), record, &history)))
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolution,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let encoded = match &resolve.outcome {
            ResolutionOutcome::Completed(response) => {
                check_size(response, self.max_result)?;
                Some(encode_response(response)?)
            }
            ResolutionOutcome::NotApplied => None,
        };
        let outcome = self.update(key, |slot| {
            let current = slot.to_record()?;
            let parked = matches!(current.state, RecordState::Unknown { .. });
            if !parked || current.attempt != resolve.expected_attempt || current.is_expired(now) {
                let shown = (!current.is_expired(now)).then_some(&current);
                return Ok(Err(ops::refused(shown, resolve.expected_attempt)));
            }
            let parked = match &current.state {
                RecordState::Unknown { reason } => reason.as_str(),
                _ => "",
            };
            self.note(key, Event::resolved(current.attempt, parked, resolve, now));
            slot.state = match encoded {
                Some(encoded) => SlotState::Completed(encoded),
                None => SlotState::Released,
            };
            Ok(Ok(slot.to_record()?))
        });
        match outcome {
            Ok(result) => result,
            Err(StoreError::LeaseLost) => Err(StoreError::NotFound),
            Err(error) => Err(error),
        }
    }

    async fn due_deliveries(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError> {
        // Each map's lock is let go before the next is taken.
        let ids: Vec<OperationId> = self.outbox.iter().map(|entry| *entry.key()).collect();
        let mut due = Vec::new();
        for id in ids {
            let Some((key, steps)) = self
                .journals
                .get(&id)
                .and_then(|j| j.key.clone().map(|key| (key, j.steps.clone())))
            else {
                continue;
            };
            if !self.completed_ok(&key, id, now) {
                continue;
            }
            due.extend(
                steps
                    .into_iter()
                    .filter(|s| matches!(s.state, StepState::Staged(_)) && s.next_at <= now)
                    .map(|step| Due {
                        key: key.clone(),
                        operation_id: id,
                        step,
                    }),
            );
        }
        due.sort_by_key(|d| (d.step.next_at, d.operation_id, d.step.index));
        due.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(due)
    }

    async fn claim_delivery(
        &self,
        _key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.change_delivery(operation_id, index, |step| step.claimed(until, now))
    }

    async fn settle_delivery(
        &self,
        _key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
        _now: UnixMillis,
    ) -> Result<Step, StoreError> {
        self.change_delivery(operation_id, index, |step| step.settled(claim, delivery))
    }
}

impl MemoryStore {
    /// The tables as they are now, with their operation's name.
    fn tables_named(&self) -> Vec<(Box<str>, Arc<Table>)> {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        tables
            .iter()
            .map(|(name, table)| (name.clone(), Arc::clone(table)))
            .collect()
    }

    /// Appends `event` to the history of `key` (called under the record's shard lock).
    fn note(&self, key: &RecordKey, event: Event) {
        let name = (key.operation.as_str().into(), compact_key(key));
        ops::append(&mut self.history.entry(name).or_default(), event);
    }

    /// What `begin` writes over `current` does to the history: a new operation starts
    /// none, a reclaim appends its event (called under the record's shard lock).
    fn note_begin(&self, key: &RecordKey, current: &Record, record: &Record, now: UnixMillis) {
        if current.is_expired(now) {
            if !self.history.is_empty() {
                self.history
                    .remove(&(key.operation.as_str().into(), compact_key(key)));
            }
        } else {
            self.note(key, Event::reclaimed(record.attempt, now));
        }
    }
}

/// The [`RecordKey`] of `operation` and a [`compact_key`].
fn split_key(operation: &str, name: &[u8]) -> Option<RecordKey> {
    let len = u32::from_le_bytes(name.get(..4)?.try_into().ok()?) as usize;
    let client = std::str::from_utf8(name.get(4..4 + len)?).ok()?;
    let key = std::str::from_utf8(name.get(4 + len..)?).ok()?;
    Some(RecordKey::new(operation, client, key))
}

/// The client and the key of `key` as one byte string: the client's length (4 bytes,
/// little-endian), the client, then the key. Two different pairs never share a string.
fn compact_key(key: &RecordKey) -> Box<[u8]> {
    let client = key.client.as_bytes();
    let len = u32::try_from(client.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(4 + client.len() + key.key.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(client);
    out.extend_from_slice(key.key.as_bytes());
    out.into_boxed_slice()
}

/// A [`Record`] as the table keeps it.
#[derive(Debug)]
struct Slot {
    operation_id: OperationId,
    created_at: UnixMillis,
    expires_at: UnixMillis,
    fingerprint: Digest,
    attempt: u32,
    transactional: bool,
    /// The expiry bucket the client's tally counts the record in (`budget::bucket_of`),
    /// where its result's bytes are added; 0 when it is not counted.
    counted: u32,
    state: SlotState,
}

/// A fingerprint: the 32 bytes of a `sha256:<64 lowercase hex digits>` one (the form
/// idem computes), any other text as it is.
#[derive(Debug)]
enum Digest {
    Sha256([u8; 32]),
    Text(Box<str>),
}

/// [`RecordState`] as the table keeps it.
#[derive(Debug)]
enum SlotState {
    Processing {
        token: [u64; 2],
        until: UnixMillis,
    },
    /// The result, as [`encode_response`] writes it.
    Completed(Bytes),
    Released,
    Unknown(Box<str>),
}

impl Slot {
    /// The slot of `record`, counted in bucket `counted` (0: not counted).
    fn from_record(record: &Record, counted: u32) -> Slot {
        let state = match &record.state {
            RecordState::Processing { lease } => {
                let token = lease.token.as_u128();
                SlotState::Processing {
                    // Two halves keep the slot 8-byte aligned (a `u128` would make it 16).
                    token: [(token >> 64) as u64, token as u64],
                    until: lease.until,
                }
            }
            RecordState::Completed { response } => match encode_response(response) {
                Ok(encoded) => SlotState::Completed(encoded),
                // Only a result too large to frame (over 4 GiB of headers) fails, and
                // `complete` refuses those before they reach a slot.
                Err(_) => SlotState::Unknown("the stored result could not be kept".into()),
            },
            RecordState::Released => SlotState::Released,
            RecordState::Unknown { reason } => SlotState::Unknown(reason.as_str().into()),
        };
        Slot {
            operation_id: record.operation_id,
            created_at: record.created_at,
            expires_at: record.expires_at,
            fingerprint: Digest::of(&record.fingerprint),
            attempt: record.attempt,
            transactional: record.transactional,
            counted,
            state,
        }
    }

    fn to_record(&self) -> Result<Record, StoreError> {
        let state = match &self.state {
            SlotState::Processing { .. } => RecordState::Processing {
                lease: self.lease().unwrap_or(Lease {
                    token: OwnerToken::from_u128(0),
                    until: 0,
                }),
            },
            SlotState::Completed(encoded) => RecordState::Completed {
                response: decode_response(encoded)?,
            },
            SlotState::Released => RecordState::Released,
            SlotState::Unknown(reason) => RecordState::Unknown {
                reason: reason.to_string(),
            },
        };
        Ok(Record {
            operation_id: self.operation_id,
            fingerprint: self.fingerprint.to_string(),
            attempt: self.attempt,
            created_at: self.created_at,
            expires_at: self.expires_at,
            state,
            transactional: self.transactional,
        })
    }

    const fn is_expired(&self, now: UnixMillis) -> bool {
        self.expires_at <= now
    }

    fn lease(&self) -> Option<Lease> {
        match self.state {
            SlotState::Processing {
                token: [high, low],
                until,
            } => Some(Lease {
                token: OwnerToken::from_u128((u128::from(high) << 64) | u128::from(low)),
                until,
            }),
            _ => None,
        }
    }

    /// [`Record::is_live_owner`].
    fn is_live_owner(&self, token: OwnerToken, now: UnixMillis) -> bool {
        self.lease()
            .is_some_and(|l| l.token == token && l.is_live(now))
    }
}

impl Digest {
    const PREFIX: &'static str = "sha256:";

    fn of(text: &str) -> Digest {
        let lower_hex = |s: &str| {
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if let Some(hex_digits) = text.strip_prefix(Self::PREFIX)
            && lower_hex(hex_digits)
        {
            let mut bytes = [0; 32];
            if hex::decode_to_slice(hex_digits, &mut bytes).is_ok() {
                return Digest::Sha256(bytes);
            }
        }
        Digest::Text(text.into())
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Digest::Sha256(bytes) => {
                let mut hex_digits = [0; 64];
                // 32 bytes always fit 64 digits.
                let _ = hex::encode_to_slice(bytes, &mut hex_digits);
                f.write_str(Self::PREFIX)?;
                f.write_str(std::str::from_utf8(&hex_digits).map_err(|_| std::fmt::Error)?)
            }
            Digest::Text(text) => f.write_str(text),
        }
    }
}

/// A result as one buffer: the status (2 bytes), the number of headers (4 bytes), each
/// header as its name's length (4 bytes), the name, its value's length (4 bytes) and the
/// value, then the body. Lengths are little-endian. `TooLarge` only for a header list or
/// header longer than 4 GiB.
fn encode_response(response: &StoredResponse) -> Result<Bytes, StoreError> {
    let too_large = || StoreError::TooLarge {
        size: response.size(),
        limit: u32::MAX as usize,
    };
    let len = |n: usize| u32::try_from(n).map_err(|_| too_large());
    let size = 6 + response.headers.len() * 8 + response.size();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&response.status.to_le_bytes());
    out.extend_from_slice(&len(response.headers.len())?.to_le_bytes());
    for (name, value) in &response.headers {
        out.extend_from_slice(&len(name.as_str().len())?.to_le_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&len(value.len())?.to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(&response.body);
    // Exactly `size` bytes: the buffer is kept without spare capacity.
    Ok(Bytes::from(out))
}

/// The result that [`encode_response`] wrote; the header values and the body are slices
/// of `encoded`, not copies.
fn decode_response(encoded: &Bytes) -> Result<StoredResponse, StoreError> {
    let mut cursor = Cursor { encoded, at: 0 };
    let status = cursor.take(2)?;
    let status = u16::from_le_bytes([encoded[status.start], encoded[status.start + 1]]);
    let count = cursor.length()?;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name = cursor.length().and_then(|n| cursor.take(n))?;
        let name = HeaderName::from_bytes(&encoded[name])
            .map_err(|_| StoreError::Corrupt("a stored header name".into()))?;
        let value = cursor.length().and_then(|n| cursor.take(n))?;
        let value = HeaderValue::from_maybe_shared(encoded.slice(value))
            .map_err(|_| StoreError::Corrupt("a stored header value".into()))?;
        headers.push((name, value));
    }
    let body = encoded.slice(cursor.at..);
    Ok(StoredResponse {
        status,
        headers,
        body,
    })
}

/// A reading position in an encoded result.
struct Cursor<'a> {
    encoded: &'a Bytes,
    at: usize,
}

impl Cursor<'_> {
    /// The range of the next `n` bytes; `Corrupt` past the end.
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, StoreError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.encoded.len())
            .ok_or_else(|| StoreError::Corrupt("a stored result is cut short".into()))?;
        let range = self.at..end;
        self.at = end;
        Ok(range)
    }

    /// The next 4-byte little-endian length.
    fn length(&mut self) -> Result<usize, StoreError> {
        let range = self.take(4)?;
        let mut bytes = [0; 4];
        bytes.copy_from_slice(&self.encoded[range]);
        Ok(u32::from_le_bytes(bytes) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite() {
        crate::store::conformance::run(|| async { MemoryStore::new() }).await;
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![
                (
                    HeaderName::from_static("location"),
                    HeaderValue::from_static("/orders/ord_1"),
                ),
                (
                    HeaderName::from_static("x-custom"),
                    HeaderValue::from_bytes(b"\xe9t\xe9").unwrap(),
                ),
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static("</a>"),
                ),
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static(""),
                ),
            ],
            body: Bytes::from_static(b"{\"id\":\"ord_1\"}\n"),
        }
    }

    #[test]
    fn results_round_trip_byte_for_byte() {
        let stored = response();
        let encoded = encode_response(&stored).unwrap();
        assert_eq!(encoded.len(), 6 + 4 * 8 + stored.size());
        assert_eq!(decode_response(&encoded).unwrap(), stored);
        let empty = StoredResponse {
            status: 204,
            headers: Vec::new(),
            body: Bytes::new(),
        };
        assert_eq!(
            decode_response(&encode_response(&empty).unwrap()).unwrap(),
            empty
        );
    }

    #[test]
    fn a_cut_result_is_corrupt_not_a_panic() {
        let encoded = encode_response(&response()).unwrap();
        // Every prefix that ends inside the header list is refused; one that ends in the
        // body is a shorter body (the body has no length of its own).
        let headers_end = encoded.len() - response().body.len();
        for cut in 0..headers_end {
            let result = decode_response(&encoded.slice(..cut));
            assert!(
                matches!(result, Err(StoreError::Corrupt(_))),
                "cut at {cut}"
            );
        }
        let mut huge = encoded.to_vec();
        huge[2..6].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_response(&Bytes::from(huge)),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn fingerprints_are_kept_as_written() {
        let sha = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert!(matches!(Digest::of(&sha), Digest::Sha256(_)));
        assert_eq!(Digest::of(&sha).to_string(), sha);
        let upper = sha.to_uppercase().replace("SHA256", "sha256");
        for other in ["", "sha256:", "md5:abc", upper.as_str(), &sha[..70]] {
            assert!(matches!(Digest::of(other), Digest::Text(_)), "{other}");
            assert_eq!(Digest::of(other).to_string(), other);
        }
    }

    #[test]
    fn a_slot_is_small() {
        // The table holds the key's box (16 bytes) and the slot inline: keep both small.
        assert!(
            std::mem::size_of::<Slot>() <= 128,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }

    #[tokio::test]
    async fn operations_have_tables_of_their_own() {
        let store = MemoryStore::new();
        let new = NewRecord {
            operation_id: OperationId::new(),
            fingerprint: "f".into(),
            lease: Lease {
                token: OwnerToken::random(),
                until: 2_000,
            },
            expires_at: 10_000,
            transactional: false,
            holds_until: 2_000,
            budget: None,
        };
        for operation in ["a", "b"] {
            let key = RecordKey::new(operation, "c", "k");
            assert!(matches!(
                store.begin(&key, &new, 1_000).await.unwrap(),
                Begin::Started(_)
            ));
        }
        assert_eq!(store.len(), 2);
        // A client whose name ends like another's key: `ab` + `c` against `a` + `bc`.
        let first = RecordKey::new("a", "ab", "c");
        let second = RecordKey::new("a", "a", "bc");
        assert_ne!(compact_key(&first), compact_key(&second));
        assert_eq!(store.purge_expired(20_000).await.unwrap(), 2);
        assert!(store.is_empty());
    }
}
