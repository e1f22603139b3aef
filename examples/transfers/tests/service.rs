//! The guide "your own service" (`docs/your-own-service.md`), as a user runs it: the
//! binary on 127.0.0.1, and the code in the guide the same as `src/main.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// The binary on a free port; killed when dropped.
struct Service {
    child: Child,
    url: String,
}

impl Service {
    fn start() -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_transfers"))
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("the transfers binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .expect("the service prints its address");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Service { child, url }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The guide's block is `no_run`: it is also a doctest of the `idem` crate
/// (`idem::guide::your_own_service`), which compiles it but must not serve forever.
#[test]
fn the_guide_shows_this_crates_main_rs() {
    let guide = include_str!("../../../docs/your-own-service.md");
    let main = include_str!("../src/main.rs");
    assert!(
        guide.contains(&format!("```rust,no_run\n{main}```")),
        "docs/your-own-service.md must show examples/transfers/src/main.rs as it is"
    );
}

#[tokio::test]
async fn a_transfer_runs_once_and_its_retry_is_the_replay() {
    let service = Service::start();
    let client = reqwest::Client::new();
    let send = |key: &str, amount: u64| {
        client
            .post(format!("{}/transfers", service.url))
            .header("x-client-id", "acme")
            .header("idempotency-key", key)
            .json(&json!({"from": "acc_1", "to": "acc_2", "amount_minor": amount}))
            .send()
    };
    let first = send("tr-1", 500).await.unwrap();
    assert_eq!(first.status(), 201);
    let operation_id = first.headers()["operation-id"].to_str().unwrap().to_owned();
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["id"], format!("tr_{operation_id}"));

    let again = send("tr-1", 500).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);

    let changed = send("tr-1", 900).await.unwrap();
    assert_eq!(changed.status(), 422);

    let status: Value = client
        .get(format!("{}/transfers/operations/tr-1", service.url))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["state"], "completed");
    assert_eq!(status["operation_id"], operation_id);
}
