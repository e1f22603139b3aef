//! `idem ops` against real stores (an SQLite file, a scratch schema of the PostgreSQL
//! server, a scratch prefix of the Redis server on 127.0.0.1): listing, showing and
//! resolving parked operations through the real binary, and bad input, each with a
//! precise message, a non-zero exit and the records unchanged.
#![cfg(feature = "ops")]

use std::ffi::OsStr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::conformance::{self, new_record};
use idem_runtime::store::{
    PostgresStore, RecordKey, RecordState, RecordStore, RedisStore, SqliteStore, StepState,
    StepWrite, Store, StoredResponse, unix_now,
};

fn idem<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("USER", "test-operator")
        .output()
        .expect("the idem binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `idem` with `args`, expects exit code `code` and returns stderr.
fn fails(args: &[&str], code: i32) -> String {
    let out = idem(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "idem {args:?} must exit with {code}; stdout: {}; stderr: {}",
        stdout(&out),
        stderr(&out)
    );
    stderr(&out)
}

fn succeeds(args: &[&str]) -> String {
    let out = idem(args);
    assert!(
        out.status.success(),
        "idem {args:?} must succeed; stderr: {}",
        stderr(&out)
    );
    stdout(&out)
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn k(name: &str) -> RecordKey {
    RecordKey::new("create_order", "acme", name)
}

/// Seeds `store`: `parked` and `parked-2` parked as unknown at attempt 1, `running`
/// processing under a live lease, `done` completed.
async fn seed(store: &dyn Store) {
    let now = unix_now();
    for name in ["parked", "parked-2", "running", "done"] {
        let new = new_record("sha256:a", now);
        store.begin(&k(name), &new, now).await.unwrap();
        if name == "parked" {
            // A charge at a provider, done before the attempt died.
            let step = StepWrite {
                operation_id: new.operation_id,
                index: 0,
                name: "charge".into(),
                state: StepState::Done(r#"{"id":"ch_1"}"#.into()),
            };
            store
                .write_step(&k(name), new.lease.token, &step, now)
                .await
                .unwrap();
        }
        match name {
            "parked" | "parked-2" => store
                .park_unknown(&k(name), new.lease.token, "no answer from the ledger", now)
                .await
                .unwrap(),
            "done" => store
                .complete(&k(name), new.lease.token, &conformance::created(), now)
                .await
                .unwrap(),
            _ => {}
        }
    }
}

async fn state(store: &dyn Store, name: &str) -> RecordState {
    store
        .get(&k(name), unix_now())
        .await
        .unwrap()
        .expect("the record")
        .state
}

/// The whole operator's path against one store: `store_args` name it on the command
/// line, `store` is the test's own handle on it.
async fn operate(store_args: &[&str], store: Arc<dyn Store>) {
    seed(&*store).await;
    let with = |rest: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = vec!["ops".into(), rest[0].into()];
        args.extend(store_args.iter().map(|s| (*s).to_owned()));
        args.extend(rest[1..].iter().map(|s| (*s).to_owned()));
        args
    };
    let run = |rest: &[&str]| with(rest);
    let key_of = |name: &str| {
        vec![
            "--operation".to_owned(),
            "create_order".to_owned(),
            "--client".to_owned(),
            "acme".to_owned(),
            "--key".to_owned(),
            name.to_owned(),
        ]
    };

    // list
    let listed = succeeds(&as_refs(&run(&["list", "--state", "unknown"])));
    assert!(
        listed.contains("parked ") && listed.contains("parked-2"),
        "{listed}"
    );
    assert!(
        !listed.contains("running") && !listed.contains("done"),
        "{listed}"
    );
    assert!(listed.contains("no answer from the ledger"), "{listed}");
    let json: serde_json::Value =
        serde_json::from_str(&succeeds(&as_refs(&run(&["list", "--json"])))).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 4, "{json}");
    let first: serde_json::Value = serde_json::from_str(&succeeds(&as_refs(&run(&[
        "list", "--json", "--limit", "2",
    ]))))
    .unwrap();
    let names: Vec<_> = first
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["done", "parked"], "in key order, at most --limit");
    let cut = succeeds(&as_refs(&run(&["list", "--limit", "2"])));
    assert!(cut.contains("the first 2 shown"), "{cut}");
    let none = succeeds(&as_refs(&run(&["list", "--operation", "other_op"])));
    assert!(none.contains("no operations found"), "{none}");

    // show
    let mut show = run(&["show"]);
    show.extend(key_of("parked"));
    let shown = succeeds(&as_refs(&show));
    assert!(shown.contains("#1"), "{shown}");
    assert!(
        shown.contains("parked as unknown: no answer from the ledger"),
        "{shown}"
    );
    assert!(shown.contains("--expect-attempt 1"), "{shown}");
    assert!(shown.contains("steps (the step journal"), "{shown}");
    assert!(
        shown.contains("charge") && shown.contains("done") && shown.contains("ch_1"),
        "{shown}"
    );
    show.push("--json".into());
    let shown: serde_json::Value = serde_json::from_str(&succeeds(&as_refs(&show))).unwrap();
    assert_eq!(
        shown["steps"],
        serde_json::json!([{"index": 0, "name": "charge", "state": "done", "calls": 1, "value": {"id": "ch_1"}}])
    );

    // bad input: each refused with its message, nothing changed
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("order.json");
    std::fs::write(
        &good,
        r#"{"status": 201, "headers": {"content-type": "application/json", "location": "/orders/42"}, "body": {"id": 42}}"#,
    )
    .unwrap();
    let good = good.to_str().unwrap().to_owned();
    let resolve = |name: &str, extra: &[&str]| {
        let mut args = run(&["resolve"]);
        args.extend(key_of(name));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let completed = [
        "--as",
        "completed",
        "--response",
        good.as_str(),
        "--reason",
        "order 42 is in the ledger",
    ];

    let err = fails(&as_refs(&resolve("nope", &completed)), 1);
    assert!(
        err.contains("no operation `create_order` with client `acme` and key `nope` is recorded"),
        "{err}"
    );
    let mut unknown_show = run(&["show"]);
    unknown_show.extend(key_of("nope"));
    let err = fails(&as_refs(&unknown_show), 1);
    assert!(err.contains("key `nope` is recorded"), "{err}");

    let malformed = dir.path().join("bad.json");
    std::fs::write(&malformed, "{\"status\": 201, \"body\": ").unwrap();
    let malformed = malformed.to_str().unwrap().to_owned();
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &[
                "--as",
                "completed",
                "--response",
                &malformed,
                "--reason",
                "r",
            ],
        )),
        1,
    );
    assert!(
        err.contains("bad.json") && err.contains("not JSON"),
        "{err}"
    );
    let server_error = dir.path().join("500.json");
    std::fs::write(&server_error, r#"{"status": 500, "body": {}}"#).unwrap();
    let server_error = server_error.to_str().unwrap().to_owned();
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &[
                "--as",
                "completed",
                "--response",
                &server_error,
                "--reason",
                "r",
            ],
        )),
        1,
    );
    assert!(err.contains("`status` is 500"), "{err}");
    let unknown_field = dir.path().join("typo.json");
    std::fs::write(&unknown_field, r#"{"status": 201, "bdy": {}}"#).unwrap();
    let unknown_field = unknown_field.to_str().unwrap().to_owned();
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &[
                "--as",
                "completed",
                "--response",
                &unknown_field,
                "--reason",
                "r",
            ],
        )),
        1,
    );
    assert!(err.contains("unknown field `bdy`"), "{err}");
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &["--as", "not-applied", "--reason", "  "],
        )),
        1,
    );
    assert!(err.contains("--reason is empty"), "{err}");
    let long_key = "k".repeat(300);
    let err = fails(&as_refs(&resolve(&long_key, &completed)), 1);
    assert!(
        err.contains("--key is 300 bytes long; at most 255"),
        "{err}"
    );
    let long_reason = "r".repeat(3000);
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &["--as", "not-applied", "--reason", &long_reason],
        )),
        1,
    );
    assert!(err.contains("--reason is 3000 bytes long"), "{err}");
    let err = fails(
        &as_refs(&resolve(
            "parked",
            &["--as", "not-applied", "--reason", "r", "--response", &good],
        )),
        1,
    );
    assert!(
        err.contains("--response goes with --as completed only"),
        "{err}"
    );
    let mut stale = completed.to_vec();
    stale.extend(["--expect-attempt", "2"]);
    let err = fails(&as_refs(&resolve("parked", &stale)), 1);
    assert!(
        err.contains("was not resolved") && err.contains("parked at attempt 1, not attempt 2"),
        "{err}"
    );
    let err = fails(&as_refs(&resolve("running", &completed)), 1);
    assert!(
        err.contains("the operation is processing (attempt 1), not parked as unknown"),
        "{err}"
    );
    assert!(matches!(
        state(&*store, "parked").await,
        RecordState::Unknown { .. }
    ));
    assert!(matches!(
        state(&*store, "running").await,
        RecordState::Processing { .. }
    ));

    // resolve as completed, with the operator's result
    let mut first = completed.to_vec();
    first.extend(["--by", "ana", "--expect-attempt", "1"]);
    let done = succeeds(&as_refs(&resolve("parked", &first)));
    assert!(done.contains("as completed (status 201), by ana"), "{done}");
    let RecordState::Completed { response } = state(&*store, "parked").await else {
        panic!("completed");
    };
    assert_eq!(
        (response.status, &response.body[..]),
        (201, &br#"{"id":42}"#[..])
    );
    assert_eq!(
        response
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect::<Vec<_>>(),
        ["content-type: application/json", "location: /orders/42"]
    );
    let mut show = run(&["show"]);
    show.extend(key_of("parked"));
    let shown = succeeds(&as_refs(&show));
    assert!(
        shown.contains("by ana: attempt 1 resolved as completed (status 201): \"order 42 is in the ledger\" (parked: \"no answer from the ledger\")"),
        "{shown}"
    );
    assert!(
        shown.contains("parked as unknown: no answer from the ledger; resolved by ana at"),
        "the attempt says how it ended: {shown}"
    );
    // resolved twice: refused, nothing changed
    let err = fails(&as_refs(&resolve("parked", &first)), 1);
    assert!(
        err.contains("the operation is completed (attempt 1), not parked as unknown"),
        "{err}"
    );
    assert_eq!(
        state(&*store, "parked").await,
        RecordState::Completed {
            response: StoredResponse { ..response }
        }
    );

    // resolve as not applied: the key is released; `by` defaults to $USER
    let released = succeeds(&as_refs(&resolve(
        "parked-2",
        &["--as", "not-applied", "--reason", "nothing in the ledger"],
    )));
    assert!(
        released.contains("not applied") && released.contains("by test-operator"),
        "{released}"
    );
    assert_eq!(state(&*store, "parked-2").await, RecordState::Released);
    let mut show = run(&["show", "--json"]);
    show.extend(key_of("parked-2"));
    let shown: serde_json::Value = serde_json::from_str(&succeeds(&as_refs(&show))).unwrap();
    assert_eq!(shown["state"], "released");
    assert_eq!(shown["resolutions"][0]["as"], "not-applied");
    assert_eq!(shown["resolutions"][0]["by"], "test-operator");
    assert_eq!(shown["resolutions"][0]["reason"], "nothing in the ledger");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operates_on_an_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let path = path.to_str().unwrap().to_owned();
    operate(&["--store", &path], Arc::new(store)).await;
}

