//! No code: the package holds the compile-time contract checks of `#[idem::contract]`
//! (`compile_fail.rs`, `fail/`, `pass/`).
