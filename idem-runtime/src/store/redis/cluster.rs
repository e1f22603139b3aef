//! What the Redis store does beyond one server's script: the registration and its
//! budget on a cluster (where a client's accounting lives in another slot than its
//! records), scans that cover every master, and the wait for replicas after a claim.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::Value;

use super::connection::{Master, slot_of};
use super::{EXPIRY_MARGIN_MS, RedisStore, ReplicaWait, SCAN_BATCH, flagged, over_budget};
use crate::store::{
    Begin, ClientBudget, NewRecord, OwnerToken, Record, RecordKey, RecordStore, StoreError,
    UnixMillis,
};

impl RedisStore {
    /// The registration script for `key` under `budget` (`None`: nothing counted). On
    /// one server the client's accounting is kept in the same script; on a cluster
    /// (`elsewhere`) the script only writes the record's bucket, and the caller counts it
    /// in the client's slot.
    pub(super) async fn register(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        budget: Option<ClientBudget>,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let (how, bytes) = match budget {
            None => (String::new(), String::new()),
            Some(_) if self.layout.cluster() => ("elsewhere".to_owned(), String::new()),
            Some(budget) if budget.refuses_nothing() => ("count".to_owned(), String::new()),
            Some(budget) => (budget.records.to_string(), budget.bytes.to_string()),
        };
        let mut invocation = self.scripts.begin.key(self.hash_name(key));
        if budget.is_some() && !self.layout.cluster() {
            let (ends, counts) = self.layout.budget(&key.client);
            invocation.key(ends).key(counts);
        }
        invocation
            .arg(now)
            .arg(new.operation_id.to_string())
            .arg(&new.fingerprint)
            .arg(new.lease.token.to_string())
            .arg(new.lease.until)
            .arg(new.expires_at)
            .arg(new.holds_until)
            .arg(if new.transactional { "1" } else { "0" })
            .arg(EXPIRY_MARGIN_MS)
            .arg(self.layout.prefix())
            .arg(how)
            .arg(bytes);
        let mut conn = self.conn.clone();
        let answer: Value = self.bounded(invocation.invoke_async(&mut conn)).await?;
        if let Some(over) = over_budget(&answer) {
            return Ok(Begin::OverBudget(over));
        }
        match flagged(answer)? {
            (2, None) => Ok(Begin::Started(Record::started(new, now))),
            (1, Some(record)) => Ok(Begin::Started(record)),
            (0, Some(record)) => Ok(Begin::Exists(record)),
            _ => Err(StoreError::Corrupt(
                "the registration script answered in an unexpected shape".into(),
            )),
        }
    }

    /// `begin` on a cluster: the client's accounting is in its own slot, so the budget is
    /// checked before the registration (a read; near the budget only, where the handle
    /// asks the store to decide) and a new record counted after it (one more call).
    /// A key the client holds is never refused. Concurrent new keys of one client may
    /// each pass the check: the count overshoots by at most the requests in flight, as
    /// on one server. A count that fails after the record was written is logged and
    /// lost (the record is not counted; it still expires).
    pub(super) async fn begin_in_cluster(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        if let Some(budget) = new.budget.filter(|b| !b.refuses_nothing()) {
            let counted = self.client_usage(&key.client, budget.records, now).await?;
            if !budget.admits(&counted.usage) && self.get(key, now).await?.is_none() {
                return Ok(Begin::OverBudget(crate::store::OverBudget {
                    usage: counted.usage,
                    retry_at: counted.oldest_expiry.unwrap_or(now),
                }));
            }
        }
        let begun = self.register(key, new, new.budget, now).await?;
        // A new record (not a reclaimed one) is counted, until the expiry it was
        // registered with.
        let counted = match &begun {
            Begin::Started(r) if r.attempt == 1 && r.operation_id == new.operation_id => {
                new.budget.map(|_| r.expires_at)
            }
            _ => None,
        };
        if let Some(exp) = counted {
            let (ends, counts) = self.layout.budget(&key.client);
            let mut invocation = self.scripts.count.key(ends);
            invocation
                .key(counts)
                .arg(exp)
                .arg(now)
                .arg(EXPIRY_MARGIN_MS);
            let mut conn = self.conn.clone();
            let counted: Result<String, _> = self.bounded(invocation.invoke_async(&mut conn)).await;
            if let Err(error) = counted {
                tracing::warn!(client = %key.client, %error, "idem: a new record could not be counted for its client's budget (Redis Cluster); it is not counted");
            }
        }
        Ok(begun)
    }

