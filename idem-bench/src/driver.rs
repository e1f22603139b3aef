//! The parent: the knobs, the servers, the warm-up, the interleaved rounds.

use std::path::PathBuf;
use std::process::Command;
use std::time::SystemTime;

use axum::http::header;

use crate::children::{Server, Servers};
use crate::load::{BODY, Path};
use crate::report::{Measures, Report};
use crate::serve::{SESSION_COOKIE, Stats, Variant};
use crate::wrk::wrk;

/// The run's settings, from the environment (see the crate's documentation).
#[derive(Clone, Debug)]
pub struct Knobs {
    /// `IDEM_BENCH_ROUNDS`, default 5.
    pub rounds: usize,
    /// `IDEM_BENCH_SECONDS`, default 10: the length of one wrk run.
    pub seconds: u64,
    /// `IDEM_BENCH_CONNECTIONS`, default 32: wrk's `-c`.
    pub connections: usize,
    /// `IDEM_BENCH_CLIENTS`, default 1000: client identities (and sessions).
    pub clients: usize,
    /// `IDEM_BENCH_ONLY`, default all: the variants served and measured.
    pub variants: Vec<Variant>,
}

impl Knobs {
    /// Reads the knobs.
    ///
    /// # Panics
    ///
    /// On a value that is not a number, a number that is 0, or an unknown variant name.
    #[must_use]
    pub fn from_env() -> Knobs {
        let variants = match std::env::var("IDEM_BENCH_ONLY") {
            Ok(only) => only
                .split(',')
                .filter(|name| !name.trim().is_empty())
                .map(|name| {
                    Variant::from_name(name).unwrap_or_else(|| {
                        panic!("IDEM_BENCH_ONLY: unknown variant {name:?} (bare, axum-idempotent, idem)")
                    })
                })
                .collect(),
            Err(_) => Variant::ALL.to_vec(),
        };
        Knobs {
            rounds: positive("IDEM_BENCH_ROUNDS", 5),
            seconds: positive("IDEM_BENCH_SECONDS", 10),
            connections: positive("IDEM_BENCH_CONNECTIONS", 32),
            clients: positive("IDEM_BENCH_CLIENTS", 1000),
            variants,
        }
    }
}

fn positive<T: std::str::FromStr + PartialEq + From<u8>>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Err(_) => default,
        Ok(value) => match value.trim().parse::<T>() {
            Ok(n) if n != T::from(0) => n,
            _ => panic!("{name}={value:?}: expected a positive whole number"),
        },
    }
}

/// The bench binary's parent side: runs everything and prints the table.
///
/// # Panics
///
/// When wrk is missing, a server fails to start or to answer the warm-up as expected, a
/// variant answers anything but 2xx under load, or a replay reaches the handler.
pub fn run() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("the benchmark needs wrk on the PATH (apt-get install wrk)");
        std::process::exit(2);
    }
    let knobs = Knobs::from_env();
    let started = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let load_before = load();
    let servers = Servers::start(&knobs.variants, knobs.clients);
    for server in &servers.0 {
        eprintln!(
            "{} server: pid {} at {} (perf record -p {})",
            server.variant.name(),
            server.pid,
            server.url,
            server.pid
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the warm-up");
    let http = reqwest::Client::new();
    let start: Vec<Stats> = servers
        .0
        .iter()
        .map(|s| runtime.block_on(stats(&http, s)))
        .collect();
    let cookies = runtime.block_on(sessions(&http, &servers, knobs.clients));
    let mut stored_bytes = 0;
    for server in &servers.0 {
        stored_bytes = runtime.block_on(warm_up(&http, server, &cookies));
    }

    let dir = tempfile::tempdir().expect("a temporary directory for the Lua scripts");
    let scripts: Vec<PathBuf> = Path::ALL
        .iter()
        .map(|path| {
            let file = dir.path().join(format!("{}.lua", path.short()));
            std::fs::write(&file, path.script(&cookies)).expect("the Lua script is written");
            file
        })
        .collect();
    let mut measures = Measures::default();
    for round in 0..knobs.rounds {
        for (p, &path) in Path::ALL.iter().enumerate() {
            for (v, server) in servers.0.iter().enumerate() {
                let run = round * 100 + p * 10 + v;
                let checks_replay = path == Path::Replay && server.variant != Variant::Bare;
                let before = checks_replay.then(|| runtime.block_on(stats(&http, server)));
                let (rps, p99) = wrk(
                    &server.url,
                    &scripts[p],
                    knobs.seconds,
                    knobs.connections,
                    run,
                );
                eprintln!(
                    "round {}/{} {} {}: {rps:.0} req/s, p99 {p99:.2} ms",
                    round + 1,
                    knobs.rounds,
                    path.short(),
                    server.variant.name()
                );
                if let Some(before) = before {
                    let after = runtime.block_on(stats(&http, server));
                    assert_eq!(
                        after.orders,
                        before.orders,
                        "{}: a replay reached the handler ({} new orders)",
                        server.variant.name(),
                        after.orders.saturating_sub(before.orders)
                    );
                }
                measures.push(path, server.variant, rps, p99);
            }
        }
    }
    let end: Vec<Stats> = servers
        .0
        .iter()
        .map(|s| runtime.block_on(stats(&http, s)))
        .collect();
    let load_after = load();
    Report {
        knobs: &knobs,
        command: command(),
        started,
        load_before,
        load_after,
        servers: servers.0.iter().map(|s| (s.variant, s.pid)).collect(),
        measures,
        start,
        end,
        stored_bytes,
    }
    .print();
    drop(servers);
}

/// `GET /stats` of one server.
async fn stats(http: &reqwest::Client, server: &Server) -> Stats {
    let answer = http
        .get(format!("{}/stats", server.url))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET /stats of {}: {e}", server.variant.name()));
    let body = answer.bytes().await.unwrap_or_default();
    serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "GET /stats of {}: {e} in {:?}",
            server.variant.name(),
            String::from_utf8_lossy(&body)
        )
    })
}

