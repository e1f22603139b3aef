//! A loopback HTTP/1.1 proxy that loses the first answer: it forwards each request to the
//! service, reads the service's whole answer, and for the first one closes the client's
//! connection without writing a byte, as a network that fails after the server committed.
//!
//! One request per connection, both ways (`connection: close` is written into the
//! forwarded request and the returned answer). Bodies are framed by `Content-Length`
//! (an answer without one is read until the service closes); chunked bodies are refused.
//! Everything is bounded: 1 MiB per message, 64 KiB per header block, a timeout on every
//! read and write, and a limit on connections served at once. Bad input gets a 400 (or
//! 502 when the service's answer is bad), never a panic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// The largest request or answer, header block and body together: 1 MiB.
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// The largest header block (the start line and the headers): 64 KiB.
pub const MAX_HEAD: usize = 64 * 1024;
/// How long one read of a whole message, or one write, may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How many client connections are served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;

/// What the proxy did with one request it forwarded.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// The request's method and target, such as `POST /orders`.
    pub request: String,
    /// The service's status line without the version, such as `201 Created`.
    pub answer: String,
    /// The answer's `Operation-Id`, if any.
    pub operation_id: Option<String>,
    /// Whether the answer said `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// Whether the answer was written back to the client (false: it was lost on purpose,
    /// or the client had gone).
    pub delivered: bool,
    /// The answer's status code (0 when its status line cannot be read).
    pub status: u16,
    /// The answer's body.
    pub body: Vec<u8>,
    /// The answer's headers whose values are text, name and value, in order (a harness
    /// reads another correlation header than `Operation-Id`, and the cookies the service
    /// set, from them).
    pub headers: Vec<(String, String)>,
}

/// The running proxy; it stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Exchange>>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`, losing the first answer.
    ///
    /// # Errors
    ///
    /// The listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(Shared {
            upstream,
            answered: AtomicU32::new(0),
            log: Arc::clone(&log),
        });
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(Proxy { addr, log, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests forwarded so far, in the order their answers arrived.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    upstream: SocketAddr,
    /// The answers read from the service so far: the first one is lost.
    answered: AtomicU32,
    log: Arc<Mutex<Vec<Exchange>>>,
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((client, _)) => {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    serve(client, &shared).await;
                    drop(permit);
                });
            }
            // Out of file descriptors, say: wait a little rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Serves one client connection: one request, then the connection is closed.
async fn serve(mut client: TcpStream, shared: &Shared) {
    let request = match timeout(IO_TIMEOUT, read_message(&mut client, Kind::Request)).await {
        Ok(Ok(request)) => request,
        Ok(Err(error)) => {
            tracing::debug!("idem-test proxy: refused a request: {error}");
            return refuse(client, error.status()).await;
        }
        Err(_) => return refuse(client, 408).await,
    };
    let answer = match timeout(2 * IO_TIMEOUT, forward(&request, shared.upstream)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => {
            tracing::debug!("idem-test proxy: no answer from the service: {error}");
            return refuse(client, 502).await;
        }
        Err(_) => {
            tracing::debug!(
                "idem-test proxy: no answer from the service within {:?}",
                2 * IO_TIMEOUT
            );
            return refuse(client, 502).await;
        }
    };
    let lose = shared.answered.fetch_add(1, Ordering::SeqCst) == 0;
    let mut exchange = Exchange {
        request: request.start_line_words(2),
        answer: answer.start_line_tail(),
        operation_id: answer
            .header(idem_runtime::headers::OPERATION_ID)
            .map(str::to_owned),
        replayed: answer
            .header(idem_runtime::headers::IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        delivered: false,
        status: answer
            .start_line_tail()
            .split(' ')
            .next()
            .and_then(|code| code.parse().ok())
            .unwrap_or(0),
        body: answer.body.clone(),
        headers: answer
            .headers
            .iter()
            .filter_map(|(name, value)| {
                Some((
                    String::from_utf8(name.clone()).ok()?,
                    String::from_utf8(value.clone()).ok()?,
                ))
            })
            .collect(),
    };
    if !lose {
        let bytes = answer.rewritten(&[]);
        exchange.delivered = timeout(IO_TIMEOUT, async {
            client.write_all(&bytes).await?;
            client.shutdown().await
        })
        .await
        .is_ok_and(|written| written.is_ok());
    }
    shared
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(exchange);
    // Dropping `client` closes the connection; for the lost answer nothing was written.
}

/// Sends `request` to the service on a new connection and reads its whole answer.
async fn forward(request: &Message, upstream: SocketAddr) -> Result<Message, HttpError> {
    let mut service = TcpStream::connect(upstream).await.map_err(HttpError::Io)?;
    // The whole body is here already: no `Expect: 100-continue` for the service to answer.
    service
        .write_all(&request.rewritten(&["expect"]))
        .await
        .map_err(HttpError::Io)?;
    read_message(
        &mut service,
        Kind::Answer {
            to_head: request.method() == "HEAD",
        },
    )
    .await
}

/// Answers `status` with an empty body and closes the connection.
async fn refuse(mut client: TcpStream, status: u16) {
    let reason = match status {
        400 => "Bad Request",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let answer =
        format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let _ = timeout(IO_TIMEOUT, async {
        client.write_all(answer.as_bytes()).await?;
        client.shutdown().await
    })
    .await;
}

/// What is being read: a client's request, or the service's answer (to a `HEAD` or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request: its body is `Content-Length` bytes, none without one.
    Request,
    /// An answer: its body is `Content-Length` bytes, or everything until the connection
    /// closes; none for a `HEAD`, a 1xx, a 204 or a 304.
    Answer {
        /// Whether the request was a `HEAD`.
        to_head: bool,
    },
}

/// Why a message could not be read.
#[derive(Debug)]
pub enum HttpError {
    /// The connection failed, or closed before the message was whole.
    Io(std::io::Error),
    /// The header block is over [`MAX_HEAD`].
    HeadTooLarge,
    /// The message is over [`MAX_MESSAGE`].
    TooLarge,
    /// The message is not HTTP/1.1 this proxy handles.
    Malformed(&'static str),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Io(error) => write!(f, "the connection failed: {error}"),
            HttpError::HeadTooLarge => write!(f, "the header block is over {MAX_HEAD} bytes"),
            HttpError::TooLarge => write!(f, "the message is over {MAX_MESSAGE} bytes"),
            HttpError::Malformed(what) => write!(f, "malformed HTTP/1.1: {what}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl HttpError {
    /// The status a client gets for a request that failed so.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLarge => 431,
            HttpError::TooLarge => 413,
            HttpError::Io(_) | HttpError::Malformed(_) => 400,
        }
    }
}

/// One HTTP/1.1 message, read whole: its header block (parsed) and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The start line, without its CRLF.
    pub start_line: Vec<u8>,
    /// The headers, name and value, in order (values trimmed).
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
    /// Whether the body was framed by the end of the connection (an answer without
    /// `Content-Length`) rather than by its headers.
    pub until_close: bool,
}

