//! What the tests of the orders service share: the real binary started as a separate
//! process on a free port of 127.0.0.1, the HTTP client and requests, and a PostgreSQL
//! server of a test's own (for the outage tests, which stop it).
//!
//! Each test file uses a part of it.
#![allow(dead_code, reason = "each test binary uses a part of the helpers")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

/// The service binary, started on a free port of 127.0.0.1; killed when dropped.
pub struct Service {
    child: Child,
    /// `http://127.0.0.1:<port>`, as the service printed it.
    pub url: String,
    /// The lines the service writes to standard error (also passed on to ours).
    stderr: mpsc::Receiver<String>,
}

impl Service {
    /// `orders --db <db> <extra>` (records and orders in the SQLite file).
    pub fn start(db: &Path, extra: &[&str]) -> Service {
        Service::start_with(db, extra, &[])
    }

    /// [`Service::start`], with more environment.
    pub fn start_with(db: &Path, extra: &[&str], env: &[(&str, &str)]) -> Service {
        let db = db.to_str().expect("a UTF-8 temporary path");
        let mut args = vec!["--db", db];
        args.extend_from_slice(extra);
        Service::spawn(&args, env)
    }

    /// `orders --store postgres` on the database at `url` (passed as `DATABASE_URL`).
    pub fn postgres(url: &str, env: &[(&str, &str)]) -> Service {
        let mut env = env.to_vec();
        env.push(("DATABASE_URL", url));
        Service::spawn(&["--store", "postgres"], &env)
    }

    /// `orders --store redis`: records at `redis_url` (`REDIS_URL`), orders at
    /// `database_url` (`DATABASE_URL`).
    pub fn redis(redis_url: &str, database_url: &str) -> Service {
        Service::redis_with(redis_url, database_url, &[])
    }

    /// [`Service::redis`] with more of the environment (a fault point).
    pub fn redis_with(redis_url: &str, database_url: &str, env: &[(&str, &str)]) -> Service {
        let mut env = env.to_vec();
        // A claim on a cluster waits for its replica: long enough for a loaded test
        // machine, where a replica may not run for a while.
        env.extend([
            ("REDIS_URL", redis_url),
            ("DATABASE_URL", database_url),
            ("REDIS_REPLICA_WAIT", "5s"),
        ]);
        Service::spawn(&["--store", "redis"], &env)
    }

