//! Device geometry and human-readable byte sizes.

use std::fmt;
use std::str::FromStr;

use crate::error::GeometryError;

/// A size in bytes that parses from and prints as `4KiB`, `16TiB`, `1.5GiB`,
/// `4096`, `10MB` (decimal units) and so on.
///
/// ```
/// use blockalloc::ByteSize;
/// assert_eq!("16TiB".parse::<ByteSize>().unwrap().bytes(), 16 << 40);
/// assert_eq!("4KiB".parse::<ByteSize>().unwrap().bytes(), 4096);
/// assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().bytes(), 1536);
/// assert_eq!("10MB".parse::<ByteSize>().unwrap().bytes(), 10_000_000);
/// assert_eq!(ByteSize(4 << 20).to_string(), "4MiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

const UNITS: &[(&str, u64)] = &[
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("pib", 1 << 50),
    ("eib", 1 << 60),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("p", 1 << 50),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("pb", 1_000_000_000_000_000),
    ("b", 1),
    ("", 1),
];

impl FromStr for ByteSize {
    type Err = GeometryError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |reason| GeometryError::BadSize {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let num: String = num.chars().filter(|&c| c != '_').collect();
        if num.is_empty() {
            return Err(bad("no number"));
        }
        let unit = unit.trim().to_ascii_lowercase();
        let mult = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|&(_, m)| m)
            .ok_or_else(|| bad("unknown unit"))?;
        let bytes = match num.split_once('.') {
            None => num
                .parse::<u64>()
                .map_err(|_| bad("number too large"))?
                .checked_mul(mult)
                .ok_or_else(|| bad("size too large"))?,
            Some((int, frac)) => {
                if frac.is_empty() || frac.contains('.') || frac.len() > 9 {
                    return Err(bad("malformed fraction"));
                }
                let int: u64 = if int.is_empty() {
                    0
                } else {
                    int.parse().map_err(|_| bad("number too large"))?
                };
                let frac_val: u64 = frac.parse().map_err(|_| bad("malformed fraction"))?;
                let scale = 10u128.pow(frac.len() as u32);
                let total = int as u128 * mult as u128 + frac_val as u128 * mult as u128 / scale;
                if !(frac_val as u128 * mult as u128).is_multiple_of(scale) {
                    return Err(bad("not a whole number of bytes"));
                }
                u64::try_from(total).map_err(|_| bad("size too large"))?
            }
        };
        Ok(ByteSize(bytes))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut v = self.0;
        let mut i = 0;
        while i + 1 < NAMES.len() && v != 0 && v.is_multiple_of(1024) {
            v /= 1024;
            i += 1;
        }
        if i == 0 && self.0 >= 1 << 20 {
            // Not a whole number of binary units: print with two decimals.
            let mut x = self.0 as f64;
            let mut j = 0;
            while x >= 1024.0 && j + 1 < NAMES.len() {
                x /= 1024.0;
                j += 1;
            }
            return write!(f, "{x:.2}{}", NAMES[j]);
        }
        write!(f, "{v}{}", NAMES[i])
    }
}

/// The shape of a device: how many blocks of what size.
///
/// ```
/// use blockalloc::Geometry;
/// let g = Geometry::parse("16TiB", "4KiB").unwrap();
/// assert_eq!(g.capacity_blocks(), 1 << 32);
/// assert_eq!(g.blocks_for_bytes(1), 1);
/// assert_eq!(g.blocks_for_bytes(4096), 1);
/// assert_eq!(g.blocks_for_bytes(4097), 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    block_size: u64,
    capacity_blocks: u64,
}

impl Geometry {
    /// A device of `capacity_bytes` (rounded down to whole blocks) with
    /// `block_size`-byte blocks.
    ///
    /// # Errors
    /// When the block size is not a power of two in 512 B..=1 GiB or the
    /// capacity is less than one block.
    pub fn new(capacity_bytes: u64, block_size: u64) -> Result<Self, GeometryError> {
        if !block_size.is_power_of_two() || !(512..=1 << 30).contains(&block_size) {
            return Err(GeometryError::BadBlockSize(block_size));
        }
        let capacity_blocks = capacity_bytes / block_size;
        if capacity_blocks == 0 {
            return Err(GeometryError::CapacityTooSmall {
                capacity: capacity_bytes,
                block_size,
            });
        }
        Ok(Geometry {
            block_size,
            capacity_blocks,
        })
    }

    /// Parses both sizes from strings such as `"2TiB"` and `"4KiB"`.
    ///
    /// # Errors
    /// As [`Geometry::new`], or when a size does not parse.
    pub fn parse(capacity: &str, block_size: &str) -> Result<Self, GeometryError> {
        Self::new(
            capacity.parse::<ByteSize>()?.0,
            block_size.parse::<ByteSize>()?.0,
        )
    }

    /// A geometry given in blocks.
    ///
    /// # Errors
    /// As [`Geometry::new`].
    pub fn from_blocks(capacity_blocks: u64, block_size: u64) -> Result<Self, GeometryError> {
        Self::new(capacity_blocks.saturating_mul(block_size), block_size)
    }

    /// Bytes per block.
    pub const fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Whole blocks on the device.
    pub const fn capacity_blocks(&self) -> u64 {
        self.capacity_blocks
    }

    /// Usable bytes: whole blocks only.
    pub const fn capacity_bytes(&self) -> u64 {
        self.capacity_blocks * self.block_size
    }

    /// Blocks needed to hold `bytes` bytes (rounded up; zero for zero).
    pub const fn blocks_for_bytes(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.block_size)
    }

    /// Byte offset of a block.
    pub const fn byte_offset(&self, block: u64) -> u64 {
        block * self.block_size
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in {} blocks of {}",
            ByteSize(self.capacity_bytes()),
            self.capacity_blocks,
            ByteSize(self.block_size)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_sizes() {
        let p = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(p("0").unwrap(), 0);
        assert_eq!(p("1B").unwrap(), 1);
        assert_eq!(p("4 KiB").unwrap(), 4096);
        assert_eq!(p("4k").unwrap(), 4096);
        assert_eq!(p("2TiB").unwrap(), 2 << 40);
        assert_eq!(p("0.5MiB").unwrap(), 512 << 10);
        assert_eq!(p("1_000").unwrap(), 1000);
        assert!(p("").is_err());
        assert!(p("KiB").is_err());
        assert!(p("4XB").is_err());
        assert!(p("1.5").is_err()); // 1.5 bytes
        assert!(p("1.2.3KiB").is_err());
        assert!(p("99999999999EiB").is_err());
        assert!(p("-4KiB").is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in ["4KiB", "16TiB", "1B", "3MiB", "512B"] {
            let b: ByteSize = s.parse().unwrap();
            assert_eq!(b.to_string(), s);
        }
    }

    #[test]
    fn geometry_edges() {
        assert!(Geometry::new(4096, 3000).is_err());
        assert!(Geometry::new(100, 4096).is_err());
        let g = Geometry::new(4096 * 3 + 100, 4096).unwrap();
        assert_eq!(g.capacity_blocks(), 3);
        assert_eq!(g.capacity_bytes(), 4096 * 3);
    }
}
