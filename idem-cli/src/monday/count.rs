//! Counting the business effects: `--effects-url` (its whole body a number, or the number
//! a JSON pointer names in it: `--effects-pointer`) or `--effects-command`.

use std::time::Duration;

use idem_codegen::error::{Error, Errors};
use idem_testing::Harness;
use serde_json::Value;

/// How long one count of the effects may take.
const COUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// The number a counter printed or answered, when it is the whole text.
fn number(text: &str, from: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    trimmed.parse::<u64>().map_err(|_| {
        let shown: String = trimmed.chars().take(80).collect();
        format!(
            "{from} gave `{shown}`, not a number of effects{}",
            pointer_hint(trimmed)
        )
    })
}

/// For a JSON object, how to name the count in it.
fn pointer_hint(text: &str) -> String {
    let Ok(Value::Object(members)) = serde_json::from_str::<Value>(text) else {
        return String::new();
    };
    let example = members
        .iter()
        .find(|(_, v)| v.as_u64().is_some())
        .map_or("/orders".to_owned(), |(name, _)| {
            format!("/{}", name.replace('~', "~0").replace('/', "~1"))
        });
    format!(": name the count in it with `--effects-pointer {example}` (a JSON pointer)")
}

/// The number the JSON pointer `pointer` names in `text`.
fn at_pointer(text: &str, pointer: &str, from: &str) -> Result<u64, String> {
    let shown = || text.trim().chars().take(80).collect::<String>();
    let document: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "{from} gave `{}`, not JSON ({e}): `--effects-pointer {pointer}` reads a JSON body",
            shown()
        )
    })?;
    let Some(found) = document.pointer(pointer) else {
        return Err(format!(
            "{from} gave `{}`, where `{pointer}` names nothing{}",
            shown(),
            members(&document)
        ));
    };
    found.as_u64().ok_or_else(|| {
        format!(
            "{from} gave `{found}` at `{pointer}`, {}, not a number of effects (a whole number, 0 or more)",
            kind(found)
        )
    })
}

/// The members of an object, for a pointer that names nothing in it.
fn members(document: &Value) -> String {
    match document {
        Value::Object(members) if !members.is_empty() => {
            let names: Vec<String> = members.keys().take(10).map(|k| format!("`/{k}`")).collect();
            format!(" (its members: {})", names.join(", "))
        }
        _ => String::new(),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number with a fraction",
        Value::Number(_) => "a negative number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn by_url(
    harness: Harness,
    url: &str,
    pointer: Option<String>,
) -> Result<Harness, Errors> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| Error::new(format!("`--effects-url {url}` is not a URL: {e}")))?;
    if parsed.scheme() != "http" && parsed.scheme() != "https" {
        return Err(Error::new(format!("`--effects-url {url}` is not an http URL")).into());
    }
    let client = reqwest::Client::builder()
        .timeout(COUNT_TIMEOUT)
        .build()
        .map_err(|e| Error::new(format!("cannot build the HTTP client: {e}")))?;
    Ok(harness.count_effects(move || {
        let client = client.clone();
        let url = parsed.clone();
        let pointer = pointer.clone();
        async move {
            let from = format!("GET {url}");
            let response = client
                .get(url)
                .send()
                .await
                .map_err(|e| format!("{from} failed: {e}"))?;
            let status = response.status();
            let text = response
                .text()
                .await
                .map_err(|e| format!("{from} failed: {e}"))?;
            if !status.is_success() {
                return Err(format!("{from} answered {status}"));
            }
            match &pointer {
                Some(pointer) => at_pointer(&text, pointer, &from),
                None => number(&text, &from),
            }
        }
    }))
}

pub(super) fn by_command(harness: Harness, command: &str) -> Result<Harness, Errors> {
    if command.trim().is_empty() {
        return Err(Error::new("`--effects-command` is empty").into());
    }
    let command = command.to_owned();
    Ok(harness.count_effects(move || {
        let command = command.clone();
        async move {
            let from = format!("the effects command `{command}`");
            let run = command.clone();
            let output = tokio::task::spawn_blocking(move || {
                std::process::Command::new("sh")
                    .arg("-c")
                    .arg(&run)
                    .stdin(std::process::Stdio::null())
                    .output()
            })
            .await
            .map_err(|e| format!("{from} did not finish: {e}"))?
            .map_err(|e| format!("{from} cannot run: {e}"))?;
            if !output.status.success() {
                let stderr = String::from_utf8_lossy(&output.stderr);
                return Err(format!(
                    "{from} failed ({}): {}",
                    output.status,
                    stderr.trim().chars().take(200).collect::<String>()
                ));
            }
            number(&String::from_utf8_lossy(&output.stdout), &from)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_is_the_whole_body_or_what_the_pointer_names() {
        assert_eq!(number(" 7\n", "GET u"), Ok(7));
        let hint = number(r#"{"name": "x", "orders": 0}"#, "GET u").unwrap_err();
        assert!(
            hint.ends_with(
                "name the count in it with `--effects-pointer /orders` (a JSON pointer)"
            ),
            "{hint}"
        );
        let body =
            r#"{"orders": 3, "stats": {"a/b": [1, 2]}, "ratio": 1.5, "name": "x", "neg": -1}"#;
        assert_eq!(at_pointer(body, "/orders", "GET u"), Ok(3));
        assert_eq!(at_pointer(body, "/stats/a~1b/1", "GET u"), Ok(2));
        assert_eq!(at_pointer("12", "", "GET u"), Ok(12));
        for (pointer, why) in [
            (
                "/missing",
                "where `/missing` names nothing (its members: `/orders`",
            ),
            (
                "/ratio",
                "gave `1.5` at `/ratio`, a number with a fraction, not a number of effects",
            ),
            ("/name", "gave `\"x\"` at `/name`, a string"),
            ("/neg", "a negative number"),
            ("/stats", "an object"),
        ] {
            let error = at_pointer(body, pointer, "GET u").unwrap_err();
            assert!(error.contains(why), "{pointer}: {error}");
        }
        let error = at_pointer("7 orders", "/orders", "GET u").unwrap_err();
        assert!(error.contains("not JSON"), "{error}");
    }
}
