use std::time::Duration;

use renewals::{App, renew_subscription};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt::init(); // idem logs a misconfiguration, a failed recovery, …
    let url = std::env::var("DATABASE_URL")?; // postgres://user@host/db
    let store = idem::PostgresStore::connect(&url).await?; // idem's table, migrated
    renewals::migrate(store.pool()).await?; // the business tables, in the same database
    let app = App {
        pool: store.pool().clone(),
        days: 30,
    };
    let idem = idem::Idem::transactional_builder(store, idem::identity::header("x-client-id"))
        .recover_with::<renew_subscription::Operation, _>(&app) // for the reconciler
        .build();
    // Every contracted handler, checked against the handle now rather than at its first
    // request: `PgTx` needs `Idem::transactional` over this PostgreSQL store.
    idem.check_handlers::<renew_subscription::Operation>()?;
    // Recovers operations whose instance died, with no client retry needed; every
    // instance may run one.
    let _reconciler = idem.spawn_reconciler(Duration::from_secs(5));
    let _purger = idem.spawn_purger(Duration::from_secs(60)); // expired keys are deleted
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3003".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // `idem::serve` closes a connection whose request head has not come within 10 s.
    idem::serve(listener, renewals::router(&idem, app)).await?;
    Ok(())
}
