//! The store goes away under load: one `orders --store postgres` process on a PostgreSQL
//! server of the test's own, stopped (`immediate`, as a crash of the server) while
//! requests keep coming, then started again. While it is down every answer is 503
//! `store-unavailable` with `Retry-After` and no order is written; once it is back, new
//! keys succeed within seconds without restarting the service, and no key has two orders.
//!
//! `OUTAGE_TRACE=1` prints every request of the load (when it was sent and answered,
//! from the moment the server was down, and the answer).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{OwnPostgres, Reply, Service, client, order, try_post};
use reqwest::StatusCode;

const STORE_UNAVAILABLE: &str = "tag:idem.rs,2026:problem:store-unavailable";
const IN_PROGRESS: &str = "tag:idem.rs,2026:problem:operation-in-progress";

/// How many clients send at once; each sends a new key as soon as it has its answer.
const CLIENTS: usize = 8;

/// How long the server stays down: while it is, each answer takes the store's 3 s wait
/// for a connection (`PostgresStore::connect`'s default), so a request must be able to
/// start and end inside the window, twice over.
const DOWN_FOR: Duration = Duration::from_secs(7);

/// One request of the load.
struct Sent {
    key: String,
    amount: i64,
    sent: Instant,
    answered: Instant,
    answer: Reply,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_under_load_fails_closed_then_recovers_without_a_restart() {
    let what = "the PostgreSQL outage test";
    let Some(pg) = OwnPostgres::start(what) else {
        return;
    };
    let started = Instant::now();
    let service = Service::postgres(&pg.url(), &[]);
    let http = client();

    // The steady load: CLIENTS loops, a new key per request.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let log: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (stop, next, log, http, url) = (
            stop.clone(),
            next.clone(),
            log.clone(),
            http.clone(),
            service.url.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let key = format!("k-outage-{n:04}");
                let amount = 100 + i64::try_from(n).unwrap();
                let sent = Instant::now();
                let answer = try_post(&http, &url, Some(&key), &order(amount))
                    .await
                    .unwrap_or_else(|e| panic!("{key}: the service must answer: {e}"));
                let answered = Instant::now();
                log.lock().unwrap().push(Sent {
                    key,
                    amount,
                    sent,
                    answered,
                    answer,
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let pg = Arc::new(pg);
    let control = |action: fn(&OwnPostgres) -> Result<(), String>| {
        let pg = pg.clone();
        async move {
            tokio::task::spawn_blocking(move || action(&pg))
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{e}"));
            Instant::now()
        }
    };

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let going_down = Instant::now();
    let down = control(OwnPostgres::stop_immediate).await;
    tokio::time::sleep(DOWN_FOR).await;
    let coming_up = Instant::now();
    let up = control(OwnPostgres::start_again).await;
    eprintln!(
        "the server stopped in {:?}, was down {:?}, started in {:?}",
        down - going_down,
        coming_up - down,
        up - coming_up
    );

    // Back: a new key succeeds within a few seconds, without a restart of the service.
    let recovered = loop {
        let first_201 = log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.sent >= up && s.answer.status == StatusCode::CREATED)
            .map(|s| s.answered)
            .min();
        if let Some(at) = first_201 {
            break at;
        }
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "no order succeeded within 10 s of the server's return"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let log = std::mem::take(&mut *log.lock().unwrap());

    if std::env::var_os("OUTAGE_TRACE").is_some() {
        for s in &log {
            eprintln!(
                "{} sent {:?} answered {:?} {} {}",
                s.key,
                s.sent.saturating_duration_since(down),
                s.answered.saturating_duration_since(down),
                s.answer.status,
                s.answer.problem_type()
            );
        }
    }
    let (mut before, mut while_down, mut after) = (0, 0, 0);
    for s in &log {
        let a = &s.answer;
        // Any moment: the order, or 503 with Retry-After (an attempt caught by the stop
        // may say more precisely what became of it, always with Retry-After).
        assert!(
            a.status == StatusCode::CREATED
                || (a.status == StatusCode::SERVICE_UNAVAILABLE
                    && a.header("retry-after").is_some()),
            "{}: {a:?}",
            s.key
        );
        if s.answered < going_down {
            assert_eq!(a.status, StatusCode::CREATED, "{}: before the stop", s.key);
            before += 1;
        } else if s.sent >= down && s.answered <= coming_up {
            // Wholly while the server was down: fail closed, nothing runs.
            assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", s.key);
            assert_eq!(a.problem_type(), STORE_UNAVAILABLE, "{}: {a:?}", s.key);
            assert_eq!(a.json()["new_key_safe"], false);
            while_down += 1;
        } else if s.sent >= recovered {
            assert_eq!(
                a.status,
                StatusCode::CREATED,
                "{}: after the recovery",
                s.key
            );
            after += 1;
        }
    }
    eprintln!(
        "{} requests: {before} before the stop, {while_down} while down, {after} after the first success again; back {:?} after the server",
        log.len(),
        recovered - up
    );
    assert!(
        before > 0 && while_down > 0 && after > 0,
        "the load covered every phase"
    );
    assert!(
        recovered - up < Duration::from_secs(5),
        "new keys succeed within seconds: {:?}",
        recovered - up
    );

    // Every key that did not get its order is retried until final, and so is every key
    // answered 201 around the outage (its replay must be that answer); then each key has
    // exactly one order, the one answered.
    let mut answered: HashMap<String, String> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(20);
    for s in &log {
        let created = s.answer.status == StatusCode::CREATED;
        if created && (s.answered < going_down || s.sent > recovered) {
            let id = s.answer.json()["id"].as_str().unwrap().to_owned();
            answered.insert(s.key.clone(), id);
            continue;
        }
        let mut answer = try_post(&http, &service.url, Some(&s.key), &order(s.amount))
            .await
            .unwrap();
        while answer.status == StatusCode::CONFLICT {
            assert_eq!(answer.problem_type(), IN_PROGRESS, "{}: {answer:?}", s.key);
            assert!(Instant::now() < until, "{}: never decided", s.key);
            tokio::time::sleep(Duration::from_millis(500)).await;
            answer = try_post(&http, &service.url, Some(&s.key), &order(s.amount))
                .await
                .unwrap();
        }
        assert_eq!(answer.status, StatusCode::CREATED, "{}: {answer:?}", s.key);
        let id = answer.json()["id"].as_str().unwrap().to_owned();
        if created {
            assert!(answer.replayed(), "{}: the stored result", s.key);
            assert_eq!(answer.body, s.answer.body, "{}", s.key);
        } else if s.answer.problem_type() == STORE_UNAVAILABLE {
            assert!(
                !answer.replayed(),
                "{}: nothing had run, so it runs now",
                s.key
            );
        }
        answered.insert(s.key.clone(), id);
    }
    let pool = sqlx::PgPool::connect(&pg.url()).await.unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT idempotency_key, id FROM orders")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(rows.len(), log.len(), "one order per key, no key with two");
    let in_table: HashMap<String, String> = rows.into_iter().collect();
    assert_eq!(in_table, answered);
    let took = started.elapsed();
    eprintln!("took {took:?}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}
