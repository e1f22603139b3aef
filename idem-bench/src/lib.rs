//! idem's benchmarks. `cargo bench -p idem-bench` runs one of them, [`figures`]: every
//! figure of the performance goals in one table (`-- --quick`: the harness at a tiny
//! scale, which `cargo test` runs too). The others run by name (`cargo bench -p idem-bench
//! --bench <name>`; the loopback ones need `wrk`: `apt-get install wrk`):
//!
//! | benchmark | what it measures |
//! |---|---|
//! | `overhead` | idem's cost against the same handler bare and behind `axum-idempotent`, memory included (below) |
//! | `paths` | the request path in process, no sockets (`benches/paths.rs`) |
//! | `stores` | each store under idem against the hand-written minimum on the same store ([`stores`]) |
//! | `alone` | the same new keys' store calls without the service: what the statements cost ([`alone`]) |
//! | `flat` | new keys as the store grows to millions of records, and during a purge ([`flat`]) |
//! | `budget` | the client budget's cost on a new key (`benches/budget.rs`) |
//! | `cluster` | the Redis store on a Redis Cluster against one server (`benches/cluster.rs`) |
//! | `build` | what contracts cost the build: the same handlers compiled bare and contracted ([`build`]) |
//!
//! # `overhead`
//!
//! What idem costs a handler, measured on loopback against the same handler bare and behind
//! the `axum-idempotent` crate.
//!
//! ## What runs
//!
//! One `POST /orders` handler body ([`order::create`]): parse
//! `{"customer_id": "...", "amount_minor": n}`, make an id (`ord_` and a UUID v7), insert
//! the order into an in-memory map sharded 64 ways (a `DashMap`, so that its growth never
//! stalls both workers), answer 201 with the order's JSON (about 150 bytes: id, customer,
//! amount, status, creation time) and `Location: /orders/<id>`. It is served three ways,
//! each in a **process of its own** (the bench binary started again with
//! `IDEM_BENCH_SERVE=<variant>`, a 2-worker tokio runtime on `127.0.0.1`), so that each
//! one's resident memory is its own:
//!
//! | variant | what a request does |
//! |---|---|
//! | `bare` | the handler alone |
//! | `axum-idempotent` | the handler behind `axum_idempotent::IdempotentLayer` 0.6.0, as its README sets it up: `use_idempotency_key_header(Some("idempotency-key"), true)` (the client's key is the cache key, nothing hashed, no fingerprint), `expire_after(24 h)`, inside a `ruts` `SessionLayer` on a `MokaStore` and tower-cookies' `CookieManagerLayer`. It keeps responses in the caller's session: a get, then the handler, then a set, with no claim while the handler runs. It caches only for a request that already carries a session and never opens one, so the server also has `POST /session`, which opens one as an application's login would |
//! | `idem` | the handler under the `#[idem::contract(..)]` of `idem-bench/src/stores` (client-scoped keys, fingerprint of both fields, 24 h TTL, deadlines, `concurrency = conflict`, a status lookup, manual recovery) with `idem::MemoryStore` and `idem::identity::header("x-client-id")` |
//!
//! Each server also answers `GET /stats` with `{"orders": n, "records": m, "rss_kb": k}`
//! (the orders in its map, idem's `MemoryStore::len()` or 0, its `VmRSS`).
//!
//! ## Clients and paths
//!
//! `IDEM_BENCH_CLIENTS` clients (1,000): idem knows client `i` by `X-Client-Id: client-<i>`,
//! `axum-idempotent` by the session the warm-up opened for it (`Cookie: sid=…`). Every
//! request carries both, so the three servers get byte-identical streams; the bare handler
//! reads neither. The warm-up then completes one key per client (`r-<i>`), checks that each
//! answers 201 and that the first one replays (`Idempotent-Replayed: true` from idem,
//! `idempotency-replayed: true` from `axum-idempotent`). Three paths, each a `wrk` Lua
//! script ([`load::Path`]), run with `wrk -t2 -c<connections> -d<seconds>s --latency`:
//!
//! 1. **new key**: every request a new `Idempotency-Key`, the clients in turn;
//! 2. **replay of a completed key**: every request one of the warm-up's (client, key) pairs,
//!    the clients in turn; the bare handler, which has no keys, runs on the same stream
//!    (a new order each time) and is what the ratio is to. The run checks that no replay
//!    reached the handler (the order count does not move);
//! 3. **all keys of one client (1 scope)**: new keys, all from client 0 (one session).
//!
//! Rounds are interleaved (each round runs every path on every variant) and the table gives
//! medians: requests per second, the ratio to bare, p99 latency. A non-2xx answer under load
//! fails the run with wrk's output. The load generator shares the 2 cores with the server,
//! so read ratios, not capacity.
//!
//! ## Memory
//!
//! After the rounds, from each server's `/stats` before any load and at the end: resident
//! memory, completed keys (idem's records; the orders of the other two: bare keeps only
//! orders, `axum-idempotent` caches every order's answer), and
//!
//! - **per completed key** = RSS growth / completed keys;
//! - **beyond the stored body** = (RSS growth − bare's RSS growth per order × the variant's
//!   orders) / completed keys − the stored body, where the stored body is the 201's body
//!   and its `Location` header (name and value) in bytes: what a key costs beyond its order
//!   and beyond the bytes any replay must give back. The goal for idem is ≤ 0.5 KB.
//!
//! RSS moves in steps (a map doubling, the allocator keeping freed pages), so these are
//! figures for a long run (millions of keys), not for a short one.
//!
//! ## Knobs
//!
//! | variable | default | what |
//! |---|---|---|
//! | `IDEM_BENCH_ROUNDS` | 5 | interleaved rounds |
//! | `IDEM_BENCH_SECONDS` | 10 | length of one wrk run (`-d`) |
//! | `IDEM_BENCH_CONNECTIONS` | 32 | wrk's `-c` (always `-t2`) |
//! | `IDEM_BENCH_CLIENTS` | 1000 | client identities (and sessions) |
//! | `IDEM_BENCH_ONLY` | all | comma-separated variants to run (`bare`, `axum-idempotent`, `idem`), e.g. one for a profile; ratios need `bare` |
//!
//! Each server's pid is printed when it starts (`perf record -p <pid>` attaches to it);
//! the printout ends with the command, the start time, `uptime` before and after, and the
//! pids. The servers are killed when the run ends or fails; a server also exits when its
//! stdin (held by the parent) closes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod alone;
pub mod build;
pub mod children;
pub mod cpu;
pub mod driver;
pub mod figures;
pub mod flat;
pub mod load;
pub mod order;
pub mod report;
pub mod serve;
pub mod stores;
pub mod wrk;

/// The bench binary's `main`: a server when `IDEM_BENCH_SERVE` names a variant, otherwise
/// the driver.
///
/// # Panics
///
/// When `IDEM_BENCH_SERVE` names no variant, and as [`driver::run`] does.
pub fn main() {
    match std::env::var(serve::SERVE_ENV) {
        Ok(name) => serve::run(serve::Variant::from_name(&name).unwrap_or_else(|| {
            panic!(
                "{}={name:?}: expected bare, axum-idempotent or idem",
                serve::SERVE_ENV
            )
        })),
        Err(_) => driver::run(),
    }
}
