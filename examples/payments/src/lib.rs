//! The idem example on PostgreSQL: a payment service.
//!
//! `POST /payments` captures a payment under a full idempotency contract, in the
//! transactional mode: the payment row and the idempotency record commit in one
//! PostgreSQL transaction ([`idem::PgTx`]), so any number of instances can serve it from
//! one database and a crash never leaves a payment without its record, or a record
//! without its payment. `GET /payments/{id}` reads one; `GET /payments/operations/{key}`
//! is the contract's status lookup; `GET /openapi.json` is the OpenAPI document utoipa
//! builds, with the contract merged in ([`api::openapi`]).
//!
//! Payments are charged at a payment provider ([`provider`]): the one at
//! `--provider-url`, or, without it, an in-process one on a free port of 127.0.0.1.
//!
//! Run it with `DATABASE_URL=postgres://… cargo run -p payments`; `--help` lists the
//! options.
#![forbid(unsafe_code)]

pub mod api;
pub mod db;
pub mod provider;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use crate::api::{App, CLIENT_ID_HEADER, Demo};
use crate::provider::Provider;

/// How long a charge at the provider may take, from its start to its answer's last byte,
/// as the `payments` command sets it: well inside the contract's 10 s per attempt.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the service needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    /// The PostgreSQL server, as sqlx reads a URL
    /// (`postgres://user@host:5432/db?sslmode=disable`).
    pub database_url: String,
    /// See [`Demo::delay`].
    pub delay: Duration,
    /// The payment provider's client ([`Provider::new`]).
    pub provider: Provider,
}

/// A service ready to serve.
pub struct Service {
    /// The router, with its state.
    pub router: Router,
    /// idem's handle (its store is the PostgreSQL database).
    pub idem: idem::Idem,
    /// The service's state.
    pub app: App,
}

impl Service {
    /// Connects to the database, applies idem's migrations and the payments table, and
    /// builds the router.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or refuses a statement.
    pub async fn open(
        config: &Config,
    ) -> Result<Service, Box<dyn std::error::Error + Send + Sync>> {
        let store = idem::PostgresStore::connect(&config.database_url).await?;
        let pool = store.pool().clone();
        db::migrate(&pool).await?;
        let idem = idem::Idem::transactional(store, idem::identity::header(CLIENT_ID_HEADER));
        let app = App {
            db: pool,
            provider: config.provider.clone(),
            demo: Arc::new(Demo {
                delay: config.delay,
            }),
        };
        let router = api::router(&idem, api::openapi()?).with_state(app.clone());
        Ok(Service { router, idem, app })
    }
}
