//! SIGKILL under load: three `orders` processes on one store, one of them killed in the
//! middle of an attempt; every key whose answer was lost is retried on the survivors until
//! final, and each key has exactly one order.
//!
//! - `--store postgres` (transactional): killed after the commit of an order and its
//!   record, before the answer; the retry is the replay.
//! - `--store postgres`, killed before the commit: nothing is left, and the retry runs.
//! - `--store redis` (records in Redis, orders in PostgreSQL, not transactional): killed
//!   after the order was written and before its record was completed; the retry finds the
//!   record processing under a dead lease, and recovery (the reconcile function, which
//!   finds the order by its operation id) decides: applied, so the order is answered and
//!   never made twice.
#![cfg(feature = "fault-points")]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Reply, Service, client, order, try_post};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::url_or_skip;
use reqwest::StatusCode;
use tokio::sync::Semaphore;

/// How many distinct keys the load sends, round-robin to the three processes.
const KEYS: usize = 90;

/// How many requests are in flight at once.
const IN_FLIGHT: usize = 12;

/// The stable `type` of the answer while a key is held by a running (or dead) attempt.
const IN_PROGRESS: &str = "tag:idem.rs,2026:problem:operation-in-progress";

/// The rows of the orders table: each key's order id.
async fn orders_by_key(url: &str) -> Vec<(String, String)> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows = sqlx::query_as("SELECT idempotency_key, id FROM orders ORDER BY idempotency_key")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows
}

fn body_of(i: usize) -> serde_json::Value {
    order(2000 + i64::try_from(i).unwrap())
}

/// Retries `key` on `urls` (in turn) until its answer is final, waiting as each 409 says
/// (`Retry-After`); returns the final answer and how many 409s came first.
async fn retry_until_final(
    http: &reqwest::Client,
    urls: &[String],
    key: &str,
    body: &serde_json::Value,
    until: Instant,
) -> (Reply, u32) {
    // Every turn but the last is a 409: the turn is the count of them.
    for held in 0_u32.. {
        let url = &urls[held as usize % urls.len()];
        let answer = try_post(http, url, Some(key), body)
            .await
            .unwrap_or_else(|e| panic!("{key}: a survivor did not answer: {e}"));
        if answer.status != StatusCode::CONFLICT {
            return (answer, held);
        }
        assert_eq!(answer.problem_type(), IN_PROGRESS, "{key}: {answer:?}");
        assert!(Instant::now() < until, "{key}: never decided: {answer:?}");
        // The client waits as told, at most a second between tries.
        let wait = answer
            .header("retry-after")
            .and_then(|s| s.parse().ok())
            .map_or(Duration::from_secs(1), Duration::from_secs)
            .min(Duration::from_secs(1));
        tokio::time::sleep(wait).await;
    }
    unreachable!()
}

/// The lease of a dead attempt is the heartbeat's (`Idem::lease_for`: the smaller of 2 s
/// and the contract's 10 s per-attempt timeout), so a key the dead process held but never
/// committed is decided by recovery within a few seconds; a key it committed is replayed
/// at once, since in the transactional mode its record committed with the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_commit_under_load_every_key_has_one_order() {
    let what = "SIGKILL of one of three orders processes under load";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let survivors = [Service::postgres(&url, &[]), Service::postgres(&url, &[])];
    let doomed = Service::postgres(&url, &[("IDEM_FAULT_POINT", "after_commit")]);
    kill_one_under_load(&url, survivors, doomed, "after_commit", "k-crash").await;
}

/// PostgreSQL, transactional: SIGKILL between the order's insert and the commit (the
/// fault point `before_commit`), where a new key's record is not even written yet (it is
/// written once, at the completion). The session dies with the process, its transaction
/// rolls back and its lock goes with it: no order, no record, and a retry on another
/// instance runs the handler as the key's first attempt, without waiting for any lease;
/// one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_the_commit_on_postgres_the_retry_runs_once() {
    let what = "SIGKILL of an orders process before its commit on PostgreSQL";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let http = client();
    let survivor = Service::postgres(&url, &[]);
    let doomed = Service::postgres(&url, &[("IDEM_FAULT_POINT", "before_commit")]);
    let body = body_of(1);
    let (to, sent_body, url_of_doomed) = (http.clone(), body.clone(), doomed.url.clone());
    let in_flight = tokio::spawn(async move {
        try_post(&to, &url_of_doomed, Some("k-before-commit"), &sent_body).await
    });
    tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr("fault point before_commit reached");
        doomed.crash();
    })
    .await
    .unwrap();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the answer died with the process"
    );
    assert!(orders_by_key(&url).await.is_empty(), "nothing committed");
    let until = Instant::now() + Duration::from_secs(10);
    let urls = [survivor.url.clone()];
    let (retry, _held) = retry_until_final(&http, &urls, "k-before-commit", &body, until).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(
        retry.header("idempotent-replayed"),
        None,
        "the retry ran: {retry:?}"
    );
    let orders = orders_by_key(&url).await;
    assert_eq!(orders.len(), 1, "one order: {orders:?}");
    let again = try_post(&http, &survivor.url, Some("k-before-commit"), &body)
        .await
        .unwrap();
    assert_eq!(
        again.header("idempotent-replayed"),
        Some("true"),
        "{again:?}"
    );
    assert_eq!(orders_by_key(&url).await.len(), 1);
}

