//! One clock for leases: three `orders` processes on one store, one on this machine's
//! clock, one 30 s ahead and one 30 s behind (libfaketime, from Debian's package
//! `faketime`). A key held by an attempt (`--delay 3s`, longer than the 2 s lease) is sent to
//! the other two while it runs: both answer 409 `operation-in-progress` (none takes it
//! over: leases are judged by the store's clock, not theirs), each key ends with one
//! order, and no answer is a 503. On PostgreSQL, and on Redis with PostgreSQL.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Reply, Service, client, order, try_post};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::url_or_skip;
use idem_runtime::store::conformance::skips_fail;
use reqwest::StatusCode;

/// The stable `type` of the declared concurrency answer (`concurrency = conflict`).
const IN_PROGRESS: &str = "tag:idem.rs,2026:problem:operation-in-progress";

/// How many keys each holder holds at once.
const KEYS: usize = 6;

/// How long each attempt runs (`--delay`): longer than the 2 s lease, so that it is
/// renewed while the others ask.
const DELAY: &str = "3s";

/// When the others are asked, after the holder: its attempt has registered and runs.
const ASK_AFTER: Duration = Duration::from_millis(1200);

/// The clocks of the three processes, as `faketime -f` takes them (`None`: this
/// machine's).
const CLOCKS: [Option<&str>; 3] = [None, Some("+30s"), Some("-30s")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_on_postgres_never_take_over_a_live_attempt() {
    let what = "orders processes with skewed clocks on one PostgreSQL database";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let Some(lib) = libfaketime(what) else {
        return;
    };
    let env = [("DATABASE_URL", url.as_str())];
    let services = start(&lib, &["--store", "postgres"], &env);
    holders_keep_their_keys(&services, &url, "k-skew").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_on_redis_never_take_over_a_live_attempt() {
    let what = "orders processes with skewed clocks on one Redis and one PostgreSQL database";
    let Some(redis_url) = url_or_skip(what).await else {
        return;
    };
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let Some(lib) = libfaketime(what) else {
        return;
    };
    let env = [
        ("REDIS_URL", redis_url.as_str()),
        ("DATABASE_URL", url.as_str()),
    ];
    let services = start(&lib, &["--store", "redis"], &env);
    // The Redis server is shared between runs: the keys are new each time.
    let prefix = format!("k-skew-{}", uuid::Uuid::new_v4().simple());
    holders_keep_their_keys(&services, &url, &prefix).await;
}

/// libfaketime, from Debian's package `faketime`, when it is installed and shifts the
/// clock; `None` (after saying why) when it is missing. The processes load it
/// themselves (`LD_PRELOAD`, `FAKETIME`) rather than under the `faketime` command, which
/// forks them: killing it would leave them running.
///
/// # Panics
///
/// Under `CI=true` when it is missing (`.ci/run` installs it), or when it is loaded
/// and does not shift the clock.
fn libfaketime(what: &str) -> Option<PathBuf> {
    let found = ["/usr/lib", "/usr/local/lib"].iter().find_map(|root| {
        let dirs = std::fs::read_dir(root).ok()?;
        dirs.filter_map(Result::ok)
            .map(|dir| dir.path().join("faketime/libfaketime.so.1"))
            .chain([Path::new(root).join("faketime/libfaketime.so.1")])
            .find(|lib| lib.is_file())
    });
    let Some(lib) = found else {
        let why = "libfaketime is not installed (apt-get install faketime)";
        assert!(
            !skips_fail(),
            "{what}: {why}; under CI=true a skip is a failure"
        );
        eprintln!("skipped {what}: {why}");
        return None;
    };
    let ahead = Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME", "+30s")
        .output()
        .expect("date runs");
    let shifted: u64 = String::from_utf8_lossy(&ahead.stdout)
        .trim()
        .parse()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (now + 28..now + 33).contains(&shifted),
        "{} with FAKETIME=+30s says {shifted}, this clock {now}",
        lib.display()
    );
    Some(lib)
}

/// The three processes with `store_args` and `env`, each on its clock of [`CLOCKS`]
/// (shifted by `lib`, libfaketime), every attempt running [`DELAY`].
fn start(lib: &Path, store_args: &[&str], env: &[(&str, &str)]) -> Vec<Service> {
    let mut args = store_args.to_vec();
    args.extend(["--delay", DELAY]);
    let lib = lib.to_str().expect("a UTF-8 path");
    CLOCKS
        .iter()
        .map(|clock| {
            let mut env = env.to_vec();
            if let Some(offset) = clock {
                env.extend([("LD_PRELOAD", lib), ("FAKETIME", offset)]);
            }
            let service = Service::spawn(&args, &env);
            // The warning at start: its clock is 30 s from the store's.
            match clock {
                Some(offset) if offset.starts_with('+') => {
                    service.wait_for_stderr("ms ahead of the store's");
                }
                Some(_) => service.wait_for_stderr("ms behind the store's"),
                None => {}
            }
            service
        })
        .collect()
}

/// Two rounds: keys held by the process on this machine's clock, then keys held by the
/// one behind (whose lease ends, by its own clock, 30 s before it is given); each key is
/// sent to the other two processes while it is held. Then checks the orders table at
/// `url`.
async fn holders_keep_their_keys(services: &[Service], url: &str, prefix: &str) {
    let started = Instant::now();
    let urls: Arc<[String]> = services.iter().map(|s| s.url.clone()).collect();
    let mut keys = Vec::new();
    for holder in [0, 2] {
        let mut round = tokio::task::JoinSet::new();
        for i in 0..KEYS {
            let key = format!("{prefix}-{holder}-{i}");
            keys.push(key.clone());
            round.spawn(hold_and_ask(urls.clone(), holder, key, i));
        }
        while let Some(done) = round.join_next().await {
            done.unwrap();
        }
    }
    let took = started.elapsed();
    eprintln!("{} keys held against skewed clocks in {took:?}", keys.len());
    assert!(took < Duration::from_secs(60), "took {took:?}");

    let pool = sqlx::PgPool::connect(url).await.unwrap();
    for key in &keys {
        let (orders,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM orders WHERE idempotency_key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(orders, 1, "{key}: exactly one order");
    }
    pool.close().await;
}

/// Sends `key` to the process `holder`, then, while its attempt runs, to the other two:
/// both answer 409 `operation-in-progress`; the holder answers 201, not a replay.
async fn hold_and_ask(urls: Arc<[String]>, holder: usize, key: String, i: usize) {
    let http = client();
    let body = order(2000 + i64::try_from(i).unwrap());
    let held = {
        let (http, url, key, body) = (
            http.clone(),
            urls[holder].clone(),
            key.clone(),
            body.clone(),
        );
        tokio::spawn(async move { try_post(&http, &url, Some(&key), &body).await })
    };
    tokio::time::sleep(ASK_AFTER).await;
    let others: Vec<usize> = (0..urls.len()).filter(|&p| p != holder).collect();
    let (a, b) = tokio::join!(
        try_post(&http, &urls[others[0]], Some(&key), &body),
        try_post(&http, &urls[others[1]], Some(&key), &body),
    );
    for (process, answer) in others.iter().zip([a, b]) {
        let answer = answer.unwrap_or_else(|e| panic!("{key}: process {process}: {e}"));
        in_progress(&key, *process, &answer);
    }
    let held = held
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{key}: no answer: {e}"));
    assert_eq!(
        (held.status, held.replayed()),
        (StatusCode::CREATED, false),
        "{key}: the holder {holder} ran it and answered: {held:?}"
    );
}

/// `answer` of `process` is the declared 409: the attempt runs elsewhere.
fn in_progress(key: &str, process: usize, answer: &Reply) {
    assert_eq!(
        (answer.status, answer.problem_type().as_str()),
        (StatusCode::CONFLICT, IN_PROGRESS),
        "{key}: process {process} (clock {:?}) must answer 409 operation-in-progress, not take the attempt over: {answer:?}",
        CLOCKS[process]
    );
    assert_eq!(answer.json()["state"], "processing", "{key}: {answer:?}");
}
