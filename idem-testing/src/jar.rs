//! The run's cookies: those given ([`Harness::cookie`](crate::Harness::cookie)) and those
//! the service sets, sent with every request of the run.
//!
//! One jar per run, not per host, path or port: the run talks to one service on loopback,
//! directly and through the lost-answer proxy (another port), and a session-scoped service
//! must see one session in all of it. A `Set-Cookie` replaces the cookie of its name;
//! `Max-Age` of 0 or less, or an `Expires` in the past, removes it; other attributes are
//! not read.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The cookies of one run, shared by its requests (the concurrent ones too).
#[derive(Clone, Debug, Default)]
pub(super) struct Jar(Arc<Mutex<Vec<(String, String)>>>);

impl Jar {
    /// A jar holding the cookies given, in order.
    pub(super) fn new(given: &[(String, String)]) -> Jar {
        Jar(Arc::new(Mutex::new(given.to_vec())))
    }

    fn cookies(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `Cookie` header's value (`a=1; b=2`), if the jar holds any.
    pub(super) fn header(&self) -> Option<String> {
        let cookies = self.cookies();
        if cookies.is_empty() {
            return None;
        }
        let pairs: Vec<String> = cookies.iter().map(|(n, v)| format!("{n}={v}")).collect();
        Some(pairs.join("; "))
    }

    /// Keeps what one `Set-Cookie` value sets (one that cannot be read is ignored, as a
    /// browser would).
    pub(super) fn set(&self, set_cookie: &str) {
        let mut parts = set_cookie.split(';');
        let Some((name, value)) = parts.next().and_then(|pair| pair.split_once('=')) else {
            return;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            return;
        }
        let removed = expired(parts);
        let mut cookies = self.cookies();
        let at = cookies.iter().position(|(n, _)| n == name);
        match (at, removed) {
            (Some(at), true) => {
                cookies.remove(at);
            }
            (Some(at), false) => cookies[at].1 = value.to_owned(),
            (None, true) => {}
            (None, false) => cookies.push((name.to_owned(), value.to_owned())),
        }
    }
}

/// Whether a cookie's attributes end it now: `Max-Age` (which wins when both are given)
/// of 0 or less, or an `Expires` in the past.
fn expired<'a>(attributes: impl Iterator<Item = &'a str>) -> bool {
    let (mut max_age, mut expires) = (None, None);
    for attribute in attributes {
        let Some((name, value)) = attribute.split_once('=') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("max-age") {
            max_age = value.parse::<i64>().ok();
        } else if name.eq_ignore_ascii_case("expires") {
            expires = httpdate::parse_http_date(value).ok();
        }
    }
    match (max_age, expires) {
        (Some(seconds), _) => seconds <= 0,
        (None, Some(at)) => at <= SystemTime::now(),
        (None, None) => false,
    }
}

/// Why `name=value` cannot be sent as a cookie, if it cannot: the name must be a token,
/// the value cookie octets (no blank, `"`, `,`, `;` or `\`), optionally in double quotes.
pub(super) fn cookie_problem(name: &str, value: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the cookie's name is empty".into());
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Some(format!(
            "`{name}` is not a cookie name (a token: letters, digits and !#$%&'*+-.^_`|~)"
        ));
    }
    let inner = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    if let Some(bad) = inner.chars().find(|c| !cookie_octet(*c)) {
        return Some(format!(
            "the value of the cookie `{name}` holds {bad:?}, which a cookie value cannot (no blank, control, `\"`, `,`, `;` or `\\`)"
        ));
    }
    None
}

fn cookie_octet(c: char) -> bool {
    matches!(c, '\x21' | '\x23'..='\x2b' | '\x2d'..='\x3a' | '\x3c'..='\x5b' | '\x5d'..='\x7e')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_cookie_adds_replaces_and_removes() {
        let jar = Jar::new(&[("sid".into(), "given".into())]);
        assert_eq!(jar.header().as_deref(), Some("sid=given"));
        jar.set("theme=dark; Path=/; HttpOnly");
        jar.set("sid=fresh; Max-Age=3600; Expires=Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(jar.header().as_deref(), Some("sid=fresh; theme=dark"));
        jar.set("theme=; Expires=Thu, 01 Jan 1970 00:00:00 GMT");
        jar.set("sid=gone; Max-Age=0");
        jar.set("no pair here");
        jar.set("=nameless");
        assert_eq!(jar.header(), None);
    }

    #[test]
    fn cookie_problems_are_named() {
        assert_eq!(cookie_problem("sid", "abc"), None);
        assert_eq!(cookie_problem("sid", "\"quoted\""), None);
        assert_eq!(cookie_problem("sid", ""), None);
        assert!(cookie_problem("", "x").unwrap().contains("name is empty"));
        assert!(
            cookie_problem("s id", "x")
                .unwrap()
                .contains("not a cookie name")
        );
        assert!(cookie_problem("sid", "a;b").unwrap().contains("';'"));
        assert!(cookie_problem("sid", "a b").unwrap().contains("' '"));
    }
}
