//! `idem monday` through the real binary, against real services on 127.0.0.1: an idem
//! service (an SQLite store, the test-fault protocol) passes every proof it can check
//! from outside, a service without idempotency fails the proofs it breaks, and bad input
//! gets a precise message and a non-zero exit, never a panic. Services it must not blame:
//! one without the test-fault protocol, one that names its operations in another header,
//! one whose keys live in a cookie session of a tenant; one whose status lookup is routed
//! elsewhere fails proof 2, naming the URL it asked; a count in JSON is read at its
//! pointer.
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

/// How an idem service under test is set up.
#[derive(Clone, Copy)]
struct Setup {
    /// It honours the test-fault header (`IdemBuilder::test_faults`).
    faults: bool,
    /// Where its status lookup is routed.
    lookup: &'static str,
    /// The header its answers name their operation in.
    correlation: &'static str,
    /// Its client is the tenant `x-tenant` names, the client `x-client-id` names and the
    /// session the `sid` cookie names (a request to `/orders…` without one starts one).
    sessions: bool,
}

/// The service as the contract describes it.
const IDEM: Setup = Setup {
    faults: true,
    lookup: "/orders/operations/{key}",
    correlation: "operation-id",
    sessions: false,
};

/// The idem service over an SQLite file in `dir`; its base URL and the store's path.
async fn idem_service(dir: &Path) -> (String, PathBuf) {
    let (base, db, _) = idem_service_with(dir, IDEM).await;
    (base, db)
}

/// The idem service set up as `setup` says; its base URL, the store's path and the
/// number of sessions it started.
async fn idem_service_with(dir: &Path, setup: Setup) -> (String, PathBuf, Arc<AtomicU64>) {
    let db = dir.join("records.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let mut builder = match setup.sessions {
        true => Idem::builder(store, session_identity),
        false => Idem::builder(store, identity::header("x-client-id")),
    }
    .heartbeat(Duration::from_millis(300));
    if setup.faults {
        builder = builder.test_faults();
    }
    let idem = builder.build();
    let started = Arc::new(AtomicU64::new(0));
    let correlation = setup.correlation;
    let mut router = Router::new()
        .route("/orders", post(create_order))
        .route(setup.lookup, get(order_status))
        .route("/effects", get(effects))
        .route("/stats", get(stats))
        .with_state(Orders::default())
        .layer(idem.layer())
        .layer(axum::middleware::map_response(
            move |mut response: Response| async move {
                if let Some(id) = response.headers_mut().remove("operation-id") {
                    response.headers_mut().insert(correlation, id);
                }
                response
            },
        ));
    if setup.sessions {
        router = router.layer(axum::middleware::from_fn_with_state(
            Arc::clone(&started),
            start_session,
        ));
    }
    (serve(router).await, db, started)
}

/// The value of the `sid` cookie.
fn session(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("sid=").map(str::to_owned))
}

/// The client of a session-scoped service: tenant, client and session.
#[allow(
    clippy::result_large_err,
    reason = "a response is what axum rejects with"
)]
fn session_identity(parts: &axum::http::request::Parts) -> Result<String, Response> {
    let text = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    match (
        text("x-tenant"),
        text("x-client-id"),
        session(&parts.headers),
    ) {
        (Some(tenant), Some(client), Some(sid)) => Ok(format!("{tenant}/{client}/{sid}")),
        _ => Err(StatusCode::UNAUTHORIZED.into_response()),
    }
}

/// Starts a session for a request to `/orders…` that has none, and sets its cookie.
async fn start_session(
    State(started): State<Arc<AtomicU64>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !request.uri().path().starts_with("/orders") || session(request.headers()).is_some() {
        return next.run(request).await;
    }
    let sid = format!("s{}", started.fetch_add(1, Ordering::SeqCst) + 1);
    let cookie = format!("sid={sid}").parse().unwrap();
    request.headers_mut().append("cookie", cookie);
    let mut response = next.run(request).await;
    let set = format!("sid={sid}; Path=/orders; HttpOnly")
        .parse()
        .unwrap();
    response.headers_mut().append("set-cookie", set);
    response
}

