//! [`BenchEngine`]: the engines a bench can run, by name — the core engines
//! of [`blockalloc::EngineKind`] and, with the `peers` feature, adapters over
//! other crates' allocators.

use std::fmt;

use blockalloc::{Allocator, BuildError, EngineKind};

#[cfg(feature = "peers")]
use crate::peers::PeerKind;

/// Names of the peer engines, known even in builds without the `peers`
/// feature so that asking for one gives a useful error.
pub const PEER_NAMES: [&str; 2] = ["peer-offset-allocator", "peer-range-alloc"];

/// One engine a bench can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BenchEngine {
    /// An engine of the core crate.
    Core(EngineKind),
    /// `pool` with the notes' offline compaction, run when an allocation
    /// fails (`CompactingPool`).
    PoolCompact,
    /// Plain best fit with immediate coalescing, the packing reference
    /// ([`crate::bestfit::BestFit`]).
    BestFit,
    /// An adapter over another crate's allocator.
    #[cfg(feature = "peers")]
    Peer(PeerKind),
}

impl Default for BenchEngine {
    /// The core crate's recommended engine.
    fn default() -> Self {
        BenchEngine::Core(EngineKind::default())
    }
}

/// An `--engine` list that names no known engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineListError {
    /// A name that is no engine.
    #[error("unknown engine {name:?} (known: {known}, or all)")]
    Unknown {
        /// The name given.
        name: String,
        /// Every engine name of this build.
        known: String,
    },
    /// A peer engine in a build without the `peers` feature.
    #[error("engine {0:?} is a peer allocator; this binary was built without them (rebuild with --features peers)")]
    PeersNotBuilt(String),
    /// An empty list or an empty name in it.
    #[error("empty engine name in {0:?}")]
    Empty(String),
}

blockalloc::invalid_input_errors!(EngineListError);

impl BenchEngine {
    /// Every engine of this build: the core engines (recommended first), then
    /// the peers when built with the `peers` feature.
    pub fn all() -> Vec<BenchEngine> {
        #[allow(unused_mut)]
        let mut v: Vec<BenchEngine> = EngineKind::ALL.into_iter().map(BenchEngine::Core).collect();
        v.push(BenchEngine::PoolCompact);
        v.push(BenchEngine::BestFit);
        #[cfg(feature = "peers")]
        v.extend(PeerKind::ALL.into_iter().map(BenchEngine::Peer));
        v
    }

    /// The name `--engine` uses and reports print.
    pub fn name(self) -> &'static str {
        match self {
            BenchEngine::Core(k) => k.name(),
            BenchEngine::PoolCompact => crate::compacting::CompactingPool::NAME,
            BenchEngine::BestFit => crate::bestfit::BestFit::NAME,
            #[cfg(feature = "peers")]
            BenchEngine::Peer(p) => p.name(),
        }
    }

    /// A fresh engine over `capacity` blocks, all free.
    ///
    /// # Errors
    /// [`BuildError`] when the engine cannot serve such a device, e.g.
    /// [`BuildError::CapacityTooLarge`].
    pub fn build(self, capacity: u64) -> Result<Box<dyn Allocator>, BuildError> {
        match self {
            BenchEngine::Core(k) => k.build(capacity),
            BenchEngine::PoolCompact => {
                Ok(Box::new(crate::compacting::CompactingPool::new(capacity)?))
            }
            BenchEngine::BestFit => Ok(Box::new(
                <crate::bestfit::BestFit as blockalloc::FromFreeExtents>::with_capacity(capacity)?,
            )),
            #[cfg(feature = "peers")]
            BenchEngine::Peer(p) => p.build(capacity),
        }
    }

    /// Parses `NAME[,NAME...]` or `all`; repeated names run once, in the
    /// order first given. Names are case-insensitive.
    ///
    /// # Errors
    /// [`EngineListError`] for an unknown or empty name.
    pub fn parse_list(list: &str) -> Result<Vec<BenchEngine>, EngineListError> {
        let all = Self::all();
        let mut out: Vec<BenchEngine> = Vec::new();
        for raw in list.split(',') {
            let name = raw.trim();
            if name.is_empty() {
                return Err(EngineListError::Empty(list.to_string()));
            }
            let picked: Vec<BenchEngine> = if name.eq_ignore_ascii_case("all") {
                all.clone()
            } else if let Some(e) = all.iter().find(|e| e.name().eq_ignore_ascii_case(name)) {
                vec![*e]
            } else if PEER_NAMES.iter().any(|p| p.eq_ignore_ascii_case(name)) {
                return Err(EngineListError::PeersNotBuilt(name.to_string()));
            } else {
                let known: Vec<&str> = all.iter().map(|e| e.name()).collect();
                return Err(EngineListError::Unknown {
                    name: name.to_string(),
                    known: known.join(", "),
                });
            };
            for e in picked {
                if !out.contains(&e) {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for BenchEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        let segfit = BenchEngine::Core(EngineKind::SegFit);
        let pool = BenchEngine::Core(EngineKind::Pool);
        assert_eq!(BenchEngine::parse_list("segfit").unwrap(), vec![segfit]);
        assert_eq!(
            BenchEngine::parse_list(" Pool , segfit,pool").unwrap(),
            vec![pool, segfit]
        );
        assert_eq!(BenchEngine::parse_list("all").unwrap(), BenchEngine::all());
        assert_eq!(
            BenchEngine::parse_list("pool,all").unwrap()[0],
            pool,
            "order first given"
        );
        assert!(BenchEngine::all().len() >= EngineKind::ALL.len());
        assert_eq!(BenchEngine::default().name(), EngineKind::default().name());
    }

    #[test]
    fn refuses_bad_lists() {
        let e = BenchEngine::parse_list("segfit,nope").unwrap_err();
        assert!(e.to_string().contains("segfit, bitmap"), "{e}");
        assert!(matches!(
            BenchEngine::parse_list("segfit,,pool"),
            Err(EngineListError::Empty(_))
        ));
        assert!(BenchEngine::parse_list("").is_err());
        #[cfg(not(feature = "peers"))]
        assert!(matches!(
            BenchEngine::parse_list("peer-range-alloc"),
            Err(EngineListError::PeersNotBuilt(_))
        ));
        #[cfg(feature = "peers")]
        assert_eq!(
            BenchEngine::parse_list("peer-range-alloc").unwrap().len(),
            1
        );
    }
}
