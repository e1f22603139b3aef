//! A partition between one instance and PostgreSQL while it holds an open transaction:
//! two `orders --store postgres` processes on one database, the first reaching it through
//! a loopback proxy that stops forwarding for 25 s (its sockets stay open, nothing passes
//! either way) while its attempt's transaction holds an uncommitted order. The same key
//! sent to the second instance succeeds within the contract's per-attempt timeout (10 s)
//! and 5 s, with one order; the first instance answers its own request long before the
//! partition ends, and once it does the key replays there.
//!
//! What bounds it: the first attempt's record is in its transaction, and the key's
//! advisory lock with it, so the second instance answers the key with the contract's
//! concurrency answer (409) until the server ends the silent session at the attempt's
//! `idle_in_transaction_session_timeout` (its time left and a grace); the transaction
//! then rolls back, the lock is let go, and the retry runs. The cut-off instance gives its
//! commit up at its deadline and answers after one more bounded call. Measured on a
//! 2-core machine: the key succeeds 11.2 s after the partition began, and the cut-off
//! instance answers 503 after 13.0 s (11.0 s and 13.0 s when the key's record was
//! committed on its own before the transaction and taken over by lease); without these
//! bounds the key was held for the whole partition.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Reply, Service, order, try_post};
use idem_runtime::store::conformance::postgres::scratch_url;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The contract's per-attempt timeout (`deadline = ("30s", per_attempt = "10s")`).
const PER_ATTEMPT: Duration = Duration::from_secs(10);

/// How long the first instance stays cut off from the database: longer than every bound
/// the test asserts while it lasts (the key free again within the per-attempt timeout
/// and 5 s, the cut-off instance's own answer within it and 10 s).
const PARTITION: Duration = Duration::from_secs(25);

/// How long the first instance's handler holds its transaction open after its insert
/// (`--delay`): the partition starts meanwhile.
const DELAY: &str = "3s";

