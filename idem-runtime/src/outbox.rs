//! The outbox: effects that must happen only once an operation has completed — an
//! e-mail, a webhook, a message — staged by the handler in its step journal
//! ([`Journal::after_commit`](crate::Journal::after_commit)) and delivered afterwards by a
//! worker, under the step's downstream key, with backoff, until delivered or given up.
//!
//! A staged step goes out only once its operation's record is completed with a success
//! (2xx): in the transactional mode that record commits with the business writes, so a
//! rolled-back attempt delivers nothing, and a resumed one stages the same step again (by
//! position and name: once). A worker claims each due delivery with one compare-and-set,
//! so that one of many instances sends it; its claim lasts the delivery's timeout, after
//! which another worker may send it again, under the same key, which the other system
//! deduplicates.
//!
//! ```
//! use std::time::Duration;
//! use idem_runtime::journal::{CallError, DownstreamKey};
//! use idem_runtime::{Idem, identity, store::MemoryStore};
//! # use idem_runtime::enforce::Contracted;
//! # pub mod create_order { pub struct Operation; }
//! # impl Contracted for create_order::Operation {
//! #     const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER;
//! # }
//!
//! #[derive(serde::Deserialize)]
//! struct Receipt { to: String, order: String }
//!
//! /// Sends the receipt with `key` as the mail service's idempotency key.
//! async fn send_receipt(receipt: Receipt, key: DownstreamKey) -> Result<(), CallError<String>> {
//!     # let _ = (receipt.to, receipt.order, key);
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
//!     // The handler of `create_order` stages `journal.after_commit("receipt", &receipt)`.
//!     .deliver::<create_order::Operation, _, _, _, _>("receipt", send_receipt)
//!     .build();
//! let outbox = idem.spawn_outbox(Duration::from_secs(1));
//! # outbox.abort();
//! # }
//! ```
//!
//! | the deliverer says | what happens |
//! |---|---|
//! | `Ok(())` | delivered: never sent again |
//! | [`CallError::Unknown`] (or it outlasts [`DeliveryPolicy::timeout`]) | due again after a backoff ([`DeliveryPolicy`]), under the same key; given up after [`DeliveryPolicy::max_deliveries`] |
//! | [`CallError::Definite`] (or the payload no longer reads as its type) | given up at once |
//!
//! A step given up stays in the journal, with its payload, for an operator: `idem ops show`
//! lists it. A staged step with no deliverer registered under this handle stays staged
//! (counted in [`OutboxPass::unregistered`]) until one is, or its record expires.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::Idem;
use crate::attempt::{CallError, DownstreamKey};
use crate::idem::IdemBuilder;
use crate::operation::Contracted;
use crate::store::{Delivery, Due, StoreError, UnixMillis};
use crate::telemetry::{FIELD_OPERATION_ID, FIELD_STEP_CALL, FIELD_STEP_NAME};

/// How many due deliveries one pass asks for.
const PAGE: u32 = 100;

/// The span of one delivery of a staged step (the payload is never recorded).
pub const SPAN_DELIVERY: &str = "idem.delivery";

/// How staged deliveries are sent and retried ([`IdemBuilder::delivery_policy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryPolicy {
    /// The most times one step is sent before it is given up.
    pub max_deliveries: u32,
    /// The wait before the second delivery; each later one waits twice as long, up to
    /// [`DeliveryPolicy::max_backoff`], half of it random (equal jitter).
    pub first_backoff: Duration,
    /// The longest wait between two deliveries of one step.
    pub max_backoff: Duration,
    /// How long one delivery may take; a delivery that takes longer counts as an unknown
    /// outcome. It is also how long a worker's claim on the delivery lasts.
    pub timeout: Duration,
}

impl Default for DeliveryPolicy {
    /// 10 deliveries at most, 1 s then doubling up to 5 minutes apart, 30 s each.
    fn default() -> DeliveryPolicy {
        DeliveryPolicy {
            max_deliveries: 10,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            timeout: Duration::from_secs(30),
        }
    }
}

impl DeliveryPolicy {
    /// The policy with at most `max` deliveries of a step (at least 1).
    #[must_use]
    pub fn max_deliveries(mut self, max: u32) -> DeliveryPolicy {
        self.max_deliveries = max.max(1);
        self
    }

    /// The policy with waits from `first` up to `max` between deliveries.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> DeliveryPolicy {
        self.first_backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// The policy with `timeout` for one delivery.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> DeliveryPolicy {
        self.timeout = timeout;
        self
    }

    /// The wait after the `sent`-th delivery of a step failed (1 for the first), in
    /// milliseconds: `first_backoff · 2^(sent-1)`, at most `max_backoff`, its second half
    /// random.
    fn backoff_ms(&self, sent: u32) -> u64 {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let doubling = 1u64 << sent.saturating_sub(1).min(40);
        let full = ms(self.first_backoff)
            .saturating_mul(doubling)
            .min(ms(self.max_backoff));
        let random = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        full / 2 + random % (full / 2 + 1)
    }
}

