//! The child side: one variant served on `127.0.0.1`, in a process of its own so that its
//! resident memory is its own.
//!
//! The parent starts the bench binary again with [`SERVE_ENV`] set to a variant's name; the
//! child binds port 0, prints the port on a line of its stdout, and serves until its stdin
//! closes (the parent ended or dropped it) or it is killed.

use std::io::{Read, Write};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use ruts::store::Ttl;
use ruts::store::moka::MokaStore;
use ruts::{CookieOptions, Session, SessionLayer};
use serde::{Deserialize, Serialize};
use tower_cookies::CookieManagerLayer;

use crate::order::{self, CreateOrder, Orders};

/// The variable that turns the bench binary into a server of the variant it names.
pub const SERVE_ENV: &str = "IDEM_BENCH_SERVE";

/// The name of the session cookie of the `axum-idempotent` variant.
pub const SESSION_COOKIE: &str = "sid";

/// How long a completed key is kept, in every variant that keeps one: the contract's
/// `ttl = "24h"`.
const TTL_SECS: u32 = 86_400;

/// One of the three servers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The handler alone.
    Bare,
    /// The handler behind `axum_idempotent::IdempotentLayer`, in a `ruts` session.
    AxumIdempotent,
    /// The handler under `#[idem::contract(..)]` with `idem::MemoryStore`.
    Idem,
}

impl Variant {
    /// Every variant, in the order of the table's columns.
    pub const ALL: [Variant; 3] = [Variant::Bare, Variant::AxumIdempotent, Variant::Idem];

    /// The name used in [`SERVE_ENV`], `IDEM_BENCH_ONLY` and the table.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::AxumIdempotent => "axum-idempotent",
            Variant::Idem => "idem",
        }
    }

    /// The variant of that name.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name.trim())
    }

    /// The header a replayed answer carries, with the value `true`.
    #[must_use]
    pub const fn replay_header(self) -> Option<&'static str> {
        match self {
            Variant::Bare => None,
            Variant::AxumIdempotent => Some("idempotency-replayed"),
            Variant::Idem => Some(idem::headers::IDEMPOTENT_REPLAYED),
        }
    }
}

/// What `GET /stats` answers: counts and resident memory, read by the parent.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Orders in the handler's map.
    pub orders: usize,
    /// Records in idem's `MemoryStore` (0 in the other variants).
    pub records: usize,
    /// `VmRSS` of `/proc/self/status`, in kB (0 if unreadable).
    pub rss_kb: u64,
}

/// The process's resident set size in kB, as `/proc/self/status` gives it.
#[must_use]
pub fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A multi-threaded tokio runtime of 2 workers, as every server and driver of these
/// benchmarks runs on (one a core of the 2-core machines they are measured on).
///
/// # Panics
///
/// When the runtime cannot be built (no threads left).
#[must_use]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime with 2 workers")
}

/// The child's entry point: serves `variant` on a 2-worker runtime until stdin closes.
pub fn run(variant: Variant) {
    // The parent holds our stdin: its end (even a SIGKILL) is our end.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let runtime = runtime();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("a bound address").port();
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{port}")
            .and_then(|()| stdout.flush())
            .expect("stdout to the parent");
        axum::serve(listener, router(variant)).await.expect("serve");
    });
}

/// The routes of one variant: `POST /orders` and `GET /stats`, plus `POST /session` for
/// `axum-idempotent` and the status lookup for idem.
pub fn router(variant: Variant) -> Router {
    let orders = order::orders();
    match variant {
        Variant::Bare => Router::new()
            .route("/orders", post(bare))
            .with_state(Arc::clone(&orders))
            .merge(stats(orders, None)),
        Variant::AxumIdempotent => {
            // The crate's documented set-up: a direct key (the `Idempotency-Key` header,
            // required), the response kept in the caller's session for the TTL, the
            // session layer inside the cookie manager.
            let options = IdempotentOptions::default()
                .use_idempotency_key_header(Some("idempotency-key"), true)
                .expire_after(i64::from(TTL_SECS));
            let clients: u64 = std::env::var("IDEM_BENCH_CLIENTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            // `MokaStore` evicts whole sessions past its capacity (10,000 by default).
            let store = Arc::new(
                MokaStore::builder()
                    .max_capacity(clients.max(10_000) * 2)
                    .build(),
            );
            let cookie = CookieOptions::build()
                .name(SESSION_COOKIE)
                .path("/")
                .max_age(u64::from(TTL_SECS));
            Router::new()
                .route(
                    "/orders",
                    post(bare).layer(IdempotentLayer::<MokaStore>::new(options)),
                )
                .route("/session", post(open_session))
                .with_state(Arc::clone(&orders))
                .layer(SessionLayer::new(store).with_cookie_options(cookie))
                .layer(CookieManagerLayer::new())
                .merge(stats(orders, None))
        }
        Variant::Idem => {
            let store = Arc::new(idem::MemoryStore::new());
            // The default client budget (10,000 live keys) would refuse the one-scope path
            // within a second: a budget no run reaches, still counted.
            let idem =
                idem::Idem::builder(Arc::clone(&store), idem::identity::header("x-client-id"))
                    .client_budget(idem::store::ClientBudget::new(1 << 40, 1 << 50))
                    .build();
            Router::new()
                .route("/orders", post(contracted))
                .route("/o/{key}", get(lookup))
                .layer(idem.layer())
                .with_state(Arc::clone(&orders))
                .merge(stats(orders, Some(store)))
        }
    }
}

/// `GET /stats`, outside every other layer.
fn stats(orders: Orders, store: Option<Arc<idem::MemoryStore>>) -> Router {
    Router::new().route(
        "/stats",
        get(move || async move {
            Json(Stats {
                orders: orders.len(),
                records: store.as_ref().map_or(0, |s| s.len()),
                rss_kb: rss_kb(),
            })
        }),
    )
}

/// The bare handler (also the one behind `axum-idempotent`).
async fn bare(State(orders): State<Orders>, Json(body): Json<CreateOrder>) -> Response {
    order::create(&orders, body)
}

/// The same handler under the contract of `idem-bench/src/stores`.
#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
async fn contracted(State(orders): State<Orders>, Json(body): Json<CreateOrder>) -> Response {
    order::create(&orders, body)
}

/// The contract's status lookup.
async fn lookup(
    lookup: idem::Lookup<contracted::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// Opens a session for the caller, as an application's login would: `axum-idempotent`
/// caches only for a request that already carries one, and never creates one itself.
async fn open_session(session: Session<MokaStore>, headers: HeaderMap) -> Response {
    let client = headers
        .get("x-client-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    let Ok(ttl) = Ttl::new(i64::from(TTL_SECS)) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    match session.set("client", &client, ttl, None).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