    /// On a cluster, adds a result's `size` to its record's `bucket` in the client's slot,
    /// after the completion. A failure is logged: the result is stored, its size not
    /// counted.
    pub(super) async fn account_in_cluster(
        &self,
        key: &RecordKey,
        bucket: &str,
        size: usize,
        now: UnixMillis,
    ) {
        let (_, counts) = self.layout.budget(&key.client);
        let mut invocation = self.scripts.account.key(counts);
        invocation.arg(bucket).arg(size).arg(now);
        let mut conn = self.conn.clone();
        let done: Result<i64, _> = self.bounded(invocation.invoke_async(&mut conn)).await;
        if let Err(error) = done {
            tracing::warn!(client = %key.client, %error, "idem: a result's size could not be counted for its client's budget (Redis Cluster)");
        }
    }

    /// Waits until the claim of `key` under `token` is on the replicas that
    /// [`RedisStore::with_replica_wait`] asks for (`WAIT` on the master that holds it,
    /// on the connection that wrote it). On a cluster, a master that has fewer replicas
    /// than asked for now (its replica was just promoted in a failover, or is down) is
    /// waited for by the ones it has, none if it has none (with a warning, at most once
    /// a minute): new keys go on after a failover rather than fail until an operator
    /// brings a replica back. Not acknowledged in time: the claim is released (so that
    /// the retry may claim the key at once) and the call fails as unavailable.
    pub(super) async fn acknowledged(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let Some(wait) = self.replica_wait else {
            return Ok(());
        };
        let name = self.hash_name(key);
        let asked = usize::try_from(wait.replicas).unwrap_or(usize::MAX);
        let mut wanted = asked;
        if self.layout.cluster()
            && let Some(has) = self.replicas_of(&name, false).await
        {
            wanted = wanted.min(has);
        }
        let acked = if wanted == 0 {
            0
        } else {
            self.wait_for(&name, wanted, wait).await
        };
        if acked >= wanted && wanted > 0 {
            return Ok(());
        }
        // Fewer than asked for: the cluster may have changed since it was last read.
        if self.layout.cluster()
            && let Some(has) = self.replicas_of(&name, wanted > 0).await
            && acked >= asked.min(has)
        {
            if has < asked {
                unreplicated(&name, has, asked);
            }
            return Ok(());
        }
        if let Err(error) = self.release(key, token, now).await {
            tracing::warn!(%error, "idem: a claim no replica acknowledged could not be released; its lease will end");
        }
        Err(StoreError::unavailable(format!(
            "{acked} of the {wanted} replica(s) asked for acknowledged the claim within {} ms",
            wait.timeout.as_millis()
        )))
    }

    /// `WAIT` for `replicas` on the master of `name`: how many acknowledged (0 when the
    /// call failed).
    async fn wait_for(&self, name: &str, replicas: usize, wait: ReplicaWait) -> usize {
        let millis = u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(millis);
        let mut conn = self.conn.clone();
        let acked = tokio::time::timeout(
            self.call_timeout + wait.timeout,
            conn.on_master_of(name, cmd),
        )
        .await;
        match acked {
            Ok(Ok(Value::Int(n))) => usize::try_from(n).unwrap_or(0),
            _ => 0,
        }
    }

    /// How many replicas that are not failing the master of `name`'s slot has, from the
    /// cluster's topology as read at most [`TOPOLOGY_FOR`] ago (`fresh`: read now);
    /// `None` when it cannot be read or no master serves the slot.
    async fn replicas_of(&self, name: &str, fresh: bool) -> Option<usize> {
        let slot = slot_of(name.as_bytes());
        if !fresh {
            let topology = self.topology.lock().unwrap_or_else(|p| p.into_inner());
            if topology
                .read_at
                .is_some_and(|at| at.elapsed() < TOPOLOGY_FOR)
            {
                return topology.replicas_of(slot);
            }
        }
        let mut conn = self.conn.clone();
        let masters = self.bounded(conn.masters()).await.ok()?;
        let mut topology = self.topology.lock().unwrap_or_else(|p| p.into_inner());
        *topology = Topology {
            masters,
            read_at: Some(Instant::now()),
        };
        topology.replicas_of(slot)
    }

