//! Helpers of the enforcement tests: a real server on 127.0.0.1, a client, a store that
//! counts (and can refuse) calls.
#![allow(dead_code)]

/// A store that fails any of its calls on demand (the hostile tests).
pub mod faults;
/// HTTP/1.1 written byte for byte on a socket (the hostile tests).
pub mod raw;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use axum::Router;
use idem::store::{
    Begin, Lease, MemoryStore, NewRecord, OwnerToken, Record, RecordKey, Store, StoreError,
    StoredResponse, UnixMillis,
};
use reqwest::header::HeaderMap;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server on an ephemeral port of 127.0.0.1, served by `axum::serve`.
pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    pub async fn start(app: Router) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .expect("serve");
        });
        TestServer {
            addr,
            shutdown: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops accepting, finishes the requests in flight, and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// A client that never uses a proxy and times out after 10 s.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap()
}

/// An answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub async fn read(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("read the body").to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn operation_id(&self) -> &str {
        self.header("operation-id")
            .expect("every answer carries Operation-Id")
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts a problem answer of `slug` with `status`, and returns its body.
    pub fn problem(&self, status: u16, slug: &str) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let body = self.json();
        assert_eq!(body["type"], format!("tag:idem.rs,2026:problem:{slug}"));
        assert_eq!(body["status"], status);
        assert!(body["title"].is_string() && body["detail"].is_string());
        body
    }
}

/// Sends a request and reads the answer.
pub async fn send(request: reqwest::RequestBuilder) -> Answer {
    Answer::read(request.send().await.expect("send the request")).await
}

/// A store that counts calls, and refuses `begin` while `fail_begin` is set.
#[derive(Clone, Default)]
pub struct CountingStore {
    pub inner: Arc<MemoryStore>,
    pub calls: Arc<AtomicUsize>,
    pub fail_begin: Arc<AtomicBool>,
}

impl CountingStore {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        self.count();
        if self.fail_begin.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(
                "injected failure: the store is down",
            ));
        }
        self.inner.begin(key, new, now).await
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        self.count();
        self.inner.get(key, now).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.count();
        self.inner.complete(key, token, response, now).await
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.count();
        self.inner.release(key, token, now).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.count();
        self.inner.renew(key, token, until, now).await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.count();
        self.inner.park_unknown(key, token, reason, now).await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        self.count();
        self.inner.take_over(key, expected, new_lease, now).await
    }

    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        self.count();
        self.inner.purge_expired(now).await
    }
}
