//! A fast hasher for maps keyed by dense `u64` ids (object ids, block
//! numbers). The keys are ours, not an attacker's, so SipHash's protection
//! against hash flooding buys nothing, and its cost would show in the peers'
//! free path, which looks up a map on every call.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by `u64` with a multiply-fold hasher: fast, and
/// not hardened against chosen keys (the keys are ours).
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Multiply-fold hasher: a 64×64→128-bit multiply by an odd constant, high
/// and low halves xor-ed, so both the low bits (bucket index) and the high
/// bits (control byte) depend on every key bit.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let m = (self.0 ^ n) as u128 * K as u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_works_and_spreads_keys() {
        let mut m: IdMap<u64> = IdMap::default();
        for i in 0..10_000u64 {
            m.insert(i * 4096, i);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(&(77 * 4096)), Some(&77));
        let mut low = std::collections::HashSet::new();
        for i in 0..1024u64 {
            let mut h = IdHasher::default();
            h.write_u64(i << 12);
            low.insert(h.finish() & 1023);
        }
        assert!(low.len() > 500, "{}", low.len());
    }
}
