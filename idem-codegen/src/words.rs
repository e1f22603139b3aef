//! Contract values in plain words, for the OpenAPI descriptions and the consumer docs:
//! readers are client developers in any language, so nothing here is Rust.

use idem_contract::{Duration, Retryable, StatusCode, TransportFailure};

/// `"1 day"`, `"90 minutes"`, `"1.5 seconds"`, `"250 milliseconds"`.
pub fn duration(d: Duration) -> String {
    let millis = d.as_millis();
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1000, "second"),
    ];
    for (size, unit) in UNITS {
        if millis.is_multiple_of(size) {
            return count(millis / size, unit);
        }
    }
    if millis > 1000 {
        // Millisecond precision above a second reads better as a decimal.
        let secs = format!("{}.{:03}", millis / 1000, millis % 1000);
        return format!("{} seconds", secs.trim_end_matches('0'));
    }
    count(millis, "millisecond")
}

/// `"1 attempt"`, `"3 attempts"`.
pub fn count(n: u64, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// `"503 Service Unavailable"`, or `"599"` for a status without a reason phrase.
pub fn status(code: StatusCode) -> String {
    match code.reason() {
        "" => code.to_string(),
        reason => format!("{code} {reason}"),
    }
}

/// A transport failure in a client developer's words.
pub fn transport(t: TransportFailure) -> &'static str {
    match t {
        TransportFailure::Timeout => "no answer within the per-attempt timeout",
        TransportFailure::ConnectionReset => {
            "the connection was closed or reset after the request was sent"
        }
        TransportFailure::ConnectionRefused => "the connection could not be opened",
    }
}

/// One entry of `retryable` in words.
pub fn retryable(r: Retryable) -> String {
    match r {
        Retryable::Status(s) => status(s),
        Retryable::Transport(t) => transport(t).to_owned(),
    }
}

/// `"a"`, `"a and b"`, `"a, b and c"` (or with `"or"`).
pub fn list(items: &[String], last: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., tail] => format!("{} {last} {tail}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        let d = |s: &str| duration(s.parse().unwrap());
        assert_eq!(d("24h"), "1 day");
        assert_eq!(d("90m"), "90 minutes");
        assert_eq!(d("1500ms"), "1.5 seconds");
        assert_eq!(d("250ms"), "250 milliseconds");
        assert_eq!(d("1s"), "1 second");
        assert_eq!(d("30s"), "30 seconds");
        assert_eq!(d("1001ms"), "1.001 seconds");
    }

    #[test]
    fn lists() {
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(list(&items(&["a"]), "and"), "a");
        assert_eq!(list(&items(&["a", "b", "c"]), "or"), "a, b or c");
    }
}
