//! Object size distributions (`--sizes`) and sampling them in blocks.
//!
//! A [`SizeSpec`] is parsed from text such as `uniform:1B..4MiB`,
//! `fixed:64KiB` or `lognormal:256KiB:1.5`. A [`SizeSampler`] draws object
//! sizes in bytes from it and turns each into a request in whole blocks:
//! rounded **up**, and at least one block (a zero-byte object still takes a
//! block, as it would on a real device).

use std::fmt;
use std::str::FromStr;

use blockalloc::ByteSize;
use rand::Rng;

/// The largest object of the workloads blockalloc is built for: 4 MiB.
/// `lognormal` samples are capped here.
pub const MAX_OBJECT_BYTES: u64 = 4 << 20;

/// A distribution of object sizes in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeSpec {
    /// Uniform over the bytes `min..=max` (both ends included).
    Uniform {
        /// Smallest size in bytes.
        min: u64,
        /// Largest size in bytes.
        max: u64,
    },
    /// Every object has this many bytes.
    Fixed(u64),
    /// Log-normal with the given median (bytes) and σ of the underlying
    /// normal, capped at [`MAX_OBJECT_BYTES`].
    LogNormal {
        /// Median size in bytes (`e^μ`).
        median: u64,
        /// Standard deviation of `ln(size)`.
        sigma: f64,
    },
}

impl Default for SizeSpec {
    /// `uniform:1B..4MiB`, the sizes of the original design notes.
    fn default() -> Self {
        SizeSpec::Uniform {
            min: 1,
            max: MAX_OBJECT_BYTES,
        }
    }
}

/// A `--sizes` value that does not parse or makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad size distribution {input:?}: {reason} (expected uniform:MIN..MAX, fixed:SIZE or lognormal:MEDIAN:SIGMA, e.g. uniform:1B..4MiB)")]
pub struct SizeSpecError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

blockalloc::invalid_input_errors!(SizeSpecError);

impl FromStr for SizeSpec {
    type Err = SizeSpecError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| SizeSpecError {
            input: input.to_string(),
            reason,
        };
        let size = |s: &str| {
            s.parse::<ByteSize>()
                .map(ByteSize::bytes)
                .map_err(|e| bad(e.to_string()))
        };
        let (kind, rest) = input
            .trim()
            .split_once(':')
            .ok_or_else(|| bad("missing ':' after the distribution name".into()))?;
        match kind.trim().to_ascii_lowercase().as_str() {
            "uniform" => {
                let (lo, hi) = rest
                    .split_once("..")
                    .ok_or_else(|| bad("uniform needs a range MIN..MAX".into()))?;
                let (min, max) = (size(lo)?, size(hi)?);
                if min > max {
                    return Err(bad(format!("minimum {min} B is above maximum {max} B")));
                }
                Ok(SizeSpec::Uniform { min, max })
            }
            "fixed" => Ok(SizeSpec::Fixed(size(rest)?)),
            "lognormal" => {
                let (median, sigma) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| bad("lognormal needs MEDIAN:SIGMA".into()))?;
                let median = size(median)?;
                if median == 0 {
                    return Err(bad("the median must be at least 1 byte".into()));
                }
                let sigma: f64 = sigma
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("sigma {sigma:?} is not a number")))?;
                if !sigma.is_finite() || sigma < 0.0 {
                    return Err(bad(format!("sigma {sigma} must be finite and >= 0")));
                }
                Ok(SizeSpec::LogNormal { median, sigma })
            }
            other => Err(bad(format!("unknown distribution {other:?}"))),
        }
    }
}

impl fmt::Display for SizeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SizeSpec::Uniform { min, max } => write!(f, "uniform:{}..{}", bytes(min), bytes(max)),
            SizeSpec::Fixed(n) => write!(f, "fixed:{}", bytes(n)),
            SizeSpec::LogNormal { median, sigma } => {
                write!(f, "lognormal:{}:{sigma}", bytes(median))
            }
        }
    }
}

/// Prints a byte count so that it parses back to the same number
/// (`ByteSize`'s display rounds sizes that are not whole units).
fn bytes(n: u64) -> String {
    let s = ByteSize(n).to_string();
    if s.contains('.') {
        format!("{n}B")
    } else {
        s
    }
}

/// Draws requests in blocks from a [`SizeSpec`].
#[derive(Clone, Debug)]
pub struct SizeSampler {
    spec: SizeSpec,
    block_size: u64,
}

impl SizeSampler {
    /// A sampler for devices with `block_size`-byte blocks.
    ///
    /// # Panics
    /// When `block_size` is zero (a [`blockalloc::Geometry`] never has one).
    pub fn new(spec: SizeSpec, block_size: u64) -> Self {
        assert!(block_size > 0, "block size must be positive");
        SizeSampler { spec, block_size }
    }

