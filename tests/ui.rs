//! Compile-time contract checks: every rule of DESIGN §3 has a compile-fail case whose
//! expected errors are a reviewed `.stderr` snapshot, and the pass cases compile and run.
//!
//! Regenerate snapshots with `TRYBUILD=overwrite cargo test --test ui`, then review the
//! diff like code.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*/*.rs");
    cases.compile_fail("tests/ui/fail/*/*.rs");
}
