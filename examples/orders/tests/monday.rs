//! `orders monday` as a process: the Monday test against the service itself checks and
//! passes every proof, 4 (its trace) and 5 (its store, through the operator's calls)
//! included.

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
        stdout.contains("passed: 30 of 30 proofs checked, 0 failed, 0 not checked"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the lost 201 came back byte for byte"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(!stdout.contains("not checked  "), "{stdout}");
    // Proof 4 from idem's spans: one final outcome per scenario.
    assert_eq!(
        stdout.matches("idem.operation.end: completed").count(),
        6,
        "{stdout}"
    );
    // Proof 5 from the store: every scenario ends completed, so nothing to restore; the
    // refusals' and the crash's two attempts are both shown.
    assert_eq!(stdout.matches("nothing to restore").count(), 6, "{stdout}");
    assert!(stdout.contains("#1 released, #2 completed 201"), "{stdout}");
}
