//! The step journal in Redis ([`crate::store::Step`]): each step is a field of its record's
//! hash, `step:<position>`, holding `{"op", "name", "state", "value", "calls"}` as JSON, so
//! that it lives, expires and is purged with the record, shares its hash slot, and is
//! written under the same fence by one script. A field whose `op` is another operation's
//! (the key's earlier operation, before its TTL passed) is not this journal's.
//!
//! A staged delivery's position is kept in the record's field `staged` (a list) until the
//! record completes; a completion with a success makes each a member
//! `<position>:<hash name>` of the sorted set `<prefix>/outbox` (on a cluster, the outbox
//! of the record's hash tag, `<prefix>/outbox/{<bucket>}`), scored by when it is next
//! due, outside the prefix's records so that listing and purging never meet it. A member
//! whose record is gone is removed when the outbox's worker meets it.

use std::collections::HashMap;

use redis::{Script, Value};
use serde::{Deserialize, Serialize};

use futures_util::{StreamExt, stream};

use super::RedisStore;
use super::record::fields;
use crate::OperationId;
use crate::store::{
    Delivery, Due, OwnerToken, RecordKey, RecordState, Step, StepState, StepWrite, StoreError,
    UnixMillis, step_changed,
};

/// How many outboxes (a cluster has one per bucket) are read at once.
const OUTBOXES_AT_ONCE: usize = 32;

/// The prefix of a step's field in the record's hash.
const FIELD: &str = "step:";

/// Lua helpers of the journal's scripts: a step's field, read for operation `op`.
const STEP: &str = r"
local function is_delivery(state)
  return state == 'staged' or state == 'delivered' or state == 'given_up'
end
local function load(key, field, op)
  local raw = redis.call('HGET', key, field)
  if not raw then return false, raw end
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' and decoded.op == op then return decoded, raw end
  return false, raw
end
";

/// A write ([`Step::apply`]): KEYS[1] the record; ARGV: token,
/// operation id, position, name, state, value (empty when pending), calls of a new step.
/// Answers `{1, step}` with the step as written (or as it stands), `{2, step}` when the
/// position holds another name (or kind), `{0}` when the record is not this operation's,
/// processing under the token.
const WRITE: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'operation_id')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[1] or cur[3] ~= ARGV[2] then
  return {0}
end
local field = 'step:' .. ARGV[3]
local step, raw = load(KEYS[1], field, ARGV[2])
if not step then
  step = {op = ARGV[2], name = ARGV[4], state = ARGV[5], value = ARGV[6],
    calls = tonumber(ARGV[7]), next_at = 0}
  if ARGV[5] == 'staged' then
    local staged = redis.call('HGET', KEYS[1], 'staged')
    redis.call('HSET', KEYS[1], 'staged', (staged and (staged .. ',') or '') .. ARGV[3])
  end
elseif step.name ~= ARGV[4] or is_delivery(step.state) ~= is_delivery(ARGV[5]) then
  return {2, raw}
elseif step.state == 'pending' then
  if ARGV[5] == 'pending' then
    step.calls = step.calls + 1
  else
    step.state = ARGV[5]
    step.value = ARGV[6]
  end
else
  return {1, raw}
end
local encoded = cjson.encode(step)
redis.call('HSET', KEYS[1], field, encoded)
return {1, encoded}
";

/// A claim ([`Step::claimed`]): KEYS[1] the record, KEYS[2] the outbox; ARGV: operation
/// id, position, the claim's end, now. `{1, step}`, or `{0}` when it is not staged or not
/// due.
const CLAIM: &str = r"
local field = 'step:' .. ARGV[2]
local step = load(KEYS[1], field, ARGV[1])
if not step or step.state ~= 'staged' or tonumber(step.next_at or 0) > tonumber(ARGV[4]) then
  return {0}
end
step.calls = step.calls + 1
step.next_at = tonumber(ARGV[3])
local encoded = cjson.encode(step)
redis.call('HSET', KEYS[1], field, encoded)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2] .. ':' .. KEYS[1])
return {1, encoded}
";

