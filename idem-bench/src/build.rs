//! What contracts cost the build: a generated service of N `POST` handlers, compiled twice
//! — **bare** (axum alone) and **contracted** (each handler under `#[idem::contract(..)]`,
//! served with `idem::MemoryStore`) — and timed side by side (`benches/build.rs`).
//!
//! Both crates have the same handlers: handler `i` takes `State<App>` and
//! `Json<Order<i>>` (a body type of its own, two fields), counts the order and answers
//! 201 with `Location` and a JSON body. The contracted crate adds only the attribute (the
//! contract of `idem-bench/src/stores`), the idem layer and one status lookup route. Each is a
//! binary whose `main` routes every handler, so none is left out of the build.
//!
//! The crates live in a workspace of their own under the directory given, with a copy of
//! this repository's `Cargo.lock` (the same versions) and its dev profile, built
//! `--offline` into a target directory of their own: the dependencies are compiled once,
//! by the first build, and every timed build compiles the handlers' crate alone (its main
//! file touched first), whole (`CARGO_INCREMENTAL=0`: nothing reused from the last one).

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The two crates of the generated workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The handlers without idem.
    Bare,
    /// The same handlers, each under `#[idem::contract(..)]`.
    Contracted,
}

impl Variant {
    /// The crate's (and its binary's) name.
    pub fn package(self) -> &'static str {
        match self {
            Variant::Bare => "handlers-bare",
            Variant::Contracted => "handlers-contracted",
        }
    }
}

/// A cargo profile the crates are built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// `cargo build` (the repository's dev profile: line tables only, no debug info for
    /// dependencies).
    Debug,
    /// `cargo build --release`.
    Release,
}

impl Profile {
    /// The name in tables and in the target directory (`debug`, `release`).
    pub fn name(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::Release => "release",
        }
    }
}

/// A generated workspace of two crates of `handlers` handlers each.
#[derive(Debug)]
pub struct Generated {
    dir: PathBuf,
}

/// One timed build: how long cargo took to compile the crate alone, and the size of the
/// binary it left (bytes).
#[derive(Clone, Copy, Debug)]
pub struct Built {
    /// Wall time of `cargo build -p <crate>` after its main file was touched.
    pub time: Duration,
    /// CPU time (user and system) of cargo and the compilers it ran: steadier than the
    /// wall time on a machine whose two cores the compiler shares with nothing else, and
    /// the same whatever the parallelism.
    pub cpu: Duration,
    /// The binary's size on disk, in bytes.
    pub binary: u64,
}

impl Generated {
    /// Writes the workspace under `dir` (created if missing; its `target/` is kept, so a
    /// second run reuses the compiled dependencies). `repository` is the root of this
    /// repository, for the path dependency on `idem` and its `Cargo.lock`.
    ///
    /// # Errors
    ///
    /// Any error writing the files, or reading `repository/Cargo.lock`.
    pub fn write(dir: &Path, repository: &Path, handlers: usize) -> io::Result<Generated> {
        for variant in [Variant::Bare, Variant::Contracted] {
            let src = dir.join(variant.package()).join("src");
            std::fs::create_dir_all(&src)?;
            write_if_changed(
                &dir.join(variant.package()).join("Cargo.toml"),
                &manifest(variant, repository),
            )?;
            write_if_changed(&src.join("main.rs"), &main_rs(variant, handlers))?;
        }
        write_if_changed(&dir.join("Cargo.toml"), WORKSPACE)?;
        let lock = std::fs::read(repository.join("Cargo.lock"))?;
        if std::fs::read(dir.join("Cargo.lock")).ok().as_deref() != Some(&lock[..]) {
            std::fs::write(dir.join("Cargo.lock"), lock)?;
        }
        Ok(Generated {
            dir: dir.to_path_buf(),
        })
    }

    /// Builds both crates in `profile` once, untimed: the dependencies.
    ///
    /// # Errors
    ///
    /// Cargo's output when the build fails.
    pub fn prepare(&self, profile: Profile) -> Result<(), String> {
        // One crate at a time, as they are timed: two together would unify their
        // dependencies' features, and the timed builds would compile those again.
        self.cargo(profile, &[Variant::Bare])?;
        self.cargo(profile, &[Variant::Contracted])
    }

