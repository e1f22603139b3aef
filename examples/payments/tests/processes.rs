//! The payments service over real processes: several instances of the binary on one
//! PostgreSQL database (a scratch schema per test), charging the tests' own provider,
//! while the provider loses answers, goes down or hangs, and instances are killed,
//! paused or run on a shifted clock.
//!
//! Whatever happens, every test checks the same four things at the end
//! ([`Outcomes::check`]): one charge at the provider per client intent (per key), the
//! same final answer to every retry of a key (status and body, `Idempotent-Replayed:
//! true` on replays, at every instance), one payment row per key, and nothing parked for
//! an operator (every record of `idem_records` completed, none `unknown`).
//!
//! The tests run one at a time (they share two cores with the processes they start).
//! Without a PostgreSQL server they say they were skipped and why; under `CI=true` a
//! skip is a failure.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::skips_fail;
use reqwest::StatusCode;
use serde_json::Value;
use support::provider::{Fault, TestProvider};
use support::service::{
    Reply, Service, client, client_waiting, lookup, payment, payments_in, try_post,
};
use tokio::sync::{Mutex, Semaphore};

/// The stable `type` of the declared concurrency answer (`concurrency = conflict`).
const IN_PROGRESS: &str = "tag:idem.rs,2026:problem:operation-in-progress";

/// The stable `type` of the answer to a step whose outcome is unknown.
const STEP_OUTCOME_UNKNOWN: &str = "tag:idem.rs,2026:problem:step-outcome-unknown";

/// The longest a client retries one key before the test fails: the contract's whole
/// deadline (30 s) and as much again for a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// One test at a time: each starts two or three processes, and two cores are shared by
/// them, the provider and the clients.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The provider charges and its answer is lost on the way back to instance A: A answers
/// 503 `step-outcome-unknown` with `Retry-After` and writes nothing. The client's retry
/// goes to instance B, which resumes the same operation (the same operation id), sends
/// the charge again under the same downstream key (the provider asked twice, charging
/// once) and captures the payment; both instances replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_provider_answer_is_resumed_by_another_instance() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(url) = scratch_url("payments processes: a lost provider answer").await else {
        return;
    };
    let provider = TestProvider::start().await;
    let services = instances(&url, &provider, &[&[], &[]]);
    let mut outcomes = Outcomes::default();
    let intent = Intent::new("pay-lost", 0);
    provider.fail_next(Fault::LoseAnswer, 1);

    let lost = intent.send(&client(), &services[0]).await;
    assert_eq!(
        (lost.status, lost.problem_type().as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, STEP_OUTCOME_UNKNOWN),
        "{lost:?}"
    );
    assert_eq!(lost.retry_after(), Some(1), "{lost:?}");
    let operation = lost.operation_id().expect("an Operation-Id").to_owned();
    assert_eq!(provider.charges(&charge_key(&operation)), 1, "it charged");
    assert_eq!(payments_in(&url).await, 0, "nothing written");
    outcomes.add(&intent, [lost]);
    tokio::time::sleep(Duration::from_secs(1)).await; // Retry-After

    let retried = retry_until_final(&client(), &services[1].url, &intent).await;
    let done = retried.last().unwrap();
    assert_eq!(done.status, StatusCode::CREATED, "{retried:?}");
    assert!(!done.replayed(), "B ran it: {done:?}");
    assert_eq!(done.operation_id(), Some(operation.as_str()), "resumed");
    assert_eq!(provider.requests(&charge_key(&operation)), 2, "sent again");
    outcomes.add(&intent, retried);
    outcomes.check(&url, &provider, &services).await;
}

