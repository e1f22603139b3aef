//! `idem ops` never hangs and never lies: the real binary against PostgreSQL and Redis
//! through a loopback proxy that partitions or drops the connection once it is set up,
//! and against an SQLite file another connection holds locked. Every call ends within
//! `--timeout` and a margin; a resolution that was sent and got no answer exits with 3
//! and says it may or may not have been applied, and `idem ops show` through a healed
//! path then tells what the store holds; a failure before the resolution was sent, a
//! refusal by the server, or a read that got no answer is an ordinary error (exit 1).
#![cfg(feature = "ops")]

#[path = "common/proxy.rs"]
mod proxy;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::{self, new_record};
use idem_runtime::store::{
    PostgresStore, RecordKey, RecordState, RedisStore, SqliteStore, Store, unix_now,
};
use proxy::{Dir, Proxy};

/// The `--timeout` of these tests.
const TIMEOUT: &str = "2s";
/// How long a bounded call may take in all: the timeout, the client's grace (0.5 s) and
/// a margin for starting the process and a slow machine.
const BOUND: Duration = Duration::from_secs(6);

/// Runs `idem` with `args`; its output and how long it took.
fn idem(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("USER", "test-operator")
        .output()
        .expect("the idem binary runs");
    (out, started.elapsed())
}

/// Runs `idem`, expects exit code `code` within [`BOUND`]; stdout and stderr.
fn exits(args: &[&str], code: i32) -> (String, String) {
    let (out, took) = idem(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "idem {args:?} must exit with {code}; stdout: {stdout}; stderr: {stderr}"
    );
    assert!(took < BOUND, "idem {args:?} took {took:?}");
    eprintln!(
        "idem {} exited with {code} after {took:?}\n{stderr}",
        args[..2].join(" ")
    );
    (stdout, stderr)
}

fn k(name: &str) -> RecordKey {
    RecordKey::new("create_order", "acme", name)
}

/// Parks `names` as unknown at attempt 1.
async fn park(store: &dyn Store, names: &[&str]) {
    let now = unix_now();
    for name in names {
        let new = new_record("sha256:a", now);
        store.begin(&k(name), &new, now).await.unwrap();
        store
            .park_unknown(&k(name), new.lease.token, "no answer from the ledger", now)
            .await
            .unwrap();
    }
}

async fn state(store: &dyn Store, name: &str) -> RecordState {
    let record = store.get(&k(name), unix_now()).await.unwrap();
    record.expect("the record").state
}

/// `idem ops ACTION --store STORE …` on the key `name`, with `rest` after.
fn on(action: &str, store: &[&str], name: &str, rest: &[&str]) -> Vec<String> {
    let mut args = vec!["ops".to_owned(), action.to_owned()];
    args.extend(store.iter().map(|s| (*s).to_owned()));
    for (flag, value) in [
        ("--operation", "create_order"),
        ("--client", "acme"),
        ("--key", name),
    ] {
        args.extend([flag.to_owned(), value.to_owned()]);
    }
    args.extend(rest.iter().map(|s| (*s).to_owned()));
    args
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `--as not-applied` at attempt 1.
const NOT_APPLIED: [&str; 6] = [
    "--as",
    "not-applied",
    "--reason",
    "nothing in the ledger",
    "--expect-attempt",
    "1",
];

/// `url` cut into its scheme and user (`postgres://user@`), its host and port, and the
/// rest (the path and the query).
fn parts(url: &str) -> (String, &str, &str) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{scheme}://{user}@"), host, path),
        None => (format!("{scheme}://"), authority, path),
    }
}

/// The address of the server `url` names.
fn server(url: &str) -> SocketAddr {
    let (_, host, _) = parts(url);
    host.to_socket_addrs().unwrap().next().unwrap()
}

/// `url` through `proxy`: its host and port replaced by the proxy's.
fn through(url: &str, proxy: &Proxy) -> String {
    let (start, _, rest) = parts(url);
    format!("{start}{}{rest}", proxy.addr())
}

