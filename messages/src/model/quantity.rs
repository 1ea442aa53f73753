//! Exact Kubernetes resource quantities.
//!
//! A [`Quantity`] is a count of milli-units held in an `i64`: `"100m"` CPU is 100, `"1Gi"` memory is
//! 1 073 741 824 000 (bytes × 1000). Parsing follows the Kubernetes grammar (sign, decimal number,
//! then a binary suffix `Ki…Ei`, a decimal suffix `n u m k M G T P E`, or an exponent `e3`/`E-2`) and
//! uses integer arithmetic only, so `"1.5Gi"` is exactly 1 610 612 736 bytes. Values finer than a
//! milli-unit round up, as `Quantity.MilliValue()` does in Kubernetes.
//!
//! Failure modes: [`QuantityError`] names what is wrong with the text. Parsed text with a magnitude
//! beyond `i64::MAX` milli-units (about 8 PiB of memory) is rejected as
//! [`QuantityError::OutOfRange`] rather than silently wrapped. Decoding an object is kinder: the API
//! server stores any well-formed quantity (Kubernetes' are arbitrary-precision), so one too large
//! decodes to the largest (or smallest) quantity, which the saturating arithmetic treats as
//! unbounded, instead of making the whole object unreadable.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Why a quantity string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is empty.
    #[error("quantity is empty")]
    Empty,
    /// The number part is missing or malformed.
    #[error("quantity {0:?} is not a number followed by an optional suffix (e.g. 100m, 1.5Gi, 2k, 1e3)")]
    Malformed(String),
    /// The suffix is not one Kubernetes knows.
    #[error(
        "quantity {text:?} has unknown suffix {suffix:?} (use Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent)"
    )]
    UnknownSuffix {
        /// The whole input.
        text: String,
        /// The part after the number.
        suffix: String,
    },
    /// The value does not fit in `i64` milli-units.
    #[error("quantity {0:?} is too large (limit is about 9.2e15 units)")]
    OutOfRange(String),
}

/// An exact quantity in milli-units (see the module docs).
///
/// Like Kubernetes, it remembers whether it was written with a binary suffix (`Gi`) so that it is
/// printed back the same way; equality and ordering look at the value only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantity {
    millis: i64,
    binary: bool,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.millis == other.millis
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.millis.cmp(&other.millis)
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.millis.hash(state);
    }
}

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity::from_millis(0);

    /// A quantity of `millis` milli-units.
    pub const fn from_millis(millis: i64) -> Self {
        Quantity {
            millis,
            binary: false,
        }
    }

    /// A quantity of whole units (cores, bytes, pods).
    pub const fn from_units(units: i64) -> Self {
        Quantity::from_millis(units.saturating_mul(1000))
    }

    /// The value in milli-units.
    pub const fn millis(self) -> i64 {
        self.millis
    }

    /// The value in whole units, rounded up (as Kubernetes' `Quantity.Value()`).
    pub const fn units_ceil(self) -> i64 {
        self.millis.div_euclid(1000) + if self.millis.rem_euclid(1000) == 0 { 0 } else { 1 }
    }

    /// `self + other`, saturating at the `i64` bounds.
    pub const fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            millis: self.millis.saturating_add(other.millis),
            binary: self.binary,
        }
    }

    /// `self - other`, saturating at the `i64` bounds.
    pub const fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            millis: self.millis.saturating_sub(other.millis),
            binary: self.binary,
        }
    }

    /// True when the value is exactly zero.
    pub const fn is_zero(self) -> bool {
        self.millis == 0
    }
}

