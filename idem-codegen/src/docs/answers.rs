//! What each answer means, and the worked request sequence, for one operation's section.

use idem_contract::{Concurrency, Contract, Fingerprint, Retryable, StatusCode};

use super::content::{
    Answer, HeaderExample, OperationInfo, Step, header_or_field, identity_header, identity_words,
    lookup_path,
};
use super::rich::Rich;
use crate::extension::EXAMPLE_KEY;
use crate::problem::{self, ProblemType};
use crate::words;

fn status_words(code: u16) -> String {
    words::status(StatusCode(code))
}

pub(super) fn answers(c: &Contract, info: &OperationInfo) -> Vec<Answer> {
    let retryable_status = |s: u16| c.retryable.contains(&Retryable::Status(StatusCode(s)));
    let mut out = vec![
        Answer {
            answer: Rich::new("A success (`2xx`)"),
            problem_type: None,
            meaning: Rich::new(&format!(
                "The operation ran once; its answer is stored for {}.",
                words::duration(c.ttl)
            )),
            action: Rich::new("Done."),
        },
        Answer {
            answer: Rich::new("Any answer with `Idempotent-Replayed: true`"),
            problem_type: None,
            meaning: Rich::new(
                "The stored answer of an earlier attempt with this key, replayed byte for byte: status, headers such as `Location`, and body. When that body was larger than the server keeps, the replay has the same status and a problem body of type `tag:idem.rs,2026:problem:result-body-not-kept` in its place, giving the original body's length and SHA-256.",
            ),
            action: Rich::new(
                "Treat it as the answer to your operation; it is not a second operation.",
            ),
        },
    ];
    if matches!(c.concurrency, Concurrency::Accepted) {
        out.push(Answer {
            answer: Rich::new("").code(status_words(202)),
            problem_type: None,
            meaning: Rich::new(
                "An earlier attempt with this key is still running; this one was not run again.",
            ),
            action: Rich::new("Ask the status lookup at `Location` for the outcome."),
        });
    }
    // Every problem type of the catalogue gets a row: these here, the 503s after 429,
    // and the set-up's at the end; the status lookup's 404 is in its own table.
    let later = |p: &ProblemType| {
        p.status() == 503 || matches!(p.slug(), "operation-not-found" | "not-configured")
    };
    for p in ProblemType::ALL.iter().filter(|p| !later(p)) {
        if p.slug() == "operation-in-progress" && matches!(c.concurrency, Concurrency::Accepted) {
            continue;
        }
        let mut answer = problem_answer(p, None);
        if *p == ProblemType::ClientIdentityMissing {
            answer.action = identity_action(info);
        }
        out.push(answer);
    }
    out.push(Answer {
        answer: Rich::new("").code(status_words(429)),
        problem_type: None,
        meaning: Rich::new("Too many requests."),
        action: Rich::new(if retryable_status(429) {
            "Wait for `Retry-After`, then retry with the same key."
        } else {
            "429 is not in this operation's retry list: stop, and ask the status lookup before starting again."
        }),
    });
    // `step-outcome-unknown` comes only from an operation with a step journal.
    let resumes = matches!(c.recovery, idem_contract::Recovery::Resume);
    for p in ProblemType::ALL.iter().filter(|p| p.status() == 503) {
        if *p == ProblemType::StepOutcomeUnknown && !resumes {
            continue;
        }
        out.push(problem_answer(p, Some(retryable_status(503))));
    }
    out.extend(own_retryable_answers(c));
    out.extend(last_answers(c));
    out.push(problem_answer(&ProblemType::NotConfigured, None));
    out
}

/// A row for each retryable status the operation answers itself, with a problem `type`
/// of its own (or none): the server released the key, so a retry runs again.
fn own_retryable_answers(c: &Contract) -> Vec<Answer> {
    let mut out = Vec::new();
    let mut own: Vec<u16> = c
        .retryable
        .iter()
        .filter_map(|r| match r {
            Retryable::Status(s) if s.as_u16() != 429 => Some(s.as_u16()),
            _ => None,
        })
        .collect();
    own.sort_unstable();
    own.dedup();
    for status in own {
        out.push(Answer {
            answer: Rich::default()
                .code(status_words(status))
                .text(" from the service itself"),
            problem_type: Some(Rich::new("any other, or none")),
            meaning: Rich::new(&format!(
                "The service itself answered {status}, with none of the problem types above. {status} is in this operation's retry list, so the server released the key: a retry runs the operation again."
            )),
            action: Rich::new(
                "Back off (at least `Retry-After`, when the answer carries it), then retry with the same key.",
            ),
        });
    }
    out
}