/// Instance A holds every payment 30 s after its charge, before its commit
/// (`--delay 30s`), and is SIGKILLed then, once the status lookup shows the charge done:
/// PostgreSQL rolls the transaction back with the dead connection, and the journal keeps
/// the charge. The client's retry goes to instance B, already running: 409 while A's
/// lease lasts (it is no longer renewed), then B takes the operation over, replays the
/// charge from the journal without calling the provider, and captures the one payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_charge_and_the_commit_another_instance_finishes() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(url) = scratch_url("payments processes: killed before the commit").await else {
        return;
    };
    let provider = TestProvider::start().await;
    let mut services = instances(&url, &provider, &[&[], &["--delay", "30s"]]);
    let doomed = services.pop().unwrap();
    let mut outcomes = Outcomes::default();
    let intent = Intent::new("pay-killed", 0);

    let in_flight = tokio::spawn(intent.clone().send_to(client(), doomed.url.clone()));
    let operation = charged(&services[0].url, &intent.key).await;
    doomed.crash();
    let killed = Instant::now();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the answer died with the process"
    );
    assert_eq!(payments_in(&url).await, 0, "nothing committed");

    let retried = retry_until_final(&client(), &services[0].url, &intent).await;
    let took = killed.elapsed();
    let done = retried.last().unwrap();
    assert_eq!(done.status, StatusCode::CREATED, "{retried:?}");
    assert!(!done.replayed(), "B ran it: {done:?}");
    assert_eq!(done.operation_id(), Some(operation.as_str()), "resumed");
    assert_eq!(
        provider.requests(&charge_key(&operation)),
        1,
        "replayed from the journal, not sent again"
    );
    eprintln!(
        "B finished {took:?} after the kill, after {} answers",
        retried.len()
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    outcomes.add(&intent, retried);
    outcomes.check(&url, &provider, &services).await;
}

/// Instance A holds every payment 6 s after its charge, before its commit, and is paused
/// with SIGSTOP once the status lookup shows the charge done (its transaction open, its
/// payment row written, not committed). The client retries at instance B until it
/// succeeds: 409 while A's lease lasts (no longer renewed), then B takes the operation
/// over and resumes it from the journal, without a second charge. Then A is resumed
/// (SIGCONT): its late commit is fenced out (its client gets 503, not a 201 for a second
/// payment), and A replays B's answer afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_instance_is_taken_over_and_its_late_commit_fenced_out() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(url) = scratch_url("payments processes: a paused instance").await else {
        return;
    };
    let provider = TestProvider::start().await;
    let services = instances(&url, &provider, &[&["--delay", "6s"], &[]]);
    let (paused, other) = (&services[0], &services[1]);
    let mut outcomes = Outcomes::default();
    let intent = Intent::new("pay-paused", 0);

    // Its client waits for as long as the test may take.
    let in_flight = tokio::spawn(
        intent
            .clone()
            .send_to(client_waiting(2 * PATIENCE), paused.url.clone()),
    );
    let operation = charged(&other.url, &intent.key).await;
    paused.pause();
    let stopped = Instant::now();
    let retried = retry_until_final(&client(), &other.url, &intent).await;
    let took = stopped.elapsed();
    eprintln!(
        "B finished {took:?} after the pause, after {} answers",
        retried.len()
    );
    let done = retried.last().unwrap();
    assert_eq!(done.status, StatusCode::CREATED, "{retried:?}");
    assert!(!done.replayed(), "B ran it: {done:?}");
    assert_eq!(done.operation_id(), Some(operation.as_str()), "resumed");
    assert_eq!(
        provider.requests(&charge_key(&operation)),
        1,
        "from the journal"
    );
    // Within the contract's deadline (30 s), A still paused.
    assert!(took < Duration::from_secs(30), "{took:?}");
    outcomes.add(&intent, retried);

    paused.resume();
    let late = in_flight.await.unwrap().expect("A answers once resumed");
    assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE, "{late:?}");
    assert!(late.retry_after().is_some(), "{late:?}");
    outcomes.add(&intent, [late]);
    outcomes.check(&url, &provider, &services).await;
}

/// The clocks of the instances of the skew test, as `faketime -f` takes them (`None`:
/// this machine's).
const CLOCKS: [Option<&str>; 3] = [None, Some("+30s"), Some("-30s")];