    /// Touches `variant`'s main file and times its build in `profile`.
    ///
    /// # Errors
    ///
    /// Cargo's output when the build fails; an I/O error touching the file or reading the
    /// binary's size.
    pub fn time(&self, variant: Variant, profile: Profile) -> Result<Built, String> {
        let main = self.dir.join(variant.package()).join("src/main.rs");
        let file = std::fs::File::options()
            .append(true)
            .open(&main)
            .map_err(|e| format!("{}: {e}", main.display()))?;
        file.set_modified(std::time::SystemTime::now())
            .map_err(|e| format!("{}: {e}", main.display()))?;
        let cpu_before = children_cpu();
        let started = Instant::now();
        self.cargo(profile, &[variant])?;
        let time = started.elapsed();
        let cpu = children_cpu().saturating_sub(cpu_before);
        let binary = self
            .dir
            .join("target")
            .join(profile.name())
            .join(variant.package());
        let binary = std::fs::metadata(&binary)
            .map_err(|e| format!("{}: {e}", binary.display()))?
            .len();
        Ok(Built { time, cpu, binary })
    }

    /// Times `rounds` builds of each crate in `profile`, interleaved (bare, contracted,
    /// bare, …), after [`Generated::prepare`].
    ///
    /// # Errors
    ///
    /// As [`Generated::prepare`] and [`Generated::time`].
    pub fn compare(&self, profile: Profile, rounds: usize) -> Result<Comparison, String> {
        self.prepare(profile)?;
        let mut bare = Vec::new();
        let mut contracted = Vec::new();
        for _ in 0..rounds.max(1) {
            bare.push(self.time(Variant::Bare, profile)?);
            contracted.push(self.time(Variant::Contracted, profile)?);
        }
        Ok(Comparison::of(&bare, &contracted))
    }

    fn cargo(&self, profile: Profile, variants: &[Variant]) -> Result<(), String> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(&self.dir)
            .args(["build", "--offline", "--quiet"])
            .env("CARGO_TARGET_DIR", self.dir.join("target"))
            // A whole compile of the crate each time, not incremental compilation's reuse
            // of the last one (the dev profile's default).
            .env("CARGO_INCREMENTAL", "0")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        if profile == Profile::Release {
            command.arg("--release");
        }
        for variant in variants {
            command.args(["-p", variant.package()]);
        }
        let output = command.output().map_err(|e| format!("cargo: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "cargo build of {variants:?} ({}) failed:\n{}",
                profile.name(),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

/// Medians of the rounds: wall time, CPU time (seconds) and binary size (bytes), bare
/// and contracted.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    /// The bare crate's wall time (s), CPU time (s) and binary (bytes).
    pub bare: [f64; 3],
    /// The contracted crate's, likewise.
    pub contracted: [f64; 3],
}

impl Comparison {
    /// The medians of each side's rounds (the binary's size: the first round's; every
    /// round builds the same one).
    ///
    /// # Panics
    ///
    /// When either side has no round.
    #[must_use]
    pub fn of(bare: &[Built], contracted: &[Built]) -> Comparison {
        let medians = |builds: &[Built]| {
            let median = |of: fn(&Built) -> Duration| {
                let mut times: Vec<Duration> = builds.iter().map(of).collect();
                times.sort();
                times[times.len() / 2].as_secs_f64()
            };
            [
                median(|b| b.time),
                median(|b| b.cpu),
                builds[0].binary as f64,
            ]
        };
        Comparison {
            bare: medians(bare),
            contracted: medians(contracted),
        }
    }

    /// What the handlers between `smaller`'s count and this row's add, per handler set:
    /// the ratio of the two differences is the cost of one contracted handler against
    /// one bare, without what both counts share (the runtime, `main`, the link).
    #[must_use]
    pub fn minus(self, smaller: Comparison) -> Comparison {
        let sub = |a: [f64; 3], b: [f64; 3]| [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
        Comparison {
            bare: sub(self.bare, smaller.bare),
            contracted: sub(self.contracted, smaller.contracted),
        }
    }

    /// Contracted over bare: wall time, CPU time, binary.
    #[must_use]
    pub fn ratios(&self) -> [f64; 3] {
        let [b, bc, bb] = self.bare;
        let [c, cc, cb] = self.contracted;
        [c / b, cc / bc, cb / bb]
    }

    /// A row of the benchmark's markdown table.
    pub fn print(&self, profile: &str, handlers: &str) {
        let [b, bc, bb] = self.bare;
        let [c, cc, cb] = self.contracted;
        let mb = |bytes: f64| bytes / 1_000_000.0;
        println!(
            "| {profile} | {handlers} | {b:.2} s | {c:.2} s | **{:.2}** | {bc:.2} s | {cc:.2} s | **{:.2}** | {:.2} MB | {:.2} MB | **{:.2}** |",
            c / b,
            cc / bc,
            mb(bb),
            mb(cb),
            cb / bb,
        );
    }
}

/// The checkout of idem the contracted crate is built against: `IDEM_BENCH_IDEM`, or this
/// repository.
#[must_use]
pub fn repository() -> PathBuf {
    let repository = std::env::var_os("IDEM_BENCH_IDEM").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
        PathBuf::from,
    );
    repository.canonicalize().unwrap_or(repository)
}

/// The target directory the running bench binary was built into
/// (`<target>/<profile>/deps/<binary>`), where the generated workspace is kept.
///
/// # Panics
///
/// When the binary does not live three levels below a directory.
#[must_use]
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench binary's path");
    exe.ancestors()
        .nth(3)
        .map(PathBuf::from)
        .expect("the bench binary lives in <target>/<profile>/deps")
}

/// The CPU time (user and system) of this process's children that have ended, and of
/// theirs: `cutime` and `cstime` of `/proc/self/stat`, in clock ticks (Linux's `USER_HZ`,
/// 100 a second on every architecture it exposes to user space). Zero where there is no
/// `/proc`.
fn children_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // The command name (field 2) may hold spaces; the fields after it follow its `)`.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 16 and 17 of the file, counted from the state (field 3) as 0.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(13) + ticks(14)) * 10)
}

