//! A new key's store calls without the service, against the hand-written minimum's:
//! `cargo bench -p idem-bench --bench alone`. What runs, and its knobs:
//! [`idem_bench::alone`].

fn main() {
    idem_bench::alone::run(&idem_bench::alone::Settings::from_env()).print();
}