/// Three instances on one database, one on this machine's clock and two on clocks
/// shifted by +30 s and -30 s (libfaketime), each holding every payment 3 s after its
/// charge (longer than the 2 s lease, so leases are renewed while the others ask). Nine
/// keys are sent to the three at once; nine more are held by each instance in turn (sent
/// to it first) and sent to the two others once its charge is done. Each client retries
/// its 409 after `Retry-After`: no instance takes a live attempt over (each record is at
/// its first attempt, each charge was asked for once: the handler ran once, where it was
/// held), and no answer is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_shifted_clocks_take_no_live_attempt_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let what = "payments processes on shifted clocks";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let Some(lib) = libfaketime(what) else {
        return;
    };
    let provider = TestProvider::start().await;
    let services = on_shifted_clocks(&url, &provider, &lib);
    let mut outcomes = Outcomes::default();
    let mut ran_by = [0; CLOCKS.len()];
    let at_once: Vec<Intent> = (0..9).map(|i| Intent::new("pay-skew", i)).collect();
    for (intent, answers) in all_at_once(&services, &at_once, at_once.len()).await {
        ran_by[ran_once_without_503(&provider, &intent, &answers)] += 1;
        outcomes.add(&intent, answers.into_iter().map(|(_, a)| a));
    }
    let mut held = tokio::task::JoinSet::new();
    let urls: Arc<[String]> = services.iter().map(|s| s.url.clone()).collect();
    for i in 0..9 {
        let (intent, urls) = (Intent::new("pay-held", i), urls.clone());
        held.spawn(async move {
            let answers = hold_and_ask(&urls, i % urls.len(), &intent).await;
            (intent, i % urls.len(), answers)
        });
    }
    while let Some(joined) = held.join_next().await {
        let (intent, holder, answers) = joined.unwrap();
        let ran = ran_once_without_503(&provider, &intent, &answers);
        assert_eq!(ran, holder, "{}: run where it was held", intent.key);
        ran_by[ran] += 1;
        outcomes.add(&intent, answers.into_iter().map(|(_, a)| a));
    }
    eprintln!("attempts run by the instances on clocks {CLOCKS:?}: {ran_by:?}");
    assert_eq!(first_attempts_only(&url).await, 18, "none taken over");
    outcomes.check(&url, &provider, &services).await;
}

/// An instance on each clock of [`CLOCKS`], on `url`, every payment held 3 s; each
/// shifted one has said at start how far its clock is from the store's.
fn on_shifted_clocks(url: &str, provider: &TestProvider, lib: &Path) -> Vec<Service> {
    let lib = lib.to_str().expect("a UTF-8 path");
    let each = CLOCKS.iter().map(|clock| {
        let env = clock.map_or_else(Vec::new, |offset| {
            vec![("LD_PRELOAD", lib), ("FAKETIME", offset)]
        });
        (&["--delay", "3s"][..], env)
    });
    let services = instances_with(url, provider, each);
    for (service, clock) in services.iter().zip(CLOCKS) {
        match clock {
            Some(offset) if offset.starts_with('+') => {
                service.wait_for_stderr("ms ahead of the store's");
            }
            Some(_) => service.wait_for_stderr("ms behind the store's"),
            None => {}
        }
    }
    services
}

/// Sends `intent` to the instance `holder` of `urls`, and, once its charge is done (its
/// attempt holds the key, in its 3 s delay), to each other instance, whose first answer
/// is the declared 409; every client retries until its answer is final.
async fn hold_and_ask(urls: &[String], holder: usize, intent: &Intent) -> Vec<(usize, Reply)> {
    let http = client();
    let held = {
        let (http, url, intent) = (http.clone(), urls[holder].clone(), intent.clone());
        tokio::spawn(async move { retry_until_final(&http, &url, &intent).await })
    };
    let others: Vec<usize> = (0..urls.len()).filter(|&i| i != holder).collect();
    charged(&urls[others[0]], &intent.key).await;
    let mut asked = tokio::task::JoinSet::new();
    for &other in &others {
        let (http, url, intent) = (http.clone(), urls[other].clone(), intent.clone());
        asked.spawn(async move {
            let answers = retry_until_final(&http, &url, &intent).await;
            assert_eq!(answers[0].status, StatusCode::CONFLICT, "{answers:?}");
            answers.into_iter().map(move |a| (other, a))
        });
    }
    let mut answers: Vec<(usize, Reply)> = held
        .await
        .unwrap()
        .into_iter()
        .map(|a| (holder, a))
        .collect();
    while let Some(joined) = asked.join_next().await {
        answers.extend(joined.unwrap());
    }
    answers
}

