//! `idem monday` through the real binary, against real services on 127.0.0.1: an idem
//! service (an SQLite store, the test-fault protocol) passes every proof it can check
//! from outside, a service without idempotency fails the proofs it breaks, and bad input
//! gets a precise message and a non-zero exit, never a panic.
#![cfg(feature = "monday")]

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_contract::extension::{ClientIdentity, Extension};
use idem_contract::*;
use idem_runtime::enforce::{Contracted, Enforced};
use idem_runtime::recovery::{Decision, Recover, Recoverer, UnknownOperation};
use idem_runtime::store::SqliteStore;
use idem_runtime::{Idem, Lookup, OperationStatus, identity};

const CONTRACT: Contract = Contract {
    operation: Cow::Borrowed("create_order"),
    key_scope: KeyScope::CLIENT,
    fingerprint: Fingerprint::Fields(Cow::Borrowed(&[FieldPath::from_static("amount")])),
    fingerprint_query: Cow::Borrowed(&[]),
    ttl: idem_contract::Duration::from_millis(86_400_000),
    deadline: Deadline {
        total: idem_contract::Duration::from_millis(30_000),
        per_attempt: Some(idem_contract::Duration::from_millis(10_000)),
    },
    max_attempts: 4,
    retryable: Cow::Borrowed(&[
        Retryable::Status(idem_contract::StatusCode(429)),
        Retryable::Status(idem_contract::StatusCode(503)),
    ]),
    concurrency: Concurrency::Conflict {
        retry_after: DEFAULT_CONFLICT_RETRY_AFTER,
    },
    status_lookup: StatusLookup {
        handler: Cow::Borrowed("order_status"),
        path: Some(Cow::Borrowed("/orders/operations/{key}")),
    },
    recovery: Recovery::Reconcile {
        function: Cow::Borrowed("reconcile_order"),
    },
};

#[derive(Clone, Default)]
struct Orders {
    count: Arc<AtomicU64>,
    by_operation: Arc<Mutex<HashMap<String, serde_json::Value>>>,
}

struct CreateOrder;
impl Contracted for CreateOrder {
    const CONTRACT: &'static Contract = &CONTRACT;
}
impl Recover<Orders> for CreateOrder {
    fn recoverer(state: &Orders) -> Recoverer {
        Recoverer::reconcile_with(state.clone(), reconcile_order)
    }
}

async fn reconcile_order(orders: Orders, op: UnknownOperation) -> Decision {
    let found = orders
        .by_operation
        .lock()
        .unwrap()
        .get(&op.operation_id.to_string())
        .cloned();
    match found {
        Some(order) => Decision::applied((StatusCode::CREATED, Json(order))),
        None => Decision::NotApplied,
    }
}

async fn create_order(
    State(orders): State<Orders>,
    enforced: Enforced<Json<serde_json::Value>, CreateOrder>,
) -> Response {
    let (Json(body), guard) = enforced.into_parts();
    let operation_id = guard.operation_id().to_string();
    guard
        .run(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let id = orders.count.fetch_add(1, Ordering::SeqCst) + 1;
            let order = serde_json::json!({ "id": id, "amount": body["amount"] });
            orders
                .by_operation
                .lock()
                .unwrap()
                .insert(operation_id, order.clone());
            (StatusCode::CREATED, Json(order))
        })
        .await
}

