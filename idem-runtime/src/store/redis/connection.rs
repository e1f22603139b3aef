//! The connection of a [`RedisStore`](super::RedisStore): one server, or a Redis Cluster
//! through the `redis` crate's cluster client.
//!
//! A URL names one server (`redis://host:port`) or several seed nodes of one cluster,
//! comma-separated (`redis://h1:p1,redis://h2:p2`). One URL of a node that runs in
//! cluster mode (`cluster_enabled:1` in `INFO cluster`) is a cluster too: the store then
//! learns every node from it.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use crate::store::StoreError;

/// The connection a [`RedisStore`](super::RedisStore) talks through. Both kinds are
/// [`ConnectionLike`]: commands and scripts run on either the same way, and on a cluster
/// each goes to the master of its keys' hash slot (following `MOVED` and `ASK`).
///
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server: one multiplexed connection, re-established after it breaks.
    Server(ConnectionManager),
    /// A Redis Cluster: a connection per node, the slot map refreshed when it changes.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConnection::Server(_) => "RedisConnection::Server",
            RedisConnection::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Server(conn) => conn.req_packed_command(cmd),
            RedisConnection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Server(conn) => conn.get_db(),
            RedisConnection::Cluster(conn) => conn.get_db(),
        }
    }
}

/// How long the connection waits: to connect, and for each answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Waits {
    pub(super) connect: Duration,
    pub(super) response: Duration,
}

/// A master of a cluster, by the address the cluster gives for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Master {
    pub(super) host: String,
    pub(super) port: u16,
    /// How many replicas it has that are not failing.
    pub(super) replicas: usize,
    /// The hash slots it serves, as inclusive ranges.
    pub(super) slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether it serves `slot`.
    pub(super) fn serves(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&slot))
    }
}

/// The hash slot of `name` on a cluster: CRC16 (XMODEM) of its hash tag — the text
/// between its first `{` and the first `}` after it, when not empty — or of the whole
/// name, modulo 16384 (the Redis Cluster specification).
pub(super) fn slot_of(name: &[u8]) -> u16 {
    let tagged = name.iter().position(|b| *b == b'{').and_then(|open| {
        let close = name[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &name[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(name)) % 16384
}

impl RedisConnection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConnection::Cluster(_))
    }

    /// Connects to `url`: one server, or the cluster its seed nodes (comma-separated)
    /// belong to, or the cluster its one node belongs to.
    pub(super) async fn open(
        url: &str,
        waits: Waits,
        probing: Option<redis::io::tcp::TcpSettings>,
    ) -> Result<RedisConnection, StoreError> {
        let mut seeds = url
            .split(',')
            .map(str::trim)
            .filter(|seed| !seed.is_empty())
            .map(|seed| seed.into_connection_info().map_err(StoreError::unavailable))
            .collect::<Result<Vec<ConnectionInfo>, _>>()?;
        if let Some(probing) = probing {
            seeds = seeds
                .into_iter()
                .map(|info| info.set_tcp_settings(probing.clone()))
                .collect();
        }
        match seeds.len() {
            0 => Err(StoreError::unavailable("the Redis URL names no server")),
            1 => {
                let server = server(seeds[0].clone(), waits).await?;
                if cluster_enabled(server.clone(), waits.response).await {
                    cluster(seeds, waits).await
                } else {
                    Ok(server)
                }
            }
            _ => cluster(seeds, waits).await,
        }
    }

    /// Runs `cmd` on the master that holds `name`'s hash slot (on one server, on it).
    pub(super) async fn on_master_of(&mut self, name: &str, cmd: Cmd) -> redis::RedisResult<Value> {
        match self {
            RedisConnection::Server(conn) => cmd.query_async(conn).await,
            RedisConnection::Cluster(conn) => {
                let route = Route::with_key(name.as_bytes(), SlotAddr::Master);
                conn.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }

    /// Runs `cmd` on `master` (on one server, on it).
    pub(super) async fn on(&mut self, master: &Master, cmd: Cmd) -> redis::RedisResult<Value> {
        match self {
            RedisConnection::Server(conn) => cmd.query_async(conn).await,
            RedisConnection::Cluster(conn) => {
                let routing = SingleNodeRoutingInfo::ByAddress {
                    host: master.host.clone(),
                    port: master.port,
                };
                conn.route_command(cmd, RoutingInfo::SingleNode(routing))
                    .await
            }
        }
    }

    /// The cluster's masters that are not failing, from `CLUSTER NODES` asked of any
    /// node; one server is its own master (asked nothing: its address and replicas are
    /// not needed, [`RedisConnection::on`] runs on it).
    pub(super) async fn masters(&mut self) -> redis::RedisResult<Vec<Master>> {
        match self {
            RedisConnection::Server(_) => Ok(vec![Master {
                host: String::new(),
                port: 0,
                replicas: 0,
                slots: vec![(0, 16383)],
            }]),
            RedisConnection::Cluster(conn) => {
                let nodes = conn
                    .route_command(
                        redis::cmd("CLUSTER").arg("NODES").clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                let text: String = redis::from_redis_value(nodes)?;
                Ok(parse_masters(&text))
            }
        }
    }
}

/// One server's connection, checked to answer within `waits`.
async fn server(info: ConnectionInfo, waits: Waits) -> Result<RedisConnection, StoreError> {
    let client = redis::Client::open(info).map_err(StoreError::unavailable)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(waits.connect))
        .set_response_timeout(Some(waits.response))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_millis(500));
    let conn = tokio::time::timeout(
        waits.response,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| StoreError::unavailable("the Redis server did not answer in time"))?
    .map_err(StoreError::unavailable)?;
    Ok(RedisConnection::Server(conn))
}

/// A cluster connection from its seed nodes. Each call follows `MOVED` and `ASK` and
/// retries a node that failed a few times (100 ms to 1 s apart), within the call timeout
/// of the store around it.
async fn cluster(seeds: Vec<ConnectionInfo>, waits: Waits) -> Result<RedisConnection, StoreError> {
    let client = ClusterClientBuilder::new(seeds)
        .connection_timeout(waits.connect)
        .response_timeout(waits.response)
        .retries(4)
        .min_retry_wait(100)
        .max_retry_wait(1000)
        .build()
        .map_err(StoreError::unavailable)?;
    let conn = tokio::time::timeout(waits.response, client.get_async_connection())
        .await
        .map_err(|_| StoreError::unavailable("the Redis cluster did not answer in time"))?
        .map_err(StoreError::unavailable)?;
    Ok(RedisConnection::Cluster(conn))
}

/// Whether the server runs in cluster mode; a server that refuses `INFO` is taken for one
/// server.
async fn cluster_enabled(mut server: RedisConnection, limit: Duration) -> bool {
    let answer = tokio::time::timeout(
        limit,
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut server),
    )
    .await;
    matches!(answer, Ok(Ok(info)) if info_field(&info, "cluster_enabled") == Some("1"))
}

