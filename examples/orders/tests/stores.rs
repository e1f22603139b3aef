//! `orders --store …`: each store as a user starts it, and the path of `--store redis`
//! (records outside the orders database, orders in PostgreSQL, written through the pool)
//! also with the records in memory, in-process.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Reply, Service, client, order, post, temp_db, try_post};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::url_or_skip;
use orders::Service as OrdersService;
use orders::api::Demo;
use orders::db::Orders;
use reqwest::StatusCode;

async fn get(http: &reqwest::Client, url: &str, path: &str) -> Reply {
    let response = http
        .get(format!("{url}{path}"))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap();
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await.unwrap(),
    }
}

/// The order, its replay, and the order read back through `GET` (from whichever
/// database holds it).
async fn order_replay_and_read(http: &reqwest::Client, url: &str, key: &str) -> Reply {
    let first = try_post(http, url, Some(key), &order(4200)).await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let again = try_post(http, url, Some(key), &order(4200)).await.unwrap();
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "the stored body, byte for byte");
    let location = first.header("location").unwrap().to_owned();
    let read = get(http, url, &location).await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    assert_eq!(read.json(), first.json());
    first
}

async fn count_pg(url: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let count = orders::db::postgres::count(&pool).await.unwrap();
    pool.close().await;
    count
}

async fn count_sqlite(db: &std::path::Path) -> i64 {
    let pool = orders::db::sqlite::open(db).await.unwrap();
    let count = orders::db::sqlite::count(&pool).await.unwrap();
    pool.close().await;
    count
}

/// `--store memory`: the records live in the process, the orders in the SQLite file. A
/// restart forgets every key (as `--help` says): the same key makes a second order.
#[tokio::test]
async fn memory_records_are_lost_on_restart_orders_stay_in_the_file() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &["--store", "memory"]);
    order_replay_and_read(&http, &service.url, "k-mem").await;
    assert_eq!(count_sqlite(&db).await, 1);
    service.crash();

    let service = Service::start(&db, &["--store", "memory"]);
    let after = post(&http, &service, Some("k-mem"), &order(4200)).await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(
        !after.replayed(),
        "the records were in the dead process's memory"
    );
    assert_eq!(count_sqlite(&db).await, 2, "the orders are in the file");
}

/// `--store postgres`, one process: the order and its record in PostgreSQL, read back
/// from there, and the status lookup.
#[tokio::test]
async fn postgres_stores_records_and_orders_in_the_database() {
    let Some(url) = scratch_url("orders --store postgres").await else {
        return;
    };
    let http = client();
    let service = Service::postgres(&url, &[]);
    order_replay_and_read(&http, &service.url, "k-pg").await;
    let lookup = get(&http, &service.url, "/orders/operations/k-pg").await;
    assert_eq!(lookup.json()["state"], "completed", "{lookup:?}");
    assert_eq!(count_pg(&url).await, 1);
}