    /// The distribution sampled.
    pub fn spec(&self) -> SizeSpec {
        self.spec
    }

    /// One object size in bytes.
    pub fn sample_bytes<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match self.spec {
            SizeSpec::Uniform { min, max } => rng.random_range(min..=max),
            SizeSpec::Fixed(n) => n,
            SizeSpec::LogNormal { median, sigma } => {
                let x = median as f64 * (sigma * standard_normal(rng)).exp();
                // `as` saturates, and NaN cannot occur: median ≥ 1, σ finite.
                (x.round() as u64).clamp(1, MAX_OBJECT_BYTES)
            }
        }
    }

    /// One request in blocks: a sampled size rounded up to whole blocks,
    /// at least one.
    pub fn sample_blocks<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.sample_bytes(rng).div_ceil(self.block_size).max(1)
    }
}

/// A standard normal variate (Box–Muller; one of the pair is discarded, which
/// keeps the sampler stateless).
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // 1 − [0, 1) is in (0, 1], so the logarithm is finite.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_xoshiro::Xoshiro256PlusPlus;

    fn p(s: &str) -> Result<SizeSpec, SizeSpecError> {
        s.parse()
    }

    #[test]
    fn parses_good_specs() {
        assert_eq!(
            p("uniform:1B..4MiB").unwrap(),
            SizeSpec::Uniform {
                min: 1,
                max: 4 << 20
            }
        );
        assert_eq!(
            p("uniform:0..0").unwrap(),
            SizeSpec::Uniform { min: 0, max: 0 }
        );
        assert_eq!(
            p("UNIFORM: 3MiB .. 4MiB").unwrap(),
            p("uniform:3MiB..4MiB").unwrap()
        );
        assert_eq!(p("fixed:64KiB").unwrap(), SizeSpec::Fixed(64 << 10));
        assert_eq!(
            p("lognormal:256KiB:1.5").unwrap(),
            SizeSpec::LogNormal {
                median: 256 << 10,
                sigma: 1.5
            }
        );
        assert_eq!(
            p("lognormal:1MiB:0").unwrap().to_string(),
            "lognormal:1MiB:0"
        );
        assert_eq!(SizeSpec::default(), p("uniform:1B..4MiB").unwrap());
    }

    #[test]
    fn refuses_bad_specs() {
        for bad in [
            "",
            "uniform",
            "uniform:",
            "uniform:4MiB",
            "uniform:4MiB..1B",
            "uniform:1B..lots",
            "fixed:",
            "fixed:-1",
            "lognormal:1MiB",
            "lognormal:0:1",
            "lognormal:1MiB:-1",
            "lognormal:1MiB:nan",
            "lognormal:1MiB:inf",
            "zipf:1:2",
        ] {
            let e = p(bad).expect_err(bad);
            assert!(e.to_string().contains("expected uniform:"), "{e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "uniform:1B..4MiB",
            "uniform:3MiB..4MiB",
            "uniform:1000B..5000B",
            "fixed:0B",
            "fixed:12345B",
            "lognormal:256KiB:1.5",
        ] {
            assert_eq!(p(s).unwrap().to_string(), s);
            assert_eq!(p(&p(s).unwrap().to_string()).unwrap(), p(s).unwrap());
        }
    }

    #[test]
    fn blocks_round_up_with_minimum_one() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let fixed = |n| SizeSampler::new(SizeSpec::Fixed(n), 4096).sample_blocks(&mut rng.clone());
        assert_eq!(fixed(0), 1);
        assert_eq!(fixed(1), 1);
        assert_eq!(fixed(4096), 1);
        assert_eq!(fixed(4097), 2);
        let s = SizeSampler::new(SizeSpec::default(), 4096);
        for _ in 0..10_000 {
            let b = s.sample_blocks(&mut rng);
            assert!((1..=1024).contains(&b));
        }
    }

    #[test]
    fn lognormal_is_capped_and_centred() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        let s = SizeSampler::new(p("lognormal:256KiB:1").unwrap(), 4096);
        let mut v: Vec<u64> = (0..20_001).map(|_| s.sample_bytes(&mut rng)).collect();
        assert!(v.iter().all(|&b| (1..=MAX_OBJECT_BYTES).contains(&b)));
        v.sort_unstable();
        let median = v[v.len() / 2] as f64;
        assert!(
            (median / (256 << 10) as f64 - 1.0).abs() < 0.05,
            "median {median}"
        );
        let wide = SizeSampler::new(p("lognormal:4MiB:3").unwrap(), 4096);
        assert!((0..1000).any(|_| wide.sample_bytes(&mut rng) == MAX_OBJECT_BYTES));
    }
}
