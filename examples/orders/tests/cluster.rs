//! The orders service on a Redis Cluster that loses a master mid-run: two `orders`
//! processes (`--store redis`, the records on a cluster of 3 masters with a replica each,
//! the orders in PostgreSQL) take orders under new keys while one master is killed with
//! SIGKILL. Every key ends with one order and the answer that names it; no key waits
//! past its contract's deadline (30 s).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Reply, client, on_a_cluster, order, orders_by_key, try_post};
use idem_runtime::store::{RecordKey, RedisStore};
use reqwest::StatusCode;
use tokio::sync::Semaphore;

/// How many keys, and how many are in flight at once.
const KEYS: usize = 120;
const KEYS_AT_ONCE: usize = 8;

/// The contract's whole deadline for one key (`deadline = ("30s", …)`).
const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_leaves_one_order_per_key() {
    let what = "orders on a Redis Cluster that loses a master";
    let Some((mut cluster, url, services)) = on_a_cluster(2, what).await else {
        return;
    };
    let urls: Arc<[String]> = services.iter().map(|s| s.url.clone()).collect();
    let http = client();
    // The master to kill: the one that holds the first key's record.
    let store = RedisStore::connect(&cluster.url())
        .await
        .expect("the cluster");
    let first = RecordKey::new("create_order", "acme", "k-failover-000");
    let victim = cluster.master_of(&store.hash_name(&first));

    let gate = Arc::new(Semaphore::new(KEYS_AT_ONCE));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let (gate, urls, http) = (gate.clone(), urls.clone(), http.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let key = format!("k-failover-{i:03}");
            let body = order(2000 + i64::try_from(i).unwrap());
            let reply = until_final(&http, &urls, &key, &body, i).await;
            (key, reply)
        });
        if i == KEYS / 4 {
            // A quarter of the keys sent: the master dies under the traffic.
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.kill(victim);
        }
    }
    let mut answered: HashMap<String, String> = HashMap::new();
    let mut waited = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (key, (reply, took)) = joined.unwrap();
        assert_eq!(reply.status, StatusCode::CREATED, "{key}: {reply:?}");
        waited = waited.max(took);
        answered.insert(key, reply.json()["id"].as_str().unwrap().to_owned());
    }
    eprintln!("{KEYS} keys, the longest took {waited:?}");

    let in_table = orders_by_key(&url).await;
    assert_eq!(in_table.len(), KEYS, "exactly one order per key");
    assert_eq!(in_table, answered, "each key's order is the one answered");
}

/// Sends `key` until a final answer, as a client that honours `Retry-After` would (a
/// 503 while the master is down, a 409 while an earlier attempt holds the key), to the
/// two processes in turn; the answer and how long the key took.
///
/// # Panics
///
/// On an answer that is neither final nor retryable, or past the contract's deadline.
async fn until_final(
    http: &reqwest::Client,
    urls: &[String],
    key: &str,
    body: &serde_json::Value,
    first: usize,
) -> (Reply, Duration) {
    let started = Instant::now();
    for attempt in first.. {
        let url = &urls[attempt % urls.len()];
        match try_post(http, url, Some(key), body).await {
            Ok(reply) if reply.status == StatusCode::CREATED => return (reply, started.elapsed()),
            Ok(reply)
                if reply.status == StatusCode::SERVICE_UNAVAILABLE
                    || reply.status == StatusCode::CONFLICT =>
            {
                assert!(
                    reply.header("retry-after").is_some(),
                    "{key}: a retryable answer says when: {reply:?}"
                );
            }
            Ok(reply) => panic!("{key}: neither final nor retryable: {reply:?}"),
            Err(error) => panic!("{key}: no answer: {error}"),
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{key}: no final answer within the deadline"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    unreachable!("the loop returns or panics")
}
