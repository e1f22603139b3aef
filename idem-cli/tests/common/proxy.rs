//! A loopback TCP proxy between the `idem` command and a store's server that fails on
//! cue: it forwards bytes both ways until a chosen pattern passes in a chosen direction,
//! then either goes silent (a partition: every connection stays open and nothing more
//! is delivered, until [`Proxy::heal`] delivers what it held) or drops every connection
//! and refuses new ones (a server that went away).
//!
//! The cue is one-shot and global: whichever connection carries the pattern, every
//! connection is partitioned or dropped, as a network would be.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The direction bytes travel in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the command to the server: requests.
    FromClient,
    /// From the server to the command: answers.
    FromServer,
}

/// What the proxy does once the pattern passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Hold the chunk that carries the pattern and everything after it, both ways.
    Hold,
    /// Close every connection without delivering the chunk, and refuse new ones.
    Drop,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    partitioned: bool,
    dropped: bool,
}

struct Shared {
    upstream: SocketAddr,
    cue: Mutex<Option<(Dir, &'static [u8], Fault)>>,
    state: watch::Sender<State>,
}

impl Shared {
    /// Applies the cue if `seen` (bytes travelling `dir`) carries its pattern.
    fn check(&self, dir: Dir, seen: &[u8]) {
        let mut cue = self.cue.lock().unwrap();
        let Some((on, pattern, fault)) = *cue else {
            return;
        };
        if on != dir || !seen.windows(pattern.len()).any(|w| w == pattern) {
            return;
        }
        *cue = None;
        self.state.send_modify(|s| match fault {
            Fault::Hold => s.partitioned = true,
            Fault::Drop => s.dropped = true,
        });
    }
}

/// The running proxy; it drops every connection when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            cue: Mutex::new(None),
            state: watch::channel(State::default()).0,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Proxy {
            addr,
            shared,
            accept,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From the chunk that carries `pattern` travelling `dir` on (that chunk included),
    /// nothing more is delivered either way, and connections stay open.
    pub fn hold_from(&self, dir: Dir, pattern: &'static [u8]) {
        *self.shared.cue.lock().unwrap() = Some((dir, pattern, Fault::Hold));
    }

    /// At the chunk that carries `pattern` travelling `dir` (not delivered), every
    /// connection is closed and new ones are refused.
    pub fn drop_at(&self, dir: Dir, pattern: &'static [u8]) {
        *self.shared.cue.lock().unwrap() = Some((dir, pattern, Fault::Drop));
    }

    /// Ends a partition: what was held is delivered, and forwarding goes on.
    pub fn heal(&self) {
        *self.shared.cue.lock().unwrap() = None;
        self.shared.state.send_modify(|s| s.partitioned = false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.state.send_modify(|s| s.dropped = true);
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = state.wait_for(|s| s.dropped) => return,
        };
        let Ok((client, _)) = accepted else { continue };
        let Ok(server) = TcpStream::connect(shared.upstream).await else {
            continue;
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let up = Arc::clone(&shared);
        tokio::spawn(pump(client_read, server_write, Dir::FromClient, up));
        let down = Arc::clone(&shared);
        tokio::spawn(pump(server_read, client_write, Dir::FromServer, down));
    }
}

/// Forwards `from` to `to`, chunk by chunk, as the cue and the state allow.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, dir: Dir, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    let mut buf = vec![0; 64 * 1024];
    // The end of the bytes before, so that a pattern split between two chunks is seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = state.wait_for(|s| s.dropped) => return,
        };
        tail.extend_from_slice(&buf[..n]);
        shared.check(dir, &tail);
        tail.drain(..tail.len().saturating_sub(256));
        let deliver = state
            .wait_for(|s| !s.partitioned || s.dropped)
            .await
            .map(|s| !s.dropped)
            .unwrap_or(false);
        if !deliver || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}
