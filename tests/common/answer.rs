//! An answer, read whole, and the checks of idem's problem answers.

use reqwest::header::HeaderMap;

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

    /// Asserts the replay of a result whose body, `original`, was larger than idem keeps:
    /// `status`, `Idempotent-Replayed: true`, and a problem body of type
    /// `result-body-not-kept` with the original's length and SHA-256. Returns the body.
    pub fn body_not_kept(&self, status: u16, original: &[u8]) -> serde_json::Value {
        use sha2::Digest;
        assert!(self.replayed(), "{self:?}");
        let body = self.problem(status, "result-body-not-kept");
        assert_eq!(body["original_body_length"], original.len());
        let digest = hex::encode(sha2::Sha256::digest(original));
        assert_eq!(body["original_body_sha256"], digest);
        body
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

    /// The slug of a problem answer (`store-unavailable`), or "" for any other answer.
    pub fn slug(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|b| b["type"].as_str().map(str::to_owned))
            .and_then(|t| t.rsplit(':').next().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// Sends a request and reads the answer.
pub async fn send(request: reqwest::RequestBuilder) -> Answer {
    Answer::read(request.send().await.expect("send the request")).await
}
