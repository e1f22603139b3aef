//! The parent's handle on the servers: one child process per variant, killed when the
//! handle is dropped (at the end, and when a panic unwinds the driver).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::serve::{SERVE_ENV, Variant};

/// One running server.
pub struct Server {
    /// What it serves.
    pub variant: Variant,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its process id, for `perf record -p`.
    pub pid: u32,
    child: Child,
    /// Held open: the child exits when it reads end of file here.
    _stdin: Option<ChildStdin>,
}

/// The servers of a run; dropping it kills them.
pub struct Servers(pub Vec<Server>);

impl Servers {
    /// Starts one child per variant (this same executable with [`SERVE_ENV`] set) and
    /// reads each one's port.
    ///
    /// # Panics
    ///
    /// When a child cannot start or prints no port; the children already started are
    /// killed.
    #[must_use]
    pub fn start(variants: &[Variant], clients: usize) -> Servers {
        let exe = std::env::current_exe().expect("the path of the bench executable");
        let mut servers = Servers(Vec::new());
        for &variant in variants {
            let mut child = Command::new(&exe)
                .env(SERVE_ENV, variant.name())
                .env("IDEM_BENCH_CLIENTS", clients.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap_or_else(|e| panic!("start the {} server: {e}", variant.name()));
            let pid = child.id();
            let stdin = child.stdin.take();
            let stdout = child.stdout.take();
            // Pushed before reading the port, so that a failure below still kills it.
            servers.0.push(Server {
                variant,
                url: String::new(),
                pid,
                child,
                _stdin: stdin,
            });
            let mut line = String::new();
            if let Some(stdout) = stdout {
                let _ = BufReader::new(stdout).read_line(&mut line);
            }
            let port: u16 = line.trim().parse().unwrap_or_else(|_| {
                panic!(
                    "the {} server (pid {pid}) printed no port (got {line:?})",
                    variant.name()
                )
            });
            if let Some(server) = servers.0.last_mut() {
                server.url = format!("http://127.0.0.1:{port}");
            }
        }
        servers
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for server in &mut self.0 {
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
    }
}
