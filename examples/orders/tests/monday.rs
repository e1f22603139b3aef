//! `orders monday` as a process: the Monday test against the service itself passes every
//! proof it checks, and says which it did not check.

use std::process::Command;

#[test]
fn orders_monday_runs_the_harness_against_itself_and_passes() {
    let out = Command::new(env!("CARGO_BIN_EXE_orders"))
        .arg("monday")
        .env_remove("RUST_LOG")
        .output()
        .expect("orders runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for scenario in [
        "lost answer",
        "429 Retry-After",
        "transient 503",
        "permanent 400",
        "concurrent, one key",
        "crash midway",
    ] {
        assert!(stdout.contains(scenario), "{scenario} missing:\n{stdout}");
    }
    assert!(
        stdout.contains("passed: 18 of 30 proofs checked, 0 failed, 12 not checked"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the lost 201 came back byte for byte"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // Proofs 4 and 5 are not passed without a check that shows them.
    assert_eq!(
        stdout.matches("not checked  no trace check").count(),
        6,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("not checked  no operator check").count(),
        6,
        "{stdout}"
    );
}