    /// `orders --addr 127.0.0.1:0 <args>`, with `env` (and no inherited
    /// `IDEM_FAULT_POINT`, `DATABASE_URL` or `REDIS_URL`); returns once the service printed the
    /// address it listens on.
    ///
    /// # Panics
    ///
    /// When the binary does not start or prints no address (it exited: its standard
    /// error, passed on to ours, says why).
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("IDEM_FAULT_POINT")
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("REDIS_REPLICA_WAIT")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the orders binary starts");
        let (lines, stderr) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("orders: {line}");
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the service prints its address");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Service { child, url, stderr }
    }

    /// Waits (at most 20 s) until the service writes a line containing `text` to
    /// standard error.
    pub fn wait_for_stderr(&self, text: &str) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(_) => panic!("the service never wrote {text:?}"),
            }
        }
    }

    /// Kills the process at once with SIGKILL, as a crash would.
    pub fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` `orders --store redis` processes with their records on a Redis Cluster of the
/// test's own (3 masters, a replica each) and their orders in a scratch PostgreSQL
/// database: the cluster, the database's URL and the processes; `None` (after saying
/// why) when either cannot be had.
pub async fn on_a_cluster(
    n: usize,
    what: &str,
) -> Option<(
    idem_runtime::store::conformance::redis::OwnCluster,
    String,
    Vec<Service>,
)> {
    let cluster = idem_runtime::store::conformance::redis::OwnCluster::start(3, 1)?;
    let url = idem_runtime::store::conformance::postgres::scratch_url(what).await?;
    let services = (0..n)
        .map(|_| Service::redis(&cluster.url(), &url))
        .collect();
    Some((cluster, url, services))
}

/// The orders table at `url`, read directly: each order's id by its idempotency key.
pub async fn orders_by_key(url: &str) -> std::collections::HashMap<String, String> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT idempotency_key, id FROM orders ORDER BY idempotency_key")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().collect()
}

/// An HTTP client with a 20 s timeout and without reqwest's own retries (the tests
/// decide every retry).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .retry(reqwest::retry::never())
        .build()
        .unwrap()
}

/// An order of `amount` minor units.
pub fn order(amount: i64) -> Value {
    json!({
        "customer_id": "cus_42",
        "currency": "EUR",
        "amount_minor": amount,
        "items": [{ "sku": "book-1", "qty": 2 }]
    })
}

/// An answer, read to the end.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub body: bytes::Bytes,
}

impl Reply {
    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header, when it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether this is a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem's `type` (empty when there is none).
    pub fn problem_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// `POST /orders` to `service` as the client `acme`.
///
/// # Panics
///
/// When the service does not answer.
pub async fn post(
    http: &reqwest::Client,
    service: &Service,
    key: Option<&str>,
    body: &Value,
) -> Reply {
    try_post(http, &service.url, key, body)
        .await
        .expect("the service answers")
}

/// `POST {url}/orders` as the client `acme`; the error when no answer came (the
/// connection was refused or closed: the process died).
pub async fn try_post(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> Result<Reply, reqwest::Error> {
    let mut request = http
        .post(format!("{url}/orders"))
        .header("x-client-id", "acme")
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await?;
    Ok(Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await?,
    })
}

/// A temporary folder and the path of `orders.db` in it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    (dir, db)
}

/// A PostgreSQL server of a test's own, in a temporary folder, on a free port of
/// 127.0.0.1 with trust authentication: for tests that stop the server under load
/// (never the shared one on 5432). Stopped (`immediate`) when dropped.
pub struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// Whether the tools run as the `postgres` OS user (the tests run as root, which
    /// PostgreSQL refuses).
    as_postgres: bool,
}

impl OwnPostgres {
    /// Creates the cluster (`initdb`) and starts it, or `None` (after saying why) when
    /// `initdb` cannot be found.
    ///
    /// # Panics
    ///
    /// Under `CI=true` when `initdb` cannot be found (a skip is a failure there); when
    /// `initdb` or `pg_ctl start` fails.
    pub fn start(what: &str) -> Option<OwnPostgres> {
        let Some(bin) = find_pg_bin() else {
            let why = "initdb is not on the PATH nor under /usr/lib/postgresql/*/bin";
            assert!(
                !skips_fail(),
                "{what}: {why}; under CI=true a skipped test is a failure"
            );
            eprintln!("skipped {what}: {why} (apt-get install postgresql)");
            return None;
        };
        let as_postgres = is_root();
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()))
                .unwrap_or_else(|e| panic!("{what}: cannot give the folder to postgres: {e}"));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let server = OwnPostgres {
            dir,
            bin,
            port,
            as_postgres,
        };
        let data = server.data();
        server
            .tool(
                "initdb",
                &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
            )
            .unwrap_or_else(|e| panic!("{what}: initdb failed: {e}"));
        server
            .start_again()
            .unwrap_or_else(|e| panic!("{what}: pg_ctl start failed: {e}"));
        Some(server)
    }

    /// The server's URL, as the service takes it in `DATABASE_URL`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`), as a crash of the server
    /// would; returns when it is down.
    ///
    /// # Errors
    ///
    /// What `pg_ctl` said.
    pub fn stop_immediate(&self) -> Result<(), String> {
        self.tool(
            "pg_ctl",
            &["-D", &self.data(), "stop", "-m", "immediate", "-w"],
        )
    }

    /// Starts the server (again) on its port; returns when it accepts connections.
    ///
    /// # Errors
    ///
    /// What `pg_ctl` said.
    pub fn start_again(&self) -> Result<(), String> {
        let dir = self.dir.path().display().to_string();
        let options = format!(
            "-p {} -k {dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port
        );
        let log = format!("{dir}/server.log");
        self.tool(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &options,
                "start",
                "-w",
                "-t",
                "30",
            ],
        )
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Runs the PostgreSQL tool `name` with `args`, as the `postgres` user when needed.
    fn tool(&self, name: &str, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(name);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command.args(args).current_dir(self.dir.path());
        run(&mut command)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.stop_immediate();
    }
}

/// Whether a skipped test must fail (`CI` is `true` or `1`).
pub fn skips_fail() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs `command`; its standard error when it fails.
fn run(command: &mut Command) -> Result<(), String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The folder of `initdb` and `pg_ctl`: on the PATH, or the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian keeps them there).
fn find_pg_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()));
    if let Some(dir) = on_path {
        // A symbolic link (`/usr/local/bin/initdb`) names the folder of its siblings.
        let real = std::fs::canonicalize(dir.join("initdb")).ok();
        return Some(
            real.and_then(|p| p.parent().map(Path::to_path_buf))
                .unwrap_or(dir),
        );
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Whether this process runs as root.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}
