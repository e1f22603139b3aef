//! Compile-time contract checks: every rule of the attribute (the reference is
//! `docs/contract.md`) has a compile-fail case in `fail/` whose expected errors are a
//! reviewed `.stderr` snapshot; one mistake gives one error. The pass cases in `pass/` are
//! test targets of this package of their own (see Cargo.toml).
//!
//! Regenerate snapshots with `TRYBUILD=overwrite cargo test -p idem-ui-tests`, then review
//! the diff like code.

#[test]
fn compile_fail() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("fail/*/*.rs");
}
