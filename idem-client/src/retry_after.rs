//! The `Retry-After` response header (RFC 9110 §10.2.3): how long the server asks the
//! client to wait before its next request.
//!
//! The value is either a number of seconds (`delay-seconds`, `120`) or an HTTP-date
//! (`Sun, 06 Nov 1994 08:49:37 GMT`). [`parse`] turns either into a delay from a given
//! `now`, or into `None` when the value says nothing usable; the caller then falls back to
//! its own backoff.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use idem_client::retry_after;
//!
//! let now = SystemTime::now();
//! assert_eq!(retry_after::parse(b"120", now), Some(Duration::from_secs(120)));
//! assert_eq!(retry_after::parse(b"soon", now), None);
//! ```

use std::time::{Duration, SystemTime};

/// The longest delay [`parse`] returns: `u32::MAX` seconds (about 136 years).
///
/// Longer values, in seconds or as a date, are cut down to it instead of overflowing.
/// This is a limit of representation, not a policy: no deadline a caller can set comes
/// near it, so a caller that compares the delay with its deadline sees the same answer
/// (give up) as it would with the server's exact value, and never one shorter than the
/// server asked for.
pub const MAX_DELAY: Duration = Duration::from_secs(u32::MAX as u64);

/// The delay a `Retry-After` value asks for, measured from `now`.
///
/// `value` is the header's value as received: optional whitespace (SP, HTAB) around it is
/// allowed, as around every field value. Then the value must be, whole:
///
/// - `delay-seconds`: one or more ASCII digits (`1*DIGIT`), with no sign, decimal point
///   or unit. `0` is `Some(Duration::ZERO)`: retry at once. Values above [`MAX_DELAY`]
///   are cut down to it.
/// - an HTTP-date, in any of the three forms RFC 9110 §5.6.7 requires recipients to
///   accept: IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form
///   (`Sunday, 06-Nov-94 08:49:37 GMT`) and ANSI C's asctime form
///   (`Sun Nov  6 08:49:37 1994`). Parsed by [`httpdate`], which also requires the day
///   name to match the date. The delay is the date minus `now`, cut down to
///   [`MAX_DELAY`]; a date at or before `now` is `None`, since a server's clock and the
///   client's differ and a past date asks for no particular delay.
///
/// Anything else (empty, not ASCII, other characters, a zone other than `GMT`) is `None`.
/// Never panics.
///
/// Two-digit years of the RFC 850 form are read by `httpdate` with a fixed pivot (`00`
/// to `69` are 2000 to 2069, `70` to `99` are 1970 to 1999), not with RFC 9110's rule of
/// the most recent year in the past for a year more than 50 years ahead. The first date
/// they read differently is in 2070 (`70`, which `httpdate` reads as 1970, so `None`),
/// decades away, and no server asks for such a delay in `Retry-After`.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use idem_client::retry_after::parse;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 1994-11-06 08:49:37
/// let later = Some(Duration::from_secs(60));
/// assert_eq!(parse(b"60", now), later);
/// assert_eq!(parse(b"Sun, 06 Nov 1994 08:50:37 GMT", now), later);
/// assert_eq!(parse(b"Sunday, 06-Nov-94 08:50:37 GMT", now), later);
/// assert_eq!(parse(b"Sun Nov  6 08:50:37 1994", now), later);
/// assert_eq!(parse(b"Sun, 06 Nov 1994 08:49:37 GMT", now), None); // not later than now
/// assert_eq!(parse(b"1.5", now), None);
/// ```
pub fn parse(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = trim_ows(value);
    if value.is_empty() {
        return None;
    }
    // A date starts with a day name; anything starting with a digit is `delay-seconds`.
    if value.first().is_some_and(u8::is_ascii_digit) {
        return delay_seconds(value);
    }
    // Visible ASCII and spaces only: `httpdate` would itself trim other whitespace (CR,
    // LF, form feed) that has no place in a field value.
    if !value.iter().all(|&b| (b' '..=b'~').contains(&b)) {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let date = httpdate::parse_http_date(text).ok()?;
    match date.duration_since(now) {
        Ok(delay) if !delay.is_zero() => Some(delay.min(MAX_DELAY)),
        _ => None,
    }
}

/// `value` without leading and trailing optional whitespace (`OWS`: SP and HTAB).
fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    value.get(start..end).unwrap_or_default()
}