/// [`ran_once`], after checking that none of `answers` is a 503 and that the charge was
/// asked for once; the instance that ran it.
fn ran_once_without_503(
    provider: &TestProvider,
    intent: &Intent,
    answers: &[(usize, Reply)],
) -> usize {
    for (instance, answer) in answers {
        assert_ne!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}: instance {instance} (clock {:?}): {answer:?}",
            intent.key,
            CLOCKS[*instance]
        );
    }
    let ran = ran_once(&intent.key, answers);
    let operation = answers[0].1.operation_id().unwrap();
    let requests = provider.requests(&charge_key(operation));
    assert_eq!(requests, 1, "{}: charge asked for once", intent.key);
    ran
}

/// libfaketime, from Debian's package `faketime`, when it is installed and shifts the
/// clock; `None` (after saying why) when it is missing. The processes load it
/// themselves (`LD_PRELOAD`, `FAKETIME`) rather than under the `faketime` command, which
/// forks them: killing it would leave them running.
///
/// # Panics
///
/// Under `CI=true` when it is missing (`.ci/run` installs it), or when it is loaded and
/// does not shift the clock.
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

/// How many records of the database at `url` are at their first attempt (none was
/// taken over or run again).
async fn first_attempts_only(url: &str) -> usize {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let attempts: Vec<(String, i64)> = sqlx::query_as("SELECT key, attempt FROM idem_records")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    for (key, attempt) in &attempts {
        assert_eq!(*attempt, 1, "{key}: taken over or run again");
    }
    attempts.len()
}

/// The provider answers 503 for 3 s: every payment sent meanwhile (six keys, over two
/// instances) gets 503 `step-outcome-unknown` with `Retry-After`, and nothing is charged.
/// Each client retries after `Retry-After` until the provider is back: each key keeps
/// its operation (the same operation id in every answer) and ends with its one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_down_for_a_while_is_waited_out() {
    provider_outage(Fault::Unavailable, "pay-down").await;
}

/// The provider holds every request that comes within 3 s, without answering or
/// charging, until the service's client gives up (5 s): as when it is down, each of
/// those payments gets 503 `step-outcome-unknown`, and its client's retries end with one
/// charge once the provider answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_provider_is_waited_out() {
    provider_outage(Fault::Hang, "pay-hang").await;
}

/// The provider misbehaves with `fault` for 3 s, while six keys of `prefix` are sent,
/// each to one of two instances and retried there (see the tests above).
async fn provider_outage(fault: Fault, prefix: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(url) = scratch_url(&format!("payments processes: provider {fault:?}")).await else {
        return;
    };
    let provider = Arc::new(TestProvider::start().await);
    let services = instances(&url, &provider, &[&[], &[]]);
    let intents: Vec<Intent> = (0..6).map(|i| Intent::new(prefix, i)).collect();
    provider.fail_for(fault, Duration::from_secs(3));
    let mut clients = tokio::task::JoinSet::new();
    for (i, intent) in intents.iter().enumerate() {
        let (intent, url) = (intent.clone(), services[i % 2].url.clone());
        clients.spawn(async move {
            let answers = retry_until_final(&client(), &url, &intent).await;
            (intent, answers)
        });
    }
    let mut outcomes = Outcomes::default();
    while let Some(joined) = clients.join_next().await {
        let (intent, answers) = joined.unwrap();
        let first = &answers[0];
        assert_eq!(
            (first.status, first.problem_type().as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, STEP_OUTCOME_UNKNOWN),
            "{}: {answers:#?}",
            intent.key
        );
        let operation = first.operation_id().unwrap().to_owned();
        for answer in &answers {
            assert_eq!(
                answer.operation_id(),
                Some(operation.as_str()),
                "{}",
                intent.key
            );
            if answer.status == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(answer.problem_type(), STEP_OUTCOME_UNKNOWN, "{answer:?}");
            }
        }
        assert!(
            provider.requests(&charge_key(&operation)) >= 2,
            "sent again"
        );
        outcomes.add(&intent, answers);
    }
    outcomes.check(&url, &provider, &services).await;
}

/// How many distinct keys the many-instances test sends, each to the three instances.
const KEYS: usize = 100;