/// Why a delivery did not go through.
enum Failure {
    /// The other system refused it, or its payload no longer reads: given up.
    Definite(String),
    /// Its outcome is not known: due again later.
    Unknown(String),
}

/// One registered deliverer: the operation and step it sends, type-erased.
type Send = Arc<
    dyn Fn(String, DownstreamKey) -> BoxFuture<'static, Result<(), Failure>>
        + std::marker::Send
        + Sync,
>;

/// The deliverers registered under a handle, and their policy.
#[derive(Clone, Default)]
pub(crate) struct Deliverers {
    policy: DeliveryPolicy,
    by_step: Vec<(String, String, Send)>,
}

impl fmt::Debug for Deliverers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<_> = self
            .by_step
            .iter()
            .map(|(op, step, _)| format!("{op}/{step}"))
            .collect();
        f.debug_struct("Deliverers")
            .field("policy", &self.policy)
            .field("steps", &steps)
            .finish()
    }
}

impl Deliverers {
    fn find(&self, operation: &str, step: &str) -> Option<&Send> {
        self.by_step
            .iter()
            .find(|(op, name, _)| op == operation && name == step)
            .map(|(_, _, send)| send)
    }
}

impl IdemBuilder {
    /// Registers `deliver` as the sender of the steps named `step` that handlers of the
    /// operation `C` stage with [`Journal::after_commit`](crate::Journal::after_commit):
    /// the outbox's worker ([`Idem::spawn_outbox`]) calls it with the staged payload (read
    /// back as a `T`) and the step's [`DownstreamKey`], which it must send as the other
    /// system's idempotency key. Registering the same operation and step again replaces
    /// the deliverer.
    pub fn deliver<C, T, E, F, Fut>(mut self, step: &str, deliver: F) -> Self
    where
        C: Contracted,
        T: DeserializeOwned + std::marker::Send + 'static,
        E: fmt::Debug + std::marker::Send + 'static,
        F: Fn(T, DownstreamKey) -> Fut + std::marker::Send + Sync + 'static,
        Fut: Future<Output = Result<(), CallError<E>>> + std::marker::Send + 'static,
    {
        let send: Send = Arc::new(move |payload: String, key: DownstreamKey| {
            let value: T = match serde_json::from_str(&payload) {
                Ok(value) => value,
                Err(error) => {
                    let why = format!(
                        "the staged payload does not read as the deliverer's type: {error}"
                    );
                    return Box::pin(std::future::ready(Err(Failure::Definite(why))));
                }
            };
            let sent = deliver(value, key);
            Box::pin(async move {
                sent.await.map_err(|error| match error {
                    CallError::Definite(error) => Failure::Definite(format!("{error:?}")),
                    CallError::Unknown(why) => Failure::Unknown(why),
                })
            })
        });
        let operation = C::CONTRACT.operation.to_string();
        let deliverers = self.deliverers_mut();
        deliverers
            .by_step
            .retain(|(op, name, _)| !(*op == operation && name == step));
        deliverers.by_step.push((operation, step.to_owned(), send));
        self
    }

    /// How staged deliveries are retried ([`DeliveryPolicy::default`] unless set).
    pub fn delivery_policy(mut self, policy: DeliveryPolicy) -> Self {
        self.deliverers_mut().policy = policy;
        self
    }
}

/// What one pass of the outbox did ([`Idem::deliver_due`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxPass {
    /// Due deliveries found.
    pub due: u64,
    /// Delivered by this pass.
    pub delivered: u64,
    /// Failed with an unknown outcome: due again after a backoff.
    pub retried: u64,
    /// Given up by this pass: failed definitely, or too many times.
    pub given_up: u64,
    /// Claimed or settled by another worker first.
    pub lost: u64,
    /// Left staged: no deliverer is registered for them under this handle.
    pub unregistered: u64,
    /// The store failed while delivering them; the next pass tries again.
    pub failed: u64,
}

impl Idem {
    /// One pass of the outbox: sends every delivery that is due (see the
    /// [module docs](crate::outbox)), up to a hundred, one after another.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store cannot list the due deliveries; a failure while
    /// delivering one is logged and counted in [`OutboxPass::failed`] instead.
    pub async fn deliver_due(&self) -> Result<OutboxPass, StoreError> {
        let now = self.now().await;
        let due = self.store().due_deliveries(PAGE, now).await?;
        let mut pass = OutboxPass::default();
        for delivery in due {
            pass.due += 1;
            match self
                .deliverers()
                .find(&delivery.key.operation, &delivery.step.name)
            {
                Some(send) => {
                    self.deliver_one(Arc::clone(send), &delivery, &mut pass)
                        .await
                }
                None => pass.unregistered += 1,
            }
        }
        Ok(pass)
    }

