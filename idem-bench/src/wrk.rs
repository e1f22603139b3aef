//! The `wrk` driver the loopback benchmarks share (this crate's `stores`, `flat`, `budget`
//! and `cluster`, and `examples/orders/benches/modes.rs`): one timed run of a Lua script, its
//! requests per second and p99 latency, and the median of rounds.

use std::path::Path;
use std::process::Command;

/// The Lua script of a run of `POST /orders`: each request from the client `client` and
/// with the key `key`, both Lua expressions over `run` (the run's number, [`wrk`]), `tid`
/// (the wrk thread, 1 or 2) and `counter` (the thread's request count), such as
/// `"c-" .. (counter % 1000)` (a key made of `run`, `tid` and `counter` is new in every
/// request); the body is a 45-byte order. A non-2xx answer is written out, so that the
/// run's failure says which it was.
pub fn orders_script(client: &str, key: &str) -> String {
    format!(
        r#"{THREAD_IDS}
function request()
  counter = counter + 1
  return wrk.format("POST", "/orders", {{
    ["Content-Type"] = "application/json",
    ["X-Client-Id"] = {client},
    ["Idempotency-Key"] = {key},
  }}, '{ORDER}')
end
function response(status, headers, body)
  if status >= 300 then io.write("answered " .. status .. ": " .. body .. "\n") end
end
"#
    )
}

/// The body of every benchmark's `POST /orders`: a 45-byte order.
pub const ORDER: &str = r#"{"customer_id":"cus_42","amount_minor":1999}"#;

/// The start of every wrk script: each wrk thread numbered in `tid` (1, 2, …) and a
/// `counter` of its requests, which `request()` increments.
pub const THREAD_IDS: &str = r#"local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
counter = 0"#;

/// Whether wrk can be run (it is on the PATH).
#[must_use]
pub fn available() -> bool {
    Command::new("wrk").arg("--version").output().is_ok()
}

/// Exits with 2 and says how to install it when wrk is not on the PATH.
pub fn require() {
    if !available() {
        eprintln!("the benchmark needs wrk on the PATH (apt-get install wrk)");
        std::process::exit(2);
    }
}

/// The rounds and seconds of a run (`IDEM_BENCH_ROUNDS`, default 3;
/// `IDEM_BENCH_SECONDS`, default 5), after [`require`].
pub fn wrk_rounds() -> (usize, u64) {
    require();
    let read = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = usize::try_from(read("IDEM_BENCH_ROUNDS", 3)).unwrap_or(3);
    (rounds, read("IDEM_BENCH_SECONDS", 5))
}

/// Requests per second and p99 latency in milliseconds of one `wrk -t2` run of `seconds`
/// over `connections` connections. The script sees a global `run` (the decimal `run`), so
/// that keys made of it are new in every run.
///
/// # Panics
///
/// When wrk cannot run, prints no rate (a script error), or counts a non-2xx answer: the
/// panic message carries wrk's output.
pub fn wrk(url: &str, script: &Path, seconds: u64, connections: usize, run: usize) -> (f64, f64) {
    let lua = std::fs::read_to_string(script).expect("the Lua script is readable");
    let script_run = script.with_extension(format!("{run}.lua"));
    std::fs::write(&script_run, format!("run = \"{run}\"\n{lua}"))
        .expect("the run's Lua script is written beside the script");
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            "-s",
        ])
        .arg(&script_run)
        .arg(format!("{url}/orders"))
        .output()
        .expect("wrk runs (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    // A minimum's 409 (a key taken) counts here too: with unique keys it never happens.
    assert!(
        !text.contains("Non-2xx"),
        "a variant answered errors under load:\n{text}"
    );
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no Requests/sec in:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .map(|v| latency_ms(v.trim()))
        .unwrap_or(f64::NAN);
    (rps, p99)
}

/// A latency as wrk prints it (`850.00us`, `3.59ms`, `1.2s`) in milliseconds; NaN when
/// it is not one.
pub fn latency_ms(text: &str) -> f64 {
    let (number, factor) = if let Some(v) = text.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = text.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (text, f64::NAN)
    };
    number.parse::<f64>().map_or(f64::NAN, |n| n * factor)
}

/// The median of `values` (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