/// The rows after the catalogue's: any other 4xx and 5xx, and no answer at all.
fn last_answers(c: &Contract) -> Vec<Answer> {
    let mut out = Vec::new();
    out.push(Answer {
        answer: Rich::new("Any other `4xx`"),
        problem_type: None,
        meaning: Rich::new(
            "The request was refused for good; the answer is stored and replayed to a retry with the same key.",
        ),
        action: Rich::new("Stop. Fix the cause; a new intent needs a new key."),
    });
    out.push(Answer {
        answer: Rich::new("Any other `5xx`"),
        problem_type: None,
        meaning: Rich::new(
            "The service failed and nothing was stored as the operation's result: what it wrote was rolled back and the key released, so the same key runs the operation again. (Where the server cannot roll back, it does not send this: it answers 503 `attempt-failed`, above.)",
        ),
        action: Rich::new(
            "Back off, then retry with the same key, or ask the status lookup first; never a new key.",
        ),
    });
    let transports: Vec<String> = c
        .retryable
        .iter()
        .filter_map(|r| match r {
            Retryable::Transport(t) => Some(words::transport(*t).to_owned()),
            Retryable::Status(_) => None,
        })
        .collect();
    out.push(Answer {
        answer: Rich::new("No answer"),
        problem_type: None,
        meaning: Rich::new("The request may or may not have been processed."),
        action: Rich::new(&if transports.is_empty() {
            "No transport failure is in the retry list: ask the status lookup.".to_owned()
        } else {
            format!(
                "Retry with the same key when the failure was: {}. Otherwise ask the status lookup.",
                words::list(&transports, "or")
            )
        }),
    });
    out
}

/// What to do after `client-identity-missing`.
fn identity_action(info: &OperationInfo) -> Rich {
    Rich::new("Send the request again with ")
        .then(identity_words(info))
        .text(", the same on every attempt.")
}

/// What each answer of the status lookup means. Its advice follows the new-key rule
/// ([`super::properties::new_key`]).
pub(super) fn lookup_answers(c: &Contract, info: &OperationInfo) -> Vec<Answer> {
    let ok = || Rich::new("").code(status_words(200));
    let state = |s: &str| Some(Rich::new("`state`: ").code(s));
    let ttl = words::duration(c.ttl);
    let mut out = vec![
        Answer {
            answer: ok(),
            problem_type: state("completed"),
            meaning: Rich::new(
                "The operation happened. `response` holds its stored answer: its `status`, its `headers` (such as `location`, where the result is) and its `body` when it is JSON.",
            ),
            action: Rich::new(
                "Use it as the answer to your request. A retry with the same key gets the same answer, replayed.",
            ),
        },
        Answer {
            answer: ok(),
            problem_type: state("processing"),
            meaning: Rich::new(
                "An attempt is running, or stopped before its outcome was recorded and its time is not up yet; `retry_after` says how many seconds are left. The first lookup or retry after that has the server settle it.",
            ),
            action: Rich::new(
                "Ask again after `retry_after` seconds, or retry with the same key; never start it again with a new key.",
            ),
        },
        Answer {
            answer: ok(),
            problem_type: state("released"),
            meaning: Rich::new(
                "The last attempt took no effect (it answered a retryable status, or everything it wrote was rolled back); `new_key_safe` is `true`.",
            ),
            action: Rich::new(
                "Send the request again with the same key: the operation runs again.",
            ),
        },
        Answer {
            answer: ok(),
            problem_type: state("unknown"),
            meaning: Rich::new(
                "An attempt stopped between its effect and the record of its outcome, and the server could not tell whether it took effect; `reason` says why or names the runbook. An operator resolves it.",
            ),
            action: Rich::new(
                "Do not start it again with a new key; contact the API's provider with the `operation_id`, or ask again later.",
            ),
        },
    ];
    let not_found = ProblemType::OperationNotFound;
    out.push(Answer {
        answer: Rich::new("").code(status_words(not_found.status())),
        problem_type: Some(Rich::default().code(not_found.type_uri())),
        meaning: Rich::new(&format!(
            "No operation has this key for you: no attempt with it reached the server, or its lifetime ({ttl}) has passed. `new_key_safe` is `true`."
        )),
        action: Rich::new("Within the key's lifetime nothing happened under it: send the request again with the same key."),
    });
    let malformed = ProblemType::KeyMalformed;
    out.push(Answer {
        answer: Rich::new("").code(status_words(malformed.status())),
        problem_type: Some(Rich::default().code(malformed.type_uri())),
        meaning: Rich::new(
            "The key in the path is not one this operation accepts, so no operation can have it.",
        ),
        action: Rich::new("Ask with the key exactly as your requests sent it, percent-encoded."),
    });
    let identity = ProblemType::ClientIdentityMissing;
    out.push(Answer {
        answer: Rich::new("").code(status_words(identity.status())),
        problem_type: Some(Rich::default().code(identity.type_uri())),
        meaning: Rich::new("The server could not tell which client is asking. Operations are kept per client: another client's lookup never sees yours."),
        action: match identity_header(info) {
            Some(name) => Rich::new("Ask again with the ").code(name).text(" header your requests carried."),
            None => Rich::new("Ask again with the credentials your requests carried."),
        },
    });
    let store = ProblemType::StoreUnavailable;
    out.push(Answer {
        answer: Rich::new("").code(status_words(store.status())),
        problem_type: Some(Rich::default().code(store.type_uri())),
        meaning: Rich::new("The server cannot reach the store that remembers keys, so it cannot tell the state now."),
        action: Rich::new("Ask again after `Retry-After`."),
    });
    out
}