    /// Claims, sends and settles one due delivery.
    async fn deliver_one(&self, send: Send, due: &Due, pass: &mut OutboxPass) {
        let policy = self.deliverers().policy;
        let store = self.store();
        let (key, id, index) = (&due.key, due.operation_id, due.step.index);
        let now = self.now().await;
        let until =
            now.saturating_add(u64::try_from(policy.timeout.as_millis()).unwrap_or(u64::MAX));
        let claimed = match store.claim_delivery(key, id, index, until, now).await {
            Ok(claimed) => claimed,
            Err(StoreError::LeaseLost) => return pass.lost += 1,
            Err(error) => return self.delivery_failed(due, &error, pass),
        };
        let downstream = match self.delivery_key(due).await {
            Ok(downstream) => downstream,
            Err(error) => return self.delivery_failed(due, &error, pass),
        };
        let payload = claimed.state.value().unwrap_or("null").to_owned();
        let span = tracing::info_span!(
            SPAN_DELIVERY,
            { FIELD_STEP_NAME } = %claimed.name,
            { FIELD_STEP_CALL } = claimed.calls,
            { FIELD_OPERATION_ID } = %id,
        );
        let sent = tokio::time::timeout(policy.timeout, send(payload, downstream))
            .instrument(span)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Unknown(format!(
                    "no answer within {:?}",
                    policy.timeout
                )))
            });
        let delivery = match sent {
            Ok(()) => Delivery::Delivered,
            Err(Failure::Unknown(why)) if claimed.calls < policy.max_deliveries => {
                tracing::info!(operation_id = %id, step = %claimed.name, delivery = claimed.calls, why = %why, "idem: a delivery failed; it goes again after a backoff");
                let later = self
                    .now()
                    .await
                    .saturating_add(policy.backoff_ms(claimed.calls));
                Delivery::RetryAt(later)
            }
            Err(Failure::Unknown(why) | Failure::Definite(why)) => {
                tracing::warn!(operation_id = %id, step = %claimed.name, deliveries = claimed.calls, why = %why, "idem: a delivery is given up; `idem ops show` lists it for an operator");
                Delivery::GiveUp
            }
        };
        let now = self.now().await;
        match store
            .settle_delivery(key, id, index, claimed.calls, delivery, now)
            .await
        {
            Ok(_) => match delivery {
                Delivery::Delivered => pass.delivered += 1,
                Delivery::RetryAt(_) => pass.retried += 1,
                Delivery::GiveUp => pass.given_up += 1,
            },
            Err(StoreError::LeaseLost) => pass.lost += 1,
            Err(error) => self.delivery_failed(due, &error, pass),
        }
    }

    /// The downstream key of the staged step `due`: that of the n-th step of its name in
    /// the operation's journal, as for a call ([`DownstreamKey::derive`]).
    async fn delivery_key(&self, due: &Due) -> Result<DownstreamKey, StoreError> {
        let now: UnixMillis = self.now().await;
        let steps = self.store().steps(&due.key, due.operation_id, now).await?;
        let earlier = steps
            .iter()
            .filter(|s| s.index < due.step.index && s.name == due.step.name)
            .count();
        let occurrence = u32::try_from(earlier + 1).unwrap_or(u32::MAX);
        Ok(DownstreamKey::derive(
            due.operation_id,
            &due.step.name,
            occurrence,
        ))
    }

    fn delivery_failed(&self, due: &Due, error: &StoreError, pass: &mut OutboxPass) {
        tracing::warn!(
            operation = %due.key.operation,
            operation_id = %due.operation_id,
            step = %due.step.name,
            error = %error,
            "idem: the outbox could not settle a delivery; the next pass tries again"
        );
        pass.failed += 1;
    }

    /// Spawns a tokio task that runs [`Idem::deliver_due`] every `every` (the first time
    /// at once), logging what it did and its failures, until the handle it returns is
    /// aborted or the runtime stops. Every instance of a service may run one: each
    /// delivery is claimed by one of them at a time.
    pub fn spawn_outbox(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let idem = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match idem.deliver_due().await {
                    Ok(pass) if pass.due > 0 => tracing::debug!(
                        due = pass.due,
                        delivered = pass.delivered,
                        retried = pass.retried,
                        given_up = pass.given_up,
                        lost = pass.lost,
                        unregistered = pass.unregistered,
                        failed = pass.failed,
                        "idem: the outbox delivered staged steps"
                    ),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(error = %error, "idem: the outbox cannot list due deliveries");
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_equal_jitter_up_to_its_cap() {
        let policy = DeliveryPolicy::default()
            .backoff(Duration::from_millis(100), Duration::from_millis(1000));
        for _ in 0..100 {
            let first = policy.backoff_ms(1);
            assert!((50..=100).contains(&first), "{first}");
            let third = policy.backoff_ms(3);
            assert!((200..=400).contains(&third), "{third}");
            let late = policy.backoff_ms(30);
            assert!((500..=1000).contains(&late), "{late}");
        }
        assert_eq!(
            DeliveryPolicy::default().max_deliveries(0).max_deliveries,
            1
        );
    }
}
