//! The step journal in Redis ([`crate::store::Step`]): each step is a field of its record's
//! hash, `step:<position>`, holding `{"op", "name", "state", "value", "calls"}` as JSON, so
//! that it lives, expires and is purged with the record, shares its hash slot, and is
//! written under the same fence by one script. A field whose `op` is another operation's
//! (the key's earlier operation, before its TTL passed) is not this journal's.

use std::collections::HashMap;

use redis::Value;
use serde::{Deserialize, Serialize};

use super::{RedisStore, fields};
use crate::OperationId;
use crate::store::{OwnerToken, RecordKey, Step, StepState, StepWrite, StoreError, step_changed};

/// The prefix of a step's field in the record's hash.
const FIELD: &str = "step:";

/// A write ([`Step::apply`]): KEYS[1] the record; ARGV: token, operation id, position,
/// name, state, value (empty when pending). Answers `{1, step}` with the step as written
/// (or as it stands), `{2, step}` when the position holds another name, `{0}` when the
/// record is not this operation's, processing under the token.
pub(super) const WRITE_STEP: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'state', 'token', 'operation_id')
if cur[1] ~= 'processing' or cur[2] ~= ARGV[1] or cur[3] ~= ARGV[2] then
  return {0}
end
local field = 'step:' .. ARGV[3]
local raw = redis.call('HGET', KEYS[1], field)
local step = false
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' and decoded.op == ARGV[2] then step = decoded end
end
if not step then
  step = {op = ARGV[2], name = ARGV[4], state = ARGV[5], value = ARGV[6], calls = 1}
elseif step.name ~= ARGV[4] then
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

/// A step's field, as the script writes it.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    op: String,
    name: String,
    state: String,
    #[serde(default)]
    value: String,
    calls: u32,
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
        let mut invocation = self.scripts.write_step.key(self.hash_name(key));
        invocation
            .arg(token.to_string())
            .arg(&id)
            .arg(write.index)
            .arg(&write.name)
            .arg(write.state.as_str())
            .arg(write.state.value().unwrap_or(""));
        let mut conn = self.conn.clone();
        let answer: Vec<Value> = self.bounded(invocation.invoke_async(&mut conn)).await?;
        let shape =
            || StoreError::Corrupt("the journal's script answered in an unexpected shape".into());
        let mut answer = answer.into_iter();
        let flag = match answer.next() {
            Some(Value::Int(flag)) => flag,
            _ => return Err(shape()),
        };
        let raw = match answer.next() {
            Some(Value::BulkString(raw)) => Some(raw),
            None => None,
            Some(_) => return Err(shape()),
        };
        match (flag, raw) {
            (0, None) => Err(StoreError::LeaseLost),
            (flag @ (1 | 2), Some(raw)) => {
                let step = parse(&raw, write.index, &id)?.ok_or_else(shape)?;
                if flag == 2 {
                    return Err(step_changed(&step, write));
                }
                Ok(step)
            }
            _ => Err(shape()),
        }
    }
}