/// The value of `field` in an `INFO` answer (`field:value` lines).
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// The masters of a `CLUSTER NODES` answer: each node flagged `master` that serves slots
/// (failing or not: a master whose slots no replica took over yet is still theirs) or is
/// not failing, with its replicas that are not failing. A line is `<id>
/// <ip:port@cport[,hostname]> <flags> <master id or -> <ping> <pong> <epoch> <link>
/// <slot>…`.
fn parse_masters(nodes: &str) -> Vec<Master> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.len() >= 8)
        .collect();
    let failing = |flags: &str| flags.split(',').any(|f| f == "fail" || f == "fail?");
    lines
        .iter()
        .filter(|f| f[2].split(',').any(|flag| flag == "master"))
        // A master that serves slots is one, failing or not (its calls fail, and say
        // so); one that serves none is an old master a replica replaced.
        .filter(|f| f.len() > 8 || !failing(f[2]))
        .filter_map(|f| {
            let address = f[1].split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            let replicas = lines
                .iter()
                .filter(|r| r[3] == f[0] && !failing(r[2]))
                .count();
            // Slots are `a-b`, `a`, or a slot being moved (`[a->-id]`, `[a-<-id]`).
            let slots = f[8..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    Some((lo.parse().ok()?, hi.parse().ok()?))
                })
                .collect();
            Some(Master {
                host: host.to_owned(),
                port: port.parse().ok()?,
                replicas,
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7001@17001 master - 0 1700 2 connected 5461-10922
a3 127.0.0.1:7002@17002 master,fail - 0 1700 3 connected 10923-16383
b1 127.0.0.1:7003@17003 slave a1 0 1700 1 connected
b2 127.0.0.1:7004@17004,node-4 slave,fail a2 0 1700 2 connected
b3 127.0.0.1:7005@17005 master - 0 1700 7 connected 10923-16383
";
        let masters = parse_masters(nodes);
        let seen: Vec<(u16, usize)> = masters.iter().map(|m| (m.port, m.replicas)).collect();
        assert_eq!(seen, [(7000, 1), (7001, 0), (7002, 0), (7005, 0)]);
        assert_eq!(masters[0].slots, [(0, 5460)]);
        assert!(masters[3].serves(16383) && !masters[3].serves(10922));
        let replaced = "a3 127.0.0.1:7002@17002 master,fail - 0 1700 3 disconnected\n";
        assert!(
            parse_masters(replaced).is_empty(),
            "an old master without slots"
        );
        assert!(masters.iter().all(|m| m.host == "127.0.0.1"));
        assert!(parse_masters("").is_empty());
        assert!(parse_masters("garbage\nmore garbage here\n").is_empty());
    }

    #[test]
    fn info_fields_are_found_by_name() {
        let info = "# Cluster\r\ncluster_enabled:1\r\n";
        assert_eq!(info_field(info, "cluster_enabled"), Some("1"));
        assert_eq!(info_field(info, "cluster"), None);
    }

    /// The slots of the specification's examples, and tags as Redis reads them.
    #[test]
    fn slots_follow_the_cluster_specification() {
        assert_eq!(slot_of(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(
            slot_of(b"foo{}{bar}"),
            slot_of(b"bar"),
            "an empty tag is no tag"
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
    }
}
