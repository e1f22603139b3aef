//! A store opened from a URL: [`open`] and [`OpenOptions`] (the URLs: [`open`]).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{MemoryStore, Store};

/// The longest URL accepted, in bytes.
pub const MAX_URL_LEN: usize = 4096;

/// Why [`open`] could not open a store. Every message names the URL with its password
/// hidden ([`redact_url`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is empty, or only blanks.
    #[error(
        "the store URL is empty: name `memory:`, an SQLite file (a path or `sqlite:PATH`), a postgres:// URL or a redis:// URL"
    )]
    Empty,
    /// The URL's scheme names no store.
    #[error(
        "`{url}` is not a store (scheme `{scheme}`): name `memory:`, an SQLite file (a path or `sqlite:PATH`), a postgres:// URL or a redis:// URL"
    )]
    UnknownScheme {
        /// The URL, its password hidden.
        url: String,
        /// The scheme, as written.
        scheme: String,
    },
    /// The URL names a store whose feature this build leaves out.
    #[error(
        "`{url}` names a {backend} store, which this build leaves out: it needs the feature `{feature}`"
    )]
    FeatureOff {
        /// The URL, its password hidden.
        url: String,
        /// The backend: `SQLite`, `PostgreSQL` or `Redis`.
        backend: &'static str,
        /// The feature of `idem-runtime` (and of `idem`, and of the `idem` command) that
        /// brings it: `sqlite`, `postgres` or `redis`.
        feature: &'static str,
    },
    /// The URL is not one its backend can read: a control character, too long, or
    /// refused by the backend's own URL parser; nothing was connected to.
    #[error("`{url}` is not a valid store URL: {reason}")]
    Malformed {
        /// The URL, its password hidden (cut to its first 200 characters).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`OpenOptions::existing_only`]: no SQLite file at the path; none was created.
    #[error(
        "no SQLite database at {}: name the file the service opened (`SqliteStore::open`)",
        path.display()
    )]
    NoDatabase {
        /// The path the URL names.
        path: PathBuf,
    },
    /// [`OpenOptions::existing_only`]: the PostgreSQL database has no idem schema.
    #[error(
        "the database at {url} has no idem schema (no table `idem_schema_migrations` in its search_path): is it the service's database?"
    )]
    NoSchema {
        /// The URL, its password hidden.
        url: String,
    },
    /// [`OpenOptions::existing_only`]: the PostgreSQL database lacks a migration this
    /// version of idem needs.
    #[error(
        "the database at {url} lacks idem's migration {missing}: start the service with this version of idem once, or apply idem-runtime/migrations/postgres"
    )]
    OutdatedSchema {
        /// The URL, its password hidden.
        url: String,
        /// The version of the latest migration, which the database lacks.
        missing: i64,
    },
    /// The store could not be reached or opened: a server that does not answer or
    /// refuses the login, a file that cannot be opened, a schema that cannot be created.
    #[error("cannot open the store {url}: {source}")]
    Connect {
        /// The URL, its password hidden.
        url: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// How [`OpenOptions::open`] opens a store.
///
/// # Default
///
/// - not [`existing_only`](OpenOptions::existing_only): as a service opens its store,
///   creating the SQLite file and schema, applying idem's PostgreSQL migrations, with
///   each backend's own pool (`SqliteStore::open`, `PostgresStore::connect`,
///   `RedisStore::connect`);
/// - Redis prefix `idem` (`RedisStore`'s default);
/// - no [`timeout`](OpenOptions::timeout): each backend's own bounds, those of the
///   constructors above.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    existing_only: bool,
    redis_prefix: Cow<'static, str>,
    timeout: Option<Duration>,
}

/// The bounds [`OpenOptions::timeout`] puts on a store, as each backend applies them
/// (none without a store feature: `memory:` has nothing to wait for).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
    allow(dead_code)
)]
pub(crate) struct Bounds {
    /// Connecting, the wait for a connection of a pool, and the server's own limit on a
    /// statement (PostgreSQL's `statement_timeout`) or on the wait for a lock (SQLite's
    /// busy timeout).
    pub(crate) limit: Duration,
    /// The client's wait for the answer to one statement or command: `limit` and a grace
    /// (a quarter of it, at most 1 s), so that a server that gives up in time is heard
    /// and only a silent one is cut off.
    pub(crate) call: Duration,
}

