//! Scratch PostgreSQL databases for tests: a fresh schema of a real server per store, so
//! that tests run in parallel and never see each other's records.
//!
//! The server is the one at `IDEM_TEST_DATABASE_URL`, by default
//! [`DEFAULT_URL`] (the local server with trust authentication that
//! `.ci/run` starts). When it cannot be reached, [`scratch_pool`] says the test was
//! skipped and why, and returns `None`; under `CI=true` it panics instead, because in CI a
//! skipped store test is a failure.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The variable that names the test server.
pub const URL_VAR: &str = "IDEM_TEST_DATABASE_URL";

/// The test server when [`URL_VAR`] is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable";

/// The prefix of every scratch schema; schemas of this prefix older than an hour are
/// dropped when a new one is made.
const PREFIX: &str = "idem_t_";

/// The URL of the test server.
pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

pub use super::skips_fail;

/// Reports that `what` cannot run because `why`, and returns `None`.
///
/// # Panics
///
/// Under `CI=true`: a skipped store test is a failure there.
pub fn skip<T>(what: &str, why: &dyn std::fmt::Display) -> Option<T> {
    assert!(
        !skips_fail(),
        "{what}: {why}; under CI=true a skipped store test is a failure"
    );
    eprintln!("skipped {what}: {why} (start PostgreSQL on 127.0.0.1:5432, or set {URL_VAR})");
    None
}

/// The URL of a new, empty schema of the test server (the server's URL with
/// `options[search_path]=<schema>`, which sqlx reads), for a test that starts a service
/// of its own; or `None` (after saying so) when the server cannot be reached.
///
/// # Panics
///
/// Under `CI=true` when the server cannot be reached; when the server refuses to create
/// the schema.
pub async fn scratch_url(what: &str) -> Option<String> {
    let url = url();
    let schema = scratch_schema(what, &url).await?;
    let separator = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{separator}options[search_path]={schema}"))
}

/// A pool of up to 8 connections whose `search_path` is a new, empty schema of the test
/// server, or `None` (after saying so) when the server cannot be reached.
///
/// # Panics
///
/// Under `CI=true` when the server cannot be reached; when the server refuses to create
/// the schema.
pub async fn scratch_pool(what: &str) -> Option<PgPool> {
    let url = url();
    let schema = scratch_schema(what, &url).await?;
    let options = PgConnectOptions::from_str(&url)
        .unwrap_or_else(|e| panic!("{what}: {URL_VAR} is not a PostgreSQL URL: {e}"))
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot connect to the scratch schema: {e}"));
    Some(pool)
}

/// Creates a new scratch schema on the server at `url` and returns its name.
async fn scratch_schema(what: &str, url: &str) -> Option<String> {
    let admin = match PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
    {
        Ok(pool) => pool,
        Err(error) => {
            return skip(
                what,
                &format_args!("PostgreSQL at {url} cannot be reached ({error})"),
            );
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    drop_stale_schemas(&admin, now).await;
    let schema = format!(
        "{PREFIX}{now}_{}",
        uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .get(..12)
            .unwrap_or("0")
    );
    // The name is made of digits, lowercase hex and `_` only.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot create the scratch schema {schema}: {e}"));
    admin.close().await;
    Some(schema)
}

/// Drops the scratch schemas that earlier runs left behind more than an hour ago.
async fn drop_stale_schemas(admin: &PgPool, now: u64) {
    let Ok(names) = sqlx::query_scalar::<_, String>(
        "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, 'idem_t_')",
    )
    .fetch_all(admin)
    .await
    else {
        return;
    };
    for name in names {
        let created = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        let stale = created.is_some_and(|secs| secs + 3600 < now);
        let safe = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if stale && safe {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE"
            )))
            .execute(admin)
            .await;
        }
    }
}
