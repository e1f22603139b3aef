//! Micro-benchmarks of idem's request path, without sockets: what one request costs in
//! idem's own code, against the same handler bare. `cargo bench -p idem-bench --bench paths`.
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `request::bare` | `POST /orders` through the bare router (`tower::ServiceExt::oneshot`): the handler alone |
//! | `request::new_key` | the same request under the contract with `MemoryStore`, a fresh idempotency key each time: key, fingerprint, registration, the handler on its own task, the result captured and stored |
//! | `request::replay` | the same request with a key the store has completed: the stored 201 rebuilt and answered, the handler not run |
//! | `store::register` | `MemoryStore::begin` of a new key (the atomic insert-if-absent alone) |
//! | `store::complete` | `MemoryStore::begin` then `complete` with the handler's 201 (the record as a completed key keeps it) |
//! | `store::replay_read` | `MemoryStore::get` of a completed key (what a replay reads) |
//!
//! The fingerprint of a 1 KiB body, against plain SHA-256, is `idem-runtime`'s bench
//! `fingerprint` (`cargo bench -p idem-runtime --bench fingerprint`).
//!
//! divan's `AllocProfiler` is the global allocator here, so each row also gives the
//! allocations (count and bytes) per iteration. After divan's table, `main` prints a
//! summary: nanoseconds per request of each path and the ratio to bare (best of 5 loops),
//! and **the record's size**: the resident memory that 1,000,000 completed records of the
//! benchmark's 201 (a ≈150-byte body and its `Location`) add to a fresh `MemoryStore`,
//! per record, and per record beyond the stored body and header (the goal of issue 10 is
//! ≤ 0.5 KB). `IDEM_BENCH_RECORDS` changes the count. A filter (divan's, such as
//! `-- request::replay`) runs only the benchmarks it names, without the summary: the way
//! to profile one path with `perf record`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use bytes::Bytes;
use futures_util::FutureExt;
use idem::store::{Begin, Lease, NewRecord, OwnerToken, RecordKey, RecordStore, StoredResponse};
use idem::{MemoryStore, OperationId};
use idem_bench::load::BODY;
use idem_bench::serve::{self, Variant};
use tower::ServiceExt;

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

/// A number for a fresh key, unique in the process.
fn next() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The runtime the requests run on: the handler of a contracted request runs on a task
/// of its own, so a runtime is needed. A current-thread one, so that every allocation of
/// a request is made on the bench's thread, where divan's `AllocProfiler` counts it.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// `POST /orders` as the harness sends it: client 7, key `key`.
fn request(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-client-id", "client-7")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .expect("a request")
}

/// Sends `request` to `router` and checks the status.
async fn send(router: &Router, request: Request<Body>, want: StatusCode) {
    let response = router.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), want);
    // The body is part of the answer's cost.
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await;
    black_box(body.expect("a body"));
}

/// Which request each path sends.
#[derive(Clone, Copy, Debug)]
enum Path {
    Bare,
    NewKey,
    Replay,
}

/// A router for `path` and the one request of a replay (completed before the clock runs).
fn setup(rt: &tokio::runtime::Runtime, path: Path) -> Router {
    let variant = match path {
        Path::Bare => Variant::Bare,
        Path::NewKey | Path::Replay => Variant::Idem,
    };
    let router = serve::router(variant);
    if let Path::Replay = path {
        rt.block_on(send(&router, request("replayed"), StatusCode::CREATED));
    }
    router
}

/// One request of `path`.
fn one(rt: &tokio::runtime::Runtime, router: &Router, path: Path) {
    rt.block_on(async {
        match path {
            Path::Bare | Path::NewKey => {
                let key = format!("k-{}", next());
                send(router, request(&key), StatusCode::CREATED).await;
            }
            Path::Replay => send(router, request("replayed"), StatusCode::CREATED).await,
        }
    });
}

mod request {
    use super::*;

    fn bench(bencher: divan::Bencher, path: Path) {
        let rt = runtime();
        let router = setup(&rt, path);
        bencher.bench_local(|| one(&rt, &router, path));
    }

    #[divan::bench]
    fn bare(bencher: divan::Bencher) {
        bench(bencher, Path::Bare);
    }

    #[divan::bench]
    fn new_key(bencher: divan::Bencher) {
        bench(bencher, Path::NewKey);
    }

    #[divan::bench]
    fn replay(bencher: divan::Bencher) {
        bench(bencher, Path::Replay);
    }
}

/// The 201 the handler answers: its JSON body (≈150 bytes) and `Location`.
fn stored_201() -> StoredResponse {
    let id = format!("ord_{}", uuid::Uuid::now_v7().simple());
    let body = format!(
        r#"{{"id":"{id}","customer_id":"cus_42","amount_minor":1999,"status":"created","created_at":"2026-12-03T08:00:00.000Z"}}"#
    );
    StoredResponse {
        status: 201,
        headers: vec![
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::LOCATION,
                HeaderValue::from_str(&format!("/orders/{id}")).expect("a header value"),
            ),
        ],
        body: Bytes::from(body),
    }
}

