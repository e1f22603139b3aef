//! The store `idem ops` and `idem monday --store` open: a service's own, as its operator
//! sees it (nothing is created), through [`idem_runtime::store::OpenOptions`].

use std::sync::Arc;

use clap::Args;
use idem_codegen::error::Error;
use idem_runtime::store::{OpenError, OpenOptions, Store};

/// The longest `--store` accepted, in bytes.
const MAX_STORE: usize = idem_runtime::store::MAX_URL_LEN;

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
