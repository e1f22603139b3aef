//! `cargo bench -p idem-bench --bench overhead`: idem against a bare handler and against
//! `axum-idempotent`, on loopback. What it measures and its knobs: the `idem_bench` crate's
//! documentation (`idem-bench/src/lib.rs`).

fn main() {
    idem_bench::main();
}
