//! Every figure of idem's performance goals in one table: `cargo bench -p idem-bench`
//! (`-- --quick` for the harness at a tiny scale, which `cargo test` also runs). What
//! runs: [`idem_bench::figures`].

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let scale = idem_bench::figures::Scale::from_args(&args);
    idem_bench::figures::run(&scale).print();
}
