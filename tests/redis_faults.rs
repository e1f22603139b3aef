//! The Redis store against servers configured the way real deployments break: full under
//! `maxmemory` with `noeviction`, evicting, a read-only replica, restarted without
//! persistence, scripts flushed, a password required, the connection killed. Every server
//! is the test's own (a free port of 127.0.0.1, killed when the test ends), never the
//! shared one on 6379.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::{T0, TTL, new_record};
use idem_runtime::store::{
    Begin, OperatorStore, RecordKey, RecordState, RecordStore, StoreError, StoredResponse,
};
use serde_json::json;

use common::redis::{
    OwnRedis, assert_store_full, assert_store_unavailable, order, redis_server, service,
    until_created,
};

/// Writes values until the server refuses even a small one with OOM: 64 KiB ones first,
/// then smaller (a refused large write frees its own query buffer, which leaves room for
/// small ones). At most 4,000 writes.
async fn fill(conn: &mut redis::aio::MultiplexedConnection) {
    let mut i = 0;
    for size in [64 * 1024, 4 * 1024, 256, 16] {
        let value = vec![b'x'; size];
        loop {
            assert!(i < 4_000, "the server never said it was full");
            let written: Result<(), redis::RedisError> = redis::cmd("SET")
                .arg(format!("filler:{i}"))
                .arg(&value)
                .query_async(conn)
                .await;
            i += 1;
            if let Err(error) = written {
                assert_eq!(error.code(), Some("OOM"), "{error}");
                break;
            }
        }
    }
    // Full is fuzzy: a connection that closes frees its buffers, and a small write fits
    // again (the fill's own connection, with the query buffer its 64 KiB values grew, is
    // closed right after). Keep the server full: `maxmemory` 512 KiB below what it uses.
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used - 512 * 1024)
        .query_async(conn)
        .await
        .unwrap();
}

async fn unfill(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("2mb")
        .query_async(conn)
        .await
        .unwrap();
    for i in 0..4_000 {
        let _: () = redis::cmd("DEL")
            .arg(format!("filler:{i}"))
            .query_async(conn)
            .await
            .unwrap();
    }
}

fn ok_response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![],
        body: bytes_of(b"{}"),
    }
}

fn bytes_of(b: &[u8]) -> axum::body::Bytes {
    axum::body::Bytes::copy_from_slice(b)
}

// ---------------------------------------------------------------------------------------
// 1. Full under maxmemory with noeviction.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_fails_closed_and_a_refused_completion_is_not_replayed() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(
        &binary,
        &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"],
    );
    let store = idem::RedisStore::connect(&redis.url()).await.unwrap();
    let (server, books) = service(store).await;

    // The handler of `cut` fills the server: its effect is made, its completion refused.
    let url = redis.url();
    books.hook(
        "cut",
        Arc::new(move || {
            let url = url.clone();
            Box::pin(async move {
                let mut conn = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                fill(&mut conn).await;
            })
        }),
    );
    let cut = order(&server, "cut", 7).await;
    assert_store_full(&cut, "a refused completion");
    assert_eq!(books.effects("cut"), 1);

    // Full: a new key is refused before its handler runs.
    let refused = order(&server, "new", 1).await;
    assert_store_full(&refused, "a registration on a full server");
    assert_eq!(
        books.effects("new"),
        0,
        "no handler runs without its record"
    );

    // The cut key, still full: never a replay of a result that was not stored.
    let again = order(&server, "cut", 7).await;
    assert!(
        matches!(again.status, 409 | 503) && !again.replayed(),
        "the cut key on a full server: {again:?}"
    );

    // Room again: the new key runs once, the cut key is decided by recovery (its effect
    // is found), and nothing runs twice.
    unfill(&mut redis.admin(None).await).await;
    let new = until_created(&server, "new", 1, Duration::from_secs(10)).await;
    assert!(!new.replayed());
    let decided = until_created(&server, "cut", 7, Duration::from_secs(30)).await;
    assert_eq!(decided.operation_id(), cut.operation_id());
    assert_eq!(decided.json(), json!({ "amount": 7 }));
    assert_eq!(books.effects("cut"), 1, "the cut key ran once");
    assert_eq!(books.effects("new"), 1);
}