/// The delay of `delay-seconds` (`1*DIGIT`), saturating at [`MAX_DELAY`]; `None` if
/// `digits` holds anything but ASCII digits.
fn delay_seconds(digits: &[u8]) -> Option<Duration> {
    let max = MAX_DELAY.as_secs();
    let mut secs: u64 = 0;
    for &byte in digits {
        let digit = char::from(byte).to_digit(10)?;
        secs = secs
            .saturating_mul(10)
            .saturating_add(u64::from(digit))
            .min(max);
    }
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::UNIX_EPOCH;

    /// 1994-11-06 08:49:37 UTC, RFC 9110's example date.
    const EXAMPLE: u64 = 784_111_777;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Two minutes before RFC 9110's example date.
    fn two_minutes_before() -> SystemTime {
        at(EXAMPLE - 120)
    }

    #[test]
    fn delay_seconds_examples() {
        let now = SystemTime::now();
        assert_eq!(parse(b"0", now), Some(Duration::ZERO));
        assert_eq!(parse(b"1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse(b"120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse(b"007", now), Some(Duration::from_secs(7)));
        assert_eq!(parse(b" \t 120\t ", now), Some(Duration::from_secs(120)));
    }

    #[test]
    fn large_numbers_saturate_at_max_delay() {
        let now = SystemTime::now();
        let max = u32::MAX.to_string();
        assert_eq!(parse(max.as_bytes(), now), Some(MAX_DELAY));
        let above = (u64::from(u32::MAX) + 1).to_string();
        assert_eq!(parse(above.as_bytes(), now), Some(MAX_DELAY));
        assert_eq!(parse(u64::MAX.to_string().as_bytes(), now), Some(MAX_DELAY));
        let overlong = "9".repeat(10_000);
        assert_eq!(parse(overlong.as_bytes(), now), Some(MAX_DELAY));
        let zeros_then_one = format!("{}1", "0".repeat(10_000));
        assert_eq!(
            parse(zeros_then_one.as_bytes(), now),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn the_three_date_forms_of_one_instant_give_one_delay() {
        let now = two_minutes_before();
        let expected = Some(Duration::from_secs(120));
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:49:37 GMT", // RFC 850
            "Sun Nov  6 08:49:37 1994",       // asctime
            " Sun, 06 Nov 1994 08:49:37 GMT\t",
        ] {
            assert_eq!(parse(form.as_bytes(), now), expected, "{form:?}");
        }
    }

    #[test]
    fn the_delay_keeps_the_fraction_of_a_second_of_now() {
        let now = two_minutes_before() + Duration::from_millis(250);
        assert_eq!(
            parse(b"Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_millis(119_750))
        );
    }

    #[test]
    fn a_date_at_or_before_now_is_none() {
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse(date, at(EXAMPLE)), None);
        assert_eq!(parse(date, at(EXAMPLE + 1)), None);
        assert_eq!(parse(date, at(EXAMPLE) + Duration::from_nanos(1)), None);
        assert_eq!(parse(date, SystemTime::now()), None);
        assert_eq!(
            parse(date, at(EXAMPLE) - Duration::from_nanos(1)),
            Some(Duration::from_nanos(1))
        );
    }

    #[test]
    fn a_far_date_saturates_at_max_delay() {
        assert_eq!(
            parse(b"Fri, 31 Dec 9999 23:59:59 GMT", at(EXAMPLE)),
            Some(MAX_DELAY)
        );
    }

    #[test]
    fn garbage_is_none() {
        let now = two_minutes_before();
        let overlong_then_junk = format!("{}x", "9".repeat(10_000));
        let garbage: &[&[u8]] = &[
            b"",
            b" ",
            b"\t",
            b"-1",
            b"-0",
            b"1.5",
            b"1.",
            b"+3",
            b"1e3",
            b"0x10",
            b"1 2",
            b"120 s",
            b"120s",
            b"12\r\n",
            b"\n12",
            b"\xff\xfe",
            b"1\xff",
            "\u{ff11}\u{ff12}".as_bytes(), // full-width digits
            b"soon",
            overlong_then_junk.as_bytes(),
            b"Sun, 06 Nov 1994 08:49:37 PST",
            b"Sun, 06 Nov 1994 08:49:37 UTC",
            b"Sun, 06 Nov 1994 08:49:37",
            b"sun, 06 nov 1994 08:49:37 gmt",
            b"Sun, 6 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 94 08:49:37 GMT",
            b"Sun,  06 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 08:49:37 GMT\n",
            b"\x0cSun, 06 Nov 1994 08:49:37 GMT",
            b"Sun, 31 Feb 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 24:00:00 GMT",
            b"Sun, 06 Nov 1994 08:49:37 GMT, 120",
            b"120, Sun, 06 Nov 1994 08:49:37 GMT",
        ];
        for value in garbage {
            assert_eq!(
                parse(value, now),
                None,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    /// What `httpdate` does where RFC 9110 says something else or nothing: pinned here so
    /// that a new version of `httpdate` that changes it is noticed.
    #[test]
    fn httpdate_quirks() {
        let now = two_minutes_before();
        // The day name must match the date: 1994-11-06 was a Sunday.
        assert_eq!(parse(b"Mon, 06 Nov 1994 08:49:37 GMT", now), None);
        // A leap second (RFC 9110 §5.6.7 allows `60`) is refused.
        assert_eq!(parse(b"Sat, 31 Dec 2016 23:59:60 GMT", now), None);
        // Two-digit years: a fixed pivot at 70, not RFC 9110's 50-year rule. On
        // 2026-01-01, RFC 9110 reads `01-Jan-70` as 2070-01-01 (a Wednesday, 44 years
        // ahead); httpdate reads it as 1970-01-01 (a Thursday), so the date is either in
        // the past or has the wrong day name.
        let new_year_2026 = at(1_767_225_600);
        assert_eq!(
            parse(b"Wednesday, 01-Jan-70 00:00:00 GMT", new_year_2026),
            None
        );
        assert_eq!(
            httpdate::parse_http_date("Thursday, 01-Jan-70 00:00:00 GMT").ok(),
            Some(UNIX_EPOCH)
        );
        // `69` is 2069-01-01 (a Tuesday), as RFC 9110 also reads it in 2026.
        assert_eq!(
            parse(b"Tuesday, 01-Jan-69 00:00:00 GMT", new_year_2026),
            Some(Duration::from_secs(1_356_998_400))
        );
        // asctime accepts a two-digit day as well as a space and one digit.
        assert_eq!(
            parse(b"Sun Nov 06 08:49:37 1994", now),
            Some(Duration::from_secs(120))
        );
        // Years before 1970 are refused rather than read.
        assert_eq!(
            httpdate::parse_http_date("Thu, 01 Jan 1969 00:00:00 GMT").ok(),
            None
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), secs in any::<i64>()) {
            let offset = Duration::from_secs(secs.unsigned_abs());
            let now = if secs < 0 { UNIX_EPOCH.checked_sub(offset) } else { UNIX_EPOCH.checked_add(offset) };
            let now = now.unwrap_or(UNIX_EPOCH);
            if let Some(delay) = parse(&bytes, now) {
                prop_assert!(delay <= MAX_DELAY);
            }
        }

        #[test]
        fn date_like_text_never_panics(text in "[A-Za-z0-9 ,:-]{0,40}") {
            let _ = parse(text.as_bytes(), SystemTime::now());
        }

        #[test]
        fn dates_with_one_byte_changed_never_panic(
            form in prop::sample::select(&[
                "Sun, 06 Nov 1994 08:49:37 GMT",
                "Sunday, 06-Nov-94 08:49:37 GMT",
                "Sun Nov  6 08:49:37 1994",
            ][..]),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = form.as_bytes().to_vec();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let _ = parse(&bytes, two_minutes_before());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn any_u32_is_that_many_seconds(n in any::<u32>(), before in "[ \t]{0,3}", after in "[ \t]{0,3}") {
            let value = format!("{before}{n}{after}");
            prop_assert_eq!(
                parse(value.as_bytes(), SystemTime::now()),
                Some(Duration::from_secs(u64::from(n)))
            );
        }

        #[test]
        fn any_larger_number_is_max_delay(n in u64::from(u32::MAX)..=u64::MAX) {
            prop_assert_eq!(parse(n.to_string().as_bytes(), SystemTime::now()), Some(MAX_DELAY));
        }

        #[test]
        fn a_formatted_date_parses_back_within_a_second(
            now_secs in 0u64..240_000_000_000,
            now_nanos in 0u32..1_000_000_000,
            delay_secs in 1u64..=MAX_DELAY.as_secs(),
            delay_nanos in 0u32..1_000_000_000,
        ) {
            let now = UNIX_EPOCH + Duration::new(now_secs, now_nanos);
            let delay = Duration::new(delay_secs, delay_nanos).min(MAX_DELAY);
            let date = httpdate::fmt_http_date(now + delay);
            let parsed = parse(date.as_bytes(), now);
            // The date has whole seconds: it is up to a second before `now + delay`.
            prop_assert!(
                parsed.is_some_and(|p| p <= delay && delay - p < Duration::from_secs(1)),
                "{date}: {parsed:?} for {delay:?}"
            );
        }
    }
}