fn problem_answer(p: &ProblemType, retryable: Option<bool>) -> Answer {
    let answer = Rich::default().code(status_words(p.status()));
    let action = match retryable {
        Some(false) => format!(
            "{}; 503 is not in this operation's retry list, so stop after it and ask the status lookup",
            p.action()
        ),
        _ => p.action().to_owned(),
    };
    Answer {
        answer,
        problem_type: Some(Rich::default().code(p.type_uri())),
        meaning: Rich::new(&sentence(p.meaning())),
        action: Rich::new(&sentence(&action)),
    }
}

fn sentence(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect::<String>() + ".",
        None => String::new(),
    }
}

/// The request line, headers and body of an attempt on the operation `name`.
fn request(c: &Contract, info: &OperationInfo, name: &str) -> String {
    let method = info.method.as_deref().unwrap_or("POST");
    let path = info
        .path
        .clone()
        .unwrap_or_else(|| format!("<the URL of {name}>"));
    let (in_header, key) = header_or_field(c);
    let mut members: Vec<String> = Vec::new();
    if !in_header {
        members.push(nested(&key, &format!("\"{EXAMPLE_KEY}\"")));
    }
    if let Fingerprint::Fields(fields) = &c.fingerprint {
        for f in fields.iter() {
            if f.as_str() != key {
                members.push(nested(f.as_str(), "…"));
            }
        }
    }
    members.push("…".to_owned());
    let mut text = format!("{method} {path} HTTP/1.1\nContent-Type: application/json\n");
    for h in other_headers(c, info) {
        text.push_str(&format!("{}: {}\n", h.name, h.value));
    }
    if in_header {
        text.push_str(&format!("{key}: {EXAMPLE_KEY}\n"));
    }
    text.push_str(&format!("\n{{ {} }}", members.join(", ")));
    text
}

/// The headers the operation requires besides the key: the document's, and the client
/// identity header when the document does not list it.
fn other_headers(c: &Contract, info: &OperationInfo) -> Vec<HeaderExample> {
    let key = c.key_scope.header();
    let mut out: Vec<HeaderExample> = info
        .headers
        .iter()
        .filter(|h| key.is_none_or(|k| !h.name.eq_ignore_ascii_case(k)))
        .cloned()
        .collect();
    if let Some(name) = info.identity.as_ref().and_then(|i| i.header_name())
        && !out.iter().any(|h| h.name.eq_ignore_ascii_case(name))
    {
        out.insert(
            0,
            HeaderExample {
                name: name.to_owned(),
                value: format!("<your {name}>"),
                placeholder: true,
            },
        );
    }
    out
}

/// `"a": v` or `"a": { "b": v }` for a dotted path.
fn nested(path: &str, value: &str) -> String {
    let segments: Vec<&str> = path.split('.').collect();
    let mut out = value.to_owned();
    for (i, s) in segments.iter().enumerate().rev() {
        out = if i == 0 {
            format!("\"{s}\": {out}")
        } else {
            format!("{{ \"{s}\": {out} }}")
        };
    }
    out
}