/// Records in Redis: the dead attempt's order is in the table but its record is still
/// processing; after its lease, recovery finds the order and answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_the_completion_on_redis_recovery_decides() {
    let what = "SIGKILL of one of three orders processes on Redis under load";
    let Some(redis_url) = url_or_skip(what).await else {
        return;
    };
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let survivors = [
        Service::redis(&redis_url, &url),
        Service::redis(&redis_url, &url),
    ];
    let doomed = Service::redis_with(&redis_url, &url, &[("IDEM_FAULT_POINT", "before_complete")]);
    // The Redis server is shared between runs: the keys are new each time.
    let prefix = format!("k-crash-{}", uuid::Uuid::new_v4().simple());
    kill_one_under_load(&url, survivors, doomed, "before_complete", &prefix).await;
}

/// The load, the kill at `point`, the retries on the survivors, and the count of orders
/// in the database at `url`.
async fn kill_one_under_load(
    url: &str,
    survivors: [Service; 2],
    doomed: Service,
    point: &'static str,
    prefix: &str,
) {
    let started = Instant::now();
    let urls: Arc<[String]> = [&survivors[0], &survivors[1], &doomed]
        .iter()
        .map(|s| s.url.clone())
        .collect();
    let survivor_urls: Vec<String> = survivors.iter().map(|s| s.url.clone()).collect();
    let killer = tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr(&format!("idem: fault point {point} reached"));
        doomed.crash();
        Instant::now()
    });

    // The load: every key once, round-robin, some in flight at all times.
    let http = client();
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let (gate, urls, http) = (gate.clone(), urls.clone(), http.clone());
        let key = format!("{prefix}-{i:03}");
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let answer = try_post(&http, &urls[i % 3], Some(&key), &body_of(i)).await;
            (i, key, answer)
        });
    }
    let mut answered: HashMap<String, String> = HashMap::new();
    let mut lost: Vec<(usize, String)> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (i, key, answer) = joined.unwrap();
        match answer {
            Ok(answer) => {
                assert_eq!(answer.status, StatusCode::CREATED, "{key}: {answer:?}");
                assert!(!answer.replayed(), "{key}: sent once, ran once");
                let id = answer.json()["id"].as_str().unwrap().to_owned();
                answered.insert(key, id);
            }
            Err(_) => {
                assert_eq!(i % 3, 2, "{key}: only the killed process loses answers");
                lost.push((i, key));
            }
        }
    }
    let killed = killer.await.unwrap();
    assert!(!lost.is_empty(), "the killed process lost answers");

    // What the dead process wrote before it died: the order of the key at the fault
    // point, at least (its answer never left).
    let committed: HashMap<String, String> = orders_by_key(url).await.into_iter().collect();
    let lost_but_committed = lost
        .iter()
        .filter(|(_, k)| committed.contains_key(k))
        .count();
    assert!(lost_but_committed >= 1, "the fault point's order committed");

    // Every lost key, retried on the survivors until final.
    let until = killed + Duration::from_secs(20);
    let (mut replayed, mut ran_again, mut waited) = (0, 0, 0);
    for (i, key) in &lost {
        let (answer, held) =
            retry_until_final(&http, &survivor_urls, key, &body_of(*i), until).await;
        waited += held;
        assert_eq!(answer.status, StatusCode::CREATED, "{key}: {answer:?}");
        let id = answer.json()["id"].as_str().unwrap().to_owned();
        if let Some(stored) = committed.get(key) {
            // Transactional: committed with its record, so the stored result at once.
            // Otherwise recovery found the order once the dead lease ended.
            assert!(answer.replayed(), "{key}: the replay of the stored result");
            if point == "after_commit" {
                assert_eq!(held, 0, "{key}: a committed key is not held");
            }
            assert_eq!(&id, stored, "{key}: the order that was written");
            replayed += 1;
        } else {
            assert!(
                !answer.replayed(),
                "{key}: nothing committed, so the retry ran"
            );
            ran_again += 1;
        }
        answered.insert(key.clone(), id);
    }
    let took = started.elapsed();
    eprintln!(
        "{KEYS} keys: {} answered at once, {} lost ({replayed} replayed after the kill, {ran_again} ran again, {waited} answers 409 while a dead attempt held its key) in {took:?}",
        KEYS - lost.len(),
        lost.len(),
    );

    let rows = orders_by_key(url).await;
    assert_eq!(rows.len(), KEYS, "exactly one order per key");
    let in_table: HashMap<String, String> = rows.into_iter().collect();
    assert_eq!(in_table, answered, "each key's order is the one answered");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}
