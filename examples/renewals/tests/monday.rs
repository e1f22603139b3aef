//! The Monday test (idem's conformance harness, docs/conformance.md) against the renewals
//! service, as the guide "your own service" tells a service to run it in its own tests:
//! the guide shows [`monday`] as it is here.

use std::time::Duration;

use idem::testing::{Harness, OperatorCheck, Request, TraceCapture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monday_test_passes_against_the_renewals_service() {
    let what = "the Monday test against the renewals service";
    let Some(url) = idem_runtime::store::conformance::postgres::scratch_url(what).await else {
        return;
    };
    monday(&url).await;
}

/// The guide shows this function, from its first line to its last, as it is.
async fn monday(url: &str) {
    // The service as `main` builds it, on a database of its own, with two changes for the
    // test only: a short lease, so that a crash is recovered within it, and the
    // test-fault protocol (feature `testing`), so that the harness can make it fail.
    let store = idem::PostgresStore::connect(url).await.unwrap();
    renewals::migrate(store.pool()).await.unwrap();
    let app = renewals::App {
        pool: store.pool().clone(),
        days: 30,
    };
    let idem = idem::Idem::transactional_builder(store, idem::identity::header("x-client-id"))
        .recover_with::<renewals::renew_subscription::Operation, _>(&app)
        .heartbeat(Duration::from_millis(300))
        .test_faults()
        .build();
    idem.check_handlers::<renewals::renew_subscription::Operation>()
        .unwrap();
    let capture = TraceCapture::new(); // idem's spans in this process (proof 4)
    capture.install_global().unwrap();
    let operator = OperatorCheck::for_idem(&idem, "renew_subscription"); // proof 5
    let pool = app.pool.clone();
    let report = Harness::for_router(renewals::router(&idem, app))
        .request(Request::post_json(
            "/subscriptions/sub_42/renewals",
            r#"{"plan": "pro", "coupon": null}"#,
        ))
        .client_header("x-client-id", "monday")
        .status_lookup("/renewals/operations/{key}")
        .count_effects(move || {
            // A business effect is a renewal row.
            let pool = pool.clone();
            async move {
                idem::sqlx::query_scalar::<_, i64>("SELECT count(*) FROM renewals")
                    .fetch_one(&pool)
                    .await
                    .map(|n| n.unsigned_abs())
            }
        })
        .check_trace(capture.check())
        .check_operator(operator.check())
        .run()
        .await
        .unwrap();
    println!("{report}"); // scenario × proof, with the evidence
    report.assert_passed();
}
