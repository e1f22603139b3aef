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

/// A Redis Cluster of the test's own: masters and replicas as `redis-server` processes
/// on free ports of 127.0.0.1 (each with its cluster bus port, + 10000, free too), in a
/// scratch directory, without persistence, a node timeout of 1 s (a replica takes over
/// within a few seconds of its master's death), `cluster-require-full-coverage no`
/// (a failing master stops its own slots only) and no delay before a replica's first
/// sync. Every node is killed (SIGKILL) when it
/// is dropped.
#[derive(Debug)]
pub struct OwnCluster {
    nodes: Vec<ClusterNode>,
    dir: std::path::PathBuf,
}

#[derive(Debug)]
struct ClusterNode {
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnCluster {
    /// Starts `masters` masters with `replicas` replicas each and joins them
    /// (`redis-cli --cluster create`), then waits until every node says
    /// `cluster_state:ok` and every master has its replicas. `None` (after saying why)
    /// when `redis-server` or `redis-cli` is not installed.
    ///
    /// # Panics
    ///
    /// When a node does not start or the cluster does not form within 30 s; when
    /// `redis-server` is missing under `CI=true`.
    pub fn start(masters: usize, replicas: usize) -> Option<OwnCluster> {
        let installed = ["redis-server", "redis-cli"].iter().all(|tool| {
            std::process::Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        if !installed {
            assert!(
                !super::skips_fail(),
                "redis-server and redis-cli are not installed; under CI=true a skipped store test is a failure"
            );
            eprintln!(
                "skipped: redis-server or redis-cli is not installed (apt-get install redis-server)"
            );
            return None;
        }
        let count = masters * (1 + replicas);
        let base = free_ports(count);
        let dir =
            std::env::temp_dir().join(format!("idem-cluster-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let mut cluster = OwnCluster {
            nodes: (0..count)
                .map(|i| ClusterNode {
                    port: base + u16::try_from(i).expect("a few nodes"),
                    child: None,
                })
                .collect(),
            dir,
        };
        for i in 0..count {
            cluster.start_node(i);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        // `timeout` (coreutils): a cluster that never joins fails the test, not hangs it.
        let created = std::process::Command::new("timeout")
            .args(["60", "redis-cli"])
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        cluster.wait_until_ok(masters, replicas, std::time::Duration::from_secs(30));
        Some(cluster)
    }

    fn start_node(&mut self, i: usize) {
        let port = self.nodes[i].port.to_string();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--cluster-replica-validity-factor", "0"])
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.nodes[i].child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.cli(self.nodes[i].port, &["PING"]).trim() != "PONG" {
            let exited = self.nodes[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(exited.is_none(), "node {port} exited: {exited:?}");
            assert!(
                std::time::Instant::now() < deadline,
                "node {port} did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Seed URLs of every node, comma-separated: what `RedisStore::connect` takes.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A store on the cluster (its [`OwnCluster::url`]) whose claims wait for a replica
    /// up to 5 s rather than the default 500 ms, where the cluster has replicas: a
    /// loaded test machine may not run a replica for a while, and a test of the store
    /// must not fail for it.
    ///
    /// # Panics
    ///
    /// When the cluster does not answer.
    pub async fn store(&self) -> RedisStore {
        let store = RedisStore::connect(&self.url())
            .await
            .unwrap_or_else(|e| panic!("the test's cluster: {e}"));
        let wait = store.replica_wait().map(|wait| crate::store::ReplicaWait {
            timeout: std::time::Duration::from_secs(5),
            ..wait
        });
        store.with_replica_wait(wait)
    }

    /// The URL of one node (a single seed).
    pub fn node_url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[i].port)
    }

    /// The port of node `i` (in the order they were started).
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The port of the master that holds `name`'s hash slot now.
    ///
    /// # Panics
    ///
    /// When no live node answers.
    pub fn master_of(&self, name: &str) -> u16 {
        let node = self.live().next().expect("a live node");
        let slot: u16 = self
            .cli(node, &["CLUSTER", "KEYSLOT", name])
            .trim()
            .parse()
            .expect("a slot");
        let nodes = self.cli(node, &["CLUSTER", "NODES"]);
        nodes
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let serves = fields.iter().skip(8).any(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
                });
                let port = fields.get(1)?.split(['@', ',']).next()?.rsplit_once(':')?.1;
                serves.then(|| port.parse().ok()).flatten()
            })
            .expect("a master serves every slot")
    }

    /// Kills the node on `port` with SIGKILL.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until a replica has taken over from every killed master: every live node
    /// says `cluster_state:ok`, and in its view no slot is served by a killed node.
    ///
    /// # Panics
    ///
    /// When that takes longer than `limit`.
    pub fn wait_for_failover(&self, limit: std::time::Duration) {
        let killed: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_none())
            .map(|n| format!("127.0.0.1:{}@", n.port))
            .collect();
        let deadline = std::time::Instant::now() + limit;
        loop {
            let ok = self.live().all(|port| {
                let info = self.cli(port, &["CLUSTER", "INFO"]);
                let nodes = self.cli(port, &["CLUSTER", "NODES"]);
                info.contains("cluster_state:ok")
                    && !nodes.lines().any(|line| {
                        killed.iter().any(|k| line.contains(k.as_str()))
                            && line.split_whitespace().count() > 8
                    })
            });
            if ok {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no failover within {limit:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn wait_until_ok(&self, masters: usize, replicas: usize, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let formed = self.live().all(|port| {
                self.cli(port, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            });
            // Connected is not enough: a replica counts for `WAIT` once its first sync
            // is over (`state=online`).
            let replicated = self.live().all(|port| {
                let info = self.cli(port, &["INFO", "replication"]);
                !info.contains("role:master") || info.matches("state=online").count() == replicas
            });
            let nodes = self.cli(self.nodes[0].port, &["CLUSTER", "NODES"]);
            let masters_seen = nodes.lines().filter(|l| l.contains("master")).count();
            if formed && replicated && masters_seen == masters {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster did not form within {limit:?}:\n{nodes}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn live(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        std::process::Command::new("timeout")
            .args(["5", "redis-cli", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first of `count` consecutive ports of 127.0.0.1 that are free, with their cluster
/// bus ports (+ 10000) free too: nodes between 20000 and 22700, bus ports between 30000
/// and 32700, both below Linux's ephemeral ports (from 32768), which an outgoing
/// connection could take between this check and the node's start.
fn free_ports(count: usize) -> u16 {
    let count = u16::try_from(count).expect("a few nodes");
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    // Start somewhere different for each process and each cluster of a process, so that
    // clusters started at once do not try the same ports.
    static STARTED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = u16::try_from(std::process::id() % 90).unwrap_or(0) * 30 + nth * 10;
    (0..270u16)
        .map(|i| 20_000 + (start + i * 10) % 2_700)
        .find(|base| (0..count).all(|i| free(base + i) && free(base + i + 10_000)))
        .expect("free ports for a cluster")
}