/// Writes `contents` unless the file holds them already (so that an unchanged crate keeps
/// its mtime and is not rebuilt by the untimed build).
fn write_if_changed(path: &Path, contents: &str) -> io::Result<()> {
    if std::fs::read(path).ok().as_deref() == Some(contents.as_bytes()) {
        return Ok(());
    }
    std::fs::write(path, contents)
}

const WORKSPACE: &str = r#"[workspace]
members = ["handlers-bare", "handlers-contracted"]
resolver = "3"

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
"#;

fn manifest(variant: Variant, repository: &Path) -> String {
    let idem = match variant {
        Variant::Bare => String::new(),
        Variant::Contracted => format!(
            "idem = {{ path = {:?}, default-features = false, features = [\"server\"] }}\n",
            repository.display().to_string()
        ),
    };
    format!(
        r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
{idem}axum = {{ version = "0.8", default-features = false, features = ["http1", "json", "tokio"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tokio = {{ version = "1", features = ["rt-multi-thread", "macros", "net"] }}
"#,
        name = variant.package()
    )
}

/// The service: `handlers` handlers and a `main` that routes them all.
fn main_rs(variant: Variant, handlers: usize) -> String {
    let mut out = String::from(PRELUDE);
    if variant == Variant::Contracted {
        out.push_str(LOOKUP);
    }
    for i in 0..handlers {
        let attribute = match variant {
            Variant::Bare => String::new(),
            Variant::Contracted => CONTRACT.to_owned(),
        };
        let _ = write!(out, "{}", handler(i, &attribute));
    }
    out.push_str("\nfn router(app: App) -> Router {\n    Router::new()\n");
    for i in 0..handlers {
        let _ = writeln!(out, "        .route(\"/orders/{i}\", post(create_{i}))");
    }
    if variant == Variant::Contracted {
        out.push_str("        .route(\"/orders/0/{key}\", get(lookup))\n");
    }
    out.push_str("        .with_state(app)\n}\n");
    out.push_str(match variant {
        Variant::Bare => MAIN_BARE,
        Variant::Contracted => MAIN_CONTRACTED,
    });
    out
}

fn handler(i: usize, attribute: &str) -> String {
    format!(
        r#"
#[derive(Debug, Deserialize)]
pub struct Order{i} {{
    pub customer_id: String,
    pub amount_minor: u64,
}}

{attribute}pub async fn create_{i}(State(app): State<App>, Json(order): Json<Order{i}>) -> Response {{
    let id = app.orders.fetch_add(1, Ordering::Relaxed);
    let body = serde_json::json!({{
        "id": id, "customer_id": order.customer_id, "amount_minor": order.amount_minor,
    }});
    (StatusCode::CREATED, [(LOCATION, format!("/orders/{i}/{{id}}"))], Json(body)).into_response()
}}
"#
    )
}

const PRELUDE: &str = r#"//! Generated by idem-bench's `build` benchmark: do not edit.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;
use axum::http::header::LOCATION;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, extract::State};
use serde::Deserialize;

#[derive(Clone, Default)]
pub struct App {
    orders: Arc<AtomicU64>,
}
"#;

const LOOKUP: &str = r#"
pub async fn lookup(
    lookup: idem::Lookup<create_0::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}
"#;

const CONTRACT: &str = r#"#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/build"),
)]
"#;

const MAIN_BARE: &str = r#"
#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    axum::serve(listener, router(App::default())).await.unwrap();
}
"#;

const MAIN_CONTRACTED: &str = r#"
#[tokio::main]
async fn main() {
    let idem = idem::Idem::new(idem::MemoryStore::new(), idem::identity::header("x-client-id"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    axum::serve(listener, router(App::default()).layer(idem.layer())).await.unwrap();
}
"#;