/// How many of those keys are in flight at once, each with its three clients: twice as
/// many as an instance's pool has connections (16), so that one instance may be asked to
/// run more attempts than it can hold transactions for, and must keep connections for
/// their journals and leases (`idem_runtime`'s `PostgresState`).
const KEYS_AT_ONCE: usize = 32;

/// Three instances on one database and a hundred keys, each sent to the three at the same
/// moment ([`KEYS_AT_ONCE`] keys in flight at a time), every 409 retried after
/// `Retry-After`: each key's handler ran once (one 201 that is not a replay), all its 201
/// answers have the same body, no answer is a 503 (there is no fault), and each key made
/// one charge and one payment. Within 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_and_a_hundred_keys_charge_once_per_key() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(url) = scratch_url("payments processes: three instances").await else {
        return;
    };
    let provider = TestProvider::start().await;
    let services = instances(&url, &provider, &[&[], &[], &[]]);
    let intents: Vec<Intent> = (0..KEYS).map(|i| Intent::new("pay-many", i)).collect();
    let started = Instant::now();
    let answered = all_at_once(&services, &intents, KEYS_AT_ONCE).await;
    let took = started.elapsed();
    let mut outcomes = Outcomes::default();
    let (mut ran_by, mut conflicts) = ([0; 3], 0);
    for (intent, answers) in answered {
        ran_by[ran_once(&intent.key, &answers)] += 1;
        conflicts += answers
            .iter()
            .filter(|(_, a)| a.status == StatusCode::CONFLICT)
            .count();
        outcomes.add(&intent, answers.into_iter().map(|(_, a)| a));
    }
    eprintln!("{KEYS} keys x 3 instances in {took:?}: run by {ran_by:?}, {conflicts} answers 409");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    outcomes.check(&url, &provider, &services).await;
}

/// Sends each of `intents` to every instance of `services` at the same moment, each
/// client retrying until its answer is final ([`retry_until_final`]), `at_once` intents
/// in flight at a time; every answer of each intent, with the index of the instance that
/// gave it.
async fn all_at_once(
    services: &[Service],
    intents: &[Intent],
    at_once: usize,
) -> Vec<(Intent, Vec<(usize, Reply)>)> {
    let urls: Arc<[String]> = services.iter().map(|s| s.url.clone()).collect();
    let gate = Arc::new(Semaphore::new(at_once));
    let http = client();
    let mut tasks = tokio::task::JoinSet::new();
    for intent in intents.iter().cloned() {
        let (gate, urls, http) = (gate.clone(), urls.clone(), http.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let mut clients = tokio::task::JoinSet::new();
            for (i, url) in urls.iter().enumerate() {
                let (http, url, intent) = (http.clone(), url.clone(), intent.clone());
                clients.spawn(async move {
                    let answers = retry_until_final(&http, &url, &intent).await;
                    answers.into_iter().map(move |a| (i, a))
                });
            }
            let mut answers = Vec::new();
            while let Some(joined) = clients.join_next().await {
                answers.extend(joined.unwrap());
            }
            (intent, answers)
        });
    }
    let mut answered = Vec::with_capacity(intents.len());
    while let Some(joined) = tasks.join_next().await {
        answered.push(joined.unwrap());
    }
    answered
}

/// The instance that ran `key`: exactly one of `answers` is a 201 that is not a replay,
/// and every other answer is a replay of it or the declared 409 (with the same
/// operation id).
fn ran_once(key: &str, answers: &[(usize, Reply)]) -> usize {
    let ran: Vec<&(usize, Reply)> = answers
        .iter()
        .filter(|(_, a)| a.status == StatusCode::CREATED && !a.replayed())
        .collect();
    assert_eq!(ran.len(), 1, "{key}: one attempt ran: {answers:#?}");
    let (instance, first) = ran[0];
    for (_, answer) in answers {
        match answer.status {
            StatusCode::CREATED => assert_eq!(answer.body, first.body, "{key}"),
            StatusCode::CONFLICT => {
                assert_eq!(answer.problem_type(), IN_PROGRESS, "{key}: {answer:?}");
                assert_eq!(answer.json()["state"], "processing", "{key}");
            }
            _ => panic!("{key}: neither the result nor the declared 409: {answer:?}"),
        }
        assert_eq!(answer.operation_id(), first.operation_id(), "{key}");
    }
    *instance
}