/// A settlement ([`Step::settled`]): KEYS[1] the record, KEYS[2] the outbox; ARGV:
/// operation id, position, the claim, the new state, when it is next due. `{1, step}`, or
/// `{0}` when it is no longer staged under that claim.
const SETTLE: &str = r"
local field = 'step:' .. ARGV[2]
local step = load(KEYS[1], field, ARGV[1])
if not step or step.state ~= 'staged' or tonumber(step.calls) ~= tonumber(ARGV[3]) then
  return {0}
end
step.state = ARGV[4]
step.next_at = tonumber(ARGV[5])
local encoded = cjson.encode(step)
redis.call('HSET', KEYS[1], field, encoded)
local member = ARGV[2] .. ':' .. KEYS[1]
if ARGV[4] == 'staged' then
  redis.call('ZADD', KEYS[2], ARGV[5], member)
else
  redis.call('ZREM', KEYS[2], member)
end
return {1, encoded}
";

/// The journal's scripts.
pub(super) struct JournalScripts {
    write: Script,
    claim: Script,
    settle: Script,
}

impl JournalScripts {
    pub(super) fn new() -> JournalScripts {
        let with = |body: &str| Script::new(&[STEP, body].concat());
        JournalScripts {
            write: with(WRITE),
            claim: with(CLAIM),
            settle: with(SETTLE),
        }
    }
}

/// A step's field, as the script writes it.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    op: String,
    name: String,
    state: String,
    #[serde(default)]
    value: String,
    calls: u32,
    #[serde(default)]
    next_at: u64,
}

impl Stored {
    /// The step at `index`, if the field is `operation_id`'s.
    fn step(self, index: u32, operation_id: &str) -> Result<Option<Step>, StoreError> {
        if self.op != operation_id {
            return Ok(None);
        }
        let value = (self.state != "pending").then_some(self.value);
        Ok(Some(Step {
            index,
            name: self.name,
            state: StepState::from_parts(&self.state, value)?,
            calls: self.calls,
            next_at: self.next_at,
        }))
    }
}

/// The step in a field's JSON `raw`.
fn parse(raw: &[u8], index: u32, operation_id: &str) -> Result<Option<Step>, StoreError> {
    let stored: Stored = serde_json::from_slice(raw).map_err(|error| {
        StoreError::Corrupt(format!("journal step {index} does not read: {error}"))
    })?;
    stored.step(index, operation_id)
}

/// The journal of `operation_id` among a record's `fields`, in order.
pub(super) fn steps_in(
    fields: &HashMap<String, Vec<u8>>,
    operation_id: OperationId,
) -> Result<Vec<Step>, StoreError> {
    let id = operation_id.to_string();
    let mut steps = Vec::new();
    for (field, raw) in fields {
        let Some(index) = field.strip_prefix(FIELD) else {
            continue;
        };
        let index: u32 = index
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("`{field}` is no journal step")))?;
        steps.extend(parse(raw, index, &id)?);
    }
    steps.sort_by_key(|step| step.index);
    Ok(steps)
}

impl RedisStore {
    /// [`crate::store::RecordStore::steps`].
    pub(super) async fn read_steps(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
    ) -> Result<Vec<Step>, StoreError> {
        let mut conn = self.conn.clone();
        let answer: Value = self
            .bounded(
                redis::cmd("HGETALL")
                    .arg(self.hash_name(key))
                    .query_async(&mut conn),
            )
            .await?;
        steps_in(&fields(answer)?, operation_id)
    }