async fn stats(State(orders): State<Orders>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "service": "orders",
        "orders": orders.count.load(Ordering::SeqCst),
        "ratio": 0.5,
    }))
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
        stderr.contains("concurrent, one key: 1 at most one result"),
        "{stderr}"
    );
    // The concurrent requests' effects, then the one after them, each counted apart.
    assert!(
        stdout.contains("10 effect(s) for 10 requests with one key at once, expected 1; 1 for the request after them (201)"),
        "{stdout}"
    );
    // It ignores the test-fault header: the scenarios that need it are not run, and
    // nothing is said of refusals or crashes that never happened.
    assert!(stdout.contains("test faults: NOT honoured"), "{stdout}");
    assert!(!stderr.contains("crash midway"), "{stderr}");
    assert!(!stdout.contains("behind the"), "{stdout}");
    // Without `--store`, proof 5 is not checked, and says why.
    assert!(stdout.contains("not checked  no --store"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `args` and then `more`.
fn with_more(mut args: Vec<String>, more: &[&str]) -> Vec<String> {
    args.extend(more.iter().map(|a| (*a).to_owned()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idem_service_without_test_faults_is_not_blamed_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let setup = Setup {
        faults: false,
        ..IDEM
    };
    let (base, db, _) = idem_service_with(dir.path(), setup).await;
    let db = db.display().to_string();
    let out = idem(with_more(args(&spec, &base), &["--store", &db])).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("test faults: NOT honoured (Idem-Test-Fault: answer-400 under a fresh key got 201 and 1 effect(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("IdemBuilder::test_faults()"), "{stdout}");
    // The lost answer and the concurrent requests: proofs 1 to 3 and 5.
    assert!(
        stdout.contains("passed: 8 of 30 proofs checked, 0 failed, 22 not checked"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("not checked  not run: the service does not honour Idem-Test-Fault")
            .count(),
        20,
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_correlating_by_another_header_passes_once_it_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let setup = Setup {
        correlation: "x-request-id",
        ..IDEM
    };
    let (base, db, _) = idem_service_with(dir.path(), setup).await;
    let out = idem(args(&spec, &base)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("has no Operation-Id header: proof 2 links the answers by it (Harness::operation_id_header, or idem monday's --operation-id-header, names the service's own correlation header)"),
        "{stdout}"
    );
    let db = db.display().to_string();
    let more = ["--operation-id-header", "X-Request-Id", "--store", &db];
    let out = idem(with_more(args(&spec, &base), &more)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("passed: 24 of 30 proofs checked, 0 failed, 6 not checked"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 answers under one X-Request-Id "),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_scoped_service_gets_every_client_header_and_one_session() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let setup = Setup {
        sessions: true,
        ..IDEM
    };
    // The session the service starts on the first answer is kept for the whole run.
    let (base, _, started) = idem_service_with(dir.path(), setup).await;
    let more = ["--client-header", "x-tenant=acme"];
    let out = idem(with_more(args(&spec, &base), &more)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("passed: 18 of 30 proofs checked, 0 failed, 12 not checked"),
        "{stdout}"
    );
    assert_eq!(started.load(Ordering::SeqCst), 1);
    // A session given as a cookie: the service never starts one, and the operator finds
    // the records under the client it names.
    let dir = tempfile::tempdir().unwrap();
    let (base, db, started) = idem_service_with(dir.path(), setup).await;
    let db = db.display().to_string();
    let more = [
        "--client-header",
        "x-tenant=acme",
        "--cookie",
        "sid=given",
        "--store",
        &db,
        "--client-identity",
        "acme/monday/given",
    ];
    let out = idem(with_more(args(&spec, &base), &more)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("passed: 24 of 30 proofs checked, 0 failed, 6 not checked"),
        "{stdout}"
    );
    assert_eq!(started.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_lookup_routed_elsewhere_fails_proof_2_naming_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let setup = Setup {
        lookup: "/operations/{key}",
        ..IDEM
    };
    let (base, _, _) = idem_service_with(dir.path(), setup).await;
    let out = idem(args(&spec, &base)).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "the status lookup GET {base}/orders/operations/monday-"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("answered 404: it does not answer for the operation's key"),
        "{stdout}"
    );
    assert!(
        stderr.contains("6 proof(s) failed:")
            && stderr.contains("lost answer: 2 linked, no new operation"),
        "{stderr}"
    );
    let more = ["--status-lookup", "/operations/{key}"];
    let out = idem(with_more(args(&spec, &base), &more)).await;
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_in_json_is_read_at_its_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let (base, _) = idem_service(dir.path()).await;
    let stats = format!("{base}/stats");
    let mut args = args(&spec, &base);
    let at = args.iter().position(|a| a == "--effects-url").unwrap();
    args[at + 1] = stats.clone();
    let out = idem(with_more(args.clone(), &["--effects-pointer", "/orders"])).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("passed: 18 of 30 proofs checked, 0 failed, 12 not checked"),
        "{stdout}"
    );
    for (more, expected) in [
        (
            vec![],
            "`, not a number of effects: name the count in it with `--effects-pointer /orders` (a JSON pointer)".to_owned(),
        ),
        (
            vec!["--effects-pointer", "/missing"],
            "where `/missing` names nothing (its members: `/".to_owned(),
        ),
        (
            vec!["--effects-pointer", "/ratio"],
            "gave `0.5` at `/ratio`, a number with a fraction, not a number of effects (a whole number, 0 or more)".to_owned(),
        ),
        (
            vec!["--effects-pointer", "/service"],
            "gave `\"orders\"` at `/service`, a string, not a number of effects".to_owned(),
        ),
    ] {
        let out = idem(with_more(args.clone(), &more)).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{more:?}: {stderr}");
        assert!(
            stderr.contains(&format!("counting the business effects failed: GET {stats} gave `")),
            "{more:?}: {stderr}"
        );
        assert!(stderr.contains(&expected), "{more:?}: {stderr}");
    }
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
            with(&[("--client-header", "x-client-id=")]),
            "`--client-header x-client-id=`: the value of `x-client-id` is empty".into(),
        ),
        (
            with(&[("--client-header", "=monday")]),
            "`--client-header =monday`: the name is empty".into(),
        ),
        (
            with_more(with(&[]), &["--client-header", "Cookie=sid=1"]),
            "`--client-header Cookie=sid=1`: cookies are given with `--cookie NAME=VALUE`".into(),
        ),
        (
            with_more(with(&[]), &["--client-header", "X-Client-Id=other"]),
            "`--client-header X-Client-Id=other`: `X-Client-Id` is given twice".into(),
        ),
        (
            with_more(with(&[]), &["--client-header", "idempotency-key=k"]),
            "`idempotency-key` carries the idempotency key".into(),
        ),
        (
            with_more(with(&[]), &["--cookie", "sid"]),
            "`--cookie sid`: write it `NAME=VALUE`".into(),
        ),
        (
            with_more(with(&[]), &["--cookie", "sid="]),
            "`--cookie sid=`: the value of `sid` is empty".into(),
        ),
        (
            with_more(with(&[]), &["--cookie", "=abc"]),
            "`--cookie =abc`: the name is empty".into(),
        ),
        (
            with_more(with(&[]), &["--cookie", "sid=a b"]),
            "`--cookie sid=a b`: the value of `sid` holds ' ', which a cookie value cannot".into(),
        ),
        (
            with_more(with(&[]), &["--effects-pointer", "orders"]),
            "`--effects-pointer orders`: a JSON pointer (RFC 6901) starts with `/`, such as `/orders`".into(),
        ),
        (
            with_more(with(&[]), &["--effects-pointer", ""]),
            "`--effects-pointer` is empty".into(),
        ),
        (
            with_more(with(&[]), &["--operation-id-header", ""]),
            "`--operation-id-header` is empty".into(),
        ),
        (
            with_more(with(&[]), &["--operation-id-header", "request id"]),
            "`--operation-id-header request id`: `request id` is not a header name".into(),
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
    // Every bad value is reported, not only the first.
    let both = with_more(with(&[]), &["--cookie", "sid", "--effects-pointer", "x"]);
    let stderr = text(&idem(both).await.stderr);
    assert!(
        stderr.contains("`--cookie sid`") && stderr.contains("`--effects-pointer x`"),
        "{stderr}"
    );
    for (args, expected) in cases {
        let out = idem(args.clone()).await;
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{args:?}\n{stdout}\n{stderr}");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