/// A loopback TCP proxy to `upstream` that can be told to stop forwarding: while it is
/// partitioned, every connection stays open and nothing passes either way (what was read
/// waits, a close included), and a new connection is accepted but not passed on.
struct Proxy {
    /// `127.0.0.1:<port>`, where it listens.
    addr: std::net::SocketAddr,
    open: watch::Sender<bool>,
    /// The local ports of its connections to `upstream` (`client_port` in
    /// `pg_stat_activity`).
    ports: Arc<Mutex<Vec<i32>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, passing) = watch::channel(true);
        let ports: Arc<Mutex<Vec<i32>>> = Arc::default();
        let seen = ports.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (mut passing, seen, upstream) =
                    (passing.clone(), seen.clone(), upstream.clone());
                tokio::spawn(async move {
                    if passing.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    if let Ok(local) = server.local_addr() {
                        seen.lock().unwrap().push(i32::from(local.port()));
                    }
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, passing.clone()),
                        pump(server_read, client_write, passing),
                    );
                });
            }
        });
        Proxy {
            addr,
            open,
            ports,
            accepting,
        }
    }

    /// Stops forwarding now, and forwards again (what was held first) after `length`:
    /// when the partition began, and the task that ends it.
    fn partition(self: &Arc<Self>, length: Duration) -> (Instant, tokio::task::JoinHandle<()>) {
        self.open.send_replace(false);
        let began = Instant::now();
        let proxy = Arc::clone(self);
        let healed = tokio::spawn(async move {
            tokio::time::sleep_until((began + length).into()).await;
            proxy.open.send_replace(true);
        });
        (began, healed)
    }

    fn ports(&self) -> Vec<i32> {
        self.ports.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to` while `passing` says the proxy forwards; then closes `to`.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut passing: watch::Receiver<bool>) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        if passing.wait_for(|open| *open).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if passing.wait_for(|open| *open).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// `url` with its host and port made the proxy's; and the server's `host:port`.
fn through_proxy(url: &str, proxy: std::net::SocketAddr) -> String {
    let mut url = reqwest::Url::parse(url).unwrap();
    url.set_host(Some(&proxy.ip().to_string())).unwrap();
    url.set_port(Some(proxy.port())).unwrap();
    url.to_string()
}

fn server_of(url: &str) -> String {
    let url = reqwest::Url::parse(url).unwrap();
    let host = url.host_str().unwrap_or("127.0.0.1");
    format!("{host}:{}", url.port().unwrap_or(5432))
}

/// Waits (at most 10 s) until a session of the proxy's holds the order's insert in an
/// open transaction.
async fn wait_for_open_insert(admin: &sqlx::PgPool, proxy: &Proxy) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE client_port = ANY($1) AND state = 'idle in transaction'
               AND query LIKE 'INSERT INTO orders%'",
        )
        .bind(proxy.ports())
        .fetch_one(admin)
        .await
        .unwrap();
        if held > 0 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the first instance never held its insert open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `key` to `url` until it is created, as a client would: after a 409 (the key is
/// held) or a 503 (retryable) it waits as `Retry-After` says, at most half a second.
/// The answer, or the last error, once `until` is past.
async fn until_created(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    until: Instant,
) -> Result<Reply, String> {
    let mut last = String::new();
    while Instant::now() < until {
        match try_post(http, url, Some(key), &order(4200)).await {
            Ok(reply) if reply.status == StatusCode::CREATED => return Ok(reply),
            Ok(reply) => {
                assert!(
                    [StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE].contains(&reply.status),
                    "{key}: {reply:?}"
                );
                last = format!("{} {}", reply.status, reply.problem_type());
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// The cut-off instance answered its own request (or closed it) within its attempt's
/// time, one bounded call of its store (5 s) and 5 s, not at the end of the partition;
/// not with the order, since its commit cannot have reached the server.
async fn first_answered_in_time(
    first: tokio::task::JoinHandle<(Result<Reply, reqwest::Error>, Instant)>,
    partitioned: Instant,
) {
    let bound = PER_ATTEMPT + Duration::from_secs(10);
    let (answer, ended) = tokio::time::timeout_at((partitioned + bound).into(), first)
        .await
        .unwrap_or_else(|_| panic!("the cut-off instance did not answer within {bound:?}"))
        .unwrap();
    let took = ended.saturating_duration_since(partitioned);
    eprintln!("the cut-off instance answered {took:?} after the partition began: {answer:?}");
    if let Ok(reply) = &answer {
        assert_ne!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
}

async fn orders_of(admin: &sqlx::PgPool, key: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM orders WHERE client_id = 'acme' AND idempotency_key = $1")
        .bind(key)
        .fetch_all(admin)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_holding_a_transaction_blocks_the_key_no_longer_than_its_attempt() {
    let what = "a partition between an orders instance and PostgreSQL";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let started = Instant::now();
    let proxy = Arc::new(Proxy::start(server_of(&url)).await);
    let cut_off = Service::spawn(
        &["--store", "postgres", "--delay", DELAY],
        &[("DATABASE_URL", &through_proxy(&url, proxy.addr))],
    );
    let other = Service::postgres(&url, &[]);
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    // Longer than the partition: every answer, and every close, is the service's.
    let http = reqwest::Client::builder()
        .timeout(PARTITION + Duration::from_secs(20))
        .retry(reqwest::retry::never())
        .build()
        .unwrap();
    let key = "k-partition";

    // The first instance writes the order in its transaction and holds it (`--delay`).
    let first = {
        let (http, url) = (http.clone(), cut_off.url.clone());
        tokio::spawn(async move {
            let answer = try_post(&http, &url, Some(key), &order(4200)).await;
            (answer, Instant::now())
        })
    };
    wait_for_open_insert(&admin, &proxy).await;
    let (partitioned, healed) = proxy.partition(PARTITION);

    // The same key on the other instance, retried as a client would.
    let created = until_created(
        &http,
        &other.url,
        key,
        partitioned + Duration::from_secs(30),
    )
    .await;
    let blocked = partitioned.elapsed();
    eprintln!("the key was blocked {blocked:?} after the partition began");
    let created = created.unwrap_or_else(|last| panic!("{key} never succeeded: {last}"));
    assert!(
        blocked <= PER_ATTEMPT + Duration::from_secs(5),
        "the key was blocked {blocked:?}, more than the per-attempt timeout and 5 s"
    );
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        orders_of(&admin, key).await,
        std::slice::from_ref(&id),
        "one order"
    );

    first_answered_in_time(first, partitioned).await;

    // The partition ends: nothing the cut-off instance held back makes a second order,
    // and the key replays there once it reaches the server again.
    healed.await.unwrap();
    let replay = until_created(
        &http,
        &cut_off.url,
        key,
        Instant::now() + Duration::from_secs(15),
    )
    .await
    .unwrap_or_else(|last| panic!("{key} never replayed on the healed instance: {last}"));
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.json()["id"], id.as_str());
    assert_eq!(orders_of(&admin, key).await, [id], "still one order");
    eprintln!("the test took {:?}", started.elapsed());
}
