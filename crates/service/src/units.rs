//! Durations and sizes as the configuration file and the flags write them
//! (`"400ms"`, `"64MiB"`), and their serde deserializers.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A number of the configuration file, or a string holding one with a
/// unit.
enum NumberOrText {
    Number(f64),
    Integer(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for NumberOrText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = NumberOrText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number, or a string with a unit")
            }
            fn visit_u64<E>(self, v: u64) -> Result<NumberOrText, E> {
                Ok(NumberOrText::Integer(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NumberOrText, E> {
                u64::try_from(v)
                    .map(NumberOrText::Integer)
                    .map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_f64<E>(self, v: f64) -> Result<NumberOrText, E> {
                Ok(NumberOrText::Number(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<NumberOrText, E> {
                Ok(NumberOrText::Text(v.to_string()))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// The units a duration may take, with their length in seconds.
const DURATION_UNITS: [(&str, f64); 8] = [
    ("ns", 1e-9),
    ("us", 1e-6),
    ("µs", 1e-6),
    ("ms", 1e-3),
    ("s", 1.0),
    ("m", 60.0),
    ("min", 60.0),
    ("h", 3600.0),
];

/// Parses a duration as the configuration file and the flags take it: a
/// number of seconds, or a number with a unit (`ns`, `us`, `ms`, `s`, `m`,
/// `h`), e.g. `"400ms"`.
///
/// ```
/// use std::time::Duration;
/// use blockalloc_service::parse_duration;
/// assert_eq!(parse_duration("400ms"), Ok(Duration::from_millis(400)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("4 parsecs").is_err());
/// ```
///
/// # Errors
/// Why `text` is not one.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = |why: &str| {
        format!("{text:?} is not a duration ({why}; a number of seconds or one with a unit: ns, us, ms, s, m, h, e.g. \"400ms\")")
    };
    let n: f64 = num.parse().map_err(|_| bad("no number"))?;
    let scale = DURATION_UNITS
        .iter()
        .find(|(u, _)| *u == unit.trim())
        .map(|&(_, s)| s)
        .or(unit.trim().is_empty().then_some(1.0))
        .ok_or_else(|| bad("unknown unit"))?;
    Duration::try_from_secs_f64(n * scale).map_err(|_| bad("out of range"))
}

/// A duration: seconds (integer or float) or a string with a unit.
pub(crate) fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let secs = match NumberOrText::deserialize(d)? {
        NumberOrText::Integer(n) => n as f64,
        NumberOrText::Number(n) => n,
        NumberOrText::Text(t) => return parse_duration(&t).map_err(serde::de::Error::custom),
    };
    Duration::try_from_secs_f64(secs)
        .map_err(|_| serde::de::Error::custom(format!("{secs} is not a duration in seconds")))
}

/// A size: a number of bytes, or a string with a unit as flags take it
/// (`"64MiB"`, `"1TiB"`).
pub(crate) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match NumberOrText::deserialize(d)? {
        NumberOrText::Integer(n) => Ok(n),
        NumberOrText::Number(n) => Err(serde::de::Error::custom(format!(
            "{n} is not a whole number of bytes (a size with a unit is a string: \"64MiB\")"
        ))),
        NumberOrText::Text(t) => t
            .parse::<blockalloc::ByteSize>()
            .map(blockalloc::ByteSize::bytes)
            .map_err(serde::de::Error::custom),
    }
}

/// [`bytes`] for a key that may be left out.
pub(crate) fn optional_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bytes(d).map(Some)
}

/// [`bytes`] for a `usize` key.
pub(crate) fn bytes_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = bytes(d)?;
    usize::try_from(n).map_err(|_| serde::de::Error::custom(format!("{n} bytes is too large")))
}