/// Multiplier of a suffix as `numerator / denominator`, both powers of 2 or 10.
fn suffix_scale(suffix: &str) -> Option<(i128, i128)> {
    let pow2 = |n: u32| (1i128 << n, 1);
    let pow10 = |n: i32| {
        if n >= 0 {
            (10i128.pow(n as u32), 1)
        } else {
            (1, 10i128.pow(n.unsigned_abs()))
        }
    };
    Some(match suffix {
        "" => (1, 1),
        "Ki" => pow2(10),
        "Mi" => pow2(20),
        "Gi" => pow2(30),
        "Ti" => pow2(40),
        "Pi" => pow2(50),
        "Ei" => pow2(60),
        "n" => pow10(-9),
        "u" => pow10(-6),
        "m" => pow10(-3),
        "k" => pow10(3),
        "M" => pow10(6),
        "G" => pow10(9),
        "T" => pow10(12),
        "P" => pow10(15),
        "E" => pow10(18),
        _ => {
            let exp = suffix.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Kubernetes' quantities are arbitrary-precision, so any exponent is well formed. One
            // beyond ±31 only matters for its sign: the value is out of range (`1e400`) or rounds
            // to one milli-unit (`1e-400`), as at ±31.
            let n = exp
                .parse::<i64>()
                .map_or(if exp.starts_with('-') { -31 } else { 31 }, |n| n.clamp(-31, 31));
            pow10(n as i32)
        }
    })
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // No trimming: Kubernetes rejects surrounding white space.
        let s = text;
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, suffix) = rest.split_at(number_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(QuantityError::Malformed(text.to_string()));
        }
        let (num, den) = suffix_scale(suffix).ok_or_else(|| QuantityError::UnknownSuffix {
            text: text.to_string(),
            suffix: suffix.to_string(),
        })?;
        let out_of_range = || QuantityError::OutOfRange(text.to_string());
        // mantissa = int_part.frac_part as an integer, scaled by 10^-len(frac_part).
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 36 {
            return Err(out_of_range());
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| out_of_range())?
        };
        let frac_scale = 10i128
            .checked_pow(frac_part.len() as u32)
            .ok_or_else(out_of_range)?;
        let numerator = mantissa
            .checked_mul(num)
            .and_then(|v| v.checked_mul(1000))
            .ok_or_else(out_of_range)?;
        let denominator = frac_scale.checked_mul(den).ok_or_else(out_of_range)?;
        // Round away from zero to the next milli-unit, like Kubernetes' MilliValue.
        let millis = numerator / denominator + i128::from(numerator % denominator != 0);
        let millis = if negative { -millis } else { millis };
        let binary = suffix.ends_with('i');
        i64::try_from(millis)
            .map(|millis| Quantity { millis, binary })
            .map_err(|_| out_of_range())
    }
}