    /// [`crate::store::RecordStore::write_step`].
    pub(super) async fn write_one_step(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        write: &StepWrite,
    ) -> Result<Step, StoreError> {
        write.check()?;
        let id = write.operation_id.to_string();
        let mut invocation = self.scripts.journal.write.key(self.hash_name(key));
        invocation
            .arg(token.to_string())
            .arg(&id)
            .arg(write.index)
            .arg(&write.name)
            .arg(write.state.as_str())
            .arg(write.state.value().unwrap_or(""))
            .arg(u32::from(!write.state.is_delivery()));
        match self.step_script(invocation, write.index, &id).await? {
            (1, Some(step)) => Ok(step),
            (2, Some(step)) => Err(step_changed(&step, write)),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// Runs a journal script that answers `{flag}` or `{flag, step}`: the flag, and the
    /// step at `index` of `id`'s journal.
    async fn step_script(
        &self,
        invocation: redis::ScriptInvocation<'_>,
        index: u32,
        id: &str,
    ) -> Result<(i64, Option<Step>), StoreError> {
        let mut conn = self.conn.clone();
        let answer: Vec<Value> = self.bounded(invocation.invoke_async(&mut conn)).await?;
        let shape =
            || StoreError::Corrupt("the journal's script answered in an unexpected shape".into());
        let mut answer = answer.into_iter();
        let flag = match answer.next() {
            Some(Value::Int(flag)) => flag,
            _ => return Err(shape()),
        };
        match answer.next() {
            Some(Value::BulkString(raw)) => {
                let step = parse(&raw, index, id)?.ok_or_else(shape)?;
                Ok((flag, Some(step)))
            }
            None => Ok((flag, None)),
            Some(_) => Err(shape()),
        }
    }

    /// [`crate::store::OperatorStore::claim_delivery`].
    pub(super) async fn claim(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<Step, StoreError> {
        let id = operation_id.to_string();
        let mut invocation = self.scripts.journal.claim.key(self.hash_name(key));
        invocation
            .key(self.layout.outbox(key))
            .arg(&id)
            .arg(index)
            .arg(until)
            .arg(now);
        match self.step_script(invocation, index, &id).await? {
            (1, Some(step)) => Ok(step),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// [`crate::store::OperatorStore::settle_delivery`].
    pub(super) async fn settle(
        &self,
        key: &RecordKey,
        operation_id: OperationId,
        index: u32,
        claim: u32,
        delivery: Delivery,
    ) -> Result<Step, StoreError> {
        let (state, next_at) = delivery.settles_as();
        let id = operation_id.to_string();
        let mut invocation = self.scripts.journal.settle.key(self.hash_name(key));
        invocation
            .key(self.layout.outbox(key))
            .arg(&id)
            .arg(index)
            .arg(claim)
            .arg(state)
            .arg(next_at);
        match self.step_script(invocation, index, &id).await? {
            (1, Some(step)) => Ok(step),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// [`crate::store::OperatorStore::due_deliveries`]: the outbox's members due at `now`
    /// (up to four times `limit` of them), each checked against its record. A member
    /// whose record is gone (or is another operation's now), or whose step is no longer
    /// staged, is removed; one claimed meanwhile is left.
    pub(super) async fn due(&self, limit: u32, now: UnixMillis) -> Result<Vec<Due>, StoreError> {
        let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
        // One outbox on one server, one per bucket on a cluster: read a few at a time.
        let mut outboxes = stream::iter(self.layout.outboxes())
            .map(|outbox| async move {
                let members = self.due_members(&outbox, limit, now).await;
                (outbox, members)
            })
            .buffered(OUTBOXES_AT_ONCE);
        let mut due = Vec::new();
        while let Some((outbox, members)) = outboxes.next().await {
            for member in members? {
                if due.len() >= wanted {
                    return Ok(due);
                }
                match self.due_member(&member, now).await? {
                    Member::Due(found) => due.push(*found),
                    Member::NotYet => {}
                    Member::Gone => self.outbox_remove(&outbox, &member).await?,
                }
            }
        }
        Ok(due)
    }

    /// The members of `outbox` due at `now`, four times `limit` at most.
    async fn due_members(
        &self,
        outbox: &str,
        limit: u32,
        now: UnixMillis,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut conn = self.conn.clone();
        self.bounded(
            redis::cmd("ZRANGEBYSCORE")
                .arg(outbox)
                .arg("-inf")
                .arg(now)
                .arg("LIMIT")
                .arg(0)
                .arg(limit.saturating_mul(4))
                .query_async(&mut conn),
        )
        .await
    }

    /// What the outbox's `member` stands for at `now`.
    async fn due_member(&self, member: &[u8], now: UnixMillis) -> Result<Member, StoreError> {
        let parsed = std::str::from_utf8(member)
            .ok()
            .and_then(|m| m.split_once(':'))
            .and_then(|(index, name)| Some((index.parse::<u32>().ok()?, name)));
        let Some((index, name)) = parsed else {
            tracing::warn!(member = %String::from_utf8_lossy(member), "idem: a member of the Redis outbox is not one of idem's; removed");
            return Ok(Member::Gone);
        };
        let Some(key) = self.layout.key_of(name.as_bytes()) else {
            return Ok(Member::Gone);
        };
        let mut conn = self.conn.clone();
        let answer: Value = self
            .bounded(redis::cmd("HGETALL").arg(name).query_async(&mut conn))
            .await?;
        let fields = fields(answer)?;
        let Some(record) = super::decode(&fields)?.filter(|r| !r.is_expired(now)) else {
            return Ok(Member::Gone);
        };
        // A member is made by a completion with a success: a record in another state is
        // a later operation under the same key (the member is stale).
        let succeeded = matches!(&record.state, RecordState::Completed { response } if (200..300).contains(&response.status));
        if !succeeded {
            return Ok(Member::Gone);
        }
        let step = steps_in(&fields, record.operation_id)?
            .into_iter()
            .find(|s| s.index == index);
        match step {
            Some(step) if matches!(step.state, StepState::Staged(_)) && step.next_at <= now => {
                Ok(Member::Due(Box::new(Due {
                    key,
                    operation_id: record.operation_id,
                    step,
                })))
            }
            Some(step) if matches!(step.state, StepState::Staged(_)) => Ok(Member::NotYet),
            _ => Ok(Member::Gone),
        }
    }

    async fn outbox_remove(&self, outbox: &str, member: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: Value = self
            .bounded(
                redis::cmd("ZREM")
                    .arg(outbox)
                    .arg(member)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }
}

/// What an outbox member stands for.
enum Member {
    /// A delivery due now.
    Due(Box<Due>),
    /// Claimed by a worker meanwhile (its score moved on): later.
    NotYet,
    /// Its record is gone, or finished without a success, or it is no longer staged.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::{self, new_record, redis as live};
    use crate::store::{OperatorStore, RecordStore};

    /// A step field that is not a step, or is not JSON, is a record the store cannot read
    /// (never a panic); a write over a field that is not JSON replaces it. A member of the
    /// outbox that is not idem's, or whose record is gone, is dropped by the worker's
    /// listing, which goes on.
    #[tokio::test]
    async fn foreign_journal_fields_and_outbox_members_are_refused_or_dropped() {
        let Some(url) = live::url_or_skip("the Redis journal").await else {
            return;
        };
        let store = live::scratch_store(&url).await;
        let mut conn = store.connection().clone();
        let k = RecordKey::new("op", "c", "journal");
        let new = new_record("sha256:a", conformance::T0);
        store.begin(&k, &new, conformance::T0).await.unwrap();
        let hset = |field: &'static str, value: &'static str| {
            redis::cmd("HSET")
                .arg(store.hash_name(&k))
                .arg(field)
                .arg(value)
                .clone()
        };
        let _: () = hset("step:0", "not json")
            .query_async(&mut conn)
            .await
            .unwrap();
        let read = store.steps(&k, new.operation_id, conformance::T0).await;
        assert!(matches!(read, Err(StoreError::Corrupt(_))), "{read:?}");
        let write = StepWrite {
            operation_id: new.operation_id,
            index: 0,
            name: "charge".into(),
            state: StepState::Pending,
        };
        let step = store
            .write_step(&k, new.lease.token, &write, conformance::T0)
            .await
            .unwrap();
        assert_eq!((step.name.as_str(), step.calls), ("charge", 1));
        let _: () = hset("step:x", "{}").query_async(&mut conn).await.unwrap();
        let read = store.steps(&k, new.operation_id, conformance::T0).await;
        assert!(matches!(read, Err(StoreError::Corrupt(_))), "{read:?}");

        let outbox = store.layout.outbox(&RecordKey::new("op", "c", "gone"));
        let gone = format!("0:{}", store.hash_name(&RecordKey::new("op", "c", "gone")));
        for member in ["not a member", "7:not-a-name", gone.as_str()] {
            let _: () = redis::cmd("ZADD")
                .arg(&outbox)
                .arg(0)
                .arg(member)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let due = store.due_deliveries(10, conformance::T0).await.unwrap();
        assert_eq!(due, vec![]);
        let left: u64 = redis::cmd("ZCARD")
            .arg(&outbox)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(left, 0, "dropped");
    }
}
