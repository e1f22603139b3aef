//! Scratch Redis namespaces for tests: a fresh prefix of a real server per store, so that
//! tests run in parallel and never see each other's records.
//!
//! The server is the one at `IDEM_TEST_REDIS_URL`, by default [`DEFAULT_URL`] (the local
//! server that `.ci/run` starts). When it cannot be reached, [`url_or_skip`] says the test
//! was skipped and why, and returns `None`; under `CI=true` it panics instead, because in
//! CI a skipped store test is a failure.

use crate::store::RedisStore;

/// The variable that names the test server.
pub const URL_VAR: &str = "IDEM_TEST_REDIS_URL";

/// The test server when [`URL_VAR`] is not set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The URL of the test server.
pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// The URL of the test server once it has answered, or `None` (after saying why) when it
/// cannot be reached.
///
/// # Panics
///
/// Under `CI=true` when the server cannot be reached: a skipped store test is a failure
/// there.
pub async fn url_or_skip(what: &str) -> Option<String> {
    let url = url();
    match RedisStore::connect(&url).await {
        Ok(_) => Some(url),
        Err(why) => {
            assert!(
                !super::skips_fail(),
                "{what}: {why}; under CI=true a skipped store test is a failure"
            );
            eprintln!("skipped {what}: {why} (start Redis on 127.0.0.1:6379, or set {URL_VAR})");
            None
        }
    }
}

/// A prefix no other test uses: `idem-test-<uuid>`.
pub fn scratch_prefix() -> String {
    format!("idem-test-{}", uuid::Uuid::new_v4().simple())
}

/// A store on the server at `url` under a [`scratch_prefix`].
///
/// # Panics
///
/// When the server cannot be reached (call [`url_or_skip`] first).
pub async fn scratch_store(url: &str) -> RedisStore {
    RedisStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("the Redis test server at {url}: {e}"))
        .with_prefix(scratch_prefix())
}