#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
    allow(dead_code)
)]
impl Bounds {
    /// The shortest timeout: a shorter one is taken as this, 1 ms (never zero, which
    /// PostgreSQL's `statement_timeout` reads as "no limit").
    const MIN: Duration = Duration::from_millis(1);

    /// The longest timeout: a longer one is taken as this, 24 h (within what PostgreSQL's
    /// `statement_timeout`, a 32-bit count of milliseconds, holds).
    const MAX: Duration = Duration::from_secs(24 * 60 * 60);

    /// The bounds of a timeout, taken as [`Bounds::MIN`] to [`Bounds::MAX`].
    fn new(timeout: Duration) -> Bounds {
        let limit = timeout.clamp(Bounds::MIN, Bounds::MAX);
        let grace = (limit / 4).min(Duration::from_secs(1));
        Bounds {
            limit,
            call: limit + grace,
        }
    }
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// The defaults (see [`OpenOptions`]).
    pub const fn new() -> OpenOptions {
        OpenOptions {
            existing_only: false,
            redis_prefix: Cow::Borrowed("idem"),
            timeout: None,
        }
    }

    /// Opens only a store a service already uses, creating nothing, as an operator's
    /// tool does (`idem ops`): an SQLite file must exist and hold idem's table
    /// ([`OpenError::NoDatabase`], else [`OpenError::Connect`]); a PostgreSQL database
    /// must have idem's latest migration ([`OpenError::NoSchema`],
    /// [`OpenError::OutdatedSchema`]) and is reached through a pool of 2 connections
    /// that waits 5 s at most for one. `memory:` is a new, empty store all the same.
    pub const fn existing_only(mut self) -> OpenOptions {
        self.existing_only = true;
        self
    }

    /// The prefix of the Redis store's keys (`RedisStore::with_prefix`); unused by the
    /// other stores.
    pub fn with_redis_prefix(mut self, prefix: impl Into<String>) -> OpenOptions {
        self.redis_prefix = Cow::Owned(prefix.into());
        self
    }

    /// Bounds every wait of opening the store, and of every call of the store opened, by
    /// `timeout` (taken as 1 ms at least and 24 h at most), so that no call hangs on a
    /// server or a network gone silent:
    ///
    /// - connecting, and the wait for a connection of a pool: `timeout`;
    /// - each statement or command: `timeout` on the server where it has a limit of its
    ///   own (PostgreSQL's `statement_timeout`, set for the session over any the URL
    ///   gives; SQLite's busy timeout, the wait for another writer's lock), and on the
    ///   client: Redis's answer within `timeout` (the `redis` crate's response timeout),
    ///   and any store's within `timeout` and a grace (a quarter of it, at most 1 s), so
    ///   that a server's own refusal arrives first and only a silent peer is cut off;
    /// - the socket: a Redis connection sends TCP keepalive probes after `timeout` idle
    ///   and (on Linux) closes when data it sent stays unacknowledged that long; a
    ///   PostgreSQL server is asked to probe its end of the connection after `timeout`
    ///   idle, every `timeout`, three times (`tcp_keepalives_idle`,
    ///   `tcp_keepalives_interval`, `tcp_keepalives_count`, in whole seconds, at least 1),
    ///   and to close it when what it sent stays unacknowledged for four times that
    ///   (`tcp_user_timeout`); sqlx sets no keepalive on the client's end.
    ///
    /// A call cut off after it was sent, or whose connection broke before its answer
    /// came, fails with
    /// [`StoreError::outcome_unknown`](super::StoreError::outcome_unknown); one that
    /// failed before it was sent, or that the server answered with an error, with a
    /// plain [`StoreError::Unavailable`](super::StoreError::Unavailable). A store that
    /// cannot be opened in time is [`OpenError::Connect`]. Without a timeout (the
    /// default), each backend keeps the bounds of its constructor.
    pub const fn timeout(mut self, timeout: Duration) -> OpenOptions {
        self.timeout = Some(timeout);
        self
    }

