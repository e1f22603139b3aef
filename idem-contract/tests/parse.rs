//! The attribute parser without a compiler: `parse_quote!` input in, model and errors out
//! (darling's `accrue_errors.rs`).
#![cfg(feature = "parse")]

use idem_contract::parse::{Parsed, parse};
use idem_contract::{
    Concurrency, Duration, Fingerprint, KeyFormat, KeySource, Recovery, Retryable, StatusCode,
    TransportFailure,
};
use proc_macro2::{Span, TokenStream};
use quote::quote;

fn run(args: TokenStream, item: syn::Item) -> Parsed {
    parse(args, Span::call_site(), Some(&item))
}

fn handler() -> syn::Item {
    syn::parse_quote! {
        async fn create_order(State(app): State<App>, Json(body): Json<CreateOrder>) -> StatusCode { todo!() }
    }
}

fn messages(parsed: &Parsed) -> Vec<String> {
    parsed.errors.iter().map(ToString::to_string).collect()
}

fn full() -> TokenStream {
    quote! {
        key_scope = client,
        fingerprint = [customer_id, currency, amount_minor, items],
        ttl = "24h",
        deadline = "30s",
        max_attempts = 4,
        retryable = [429, 503, 504, timeout],
        concurrency = conflict,
        status_lookup = order_operation_status(path = "/orders/operations/{key}"),
        recovery = reconcile_create_order,
    }
}