impl Message {
    /// The first value of header `name` (case-insensitive), if it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The request's method.
    pub fn method(&self) -> String {
        self.start_line_words(1)
    }

    /// The first `n` words of the start line (`POST /orders` for 2), as text.
    pub fn start_line_words(&self, n: usize) -> String {
        let text = String::from_utf8_lossy(&self.start_line);
        text.split(' ').take(n).collect::<Vec<_>>().join(" ")
    }

    /// The start line after its first word (an answer's `201 Created`), as text.
    pub fn start_line_tail(&self) -> String {
        let text = String::from_utf8_lossy(&self.start_line);
        text.split_once(' ')
            .map_or_else(String::new, |(_, tail)| tail.to_owned())
    }

    /// The message as bytes to send, with `connection: close` in place of its own
    /// connection headers and without the headers named in `drop`; a body that was
    /// framed by the end of the connection gets its `Content-Length`.
    pub fn rewritten(&self, drop: &[&str]) -> Vec<u8> {
        let hop_by_hop = ["connection", "keep-alive", "proxy-connection"];
        let mut out = Vec::with_capacity(self.start_line.len() + 256 + self.body.len());
        out.extend_from_slice(&self.start_line);
        out.extend_from_slice(b"\r\n");
        for (name, value) in &self.headers {
            let skip = hop_by_hop
                .iter()
                .chain(drop)
                .any(|h| name.eq_ignore_ascii_case(h.as_bytes()));
            if !skip {
                out.extend_from_slice(name);
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
        if self.until_close {
            out.extend_from_slice(format!("content-length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"connection: close\r\n\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// Reads one whole message from `stream`: the header block up to its blank line, then
/// the body its headers announce.
///
/// # Errors
///
/// The stream fails or ends early, a limit is passed, or the message is malformed.
pub async fn read_message(
    stream: &mut (impl AsyncRead + Unpin),
    kind: Kind,
) -> Result<Message, HttpError> {
    let mut buf = Vec::with_capacity(8 * 1024);
    let head_end = loop {
        if let Some(at) = find_blank_line(&buf) {
            break at;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::HeadTooLarge);
        }
        if read_some(stream, &mut buf).await? == 0 {
            return Err(HttpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    };
    if head_end > MAX_HEAD {
        return Err(HttpError::HeadTooLarge);
    }
    let (start_line, headers) = parse_head(&buf[..head_end], kind)?;
    let mut body = buf.split_off(head_end + 4);
    let length = body_length(&start_line, &headers, kind)?;
    match length {
        Some(length) => {
            if head_end + 4 + length > MAX_MESSAGE {
                return Err(HttpError::TooLarge);
            }
            while body.len() < length {
                if read_some(stream, &mut body).await? == 0 {
                    return Err(HttpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
                }
            }
            // One message per connection: anything after it is not read.
            body.truncate(length);
        }
        None => loop {
            if head_end + 4 + body.len() > MAX_MESSAGE {
                return Err(HttpError::TooLarge);
            }
            if read_some(stream, &mut body).await? == 0 {
                break;
            }
        },
    }
    Ok(Message {
        start_line,
        headers,
        body,
        until_close: length.is_none(),
    })
}

/// Appends what one read gives (at most 8 KiB) to `buf`; 0 at the end of the stream.
async fn read_some(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<usize, HttpError> {
    let mut chunk = [0u8; 8 * 1024];
    let n = stream.read(&mut chunk).await.map_err(HttpError::Io)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// Where the header block's blank line (`\r\n\r\n`) starts.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// The start line and the headers of a header block (without its blank line).
fn parse_head(head: &[u8], kind: Kind) -> Result<(Vec<u8>, Headers), HttpError> {
    // `head` ends before the blank line's CRLF CRLF: its lines are separated by CRLF, and
    // a bare CR or LF anywhere else is refused.
    let mut lines = split_crlf(head).map(|line| {
        if line.iter().any(|&b| b == b'\r' || b == b'\n') {
            Err(HttpError::Malformed("a line not ended by CRLF"))
        } else {
            Ok(line)
        }
    });
    let start_line = match lines.next() {
        Some(line) => line?,
        None => return Err(HttpError::Malformed("no start line")),
    };
    let words: Vec<&[u8]> = start_line.splitn(3, |&b| b == b' ').collect();
    let valid = match (kind, words.as_slice()) {
        // `POST /orders HTTP/1.1`
        (Kind::Request, [method, target, version]) => {
            !method.is_empty()
                && method.iter().all(u8::is_ascii_alphabetic)
                && target.iter().all(u8::is_ascii_graphic)
                && !target.is_empty()
                && matches!(*version, b"HTTP/1.1" | b"HTTP/1.0")
        }
        // `HTTP/1.1 201 Created` (the reason may hold spaces, or be empty)
        (Kind::Answer { .. }, [version, status, _reason]) => {
            matches!(*version, b"HTTP/1.1" | b"HTTP/1.0")
                && status.len() == 3
                && status.iter().all(u8::is_ascii_digit)
        }
        _ => false,
    };
    if !valid {
        return Err(HttpError::Malformed("not an HTTP/1.x start line"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let line = line?;
        if line.first().is_some_and(|b| b.is_ascii_whitespace()) {
            return Err(HttpError::Malformed("a folded header line"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HttpError::Malformed("a header line without a colon"))?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
            return Err(HttpError::Malformed("a header name that is not a token"));
        }
        headers.push((name.to_vec(), line[colon + 1..].trim_ascii().to_vec()));
    }
    Ok((start_line.to_vec(), headers))
}

/// The lines of `head`, split at each CRLF.
fn split_crlf(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(head);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.windows(2).position(|w| w == b"\r\n") {
            Some(at) => {
                rest = Some(&text[at + 2..]);
                Some(&text[..at])
            }
            None => {
                rest = None;
                Some(text)
            }
        }
    })
}

/// The body's length from the headers; `None`: until the connection closes (answers only).
fn body_length(
    start_line: &[u8],
    headers: &Headers,
    kind: Kind,
) -> Result<Option<usize>, HttpError> {
    if headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(b"transfer-encoding"))
    {
        return Err(HttpError::Malformed("Transfer-Encoding is not supported"));
    }
    if let Kind::Answer { to_head } = kind {
        let status = start_line.split(|&b| b == b' ').nth(1).unwrap_or_default();
        if to_head || status.starts_with(b"1") || status == b"204" || status == b"304" {
            return Ok(Some(0));
        }
    }
    let mut length = None;
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        let parsed = std::str::from_utf8(value)
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or(HttpError::Malformed("Content-Length is not a number"))?;
        if length.is_some_and(|l| l != parsed) {
            return Err(HttpError::Malformed("two different Content-Lengths"));
        }
        if parsed > MAX_MESSAGE {
            return Err(HttpError::TooLarge);
        }
        length = Some(parsed);
    }
    Ok(match (length, kind) {
        (Some(length), _) => Some(length),
        (None, Kind::Request) => Some(0),
        (None, Kind::Answer { .. }) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(bytes: &[u8], kind: Kind) -> Result<Message, HttpError> {
        let mut stream = bytes;
        read_message(&mut stream, kind).await
    }

    #[tokio::test]
    async fn a_request_is_read_whole_and_rewritten_with_connection_close() {
        let raw = b"POST /orders HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\nbodyEXTRA";
        let message = read(raw, Kind::Request).await.unwrap();
        assert_eq!(message.method(), "POST");
        assert_eq!(message.start_line_words(2), "POST /orders");
        assert_eq!(message.body, b"body");
        let out = String::from_utf8(message.rewritten(&["expect"])).unwrap();
        assert_eq!(
            out,
            "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nconnection: close\r\n\r\nbody"
        );
    }

    #[tokio::test]
    async fn an_answer_without_length_is_read_until_the_close() {
        let message = read(
            b"HTTP/1.1 200 OK\r\n\r\nall of it",
            Kind::Answer { to_head: false },
        )
        .await
        .unwrap();
        assert_eq!(message.start_line_tail(), "200 OK");
        assert_eq!(message.body, b"all of it");
        assert!(
            String::from_utf8(message.rewritten(&[]))
                .unwrap()
                .ends_with("content-length: 9\r\nconnection: close\r\n\r\nall of it")
        );
        let empty = read(
            b"HTTP/1.1 204 No Content\r\n\r\n",
            Kind::Answer { to_head: false },
        )
        .await
        .unwrap();
        assert!(empty.body.is_empty());
    }

    #[tokio::test]
    async fn bad_input_is_an_error_not_a_panic() {
        let cases: &[&[u8]] = &[
            b"",
            b"GET / HTTP/1.1\r\n",
            b"\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET / HTTP/1.1 extra\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n\r\n",
            b"GET / HTTP/1.1\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET / HTTP/1.1\r\n folded: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n: empty\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
            b"\xff\xfe\xfd \xfc HTTP/1.1\r\n\x00: \x01\r\n\r\n",
        ];
        for case in cases {
            assert!(
                read(case, Kind::Request).await.is_err(),
                "{:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    /// Sends `bytes` to the proxy, half-closes, and returns all it answers.
    async fn exchange(proxy: &Proxy, bytes: &[u8]) -> String {
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut answer = Vec::new();
        let _ = timeout(IO_TIMEOUT, stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn over_a_socket_bad_requests_get_400_and_a_dead_service_502() {
        // A port that was free a moment ago: nothing listens there.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = Proxy::start(dead).await.unwrap();
        let garbage = exchange(&proxy, b"\x00\x01 nonsense\r\n\r\n").await;
        assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");
        let cut = exchange(&proxy, b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nab").await;
        assert!(cut.starts_with("HTTP/1.1 400 "), "{cut}");
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_MESSAGE + 1
        );
        let big = exchange(&proxy, big.as_bytes()).await;
        assert!(big.starts_with("HTTP/1.1 413 "), "{big}");
        let fine = exchange(&proxy, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(fine.starts_with("HTTP/1.1 502 "), "{fine}");
        assert!(proxy.exchanges().is_empty());
    }

    #[tokio::test]
    async fn the_first_answer_is_lost_and_the_next_passed_on_with_connection_close() {
        let service = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = service.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = service.accept().await {
                let request = read_message(&mut stream, Kind::Request).await.unwrap();
                assert_eq!(request.header("connection"), Some("close"));
                let answer = b"HTTP/1.1 201 Created\r\nconnection: keep-alive\r\noperation-id: op-1\r\ncontent-length: 2\r\n\r\nok";
                stream.write_all(answer).await.unwrap();
            }
        });
        let proxy = Proxy::start(upstream).await.unwrap();
        let request = b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(exchange(&proxy, request).await, "");
        let second = exchange(&proxy, request).await;
        assert_eq!(
            second,
            "HTTP/1.1 201 Created\r\noperation-id: op-1\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
        let log = proxy.exchanges();
        assert_eq!(log.len(), 2);
        assert!(!log[0].delivered && log[1].delivered);
        assert_eq!(log[0].operation_id.as_deref(), Some("op-1"));
        assert_eq!(log[0].answer, "201 Created");
    }

    #[tokio::test]
    async fn everything_is_bounded() {
        let mut long_head = b"GET / HTTP/1.1\r\nx: ".to_vec();
        long_head.resize(MAX_HEAD + 10, b'a');
        assert!(matches!(
            read(&long_head, Kind::Request).await,
            Err(HttpError::HeadTooLarge)
        ));
        let too_long = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_MESSAGE);
        assert!(matches!(
            read(too_long.as_bytes(), Kind::Request).await,
            Err(HttpError::TooLarge)
        ));
        let mut endless = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        endless.resize(MAX_MESSAGE + 10, b'a');
        assert!(matches!(
            read(&endless, Kind::Answer { to_head: false }).await,
            Err(HttpError::TooLarge)
        ));
    }
}
