//! The guide "your own service" on PostgreSQL (`docs/your-own-service.md`), as a user
//! runs it: two processes of the binary on one database, and the code in the guide the
//! same as this crate's.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// The binary on a free port of 127.0.0.1, on the database at `url`; killed when dropped.
struct Instance {
    child: Child,
    url: String,
}

impl Instance {
    fn start(database_url: &str) -> Instance {
        let mut child = Command::new(env!("CARGO_BIN_EXE_renewals"))
            .arg("127.0.0.1:0")
            .env("DATABASE_URL", database_url)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the renewals binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .expect("the service prints its address");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no address in {line:?}: did it start?"))
            .to_owned();
        Instance { child, url }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The guide's blocks are `no_run`: they are also doctests of the `idem` crate
/// (`idem::guide::your_own_service`), which compile them but must not serve forever.
#[test]
fn the_guide_shows_this_crates_sources() {
    let guide = include_str!("../../../docs/your-own-service.md");
    for (name, source) in [
        ("src/lib.rs", include_str!("../src/lib.rs")),
        ("src/main.rs", include_str!("../src/main.rs")),
    ] {
        assert!(
            guide.contains(&format!("```rust,no_run\n{source}```")),
            "docs/your-own-service.md must show examples/renewals/{name} as it is"
        );
    }
    let monday = include_str!("monday.rs");
    let recipe = &monday[monday.find("async fn monday").unwrap()..];
    assert!(
        guide.contains(recipe.trim_end()),
        "docs/your-own-service.md must show `monday` of examples/renewals/tests/monday.rs as it is"
    );
}

/// Two instances, one database: the same renewal sent to both at once extends the
/// subscription once; the retry on either is the replay, a retry that leaves out the
/// `null` coupon too, and the status lookup of the other instance knows the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_renew_once_per_key() {
    let what = "two renewals processes on one PostgreSQL database";
    let Some(database) = idem_runtime::store::conformance::postgres::scratch_url(what).await else {
        return;
    };
    let (a, b) = (Instance::start(&database), Instance::start(&database));
    let http = reqwest::Client::new();
    let renew = |base: &str, body: Value| {
        http.post(format!("{base}/subscriptions/sub_1/renewals"))
            .header("x-client-id", "acme")
            .header("idempotency-key", "renew-2026-07")
            .json(&body)
            .send()
    };
    let body = json!({ "plan": "pro", "coupon": null });
    let (first, second) = tokio::join!(renew(&a.url, body.clone()), renew(&b.url, body));
    let statuses = [first.unwrap().status(), second.unwrap().status()];
    assert!(
        statuses.contains(&reqwest::StatusCode::CREATED),
        "{statuses:?}"
    );
    // The other one was a duplicate in flight (409) or the replay (201).
    let settled = renew(&b.url, json!({ "plan": "pro" })).await.unwrap();
    assert_eq!(settled.status(), 201);
    assert_eq!(settled.headers()["idempotent-replayed"], "true");
    let operation_id = settled.headers()["operation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let renewal: Value = settled.json().await.unwrap();
    assert_eq!(renewal["id"], format!("ren_{operation_id}"));

    let again = renew(&a.url, json!({ "plan": "pro", "coupon": null }))
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), renewal);

    let status: Value = http
        .get(format!("{}/renewals/operations/renew-2026-07", b.url))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["state"], "completed", "{status}");

    // Another plan under the same key is another request: refused, nothing renewed.
    let other = renew(&a.url, json!({ "plan": "team" })).await.unwrap();
    assert_eq!(other.status(), 422);
    let next = http
        .post(format!("{}/subscriptions/sub_1/renewals", a.url))
        .header("x-client-id", "acme")
        .header("idempotency-key", "renew-2026-08")
        .json(&json!({ "plan": "pro" }))
        .send()
        .await
        .unwrap();
    let next: Value = next.json().await.unwrap();
    let month = 30 * 86_400;
    assert_eq!(
        next["paid_until"].as_i64().unwrap() - renewal["paid_until"].as_i64().unwrap(),
        month,
        "one month per key: {renewal} then {next}"
    );
}
