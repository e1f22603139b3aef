//! `orders_client`: one order placed with `idem-client` through a proxy that loses the
//! first answer after the server committed it.
//!
//! It starts the orders service in-process on 127.0.0.1 with a fresh SQLite file, puts
//! a loopback proxy in front of it that closes the client's connection instead of
//! returning the first answer, and creates one order under the retry policy of the
//! service's own contract (`create_order::CONTRACT`). The client sees its connection
//! close with no answer, which the contract declares retryable (`connection_reset`), and
//! retries with the same idempotency key; the service replays the stored 201. It prints
//! what happened and exits non-zero unless the result is exactly one order, two
//! attempts, the second a replay.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use idem_client::{Call, Client, Intent, Outcome, RetryPolicy};
use orders::api::{CLIENT_ID_HEADER, create_order};
use orders::model::{CreateOrder, LineItem};
use orders::{Backend, Config, Service};

// The loopback proxy of idem's conformance harness (`idem::testing`, feature `testing`).
use idem::testing::proxy::Proxy;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the scenario; `Ok(false)` when it did not end as it should.
async fn run() -> Result<bool, Box<dyn Error + Send + Sync>> {
    // 1. The orders service, in-process, on a fresh SQLite file.
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("orders.db");
    let config = Config::new(Backend::Sqlite { db: db.clone() });
    let service = Service::open(&config).await?;
    let orders_db = service.app.orders.clone();
    let listener = Service::bind(([127, 0, 0, 1], 0).into()).await?;
    let service_addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(service.serve(listener, async {
        let _ = stopped.await;
    }));
    println!(
        "orders service  http://{service_addr}, temporary SQLite file {}",
        db.display()
    );

    // 2. The proxy that loses the first answer.
    let proxy = Proxy::start(service_addr).await?;
    println!(
        "proxy           http://{}, loses the first answer after the service sent it",
        proxy.addr()
    );

    // 3. The policy from the service's own contract; one intent, one key.
    let policy = RetryPolicy::from_contract(&create_order::CONTRACT);
    let retryable: Vec<String> = policy.retryable().iter().map(ToString::to_string).collect();
    println!(
        "policy          {}: at most {} attempts, {:?} in all, {:?} each; retries {}",
        policy.operation(),
        policy.max_attempts(),
        policy.deadline(),
        policy.per_attempt().unwrap_or(policy.deadline()),
        retryable.join(", ")
    );
    let intent = Intent::new(policy);
    let order = CreateOrder {
        customer_id: "cus_42".into(),
        currency: "EUR".into(),
        amount_minor: 1999,
        items: vec![LineItem {
            sku: "book-1".into(),
            qty: 1,
        }],
    };
    let call = Call::post_json(&format!("http://{}/orders", proxy.addr()), &order)?
        .header(CLIENT_ID_HEADER, "acme")?;
    let outcome = Client::new()?.execute(intent, &call).await?;

    // 4. What the proxy saw, what the client got, and what the database holds.
    let exchanges = proxy.exchanges();
    println!();
    for (i, exchange) in exchanges.iter().enumerate() {
        println!(
            "proxy, request {}: {} -> {}, Operation-Id {}{}: {}",
            i + 1,
            exchange.request,
            exchange.answer,
            exchange.operation_id.as_deref().unwrap_or("(none)"),
            if exchange.replayed {
                ", Idempotent-Replayed: true"
            } else {
                ""
            },
            if exchange.delivered {
                "passed on"
            } else {
                "LOST (the client's connection closed, nothing written)"
            }
        );
    }
    let orders = orders_db.count().await?;
    println!();
    let ok = match &outcome {
        Outcome::Completed(done) => {
            let body = String::from_utf8_lossy(&done.body);
            println!("outcome         Completed");
            println!("attempts        {}", done.attempts);
            println!("replayed        {}", done.replayed);
            println!("from lookup     {}", done.from_lookup);
            println!("status          {}", done.status);
            println!(
                "operation-id    {}",
                done.operation_id.as_deref().unwrap_or("(none)")
            );
            println!("key             {}", done.key);
            println!("body            {body}");
            println!("orders in db    {orders}");
            let lost = exchanges.first();
            let same_operation = lost.is_some_and(|l| l.operation_id == done.operation_id);
            done.attempts == 2
                && done.replayed
                && !done.from_lookup
                && done.status.as_u16() == 201
                && orders == 1
                && exchanges.len() == 2
                && lost.is_some_and(|l| !l.delivered && !l.replayed)
                && same_operation
        }
        Outcome::Failed(failed) => {
            println!("outcome         Failed");
            println!("attempts        {}", failed.attempts);
            println!("status          {}", failed.status);
            println!("problem         {:?}", failed.problem);
            println!("body            {}", String::from_utf8_lossy(&failed.body));
            println!("orders in db    {orders}");
            false
        }
        Outcome::Unknown(unknown) => {
            println!("outcome         Unknown");
            println!("attempts        {}", unknown.attempts);
            println!("reason          {:?}", unknown.reason);
            println!("last attempt    {:?}", unknown.last);
            println!("status lookup   {:?}", unknown.lookup);
            println!("key             {}", unknown.key());
            println!("orders in db    {orders}");
            false
        }
    };
    println!();
    if ok {
        println!(
            "ok: the first answer was lost after the commit; the retry with the same key got \
             the stored 201 replayed, under the same Operation-Id: one order, two attempts"
        );
    } else {
        println!("NOT as expected: wanted one order, two attempts, the second a replay");
    }

    let _ = stop.send(());
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => eprintln!("the service stopped with an error: {error}"),
        Ok(Err(error)) => eprintln!("the service's task failed: {error}"),
        Err(_) => eprintln!("the service did not stop within 5 s"),
    }
    Ok(ok)
}
