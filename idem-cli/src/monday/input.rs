//! The values of `idem monday`'s options that are more than a string: the client's
//! headers and cookies (`NAME=VALUE`), the correlation header, the effects' JSON pointer.

use idem_codegen::error::{Error, Errors};

/// `--client-header NAME=VALUE`, each; a name given twice, a cookie or the key header
/// is refused, each with its reason.
pub(super) fn client_headers(
    given: &[String],
    key_header: &str,
) -> Result<Vec<(String, String)>, Errors> {
    let mut errors = Vec::new();
    let mut out: Vec<(String, String)> = Vec::new();
    for text in given {
        let bad = |why: &str| Error::new(format!("`--client-header {text}`: {why}"));
        match header(text) {
            Err(why) => errors.push(bad(&why)),
            Ok((name, _)) if name.eq_ignore_ascii_case("cookie") => errors.push(bad(
                "cookies are given with `--cookie NAME=VALUE`, one each",
            )),
            Ok((name, _)) if name.eq_ignore_ascii_case(key_header) => errors.push(bad(&format!(
                "`{name}` carries the idempotency key, which the harness sets for each scenario"
            ))),
            Ok((name, _)) if out.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) => {
                errors.push(bad(&format!("`{name}` is given twice")));
            }
            Ok(pair) => out.push(pair),
        }
    }
    collected(errors, out)
}

/// `out`, or every error found (inputs are checked as a whole).
fn collected<T>(errors: Vec<Error>, out: T) -> Result<T, Errors> {
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(Errors(errors))
    }
}

/// `NAME=VALUE` as a header.
fn header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or("write it `NAME=VALUE`, such as `x-client-id=acme`")?;
    let name = name.trim();
    if name.is_empty() {
        return Err("the name is empty: write it `NAME=VALUE`".into());
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!("`{name}` is not a header name"));
    }
    if value.trim().is_empty() {
        return Err(format!("the value of `{name}` is empty"));
    }
    if http::HeaderValue::from_str(value).is_err() {
        return Err(format!("the value of `{name}` is not a header value"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// `--cookie NAME=VALUE`, each: a cookie name (a token) and a value a cookie can hold.
pub(super) fn cookies(given: &[String]) -> Result<Vec<(String, String)>, Errors> {
    let mut errors = Vec::new();
    let mut out = Vec::new();
    for text in given {
        match cookie(text) {
            Ok(pair) => out.push(pair),
            Err(why) => errors.push(Error::new(format!("`--cookie {text}`: {why}"))),
        }
    }
    collected(errors, out)
}

fn cookie(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or("write it `NAME=VALUE`, such as `session=abc123`")?;
    if name.is_empty() {
        return Err("the name is empty: write it `NAME=VALUE`".into());
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(format!(
            "`{name}` is not a cookie name (a token: letters, digits and !#$%&'*+-.^_`|~)"
        ));
    }
    if value.is_empty() {
        return Err(format!("the value of `{name}` is empty"));
    }
    let inner = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    if let Some(bad) = inner.chars().find(|c| !cookie_octet(*c)) {
        return Err(format!(
            "the value of `{name}` holds {bad:?}, which a cookie value cannot (no blank, control, `\"`, `,`, `;` or `\\`)"
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

fn cookie_octet(c: char) -> bool {
    matches!(c, '\x21' | '\x23'..='\x2b' | '\x2d'..='\x3a' | '\x3c'..='\x5b' | '\x5d'..='\x7e')
}

/// `--operation-id-header NAME`.
pub(super) fn operation_id_header(name: &str) -> Result<String, Errors> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Err(Error::new(
            "`--operation-id-header` is empty: give the answer header that names the operation, such as `Operation-Id` (the default) or `X-Request-Id`",
        )
        .into());
    }
    if http::HeaderName::from_bytes(trimmed.as_bytes()).is_err() {
        return Err(Error::new(format!(
            "`--operation-id-header {name}`: `{trimmed}` is not a header name"
        ))
        .into());
    }
    Ok(trimmed.to_owned())
}

/// `--effects-pointer POINTER`: a JSON pointer (RFC 6901) that names something.
pub(super) fn pointer(text: &str) -> Result<String, Errors> {
    let bad = |why: &str| Error::new(format!("`--effects-pointer {text}`: {why}"));
    if text.is_empty() {
        return Err(Error::new(
            "`--effects-pointer` is empty: give the JSON pointer of the count, such as `/orders` (without the option the whole body must be a number)",
        )
        .into());
    }
    if !text.starts_with('/') {
        return Err(bad(&format!(
            "a JSON pointer (RFC 6901) starts with `/`, such as `/{}`",
            text.trim_start_matches('#')
        ))
        .into());
    }
    let mut rest = text;
    while let Some(at) = rest.find('~') {
        match rest.as_bytes().get(at + 1) {
            Some(b'0' | b'1') => rest = &rest[at + 2..],
            _ => {
                return Err(bad(
                    "in a JSON pointer `~` is followed by `0` (for `~`) or `1` (for `/`)",
                )
                .into());
            }
        }
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers() {
        assert_eq!(pointer("/orders").unwrap(), "/orders");
        assert_eq!(pointer("/a~1b/0/~0").unwrap(), "/a~1b/0/~0");
        for (bad, why) in [
            ("", "is empty"),
            ("orders", "starts with `/`, such as `/orders`"),
            ("#/orders", "such as `//orders`"),
            ("/a~2", "`~` is followed by"),
            ("/a~", "`~` is followed by"),
        ] {
            let error = pointer(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{bad}: {error}");
        }
    }
}
