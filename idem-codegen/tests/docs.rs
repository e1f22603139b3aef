//! What the consumer docs and the OpenAPI descriptions tell a client, rule by rule, on
//! the orders fixture (`tests/fixtures/orders`): an operation named `createOrder` in its
//! document, declared on the handler `create_order`, with required headers of its own.

mod common;

use std::path::Path;

use idem_codegen::contracts;
use idem_codegen::docs::{self, DocFormat, HeaderExample, OperationInfo};
use idem_codegen::openapi::{self, Document, find_operation};
use idem_contract::Contract;
use serde_json::json;

use common::fixture;

fn orders_doc() -> Document {
    let text = std::fs::read_to_string(fixture("orders/openapi.yaml")).unwrap();
    Document::parse(Path::new("orders.yaml"), &text).unwrap()
}

/// The fixture's contract, after `edit` of its serde form.
fn contract(edit: impl FnOnce(&mut serde_json::Value)) -> Contract {
    let scanned = contracts::from_sources(&[fixture("orders/api.rs")]).unwrap();
    let mut value = serde_json::to_value(&scanned[0].contract).unwrap();
    edit(&mut value);
    let file = json!({ "version": 1, "contracts": [{ "contract": value }] });
    contracts::parse_file(Path::new("c.json"), &file.to_string())
        .unwrap()
        .remove(0)
        .contract
}

fn info(doc: &Document) -> OperationInfo {
    let op = find_operation(doc, &"createOrder".parse().unwrap()).unwrap();
    OperationInfo::from_document(doc, &op)
}

fn render(format: DocFormat, contract: Contract, info: OperationInfo) -> String {
    docs::render(format, "Orders", &[(contract, info)]).unwrap()
}

#[test]
fn required_headers_come_from_the_document() {
    let info = info(&orders_doc());
    let header = |name: &str, value: &str, placeholder| HeaderExample {
        name: name.into(),
        value: value.into(),
        placeholder,
    };
    // The operation's own (a `$ref`, then one with an `example`), then its path's (a
    // schema `examples` behind a `$ref`); the optional `X-Trace` and `Content-Type`,
    // which OpenAPI ignores as a parameter, are not among them.
    assert_eq!(
        info.headers,
        [
            header("X-Client-Id", "<your X-Client-Id>", true),
            header("X-Channel", "web", false),
            header("X-Api-Version", "2026-01-01", false),
        ]
    );
    assert_eq!(info.operation_id.as_deref(), Some("createOrder"));
}

#[test]
fn the_worked_request_carries_every_required_header() {
    let md = render(DocFormat::Markdown, contract(|_| {}), info(&orders_doc()));
    assert!(
        md.contains("Operation `createOrder`. The same contract"),
        "{md}"
    );
    // The page names the operation as the API does, never by the server's functions.
    for code_name in [
        "create_order",
        "order_operation_status",
        "reconcile_create_order",
    ] {
        assert!(!md.contains(code_name), "the page names `{code_name}`");
    }
    assert!(
        md.contains("1. Attempt 1: make a new key for this intent, keep it, and send the request. Besides the key, the operation requires the headers `X-Client-Id`, `X-Channel` and `X-Api-Version` on every attempt; put your own value where the example shows `<…>`."),
        "{md}"
    );
    assert!(
        md.contains(
            "   POST /orders HTTP/1.1
   Content-Type: application/json
   X-Client-Id: <your X-Client-Id>
   X-Channel: web
   X-Api-Version: 2026-01-01
   Idempotency-Key: 0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60
"
        ),
        "{md}"
    );
    let html = render(DocFormat::Html, contract(|_| {}), info(&orders_doc()));
    assert!(
        html.contains("X-Client-Id: &lt;your X-Client-Id&gt;\nX-Channel: web\n"),
        "{html}"
    );
}

#[test]
fn the_key_header_is_not_listed_twice() {
    // Once merged, the document has the key parameter itself.
    let mut doc = orders_doc();
    let found = contracts::from_sources(&[fixture("orders/api.rs")]).unwrap();
    let mut found = found;
    found[0].target = "createOrder".parse().unwrap();
    openapi::merge(&mut doc, &found).unwrap();
    let md = render(DocFormat::Markdown, contract(|_| {}), info(&doc));
    assert_eq!(md.matches("Idempotency-Key: 0191f6a4").count(), 1, "{md}");
}

