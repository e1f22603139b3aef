//! `orders monday`: the Monday test (`idem::testing`, docs/conformance.md) against this service.
//!
//! Starts the service in-process on 127.0.0.1 with a temporary SQLite file (its embedded
//! store: an order and its record commit together), its idem handle made with
//! `IdemBuilder::test_faults` (only here: `orders` serving never honours the fault header)
//! and a short lease, so that the crash is recovered in well under a second; then runs
//! idem's conformance harness ([`idem::testing::Harness`]) against `POST /orders`,
//! counting business effects as rows of the orders table, reading the service's trace
//! through a [`TraceCapture`] (proof 4) and its store through idem's operator calls, the
//! ones `idem ops` makes (proof 5: [`OperatorCheck`]).

use std::path::PathBuf;
use std::time::Duration;

use idem::testing::{Harness, HarnessError, OperatorCheck, Report, Request, TraceCapture};

use crate::api::{CLIENT_ID_HEADER, create_order};
use crate::model::{CreateOrder, LineItem};
use crate::service::OpenError;
use crate::{Backend, Config, Service};

/// The lease of an attempt under the Monday test: a crashed attempt is noticed within it.
pub const LEASE: Duration = Duration::from_millis(300);

/// Why the Monday test could not run (a failed proof is in the report, not here).
#[derive(Debug, thiserror::Error)]
pub enum MondayError {
    /// The temporary directory or a socket could not be made.
    #[error("cannot prepare the service: {0}")]
    Io(#[from] std::io::Error),
    /// The service could not open its SQLite file.
    #[error("cannot open the service's SQLite file: {0}")]
    Open(#[from] OpenError),
    /// The harness could not run.
    #[error("the harness could not run: {0}")]
    Harness(#[from] HarnessError),
}

/// What the Monday test did.
#[derive(Debug)]
pub struct Monday {
    /// The report: scenario × proof.
    pub report: Report,
    /// The temporary SQLite file the service used (deleted when the run ends).
    pub db: PathBuf,
}

/// Runs the Monday test against a fresh in-process service; `trace` must be installed
/// for the whole process (a layer of the global subscriber) for proof 4 to pass.
///
/// # Errors
///
/// When the service cannot start or the harness cannot run; a failed proof is not an
/// error: see [`Report::passed`].
pub async fn run(trace: &TraceCapture) -> Result<Monday, MondayError> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("orders.db");
    let config = Config::new(Backend::Sqlite { db: db.clone() });
    let service = Service::open_with(&config, |idem| idem.heartbeat(LEASE).test_faults()).await?;
    let orders = service.app.orders.clone();
    let operator =
        OperatorCheck::for_idem(&service.idem, create_order::CONTRACT.operation.to_string());
    let order = CreateOrder {
        customer_id: "cus_42".into(),
        currency: "EUR".into(),
        amount_minor: 1999,
        items: vec![LineItem {
            sku: "book-1".into(),
            qty: 1,
        }],
    };
    let body = serde_json::to_vec(&order).map_err(std::io::Error::other)?;
    let report = Harness::for_router(service.router)
        .request(Request::post_json("/orders", body))
        .client_header(CLIENT_ID_HEADER, "monday")
        .status_lookup("/orders/operations/{key}")
        .recovery_within(Duration::from_secs(5))
        .count_effects(move || {
            let orders = orders.clone();
            async move { orders.count().await.map(|n| u64::try_from(n).unwrap_or(0)) }
        })
        .check_trace(trace.check())
        .check_operator(operator.check())
        .run()
        .await?;
    Ok(Monday { report, db })
}
