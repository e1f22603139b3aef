//! The features of the command: `idem --help` lists those of the build, and a command
//! whose feature is off says which one brings it (run with `--no-default-features` to
//! see that side).

use std::process::Output;

fn idem(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .expect("the idem binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_lists_the_features_of_this_build() {
    let out = idem(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for (name, on) in [
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
        ("monday", cfg!(feature = "monday")),
    ] {
        let state = if on { "on " } else { "off" };
        assert!(help.contains(&format!("{state}  {name}")), "{name}: {help}");
    }
    // Every command is listed, whatever the build has.
    for command in [
        "check", "merge", "docs", "export", "schema", "ops", "monday",
    ] {
        assert!(help.contains(&format!("  {command}")), "{command}: {help}");
    }
}

#[cfg(not(feature = "ops"))]
#[test]
fn ops_without_a_driver_names_the_features_that_bring_it() {
    let out = idem(&["ops", "list", "--store", "orders.db", "--state", "unknown"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("`idem ops` is not in this build"), "{err}");
    assert!(
        err.contains("cargo install idem-cli --features sqlite"),
        "{err}"
    );
}

#[cfg(not(feature = "monday"))]
#[test]
fn monday_without_its_feature_names_it() {
    let out = idem(&["monday", "--spec", "openapi.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("--features monday"), "{err}");
}

/// With every driver, `sqlite://PATH` names the same file as `PATH`, and a scheme that
/// names no store is refused with the schemes that do.
#[cfg(feature = "sqlite")]
#[test]
fn store_urls_are_read_by_the_runtime() {
    let dir = std::env::temp_dir().join(format!("idem-cli-features-{}", std::process::id()));
    let missing = dir.join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    let out = idem(&["ops", "list", "--store", &url]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no SQLite database at"),
        "{}",
        stderr(&out)
    );
    assert!(!missing.exists());
    let out = idem(&["ops", "list", "--store", "mysql://127.0.0.1/db"]);
    assert!(
        stderr(&out).contains("is not a store (scheme `mysql`)"),
        "{}",
        stderr(&out)
    );
    let out = idem(&["ops", "list", "--store", "memory:"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "no operations found"
    );
}
