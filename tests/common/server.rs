//! A server on an ephemeral port of 127.0.0.1, served by `axum::serve`, and the requests
//! the tests send it.

use std::net::SocketAddr;

use axum::Router;
use reqwest::{Method, RequestBuilder};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The client identity (header `x-client-id`) of the requests that do not name another.
pub const CLIENT: &str = "client-a";

/// A server on an ephemeral port of 127.0.0.1, served by `axum::serve`, with a client to
/// call it.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The client of [`TestServer::request`] and its shorthands.
    pub http: reqwest::Client,
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
            http: client(),
            shutdown: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `method path` as client `client_id`, with `Idempotency-Key: key` when there is one.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        client_id: &str,
        key: Option<&str>,
    ) -> RequestBuilder {
        let request = self
            .http
            .request(method, self.url(path))
            .header("x-client-id", client_id);
        match key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    }

    /// `POST path` as [`CLIENT`], with `Idempotency-Key: key`.
    pub fn post(&self, path: &str, key: &str) -> RequestBuilder {
        self.request(Method::POST, path, CLIENT, Some(key))
    }

    /// `GET path` as [`CLIENT`], without a key: a status lookup.
    pub fn get(&self, path: &str) -> RequestBuilder {
        self.request(Method::GET, path, CLIENT, None)
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