    /// The bounds of [`OpenOptions::timeout`], if set.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
        allow(dead_code)
    )]
    fn bounds(&self) -> Option<Bounds> {
        self.timeout.map(Bounds::new)
    }

    /// Opens the store `url` names (the URLs: [`open`]).
    ///
    /// # Errors
    ///
    /// [`OpenError`]: an empty, malformed or unknown URL and a feature that is off are
    /// refused before anything is opened; then a store that cannot be opened.
    pub async fn open(&self, url: &str) -> Result<Arc<dyn Store>, OpenError> {
        match Location::parse(url)? {
            Location::Memory => Ok(Arc::new(MemoryStore::new())),
            Location::Sqlite(path) => sqlite(url, &path, self).await,
            Location::Postgres => postgres(url, self).await,
            Location::Redis => redis(url, self).await,
        }
    }
}

/// Opens the store `url` names as a service does, with the [`OpenOptions`] defaults: the
/// SQLite file and schema are created if missing, idem's PostgreSQL migrations applied.
///
/// | URL | store | feature |
/// |---|---|---|
/// | `memory:` or `memory://` | a new, empty [`MemoryStore`] | always |
/// | `sqlite:PATH`, `sqlite://PATH`, or a plain file path | `SqliteStore` on the file `PATH` (taken as it is written: no query string) | `sqlite` |
/// | `postgres://…` or `postgresql://…` | `PostgresStore` (sqlx's URL: user, password, host, port, database, `?sslmode=`) | `postgres` |
/// | `redis://…` or `rediss://…` (TLS) | `RedisStore` (the `redis` crate's URL) | `redis` |
///
/// Schemes are matched without regard to case. Text with a colon but no `://` and no
/// scheme of the table is a file path (`C:\data\orders.db`, `backup:1.db`). A URL
/// whose scheme names none of these (`mysql://…`) is refused with
/// [`OpenError::UnknownScheme`]; one of these whose feature is off in this build, with
/// [`OpenError::FeatureOff`]. A password in a URL is never part of an error message
/// ([`redact_url`]).
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::store::OpenError> {
/// let store = idem_runtime::store::open("memory:").await?;
/// let idem = idem_runtime::Idem::new(store, idem_runtime::identity::header("x-client-id"));
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`OpenOptions::open`].
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    OpenOptions::new().open(url).await
}

/// `url` with the password of its user info (`scheme://user:password@host`) replaced
/// by `***`, in each URL of a comma-separated list of them (a cluster's seed nodes);
/// any other text as it is.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    // Several seed nodes of a Redis Cluster: each its own URL.
    if url.contains(',') && url.matches("://").count() > 1 {
        let parts: Vec<Cow<'_, str>> = url.split(',').map(redact_url).collect();
        return Cow::Owned(parts.join(","));
    }
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, host)) = rest.rsplit_once('@')
        && let Some((user, _password)) = userinfo.split_once(':')
    {
        return Cow::Owned(format!("{scheme}://{user}:***@{host}"));
    }
    Cow::Borrowed(url)
}

/// The store a URL names, read without any I/O.
#[derive(Debug, PartialEq, Eq)]
enum Location {
    Memory,
    Sqlite(PathBuf),
    Postgres,
    Redis,
}

