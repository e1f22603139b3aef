//! Raw HTTP/1.1 over a `TcpStream`, for requests a client library will not send (bytes
//! that are not UTF-8 in a header, a header twice, obs-fold, a lying `Content-Length`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer read from the socket until the server closed it.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    /// The status code, or 0 when the server closed the connection without an answer.
    pub status: u16,
    /// The status line and the header lines, as text (lossy).
    pub head: String,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The first value of header `name` (matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    /// The `type` of a problem body.
    pub fn problem_type(&self) -> String {
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\n{}",
                self.head,
                String::from_utf8_lossy(&self.body)
            )
        });
        json["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// The request head of a POST with `headers` (each a whole line without CRLF) and `body`,
/// `Content-Length` set from the body and `Connection: close`.
pub fn post(path: &str, headers: &[&[u8]], body: &[u8]) -> Vec<u8> {
    let mut out = format!("POST {path} HTTP/1.1\r\nHost: idem.test\r\n").into_bytes();
    for line in headers {
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
    out
}

/// Writes `request` and reads the answer until the server closes (at most 10 s).
pub async fn send(addr: SocketAddr, request: &[u8]) -> RawAnswer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // The server may answer (and close) before it has read everything: ignore that.
    let _ = stream.write_all(request).await;
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes)).await;
    assert!(read.is_ok(), "the server did not answer within 10 s");
    parse(&bytes)
}

fn parse(bytes: &[u8]) -> RawAnswer {
    let Some(split) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return RawAnswer {
            status: 0,
            head: String::from_utf8_lossy(bytes).into_owned(),
            body: Vec::new(),
        };
    };
    let head = String::from_utf8_lossy(&bytes[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rest = &bytes[split + 4..];
    let mut answer = RawAnswer {
        status,
        head,
        body: Vec::new(),
    };
    let chunked = answer
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    answer.body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    answer
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    body
}