/// A parked record on an SQLite file, and response files beside it: the checks of
/// `idem ops resolve --response`.
struct Resolving {
    dir: tempfile::TempDir,
    store: SqliteStore,
    db: String,
}

impl Resolving {
    async fn new() -> Resolving {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let store = SqliteStore::open(&path).await.unwrap();
        seed(&store).await;
        let db = path.to_str().unwrap().to_owned();
        Resolving { dir, store, db }
    }

    /// A response file `name` holding `text`.
    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// `idem ops resolve` of `parked` as completed with `file`, and `extra` arguments.
    fn args<'a>(&'a self, file: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "ops",
            "resolve",
            "--store",
            &self.db,
            "--operation",
            "create_order",
            "--client",
            "acme",
            "--key",
            "parked",
            "--as",
            "completed",
            "--reason",
            "r",
            "--response",
            file,
            "--by",
            "test-operator",
        ];
        args.extend_from_slice(extra);
        args
    }

    /// The refusal of `file`, which must come within a second.
    fn refused(&self, file: &str, extra: &[&str]) -> String {
        let started = std::time::Instant::now();
        let err = fails(&self.args(file, extra), 1);
        assert!(started.elapsed() < Duration::from_secs(1), "{file}: {err}");
        err
    }

    async fn assert_untouched(&self) {
        assert!(
            matches!(
                state(&self.store, "parked").await,
                RecordState::Unknown { .. }
            ),
            "nothing was written"
        );
    }
}

