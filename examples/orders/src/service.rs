//! Starting the service: the database, idem's store and handle, the router.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::api::{self, App, CLIENT_ID_HEADER, Demo};
use crate::db;

/// How often expired idempotency records are purged.
pub const PURGE_EVERY: Duration = Duration::from_secs(60);

/// What the service needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    /// The SQLite file that holds orders and idem's records; created if missing.
    pub db: PathBuf,
    /// See [`Demo::delay`].
    pub delay: Duration,
    /// See [`Demo::outage`].
    pub outage: u32,
}

/// A service ready to serve: its router and the handles behind it.
pub struct Service {
    /// The router, with its state.
    pub router: Router,
    /// idem's handle (its store is the SQLite file).
    pub idem: idem::Idem,
    /// The service's state.
    pub app: App,
}

impl Service {
    /// Opens the database (creating the file and tables if missing) and builds the router.
    ///
    /// # Errors
    ///
    /// When the SQLite file cannot be opened or its tables created.
    pub async fn open(
        config: &Config,
    ) -> Result<Service, Box<dyn std::error::Error + Send + Sync>> {
        let store = idem::SqliteStore::open(&config.db).await?;
        let pool = store.pool().clone();
        db::migrate(&pool).await?;
        // Transactional: an order and its key's final state commit together.
        let idem = idem::Idem::transactional(store, idem::identity::header(CLIENT_ID_HEADER));
        let app = App {
            db: pool,
            demo: Arc::new(Demo {
                delay: config.delay,
                outage: config.outage.into(),
            }),
        };
        let router = api::router(&idem).with_state(app.clone());
        Ok(Service { router, idem, app })
    }

    /// Serves on `listener` until `shutdown` completes, purging expired keys meanwhile.
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
        let result = axum::serve(listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
        purger.abort();
        self.app.db.close().await;
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