/// The unknown-outcome message, with the command that shows the record.
fn says_unknown(stderr: &str, name: &str) {
    assert!(
        stderr.contains("may or may not have been applied") && stderr.contains("no answer came"),
        "{stderr}"
    );
    assert!(
        stderr.contains("idem ops show --store ")
            && stderr.contains(&format!("--client acme --key {name}`")),
        "{stderr}"
    );
    assert!(stderr.contains("--expect-attempt 1 is safe"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resolution_whose_answer_is_lost_says_so_and_show_tells() {
    let Some(url) = conformance::postgres::scratch_url("idem ops, answer lost").await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    park(&store, &["lost-answer", "held-request"]).await;
    let proxy = Proxy::start(server(&url)).await;
    let proxied = through(&url, &proxy);
    let via_proxy = ["--store", proxied.as_str(), "--timeout", TIMEOUT];
    let direct = ["--store", url.as_str()];

    // The server commits the resolution; its answer never comes back.
    proxy.hold_from(Dir::FromServer, b"UPDATE 1");
    let (_, err) = exits(
        &refs(&on("resolve", &via_proxy, "lost-answer", &NOT_APPLIED)),
        3,
    );
    says_unknown(&err, "lost-answer");
    assert!(err.contains("did not answer within 2500 ms"), "{err}");
    let (shown, _) = exits(&refs(&on("show", &direct, "lost-answer", &[])), 0);
    assert!(shown.contains("state         released"), "applied: {shown}");
    assert_eq!(state(&store, "lost-answer").await, RecordState::Released);
    proxy.heal();
    let (shown, _) = exits(&refs(&on("show", &via_proxy, "lost-answer", &[])), 0);
    assert!(shown.contains("state         released"), "{shown}");

    // The request is held on its way: not applied, and resolving again is safe.
    proxy.hold_from(Dir::FromClient, b"UPDATE idem_records");
    let (_, err) = exits(
        &refs(&on("resolve", &via_proxy, "held-request", &NOT_APPLIED)),
        3,
    );
    says_unknown(&err, "held-request");
    proxy.heal();
    let (shown, _) = exits(&refs(&on("show", &via_proxy, "held-request", &[])), 0);
    assert!(
        shown.contains("state         unknown"),
        "not applied: {shown}"
    );
    assert!(matches!(
        state(&store, "held-request").await,
        RecordState::Unknown { .. }
    ));
    let (done, _) = exits(
        &refs(&on("resolve", &via_proxy, "held-request", &NOT_APPLIED)),
        0,
    );
    assert!(done.contains("resolved `create_order`"), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_and_failures_before_sending_are_ordinary_errors() {
    let Some(url) = conformance::postgres::scratch_url("idem ops, reads cut off").await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    park(&store, &["parked"]).await;

    // A read that gets no answer is a failure to read.
    let proxy = Proxy::start(server(&url)).await;
    let proxied = through(&url, &proxy);
    let via_proxy = ["--store", proxied.as_str(), "--timeout", TIMEOUT];
    proxy.hold_from(Dir::FromClient, b"CAST(history AS TEXT)");
    let (_, err) = exits(&refs(&on("show", &via_proxy, "parked", &[])), 1);
    assert!(
        err.contains("could not read from the store postgres://"),
        "{err}"
    );
    assert!(!err.contains("may or may not"), "{err}");
    proxy.heal();
    proxy.hold_from(Dir::FromClient, b"ORDER BY operation");
    let mut list = vec!["ops", "list"];
    list.extend(via_proxy);
    let (_, err) = exits(&list, 1);
    assert!(err.contains("could not read from the store"), "{err}");
    proxy.heal();

    // The server goes away before the resolution is sent: the read it needs first fails,
    // nothing is resolved.
    let proxy = Proxy::start(server(&url)).await;
    let proxied = through(&url, &proxy);
    let via_proxy = ["--store", proxied.as_str(), "--timeout", TIMEOUT];
    proxy.drop_at(Dir::FromClient, b"transactional\n    FROM idem_records");
    let rest = ["--as", "not-applied", "--reason", "r"];
    let (_, err) = exits(&refs(&on("resolve", &via_proxy, "parked", &rest)), 1);
    assert!(
        err.contains(
            "cannot read `create_order` with client `acme` and key `parked` to find the attempt"
        ) && err.contains("nothing was resolved"),
        "{err}"
    );
    assert!(matches!(
        state(&store, "parked").await,
        RecordState::Unknown { .. }
    ));
}

/// A row lock held by another transaction: the server's `statement_timeout` cancels the
/// resolution, which is a known failure (exit 1, not applied), in about the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_statement_timeout_is_a_refusal_not_an_unknown() {
    use sqlx::Connection;

    let Some(url) = conformance::postgres::scratch_url("idem ops, row locked").await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    park(&store, &["locked"]).await;
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idem_records WHERE key = 'locked' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let direct = ["--store", url.as_str(), "--timeout", "1s"];
    let (_, err) = exits(&refs(&on("resolve", &direct, "locked", &NOT_APPLIED)), 1);
    assert!(err.contains("statement timeout"), "{err}");
    assert!(err.contains("the resolution was not applied"), "{err}");
    tx.rollback().await.unwrap();
    assert!(matches!(
        state(&store, "locked").await,
        RecordState::Unknown { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_resolution_held_in_a_partition_is_unknown_and_lands_on_heal() {
    let Some(url) = conformance::redis::url_or_skip("idem ops, partition").await else {
        return;
    };
    let prefix = conformance::redis::scratch_prefix();
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    park(&store, &["warm", "held"]).await;
    // The resolution's script is known to the server, so that `EVALSHA` alone runs it.
    let proxy = Proxy::start(server(&url)).await;
    let proxied = through(&url, &proxy);
    let via_proxy = [
        "--store",
        proxied.as_str(),
        "--redis-prefix",
        prefix.as_str(),
        "--timeout",
        TIMEOUT,
    ];
    exits(&refs(&on("resolve", &via_proxy, "warm", &NOT_APPLIED)), 0);

    proxy.hold_from(Dir::FromClient, b"EVALSHA");
    let (_, err) = exits(&refs(&on("resolve", &via_proxy, "held", &NOT_APPLIED)), 3);
    says_unknown(&err, "held");
    assert!(err.contains(&format!("--redis-prefix {prefix} ")), "{err}");
    assert!(err.contains("the Redis server did not answer"), "{err}");
    // Not applied yet; the network heals and the held request lands.
    assert!(matches!(
        state(&store, "held").await,
        RecordState::Unknown { .. }
    ));
    proxy.heal();
    let landed = Instant::now();
    while state(&store, "held").await != RecordState::Released {
        assert!(
            landed.elapsed() < Duration::from_secs(5),
            "the held resolution never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (shown, _) = exits(&refs(&on("show", &via_proxy, "held", &[])), 0);
    assert!(shown.contains("state         released"), "{shown}");
    assert!(shown.contains("resolved as not applied"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reads_and_failures_before_sending_are_ordinary_errors() {
    let Some(url) = conformance::redis::url_or_skip("idem ops, reads cut off").await else {
        return;
    };
    let prefix = conformance::redis::scratch_prefix();
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    park(&store, &["parked"]).await;
    let proxy = Proxy::start(server(&url)).await;
    let proxied = through(&url, &proxy);
    let via_proxy = [
        "--store",
        proxied.as_str(),
        "--redis-prefix",
        prefix.as_str(),
        "--timeout",
        TIMEOUT,
    ];
    proxy.hold_from(Dir::FromClient, b"HGETALL");
    let (_, err) = exits(&refs(&on("show", &via_proxy, "parked", &[])), 1);
    assert!(
        err.contains("could not read from the store redis://"),
        "{err}"
    );
    proxy.heal();

    // The server goes away before the resolution is sent: at the read of the record
    // that comes first (`HMGET` of its fields).
    proxy.drop_at(Dir::FromClient, b"HMGET");
    let rest = ["--as", "not-applied", "--reason", "r"];
    let (_, err) = exits(&refs(&on("resolve", &via_proxy, "parked", &rest)), 1);
    assert!(err.contains("nothing was resolved"), "{err}");
    assert!(matches!(
        state(&store, "parked").await,
        RecordState::Unknown { .. }
    ));
    // Refused from the start: an ordinary error too.
    let (_, err) = exits(&refs(&on("resolve", &via_proxy, "parked", &NOT_APPLIED)), 1);
    assert!(err.contains("cannot open the store"), "{err}");
}

/// Another connection holds the write lock: the busy timeout bounds the wait, and the
/// refusal says the database is locked (exit 1, not applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_by_another_writer_is_a_bounded_refusal() {
    use sqlx::Connection;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = SqliteStore::open(&path).await.unwrap();
    park(&store, &["locked"]).await;
    let mut holder = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let tx = holder.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let file = path.to_str().unwrap();
    let store_args = ["--store", file, "--timeout", "1s"];
    let started = Instant::now();
    let (_, err) = exits(
        &refs(&on("resolve", &store_args, "locked", &NOT_APPLIED)),
        1,
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "it waited for the lock"
    );
    assert!(err.contains("database is locked"), "{err}");
    assert!(err.contains("the resolution was not applied"), "{err}");
    // Reads are not blocked by a writer (WAL).
    exits(&refs(&on("show", &store_args, "locked", &[])), 0);
    tx.rollback().await.unwrap();
    assert!(matches!(
        state(&store, "locked").await,
        RecordState::Unknown { .. }
    ));
    exits(
        &refs(&on("resolve", &store_args, "locked", &NOT_APPLIED)),
        0,
    );
}

/// `--timeout` takes a duration with its unit, from 100ms to 1h: anything else is a
/// usage error (exit 2) that says what is wrong, before any store is opened.
#[test]
fn bad_timeouts_are_usage_errors() {
    for (timeout, says) in [
        ("0", "0s is too short"),
        ("50ms", "50ms is too short"),
        ("-1", "cannot be negative"),
        ("abc", "write a duration with its unit"),
        ("10", "time unit needed"),
        ("2h", "2h is too long: at most 1h"),
        ("99999999999999999999999s", "number is too large"),
    ] {
        for action in ["list", "show", "resolve"] {
            let args = on(
                action,
                &["--store", "x.db", "--timeout", timeout],
                "k",
                &NOT_APPLIED,
            );
            let args = if action == "list" {
                refs(&args[..6])
            } else {
                refs(&args)
            };
            let (_, err) = exits(&args, 2);
            assert!(
                err.contains(&format!(
                    "invalid value '{timeout}' for '--timeout <DURATION>'"
                )) && err.contains(says),
                "{action} --timeout {timeout}: {err}"
            );
        }
    }
    assert!(!std::path::Path::new("x.db").exists());
}

/// The help of `resolve` documents the exit codes, the unknown outcome's own among them.
#[test]
fn exit_codes_are_documented() {
    // As one line: the help is wrapped to the terminal's width.
    let help = |args: &[&str]| {
        exits(args, 0)
            .0
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let resolve = help(&["ops", "resolve", "--help"]);
    assert!(resolve.contains("--timeout <DURATION>"), "{resolve}");
    assert!(
        resolve.contains("3 the resolution was sent and no answer came within --timeout"),
        "{resolve}"
    );
    let ops = help(&["ops", "--help"]);
    assert!(
        ops.contains("Exit codes: 0 done; 1 refused or failed"),
        "{ops}"
    );
    assert!(
        ops.contains("3 `resolve` sent its resolution and no answer came"),
        "{ops}"
    );
}