#[test]
fn without_the_document_the_target_names_the_operation() {
    let md = render(
        DocFormat::Markdown,
        contract(|_| {}),
        OperationInfo::from_target(&"POST /orders".parse().unwrap()),
    );
    assert!(md.contains("## POST /orders"), "{md}");
    assert!(md.contains("<a id=\"op-post-orders\"></a>"), "{md}");
    assert!(!md.contains("create_order"), "{md}");
    assert!(!md.contains("Besides the key"), "{md}");
    let md = render(
        DocFormat::Markdown,
        contract(|_| {}),
        OperationInfo::from_target(&"createOrder".parse().unwrap()),
    );
    assert!(
        md.contains("## createOrder") && md.contains("Operation `createOrder`. The same contract"),
        "{md}"
    );
}

/// The rows of the answers table (not the status lookup's) whose first cell starts with
/// `answer`.
fn rows<'a>(md: &'a str, answer: &str) -> Vec<&'a str> {
    let table = md
        .split("### What the status lookup answers")
        .next()
        .unwrap_or(md);
    table
        .lines()
        .filter(|l| l.starts_with(&format!("| {answer}")))
        .collect()
}

#[test]
fn a_retryable_status_of_the_service_itself_has_its_row() {
    // The contract retries 429, 503 and 504.
    let md = render(DocFormat::Markdown, contract(|_| {}), info(&orders_doc()));
    assert_eq!(
        rows(&md, "`503 Service Unavailable` from the service itself"),
        [
            "| `503 Service Unavailable` from the service itself | any other, or none | The service itself answered 503, with none of the problem types above. 503 is in this operation's retry list, so the server released the key: a retry runs the operation again. | Back off (at least `Retry-After`, when the answer carries it), then retry with the same key. |"
        ]
    );
    assert_eq!(
        rows(&md, "`504 Gateway Timeout` from the service itself").len(),
        1
    );
    assert!(rows(&md, "`429 Too Many Requests` from").is_empty());
    // Each of idem's own 503s keeps its row, and the rest stops.
    assert_eq!(rows(&md, "`503 Service Unavailable` |").len(), 6);
    assert_eq!(rows(&md, "Any other `4xx`").len(), 1);
    // A 5xx that is not retryable was rolled back (the key released): never "for good".
    let other_5xx = rows(&md, "Any other `5xx`");
    assert_eq!(other_5xx.len(), 1);
    assert!(
        other_5xx[0].contains("retry with the same key"),
        "{other_5xx:?}"
    );
    assert!(!other_5xx[0].contains("for good"), "{other_5xx:?}");

    let mut doc = orders_doc();
    let found = contracts::parse_file(
        Path::new("c.json"),
        &json!({ "version": 1, "contracts": [{ "target": "createOrder", "contract": contract(|_| {}) }] })
            .to_string(),
    )
    .unwrap();
    openapi::merge(&mut doc, &found).unwrap();
    let responses = &doc.root["paths"]["/orders"]["post"]["responses"];
    let unavailable = responses["503"]["description"].as_str().unwrap();
    assert!(
        unavailable.contains("(`attempt-failed`)")
            && unavailable.contains("The operation itself may answer 503 too, with a problem `type` of its own. 503 is retryable under this operation's contract, whoever answered it"),
        "{unavailable}"
    );
    let conflict = responses["409"]["description"].as_str().unwrap();
    assert!(
        conflict.ends_with("A 409 with a problem `type` other than these comes from the operation itself and is final: 409 is not retryable under this operation's contract."),
        "{conflict}"
    );
}

#[test]
fn a_status_left_out_of_the_retry_list_stops() {
    let no_503 = contract(|c| c["retryable"] = json!([409, 429, "timeout"]));
    let md = render(DocFormat::Markdown, no_503.clone(), info(&orders_doc()));
    assert!(
        rows(&md, "`503 Service Unavailable` from").is_empty(),
        "{md}"
    );
    assert_eq!(rows(&md, "`409 Conflict` from the service itself").len(), 1);
    for row in rows(&md, "`503 Service Unavailable` |") {
        assert!(
            row.contains("503 is not in this operation's retry list, so stop after it"),
            "{row}"
        );
    }
    let responses = idem_codegen::extension::responses(&no_503, None);
    let description = |status: &str| {
        responses
            .iter()
            .find(|(s, _)| s == status)
            .and_then(|(_, r)| r["description"].as_str())
            .unwrap()
            .to_owned()
    };
    assert!(
        description("503").ends_with("The operation itself may answer 503 too, with a problem `type` of its own. 503 is not retryable under this operation's contract, whoever answered it: stop, and ask the status lookup before starting the operation again."),
        "{}",
        description("503")
    );
    assert!(
        description("409").contains("The operation itself may answer 409 too, with a problem `type` of its own. 409 is retryable under this operation's contract, whoever answered it"),
        "{}",
        description("409")
    );
}