#[test]
fn a_complete_contract_parses_into_the_model() {
    let parsed = run(full(), handler());
    assert!(parsed.errors.is_empty(), "{:?}", messages(&parsed));
    let c = parsed.contract.unwrap();
    assert_eq!(c.operation, "create_order");
    assert_eq!(c.key_scope.header(), Some("Idempotency-Key"));
    assert_eq!(c.ttl, "24h".parse::<Duration>().unwrap());
    assert_eq!(c.deadline.total.as_millis(), 30_000);
    assert_eq!(c.max_attempts, 4);
    assert_eq!(
        &*c.retryable,
        [
            Retryable::Status(StatusCode(429)),
            Retryable::Status(StatusCode(503)),
            Retryable::Status(StatusCode(504)),
            Retryable::Transport(TransportFailure::Timeout)
        ]
    );
    assert_eq!(
        c.concurrency,
        Concurrency::Conflict {
            retry_after: Duration::from_millis(1000)
        }
    );
    assert_eq!(
        c.status_lookup.path.as_deref(),
        Some("/orders/operations/{key}")
    );
    assert_eq!(
        c.recovery,
        Recovery::Reconcile {
            function: "reconcile_create_order".into()
        }
    );
    let Fingerprint::Fields(fields) = &c.fingerprint else {
        panic!()
    };
    assert_eq!(fields.len(), 4);
    assert_eq!(parsed.fingerprint_fields.len(), 4);
    assert!(parsed.status_lookup.is_some() && parsed.recovery.is_some());
    let handler = parsed.handler.unwrap();
    let body = handler.body.unwrap();
    assert_eq!(quote!(#body).to_string(), "CreateOrder");
    let state = handler.state.unwrap();
    assert_eq!(quote!(#state).to_string(), "App");
}

#[test]
fn any_order_and_options() {
    let parsed = run(
        quote! {
            recovery = manual("https://runbooks.example.com/orders"),
            concurrency = wait("2s"),
            status_lookup = crate::ops::status,
            retryable = [503, connection_reset],
            max_attempts = 1,
            deadline = ("30s", per_attempt = "5s"),
            ttl = "7d",
            fingerprint = body,
            key_scope = client(body = meta.client_reference, format = uuid),
        },
        handler(),
    );
    assert!(parsed.errors.is_empty(), "{:?}", messages(&parsed));
    let c = parsed.contract.unwrap();
    assert_eq!(c.fingerprint, Fingerprint::Body);
    assert!(
        matches!(&c.key_scope.source, KeySource::Body { field } if field.as_str() == "meta.client_reference")
    );
    assert_eq!(c.key_scope.format, KeyFormat::Uuid);
    assert_eq!(c.deadline.per_attempt.unwrap().as_millis(), 5_000);
    assert_eq!(c.status_lookup.handler, "crate::ops::status");
    assert_eq!(
        c.concurrency,
        Concurrency::Wait {
            limit: Duration::from_millis(2_000)
        }
    );
}

#[test]
fn no_arguments_lists_all_nine() {
    let parsed = run(quote!(), handler());
    let m = messages(&parsed);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].starts_with("a contract declares all nine properties"),
        "{}",
        m[0]
    );
    for key in [
        "key_scope",
        "fingerprint",
        "ttl",
        "deadline",
        "max_attempts",
        "retryable",
        "concurrency",
        "status_lookup",
        "recovery",
    ] {
        assert!(m[0].contains(&format!("`{key}`: ")), "{key}");
    }
}

#[test]
fn a_duplicate_is_an_error_and_neither_wins() {
    let mut args = full();
    args.extend(quote!(ttl = "48h"));
    let parsed = run(args, handler());
    let m = messages(&parsed);
    assert_eq!(
        m,
        ["`ttl` is given twice: a contract takes one value, so neither wins; remove one of them"]
    );
    assert!(parsed.contract.is_none());
}

#[test]
fn the_struct_case_reports_three_problems() {
    let item: syn::Item = syn::parse_quote!(
        struct Order;
    );
    let parsed = run(
        quote! {
            key_scope = client, fingerprint = body, deadline = "30s", max_attempts = 4,
            retryble = [503], concurrency = conflict, status_lookup = s, recovery = r,
        },
        item,
    );
    let m = messages(&parsed);
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(m[0].contains("not on a struct"));
    assert!(m[1].contains("did you mean `retryable`?"));
    assert!(
        m[2].starts_with("the contract is missing 1 property:\n  `ttl`"),
        "{}",
        m[2]
    );
}

#[test]
fn value_and_rule_errors_are_all_reported() {
    let parsed = run(
        quote! {
            key_scope = client,
            fingerprint = [],
            ttl = "10s",
            deadline = ("30s", per_attempt = "1m"),
            max_attempts = 0,
            retryable = [404, 200, 503, 503, 999],
            concurrency = wait("1m"),
            status_lookup = lookup,
            recovery = manual(""),
        },
        handler(),
    );
    let m = messages(&parsed);
    let expect = [
        "`fingerprint` is empty",
        "`ttl` (10s) is shorter than `deadline` (30s): the key would be forgotten while the client may still retry",
        "the per-attempt timeout (1m) is longer than the deadline (30s)",
        "`max_attempts` counts the first attempt too",
        "`404` (Not Found) is a permanent answer",
        "`200` (OK) is a success",
        "`503` is listed twice",
        "`999` is not an HTTP status code",
        "the wait of `concurrency = wait(\"1m\")` is longer than the deadline",
        "`manual(..)` needs the runbook",
    ];
    assert_eq!(m.len(), expect.len(), "{m:#?}");
    for (message, start) in m.iter().zip(expect) {
        assert!(
            message.starts_with(start),
            "{message:?} does not start with {start:?}"
        );
    }
}

#[test]
fn malformed_values_name_the_accepted_forms() {
    let parsed = run(
        quote! {
            key_scope = tenant, fingerprint = everything, ttl = "0s", deadline = "30 parsecs",
            max_attempts = "4", retryable = [timout, 70000], concurrency = conflct,
            status_lookup = "lookup", recovery = || {},
        },
        handler(),
    );
    let m = messages(&parsed);
    let expect = [
        "unknown key scope `tenant`",
        "`fingerprint` lists the significant fields",
        "`ttl` cannot be zero: write a whole number and a unit, such as `250ms`, `30s`, `15m`, `24h` or `7d`",
        "`30 parsecs` is not a duration: write a whole number and a unit",
        "`max_attempts` takes a whole number",
        "unknown transport failure `timout`: did you mean `timeout`?",
        "`70000` is not an HTTP status code",
        "unknown concurrency response `conflct`: did you mean `conflict`?",
        "`status_lookup` names the handler",
        "`recovery` names a reconcile function",
    ];
    assert_eq!(m.len(), expect.len(), "{m:#?}");
    for (message, start) in m.iter().zip(expect) {
        assert!(
            message.starts_with(start),
            "{message:?} does not start with {start:?}"
        );
    }
}

#[test]
fn broken_syntax_stops_with_one_error() {
    let parsed = run(quote!(ttl "24h", deadline = "30s"), handler());
    assert_eq!(
        messages(&parsed),
        ["expected `=` after `ttl`: write `ttl = \"24h\"`"]
    );
}

#[test]
fn not_async_and_no_json_body() {
    let item: syn::Item = syn::parse_quote!(
        fn create_order() {}
    );
    let parsed = run(full(), item);
    assert_eq!(
        messages(&parsed)[0],
        "`#[idem::contract]` goes on an async axum handler, and `create_order` is not `async`: write `async fn create_order`"
    );
    let item: syn::Item = syn::parse_quote!(
        async fn create_order(headers: HeaderMap) {}
    );
    let parsed = run(full(), item);
    assert!(messages(&parsed)[0].starts_with("fingerprint fields are members of the request body, but `create_order` takes no `Json<T>` or `Form<T>` argument"));
}

#[test]
fn accepted_needs_a_lookup_route() {
    let parsed = run(
        quote! {
            key_scope = client, fingerprint = body, ttl = "1d", deadline = "30s", max_attempts = 3,
            retryable = [503], concurrency = accepted, status_lookup = lookup, recovery = r,
        },
        handler(),
    );
    assert_eq!(
        messages(&parsed),
        [
            "`concurrency = accepted` answers 202 with a `Location` at the status lookup, but `status_lookup` gives no route: write `status_lookup = lookup(path = \"/operations/{key}\")`"
        ]
    );
}

#[test]
fn missing_properties_do_not_hide_the_other_rules() {
    let parsed = run(
        quote! {
            key_scope = client, fingerprint = [customer_id], ttl = "10s", deadline = "30s",
            retryable = [404], concurrency = wait("1m"), status_lookup = lookup,
        },
        handler(),
    );
    let m = messages(&parsed);
    assert_eq!(m.len(), 4, "{m:#?}");
    assert!(m[0].starts_with("the contract is missing 2 properties"));
    assert!(m[1].starts_with("`ttl` (10s) is shorter than `deadline` (30s)"));
    assert!(m[2].starts_with("`404` (Not Found) is a permanent answer"));
    assert!(
        m[3].starts_with("the wait of `concurrency = wait(\"1m\")` is longer than the deadline")
    );
    // A rule that reads a missing or refused value is not reported against a stand-in.
    let parsed = run(quote! { ttl = "10s", deadline = "30 parsecs" }, handler());
    assert!(
        messages(&parsed)
            .iter()
            .all(|m| !m.contains("shorter than")),
        "{:#?}",
        messages(&parsed)
    );
}

#[test]
fn an_option_written_as_a_property_says_where_it_goes() {
    let mut args = full();
    args.extend(quote!(per_attempt = "5s"));
    assert_eq!(
        messages(&run(args, handler())),
        [
            "`per_attempt` is an option of `deadline`, not a property: write `deadline = (\"30s\", per_attempt = \"5s\")`"
        ]
    );
}

/// A 402 is the same decline of the same payment on every try: permanent, as 400 and 404
/// are, so `retryable` refuses it at its own token.
#[test]
fn payment_required_is_permanent() {
    let parsed = run(
        quote! {
            key_scope = client, fingerprint = [customer_id], ttl = "24h", deadline = "30s",
            max_attempts = 3, retryable = [402, 503], concurrency = conflict,
            status_lookup = lookup, recovery = reconcile,
        },
        handler(),
    );
    assert_eq!(
        messages(&parsed),
        [
            "`402` (Payment Required) is a permanent answer: the same request gets the same answer, so retrying it cannot help; remove it (retryable statuses are such as 408, 409, 425, 429, 500, 502, 503 and 504)"
        ]
    );
    assert!(parsed.contract.is_none());
}

/// axum reads the body with the last argument: an extractor after `Json(body)` is
/// reported at itself, with where it goes, as the user wrote both; `idem::Attempt` (passed
/// in by the macro) may come anywhere.
#[test]
fn the_body_extractor_comes_last() {
    let item: syn::Item = syn::parse_quote! {
        async fn create_order(
            attempt: idem::Attempt,
            Json(body): Json<CreateOrder>,
            tx: idem::PgTx,
            attempt_too: Attempt,
            State(app): axum::extract::State<App<'static, u8>>,
        ) -> StatusCode { todo!() }
    };
    let parsed = run(full(), item);
    assert_eq!(
        messages(&parsed),
        [
            "the request body extractor must be the last argument: move `tx: idem::PgTx` before `Json(body)`",
            "the request body extractor must be the last argument: move `State(app): axum::extract::State<App<'static, u8>>` before `Json(body)`",
        ]
    );
    assert!(parsed.contract.is_none());
    assert!(parsed.handler.is_some(), "the other rules still read it");

    let item: syn::Item = syn::parse_quote! {
        async fn create_order(tx: idem::PgTx, Form(body): axum::Form<CreateOrder>, a: idem::Attempt) -> StatusCode { todo!() }
    };
    assert!(run(full(), item).errors.is_empty());
}