    /// A scan of the names matching `pattern` on every master of a cluster (a `SCAN` of
    /// its own on each), or on the one server: [`RedisStore::next_names`] gives its
    /// batches.
    pub(super) async fn scan(&self, pattern: &str) -> Result<Scan, StoreError> {
        let mut conn = self.conn.clone();
        let masters = self.bounded(conn.masters()).await?;
        Ok(Scan {
            pattern: pattern.to_owned(),
            masters,
            at: 0,
            cursor: 0,
            failed: 0,
            last_error: None,
        })
    }

    /// The next batch of `scan`'s names (as bytes: a foreign name that is not UTF-8 must
    /// not stop a scan), or `None` at its end. A cluster master that fails is skipped
    /// with a warning (it may be failing over; its replica is scanned once promoted),
    /// unless every master failed.
    pub(super) async fn next_names(
        &self,
        scan: &mut Scan,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let mut conn = self.conn.clone();
        while let Some(master) = scan.masters.get(scan.at) {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(scan.cursor)
                .arg("MATCH")
                .arg(&scan.pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let step = self.bounded(conn.on(master, cmd)).await.and_then(|v| {
                redis::from_redis_value::<(u64, Vec<Vec<u8>>)>(v)
                    .map_err(|e| StoreError::Corrupt(format!("a SCAN answer: {e}")))
            });
            let (next, names) = match step {
                Ok(step) => step,
                Err(error) if self.layout.cluster() => {
                    tracing::warn!(master = %format!("{}:{}", master.host, master.port), %error, "idem: a Redis Cluster master could not be scanned; skipped");
                    scan.failed += 1;
                    scan.last_error = Some(error);
                    (0, Vec::new())
                }
                Err(error) => return Err(error),
            };
            scan.cursor = next;
            if next == 0 {
                scan.at += 1;
            }
            if !names.is_empty() {
                return Ok(Some(names));
            }
        }
        match scan.last_error.take() {
            Some(error) if scan.failed == scan.masters.len() => Err(error),
            _ => Ok(None),
        }
    }

    /// `names` in batches that one script may take: one batch on one server; on a
    /// cluster, a batch per hash tag (names without one, which are no records of this
    /// layout, each alone).
    pub(super) fn by_slot(&self, names: Vec<Vec<u8>>) -> Vec<Vec<Vec<u8>>> {
        if !self.layout.cluster() {
            return vec![names];
        }
        let mut batches: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
        let mut alone = Vec::new();
        for name in names {
            match self.layout.tag_of(&name) {
                Some(tag) => batches.entry(tag.to_vec()).or_default().push(name),
                None => alone.push(vec![name]),
            }
        }
        batches.into_values().chain(alone).collect()
    }
}

/// A scan in progress ([`RedisStore::scan`]).
pub(super) struct Scan {
    pattern: String,
    masters: Vec<Master>,
    /// The master being scanned.
    at: usize,
    cursor: u64,
    failed: usize,
    last_error: Option<StoreError>,
}

/// How long a cluster's topology is trusted for a claim's wait before it is read again.
const TOPOLOGY_FOR: Duration = Duration::from_secs(1);

/// What a store last read of its cluster's masters ([`RedisStore::acknowledged`]).
#[derive(Debug, Default)]
pub(super) struct Topology {
    masters: Vec<Master>,
    read_at: Option<Instant>,
}

impl Topology {
    fn replicas_of(&self, slot: u16) -> Option<usize> {
        self.masters
            .iter()
            .find(|m| m.serves(slot))
            .map(|m| m.replicas)
    }
}

/// Says that claims on `name`'s master wait for fewer replicas than asked for, at most
/// once a minute in a process.
fn unreplicated(name: &str, has: usize, asked: usize) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
        return;
    }
    *last = Some(Instant::now());
    tracing::warn!(record = %name, replicas = has, asked, "idem: a Redis Cluster master has fewer replicas than claims wait for (a failover, or a replica down): its claims wait for the replicas it has; a failover of it now may lose them");
}