/// Store level: on a full server every write that grows a record is refused as
/// Unavailable (a new key, an expired one, a released one reclaimed, a completion), reads
/// still answer, and a purge (which only deletes) still works.
#[tokio::test]
async fn a_full_redis_refuses_every_registration_as_unavailable() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(
        &binary,
        &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"],
    );
    let store = idem::RedisStore::connect(&redis.url()).await.unwrap();
    let (expired, released, live) = (
        RecordKey::new("op", "c", "expired"),
        RecordKey::new("op", "c", "released"),
        RecordKey::new("op", "c", "live"),
    );
    let mut short = new_record("sha256:a", T0);
    short.expires_at = T0 + 1_000;
    store.begin(&expired, &short, T0).await.unwrap();
    let r = new_record("sha256:a", T0);
    store.begin(&released, &r, T0).await.unwrap();
    store.release(&released, r.lease.token, T0).await.unwrap();
    let l = new_record("sha256:a", T0);
    store.begin(&live, &l, T0).await.unwrap();

    fill(&mut redis.admin(None).await).await;
    // Past the expired record's lease (its TTL end), within the live one's TTL.
    let now = T0 + idem_runtime::store::conformance::LEASE + 1;
    for key in [&RecordKey::new("op", "c", "new"), &expired, &released] {
        let begun = store.begin(key, &new_record("sha256:a", now), now).await;
        assert!(
            matches!(&begun, Err(e @ StoreError::Unavailable(_)) if e.is_full()),
            "{key:?} on a full server: {begun:?}"
        );
    }
    let completed = store
        .complete(&live, l.lease.token, &ok_response(), T0 + 1)
        .await;
    assert!(
        matches!(&completed, Err(e @ StoreError::Unavailable(_)) if e.is_full()),
        "{completed:?}"
    );
    // Nothing was half written: the records are as they were.
    assert!(
        store
            .get(&RecordKey::new("op", "c", "new"), now)
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        store.get(&released, now).await.unwrap().unwrap().state,
        RecordState::Released
    ));
    assert!(matches!(
        store.get(&live, now).await.unwrap().unwrap().state,
        RecordState::Processing { .. }
    ));
    assert!(matches!(
        store.begin(&live, &new_record("sha256:a", now), now).await,
        Ok(Begin::Exists(_))
    ));
    assert_eq!(
        store.purge_expired(now).await.unwrap(),
        1,
        "the expired record"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Eviction on.

/// Everything the subscriber writes, shared.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_evicting_server_is_warned_about_and_an_evicted_record_runs_again() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(
        &binary,
        &["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"],
    );
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let store = {
        let _guard = tracing::subscriber::set_default(subscriber);
        idem::RedisStore::connect(&redis.url()).await.unwrap()
    };
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("WARN") && logs.contains("allkeys-lru") && logs.contains("noeviction"),
        "connect warns about eviction: {logs}"
    );

    // A completed record, then writes until Redis has evicted it (bounded).
    let k = RecordKey::new("op", "c", "k");
    let first = new_record("sha256:a", T0);
    store.begin(&k, &first, T0).await.unwrap();
    store
        .complete(&k, first.lease.token, &ok_response(), T0)
        .await
        .unwrap();
    let mut admin = redis.admin(None).await;
    let value = vec![b'x'; 16 * 1024];
    let mut evicted = false;
    for i in 0..2_000 {
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&value)
            .query_async(&mut admin)
            .await
            .unwrap();
        if store.get(&k, T0).await.unwrap().is_none() {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "allkeys-lru evicts the record under pressure");
    // What the docs say: the retry finds no record and runs as a new operation.
    let second = new_record("sha256:a", T0);
    let Begin::Started(record) = store.begin(&k, &second, T0 + 1).await.unwrap() else {
        panic!("an evicted key is registered again");
    };
    assert_eq!(record.operation_id, second.operation_id);
    assert_ne!(record.operation_id, first.operation_id);
}

