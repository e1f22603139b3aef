//! The Redis store under a load while its server dies and comes back: a Redis server of
//! the test's own (never the shared one on 6379), with `appendonly yes` and `appendfsync
//! always`, killed with SIGKILL in the middle of the load and started again on the same
//! port and files.
//!
//! While it is down every answer is 503 with `Retry-After` and no handler runs. Once it is
//! back, requests succeed again within seconds without restarting the service; every key
//! that got its result before the outage still replays it (nothing completed is lost); a
//! key whose attempt was cut by the outage is decided by recovery (the reconcile function
//! finds its effect by the operation id); and no key has more than one effect.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::answer::Answer;
use common::redis::{OwnRedis, order, redis_server, service};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_redis_under_load_fails_closed_and_loses_nothing() {
    let Some(binary) = redis_server() else { return };
    // Every acknowledged write on disk before the answer: a restart keeps what completed.
    let durable = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut redis = OwnRedis::start(&binary, &durable);
    let store = idem::RedisStore::connect(&redis.url())
        .await
        .expect("connect to the test's own Redis")
        .with_call_timeout(Duration::from_millis(500));
    let (server, books) = service(store).await;
    let server = Arc::new(server);

    // The load: 8 clients, each sending new keys one after another, until told to stop.
    let answers: Arc<Mutex<Vec<(String, Answer, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..8 {
        let (server, answers, stop) = (server.clone(), answers.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && n < 2_000 {
                let key = format!("k-{c}-{n}");
                let answer = order(&server, &key, n).await;
                answers.lock().unwrap().push((key, answer, Instant::now()));
                n += 1;
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.kill();
    let killed = Instant::now();
    // Requests in flight at the kill may still have run; from here on none may.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let effects_down = books.effects.lock().unwrap().values().sum::<u32>();
    let down_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let down_until = Instant::now();
    assert_eq!(
        books.effects.lock().unwrap().values().sum::<u32>(),
        effects_down,
        "no handler runs while the store is down"
    );
    redis.restart();
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }

    let answers = answers.lock().unwrap().clone();
    let before: Vec<_> = answers.iter().filter(|(_, _, at)| *at < killed).collect();
    let during: Vec<_> = answers
        .iter()
        .filter(|(_, _, at)| *at > down_from && *at < down_until)
        .collect();
    assert!(
        before.iter().filter(|(_, a, _)| a.status == 201).count() >= 20,
        "the load ran before the outage"
    );
    assert!(during.len() >= 8, "the load ran during the outage");
    for (key, answer, _) in &during {
        assert_eq!(answer.status, 503, "{key} while Redis is down: {answer:?}");
        assert!(
            answer.header("retry-after").is_some(),
            "{key}: a 503 says when to retry"
        );
        assert_eq!(answer.slug(), "store-unavailable", "{key}");
    }
    eprintln!(
        "{} answers: {} before the kill ({} of them 201), {} while down, {} not final",
        answers.len(),
        before.len(),
        before.iter().filter(|(_, a, _)| a.status == 201).count(),
        during.len(),
        answers.iter().filter(|(_, a, _)| a.status != 201).count(),
    );
    // Back within seconds, without restarting the service.
    let first_after = answers
        .iter()
        .filter(|(_, a, at)| *at > restarted && a.status == 201)
        .map(|(_, _, at)| *at)
        .min()
        .expect("requests succeed again once Redis is back");
    assert!(
        first_after.duration_since(restarted) < Duration::from_secs(5),
        "traffic resumed {:?} after Redis came back",
        first_after.duration_since(restarted)
    );

    // Every key that got its result still replays it: nothing completed was lost.
    let completed: HashMap<&str, &Answer> = answers
        .iter()
        .filter(|(_, a, _)| a.status == 201)
        .map(|(k, a, _)| (k.as_str(), a))
        .collect();
    for (key, answer, _) in answers.iter().filter(|(_, a, _)| a.status == 201) {
        let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
        let again = order(&server, key, n).await;
        assert_eq!(again.status, 201, "{key} after the outage: {again:?}");
        assert!(again.replayed(), "{key} is replayed, not run again");
        assert_eq!(again.body, answer.body, "{key}");
        assert_eq!(again.operation_id(), answer.operation_id(), "{key}");
    }
    // Every key cut by the outage ends with one answer, decided by recovery where its
    // effect was made: retried as a client would, until final.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (key, _, _) in answers
        .iter()
        .filter(|(k, _, _)| !completed.contains_key(k.as_str()))
    {
        let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
        loop {
            let answer = order(&server, key, n).await;
            if answer.status == 201 {
                break;
            }
            assert!(
                matches!(answer.status, 409 | 503),
                "{key}: only the concurrency answer or a retryable 503 before the result: {answer:?}"
            );
            assert!(Instant::now() < deadline, "{key} was never decided");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let effects = books.effects.lock().unwrap().clone();
    for (key, _, _) in &answers {
        assert_eq!(
            effects.get(key).copied().unwrap_or(0),
            1,
            "{key}: exactly one effect"
        );
    }
}