/// The record key of client 7's key number `n`.
fn record_key(n: u64) -> RecordKey {
    RecordKey::new("create_order", "client-7", format!("k-{n}"))
}

/// A registration as the runtime makes it, at `now`.
fn new_record(now: u64) -> NewRecord {
    NewRecord {
        operation_id: OperationId::new(),
        fingerprint: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
            .into(),
        lease: Lease {
            token: OwnerToken::random(),
            until: now + 2_000,
        },
        expires_at: now + 86_400_000,
        transactional: false,
        holds_until: now + 10_000,
        budget: None,
    }
}

/// `begin` then `complete`, as one new key does; `MemoryStore` never waits, so its
/// futures are ready at once.
fn complete_one(store: &MemoryStore, n: u64, response: &StoredResponse) {
    let (key, new) = (record_key(n), new_record(NOW));
    let begun = store.begin(&key, &new, NOW).now_or_never().expect("ready");
    assert!(matches!(begun, Ok(Begin::Started(_))));
    let done = store
        .complete(&key, new.lease.token, response, NOW)
        .now_or_never();
    assert!(matches!(done, Some(Ok(()))));
}

/// A fixed clock: the records of these benchmarks never expire.
const NOW: u64 = 1_800_000_000_000;

mod store {
    use super::*;

    #[divan::bench]
    fn register(bencher: divan::Bencher) {
        let store = MemoryStore::new();
        bencher
            .with_inputs(|| (record_key(next()), new_record(NOW)))
            .bench_local_refs(|(key, new)| {
                let begun = store.begin(key, new, NOW).now_or_never().expect("ready");
                black_box(begun.expect("registered"));
            });
    }

    #[divan::bench]
    fn complete(bencher: divan::Bencher) {
        let (store, response) = (MemoryStore::new(), stored_201());
        bencher.bench_local(|| complete_one(&store, next(), &response));
    }

    #[divan::bench]
    fn replay_read(bencher: divan::Bencher) {
        let (store, response) = (MemoryStore::new(), stored_201());
        let n = next();
        complete_one(&store, n, &response);
        let key = record_key(n);
        bencher.bench_local(|| {
            let record = store.get(&key, NOW).now_or_never().expect("ready");
            black_box(record.expect("read").expect("a record"));
        });
    }
}

/// Nanoseconds per call of `f`, the best of 5 loops of `n` calls.
fn ns_per_call(n: u32, mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(n)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The summary after divan's table: each path against bare, and the record's size.
fn summary() {
    let rt = runtime();
    let n = 20_000;
    let mut rows = Vec::new();
    for path in [Path::Bare, Path::NewKey, Path::Replay] {
        let router = setup(&rt, path);
        rows.push((path, ns_per_call(n, || one(&rt, &router, path))));
    }
    let bare = rows[0].1;
    println!("\nrequests through the router (tower oneshot, no socket), best of 5 loops of {n}\n");
    println!("| path | ns per request | requests/s of one core | ratio to bare (rate) |");
    println!("|---|---|---|---|");
    for (path, ns) in &rows {
        println!(
            "| {path:?} | {ns:.0} | {:.0} | {:.2} |",
            1e9 / ns,
            bare / ns
        );
    }

    let records: u64 = std::env::var("IDEM_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let response = stored_201();
    let stored = response.size() as f64;
    let store = Arc::new(MemoryStore::new());
    let before = serve::rss_kb();
    let base = next() + 1_000_000_000;
    for i in 0..records {
        complete_one(&store, base + i, &response);
    }
    let after = serve::rss_kb();
    let per_record = (after.saturating_sub(before) as f64) * 1024.0 / records as f64;
    println!("\nthe record's size: {records} completed records in a fresh MemoryStore\n");
    println!("| what | bytes per record |");
    println!("|---|---|");
    println!("| resident memory added (VmRSS {before} kB -> {after} kB) | {per_record:.0} |");
    println!("| the stored result (body, `Content-Type`, `Location`) | {stored:.0} |");
    println!(
        "| beyond the stored result (goal ≤ 512) | {:.0} |",
        per_record - stored
    );
    println!(
        "| the record key (operation, client, key) as sent | {} |",
        "create_order".len() + "client-7".len() + format!("k-{base}").len()
    );
    drop(store);
}

fn main() {
    divan::main();
    // With a filter (`cargo bench -p idem-bench --bench paths -- request::replay`, as for
    // `perf record`), only the benchmarks it names run.
    let filtered = std::env::args()
        .skip(1)
        .any(|arg| !arg.starts_with('-') && arg != "--bench");
    if !filtered {
        summary();
    }
}