impl fmt::Display for Quantity {
    /// Canonical form: whole units when exact (with the largest exact binary suffix if the
    /// quantity was written in binary units), otherwise milli-units with an `m` suffix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.millis % 1000 != 0 {
            return write!(f, "{}m", self.millis);
        }
        let units = self.millis / 1000;
        if self.binary && units != 0 {
            for (suffix, shift) in [
                ("Ei", 60),
                ("Pi", 50),
                ("Ti", 40),
                ("Gi", 30),
                ("Mi", 20),
                ("Ki", 10),
            ] {
                if units % (1i64 << shift) == 0 {
                    return write!(f, "{}{suffix}", units >> shift);
                }
            }
        }
        write!(f, "{units}")
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    /// Accepts a string or a number, as Kubernetes' int-or-string quantities do.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as 100m, 1.5Gi or 4")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                match v.parse() {
                    Err(QuantityError::OutOfRange(_)) if v.starts_with('-') => {
                        Ok(Quantity::from_millis(i64::MIN))
                    }
                    Err(QuantityError::OutOfRange(_)) => Ok(Quantity::from_millis(i64::MAX)),
                    parsed => parsed.map_err(E::custom),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::from_millis(v.saturating_mul(1000)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                let units = i64::try_from(v).unwrap_or(i64::MAX);
                Ok(Quantity::from_millis(units.saturating_mul(1000)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                // YAML `0.5` arrives as a float; reparse its shortest decimal text exactly.
                self.visit_str(&v.to_string())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": true,
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// The OpenAPI pattern Kubernetes uses for quantities.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> i64 {
        s.parse::<Quantity>()
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .millis()
    }

    #[test]
    fn parses_the_kubernetes_grammar_exactly() {
        assert_eq!(q("100m"), 100);
        assert_eq!(q("1"), 1000);
        assert_eq!(q("1.5Gi"), 1_610_612_736_000);
        assert_eq!(q("1e3"), 1_000_000);
        assert_eq!(q("2k"), 2_000_000);
        assert_eq!(q("0.5"), 500);
        assert_eq!(q(".5"), 500);
        assert_eq!(q("1Ki"), 1_024_000);
        assert_eq!(q("1Ti"), 1_099_511_627_776_000);
        assert_eq!(q("-2"), -2000);
        assert_eq!(q("1E-3"), 1);
        assert_eq!(q("100Mi"), 104_857_600_000);
        assert_eq!(q("0"), 0);
    }

    #[test]
    fn sub_milli_values_round_up() {
        assert_eq!(q("1u"), 1);
        assert_eq!(q("1n"), 1);
        assert_eq!(q("1.0001"), 1001);
    }

    #[test]
    fn rejects_bad_text_with_a_reason() {
        assert_eq!("".parse::<Quantity>(), Err(QuantityError::Empty));
        assert!(matches!(
            "1.2.3".parse::<Quantity>(),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            "abc".parse::<Quantity>(),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            "5Gb".parse::<Quantity>(),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            "1e".parse::<Quantity>(),
            Err(QuantityError::UnknownSuffix { .. })
        ));
        assert!(matches!(
            "9Ei".parse::<Quantity>(),
            Err(QuantityError::OutOfRange(_))
        ));
        // Any exponent is Kubernetes grammar: huge ones are out of range, tiny ones round up.
        for huge in ["1e400", "1E99999999999999999999"] {
            assert!(
                matches!(huge.parse::<Quantity>(), Err(QuantityError::OutOfRange(_))),
                "{huge}"
            );
        }
        assert_eq!("0e400".parse::<Quantity>(), Ok(Quantity::from_millis(0)));
        assert_eq!("1e-400".parse::<Quantity>(), Ok(Quantity::from_millis(1)));
        assert_eq!(
            serde_json::from_value::<Quantity>(serde_json::json!("1e400")).ok(),
            Some(Quantity::from_millis(i64::MAX)),
            "an object holding one decodes, saturated"
        );
        assert!("1Gi ".parse::<Quantity>().is_err() && " 1".parse::<Quantity>().is_err());
    }

    #[test]
    fn displays_canonically_and_deserializes_numbers() {
        assert_eq!(Quantity::from_millis(1500).to_string(), "1500m");
        assert_eq!(Quantity::from_units(4).to_string(), "4");
        for (text, shown) in [
            ("1Ti", "1Ti"),
            ("1.5Gi", "1536Mi"),
            ("100Mi", "100Mi"),
            ("2k", "2000"),
        ] {
            assert_eq!(
                text.parse::<Quantity>().map(|q| q.to_string()),
                Ok(shown.to_string()),
                "{text}"
            );
        }
        assert_eq!(
            "1Gi".parse::<Quantity>(),
            "1073741824".parse::<Quantity>(),
            "equality ignores the format"
        );
        let from_int: Quantity = serde_json::from_str("1000").unwrap_or_default();
        assert_eq!(from_int, Quantity::from_units(1000));
        let from_float: Quantity = serde_json::from_str("0.25").unwrap_or_default();
        assert_eq!(from_float, Quantity::from_millis(250));
    }

    /// A NodePool with `limits: {cpu: 9223372036854776}` is stored by the API server; decoding it
    /// must not make the whole NodePool unreadable (the fuzz found it).
    #[test]
    fn quantities_too_large_for_i64_decode_as_unbounded() {
        let decode = |json: &str| serde_json::from_str::<Quantity>(json).map(|q| q.millis());
        assert_eq!(decode("9223372036854776").ok(), Some(i64::MAX));
        assert_eq!(decode("18446744073709551615").ok(), Some(i64::MAX));
        assert_eq!(decode(r#""99999999999999999999Gi""#).ok(), Some(i64::MAX));
        assert_eq!(decode(r#""-9Ei""#).ok(), Some(i64::MIN));
        assert!(
            decode(r#""5Gb""#).is_err(),
            "a malformed quantity is still refused"
        );
    }

    #[test]
    fn units_round_up() {
        assert_eq!(Quantity::from_millis(1500).units_ceil(), 2);
        assert_eq!(Quantity::from_millis(2000).units_ceil(), 2);
        assert_eq!(Quantity::from_millis(-1500).units_ceil(), -1);
    }
}