pub(super) fn example(c: &Contract, info: &OperationInfo, name: &str) -> Vec<Step> {
    let success = info
        .success
        .clone()
        .unwrap_or_else(|| "201 Created".to_owned());
    let replay = format!(
        "HTTP/1.1 {success}\nIdempotent-Replayed: true\nOperation-Id: 0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f\n\n(the answer of attempt 1, byte for byte)"
    );
    let req = request(c, info, name);
    let mut first =
        Rich::new("Attempt 1: make a new key for this intent, keep it, and send the request.");
    let headers = other_headers(c, info);
    if !headers.is_empty() {
        let mut names = Rich::default();
        for (i, h) in headers.iter().enumerate() {
            if i > 0 {
                names = names.text(if i + 1 == headers.len() {
                    " and "
                } else {
                    ", "
                });
            }
            names = names.code(&h.name);
        }
        first = first
            .text(if headers.len() == 1 {
                " Besides the key, the operation requires the header "
            } else {
                " Besides the key, the operation requires the headers "
            })
            .then(names)
            .text(if headers.iter().any(|h| h.placeholder) {
                " on every attempt; put your own value where the example shows `<…>`."
            } else {
                " on every attempt (the example shows sample values)."
            });
    }
    let mut steps = vec![
        Step {
            text: first,
            http: Some(req.clone()),
        },
        Step {
            text: Rich::new(
                "The connection drops before the answer arrives. The operation may or may not have happened on the server, so the same intent is retried with the same key, never a new one.",
            ),
            http: None,
        },
    ];
    let lookup = lookup_path(c).unwrap_or_else(|| "<the status lookup>/{key}".to_owned());
    if c.max_attempts < 2 {
        steps.push(Step {
            text: Rich::new("This operation allows one attempt, so ask the status lookup with the key instead:"),
            http: Some(format!("GET {} HTTP/1.1\n\n→ the state of the operation and, once it is completed, its outcome", lookup.replace("{key}", EXAMPLE_KEY))),
        });
        return steps;
    }
    match c.concurrency {
        Concurrency::Conflict { retry_after } if c.max_attempts >= 3 => {
            steps.push(Step {
                text: Rich::new("Attempt 2, after a short random wait: the same request with the same key. Attempt 1 is still running on the server:"),
                http: Some(format!(
                    // One member a line, so that the body fits a page and a phone scrolls it.
                    "HTTP/1.1 409 Conflict\nContent-Type: application/problem+json\nRetry-After: {secs}\nOperation-Id: 0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f\n\n{{\n  \"type\": \"{uri}\",\n  \"title\": \"Operation in progress\",\n  \"status\": 409,\n  \"operation_id\": \"0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f\",\n  \"state\": \"processing\",\n  \"new_key_safe\": false\n}}",
                    secs = retry_after.as_secs_ceil(),
                    uri = format_args!("{}operation-in-progress", problem::TYPE_PREFIX),
                )),
            });
            steps.push(Step {
                text: Rich::new(&format!("Attempt 3, after `Retry-After` ({}): the same request with the same key. Attempt 1 has finished, and its stored answer comes back:", words::count(retry_after.as_secs_ceil(), "second"))),
                http: Some(replay),
            });
        }
        Concurrency::Accepted => {
            steps.push(Step {
                text: Rich::new("Attempt 2, after a short random wait: the same request with the same key. Attempt 1 is still running, so the server answers with where to look:"),
                http: Some(format!("HTTP/1.1 202 Accepted\nLocation: {}\nOperation-Id: 0191f6a4-7a2b-7c3d-8e4f-5a6b7c8d9e0f", lookup.replace("{key}", EXAMPLE_KEY))),
            });
            steps.push(Step {
                text: Rich::new("Ask the status lookup at `Location`, with backoff, until it reports the outcome."),
                http: None,
            });
        }
        Concurrency::Wait { limit } => {
            steps.push(Step {
                text: Rich::new(&format!("Attempt 2, after a short random wait: the same request with the same key. The server waits up to {} for attempt 1 and answers with its stored result:", words::duration(limit))),
                http: Some(replay),
            });
        }
        Concurrency::Conflict { .. } => {
            steps.push(Step {
                text: Rich::new("Attempt 2, after a short random wait: the same request with the same key. Attempt 1 has finished, and its stored answer comes back:"),
                http: Some(replay),
            });
        }
    }
    steps.push(Step {
        text: Rich::new("The operation happened once. Every attempt carried the same `Operation-Id`, which links them in the server's logs."),
        http: None,
    });
    steps
}
