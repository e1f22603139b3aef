//! The Redis store on one server against a Redis Cluster (issue 24):
//! `cargo bench -p idem-bench --bench cluster` (needs `wrk`, `redis-server` and `redis-cli`).
//!
//! The contracted `POST /orders` handler of `idem_bench::stores::handlers` (the order written
//! with `PSETEX` on the same Redis as the records, 201 with `Location`), through
//! `Idem::new(RedisStore)`, on servers the benchmark starts itself (no persistence):
//!
//! | variant | records and orders on |
//! |---|---|
//! | `one server` | one `redis-server` |
//! | `cluster, no replicas` | 3 masters without replicas (the cost of the cluster's routing and of the budget's calls beside the script, without replication) |
//! | `cluster` | 3 masters with a replica each; claims do not wait for the replica (`with_replica_wait(None)`) |
//! | `cluster+wait` | the same cluster; every claim waits for its replica (`ReplicaWait::DEFAULT`, what `connect` chooses there) |
//!
//! Patterns: `new key` (every request a new key, [`CLIENTS`] clients) and `replay` (every
//! request the same key, registered and completed before the first run). Each run is
//! `wrk -t2 -c32 -d5s`; rounds are interleaved (every variant once per round, the order
//! turning each round) and the table gives medians and each variant's ratio against one
//! server in the same round set. All the processes share the machine's two cores with
//! the service and wrk: the figures are ratios, not capacity. `IDEM_BENCH_ROUNDS`
//! (default 3) and `IDEM_BENCH_SECONDS` (default 5) change the rounds.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idem::store::{RedisStore, ReplicaWait};
use idem_runtime::store::conformance::redis::OwnCluster;

use idem_bench::stores::handlers::*;
use idem_bench::wrk::{self, median, wrk};

/// How many clients the new keys come from (`X-Client-Id`).
const CLIENTS: usize = 64;

/// The heartbeat lease of every handle: long enough that an attempt starved by the shared
/// cores does not answer 503 and stop the run.
const LEASE: Duration = Duration::from_secs(10);

/// A `redis-server` of the benchmark's own on a free port; killed when dropped.
struct OneServer {
    child: Child,
    url: String,
}

impl OneServer {
    fn start() -> OneServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server)");
        std::thread::sleep(Duration::from_millis(300));
        OneServer {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }
}

impl Drop for OneServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves the contracted handler with its records and orders on `url` (one server or a
/// cluster's seeds), claims waiting for replicas as `wait` says.
async fn served(url: &str, wait: Option<ReplicaWait>) -> String {
    let store = RedisStore::connect(url)
        .await
        .expect("the bench's own Redis")
        .with_replica_wait(wait);
    let business = RedisState {
        conn: store.connection().clone(),
        prefix: Arc::from("bench"),
    };
    let idem = idem::Idem::builder(store, idem::identity::header("x-client-id"))
        .heartbeat(LEASE)
        .build();
    serve(
        Router::new()
            .route("/orders", post(redis_idem))
            .with_state(business)
            .layer(idem.layer()),
    )
    .await
}

fn main() {
    let (rounds, seconds) = wrk::wrk_rounds();
    let one = OneServer::start();
    let (Some(bare), Some(cluster)) = (OwnCluster::start(3, 0), OwnCluster::start(3, 1)) else {
        eprintln!("the benchmark needs redis-server and redis-cli");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let variants: Vec<(&str, String)> = runtime.block_on(async {
        vec![
            ("one server", served(&one.url, None).await),
            ("cluster, no replicas", served(&bare.url(), None).await),
            ("cluster", served(&cluster.url(), None).await),
            (
                "cluster+wait",
                served(&cluster.url(), Some(ReplicaWait::DEFAULT)).await,
            ),
        ]
    });
    let dir = tempfile::tempdir().unwrap();
    let new_keys = dir.path().join("new.lua");
    let client = format!(r#""c-" .. (counter % {CLIENTS})"#);
    let script = wrk::orders_script(&client, r#""k-" .. run .. "-" .. tid .. "-" .. counter"#);
    std::fs::write(&new_keys, script).unwrap();
    let replay = dir.path().join("replay.lua");
    std::fs::write(
        &replay,
        wrk::orders_script(r#""replayer""#, r#""replayed""#),
    )
    .unwrap();
    // The replayed key is registered and completed before any run, on every variant.
    runtime.block_on(async {
        let http = reqwest::Client::new();
        for (_, url) in &variants {
            let answer = http
                .post(format!("{url}/orders"))
                .header("content-type", "application/json")
                .header("x-client-id", "replayer")
                .header("idempotency-key", "replayed")
                .body(BODY)
                .send()
                .await
                .expect("the service answers");
            assert!(answer.status().is_success(), "{answer:?}");
        }
    });
    let patterns = [("new key", &new_keys), ("replay", &replay)];
    // results[pattern][variant] = (rates, p99s)
    let mut results = vec![vec![(Vec::new(), Vec::new()); variants.len()]; patterns.len()];
    let mut run = 0;
    for round in 0..rounds {
        for (p, (pattern, script)) in patterns.iter().enumerate() {
            for i in 0..variants.len() {
                let v = (i + round) % variants.len();
                let (name, url) = &variants[v];
                run += 1;
                let (rps, p99) = wrk(url, script, seconds, 32, run);
                eprintln!(
                    "round {} {pattern} {name}: {rps:.0} req/s, p99 {p99:.2} ms",
                    round + 1
                );
                results[p][v].0.push(rps);
                results[p][v].1.push(p99);
            }
        }
    }
    print_table(&variants, &patterns, &mut results, rounds, seconds);
    drop(runtime);
}

fn print_table(
    variants: &[(&str, String)],
    patterns: &[(&str, &std::path::PathBuf)],
    results: &mut [Vec<(Vec<f64>, Vec<f64>)>],
    rounds: usize,
    seconds: u64,
) {
    println!(
        "\nPOST /orders on the Redis store, wrk 32 connections {seconds} s, {rounds} interleaved rounds, medians\n"
    );
    println!("| pattern | variant | req/s | of one server | p99 |");
    println!("|---|---|---|---|---|");
    for (p, (pattern, _)) in patterns.iter().enumerate() {
        let base = median(&mut results[p][0].0);
        for (v, (name, _)) in variants.iter().enumerate() {
            let rps = median(&mut results[p][v].0);
            let p99 = median(&mut results[p][v].1);
            println!(
                "| {pattern} | {name} | {rps:.0} | **{:.2}** | {p99:.2} ms |",
                rps / base
            );
        }
    }
}
