//! New keys as the store grows, and during a purge: `cargo bench -p idem-bench --bench
//! flat` (needs `wrk`). What runs, and its knobs: [`idem_bench::flat`].

fn main() {
    idem_bench::flat::run(&idem_bench::flat::Settings::from_env()).print();
}
