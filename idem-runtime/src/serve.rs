//! [`serve`]: `axum::serve` with a bound on connections whose request head trickles in.
//!
//! `axum::serve` gives hyper no timer, so hyper's header read timeout never fires: a
//! connection that sends its headers a byte every second stays open for as long as the
//! sender likes, and thousands of them cost the sender nothing. [`serve`] serves the same
//! router through hyper's HTTP/1.1 connection builder with a timer, so that a connection
//! whose request head has not arrived within [`Serve::header_read_timeout`] (10 s unless
//! set) is closed. The body is bounded elsewhere: a contracted handler reads it within
//! the contract's time for one attempt, or answers 408 `request-timeout`.
//!
//! HTTP/1.1 only: a service that takes HTTP/2 in clear text (prior knowledge, from a proxy
//! that speaks it to its upstreams) serves it with `axum::serve` and axum's `http2`
//! feature. idem does not turn HTTP/2 on itself: Cargo unifies features, so a dependency
//! that enabled hyper's HTTP/2 would make every `axum::serve` of the service answer it,
//! and add the HTTP/2 stack (≈ 1 MB of a release binary) to services that never use it.
//!
//! ```no_run
//! # async fn run(app: axum::Router) -> std::io::Result<()> {
//! use std::time::Duration;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! idem_runtime::serve(listener, app)
//!     .header_read_timeout(Duration::from_secs(10))
//!     .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
//!     .await
//! # }
//! ```
//!
//! Not supported: HTTP/2, HTTP upgrades (WebSocket) and `ConnectInfo`; serve those routes
//! with `axum::serve`.

use std::future::{Future, IntoFuture};
use std::io;
use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};

/// A signal that ends [`Serve`]: no new connection is taken once it completes.
type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves `router` on `listener`, as `axum::serve` does, closing connections whose
/// request head has not arrived within [`Serve::header_read_timeout`] (10 s unless set).
/// Await the returned [`Serve`] to run it. `axum::serve` gives hyper no timer, so its
/// header read timeout never fires there; the body is bounded by each contract (408
/// `request-timeout`). HTTP/1.1 only; not supported: HTTP/2, HTTP upgrades (WebSocket) and
/// `ConnectInfo`.
///
/// ```no_run
/// # async fn run(app: axum::Router) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// idem_runtime::serve(listener, app)
///     .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
///     .await
/// # }
/// ```
pub fn serve(listener: TcpListener, router: Router) -> Serve {
    Serve {
        listener,
        router,
        header_read_timeout: Serve::DEFAULT_HEADER_READ_TIMEOUT,
        signal: None,
    }
}

/// A server of [`serve`], to set up and then await.
///
/// # Errors
///
/// Awaiting it fails only when the listener's address cannot be read; a failed
/// `accept` (too many open files, a connection reset before it was taken) is logged and
/// the server goes on.
#[must_use = "a server does nothing until it is awaited"]
pub struct Serve {
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    signal: Option<Signal>,
}

impl Serve {
    /// The time a connection has to send a request's head unless
    /// [`Serve::header_read_timeout`] says otherwise: 10 seconds, ample for any client
    /// on a working network.
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// Closes an HTTP/1.1 connection whose request head (the request line and every
    /// header) has not arrived within `timeout`, counted from when the server starts
    /// reading it.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Serve {
        self.header_read_timeout = timeout;
        self
    }

    /// Stops taking connections once `signal` completes, lets the open ones finish the
    /// requests they are serving, and then ends.
    pub fn with_graceful_shutdown(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Serve {
        self.signal = Some(Box::pin(signal));
        self
    }

    async fn run(self) -> io::Result<()> {
        self.listener.local_addr()?;
        let mut builder = Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        let graceful = GracefulShutdown::new();
        let mut signal = self
            .signal
            .unwrap_or_else(|| Box::pin(std::future::pending()));
        loop {
            let stream = tokio::select! {
                accepted = accept(&self.listener) => accepted,
                () = &mut signal => break,
            };
            let service = TowerToHyperService::new(self.router.clone());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(error = %error, "idem: a connection ended with an error");
                }
            });
        }
        drop(self.listener);
        graceful.shutdown().await;
        Ok(())
    }
}

impl IntoFuture for Serve {
    type Output = io::Result<()>;
    type IntoFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// The next connection. A failed `accept` is logged and retried: one that was reset
/// at once, and after a pause one that failed for want of file descriptors or memory
/// (as `axum::serve` does).
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => return stream,
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                tracing::error!(error = %error, "idem: accepting a connection failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn started(
        timeout: Duration,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve(listener, router)
            .header_read_timeout(timeout)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
        tokio::spawn(server.into_future());
        (addr, stop)
    }

    /// A request head sent a byte every 100 ms: the connection is closed when its
    /// 500 ms are up, not when the sender is done.
    #[tokio::test]
    async fn a_trickled_request_head_is_cut_off() {
        let (addr, _stop) = started(Duration::from_millis(500)).await;
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut reader, mut writer) = stream.into_split();
        let started = Instant::now();
        let trickle = tokio::spawn(async move {
            for byte in b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
                if writer.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut answer));
        read.await
            .expect("closed within 5 s, before the head's 7 s")
            .unwrap_or(0);
        trickle.abort();
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
        assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// A prompt request is served, and the server ends on its signal.
    #[tokio::test]
    async fn a_prompt_request_is_served() {
        let (addr, stop) = started(Duration::from_millis(500)).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
            "{text}"
        );
        stop.send(()).unwrap();
    }
}
