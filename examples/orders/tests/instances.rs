//! Many instances, one truth: three `orders` processes on one store (`--store postgres`,
//! `--store redis` on one server or a cluster), each key sent to all three at the same
//! moment, make one order per key.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Reply, Service, client, on_a_cluster, order, orders_by_key, try_post};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::url_or_skip;
use reqwest::StatusCode;
use tokio::sync::Semaphore;

/// The stable `type` of the declared concurrency answer (`concurrency = conflict`).
const IN_PROGRESS: &str = "tag:idem.rs,2026:problem:operation-in-progress";

/// How many distinct keys; each is sent three times.
const KEYS: usize = 100;

/// How many keys are in flight at once, each with its three requests: the processes race
/// on every key and on each other's, while no process waits longer for a connection of
/// its pool (16) than the attempt's 2 s lease or the store's 3 s wait, which on a busy
/// machine turns the test into one of overload (503) rather than of the race.
const KEYS_AT_ONCE: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_database_make_one_order_per_key() {
    let what = "three orders processes on one PostgreSQL database";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let services: Vec<Service> = (0..3).map(|_| Service::postgres(&url, &[])).collect();
    three_processes_one_order_per_key(&services, &url, "k-inst").await;
}

/// The same with the records in Redis and the orders in PostgreSQL (not transactional):
/// Redis's atomic registration is what lets one attempt run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_redis_make_one_order_per_key() {
    let what = "three orders processes on one Redis and one PostgreSQL database";
    let Some(redis_url) = url_or_skip(what).await else {
        return;
    };
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let services: Vec<Service> = (0..3).map(|_| Service::redis(&redis_url, &url)).collect();
    // The Redis server is shared between runs: the keys are new each time.
    let prefix = format!("k-inst-{}", uuid::Uuid::new_v4().simple());
    three_processes_one_order_per_key(&services, &url, &prefix).await;
}

/// The same with the records on a Redis Cluster of the test's own (3 masters, a replica
/// each, named by its seed nodes): the keys spread over every master, and each is still
/// run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_a_redis_cluster_make_one_order_per_key() {
    let what = "three orders processes on a Redis Cluster and one PostgreSQL database";
    let Some((_cluster, url, services)) = on_a_cluster(3, what).await else {
        return;
    };
    three_processes_one_order_per_key(&services, &url, "k-cluster").await;
}

/// Sends each of [`KEYS`] keys (`<prefix>-NNN`) to the three `services` at once, and
/// checks the answers and the orders table at `url`.
async fn three_processes_one_order_per_key(services: &[Service], url: &str, prefix: &str) {
    let urls: Arc<[String]> = services.iter().map(|s| s.url.clone()).collect();
    let http = client();
    let started = Instant::now();

    let gate = Arc::new(Semaphore::new(KEYS_AT_ONCE));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let (gate, urls, http) = (gate.clone(), urls.clone(), http.clone());
        let key = format!("{prefix}-{i:03}");
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let body = order(1000 + i64::try_from(i).unwrap());
            // The same key to the three processes at the same moment, over real sockets.
            let (a, b, c) = tokio::join!(
                try_post(&http, &urls[0], Some(&key), &body),
                try_post(&http, &urls[1], Some(&key), &body),
                try_post(&http, &urls[2], Some(&key), &body),
            );
            let answers: Vec<Reply> = [a, b, c]
                .into_iter()
                .map(|answer| answer.unwrap_or_else(|e| panic!("{key}: no answer: {e}")))
                .collect();
            (key, answers)
        });
    }

    let mut first_answers: HashMap<String, String> = HashMap::new();
    let (mut ran_by, mut replays, mut conflicts) = ([0; 3], 0, 0);
    while let Some(joined) = tasks.join_next().await {
        let (key, answers) = joined.unwrap();
        let ran: Vec<(usize, &Reply)> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| a.status == StatusCode::CREATED && !a.replayed())
            .collect();
        assert_eq!(ran.len(), 1, "{key}: one attempt ran: {answers:?}");
        let (process, first) = ran[0];
        ran_by[process] += 1;
        for answer in &answers {
            match answer.status {
                StatusCode::CREATED if answer.replayed() => {
                    replays += 1;
                    assert_eq!(answer.body, first.body, "{key}: the stored result");
                    assert_eq!(answer.header("operation-id"), first.header("operation-id"));
                }
                StatusCode::CREATED => {}
                StatusCode::CONFLICT => {
                    conflicts += 1;
                    assert_eq!(answer.problem_type(), IN_PROGRESS, "{key}: {answer:?}");
                    assert_eq!(answer.json()["state"], "processing");
                    assert!(answer.header("retry-after").is_some(), "{key}: {answer:?}");
                    assert_eq!(answer.header("operation-id"), first.header("operation-id"));
                }
                other => {
                    panic!("{key}: {other}, neither the result nor the declared 409: {answer:?}")
                }
            }
        }
        let id = first.json()["id"].as_str().unwrap().to_owned();
        first_answers.insert(key, id);
    }
    let took = started.elapsed();
    eprintln!(
        "{KEYS} keys x 3 processes in {took:?}: attempts run by process {ran_by:?}, {replays} replays, {conflicts} answers 409"
    );
    assert!(took < Duration::from_secs(60), "took {took:?}");

    // The orders table, read directly.
    let in_table = orders_by_key(url).await;
    assert_eq!(in_table.len(), KEYS, "exactly one order per key");
    assert_eq!(
        in_table, first_answers,
        "each key's order is the one answered"
    );
}