#[test]
fn the_client_waits_longer_than_the_servers_attempt_limit() {
    let c = contract(|_| {});
    for format in [DocFormat::Markdown, DocFormat::Html] {
        // The same words in both formats, once HTML's markup is read back as Markdown's.
        let text = render(format, c.clone(), info(&orders_doc()))
            .replace("&#x27;", "'")
            .replace("<code>", "`")
            .replace("</code>", "`");
        assert!(!text.contains("timeout (10 seconds)"), "{text}");
        assert!(
            text.contains("Give each attempt a timeout a little longer than the server's limit per attempt: 10 seconds, plus a margin for the network. The server stops an attempt after 10 seconds and answers `503` (`attempt-timed-out`); a client that gives up at exactly 10 seconds never sees that answer."),
            "{format:?}: {text}"
        );
        assert!(
            text.contains(
                "give each attempt a timeout of 10 seconds plus a margin for the network"
            ),
            "{format:?}"
        );
    }
}

#[test]
fn html_tables_keep_problem_types_whole() {
    let html = render(DocFormat::Html, contract(|_| {}), info(&orders_doc()));
    // A type wraps between its prefix and its slug only, never inside either, and a
    // table too wide for a small screen scrolls in its wrapper.
    assert!(html.contains("td.type code span, td.answer code { white-space: nowrap; }"));
    assert!(html.contains("div.table { overflow-x: auto;"));
    assert_eq!(
        html.matches("<div class=\"table\"><table>").count(),
        html.matches("<table>").count()
    );
    assert!(html.contains(
        "<td class=\"type\"><code><span>tag:idem.rs,2026:problem:</span><wbr><span>key-missing</span></code></td>"
    ));
    // Every status in the answer column is code.
    assert!(
        html.contains("<td class=\"answer\">Any other <code>4xx</code></td>")
            && html.contains("<td class=\"answer\">Any other <code>5xx</code></td>")
    );
    assert!(html.contains(
        "<td class=\"answer\"><code>504 Gateway Timeout</code> from the service itself</td>"
    ));
}

/// Text the docs take from a spec (its title, an operation's summary, its route) is
/// escaped in the Markdown as the HTML template escapes it: a `<script>` stays text.
#[test]
fn text_from_the_spec_is_escaped_in_both_formats() {
    let mut info = info(&orders_doc());
    info.summary = Some("<script>alert(1)</script>\n# not a heading".into());
    info.path = Some("/orders/<img src=x onerror=alert(1)>".into());
    let title = "Orders <script>alert(2)</script> *bold*";
    let operations = [(contract(|_| {}), info)];
    let md = docs::render(DocFormat::Markdown, title, &operations).unwrap();
    // Outside code blocks (a fenced block shows its text as it is, the route included),
    // with the escaped characters taken out, nothing of the spec's markup is left.
    let prose = md
        .split("```")
        .step_by(2)
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\<", "")
        .replace("\\*", "");
    for raw in ["<script>", "<img", "*bold*", "\n# not a heading"] {
        assert!(
            !prose.contains(raw),
            "`{raw}` is raw in the Markdown:\n{md}"
        );
    }
    assert!(
        md.contains("\\<script\\>alert(1)\\</script\\> # not a heading"),
        "{md}"
    );
    assert!(
        md.starts_with("# Orders \\<script\\>alert(2)\\</script\\> \\*bold\\*"),
        "{md}"
    );
    let html = docs::render(DocFormat::Html, title, &operations).unwrap();
    for raw in ["<script>", "<img"] {
        assert!(!html.contains(raw), "`{raw}` is raw in the HTML");
    }
}

#[test]
fn step_outcome_unknown_is_an_answer_only_of_an_operation_with_a_step_journal() {
    let row = "`tag:idem.rs,2026:problem:step-outcome-unknown` |";
    let plain = render(DocFormat::Markdown, contract(|_| {}), info(&orders_doc()));
    assert!(
        rows(
            &plain,
            "`503 Service Unavailable` | `tag:idem.rs,2026:problem:step-outcome-unknown`"
        )
        .is_empty(),
        "{plain}"
    );
    let resumed = render(
        DocFormat::Markdown,
        contract(|c| c["recovery"] = json!({ "kind": "resume" })),
        info(&orders_doc()),
    );
    assert_eq!(
        rows(
            &resumed,
            "`503 Service Unavailable` | `tag:idem.rs,2026:problem:step-outcome-unknown`"
        )
        .len(),
        1
    );
    // The catalogue of problem types lists it either way.
    assert!(plain.contains(row) && resumed.contains(row));
}
