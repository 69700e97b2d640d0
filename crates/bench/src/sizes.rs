//! Object size distributions (`--sizes`) and sampling them in blocks.
//!
//! A [`SizeSpec`] is parsed from text such as `uniform:1B..4MiB`,
//! `fixed:64KiB`, `lognormal:256KiB:1.5` or a weighted mixture of those,
//! `mix:3*fixed:64KiB+1*uniform:1MiB..4MiB` (a bimodal mix, here). A [`SizeSampler`] draws object
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

/// The most distributions one `mix` combines.
pub const MIX_PARTS: usize = 4;

/// A weighted mixture of simple distributions (no mixture inside): each
/// object's size comes from one part, chosen with probability weight / the
/// sum of the weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mixture {
    parts: [(f64, Part); MIX_PARTS],
    len: usize,
}

/// One part of a [`Mixture`]: a [`SizeSpec`] other than a mixture.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Part {
    /// Uniform: `[min, max]`; fixed: `[n, n]`; log-normal: `[median, 0]`.
    bytes: [u64; 2],
    /// Log-normal: σ; `None` for the other two.
    sigma: Option<f64>,
}

impl Part {
    fn of(spec: SizeSpec) -> Option<Part> {
        match spec {
            SizeSpec::Uniform { min, max } => Some(Part {
                bytes: [min, max],
                sigma: None,
            }),
            SizeSpec::Fixed(n) => Some(Part {
                bytes: [n, n],
                sigma: None,
            }),
            SizeSpec::LogNormal { median, sigma } => Some(Part {
                bytes: [median, 0],
                sigma: Some(sigma),
            }),
            SizeSpec::Mix(_) => None,
        }
    }

    fn spec(self) -> SizeSpec {
        match (self.sigma, self.bytes) {
            (Some(sigma), [median, _]) => SizeSpec::LogNormal { median, sigma },
            (None, [min, max]) if min == max => SizeSpec::Fixed(min),
            (None, [min, max]) => SizeSpec::Uniform { min, max },
        }
    }
}

impl Mixture {
    /// The parts and their weights, in the order given.
    pub fn parts(&self) -> impl Iterator<Item = (f64, SizeSpec)> + '_ {
        self.parts[..self.len].iter().map(|&(w, p)| (w, p.spec()))
    }
}

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
    /// A weighted mixture of the others.
    Mix(Mixture),
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
#[error("bad size distribution {input:?}: {reason} (expected uniform:MIN..MAX, fixed:SIZE, lognormal:MEDIAN:SIGMA or mix:W*DIST+W*DIST..., e.g. uniform:1B..4MiB)")]
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
            "mix" => {
                let mut parts = [(0.0, Part::of(SizeSpec::Fixed(0)).expect("simple")); MIX_PARTS];
                let mut len = 0;
                for part in rest.split('+') {
                    let (w, spec) = part
                        .split_once('*')
                        .ok_or_else(|| bad(format!("mix part {part:?} is not WEIGHT*DIST")))?;
                    let w: f64 = w
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("weight {w:?} is not a number")))?;
                    if !w.is_finite() || w <= 0.0 {
                        return Err(bad(format!("weight {w} must be finite and > 0")));
                    }
                    let spec: SizeSpec = spec.parse().map_err(|e: SizeSpecError| bad(e.reason))?;
                    let p = Part::of(spec).ok_or_else(|| bad("a mix inside a mix".into()))?;
                    if len == MIX_PARTS {
                        return Err(bad(format!("more than {MIX_PARTS} parts")));
                    }
                    parts[len] = (w, p);
                    len += 1;
                }
                Ok(SizeSpec::Mix(Mixture { parts, len }))
            }
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
            SizeSpec::Mix(m) => {
                write!(f, "mix:")?;
                for (i, (w, spec)) in m.parts().enumerate() {
                    let sep = if i > 0 { "+" } else { "" };
                    write!(f, "{sep}{w}*{spec}")?;
                }
                Ok(())
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
        sample(self.spec, rng)
    }

    /// One request in blocks: a sampled size rounded up to whole blocks,
    /// at least one.
    pub fn sample_blocks<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        self.sample_bytes(rng).div_ceil(self.block_size).max(1)
    }
}

/// One object size in bytes from `spec`.
fn sample<R: Rng + ?Sized>(spec: SizeSpec, rng: &mut R) -> u64 {
    match spec {
        SizeSpec::Mix(m) => {
            let total: f64 = m.parts().map(|(w, _)| w).sum();
            let mut at = rng.random::<f64>() * total;
            let mut chosen = m.parts[0].1;
            for &(w, p) in &m.parts[..m.len] {
                chosen = p;
                if at < w {
                    break;
                }
                at -= w;
            }
            sample(chosen.spec(), rng)
        }
        SizeSpec::Uniform { min, max } => rng.random_range(min..=max),
        SizeSpec::Fixed(n) => n,
        SizeSpec::LogNormal { median, sigma } => {
            let x = median as f64 * (sigma * standard_normal(rng)).exp();
            // `as` saturates, and NaN cannot occur: median ≥ 1, σ finite.
            (x.round() as u64).clamp(1, MAX_OBJECT_BYTES)
        }
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
    fn mixes_parse_print_and_sample_by_weight() {
        let m = p("mix:3*fixed:4KiB + 1*uniform:1MiB..2MiB").unwrap();
        assert_eq!(m.to_string(), "mix:3*fixed:4KiB+1*uniform:1MiB..2MiB");
        assert_eq!(p(&m.to_string()).unwrap(), m);
        let SizeSpec::Mix(mix) = m else {
            panic!("{m:?}")
        };
        assert_eq!(
            mix.parts().collect::<Vec<_>>(),
            vec![
                (3.0, SizeSpec::Fixed(4096)),
                (
                    1.0,
                    SizeSpec::Uniform {
                        min: 1 << 20,
                        max: 2 << 20
                    }
                )
            ]
        );
        let s = SizeSampler::new(m, 4096);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let small = (0..10_000)
            .filter(|_| s.sample_blocks(&mut rng) == 1)
            .count();
        assert!((7_200..7_800).contains(&small), "{small} of 10 000");
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
            "mix:",
            "mix:fixed:4KiB",
            "mix:0*fixed:4KiB",
            "mix:-1*fixed:4KiB",
            "mix:x*fixed:4KiB",
            "mix:1*fixed:4KiB+1*mix:1*fixed:1B",
            "mix:1*fixed:1B+1*fixed:1B+1*fixed:1B+1*fixed:1B+1*fixed:1B",
            "mix:1*zipf:1:2",
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