/// Framing and session headers, headers the service does not replay, and invalid names
/// and values in a response file are refused with a message that names them, and the
/// parked record is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_files_with_hostile_headers_are_refused() {
    let r = Resolving::new().await;
    let framing = r.file(
        "framing.json",
        r#"{"status": 201, "headers": {"content-length": "5", "transfer-encoding": "chunked", "connection": "close", "set-cookie": "sid=1", "location": "/o/1"}, "body": {}}"#,
    );
    let err = r.refused(&framing, &[]);
    for name in [
        "content-length",
        "transfer-encoding",
        "connection",
        "set-cookie",
    ] {
        assert!(err.contains(&format!("`{name}`")), "{name}: {err}");
    }
    assert!(
        err.contains("framing.json") && !err.contains("`location`"),
        "{err}"
    );
    let err = r.refused(&framing, &["--replayed-header", "set-cookie"]);
    assert!(err.contains("--replayed-header `set-cookie`"), "{err}");
    let err = r.refused(&framing, &["--replayed-header", "bad name"]);
    assert!(
        err.contains("--replayed-header `bad name` is not a header name"),
        "{err}"
    );

    let keep_alive = r#"{"status": 201, "headers": {"x-order-id": "42", "keep-alive": "timeout=5"}, "body": {}}"#;
    let err = r.refused(&r.file("other.json", keep_alive), &[]);
    assert!(err.contains("`keep-alive` is never stored"), "{err}");
    let other = r.file(
        "other-2.json",
        r#"{"status": 201, "headers": {"x-order-id": "42"}, "body": {}}"#,
    );
    let err = r.refused(&other, &[]);
    assert!(
        err.contains("`x-order-id` is not replayed") && err.contains("--replayed-header"),
        "{err}"
    );
    let bad_value = r.file(
        "value.json",
        r#"{"status": 201, "headers": {"location": "/a\nb"}, "body": {}}"#,
    );
    let err = r.refused(&bad_value, &[]);
    assert!(
        err.contains("header `location` is not a valid header value"),
        "{err}"
    );
    r.assert_untouched().await;
}

