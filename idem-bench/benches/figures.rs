//! Every figure of idem's performance goals in one table: `cargo bench -p idem-bench`
//! (`-- --quick` for the harness at a tiny scale, which `cargo test` also runs). What
//! runs: [`idem_bench::figures`].
//!
//! The quick run without `wrk` on the `PATH` says it is skipped and passes, as the tests
//! without their servers do, except under `CI=true`, where it fails.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let scale = idem_bench::figures::Scale::from_args(&args);
    if scale.quick && !idem_bench::wrk::available() && std::env::var("CI").as_deref() != Ok("true")
    {
        eprintln!("skipped: the figures' quick run needs wrk on the PATH (apt-get install wrk)");
        return;
    }
    idem_bench::figures::run(&scale).print();
}
