//! The example as its README shows it: the binary, run whole, prints one order, two
//! attempts, the second a replay, and exits 0.

use std::process::Command;
use std::time::{Duration, Instant};

/// The value printed after `label` (`attempts        2` gives `2`).
fn value<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(label)?;
            rest.starts_with(' ').then(|| rest.trim())
        })
        .unwrap_or_else(|| panic!("no line `{label} …` in:\n{stdout}"))
}

#[test]
fn one_order_two_attempts_the_second_a_replay() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_orders_client"))
        .env_remove("RUST_LOG")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );

    assert_eq!(value(&stdout, "outcome"), "Completed");
    assert_eq!(value(&stdout, "attempts"), "2");
    assert_eq!(value(&stdout, "replayed"), "true");
    assert_eq!(value(&stdout, "from lookup"), "false");
    assert_eq!(value(&stdout, "status"), "201 Created");
    assert_eq!(value(&stdout, "orders in db"), "1");
    let operation_id = value(&stdout, "operation-id");
    assert!(!operation_id.is_empty() && operation_id != "(none)");
    assert!(!value(&stdout, "key").is_empty());
    assert!(value(&stdout, "body").contains(r#""customer_id":"cus_42""#));

    // The proxy's view: the first answer (the 201 of the commit) lost, the second (the
    // replay, same operation) passed on.
    let first = value(&stdout, "proxy, request 1:");
    assert!(first.starts_with("POST /orders -> 201 Created"), "{first}");
    assert!(
        first.contains(operation_id) && first.contains("LOST"),
        "{first}"
    );
    let second = value(&stdout, "proxy, request 2:");
    assert!(
        second.contains(operation_id)
            && second.contains("Idempotent-Replayed: true")
            && second.ends_with("passed on"),
        "{second}"
    );
    assert!(!stdout.contains("proxy, request 3:"), "{stdout}");
    assert!(stdout.contains("\nok: "), "{stdout}");
}