async fn order_status(
    lookup: Lookup<CreateOrder>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> OperationStatus {
    lookup.status(&key).await
}

async fn effects(State(orders): State<Orders>) -> String {
    orders.count.load(Ordering::SeqCst).to_string()
}

/// Serves `router` on 127.0.0.1; the base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// The idem service over an SQLite file in `dir`; its base URL and the store's path.
async fn idem_service(dir: &Path) -> (String, PathBuf) {
    let db = dir.join("records.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(300))
        .test_faults()
        .build();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .route("/effects", get(effects))
        .with_state(Orders::default())
        .layer(idem.layer());
    (serve(router).await, db)
}

/// A service without idempotency: every request runs the effect, no fault is honoured.
async fn broken_service() -> String {
    let count = Arc::new(AtomicU64::new(0));
    let router = Router::new()
        .route(
            "/orders",
            post(|State(count): State<Arc<AtomicU64>>| async move {
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                (StatusCode::CREATED, format!(r#"{{"id":{n}}}"#)).into_response()
            }),
        )
        .route(
            "/effects",
            get(|State(count): State<Arc<AtomicU64>>| async move {
                count.load(Ordering::SeqCst).to_string()
            }),
        )
        .with_state(count);
    serve(router).await
}

/// The published document: `POST /orders` with its `x-idempotency`.
fn spec(dir: &Path) -> PathBuf {
    let extension = Extension::new(
        &CONTRACT,
        "create_order",
        Some(ClientIdentity::header("x-client-id")),
    );
    let document = serde_json::json!({
        "openapi": "3.1.0",
        "info": {"title": "Orders", "version": "1"},
        "paths": {
            "/orders": {"post": {
                "operationId": "create_order",
                "x-idempotency": extension,
                "responses": {"201": {"description": "created"}}
            }}
        }
    });
    let path = dir.join("openapi.json");
    std::fs::write(&path, serde_json::to_string_pretty(&document).unwrap()).unwrap();
    path
}

/// Runs the binary with `args` off the runtime (the services run on it meanwhile).
async fn idem(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("monday")
            .args(&args)
            .output()
            .expect("the idem binary runs")
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The arguments of a run against `base` with the document `spec`.
fn args(spec: &Path, base: &str) -> Vec<String> {
    [
        "--spec",
        &spec.display().to_string(),
        "--operation",
        "create_order",
        "--base-url",
        base,
        "--request-body",
        r#"{"amount": 1250}"#,
        "--client-header",
        "x-client-id=monday",
        "--effects-url",
        &format!("{base}/effects"),
        "--recovery-within",
        "3s",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idem_service_passes_every_proof_checkable_from_outside() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let (base, db) = idem_service(dir.path()).await;
    let mut args = args(&spec, &base);
    args.extend(["--store".to_owned(), db.display().to_string()]);
    let out = idem(args).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("idem monday: the Monday test against POST /orders at http://127.0.0.1:"),
        "{stdout}"
    );
    // Proofs 1 to 3 from HTTP, 5 through the store's operator calls; 4 is the service's
    // own trace, out of reach, and says so.
    assert!(
        stdout.contains("passed: 24 of 30 proofs checked, 0 failed, 6 not checked"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("not checked  idem monday runs outside the service")
            .count(),
        6,
        "{stdout}"
    );
    assert_eq!(stdout.matches("nothing to restore").count(), 6, "{stdout}");
    assert!(
        stdout.contains("#1 lease ended, #2 completed 201"),
        "{stdout}"
    );
}

/// A contracts file holding the contract, with `POST /orders` as its route or none.
fn contracts(dir: &Path, routed: bool) -> PathBuf {
    let file = ContractsFile {
        version: idem_contract::file::CONTRACTS_FILE_VERSION,
        contracts: vec![ContractEntry {
            target: routed.then(|| Target::Path {
                method: "post".into(),
                path: "/orders".into(),
            }),
            contract: CONTRACT,
        }],
    };
    let path = dir.join(if routed {
        "routed.json"
    } else {
        "unrouted.json"
    });
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contracts_file_serves_as_well_as_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = idem_service(dir.path()).await;
    let spec = spec(dir.path());
    let mut args = args(&spec, &base);
    args[0] = "--contracts".into();
    args[1] = contracts(dir.path(), true).display().to_string();
    let out = idem(args.clone()).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // No --store: proofs 4 and 5 are not checked, and say why.
    assert!(
        stdout.contains("passed: 18 of 30 proofs checked, 0 failed, 12 not checked"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("not checked  no --store").count(),
        6,
        "{stdout}"
    );
    // A contract without a route needs `--route`.
    args[1] = contracts(dir.path(), false).display().to_string();
    let out = idem(args.clone()).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("the contracts file names no route for `create_order`: give it with `--route \"POST /…\"`"),
        "{}",
        text(&out.stderr)
    );
    args.extend(["--route".to_owned(), "POST /orders".to_owned()]);
    let out = idem(args).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_idempotency_fails_and_names_the_failed_proofs() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let base = broken_service().await;
    let out = idem(args(&spec, &base)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("FAILED: "), "{stdout}");
    assert!(stderr.contains("proof(s) failed:"), "{stderr}");
    assert!(
        stderr.contains("lost answer: 1 at most one result"),
        "{stderr}"
    );
    assert!(
        stderr.contains("crash midway: 3 stored result or state"),
        "{stderr}"
    );
    // Without `--store`, proof 5 is not checked, and says why.
    assert!(stdout.contains("not checked  no --store"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_precise_message_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let (base, _) = idem_service(dir.path()).await;
    // Nothing listens on the port of a listener just closed.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    let with = |changes: &[(&str, &str)]| {
        let mut args = args(&spec, &base);
        for (flag, value) in changes {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1] = (*value).to_owned();
        }
        args
    };
    let missing = dir.path().join("missing.yaml").display().to_string();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            with(&[("--operation", "refund")]),
            "the document has no operation `refund`; those with a contract are `create_order`".into(),
        ),
        (
            with(&[("--base-url", "http://10.0.0.7:3000")]),
            "the base URL `http://10.0.0.7:3000` is not on loopback".into(),
        ),
        (with(&[("--spec", missing.as_str())]), "cannot read it".into()),
        (
            with(&[("--base-url", closed.as_str())]),
            "cannot be reached".into(),
        ),
        (
            with(&[("--request-body", "{not json")]),
            "the request body (the JSON given) is not JSON".into(),
        ),
        (
            with(&[("--client-header", "x-client-id")]),
            "write it `NAME=VALUE`".into(),
        ),
        (
            {
                let mut args = with(&[]);
                let at = args.iter().position(|a| a == "--effects-url").unwrap();
                args[at] = "--effects-command".into();
                args[at + 1] = "echo garbage".into();
                args
            },
            "counting the business effects failed: the effects command `echo garbage` gave `garbage`, not a number of effects".into(),
        ),
        (
            {
                let mut args = with(&[]);
                let at = args.iter().position(|a| a == "--client-header").unwrap();
                args.drain(at..at + 2);
                args
            },
            "the contract says the client is named by the header `x-client-id`: give `--client-header x-client-id=VALUE`".into(),
        ),
    ];
    for (args, expected) in cases {
        let out = idem(args.clone()).await;
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{args:?}\n{stdout}\n{stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