impl Location {
    fn parse(url: &str) -> Result<Location, OpenError> {
        if url.trim().is_empty() {
            return Err(OpenError::Empty);
        }
        let malformed = |reason: &str| OpenError::Malformed {
            url: redact_url(url).chars().take(200).collect(),
            reason: reason.to_owned(),
        };
        if url.len() > MAX_URL_LEN {
            return Err(malformed(&format!(
                "it is {} bytes long; at most {MAX_URL_LEN} are accepted",
                url.len()
            )));
        }
        if url.chars().any(char::is_control) {
            return Err(malformed("it holds a control character"));
        }
        let Some((scheme, rest)) = url.split_once(':') else {
            return Ok(Location::Sqlite(PathBuf::from(url)));
        };
        let slashed = rest.starts_with("//");
        match scheme.to_ascii_lowercase().as_str() {
            "memory" if rest.is_empty() || rest == "//" => Ok(Location::Memory),
            "memory" => Err(malformed("`memory:` takes nothing after it")),
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                match path {
                    "" => Err(malformed("`sqlite:` names no file: write `sqlite:PATH`")),
                    ":memory:" => Err(malformed(
                        "an SQLite database in memory is not shared with anyone: write `memory:`",
                    )),
                    _ => Ok(Location::Sqlite(PathBuf::from(path))),
                }
            }
            "postgres" | "postgresql" if slashed => Ok(Location::Postgres),
            "redis" | "rediss" if slashed => Ok(Location::Redis),
            "postgres" | "postgresql" | "redis" | "rediss" => Err(malformed(
                "write the scheme with `://`, such as `postgres://HOST/DB`",
            )),
            "" => Err(malformed("it has no scheme before `:`")),
            _ if slashed => Err(OpenError::UnknownScheme {
                url: redact_url(url).into_owned(),
                scheme: scheme.to_owned(),
            }),
            // A path with a colon in it (`C:\orders.db`, `backup:1.db`).
            _ => Ok(Location::Sqlite(PathBuf::from(url))),
        }
    }
}