/// One `Cookie` value per client: a session that `axum-idempotent`'s server opened for it,
/// or, when that variant is not run, a stand-in of the same length (the other variants
/// ignore it).
async fn sessions(http: &reqwest::Client, servers: &Servers, clients: usize) -> Vec<String> {
    let Some(server) = servers
        .0
        .iter()
        .find(|s| s.variant == Variant::AxumIdempotent)
    else {
        return (0..clients)
            .map(|i| format!("{SESSION_COOKIE}={i:0>22}"))
            .collect();
    };
    let mut cookies = Vec::with_capacity(clients);
    for i in 0..clients {
        let answer = http
            .post(format!("{}/session", server.url))
            .header("x-client-id", format!("client-{i}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /session: {e}"));
        let prefix = format!("{SESSION_COOKIE}=");
        let cookie = answer
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&prefix))
            .and_then(|v| v.split(';').next())
            .unwrap_or_else(|| {
                panic!(
                    "POST /session answered {} without a {SESSION_COOKIE} cookie",
                    answer.status()
                )
            });
        cookies.push(cookie.to_owned());
    }
    cookies
}

/// Completes the replay path's keys on one server (`r-<i>` for client `i`, each answered
/// 201), checks that the first one replays (with the variant's replay header), and gives
/// the bytes a replay must give back beyond the status: the 201's body and its
/// `Location` header (name and value).
async fn warm_up(http: &reqwest::Client, server: &Server, cookies: &[String]) -> usize {
    let name = server.variant.name();
    let post = |i: usize| {
        http.post(format!("{}/orders", server.url))
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-client-id", format!("client-{i}"))
            .header(header::COOKIE, &cookies[i])
            .header("idempotency-key", format!("r-{i}"))
            .body(BODY)
            .send()
    };
    let mut stored = 0;
    for i in 0..cookies.len() {
        let answer = post(i)
            .await
            .unwrap_or_else(|e| panic!("warm-up of {name}: {e}"));
        let status = answer.status();
        let location = answer
            .headers()
            .get(header::LOCATION)
            .map_or(0, |v| v.len());
        let body = answer.bytes().await.unwrap_or_default();
        assert_eq!(
            status.as_u16(),
            201,
            "warm-up of {name}: {:?}",
            String::from_utf8_lossy(&body)
        );
        stored = body.len() + "location".len() + location;
    }
    let again = post(0)
        .await
        .unwrap_or_else(|e| panic!("warm-up replay of {name}: {e}"));
    assert_eq!(again.status().as_u16(), 201, "warm-up replay of {name}");
    if let Some(replayed) = server.variant.replay_header() {
        assert_eq!(
            again.headers().get(replayed).and_then(|v| v.to_str().ok()),
            Some("true"),
            "{name} replays a completed key with `{replayed}: true`"
        );
    }
    stored
}

/// The load averages, as `uptime` prints them (or `/proc/loadavg`).
fn load() -> String {
    Command::new("uptime")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/loadavg").ok())
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// The command that reproduces this run, with the knobs that were set.
fn command() -> String {
    let mut set: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("IDEM_BENCH_") && name != crate::serve::SERVE_ENV)
        .map(|(name, value)| format!("{name}={value:?}"))
        .collect();
    set.sort();
    set.push("cargo bench -p idem-bench --bench overhead".to_owned());
    set.join(" ")
}
