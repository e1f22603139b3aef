//! The store `idem ops` and `idem monday --store` open: a service's own, as its operator
//! sees it (nothing is created), through [`idem_runtime::store::OpenOptions`].

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use idem_codegen::error::Error;
use idem_runtime::store::{OpenError, OpenOptions, Store};

/// The longest `--store` accepted, in bytes.
const MAX_STORE: usize = idem_runtime::store::MAX_URL_LEN;

/// `--timeout` unless given (as its `default_value` says): 10 s, which `idem monday
/// --store` waits too.
#[cfg(feature = "monday")]
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest `--timeout` accepted: 100 ms (a healthy store on a slow network takes
/// about that to answer).
const MIN_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest `--timeout` accepted: 1 h (a command that waits longer has hung).
const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// Where the records are.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The service's store: an SQLite file (a path, `sqlite:PATH` or `sqlite://PATH`), a
    /// PostgreSQL URL (`postgres://…`) or a Redis URL (`redis://…`); each needs its
    /// driver feature in this build (`idem --help` lists them).
    #[arg(long, value_name = "STORE")]
    pub store: String,
    /// The Redis store's prefix (`RedisStore::with_prefix`).
    #[arg(long, value_name = "PREFIX", default_value = "idem")]
    pub redis_prefix: String,
    /// The longest wait for the store, at each step: connecting, and each statement or
    /// command (the server's own limit too: PostgreSQL's `statement_timeout`, SQLite's
    /// busy timeout); the client waits a grace longer (a quarter, at most 1 s) for the
    /// server's answer. A duration such as `10s`, `500ms` or `2m`, from 100ms to 1h.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_timeout,
        allow_hyphen_values = true
    )]
    pub timeout: Duration,
}

/// A `--timeout`: a duration with its unit (`10s`, `500ms`, `1m 30s`), from
/// [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`].
fn parse_timeout(text: &str) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err("a timeout cannot be negative: write a duration such as `10s`".into());
    }
    let timeout = humantime::parse_duration(text.trim()).map_err(|e| {
        format!("{e}: write a duration with its unit, such as `10s`, `500ms` or `2m`")
    })?;
    let shown = |d: Duration| humantime::format_duration(d).to_string();
    if timeout < MIN_TIMEOUT {
        return Err(format!(
            "{} is too short: the store is given at least {}",
            shown(timeout),
            shown(MIN_TIMEOUT)
        ));
    }
    if timeout > MAX_TIMEOUT {
        return Err(format!(
            "{} is too long: at most {} (a wait that long is a hang)",
            shown(timeout),
            shown(MAX_TIMEOUT)
        ));
    }
    Ok(timeout)
}

/// Opens the store `args` names, without creating anything.
///
/// # Errors
///
/// A refused `--store` or `--redis-prefix`, a store whose driver this build leaves out
/// (with the command that installs one that has it), a store that cannot be opened.
pub async fn open(args: &StoreArgs) -> Result<Arc<dyn Store>, Error> {
    let spec = args.store.as_str();
    check_text("--store", spec, MAX_STORE)?;
    if spec
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("redis"))
    {
        check_text("--redis-prefix", &args.redis_prefix, 1024)?;
    }
    OpenOptions::new()
        .existing_only()
        .with_redis_prefix(args.redis_prefix.clone())
        .timeout(args.timeout)
        .open(spec)
        .await
        .map_err(explain)
}

/// The message of an [`OpenError`]; a driver this build leaves out comes with the
/// command that installs one that has it.
fn explain(error: OpenError) -> Error {
    match error {
        OpenError::FeatureOff {
            url,
            backend,
            feature,
            ..
        } => Error::new(format!(
            "`{url}` names a {backend} store, and this build of idem has no {backend} driver: install one that has it with `cargo install idem-cli --features {feature}` (the default features have every driver)"
        )),
        other => Error::new(other.to_string()),
    }
}

/// An argument that must be non-empty, at most `max` bytes, with no control characters.
pub fn check_text(flag: &str, text: &str, max: usize) -> Result<(), Error> {
    if text.trim().is_empty() {
        return Err(Error::new(format!("{flag} is empty")));
    }
    if text.len() > max {
        return Err(Error::new(format!(
            "{flag} is {} bytes long; at most {max} are accepted",
            text.len()
        )));
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(Error::new(format!(
            "{flag} holds a control character; write it without"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that is off is named with the feature and the command that bring it
    /// (the binary's tests cannot show it: their dev-dependencies turn every driver on).
    #[test]
    fn a_driver_that_is_off_is_named_with_its_install_command() {
        let e = explain(OpenError::FeatureOff {
            url: "postgres://u:***@h/db".into(),
            backend: "PostgreSQL",
            feature: "postgres",
        });
        let text = e.to_string();
        assert!(
            text.contains("cargo install idem-cli --features postgres"),
            "{text}"
        );
        assert!(text.contains("`postgres://u:***@h/db`"), "{text}");
    }

    #[test]
    fn timeouts_are_read_with_their_unit_and_kept_in_range() {
        for (text, ms) in [
            ("10s", 10_000),
            ("500ms", 500),
            (" 1m 30s ", 90_000),
            ("1h", 3_600_000),
        ] {
            assert_eq!(parse_timeout(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for (text, says) in [
            ("0", "0s is too short"),
            ("0s", "0s is too short"),
            ("99ms", "99ms is too short"),
            ("-1", "cannot be negative"),
            ("-5s", "cannot be negative"),
            ("abc", "write a duration with its unit"),
            ("10", "time unit needed"),
            ("", "write a duration with its unit"),
            ("1h 1s", "1h 1s is too long"),
            ("100000000000000000000s", "write a duration with its unit"),
        ] {
            let e = parse_timeout(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn hostile_store_arguments_are_refused_before_anything_is_opened() {
        let long = "x".repeat(MAX_STORE + 1);
        for (store, says) in [
            ("", "--store is empty"),
            ("  ", "--store is empty"),
            ("a\u{7}b.db", "control character"),
            (long.as_str(), "bytes long"),
        ] {
            let e = check_text("--store", store, MAX_STORE).unwrap_err();
            assert!(e.to_string().contains(says), "{store:?}: {e}");
        }
    }
}
