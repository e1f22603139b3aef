//! The step journal's checks ([`crate::store::RecordStore::steps`],
//! [`crate::store::RecordStore::write_step`] and the outbox's delivery calls).

use std::sync::Arc;

use super::{LEASE, T0, TTL, key, lease_lost, new_record, started};
use crate::OperationId;
use crate::store::{
    Delivery, Lease, OwnerToken, RecordKey, Step, StepState, StepWrite, Store, StoreError,
    StoredResponse,
};

fn write(operation_id: OperationId, index: u32, name: &str, state: StepState) -> StepWrite {
    StepWrite {
        operation_id,
        index,
        name: name.into(),
        state,
    }
}

fn done(value: &str) -> StepState {
    StepState::Done(value.into())
}

/// A step's intent, then its outcome, are written under the lease and read back in order;
/// a second intent counts a second call; the first outcome stands.
pub async fn steps_are_written_and_read_in_order(store: Arc<dyn Store>) {
    let k = key("journal");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    let (id, token) = (new.operation_id, new.lease.token);
    assert_eq!(
        store.steps(&k, id, T0).await.unwrap(),
        vec![],
        "no step yet"
    );

    let intent = write(id, 0, "charge", StepState::Pending);
    let step = store.write_step(&k, token, &intent, T0).await.unwrap();
    assert_eq!(
        (step.index, step.calls, &step.state),
        (0, 1, &StepState::Pending)
    );
    let again = store.write_step(&k, token, &intent, T0 + 1).await.unwrap();
    assert_eq!(again.calls, 2, "a second intent counts a second call");

    let value = r#"{"id":"ch_1","amount_minor":1250,"note":"ünïcode \"quoted\""}"#;
    let settled = store
        .write_step(&k, token, &write(id, 0, "charge", done(value)), T0 + 2)
        .await
        .unwrap();
    assert_eq!(
        settled.state,
        done(value),
        "the value is kept byte for byte"
    );
    let other = write(id, 0, "charge", StepState::Failed("{}".into()));
    let kept = store.write_step(&k, token, &other, T0 + 3).await.unwrap();
    assert_eq!(kept.state, done(value), "the first outcome stands");
    let reopened = store.write_step(&k, token, &intent, T0 + 3).await.unwrap();
    assert_eq!(
        (reopened.calls, reopened.state),
        (2, done(value)),
        "an intent does not reopen it"
    );

    let receipt = write(
        id,
        1,
        "receipt",
        StepState::Failed(r#"{"code":"x"}"#.into()),
    );
    store.write_step(&k, token, &receipt, T0 + 4).await.unwrap();
    let steps = store.steps(&k, id, T0 + 5).await.unwrap();
    let names: Vec<_> = steps.iter().map(|s| (s.index, s.name.as_str())).collect();
    assert_eq!(names, [(0, "charge"), (1, "receipt")]);
    assert_eq!(steps[1].state, StepState::Failed(r#"{"code":"x"}"#.into()));
    assert_eq!(
        store.steps(&k, OperationId::new(), T0 + 5).await.unwrap(),
        vec![],
        "another operation's journal is empty"
    );
}

/// Only the current owner writes: another token, another operation, a finished record
/// or no record at all write nothing. A lease that ended but was not taken over still
/// writes (as `renew` does).
pub async fn steps_are_written_under_the_lease(store: Arc<dyn Store>) {
    let k = key("journal-fence");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    let (id, token) = (new.operation_id, new.lease.token);
    let intent = write(id, 0, "charge", StepState::Pending);
    lease_lost(
        store
            .write_step(&k, OwnerToken::random(), &intent, T0)
            .await,
        "a write under another token",
    );
    let elsewhere = write(OperationId::new(), 0, "charge", StepState::Pending);
    lease_lost(
        store.write_step(&k, token, &elsewhere, T0).await,
        "a write to another operation",
    );
    lease_lost(
        store.write_step(&key("nothing"), token, &intent, T0).await,
        "a write without a record",
    );
    let ended = T0 + LEASE + 1;
    store
        .write_step(&k, token, &intent, ended)
        .await
        .expect("an ended lease not taken over still writes");

    let lease = Lease {
        token: OwnerToken::random(),
        until: ended + LEASE,
    };
    store.take_over(&k, token, lease, ended).await.unwrap();
    lease_lost(
        store.write_step(&k, token, &intent, ended).await,
        "a write after a takeover",
    );
    let resumed = store
        .write_step(&k, lease.token, &intent, ended + 1)
        .await
        .unwrap();
    assert_eq!(
        resumed.calls, 2,
        "the new owner sends the pending step again"
    );
    store
        .complete(&k, lease.token, &super::created(), ended + 2)
        .await
        .unwrap();
    lease_lost(
        store.write_step(&k, lease.token, &intent, ended + 3).await,
        "a write after the completion",
    );
    assert_eq!(
        store.steps(&k, id, ended + 3).await.unwrap().len(),
        1,
        "the journal outlives the attempt"
    );
}

/// A step of another name at a position is refused (the handler's steps changed), and so
/// are writes past the bounds; nothing is written.
pub async fn a_changed_step_is_refused(store: Arc<dyn Store>) {
    let k = key("journal-changed");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    let (id, token) = (new.operation_id, new.lease.token);
    store
        .write_step(&k, token, &write(id, 0, "charge", StepState::Pending), T0)
        .await
        .unwrap();
    let refund = write(id, 0, "refund", StepState::Pending);
    let changed = store.write_step(&k, token, &refund, T0).await;
    assert!(
        matches!(&changed, Err(StoreError::Changed(why)) if why.contains("`charge`") && why.contains("`refund`")),
        "another name at a position is Changed naming both, got {changed:?}"
    );
    let big = write(
        id,
        1,
        "big",
        done(&format!("\"{}\"", "x".repeat(Step::MAX_VALUE))),
    );
    let refused = store.write_step(&k, token, &big, T0).await;
    assert!(
        matches!(refused, Err(StoreError::TooLarge { .. })),
        "got {refused:?}"
    );
    let far = write(id, Step::MAX_STEPS, "far", StepState::Pending);
    assert!(matches!(
        store.write_step(&k, token, &far, T0).await,
        Err(StoreError::Changed(_))
    ));
    let steps = store.steps(&k, id, T0).await.unwrap();
    assert_eq!(steps.len(), 1, "nothing was written: {steps:?}");
    assert_eq!(steps[0].name, "charge");
}

/// The journal lives as long as its record: a purge that deletes the record deletes its
/// steps, and a new operation under the same key starts with an empty journal.
pub async fn steps_expire_with_their_record(store: Arc<dyn Store>) {
    let k = key("journal-expiry");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    let (id, token) = (new.operation_id, new.lease.token);
    store
        .write_step(&k, token, &write(id, 0, "charge", done("1")), T0)
        .await
        .unwrap();

    let later = T0 + TTL + 1;
    let next = new_record("sha256:a", later);
    started(&*store, &k, &next, later).await;
    assert_eq!(
        store.steps(&k, next.operation_id, later).await.unwrap(),
        vec![],
        "a new operation's journal is empty"
    );
    let step = store
        .write_step(
            &k,
            next.lease.token,
            &write(next.operation_id, 0, "charge", StepState::Pending),
            later,
        )
        .await
        .unwrap();
    assert_eq!(
        (step.calls, step.state),
        (1, StepState::Pending),
        "the earlier operation's step is not this one's"
    );

    store.purge_expired(later + TTL + LEASE + 1).await.unwrap();
    assert_eq!(
        store.steps(&k, next.operation_id, later).await.unwrap(),
        vec![],
        "purged with the record"
    );
}

fn staged(payload: &str) -> StepState {
    StepState::Staged(payload.into())
}

/// A record under `name` whose operation staged `mail` and `hook` (payload `1`), then
/// completed with a 201 at [`T0`]: its key and operation id.
async fn two_staged_then_completed(store: &dyn Store, name: &str) -> (RecordKey, OperationId) {
    let k = key(name);
    let new = new_record("sha256:a", T0);
    started(store, &k, &new, T0).await;
    let id = new.operation_id;
    for (i, step) in ["mail", "hook"].iter().enumerate() {
        let write = write(id, u32::try_from(i).unwrap(), step, staged("1"));
        store
            .write_step(&k, new.lease.token, &write, T0)
            .await
            .unwrap();
    }
    store
        .complete(&k, new.lease.token, &super::created(), T0)
        .await
        .unwrap();
    (k, id)
}

/// A staged delivery is due only once its operation is completed with a success (2xx):
/// not while it runs, not after a 4xx; a call step where a delivery was staged (or the
/// reverse) is refused as a changed step.
pub async fn staged_deliveries_wait_for_a_completed_success(store: Arc<dyn Store>) {
    let (ok, refused) = (key("outbox-ok"), key("outbox-422"));
    let (first, second) = (new_record("sha256:a", T0), new_record("sha256:a", T0));
    started(&*store, &ok, &first, T0).await;
    started(&*store, &refused, &second, T0).await;
    for (k, new) in [(&ok, &first), (&refused, &second)] {
        let write = write(
            new.operation_id,
            0,
            "receipt",
            staged(r#"{"to":"ana@example.com"}"#),
        );
        let step = store
            .write_step(k, new.lease.token, &write, T0)
            .await
            .unwrap();
        assert_eq!((step.calls, step.next_at), (0, 0), "nothing sent yet");
        let again = store
            .write_step(k, new.lease.token, &write, T0)
            .await
            .unwrap();
        assert_eq!(again, step, "staged once");
    }
    let call = write(first.operation_id, 0, "receipt", StepState::Pending);
    let changed = store.write_step(&ok, first.lease.token, &call, T0).await;
    assert!(
        matches!(changed, Err(StoreError::Changed(_))),
        "a call over a delivery: {changed:?}"
    );
    assert_eq!(
        store.due_deliveries(10, T0 + 1).await.unwrap(),
        vec![],
        "not while processing"
    );

    store
        .complete(&ok, first.lease.token, &super::created(), T0 + 2)
        .await
        .unwrap();
    let unprocessable = StoredResponse {
        status: 422,
        ..super::created()
    };
    store
        .complete(&refused, second.lease.token, &unprocessable, T0 + 2)
        .await
        .unwrap();
    let due = store.due_deliveries(10, T0 + 3).await.unwrap();
    assert_eq!(due.len(), 1, "only the completed success: {due:?}");
    assert_eq!(
        (&due[0].key, due[0].operation_id),
        (&ok, first.operation_id)
    );
    assert_eq!(due[0].step.name, "receipt");
    assert_eq!(due[0].step.state, staged(r#"{"to":"ana@example.com"}"#));
    assert_eq!(
        store.due_deliveries(10, T0 + TTL + 1).await.unwrap(),
        vec![],
        "nor after the TTL"
    );
}

/// A due delivery is claimed by one worker at a time, until its claim ends; only that
/// claim settles it: delivered, due again at a later time, or given up.
pub async fn a_delivery_is_claimed_once_and_settled(store: Arc<dyn Store>) {
    let (k, id) = two_staged_then_completed(&*store, "outbox-claims").await;
    let now = T0 + 10;
    let claimed = store
        .claim_delivery(&k, id, 0, now + 5_000, now)
        .await
        .unwrap();
    assert_eq!((claimed.calls, claimed.next_at), (1, now + 5_000));
    lease_lost(
        store.claim_delivery(&k, id, 0, now + 5_000, now + 1).await,
        "a second claim",
    );
    let due: Vec<u32> = store
        .due_deliveries(10, now + 1)
        .await
        .unwrap()
        .iter()
        .map(|d| d.step.index)
        .collect();
    assert_eq!(due, [1], "a claimed delivery is not due");
    lease_lost(
        store
            .settle_delivery(&k, id, 0, 2, Delivery::Delivered, now + 2)
            .await,
        "another claim's settlement",
    );

    let retry = store
        .settle_delivery(&k, id, 0, 1, Delivery::RetryAt(now + 60_000), now + 2)
        .await
        .unwrap();
    assert_eq!(
        (retry.state.as_str(), retry.next_at),
        ("staged", now + 60_000)
    );
    lease_lost(
        store
            .claim_delivery(&k, id, 0, now + 70_000, now + 59_999)
            .await,
        "a claim before it is due again",
    );
    let claimed = store
        .claim_delivery(&k, id, 0, now + 90_000, now + 60_000)
        .await
        .unwrap();
    assert_eq!(claimed.calls, 2);
    let delivered = store
        .settle_delivery(&k, id, 0, 2, Delivery::Delivered, now + 60_001)
        .await
        .unwrap();
    assert_eq!(delivered.state, StepState::Delivered("1".into()));
    lease_lost(
        store
            .claim_delivery(&k, id, 0, now + 90_000, now + 90_000)
            .await,
        "a claim of a delivered step",
    );
}

/// A delivery that fails definitely is given up: never due again, kept in the journal
/// (with the delivered ones) for operators; no step, no claim.
pub async fn a_given_up_delivery_stays_for_operators(store: Arc<dyn Store>) {
    let (k, id) = two_staged_then_completed(&*store, "outbox-given-up").await;
    let now = T0 + 10;
    let claimed = store
        .claim_delivery(&k, id, 0, now + 5_000, now)
        .await
        .unwrap();
    store
        .settle_delivery(&k, id, 0, claimed.calls, Delivery::Delivered, now)
        .await
        .unwrap();

    let claimed = store
        .claim_delivery(&k, id, 1, now + 5_000, now)
        .await
        .unwrap();
    let given_up = store
        .settle_delivery(&k, id, 1, claimed.calls, Delivery::GiveUp, now + 1)
        .await
        .unwrap();
    assert_eq!(given_up.state, StepState::GivenUp("1".into()));
    assert_eq!(
        store.due_deliveries(10, now + 100_000).await.unwrap(),
        vec![],
        "nothing left due"
    );
    let states: Vec<_> = store
        .steps(&k, id, now)
        .await
        .unwrap()
        .iter()
        .map(|s| s.state.as_str())
        .collect();
    assert_eq!(
        states,
        ["delivered", "given_up"],
        "kept in the journal for operators"
    );
    lease_lost(
        store
            .claim_delivery(&key("none"), OperationId::new(), 0, now, now)
            .await,
        "a claim of no step",
    );
}