/// Non-final statuses, a file that is not a regular file (`/dev/zero`, a directory) and
/// one past the size cap are refused within a second, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_files_that_are_not_results_are_refused() {
    let r = Resolving::new().await;
    for status in ["100", "199", "600", "0"] {
        let text = format!(r#"{{"status": {status}, "body": {{}}}}"#);
        let err = r.refused(&r.file("status.json", &text), &[]);
        assert!(err.contains(&format!("`status` is {status}")), "{err}");
    }
    let err = r.refused("/dev/zero", &[]);
    assert!(err.contains("not a regular file"), "{err}");
    let err = r.refused(r.dir.path().to_str().unwrap(), &[]);
    assert!(err.contains("not a regular file"), "{err}");
    let big = format!(
        r#"{{"status": 201, "body_text": "{}"}}"#,
        "x".repeat(3 << 20)
    );
    let err = r.refused(&r.file("big.json", &big), &[]);
    assert!(err.contains("larger than"), "{err}");
    r.assert_untouched().await;
}

/// A header the service replays besides idem's defaults goes through when
/// `--replayed-header` names it, and is stored in the file's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_service_replays_is_let_through_when_named() {
    let r = Resolving::new().await;
    let allowed = r.file(
        "allowed.json",
        r#"{"status": 201, "headers": {"location": "/o/1", "x-order-id": "42"}, "body": {}}"#,
    );
    succeeds(&r.args(&allowed, &["--replayed-header", "x-order-id"]));
    let RecordState::Completed { response } = state(&r.store, "parked").await else {
        panic!("resolved");
    };
    let names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["location", "x-order-id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operates_on_postgres() {
    let Some(url) = conformance::postgres::scratch_url("idem ops on postgres").await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    operate(&["--store", &url], Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operates_on_redis() {
    let Some(url) = conformance::redis::url_or_skip("idem ops on redis").await else {
        return;
    };
    let prefix = conformance::redis::scratch_prefix();
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    operate(
        &["--store", &url, "--redis-prefix", &prefix],
        Arc::new(store),
    )
    .await;
}

/// The whole operator's path on a Redis Cluster (3 masters, a replica each) named by its
/// seed nodes; then a master killed with SIGKILL: once its replica has taken over,
/// `idem ops list` still finds every record, on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operates_on_a_redis_cluster_and_after_a_failover() {
    let Some(mut cluster) = conformance::redis::OwnCluster::start(3, 1) else {
        return;
    };
    let url = cluster.url();
    let store = cluster.store().await;
    operate(&["--store", &url], Arc::new(store.clone())).await;
    let now = unix_now();
    for i in 0..30 {
        let key = k(&format!("spread-{i:02}"));
        store
            .begin(&key, &new_record("sha256:a", now), now)
            .await
            .unwrap();
    }
    let listed = |args: &[&str]| -> usize {
        let json: serde_json::Value = serde_json::from_str(&succeeds(args)).unwrap();
        json.as_array().unwrap().len()
    };
    let all = ["ops", "list", "--store", &url, "--json", "--limit", "1000"];
    let before = listed(&all);
    let victim = cluster.master_of(&store.hash_name(&k("spread-00")));
    cluster.kill(victim);
    // While the master is dead and not yet replaced, the listing goes on without it
    // and says so.
    let partial = idem(&all);
    if partial.status.success() {
        assert!(
            stderr(&partial).contains("could not be scanned"),
            "{}",
            stderr(&partial)
        );
    }
    cluster.wait_for_failover(std::time::Duration::from_secs(20));
    // The cluster client may meet the dead master once more before it learns the new map.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = idem(&all);
        if out.status.success() && !stderr(&out).contains("could not be scanned") {
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                json.as_array().unwrap().len(),
                before,
                "every record, after the failover"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", stderr(&out));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // One seed is enough to find the cluster.
    let one_seed = cluster.node_url(usize::from(victim == cluster.port(0)));
    assert_eq!(
        listed(&[
            "ops", "list", "--store", &one_seed, "--json", "--limit", "1000"
        ]),
        before
    );
}

/// A value under the store's Redis prefix that idem did not write (another program's,
/// a manual `SET`) is skipped by `idem ops list` and `show` with a warning that names it;
/// the rest is listed and the command succeeds.
#[tokio::test]
async fn a_foreign_value_in_redis_is_skipped_and_named() {
    let Some(url) = conformance::redis::url_or_skip("foreign values and idem ops").await else {
        return;
    };
    let prefix = conformance::redis::scratch_prefix();
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    let now = unix_now();
    store
        .begin(&k("good"), &new_record("sha256:a", now), now)
        .await
        .unwrap();
    let mut conn = store.connection().clone();
    // Another program's string under a name of idem's scheme (a manual `SET`).
    let foreign = store.hash_name(&k("manual-set"));
    let _: () = redis::cmd("SET")
        .arg(&foreign)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = idem(&["ops", "list", "--store", &url, "--redis-prefix", &prefix]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("good"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("skipped a value in the store that is not a record")
            && stderr(&out).contains(&foreign),
        "the warning names the value: {}",
        stderr(&out)
    );
}

/// Stores that cannot be opened: each a precise message and exit 1, within seconds,
/// nothing created; a password in a URL is never printed.
#[test]
fn unreachable_or_wrong_stores_are_refused() {
    fn show(store: &str) -> Vec<&str> {
        vec![
            "ops",
            "show",
            "--store",
            store,
            "--operation",
            "create_order",
            "--client",
            "acme",
            "--key",
            "k1",
        ]
    }
    let started = std::time::Instant::now();
    let err = fails(
        &show("postgres://postgres:s3cret@127.0.0.1:1/postgres?sslmode=disable"),
        1,
    );
    assert!(
        err.contains("cannot open the store postgres://postgres:***@127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    let err = fails(&show("redis://127.0.0.1:1"), 1);
    assert!(
        err.contains("cannot open the store redis://127.0.0.1:1"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let err = fails(&show(missing.to_str().unwrap()), 1);
    assert!(err.contains("no SQLite database at"), "{err}");
    assert!(!missing.exists(), "no file is created");
    let foreign = dir.path().join("foreign.db");
    std::fs::write(&foreign, "").unwrap();
    let err = fails(&show(foreign.to_str().unwrap()), 1);
    assert!(err.contains("holds no table `idem_records`"), "{err}");
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"",
        "nothing is written to it"
    );
    let err = fails(&show("mysql://127.0.0.1/db"), 1);
    assert!(err.contains("is not a store"), "{err}");
    let err = fails(&show(""), 1);
    assert!(err.contains("--store is empty"), "{err}");
}

/// Usage errors: clap's exit code 2 and its message.
#[test]
fn usage_errors_exit_with_2() {
    let err = fails(
        &[
            "ops",
            "resolve",
            "--store",
            "x.db",
            "--operation",
            "o",
            "--client",
            "c",
            "--key",
            "k",
            "--as",
            "completed",
            "--reason",
            "r",
        ],
        2,
    );
    assert!(err.contains("--response"), "{err}");
    let err = fails(&["ops", "list", "--store", "x.db", "--state", "done"], 2);
    assert!(err.contains("invalid value 'done'"), "{err}");
    let err = fails(&["ops", "list", "--store", "x.db", "--limit", "0"], 2);
    assert!(err.contains("--limit"), "{err}");

    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let out = idem(&[
            OsStr::new("ops"),
            OsStr::new("show"),
            OsStr::new("--store"),
            OsStr::new("x.db"),
            OsStr::new("--operation"),
            OsStr::new("o"),
            OsStr::new("--client"),
            OsStr::from_bytes(b"\xff\xfe"),
            OsStr::new("--key"),
            OsStr::new("k"),
        ]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("invalid UTF-8"), "{}", stderr(&out));
    }
}
