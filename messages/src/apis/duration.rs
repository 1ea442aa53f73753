//! Durations as Karpenter's CRDs spell them: whole numbers of hours, minutes and seconds.
//!
//! Karpenter's patterns accept `720h`, `1h30m`, `30s` (and `Never` where a duration may be
//! disabled), but not Go's fractional or sub-second forms. [`Duration`] parses exactly that grammar
//! and prints a canonical form (`5400s` prints as `1h30m`). [`NillableDuration`] adds `Never`;
//! [`BudgetDuration`] allows only hours and minutes, because budget schedules are cron-based.
//!
//! Failure modes: [`DurationError`] says which grammar the text broke; the CRD schemas carry the
//! same grammars as patterns so the API server rejects the same texts.

use std::{fmt, str::FromStr, time};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Pattern of [`Duration`] in the CRDs.
pub const DURATION_PATTERN: &str = "^([0-9]+(s|m|h))+$";
/// Pattern of [`NillableDuration`] in the CRDs.
pub const NILLABLE_DURATION_PATTERN: &str = "^(([0-9]+(s|m|h))+|Never)$";
/// Pattern of [`BudgetDuration`] in the CRDs.
pub const BUDGET_DURATION_PATTERN: &str = "^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$";

/// Why a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a sequence of `<digits><unit>`.
    #[error("{text:?} is not a duration: use whole numbers with units {units}, such as {example}")]
    Malformed {
        /// The input.
        text: String,
        /// The units allowed here.
        units: &'static str,
        /// An example of a valid value.
        example: &'static str,
    },
    /// Too large to represent.
    #[error("duration {0:?} is too large")]
    OutOfRange(String),
}

/// A non-negative duration in whole seconds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(time::Duration);

impl Duration {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(time::Duration::from_secs(secs))
    }

    /// The standard-library duration.
    pub const fn as_std(self) -> time::Duration {
        self.0
    }

    /// Parses `text` as a sum of `<digits><unit>` terms with units from `allowed` (`units` and
    /// `example` name them in the error).
    fn parse_units(
        text: &str,
        allowed: &[char],
        units: &'static str,
        example: &'static str,
    ) -> Result<Self, DurationError> {
        let malformed = || DurationError::Malformed {
            text: text.to_string(),
            units,
            example,
        };
        if text.is_empty() {
            return Err(malformed());
        }
        let mut total: u64 = 0;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let unit = rest[digits..].chars().next().ok_or_else(malformed)?;
            if digits == 0 || !allowed.contains(&unit) {
                return Err(malformed());
            }
            let n: u64 = rest[..digits]
                .parse()
                .map_err(|_| DurationError::OutOfRange(text.to_string()))?;
            let secs = match unit {
                'h' => 3600,
                'm' => 60,
                _ => 1,
            };
            total = n
                .checked_mul(secs)
                .and_then(|s| total.checked_add(s))
                .ok_or_else(|| DurationError::OutOfRange(text.to_string()))?;
            rest = &rest[digits + 1..];
        }
        Ok(Duration::from_secs(total))
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Duration::parse_units(s, &['h', 'm', 's'], "h, m, s", "720h, 1h30m or 30s")
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs();
        if secs == 0 {
            return f.write_str("0s");
        }
        let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
        for (n, unit) in [(h, 'h'), (m, 'm'), (s, 's')] {
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

/// A duration, or `Never` (for `expireAfter` and `consolidateAfter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NillableDuration {
    /// The action never happens.
    Never,
    /// The action happens after this long.
    After(Duration),
}

impl NillableDuration {
    /// The duration, `None` for `Never`.
    pub const fn duration(self) -> Option<Duration> {
        match self {
            NillableDuration::Never => None,
            NillableDuration::After(d) => Some(d),
        }
    }
}

impl FromStr for NillableDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "Never" {
            return Ok(NillableDuration::Never);
        }
        Duration::parse_units(s, &['h', 'm', 's'], "h, m, s", "720h, 1h30m, 30s or Never")
            .map(NillableDuration::After)
    }
}

impl fmt::Display for NillableDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NillableDuration::Never => f.write_str("Never"),
            NillableDuration::After(d) => d.fmt(f),
        }
    }
}

/// A budget window length: hours and minutes only (a trailing `0s` is tolerated, as Karpenter does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BudgetDuration(pub Duration);

impl FromStr for BudgetDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.strip_suffix("0s").filter(|t| !t.is_empty()).unwrap_or(s);
        Duration::parse_units(trimmed, &['h', 'm'], "h, m", "10m or 1h30m")
            .map(BudgetDuration)
            .map_err(|e| match e {
                DurationError::Malformed { units, example, .. } => DurationError::Malformed {
                    text: s.to_string(),
                    units,
                    example,
                },
                other => other,
            })
    }
}

impl fmt::Display for BudgetDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Serde and schema for a type that is a string with a pattern.
macro_rules! string_with_pattern {
    ($ty:ty, $name:literal, $pattern:expr) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({"type": "string", "pattern": $pattern})
            }

            fn inline_schema() -> bool {
                true
            }
        }
    };
}

string_with_pattern!(Duration, "Duration", DURATION_PATTERN);
string_with_pattern!(NillableDuration, "NillableDuration", NILLABLE_DURATION_PATTERN);
string_with_pattern!(BudgetDuration, "BudgetDuration", BUDGET_DURATION_PATTERN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_karpenter_durations() {
        assert_eq!("720h".parse::<Duration>(), Ok(Duration::from_secs(720 * 3600)));
        assert_eq!("1h30m".parse::<Duration>(), Ok(Duration::from_secs(5400)));
        assert_eq!("0s".parse::<Duration>(), Ok(Duration::from_secs(0)));
        assert_eq!("Never".parse::<NillableDuration>(), Ok(NillableDuration::Never));
        assert_eq!(
            "30s".parse::<NillableDuration>(),
            Ok(NillableDuration::After(Duration::from_secs(30)))
        );
    }

    #[test]
    fn rejects_go_forms_karpenter_rejects() {
        for bad in [
            "30 days", "1.5h", "300ms", "h", "10", "", "never", "1d", "5 ", "1m,", "1m 2s",
        ] {
            assert!(
                bad.parse::<NillableDuration>().is_err(),
                "{bad:?} must be rejected"
            );
        }
    }

    #[test]
    fn budget_durations_take_hours_and_minutes_only() {
        assert_eq!(
            "10m".parse::<BudgetDuration>(),
            Ok(BudgetDuration(Duration::from_secs(600)))
        );
        assert_eq!(
            "1h30m0s".parse::<BudgetDuration>(),
            Ok(BudgetDuration(Duration::from_secs(5400)))
        );
        assert!("30s".parse::<BudgetDuration>().is_err());
    }

    #[test]
    fn prints_canonically() {
        assert_eq!(Duration::from_secs(5400).to_string(), "1h30m");
        assert_eq!(Duration::from_secs(720 * 3600).to_string(), "720h");
        assert_eq!(Duration::from_secs(61).to_string(), "1m1s");
        assert_eq!(NillableDuration::Never.to_string(), "Never");
    }
}