/// A [`OpenError::Connect`] for `url`.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
fn connect_error(
    url: &str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> OpenError {
    OpenError::Connect {
        url: redact_url(url).into_owned(),
        source: source.into(),
    }
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(url: &str, _: &Path, _: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(feature_off(url, "SQLite", "sqlite"))
}

#[cfg(feature = "sqlite")]
async fn sqlite(
    url: &str,
    path: &Path,
    options: &OpenOptions,
) -> Result<Arc<dyn Store>, OpenError> {
    use super::SqliteStore;
    let store = if options.existing_only {
        if !path.is_file() {
            return Err(OpenError::NoDatabase {
                path: path.to_owned(),
            });
        }
        SqliteStore::open_existing_within(path, options.bounds()).await
    } else {
        SqliteStore::open_within(path, options.bounds()).await
    };
    Ok(Arc::new(store.map_err(|e| connect_error(url, e))?))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(url: &str, _: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(feature_off(url, "PostgreSQL", "postgres"))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    use std::str::FromStr;

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::PostgresStore;

    let connect = PgConnectOptions::from_str(url).map_err(|e| OpenError::Malformed {
        url: redact_url(url).into_owned(),
        reason: e.to_string(),
    })?;
    let bounds = options.bounds();
    if !options.existing_only && bounds.is_none() {
        let store = PostgresStore::connect(url).await;
        return Ok(Arc::new(store.map_err(|e| connect_error(url, e))?));
    }
    // As `PostgresStore::connect` (16 connections, 3 s), or an operator's 2 and 5 s.
    let (size, wait) = if options.existing_only {
        (2, Duration::from_secs(5))
    } else {
        (16, Duration::from_secs(3))
    };
    let pool = PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(bounds.map_or(wait, |b| b.limit))
        .connect_with(match bounds {
            Some(bounds) => postgres_bounded(connect, bounds),
            None => connect,
        })
        .await
        .map_err(|e| connect_error(url, e))?;
    let store = if options.existing_only {
        postgres_schema(url, &pool, bounds).await?;
        PostgresStore::without_migrations(pool)
    } else {
        within(bounds, PostgresStore::from_pool(pool))
            .await
            .map_err(|e| connect_error(url, e))?
            .map_err(|e| connect_error(url, e))?
    };
    Ok(Arc::new(match bounds {
        Some(bounds) => store.with_call_timeout(bounds.call),
        None => store,
    }))
}

/// `connect` with the server's side of `bounds`: its `statement_timeout`, and keepalive
/// probes of the client's end of the connection, which is closed when they (or anything
/// else sent) go unacknowledged for as long as the probes take (see
/// [`OpenOptions::timeout`]).
#[cfg(feature = "postgres")]
fn postgres_bounded(
    connect: sqlx::postgres::PgConnectOptions,
    bounds: Bounds,
) -> sqlx::postgres::PgConnectOptions {
    let ms = bounds.limit.as_millis().to_string();
    let probes = bounds.limit.as_secs().max(1);
    let secs = probes.to_string();
    // Idle, then three probes: within 4 × 24 h, which `tcp_user_timeout`'s 32 bits hold.
    let unacknowledged = (probes * 4 * 1000).to_string();
    connect.options([
        ("statement_timeout", ms.as_str()),
        ("tcp_keepalives_idle", secs.as_str()),
        ("tcp_keepalives_interval", secs.as_str()),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", unacknowledged.as_str()),
    ])
}

/// Checks that the database at `url` has idem's latest migration, without creating
/// anything ([`OpenOptions::existing_only`]).
#[cfg(feature = "postgres")]
async fn postgres_schema(
    url: &str,
    pool: &sqlx::PgPool,
    bounds: Option<Bounds>,
) -> Result<(), OpenError> {
    use super::postgres::MIGRATIONS;

    /// PostgreSQL's `undefined_table`.
    const UNDEFINED_TABLE: &str = "42P01";

    let versions =
        sqlx::query_scalar::<_, i64>("SELECT version FROM idem_schema_migrations").fetch_all(pool);
    let versions = within(bounds, versions)
        .await
        .map_err(|e| connect_error(url, e))?;
    let latest = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(1);
    match versions {
        Ok(v) if v.contains(&latest) => Ok(()),
        Ok(_) => Err(OpenError::OutdatedSchema {
            url: redact_url(url).into_owned(),
            missing: latest,
        }),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_TABLE) => {
            Err(OpenError::NoSchema {
                url: redact_url(url).into_owned(),
            })
        }
        Err(e) => Err(connect_error(url, e)),
    }
}

/// Awaits `step` of opening a store, within `bounds.call` when given.
#[cfg(feature = "postgres")]
async fn within<T>(
    bounds: Option<Bounds>,
    step: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    match bounds {
        Some(bounds) => tokio::time::timeout(bounds.call, step).await.map_err(|_| {
            format!(
                "the server did not answer within {} ms",
                bounds.call.as_millis()
            )
        }),
        None => Ok(step.await),
    }
}

#[cfg(not(feature = "redis"))]
async fn redis(url: &str, _: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(feature_off(url, "Redis", "redis"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    use super::RedisStore;

    // One server, or the comma-separated seed nodes of a cluster: each must parse.
    if let Err(e) = url
        .split(',')
        .try_for_each(|seed| redis::Client::open(seed.trim()).map(drop))
    {
        return Err(OpenError::Malformed {
            url: redact_url(url).into_owned(),
            reason: e.to_string(),
        });
    }
    let store = RedisStore::connect_within(url, options.bounds())
        .await
        .map_err(|e| connect_error(url, e))?;
    Ok(Arc::new(
        store.with_prefix(options.redis_prefix.to_string()),
    ))
}

#[cfg(not(all(feature = "sqlite", feature = "postgres", feature = "redis")))]
fn feature_off(url: &str, backend: &'static str, feature: &'static str) -> OpenError {
    OpenError::FeatureOff {
        url: redact_url(url).into_owned(),
        backend,
        feature,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(path: &str) -> Location {
        Location::Sqlite(PathBuf::from(path))
    }

    #[test]
    fn every_accepted_form_names_its_store() {
        let cases = [
            ("memory:", Location::Memory),
            ("memory://", Location::Memory),
            ("MEMORY:", Location::Memory),
            ("orders.db", sqlite("orders.db")),
            ("/var/lib/orders.db", sqlite("/var/lib/orders.db")),
            ("sqlite:orders.db", sqlite("orders.db")),
            ("sqlite://orders.db", sqlite("orders.db")),
            ("sqlite:///var/lib/orders.db", sqlite("/var/lib/orders.db")),
            ("SQLite:orders.db", sqlite("orders.db")),
            ("C:\\data\\orders.db", sqlite("C:\\data\\orders.db")),
            ("backup:1.db", sqlite("backup:1.db")),
            ("memory", sqlite("memory")),
            ("postgres://u@h/db?sslmode=disable", Location::Postgres),
            ("postgresql://h/db", Location::Postgres),
            ("PostgreSQL://h/db", Location::Postgres),
            ("redis://127.0.0.1:6379", Location::Redis),
            ("rediss://h:6380/0", Location::Redis),
        ];
        for (url, expected) in cases {
            assert_eq!(Location::parse(url).unwrap(), expected, "{url}");
        }
    }

    #[test]
    fn empty_unknown_and_malformed_urls_are_refused_precisely() {
        assert!(matches!(Location::parse(""), Err(OpenError::Empty)));
        assert!(matches!(Location::parse(" \t "), Err(OpenError::Empty)));
        let Err(OpenError::UnknownScheme { scheme, url }) =
            Location::parse("mysql://root:pw@db/orders")
        else {
            panic!("mysql is no store");
        };
        assert_eq!(
            (scheme.as_str(), url.as_str()),
            ("mysql", "mysql://root:***@db/orders")
        );
        let malformed = [
            ("memory:x", "takes nothing"),
            ("sqlite:", "names no file"),
            ("sqlite://", "names no file"),
            ("sqlite::memory:", "write `memory:`"),
            ("postgres:db", "`://`"),
            ("redis:localhost", "`://`"),
            ("://host", "no scheme"),
            ("orders\0.db", "control character"),
            ("redis://h\n:6379", "control character"),
        ];
        for (url, says) in malformed {
            match Location::parse(url) {
                Err(e @ OpenError::Malformed { .. }) => {
                    assert!(e.to_string().contains(says), "{url}: {e}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_huge_url_is_refused_and_not_repeated_whole() {
        let url = format!("postgres://u:secret@{}/db", "h".repeat(100_000));
        let e = Location::parse(&url).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("at most 4096"), "{text}");
        assert!(text.len() < 600, "{}", text.len());
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn passwords_are_hidden() {
        let cases = [
            ("postgres://u:s3cret@h/db", "postgres://u:***@h/db"),
            ("redis://:s3cret@h:6379", "redis://:***@h:6379"),
            // A password holding `@` or `/` is hidden whole.
            ("postgres://u:p@ss/w@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("orders.db", "orders.db"),
            (
                "redis://:a1@h1:7000,redis://u:b2@h2:7001,redis://h3:7002",
                "redis://:***@h1:7000,redis://u:***@h2:7001,redis://h3:7002",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[tokio::test]
    async fn memory_opens_an_empty_store() {
        let store = open("memory:").await.unwrap();
        let listed = store
            .list(
                &super::super::ListQuery::default(),
                super::super::unix_now(),
            )
            .await
            .unwrap();
        assert!(listed.is_empty());
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_is_created_unless_existing_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let url = format!("sqlite://{}", path.display());
        let existing = OpenOptions::new().existing_only();
        let e = existing.open(&url).await.err().unwrap();
        assert!(matches!(e, OpenError::NoDatabase { .. }), "{e}");
        assert!(!path.exists(), "existing_only creates nothing");
        open(&url).await.unwrap();
        assert!(path.is_file());
        existing.open(path.to_str().unwrap()).await.unwrap();
        let foreign = dir.path().join("foreign.db");
        std::fs::write(&foreign, "").unwrap();
        let e = existing
            .open(foreign.to_str().unwrap())
            .await
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("idem_records"), "{e}");
    }

    #[test]
    fn a_timeout_is_kept_in_range_and_the_client_waits_a_grace_longer() {
        let bounds = |ms: u64| {
            let b = Bounds::new(Duration::from_millis(ms));
            (b.limit.as_millis(), b.call.as_millis())
        };
        assert_eq!(bounds(0), (1, 1));
        assert_eq!(bounds(400), (400, 500));
        assert_eq!(bounds(2_000), (2_000, 2_500));
        assert_eq!(bounds(10_000), (10_000, 11_000));
        assert_eq!(bounds(u64::MAX), (86_400_000, 86_401_000));
    }

    /// Another connection holds the write lock: a write of a store opened with a
    /// timeout waits the busy timeout, and fails as a refusal (nothing was written), not
    /// as an unknown outcome.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_bounded_sqlite_write_waits_for_the_lock_as_long_as_the_timeout() {
        use sqlx::Connection;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let url = path.to_str().unwrap();
        let store = OpenOptions::new()
            .timeout(Duration::from_millis(300))
            .open(url)
            .await
            .unwrap();
        let mut holder = sqlx::SqliteConnection::connect(&format!("sqlite://{url}"))
            .await
            .unwrap();
        let tx = holder.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let started = std::time::Instant::now();
        let e = store
            .purge_expired(super::super::unix_now())
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(e.to_string().contains("database is locked"), "{e}");
        assert!(!e.is_outcome_unknown(), "{e}");
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        tx.rollback().await.unwrap();
        store.purge_expired(super::super::unix_now()).await.unwrap();
    }

    /// A database without idem's table is told apart from one that does not answer.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_without_the_schema_is_named_so_with_a_timeout() {
        let Some(url) = crate::store::conformance::postgres::scratch_url("open, no schema").await
        else {
            return;
        };
        let options = OpenOptions::new()
            .existing_only()
            .timeout(Duration::from_secs(5));
        let e = options.open(&url).await.err().unwrap();
        assert!(matches!(e, OpenError::NoSchema { .. }), "{e}");
        let store = OpenOptions::new()
            .timeout(Duration::from_secs(5))
            .open(&url)
            .await
            .unwrap();
        let listed = store
            .list(
                &super::super::ListQuery::default(),
                super::super::unix_now(),
            )
            .await
            .unwrap();
        assert!(listed.is_empty());
        options.open(&url).await.unwrap();
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_malformed_and_unreachable() {
        let e = open("postgres://u:s3cret@[::1/db").await.err().unwrap();
        assert!(matches!(e, OpenError::Malformed { .. }), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        for options in [OpenOptions::new(), OpenOptions::new().existing_only()] {
            let e = options
                .open("postgres://u:s3cret@127.0.0.1:1/db?sslmode=disable&connect_timeout=2")
                .await
                .err()
                .unwrap();
            assert!(matches!(e, OpenError::Connect { .. }), "{e}");
            assert!(
                e.to_string()
                    .starts_with("cannot open the store postgres://u:***@127.0.0.1:1/"),
                "{e}"
            );
        }
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis_malformed_and_unreachable() {
        for url in [
            "redis://[::1",
            "redis://\u{1F4A5}",
            "redis://127.0.0.1:99999",
        ] {
            let e = open(url).await.err().unwrap();
            assert!(
                matches!(e, OpenError::Malformed { .. } | OpenError::Connect { .. }),
                "{url}: {e}"
            );
        }
        let e = open("redis://:s3cret@127.0.0.1:1").await.err().unwrap();
        assert!(matches!(e, OpenError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("redis://:***@127.0.0.1:1"), "{e}");
        // A cluster's seed list: one bad seed makes the whole URL malformed, named
        // without its passwords; seeds that cannot be reached are a connect error.
        for url in [
            "redis://:a1@127.0.0.1:1,redis://[::1",
            "redis://127.0.0.1:1,\u{0}",
            "redis://127.0.0.1:1,http://127.0.0.1:2",
        ] {
            let e = open(url).await.err().unwrap();
            assert!(matches!(e, OpenError::Malformed { .. }), "{url}: {e}");
            assert!(!e.to_string().contains("a1@"), "{e}");
        }
        let e = open("redis://:a1@127.0.0.1:1,redis://:b2@127.0.0.1:2")
            .await
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Connect { .. }), "{e}");
        let shown = e.to_string();
        assert!(!shown.contains("a1") && !shown.contains("b2"), "{shown}");
    }

    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_store_whose_feature_is_off_is_named_with_its_feature() {
        let e = open("redis://127.0.0.1:6379").await.err().unwrap();
        assert!(
            matches!(
                e,
                OpenError::FeatureOff {
                    feature: "redis",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("the feature `redis`"), "{e}");
    }

    #[cfg(not(feature = "sqlite"))]
    #[tokio::test]
    async fn sqlite_off_is_named_before_any_file_is_touched() {
        let e = open("orders.db").await.err().unwrap();
        assert!(
            matches!(
                e,
                OpenError::FeatureOff {
                    feature: "sqlite",
                    ..
                }
            ),
            "{e}"
        );
    }
}