/// The status lookup at `url` polled (at most 20 s) until the step `charge` of `key` is
/// done, the operation still processing; its operation id.
async fn charged(url: &str, key: &str) -> String {
    let http = client();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let status = lookup(&http, url, key).await;
        if status["steps"][0]["state"] == "done" {
            assert_eq!(status["state"], "processing", "{status}");
            return status["operation_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < until, "{key}: never charged: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The downstream key of the charge of `operation`: the key the provider deduplicates on.
fn charge_key(operation: &str) -> String {
    format!("{operation}:charge")
}

/// Instances of the service on `url`, one for each list of extra arguments, each charging
/// at `provider`.
fn instances(url: &str, provider: &TestProvider, extra: &[&[&str]]) -> Vec<Service> {
    instances_with(url, provider, extra.iter().map(|e| (*e, Vec::new())))
}

/// [`instances`], each with its environment too.
fn instances_with<'a>(
    url: &str,
    provider: &TestProvider,
    each: impl IntoIterator<Item = (&'a [&'a str], Vec<(&'a str, &'a str)>)>,
) -> Vec<Service> {
    let provider_url = provider.url();
    each.into_iter()
        .map(|(extra, env)| {
            let mut args = vec!["--provider-url", provider_url.as_str()];
            args.extend_from_slice(extra);
            Service::start(url, &args, &env)
        })
        .collect()
}

/// One client intent: a key and its payment.
#[derive(Clone, Debug)]
struct Intent {
    key: String,
    body: Value,
}

impl Intent {
    /// The `i`-th intent of `prefix`: `<prefix>-<i>`, for 1000 + `i` minor units.
    fn new(prefix: &str, i: usize) -> Intent {
        Intent {
            key: format!("{prefix}-{i:03}"),
            body: payment(1000 + i64::try_from(i).unwrap()),
        }
    }

    /// Sends it once to `service`.
    async fn send(&self, http: &reqwest::Client, service: &Service) -> Reply {
        try_post(http, &service.url, &self.key, &self.body)
            .await
            .unwrap_or_else(|e| panic!("{}: no answer from {}: {e}", self.key, service.url))
    }

    /// Sends it once to `url` (for a task of its own).
    async fn send_to(self, http: reqwest::Client, url: String) -> Result<Reply, reqwest::Error> {
        try_post(&http, &url, &self.key, &self.body).await
    }
}

/// Whether `reply` asks the client to retry with the same key, after its `Retry-After`:
/// the declared 409 while another attempt holds the key, or a 503.
fn asks_to_retry(reply: &Reply) -> bool {
    match reply.status {
        StatusCode::CONFLICT => reply.problem_type() == IN_PROGRESS,
        StatusCode::SERVICE_UNAVAILABLE => true,
        _ => false,
    }
}

/// A client that sends `intent` to `url` until the answer is final, waiting
/// `Retry-After` between tries (which every 409 and 503 must have); every answer, the
/// final one last.
///
/// # Panics
///
/// When there is no answer, or no final answer within [`PATIENCE`].
async fn retry_until_final(http: &reqwest::Client, url: &str, intent: &Intent) -> Vec<Reply> {
    let until = Instant::now() + PATIENCE;
    let mut answers = Vec::new();
    loop {
        let reply = try_post(http, url, &intent.key, &intent.body)
            .await
            .unwrap_or_else(|e| panic!("{}: no answer from {url}: {e}", intent.key));
        if !asks_to_retry(&reply) {
            answers.push(reply);
            return answers;
        }
        let wait = reply
            .retry_after()
            .unwrap_or_else(|| panic!("{}: a retry without Retry-After: {reply:?}", intent.key));
        answers.push(reply);
        let wait = Duration::from_secs(wait);
        assert!(
            Instant::now() + wait < until,
            "{}: no final answer from {url} within {PATIENCE:?}: {answers:#?}",
            intent.key
        );
        tokio::time::sleep(wait).await;
    }
}

/// Every answer each key got, from any instance, and its intent.
#[derive(Default)]
struct Outcomes {
    keys: BTreeMap<String, (Intent, Vec<Reply>)>,
}

impl Outcomes {
    /// Notes `answers` to `intent`.
    fn add(&mut self, intent: &Intent, answers: impl IntoIterator<Item = Reply>) {
        self.keys
            .entry(intent.key.clone())
            .or_insert_with(|| (intent.clone(), Vec::new()))
            .1
            .extend(answers);
    }

    /// Sends every key once more to every instance of `services` (each answers the final
    /// answer, replayed), then checks the answers of each key, the provider's charges and
    /// the database at `url` (see the module's documentation).
    async fn check(mut self, url: &str, provider: &TestProvider, services: &[Service]) {
        let http = client();
        for (intent, answers) in self.keys.values_mut() {
            for service in services {
                let again = intent.send(&http, service).await;
                assert!(again.replayed(), "{}: {again:?}", intent.key);
                answers.push(again);
            }
        }
        let finals: BTreeMap<&str, &Reply> = self
            .keys
            .iter()
            .map(|(key, (_, answers))| (key.as_str(), final_answer(key, answers)))
            .collect();
        for (key, done) in &finals {
            assert_eq!(done.status, StatusCode::CREATED, "{key}: {done:?}");
            let operation = done.operation_id().unwrap();
            assert_eq!(provider.charges(&charge_key(operation)), 1, "{key}");
        }
        assert_eq!(
            provider.total_charges() as usize,
            finals.len(),
            "one charge per intent"
        );
        check_database(url, &finals).await;
    }
}

/// The one final answer among `answers`, all the answers `key` got: every answer that is
/// not a request to retry has the same status, body and operation id, and at most one of
/// them is not a replay (the attempt that ran it; none when its answer was lost).
fn final_answer<'a>(key: &str, answers: &'a [Reply]) -> &'a Reply {
    let finals: Vec<&Reply> = answers.iter().filter(|a| !asks_to_retry(a)).collect();
    let ran: Vec<&&Reply> = finals.iter().filter(|a| !a.replayed()).collect();
    assert!(ran.len() <= 1, "{key}: ran more than once: {answers:#?}");
    let first = ran
        .first()
        .map(|a| **a)
        .or_else(|| finals.first().copied())
        .unwrap_or_else(|| panic!("{key}: no final answer: {answers:#?}"));
    for answer in &finals {
        assert_eq!(
            (answer.status, &answer.body, answer.operation_id()),
            (first.status, &first.body, first.operation_id()),
            "{key}: every final answer is the same"
        );
    }
    first
}

