//! Human units: the one place that turns byte counts and durations into
//! text for people, so that every command prints them alike.
//!
//! * Bytes use binary units (`B`, `KiB`, `MiB`, … `EiB`). An exact multiple
//!   of the unit prints as an integer (`4 KiB`, `16 TiB`); anything else
//!   with three significant digits (`1.50 KiB`, `15.0 TiB`, `127 GiB`).
//!   Below 1 KiB the count is exact (`1023 B`).
//! * Durations pick ns, µs, ms or s by magnitude, with three significant
//!   digits (`52.3 ns`, `133 ms`, `1.25 s`); from 1000 s on, whole seconds.
//!
//! Machines read JSON, which keeps raw numbers; this module is for text
//! only.

use std::time::Duration;

const BYTE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// `x` (at least 1, below 1000 after rounding is checked by the caller) with
/// three significant digits.
fn three_significant(x: f64) -> String {
    let decimals = if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else {
        2
    };
    format!("{x:.decimals$}")
}

/// `n` bytes in binary units (see the module doc).
///
/// ```
/// use blockalloc_bench::units::bytes;
/// assert_eq!(bytes(0), "0 B");
/// assert_eq!(bytes(4096), "4 KiB");
/// assert_eq!(bytes(16_105_938_936 * 1024), "15.0 TiB");
/// ```
pub fn bytes(n: u64) -> String {
    bytes_wide(u128::from(n))
}

/// [`bytes`] for counts that may reach 2^64 (bounds of histogram buckets).
pub fn bytes_wide(n: u128) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let mut unit = 0;
    let mut whole = n;
    while unit + 1 < BYTE_UNITS.len() && whole >= 1024 && whole.is_multiple_of(1024) {
        whole /= 1024;
        unit += 1;
    }
    if whole < 1024 || unit + 1 == BYTE_UNITS.len() {
        return format!("{whole} {}", BYTE_UNITS[unit]);
    }
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < BYTE_UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    let mut text = three_significant(x);
    // 1023.7 KiB rounds to "1024": show it as the next unit instead.
    if text.parse::<f64>().is_ok_and(|v| v >= 1024.0) && unit + 1 < BYTE_UNITS.len() {
        unit += 1;
        text = three_significant(x / 1024.0);
    }
    format!("{text} {}", BYTE_UNITS[unit])
}

/// A duration given in nanoseconds (latencies are measured as `f64` ns), in
/// ns, µs, ms or s by magnitude.
///
/// ```
/// use blockalloc_bench::units::nanos;
/// assert_eq!(nanos(52.34), "52.3 ns");
/// assert_eq!(nanos(132_933_000.0), "133 ms");
/// assert_eq!(nanos(999_999.0), "1.00 ms");
/// ```
pub fn nanos(ns: f64) -> String {
    if !ns.is_finite() || ns < 0.0 {
        return "-".to_string();
    }
    if ns == 0.0 {
        return "0 ns".to_string();
    }
    const STEPS: [(&str, f64); 4] = [("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)];
    let mut i = STEPS
        .iter()
        .rposition(|&(_, scale)| ns >= scale)
        .unwrap_or(0);
    loop {
        let (unit, scale) = STEPS[i];
        let x = ns / scale;
        if unit == "s" && x >= 999.5 {
            return format!("{x:.0} s");
        }
        let text = three_significant(x);
        // 999.7 µs rounds to "1000": the next unit reads better.
        if text.parse::<f64>().is_ok_and(|v| v >= 1000.0) && i + 1 < STEPS.len() {
            i += 1;
            continue;
        }
        return format!("{text} {unit}");
    }
}

/// A [`Duration`], as [`nanos`].
pub fn duration(d: Duration) -> String {
    nanos(d.as_secs_f64() * 1e9)
}

/// A duration given in microseconds, as [`nanos`].
pub fn micros(us: f64) -> String {
    nanos(us * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        for (n, text) in [
            (0u64, "0 B"),
            (1, "1 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.50 KiB"),
            (10 * 1024 + 512, "10.5 KiB"),
            (4096, "4 KiB"),
            (64 << 20, "64 MiB"),
            (16 << 40, "16 TiB"),
            // A 16 TiB device less its metadata.
            (16_105_938_936 * 1024, "15.0 TiB"),
            (127 * (1 << 30) + 5, "127 GiB"),
            ((1 << 20) - 1, "1.00 MiB"),
            (u64::MAX, "16.0 EiB"),
        ] {
            assert_eq!(bytes(n), text, "{n}");
        }
        assert_eq!(bytes_wide(1 << 64), "16 EiB");
        assert_eq!(bytes_wide(1 << 70), "1024 EiB");
    }

    #[test]
    fn durations_by_magnitude() {
        for (ns, text) in [
            (0.0, "0 ns"),
            (0.5, "0.50 ns"),
            (52.34, "52.3 ns"),
            (999.0, "999 ns"),
            (999.8, "1.00 µs"),
            (1_500.0, "1.50 µs"),
            (132_933_000.0, "133 ms"),
            (1.25e9, "1.25 s"),
            (61e9, "61.0 s"),
            (4000e9, "4000 s"),
            (f64::NAN, "-"),
        ] {
            assert_eq!(nanos(ns), text, "{ns}");
        }
        assert_eq!(micros(132_933.0), "133 ms");
        assert_eq!(duration(Duration::from_millis(1500)), "1.50 s");
    }
}
