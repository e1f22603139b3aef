//! Starting the service: the backend (idem's store and the orders database), idem's
//! handle, the router.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use idem::IdemBuilder;
use tokio::net::TcpListener;

use crate::api::{self, App, CLIENT_ID_HEADER, Demo, Writes};
use crate::db::{self, Orders};

/// How often expired idempotency records are purged.
pub const PURGE_EVERY: Duration = Duration::from_secs(60);

/// How often the reconciler looks for attempts whose lease ended without an outcome.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// Where idem's records and the orders live: the `--store` of the command line.
#[derive(Clone, Debug)]
pub enum Backend {
    /// Records and orders in one SQLite file (created if missing), transactional: an
    /// order and its key's final state commit together.
    Sqlite {
        /// The SQLite file.
        db: PathBuf,
    },
    /// Records and orders in one PostgreSQL database, transactional; any number of
    /// instances may share it.
    Postgres {
        /// The server, such as `postgres://user@host/db?sslmode=disable`.
        url: String,
    },
    /// Records in this process's memory (lost when it stops: a retry after a restart
    /// runs again), orders in a SQLite file; not transactional.
    Memory {
        /// The SQLite file of the orders.
        db: PathBuf,
    },
    /// Records in Redis, orders in PostgreSQL; not transactional. Any number of instances
    /// may share them.
    Redis {
        /// The Redis server, such as `redis://127.0.0.1:6379`.
        redis_url: String,
        /// The PostgreSQL server of the orders.
        database_url: String,
        /// On a cluster with replicas, how long a claim waits for one (zero: none).
        replica_wait: Duration,
    },
}

impl Backend {
    /// Where the records and the orders live, for the start-up line (no secrets: URLs
    /// are not shown).
    pub fn describe(&self) -> String {
        match self {
            Backend::Sqlite { db } => {
                format!("records and orders in {}, transactional", db.display())
            }
            Backend::Postgres { .. } => {
                "records and orders in PostgreSQL (DATABASE_URL), transactional".to_owned()
            }
            Backend::Memory { db } => format!(
                "records in memory (lost on restart), orders in {}",
                db.display()
            ),
            Backend::Redis { .. } => {
                "records in Redis (REDIS_URL), orders in PostgreSQL (DATABASE_URL)".to_owned()
            }
        }
    }
}

/// Why the service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// idem's store cannot be opened.
    #[error("idem's store: {0}")]
    Store(#[from] idem::store::StoreError),
    /// The orders database cannot be used.
    #[error("the orders database: {0}")]
    Orders(#[from] db::MigrateError),
}

/// What the service needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the records and the orders live.
    pub backend: Backend,
    /// See [`Demo::delay`].
    pub delay: Duration,
    /// See [`Demo::outage`].
    pub outage: u32,
}

impl Config {
    /// `backend`, without the demo switches.
    pub fn new(backend: Backend) -> Config {
        Config {
            backend,
            delay: Duration::ZERO,
            outage: 0,
        }
    }
}

/// A service ready to serve: its router and the handles behind it.
pub struct Service {
    /// The router, with its state.
    pub router: Router,
    /// idem's handle.
    pub idem: idem::Idem,
    /// The service's state (its `orders` are the database that holds the orders).
    pub app: App,
}

impl Service {
    /// Opens the backend (creating the SQLite file and the tables if missing) and builds
    /// the router.
    ///
    /// # Errors
    ///
    /// When the store or the orders database cannot be opened.
    pub async fn open(config: &Config) -> Result<Service, OpenError> {
        Service::open_with(config, |settings| settings).await
    }

    /// [`Service::open`], with idem's settings changed by `settings` (such as
    /// `IdemBuilder::heartbeat`) before the handle is built.
    ///
    /// # Errors
    ///
    /// When the store or the orders database cannot be opened.
    pub async fn open_with(
        config: &Config,
        settings: impl FnOnce(IdemBuilder) -> IdemBuilder,
    ) -> Result<Service, OpenError> {
        let identity = || idem::identity::header(CLIENT_ID_HEADER);
        let demo = Demo {
            delay: config.delay,
            outage: config.outage.into(),
        };
        match &config.backend {
            // Transactional: an order and its key's final state commit together.
            Backend::Sqlite { db } => {
                let store = idem::SqliteStore::open(db).await?;
                let orders = Orders::Sqlite(store.pool().clone());
                db::sqlite::migrate(store.pool()).await?;
                let idem = settings(idem::Idem::transactional_builder(store, identity()));
                Ok(Service::build(idem, orders, Writes::InTransaction, demo))
            }
            Backend::Postgres { url } => {
                let store = idem::PostgresStore::connect(url).await?;
                let orders = Orders::Postgres(store.pool().clone());
                db::postgres::migrate(store.pool())
                    .await
                    .map_err(db::MigrateError::from)?;
                let idem = settings(idem::Idem::transactional_builder(store, identity()));
                Ok(Service::build(idem, orders, Writes::InTransaction, demo))
            }
            // Not transactional: the handler writes the order through the pool.
            Backend::Memory { db } => {
                let orders = Orders::open_sqlite(db).await?;
                let idem = settings(idem::Idem::builder(idem::MemoryStore::new(), identity()));
                Ok(Service::build(idem, orders, Writes::ThroughPool, demo))
            }
            // Not transactional either: Redis cannot commit with PostgreSQL.
            Backend::Redis {
                redis_url,
                database_url,
                replica_wait,
            } => {
                let store = idem::RedisStore::connect(redis_url).await?;
                // The store waits for a replica where it has them (a cluster); here only
                // for how long, or not at all.
                let wait = store.replica_wait().filter(|_| !replica_wait.is_zero());
                let store = store.with_replica_wait(wait.map(|w| idem::store::ReplicaWait {
                    timeout: *replica_wait,
                    ..w
                }));
                let orders = Orders::connect_postgres(database_url).await?;
                let idem = settings(idem::Idem::builder(store, identity()));
                Ok(Service::build(idem, orders, Writes::ThroughPool, demo))
            }
        }
    }

    /// A service whose records live in `store` and whose orders live in `orders`, not
    /// transactional: the handler writes each order through the pool, and
    /// [`reconcile_create_order`](crate::api::reconcile_create_order) decides an attempt
    /// that died between the order's commit and the record's.
    pub fn with_store(store: impl idem::store::Store, orders: Orders, demo: Demo) -> Service {
        let idem = idem::Idem::builder(store, idem::identity::header(CLIENT_ID_HEADER));
        Service::build(idem, orders, Writes::ThroughPool, demo)
    }

    fn build(idem: IdemBuilder, orders: Orders, writes: Writes, demo: Demo) -> Service {
        let app = App {
            orders,
            writes,
            demo: Arc::new(demo),
        };
        // The reconciler recovers an attempt that died without waiting for its client.
        let idem = idem
            .recover_with::<api::create_order::Operation, _>(&app)
            .build();
        let router = api::router(&idem).with_state(app.clone());
        Service { router, idem, app }
    }

    /// Serves on `listener` until `shutdown` completes, purging expired keys and
    /// recovering attempts whose lease ended (the reconciler) meanwhile.
    ///
    /// # Errors
    ///
    /// When the server fails.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let purger = self.idem.spawn_purger(PURGE_EVERY);
        let reconciler = self.idem.spawn_reconciler(RECONCILE_EVERY);
        // `idem::serve` closes a connection whose request head has not come within 10 s.
        let result = idem::serve(listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
        purger.abort();
        reconciler.abort();
        self.app.orders.close().await;
        result
    }

    /// The address a listener bound to `addr` serves on.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound.
    pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
        TcpListener::bind(addr).await
    }
}