/// The database at `url` holds one payment per key of `finals`, the one answered, and
/// every record of `idem_records` is completed: none parked as `unknown`, none left
/// processing or released; every step done.
async fn check_database(url: &str, finals: &BTreeMap<&str, &Reply>) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT idempotency_key, id, operation_id FROM payments")
            .fetch_all(&pool)
            .await
            .unwrap();
    let parked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE state = 'unknown'")
            .fetch_one(&pool)
            .await
            .unwrap();
    let records: Vec<(String, String)> = sqlx::query_as("SELECT key, state FROM idem_records")
        .fetch_all(&pool)
        .await
        .unwrap();
    let steps: Vec<(String, String)> = sqlx::query_as("SELECT operation_id, state FROM idem_steps")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(parked, 0, "nothing parked for an operator: {records:?}");
    assert_eq!(rows.len(), finals.len(), "one payment per key: {rows:?}");
    for (key, id, operation) in &rows {
        let done = finals
            .get(key.as_str())
            .unwrap_or_else(|| panic!("a payment for an unknown key {key}"));
        assert_eq!(done.json()["id"].as_str(), Some(id.as_str()), "{key}");
        assert_eq!(done.operation_id(), Some(operation.as_str()), "{key}");
    }
    assert_eq!(records.len(), finals.len(), "{records:?}");
    for (key, state) in &records {
        assert_eq!(state, "completed", "{key}");
    }
    assert_eq!(
        steps.len(),
        finals.len(),
        "one step per operation: {steps:?}"
    );
    assert!(steps.iter().all(|(_, state)| state == "done"), "{steps:?}");
}