// ---------------------------------------------------------------------------------------
// 3. A read-only replica.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_is_unavailable_not_corrupt() {
    let Some(binary) = redis_server() else { return };
    let primary = OwnRedis::start(&binary, &[]);
    let port = primary.port.to_string();
    let replica = OwnRedis::start(&binary, &["--replicaof", "127.0.0.1", &port]);
    let store = idem::RedisStore::connect(&replica.url()).await.unwrap();
    // A record written on the primary, once the replica has it.
    let on_primary = idem::RedisStore::connect(&primary.url()).await.unwrap();
    let k = RecordKey::new("op", "c", "k");
    let new = new_record("sha256:a", T0);
    on_primary.begin(&k, &new, T0).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(store.get(&k, T0).await, Ok(Some(_))) {
        assert!(Instant::now() < deadline, "the replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Reads work; every write the record's state allows is refused, as Unavailable.
    let begun = store
        .begin(
            &RecordKey::new("op", "c", "new"),
            &new_record("sha256:a", T0),
            T0,
        )
        .await;
    assert!(
        matches!(&begun, Err(StoreError::Unavailable(_))),
        "a registration on a replica: {begun:?}"
    );
    let completed = store
        .complete(&k, new.lease.token, &ok_response(), T0)
        .await;
    assert!(
        matches!(&completed, Err(StoreError::Unavailable(_))),
        "a completion on a replica: {completed:?}"
    );
    for result in [
        store.renew(&k, new.lease.token, T0 + 1, T0).await,
        store.release(&k, new.lease.token, T0).await,
        store.park_unknown(&k, new.lease.token, "r", T0).await,
    ] {
        assert!(
            matches!(&result, Err(StoreError::Unavailable(_))),
            "{result:?}"
        );
    }
    // The existing record (processing, lease live) is answered without a write.
    assert!(matches!(
        store.begin(&k, &new_record("sha256:a", T0), T0).await,
        Ok(Begin::Exists(_))
    ));
    assert!(matches!(
        store.purge_expired(T0 + TTL).await,
        Ok(0) | Err(StoreError::Unavailable(_))
    ));
    let (server, books) = service(store).await;
    let answer = order(&server, "k", 1).await;
    assert_store_unavailable(&answer, "a service on a replica");
    assert_eq!(books.effects("k"), 0);
}

// ---------------------------------------------------------------------------------------
// 4. Restarted without persistence while an attempt runs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_loses_the_running_key_and_says_so() {
    let Some(binary) = redis_server() else { return };
    let mut redis = OwnRedis::start(&binary, &["--maxmemory-policy", "noeviction"]);
    let store = idem::RedisStore::connect(&redis.url())
        .await
        .unwrap()
        .with_call_timeout(Duration::from_millis(500));
    let probe = store.clone();
    let (server, books) = service(store).await;
    let server = Arc::new(server);

    let entered = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let (e, g) = (entered.clone(), go.clone());
    books.hook(
        "slow",
        Arc::new(move || {
            let (e, g) = (e.clone(), g.clone());
            Box::pin(async move {
                e.notify_one();
                g.notified().await;
            })
        }),
    );
    let first = {
        let server = server.clone();
        tokio::spawn(async move { order(&server, "slow", 3).await })
    };
    entered.notified().await;
    redis.kill();
    redis.restart();
    // The store's connection is back before the attempt completes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe.get(&RecordKey::new("x", "x", "x"), T0).await.is_err() {
        assert!(Instant::now() < deadline, "the connection came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    go.notify_one();
    let first = first.await.unwrap();
    // The record is gone: `complete` answers LeaseLost, and the answer claims no result.
    assert_eq!(first.status, 503, "{first:?}");
    assert_eq!(first.slug(), "attempt-timed-out", "{first:?}");
    assert!(!first.replayed());
    assert_eq!(books.effects("slow"), 1);
    // The durability caveat, as documented: the retry is a new operation.
    let second = order(&server, "slow", 3).await;
    assert_eq!(second.status, 201, "{second:?}");
    assert_ne!(second.operation_id(), first.operation_id());
    assert_eq!(
        books.effects("slow"),
        2,
        "without persistence the retry runs again"
    );
}

#[tokio::test]
async fn after_a_restart_without_persistence_complete_is_lease_lost() {
    let Some(binary) = redis_server() else { return };
    let mut redis = OwnRedis::start(&binary, &[]);
    let store = idem::RedisStore::connect(&redis.url()).await.unwrap();
    let k = RecordKey::new("op", "c", "k");
    let new = new_record("sha256:a", T0);
    store.begin(&k, &new, T0).await.unwrap();
    redis.kill();
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match store
            .complete(&k, new.lease.token, &ok_response(), T0)
            .await
        {
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert!(matches!(answer, Err(StoreError::LeaseLost)), "{answer:?}");
    assert!(matches!(
        store.renew(&k, new.lease.token, T0 + 1, T0).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(
        store.get(&k, T0).await.unwrap().is_none(),
        "nothing is recreated"
    );
}

// ---------------------------------------------------------------------------------------
// 6. Scripts flushed from the server's cache.

#[tokio::test]
async fn flushed_scripts_are_loaded_again() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(&binary, &[]);
    let store = idem::RedisStore::connect(&redis.url()).await.unwrap();
    let mut admin = redis.admin(None).await;
    let flush = |mut admin: redis::aio::MultiplexedConnection| async move {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
    };
    for i in 0..3 {
        let k = RecordKey::new("op", "c", format!("k{i}"));
        let new = new_record("sha256:a", T0);
        flush(admin.clone()).await;
        assert!(matches!(
            store.begin(&k, &new, T0).await.unwrap(),
            Begin::Started(_)
        ));
        flush(admin.clone()).await;
        store
            .renew(&k, new.lease.token, T0 + 60_000, T0)
            .await
            .unwrap();
        flush(admin.clone()).await;
        store
            .complete(&k, new.lease.token, &ok_response(), T0)
            .await
            .unwrap();
        flush(admin.clone()).await;
        assert!(matches!(
            store
                .begin(&k, &new_record("sha256:a", T0), T0)
                .await
                .unwrap(),
            Begin::Exists(_)
        ));
        flush(admin.clone()).await;
        assert_eq!(store.purge_expired(T0 + TTL).await.unwrap(), 1);
    }
    let _: () = redis::cmd("PING").query_async(&mut admin).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// 8. A password required; the connection killed.

#[tokio::test]
async fn a_server_that_wants_a_password_is_unavailable_at_connect() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(&binary, &["--requirepass", "s3cret"]);
    let started = Instant::now();
    let refused = idem::RedisStore::connect(&redis.url()).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(_))),
        "no password: {refused:?}"
    );
    let wrong =
        idem::RedisStore::connect(&format!("redis://:wrong@127.0.0.1:{}", redis.port)).await;
    assert!(
        matches!(&wrong, Err(StoreError::Unavailable(_))),
        "a wrong password: {wrong:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let store = idem::RedisStore::connect(&format!("redis://:s3cret@127.0.0.1:{}", redis.port))
        .await
        .expect("the right password");
    let k = RecordKey::new("op", "c", "k");
    assert!(matches!(
        store
            .begin(&k, &new_record("sha256:a", T0), T0)
            .await
            .unwrap(),
        Begin::Started(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_re_established_under_load() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(&binary, &[]);
    let store = idem::RedisStore::connect(&redis.url())
        .await
        .unwrap()
        .with_call_timeout(Duration::from_millis(500));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for c in 0..4 {
        let (store, stop) = (store.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let (mut ok, mut failed, mut n) = (0u32, 0u32, 0u32);
            while !stop.load(Ordering::SeqCst) && n < 100_000 {
                let k = RecordKey::new("op", format!("c{c}"), format!("k{n}"));
                let new = new_record("sha256:a", T0);
                match store.begin(&k, &new, T0).await {
                    Ok(Begin::Started(record)) => {
                        assert_eq!(record.operation_id, new.operation_id);
                        ok += 1;
                    }
                    Ok(Begin::Exists(record)) => {
                        // A registration whose answer was lost with the connection.
                        assert!(matches!(record.state, RecordState::Processing { .. }));
                        ok += 1;
                    }
                    Ok(Begin::OverBudget(over)) => panic!("no budget was asked for: {over:?}"),
                    Err(StoreError::Unavailable(_)) => failed += 1,
                    Err(other) => panic!("only Unavailable while the connection breaks: {other}"),
                }
                n += 1;
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admin = redis.admin(None).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the store's connection was killed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Back within seconds, the same store.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let k = RecordKey::new("op", "probe", uuid::Uuid::new_v4().to_string());
        if store
            .begin(&k, &new_record("sha256:a", T0), T0)
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the connection was not re-established"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut failed) = (0, 0);
    for task in load {
        let (o, f) = task.await.unwrap();
        ok += o;
        failed += f;
    }
    eprintln!("{ok} registrations, {failed} unavailable around the kill");
    assert!(ok > 0);
}

// ---------------------------------------------------------------------------------------
// More: a server that stalls past the call timeout; a server without CONFIG.

/// Calls that time out while the server is paused leave their answers to arrive late on
/// the shared connection: no later call may receive an answer meant for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_after_timeouts_go_to_their_own_calls() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(&binary, &[]);
    let store = idem::RedisStore::connect(&redis.url())
        .await
        .unwrap()
        .with_call_timeout(Duration::from_millis(150));
    let keys: Vec<RecordKey> = (0..8)
        .map(|i| RecordKey::new("op", "c", format!("k{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        store
            .begin(k, &new_record(&format!("sha256:{i}"), T0), T0)
            .await
            .unwrap();
    }
    let mut admin = redis.admin(None).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2_000)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    // Every call times out; their answers come once the pause ends.
    let paused = Instant::now();
    let mut timed_out = 0;
    for (i, k) in keys.iter().enumerate() {
        let answer = if i % 2 == 0 {
            store.get(k, T0).await.map(|_| ())
        } else {
            store
                .begin(
                    &RecordKey::new("op", "c", format!("late{i}")),
                    &new_record("sha256:late", T0),
                    T0,
                )
                .await
                .map(|_| ())
        };
        if matches!(answer, Err(StoreError::Unavailable(_))) {
            timed_out += 1;
        }
    }
    assert!(
        paused.elapsed() < Duration::from_millis(1_900),
        "all within the pause"
    );
    assert_eq!(
        timed_out,
        keys.len(),
        "the paused server timed every call out"
    );
    tokio::time::sleep(Duration::from_millis(2_100).saturating_sub(paused.elapsed())).await;
    // Each call now gets its own answer, many times over and concurrently.
    for _ in 0..20 {
        let reads = keys.iter().map(|k| store.get(k, T0));
        let records = futures_util::future::join_all(reads).await;
        for (i, record) in records.into_iter().enumerate() {
            let record = record.unwrap().expect("kept");
            assert_eq!(record.fingerprint, format!("sha256:{i}"), "k{i}");
        }
    }
    // A late registration either happened or did not: it is the late one, never another.
    for i in (1..8).step_by(2) {
        if let Some(record) = store
            .get(&RecordKey::new("op", "c", format!("late{i}")), T0)
            .await
            .unwrap()
        {
            assert_eq!(record.fingerprint, "sha256:late");
        }
    }
}

/// A managed service that refuses `CONFIG`: connect still works (no eviction check), and
/// so does everything else.
#[tokio::test]
async fn a_server_without_config_is_not_checked_but_works() {
    let Some(binary) = redis_server() else { return };
    let redis = OwnRedis::start(&binary, &["--rename-command", "CONFIG", ""]);
    let store = idem::RedisStore::connect(&redis.url()).await.unwrap();
    let k = RecordKey::new("op", "c", "k");
    let new = new_record("sha256:a", T0);
    store.begin(&k, &new, T0).await.unwrap();
    store
        .complete(&k, new.lease.token, &ok_response(), T0)
        .await
        .unwrap();
    assert!(matches!(
        store.get(&k, T0).await.unwrap().unwrap().state,
        RecordState::Completed { .. }
    ));
}
