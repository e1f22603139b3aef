//! Every store's `POST /orders` under idem against the hand-written minimum and the bare
//! handler: `cargo bench -p idem-bench --bench stores` (needs `wrk`). What runs, and its
//! knobs: [`idem_bench::stores`].

fn main() {
    idem_bench::stores::run(&idem_bench::stores::Settings::from_env()).print();
}
