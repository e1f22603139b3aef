//! Durations written in a contract: `"250ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A positive span of time with millisecond resolution, as written in a contract.
///
/// Written as a whole number and a unit: `"250ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`.
/// Parsing is done by [`humantime`], so compound forms such as `"1h 30m"` are accepted
/// too; printing always uses the largest unit that divides the value (`"90m"`).
///
/// A duration is never zero and never longer than [`Duration::MAX`] (3650 days): both
/// bounds are checked when a duration is parsed, so timestamp arithmetic on it cannot
/// overflow.
///
/// Serialised as its string form (`"24h"`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    millis: u64,
}

/// Why a duration literal was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DurationError {
    /// The text is not a number followed by a unit.
    Malformed {
        /// The text as written.
        text: String,
    },
    /// The duration is zero.
    Zero,
    /// The duration has a part finer than a millisecond (`"1500us"`).
    SubMillisecond,
    /// The duration is longer than [`Duration::MAX`].
    TooLong,
}

/// The accepted forms, quoted in every duration error.
pub const ACCEPTED_FORMS: &str =
    "a whole number and a unit, such as `250ms`, `30s`, `15m`, `24h` or `7d`";

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Malformed { text } => {
                write!(f, "`{text}` is not a duration: write {ACCEPTED_FORMS}")
            }
            DurationError::Zero => write!(f, "a duration cannot be zero: write {ACCEPTED_FORMS}"),
            DurationError::SubMillisecond => {
                write!(
                    f,
                    "durations have millisecond resolution: write {ACCEPTED_FORMS}"
                )
            }
            DurationError::TooLong => write!(f, "a duration cannot be longer than `3650d`"),
        }
    }
}

impl std::error::Error for DurationError {}

impl Duration {
    /// The longest duration a contract may hold: 3650 days.
    pub const MAX: Duration = Duration {
        millis: 3650 * 86_400_000,
    };

    /// A duration of `millis` milliseconds, for generated code and tests.
    ///
    /// This does not check the bounds (it is `const`); use [`Duration::from_str`] for
    /// user input.
    pub const fn from_millis(millis: u64) -> Duration {
        Duration { millis }
    }

    /// The duration in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.millis
    }

    /// The duration as a [`std::time::Duration`].
    pub const fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.millis)
    }

    /// The duration in whole seconds, rounded up: the form of a `Retry-After` header
    /// (RFC 9110 §10.2.3), which cannot say "half a second".
    pub const fn as_secs_ceil(self) -> u64 {
        self.millis.div_ceil(1000)
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Duration, DurationError> {
        let malformed = || DurationError::Malformed {
            text: text.to_owned(),
        };
        // humantime accepts a bare number of seconds nowhere, but it does accept leading
        // and trailing spaces and words such as "sec"; a contract takes what it prints.
        if text.trim() != text || text.is_empty() {
            return Err(malformed());
        }
        let std = humantime::parse_duration(text).map_err(|_| malformed())?;
        if std.is_zero() {
            return Err(DurationError::Zero);
        }
        if std.subsec_nanos() % 1_000_000 != 0 {
            return Err(DurationError::SubMillisecond);
        }
        let millis = u64::try_from(std.as_millis()).map_err(|_| DurationError::TooLong)?;
        if millis > Duration::MAX.millis {
            return Err(DurationError::TooLong);
        }
        Ok(Duration { millis })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 5] = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1000, "s"),
            (1, "ms"),
        ];
        let (size, unit) = UNITS
            .into_iter()
            .find(|(size, _)| self.millis.is_multiple_of(*size))
            .unwrap_or((1, "ms"));
        write!(f, "{}{unit}", self.millis / size)
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Duration({self})")
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A positive duration with millisecond resolution: a whole number and a unit (ms, s, m, h, d), such as \"250ms\", \"30s\", \"15m\", \"24h\" or \"7d\"; at most 3650d.",
            "pattern": "^[1-9][0-9]*(ms|s|m|h|d)$",
            "examples": ["30s", "24h"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_documented_forms() {
        for (text, millis) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("15m", 900_000),
            ("24h", 86_400_000),
            ("7d", 604_800_000),
            ("1h 30m", 5_400_000),
            ("1.5h", 5_400_000),
        ] {
            assert_eq!(
                text.parse::<Duration>().unwrap().as_millis(),
                millis,
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_bad_forms_with_the_accepted_ones() {
        for text in ["30 parsecs", "", "30", "abc", " 30s", "30s ", "-5s"] {
            let err = text.parse::<Duration>().unwrap_err();
            assert_eq!(
                err,
                DurationError::Malformed { text: text.into() },
                "{text}"
            );
            assert!(err.to_string().contains("`250ms`, `30s`"), "{err}");
        }
        assert_eq!("0s".parse::<Duration>(), Err(DurationError::Zero));
        assert_eq!("0ms".parse::<Duration>(), Err(DurationError::Zero));
        assert_eq!(
            "1500us".parse::<Duration>(),
            Err(DurationError::SubMillisecond)
        );
        assert_eq!("3651d".parse::<Duration>(), Err(DurationError::TooLong));
        assert!("99999999999999999999y".parse::<Duration>().is_err());
    }

    #[test]
    fn prints_the_largest_dividing_unit() {
        assert_eq!(Duration::from_millis(5_400_000).to_string(), "90m");
        assert_eq!(Duration::from_millis(86_400_000).to_string(), "1d");
        assert_eq!(Duration::from_millis(1_500).to_string(), "1500ms");
        assert_eq!(Duration::from_millis(1_500).as_secs_ceil(), 2);
    }

    #[test]
    fn serde_uses_the_string_form() {
        let d: Duration = serde_json::from_str("\"24h\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1d\"");
        assert!(serde_json::from_str::<Duration>("\"0s\"").is_err());
        assert!(serde_json::from_str::<Duration>("30").is_err());
    }

    proptest! {
        #[test]
        fn display_round_trips(millis in 1u64..=Duration::MAX.as_millis()) {
            let d = Duration::from_millis(millis);
            prop_assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
    }
}