/// Records outside the orders database and orders in PostgreSQL, written through the
/// pool: what `--store redis` runs, with the records in memory here (and the demo's
/// outage, which needs the service in-process).
#[tokio::test]
async fn records_elsewhere_orders_in_postgres_through_the_pool() {
    let Some(url) = scratch_url("records in memory, orders in PostgreSQL").await else {
        return;
    };
    let orders = Orders::connect_postgres(&url).await.unwrap();
    let demo = Demo {
        outage: 1.into(),
        ..Demo::default()
    };
    let service = OrdersService::with_store(idem::MemoryStore::new(), orders, demo);
    let listener = OrdersService::bind(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(service.serve(listener, async {
        let _ = stopped.await;
    }));
    let http = client();

    // The provider is down once: 503 releases the key, the retry writes the one order.
    let outage = try_post(&http, &base, Some("k-redis-path"), &order(4200))
        .await
        .unwrap();
    assert_eq!(outage.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(count_pg(&url).await, 0, "503 before writing anything");
    order_replay_and_read(&http, &base, "k-redis-path").await;
    assert_eq!(count_pg(&url).await, 1);

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// `--store redis`: the records in Redis, the order in PostgreSQL, read back from there.
/// (The server is shared between runs, so the key is new each time.)
#[tokio::test]
async fn redis_stores_records_in_redis_and_orders_in_postgres() {
    let what = "orders --store redis";
    let Some(redis_url) = url_or_skip(what).await else {
        return;
    };
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let http = client();
    let service = Service::redis(&redis_url, &url);
    let key = format!("k-redis-{}", uuid::Uuid::new_v4().simple());
    order_replay_and_read(&http, &service.url, &key).await;
    assert_eq!(count_pg(&url).await, 1);
}

/// `--store redis` on a server that does not answer fails at start, naming the store.
#[test]
fn redis_unreachable_fails_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_orders"))
        .args(["--addr", "127.0.0.1:0", "--store", "redis"])
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--store redis: idem's store"), "{stderr}");
    assert!(out.stdout.is_empty(), "it never listened");
}

/// `--store postgres` without a server names the variable to set.
#[test]
fn postgres_without_database_url_names_the_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_orders"))
        .args(["--addr", "127.0.0.1:0", "--store", "postgres"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("set DATABASE_URL"), "{stderr}");
}

/// Malformed values of the store flags: an unknown store, an empty or malformed Redis URL,
/// a URL that is not UTF-8 text on the command line: each is refused with a message that
/// names the flag or the store, the exit status is an error, and the service never
/// listens.
#[test]
fn malformed_store_flags_are_refused_before_listening() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_orders"))
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(out.stdout.is_empty(), "{args:?} never listened");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let pg = ("DATABASE_URL", "postgres://127.0.0.1:1/none");
    let stderr = run(&["--store", "mongodb"], &[]);
    assert!(
        stderr.contains("invalid value 'mongodb' for '--store"),
        "{stderr}"
    );
    let stderr = run(&["--store", ""], &[]);
    assert!(stderr.contains("--store"), "{stderr}");
    for url in [
        "",
        "not a url",
        "http://127.0.0.1:6379",
        "redis://[::1",
        "redis://\u{1F4A5}",
    ] {
        let stderr = run(&["--store", "redis", "--redis-url", url], &[pg]);
        assert!(
            stderr.contains("--store redis: idem's store"),
            "{url:?}: {stderr}"
        );
    }
    // A cluster's seed list with one bad seed.
    let stderr = run(
        &[
            "--store",
            "redis",
            "--redis-url",
            "redis://127.0.0.1:1,redis://[::1",
        ],
        &[pg],
    );
    assert!(stderr.contains("--store redis: idem's store"), "{stderr}");
    // The replica wait is a duration, whether from the flag or the environment.
    for wait in ["", "soon", "-1s", "5 parsecs", "99999999999999999999s"] {
        let flag = format!("--replica-wait={wait}");
        let stderr = run(&["--store", "redis", &flag], &[pg]);
        assert!(stderr.contains("--replica-wait"), "{wait:?}: {stderr}");
        let stderr = run(&["--store", "redis"], &[pg, ("REDIS_REPLICA_WAIT", wait)]);
        assert!(stderr.contains("--replica-wait"), "{wait:?}: {stderr}");
    }
}

/// A NUL in an identifier is a 422 naming the field on every store, not the 500 that
/// PostgreSQL's `text` (which cannot hold U+0000) made of it; nothing is written.
#[tokio::test]
async fn a_control_character_in_an_identifier_is_a_422_on_every_store() {
    let http = client();
    let mut bad = order(1999);
    bad["customer_id"] = "cus_\u{0}42".into();
    let (_dir, db) = temp_db();
    let sqlite = Service::start(&db, &[]);
    let reply = try_post(&http, &sqlite.url, Some("k-nul"), &bad)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
    assert!(
        reply.json().to_string().contains("customer_id"),
        "{reply:?}"
    );
    assert_eq!(count_sqlite(&db).await, 0);
    let Some(url) = scratch_url("a NUL in an identifier on PostgreSQL").await else {
        return;
    };
    let postgres = Service::postgres(&url, &[]);
    let reply = try_post(&http, &postgres.url, Some("k-nul"), &bad)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
    assert!(
        reply.json().to_string().contains("customer_id"),
        "{reply:?}"
    );
    let again = try_post(&http, &postgres.url, Some("k-nul"), &bad)
        .await
        .unwrap();
    assert!(
        again.replayed(),
        "the 422 is the operation's answer: {again:?}"
    );
    assert_eq!(count_pg(&url).await, 0);
}
