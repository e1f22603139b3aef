//! A store opened from a URL: [`open`] and [`OpenOptions`] (the URLs: [`open`]).

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        "the database at {url} lacks idem's migration {missing} (the history of attempts): start the service with this version of idem once, or apply idem-runtime/migrations/postgres"
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
/// - Redis prefix `idem` (`RedisStore`'s default).
#[derive(Clone, Debug)]
pub struct OpenOptions {
    existing_only: bool,
    redis_prefix: Cow<'static, str>,
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
/// by `***`; any other text as it is.
pub fn redact_url(url: &str) -> Cow<'_, str> {
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
        SqliteStore::open_existing(path).await
    } else {
        SqliteStore::open(path).await
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
    use std::time::Duration;

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::PostgresStore;
    use super::postgres::MIGRATIONS;

    let connect = PgConnectOptions::from_str(url).map_err(|e| OpenError::Malformed {
        url: redact_url(url).into_owned(),
        reason: e.to_string(),
    })?;
    if !options.existing_only {
        let store = PostgresStore::connect(url).await;
        return Ok(Arc::new(store.map_err(|e| connect_error(url, e))?));
    }
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect)
        .await
        .map_err(|e| connect_error(url, e))?;
    let versions: Result<Vec<i64>, _> =
        sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
            .fetch_all(&pool)
            .await;
    let latest = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(1);
    let url = redact_url(url).into_owned();
    match versions {
        Ok(v) if v.contains(&latest) => Ok(Arc::new(PostgresStore::without_migrations(pool))),
        Ok(_) => Err(OpenError::OutdatedSchema {
            url,
            missing: latest,
        }),
        Err(_) => Err(OpenError::NoSchema { url }),
    }
}

#[cfg(not(feature = "redis"))]
async fn redis(url: &str, _: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(feature_off(url, "Redis", "redis"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    use super::RedisStore;

    if let Err(e) = redis::Client::open(url) {
        return Err(OpenError::Malformed {
            url: redact_url(url).into_owned(),
            reason: e.to_string(),
        });
    }
    let store = RedisStore::connect(url)
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
