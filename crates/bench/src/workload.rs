//! Workloads: engine-independent, deterministic streams of operations.
//!
//! A [`Workload`] knows nothing about engines. Given a [`WorkloadSpec`] (and
//! so a seed) it produces the same [`Round`]s every time, so every engine of a
//! bench run sees the identical request stream, and a trace recorder can store
//! the stream as [`Op`]s (see [`Workload::ops`]).
//!
//! Every workload is made of rounds: a round is a batch of allocation
//! requests, then a batch of frees (of objects of this round or, in the
//! phased workloads, of earlier ones). In the stationary rounds each object
//! is marked with probability `free_prob` to be freed at the end of its
//! round; unmarked objects live forever. Most workloads never end by
//! themselves (the runner stops at the first allocation failure or at a
//! limit); `churn` ends after a set volume ([`Workload::next_round`] then
//! says so, and runners report `end_of_workload`).
//!
//! * [`WorkloadKind::Seed`] — the test of the original design notes: rounds
//!   of `round_size` requests with sizes from the spec's [`SizeSpec`].
//! * [`WorkloadKind::LogNormal`] — the seed workload's rounds with
//!   log-normal sizes (default `lognormal:64KiB:1.5`).
//! * [`WorkloadKind::FillShift`] — the original notes' own scenario for
//!   pooling's failure: phase 1 draws `uniform:1B..1MiB` and frees nothing
//!   until 95 % of the device has been requested; phase 2 is one round that
//!   deletes each of those objects with probability 0.8; phase 3 draws
//!   `uniform:3MiB..4MiB` with free probability 0.5 for ever. Its frees
//!   cross rounds, so runners keep an object map for it.
//! * [`WorkloadKind::Shift`] — a workload shift: phase 1 draws
//!   `uniform:1B..1MiB` with free probability 0.8 until the blocks requested
//!   in total reach the device capacity (the round in which that happens is
//!   cut short there); phase 2 draws `uniform:3MiB..4MiB` with free
//!   probability 0.5 for ever. The spec's sizes and free probability are not
//!   used.
//! * [`WorkloadKind::Aging`] — an aged device ([`AgingSpec`]): phase 1
//!   allocates objects of the spec's sizes, freeing nothing, until the live
//!   blocks reach the high mark (the round is cut short there); phase 2 is
//!   one round that deletes uniformly random live objects until the live
//!   blocks are at or below the low mark. After `cycles` such fill/delete
//!   cycles, phase 3 allocates objects of the large sizes, freeing nothing,
//!   for ever: the first failure says how much of the aged device large
//!   objects can still use. Its frees cross rounds, so runners keep an
//!   object map for it.
//! * [`WorkloadKind::Churn`] — fill, then churn ([`ChurnSpec`]): phase 1
//!   allocates objects of the spec's sizes (default `lognormal:32KiB:1`),
//!   freeing nothing, until the live blocks reach the fill level (the round
//!   is cut short there); each round of phase 2 allocates new objects until
//!   the live blocks are back at the fill level, then deletes `round_size`
//!   uniformly random live objects — steady deletes and inserts, the way an
//!   object store ages. The stream ends before the first phase-2 round that
//!   would start after `volume` × the capacity was allocated in phase 2.
//!   Its frees cross rounds.
//!
//! Randomness: one `Xoshiro256PlusPlus` seeded with the spec's seed draws,
//! for each request, its size and then its free decision.

use std::fmt;
use std::str::FromStr;

use blockalloc::Geometry;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::sizes::{SizeSampler, SizeSpec};

/// Which workload to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WorkloadKind {
    /// Stationary rounds, the original notes' test.
    #[default]
    Seed,
    /// Small objects with heavy churn, then big objects.
    Shift,
    /// The original notes' own worst case for pooling: fill the device with
    /// small objects, delete 80 % of them, then ask for big ones.
    FillShift,
    /// Fill and partly empty the device several times with a size mix,
    /// then ask for large objects ([`AgingSpec`]).
    Aging,
    /// Stationary rounds with log-normal sizes.
    LogNormal,
    /// Fill with small objects, then delete and insert at that level until
    /// a volume was allocated ([`ChurnSpec`]); the one workload that ends.
    Churn,
}

/// One entry of the workload registry: what `bench`, `bench --threads`,
/// `bench --record` and `trace gen` know of a workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadInfo {
    /// The workload.
    pub kind: WorkloadKind,
    /// The name used by `--workload`, in JSON and in trace headers.
    pub name: &'static str,
    /// What it does, for help texts: lines of at most 70 columns.
    pub help: &'static str,
    /// Its rounds have phases (reported per round and at the end).
    pub phased: bool,
    /// It draws object sizes from `--sizes` (in some phase).
    pub uses_sizes: bool,
    /// It uses `--free-prob`.
    pub uses_free_prob: bool,
    /// Every free of a round names an object allocated in the same round, so
    /// runners need no map of live objects.
    pub frees_within_round: bool,
    /// Its phases end at fill levels of the live data, so in a threaded run
    /// each thread's copy is sized to its share of the device (N copies
    /// sized to the whole device would fill it N times over).
    pub shares_device: bool,
    /// The stream ends by itself (runners then stop with
    /// `end_of_workload`); the others run until an allocation fails or a
    /// limit hits.
    pub ends: bool,
    /// Its object sizes when none are given (`--sizes`, or the sizes in a
    /// `lognormal:MEDIAN:SIGMA` name).
    pub default_sizes: SizeSpec,
}

impl WorkloadName {
    /// The sizes a run of this workload draws: `given` (`--sizes`) for the
    /// workloads that draw from it ([`WorkloadInfo::uses_sizes`]), else
    /// those given with the name (`lognormal:MEDIAN:SIGMA`), else the
    /// registry's.
    pub fn sizes(&self, given: Option<SizeSpec>) -> SizeSpec {
        let info = self.kind.info();
        if info.uses_sizes { given } else { None }
            .or(self.sizes)
            .unwrap_or(info.default_sizes)
    }
}

/// The workloads, in the order help texts list them.
pub const WORKLOADS: [WorkloadInfo; 6] = [
    WorkloadInfo {
        kind: WorkloadKind::Seed,
        name: "seed",
        help: "Stationary rounds: rounds of --round-size allocation
requests with sizes from --sizes; each object is marked with
probability --free-prob to be freed, and all marked objects of a
round are freed in one batch at the end of the round. Unmarked
objects live forever.",
        phased: false,
        uses_sizes: true,
        uses_free_prob: true,
        frees_within_round: true,
        shares_device: false,
        ends: false,
        default_sizes: UNIFORM_4MIB,
    },
    WorkloadInfo {
        kind: WorkloadKind::Shift,
        name: "shift",
        help: "A workload shift. Phase 1: sizes uniform 1B..1MiB, free probability
0.8, same rounds, until the blocks requested in total reach the
device capacity. Phase 2: sizes uniform 3MiB..4MiB, free probability
0.5, until the first failure. --sizes and --free-prob are IGNORED.",
        phased: true,
        uses_sizes: false,
        uses_free_prob: false,
        frees_within_round: true,
        shares_device: false,
        ends: false,
        default_sizes: UNIFORM_4MIB,
    },
    WorkloadInfo {
        kind: WorkloadKind::FillShift,
        name: "fill-shift",
        help: "Fill 95% with 0-1MiB objects, delete 80% of them, then 3-4MiB
objects with 50% freed. --sizes and --free-prob are IGNORED.",
        phased: true,
        uses_sizes: false,
        uses_free_prob: false,
        frees_within_round: false,
        shares_device: true,
        ends: false,
        default_sizes: UNIFORM_4MIB,
    },
    WorkloadInfo {
        kind: WorkloadKind::Aging,
        name: "aging",
        help: "An aged device. Phase 1 allocates objects of --sizes, freeing
nothing, until the live blocks reach --aging-high of the device;
phase 2 deletes uniformly random live objects down to --aging-low.
After --aging-cycles such cycles, phase 3 allocates objects of
--aging-large, freeing nothing, to the first failure: how much of
an aged device large objects can still use. --free-prob is IGNORED.",
        phased: true,
        uses_sizes: true,
        uses_free_prob: false,
        frees_within_round: false,
        shares_device: true,
        ends: false,
        default_sizes: UNIFORM_4MIB,
    },
    WorkloadInfo {
        kind: WorkloadKind::LogNormal,
        name: "lognormal",
        help: "The seed workload's rounds with log-normal sizes:
lognormal[:MEDIAN:SIGMA], default lognormal:64KiB:1.5 (capped at
4MiB). The sizes come from the name; --sizes is IGNORED.",
        phased: false,
        uses_sizes: false,
        uses_free_prob: true,
        frees_within_round: true,
        shares_device: false,
        ends: false,
        default_sizes: LOGNORMAL_SIZES,
    },
    WorkloadInfo {
        kind: WorkloadKind::Churn,
        name: "churn",
        help: "Fill, then churn, of small objects (--sizes, default
lognormal:32KiB:1). Phase 1 allocates, freeing nothing, until the
live blocks reach --churn-fill (0.95) of the device; each round of
phase 2 allocates back up to that level, then deletes --round-size
random live objects. The stream ends (stopped = end_of_workload)
once phase 2 has allocated --churn-volume (2) times the capacity.
--free-prob is IGNORED.",
        phased: true,
        uses_sizes: true,
        uses_free_prob: false,
        frees_within_round: false,
        shares_device: true,
        ends: true,
        default_sizes: CHURN_SIZES,
    },
];

/// Sizes of the original design notes, `uniform:1B..4MiB`.
const UNIFORM_4MIB: SizeSpec = SizeSpec::Uniform {
    min: 1,
    max: crate::sizes::MAX_OBJECT_BYTES,
};

/// Default sizes of the `lognormal` workload.
pub const LOGNORMAL_SIZES: SizeSpec = SizeSpec::LogNormal {
    median: 64 << 10,
    sigma: 1.5,
};

/// Default sizes of the `churn` workload.
pub const CHURN_SIZES: SizeSpec = SizeSpec::LogNormal {
    median: 32 << 10,
    sigma: 1.0,
};

impl WorkloadKind {
    /// Its entry in [`WORKLOADS`].
    pub const fn info(self) -> &'static WorkloadInfo {
        let i = match self {
            WorkloadKind::Seed => 0,
            WorkloadKind::Shift => 1,
            WorkloadKind::FillShift => 2,
            WorkloadKind::Aging => 3,
            WorkloadKind::LogNormal => 4,
            WorkloadKind::Churn => 5,
        };
        &WORKLOADS[i]
    }

    /// The name used by `--workload` and in JSON.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// True when every free of a round names an object allocated in the
    /// same round (`seed`, `shift`, `lognormal`); `fill-shift`, `aging` and
    /// `churn` free objects of earlier rounds.
    pub const fn frees_within_round(self) -> bool {
        self.info().frees_within_round
    }

    /// The names of all workloads, for messages: `seed, shift, …`.
    pub fn names() -> String {
        WORKLOADS.map(|w| w.name).join(", ")
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `--workload` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown workload {0:?} (known: {names}; lognormal takes its sizes as lognormal:MEDIAN:SIGMA)",
    names = WorkloadKind::names()
)]
pub struct UnknownWorkload(pub String);

blockalloc::invalid_input_errors!(UnknownWorkload);

impl FromStr for WorkloadKind {
    type Err = UnknownWorkload;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        WORKLOADS
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.kind)
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

/// A `--workload` value: a name of the registry, or
/// `lognormal:MEDIAN:SIGMA` (the `lognormal` workload with these sizes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadName {
    /// The workload.
    pub kind: WorkloadKind,
    /// Sizes given with the name (`lognormal:MEDIAN:SIGMA` only).
    pub sizes: Option<SizeSpec>,
}

impl From<WorkloadKind> for WorkloadName {
    fn from(kind: WorkloadKind) -> Self {
        WorkloadName { kind, sizes: None }
    }
}

impl FromStr for WorkloadName {
    type Err = UnknownWorkload;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(kind) = s.parse::<WorkloadKind>() {
            return Ok(kind.into());
        }
        let t = s.trim();
        let prefix = WorkloadKind::LogNormal.name();
        let named = t
            .get(..prefix.len() + 1)
            .is_some_and(|p| p.eq_ignore_ascii_case(&format!("{prefix}:")));
        match t.parse::<SizeSpec>() {
            Ok(sizes @ SizeSpec::LogNormal { .. }) if named => Ok(WorkloadName {
                kind: WorkloadKind::LogNormal,
                sizes: Some(sizes),
            }),
            _ => Err(UnknownWorkload(s.to_string())),
        }
    }
}

impl fmt::Display for WorkloadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sizes {
            Some(sizes) => write!(f, "{sizes}"),
            None => f.write_str(self.kind.name()),
        }
    }
}

/// `fill-shift`: the share of the device phase 1 fills with small objects.
pub const FILL_SHIFT_FILL: f64 = 0.95;
/// `fill-shift`: the share of phase-1 objects the deletion round deletes.
pub const FILL_SHIFT_DELETE: f64 = 0.8;

/// Phase 1 of the shift workload: sizes and free probability.
pub const SHIFT_PHASE1: (SizeSpec, f64) = (
    SizeSpec::Uniform {
        min: 1,
        max: 1 << 20,
    },
    0.8,
);

/// Phase 2 of the shift workload: sizes and free probability.
pub const SHIFT_PHASE2: (SizeSpec, f64) = (
    SizeSpec::Uniform {
        min: 3 << 20,
        max: 4 << 20,
    },
    0.5,
);

/// The shape of the `aging` workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgingSpec {
    /// Share of the device each fill phase fills to, in `(0, 1]`.
    pub high: f64,
    /// Share of the device each delete phase deletes down to, in
    /// `[0, high)`.
    pub low: f64,
    /// Fill/delete cycles before the large objects, at least 1.
    pub cycles: u32,
    /// Sizes of the final phase's objects.
    pub large: SizeSpec,
}

impl Default for AgingSpec {
    /// Fill to 90 %, delete down to 50 %, four times, then `uniform:3MiB..4MiB`.
    fn default() -> Self {
        AgingSpec {
            high: 0.9,
            low: 0.5,
            cycles: 4,
            large: SHIFT_PHASE2.0,
        }
    }
}

/// An [`AgingSpec`] that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgingSpecError {
    /// The high mark is not in `(0, 1]`.
    #[error("the high mark {0} must be in (0, 1]")]
    High(String),
    /// The low mark is not in `[0, high)`.
    #[error("the low mark {low} must be at least 0 and below the high mark {high}")]
    Low {
        /// The low mark given.
        low: String,
        /// The high mark given.
        high: String,
    },
    /// Zero cycles.
    #[error("the number of fill/delete cycles must be at least 1")]
    Cycles,
}

blockalloc::invalid_input_errors!(AgingSpecError);

impl AgingSpec {
    /// Checks the marks and the cycle count.
    ///
    /// # Errors
    /// [`AgingSpecError`] naming the value that is out of range.
    pub fn validate(&self) -> Result<(), AgingSpecError> {
        if !(self.high > 0.0 && self.high <= 1.0) {
            return Err(AgingSpecError::High(self.high.to_string()));
        }
        if !(self.low >= 0.0 && self.low < self.high) {
            return Err(AgingSpecError::Low {
                low: self.low.to_string(),
                high: self.high.to_string(),
            });
        }
        if self.cycles == 0 {
            return Err(AgingSpecError::Cycles);
        }
        Ok(())
    }
}

/// The shape of the `churn` workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnSpec {
    /// Share of the device kept live, in `(0, 1]`.
    pub fill: f64,
    /// Blocks allocated in phase 2 before the stream ends, as a multiple of
    /// the capacity, from 0 to 10⁶.
    pub volume: f64,
}

impl Default for ChurnSpec {
    /// Keep 95 % live; churn twice the capacity.
    fn default() -> Self {
        ChurnSpec {
            fill: 0.95,
            volume: 2.0,
        }
    }
}

/// A [`ChurnSpec`] that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChurnSpecError {
    /// The fill level is not in `(0, 1]`.
    #[error("the fill level {0} must be in (0, 1]")]
    Fill(String),
    /// The volume is not a number of capacities from 0 to 10⁶.
    #[error("the volume {0} must be a number of capacities from 0 to 1e6")]
    Volume(String),
}

blockalloc::invalid_input_errors!(ChurnSpecError);

impl ChurnSpec {
    /// Checks the fill level and the volume.
    ///
    /// # Errors
    /// [`ChurnSpecError`] naming the value that is out of range.
    pub fn validate(&self) -> Result<(), ChurnSpecError> {
        if !(self.fill > 0.0 && self.fill <= 1.0) {
            return Err(ChurnSpecError::Fill(self.fill.to_string()));
        }
        if !(self.volume.is_finite() && (0.0..=1e6).contains(&self.volume)) {
            return Err(ChurnSpecError::Volume(self.volume.to_string()));
        }
        Ok(())
    }
}

/// Everything that determines a workload's stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadSpec {
    /// Which workload.
    pub kind: WorkloadKind,
    /// Object sizes (seed workload only).
    pub sizes: SizeSpec,
    /// Probability that an object is freed at the end of its round, in
    /// `[0, 1]` (seed workload only).
    pub free_prob: f64,
    /// Allocation requests per round, at least 1.
    pub round_size: u64,
    /// RNG seed.
    pub seed: u64,
    /// Marks, cycles and large sizes (aging workload only).
    pub aging: AgingSpec,
    /// Fill level and volume (churn workload only).
    pub churn: ChurnSpec,
}

impl Default for WorkloadSpec {
    /// The seed workload of the original notes.
    fn default() -> Self {
        WorkloadSpec::new(WorkloadKind::Seed)
    }
}

/// A probability of freeing outside `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("{0} must be a probability in [0, 1]")]
pub struct FreeProbError(pub f64);

impl WorkloadSpec {
    /// Checks a probability of freeing ([`WorkloadSpec::free_prob`]).
    ///
    /// # Errors
    /// [`FreeProbError`] outside `[0, 1]` (NaN included).
    pub fn check_free_prob(p: f64) -> Result<f64, FreeProbError> {
        if (0.0..=1.0).contains(&p) {
            Ok(p)
        } else {
            Err(FreeProbError(p))
        }
    }

    /// Worker `w` of `workers` that run copies of this workload side by
    /// side against one device (threads of one process, clients of one
    /// server): seed `seed + w`, rounds of `round_size / workers` (rounded
    /// up), so that a round of all of them asks for about `round_size`
    /// objects, and, for the workloads whose phases end at fill levels
    /// ([`WorkloadInfo::shares_device`]), `1 / workers` of `geometry`'s
    /// blocks. Returns the worker's spec and geometry.
    pub fn for_worker(&self, geometry: Geometry, w: u32, workers: u32) -> (WorkloadSpec, Geometry) {
        let workers = workers.max(1);
        let spec = WorkloadSpec {
            seed: self.seed.wrapping_add(u64::from(w)),
            round_size: self.round_size.div_ceil(u64::from(workers)).max(1),
            ..*self
        };
        let geometry = if self.kind.info().shares_device {
            let blocks = (geometry.capacity_blocks() / u64::from(workers)).max(1);
            let block_size = geometry.block_size();
            Geometry::new(blocks * block_size, block_size).unwrap_or(geometry)
        } else {
            geometry
        };
        (spec, geometry)
    }

    /// The defaults for `kind`: its registry sizes, free probability 0.5,
    /// rounds of 100 000 requests, seed 1, default aging and churn shapes.
    pub fn new(kind: WorkloadKind) -> Self {
        WorkloadSpec {
            kind,
            sizes: kind.info().default_sizes,
            free_prob: 0.5,
            round_size: 100_000,
            seed: 1,
            aging: AgingSpec::default(),
            churn: ChurnSpec::default(),
        }
    }

    /// The stream in one line, for the headers of reports: the sizes, free
    /// probabilities and phases the workload uses.
    pub fn describe(&self) -> String {
        match self.kind {
            WorkloadKind::Seed | WorkloadKind::LogNormal => {
                format!("sizes {}, free prob {}", self.sizes, self.free_prob)
            }
            WorkloadKind::Shift => {
                "phase 1 uniform:1B..1MiB p=0.8, phase 2 uniform:3MiB..4MiB p=0.5".to_string()
            }
            WorkloadKind::FillShift => "phase 1 uniform:1B..1MiB to 95% full, phase 2 deletes \
                 80%, phase 3 uniform:3MiB..4MiB p=0.5"
                .to_string(),
            WorkloadKind::Aging => {
                let a = self.aging;
                format!(
                    "{} cycles of filling to {}% with {} and deleting random objects down to \
                     {}%, then {} to the first failure",
                    a.cycles,
                    a.high * 100.0,
                    self.sizes,
                    a.low * 100.0,
                    a.large
                )
            }
            WorkloadKind::Churn => {
                let c = self.churn;
                format!(
                    "fill to {}% with {}, then rounds of refilling and deleting {} random \
                     objects until {} capacities were allocated",
                    c.fill * 100.0,
                    self.sizes,
                    self.round_size,
                    c.volume
                )
            }
        }
    }
}

/// One allocation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Object id, unique within the stream, increasing from 0.
    pub object: u64,
    /// Blocks requested (at least 1).
    pub blocks: u64,
}

/// One round of a workload: allocations, then frees of earlier objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Round number, from 1.
    pub number: u64,
    /// Workload phase, from 1 (always 1 for the seed workload).
    pub phase: u8,
    /// Allocation requests, in order.
    pub allocs: Vec<AllocRequest>,
    /// Objects to free after the allocations, in order.
    pub frees: Vec<u64>,
}

/// One operation of a workload stream, for recorders and replayers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `blocks` blocks for a new object.
    Alloc {
        /// Object id.
        object: u64,
        /// Blocks requested.
        blocks: u64,
    },
    /// Free every extent of an object.
    Free {
        /// Object id.
        object: u64,
    },
    /// The end of a round.
    RoundEnd {
        /// Round number, from 1.
        round: u64,
        /// Phase of the round, from 1.
        phase: u8,
    },
}

/// A deterministic generator of [`Round`]s.
#[derive(Clone, Debug)]
pub struct Workload {
    spec: WorkloadSpec,
    capacity_blocks: u64,
    block_size: u64,
    rng: Xoshiro256PlusPlus,
    sampler: SizeSampler,
    free_prob: f64,
    phase: u8,
    rounds: u64,
    next_object: u64,
    /// Blocks requested since the stream began (saturating).
    requested_blocks: u64,
    /// Aging, churn: every live object and its blocks, in no order (a
    /// delete picks uniformly among them).
    live: Vec<(u64, u64)>,
    /// Aging, churn: blocks of the objects in `live`.
    live_blocks: u64,
    /// Aging: delete phases done.
    cycles_done: u32,
    /// Churn: blocks requested in phase 2.
    churned: u64,
}

impl Workload {
    /// A fresh stream for a device of `geometry`.
    ///
    /// # Panics
    /// When the spec is invalid: `round_size == 0`, `free_prob` outside
    /// `[0, 1]`, (aging) an [`AgingSpec`] that fails
    /// [`AgingSpec::validate`] or (churn) a [`ChurnSpec`] that fails
    /// [`ChurnSpec::validate`]. Callers validate user input first.
    pub fn new(spec: WorkloadSpec, geometry: Geometry) -> Self {
        assert!(spec.round_size > 0, "round size must be at least 1");
        assert!(
            (0.0..=1.0).contains(&spec.free_prob),
            "free probability must be in [0, 1]"
        );
        let (sizes, free_prob) = match spec.kind {
            WorkloadKind::Seed | WorkloadKind::LogNormal => (spec.sizes, spec.free_prob),
            WorkloadKind::Churn => {
                if let Err(e) = spec.churn.validate() {
                    panic!("invalid churn workload: {e}");
                }
                (spec.sizes, 0.0)
            }
            WorkloadKind::Shift => SHIFT_PHASE1,
            WorkloadKind::FillShift => (SHIFT_PHASE1.0, 0.0),
            WorkloadKind::Aging => {
                if let Err(e) = spec.aging.validate() {
                    panic!("invalid aging workload: {e}");
                }
                (spec.sizes, 0.0)
            }
        };
        Workload {
            spec,
            capacity_blocks: geometry.capacity_blocks(),
            block_size: geometry.block_size(),
            rng: Xoshiro256PlusPlus::seed_from_u64(spec.seed),
            sampler: SizeSampler::new(sizes, geometry.block_size()),
            free_prob,
            phase: 1,
            rounds: 0,
            next_object: 0,
            requested_blocks: 0,
            live: Vec::new(),
            live_blocks: 0,
            cycles_done: 0,
            churned: 0,
        }
    }

    /// The spec this stream was built from.
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// The phase the next round will be in.
    pub fn phase(&self) -> u8 {
        self.phase
    }

    /// Sizes drawn in the current phase.
    pub fn current_sizes(&self) -> SizeSpec {
        self.sampler.spec()
    }

    /// Free probability of the current phase.
    pub fn current_free_prob(&self) -> f64 {
        self.free_prob
    }

    /// True when every free of a round names an object allocated in the
    /// same round (true of both workloads here; a trace replay need not be).
    /// A runner can then forget each round's objects at the round's end
    /// instead of keeping every live object in a map.
    pub fn frees_within_round(&self) -> bool {
        self.spec.kind.frees_within_round()
    }

    /// Blocks requested by all rounds generated so far.
    pub fn requested_blocks(&self) -> u64 {
        self.requested_blocks
    }

    /// Fills `round` (reusing its buffers) with the next round; false, with
    /// `round` emptied, when the stream has ended (only a workload whose
    /// [`WorkloadInfo::ends`] ends).
    pub fn next_round(&mut self, round: &mut Round) -> bool {
        round.allocs.clear();
        round.frees.clear();
        if self.ended() {
            return false;
        }
        self.rounds += 1;
        round.number = self.rounds;
        round.phase = self.phase;
        match self.spec.kind {
            WorkloadKind::Aging => self.next_aging_round(round),
            WorkloadKind::Churn => self.next_churn_round(round),
            _ => self.next_stationary_round(round),
        }
        true
    }

    /// True once the stream has no more rounds: churn, after its volume.
    fn ended(&self) -> bool {
        self.spec.kind == WorkloadKind::Churn
            && self.phase == 2
            && self.churned as f64 >= self.spec.churn.volume * self.capacity_blocks as f64
    }

    /// Draws one object of the current sizes (not yet in any round).
    fn draw(&mut self) -> AllocRequest {
        let blocks = self.sampler.sample_blocks(&mut self.rng);
        let object = self.next_object;
        self.next_object += 1;
        self.requested_blocks = self.requested_blocks.saturating_add(blocks);
        AllocRequest { object, blocks }
    }

    /// [`next_round`](Self::next_round) of the workloads whose rounds mark
    /// each object to be freed or not: seed, lognormal, shift, fill-shift.
    fn next_stationary_round(&mut self, round: &mut Round) {
        if self.spec.kind == WorkloadKind::FillShift && self.phase == 2 {
            // The deletion round: every phase-1 object (all still live) is
            // deleted with probability FILL_SHIFT_DELETE; then big objects.
            for object in 0..self.next_object {
                if self.rng.random_bool(FILL_SHIFT_DELETE) {
                    round.frees.push(object);
                }
            }
            self.phase = 3;
            let (sizes, p) = SHIFT_PHASE2;
            self.sampler = SizeSampler::new(sizes, self.block_size);
            self.free_prob = p;
            return;
        }
        for _ in 0..self.spec.round_size {
            let req = self.draw();
            round.allocs.push(req);
            if self.rng.random_bool(self.free_prob) {
                round.frees.push(req.object);
            }
            if self.phase == 1
                && self.spec.kind == WorkloadKind::FillShift
                && self.requested_blocks as f64 >= FILL_SHIFT_FILL * self.capacity_blocks as f64
            {
                self.phase = 2;
                break;
            }
            if self.phase == 1
                && self.spec.kind == WorkloadKind::Shift
                && self.requested_blocks >= self.capacity_blocks
            {
                self.phase = 2;
                let (sizes, p) = SHIFT_PHASE2;
                self.sampler = SizeSampler::new(sizes, self.block_size);
                self.free_prob = p;
                break;
            }
        }
    }

    /// [`next_round`](Self::next_round) of the aging workload.
    fn next_aging_round(&mut self, round: &mut Round) {
        let a = self.spec.aging;
        let cap = self.capacity_blocks as f64;
        if self.phase == 2 {
            let low = a.low * cap;
            while self.live_blocks as f64 > low && !self.live.is_empty() {
                self.delete_random(round);
            }
            self.cycles_done += 1;
            if self.cycles_done < a.cycles {
                self.phase = 1;
            } else {
                // The live set is never needed again: nothing more is freed.
                self.live = Vec::new();
                self.phase = 3;
                self.sampler = SizeSampler::new(a.large, self.block_size);
            }
            return;
        }
        for _ in 0..self.spec.round_size {
            let req = self.draw();
            round.allocs.push(req);
            if self.phase == 1 && self.hold(req, a.high) {
                self.phase = 2;
                break;
            }
        }
    }

    /// Files `req` among the live objects; true when the live blocks reach
    /// `level` of the device.
    fn hold(&mut self, req: AllocRequest, level: f64) -> bool {
        self.live.push((req.object, req.blocks));
        self.live_blocks += req.blocks;
        self.live_blocks as f64 >= level * self.capacity_blocks as f64
    }

    /// Deletes a uniformly random live object into `round` (none when no
    /// object is live).
    fn delete_random(&mut self, round: &mut Round) {
        if self.live.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.live.len());
        let (object, blocks) = self.live.swap_remove(i);
        self.live_blocks -= blocks;
        round.frees.push(object);
    }

    /// [`next_round`](Self::next_round) of the churn workload.
    fn next_churn_round(&mut self, round: &mut Round) {
        let fill = self.spec.churn.fill;
        if self.phase == 1 {
            for _ in 0..self.spec.round_size {
                let req = self.draw();
                round.allocs.push(req);
                if self.hold(req, fill) {
                    self.phase = 2;
                    break;
                }
            }
            return;
        }
        let level = fill * self.capacity_blocks as f64;
        while (self.live_blocks as f64) < level {
            let req = self.draw();
            round.allocs.push(req);
            self.churned = self.churned.saturating_add(req.blocks);
            self.hold(req, fill);
        }
        for _ in 0..self.spec.round_size {
            self.delete_random(round);
        }
    }

    /// The stream as individual operations, for recorders.
    pub fn ops(self) -> Ops {
        Ops {
            workload: self,
            round: Round::default(),
            pos: 0,
        }
    }
}

/// The operations of a [`Workload`], round after round, until the stream
/// ends (most never do).
#[derive(Clone, Debug)]
pub struct Ops {
    workload: Workload,
    round: Round,
    /// Position in `round`: allocations, then frees, then the round end.
    pos: usize,
}

impl Iterator for Ops {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        let (na, nf) = (self.round.allocs.len(), self.round.frees.len());
        if self.round.number == 0 || self.pos > na + nf {
            if !self.workload.next_round(&mut self.round) {
                return None;
            }
            self.pos = 0;
        }
        let (na, nf) = (self.round.allocs.len(), self.round.frees.len());
        let i = self.pos;
        self.pos += 1;
        Some(if i < na {
            let a = self.round.allocs[i];
            Op::Alloc {
                object: a.object,
                blocks: a.blocks,
            }
        } else if i < na + nf {
            Op::Free {
                object: self.round.frees[i - na],
            }
        } else {
            Op::RoundEnd {
                round: self.round.number,
                phase: self.round.phase,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_probabilities_and_sizes_are_decided_here() {
        assert_eq!(WorkloadSpec::check_free_prob(0.0), Ok(0.0));
        assert_eq!(WorkloadSpec::check_free_prob(1.0), Ok(1.0));
        for bad in [1.5, -0.1] {
            assert_eq!(WorkloadSpec::check_free_prob(bad), Err(FreeProbError(bad)));
        }
        let e = WorkloadSpec::check_free_prob(f64::NAN).unwrap_err();
        assert_eq!(e.to_string(), "NaN must be a probability in [0, 1]");
        let given: SizeSpec = "fixed:8KiB".parse().unwrap();
        for w in WORKLOADS {
            let name = WorkloadName::from(w.kind);
            assert_eq!(name.sizes(None), w.default_sizes, "{}", w.name);
            let want = if w.uses_sizes { given } else { w.default_sizes };
            assert_eq!(name.sizes(Some(given)), want, "{}", w.name);
        }
        let named: WorkloadName = "lognormal:256KiB:1".parse().unwrap();
        assert_eq!(named.sizes(Some(given)), named.sizes.unwrap());
    }

    /// Every workload is found by its registry name, its entry is its own,
    /// and an unknown name's message lists them all.
    #[test]
    fn the_registry_names_every_workload() {
        for w in WORKLOADS {
            assert_eq!(w.kind.info(), &w);
            assert_eq!(w.name.parse::<WorkloadKind>(), Ok(w.kind));
            assert_eq!(w.kind.to_string(), w.name);
            assert!(w.help.lines().all(|l| l.len() <= 70), "{}", w.name);
        }
        let e = "churny".parse::<WorkloadKind>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown workload \"churny\" (known: seed, shift, fill-shift, aging, lognormal, \
             churn; lognormal takes its sizes as lognormal:MEDIAN:SIGMA)"
        );
        for w in WORKLOADS {
            assert!(e.contains(w.name), "{}", w.name);
            assert_eq!(WorkloadSpec::new(w.kind).sizes, w.default_sizes);
            let name: WorkloadName = w.name.parse().unwrap();
            assert_eq!((name.kind, name.sizes), (w.kind, None));
        }
    }

    #[test]
    fn lognormal_takes_its_sizes_from_its_name() {
        let n: WorkloadName = "LogNormal:256KiB:1".parse().unwrap();
        assert_eq!(n.kind, WorkloadKind::LogNormal);
        assert_eq!(n.to_string(), "lognormal:256KiB:1");
        assert_eq!(
            "lognormal".parse::<WorkloadName>().unwrap().sizes,
            None,
            "the registry's default sizes apply"
        );
        for bad in ["lognormal:1", "uniform:1B..4MiB", "seed:1", "lognormal:"] {
            assert!(bad.parse::<WorkloadName>().is_err(), "{bad}");
        }
    }

    /// Churn fills to its level, then each round refills and deletes
    /// `round_size` random live objects, and the stream ends after its
    /// volume.
    #[test]
    fn churn_fills_churns_then_ends() {
        let geometry = Geometry::parse("256MiB", "4KiB").unwrap();
        let cap = geometry.capacity_blocks();
        let mut spec = WorkloadSpec::new(WorkloadKind::Churn);
        spec.round_size = 50;
        spec.churn = ChurnSpec {
            fill: 0.9,
            volume: 0.5,
        };
        let mut w = Workload::new(spec, geometry);
        assert!(!w.frees_within_round());
        let mut live: std::collections::HashMap<u64, u64> = Default::default();
        let mut r = Round::default();
        let mut churned = 0u64;
        let mut phase2_rounds = 0;
        while w.next_round(&mut r) {
            let new: u64 = r.allocs.iter().map(|a| a.blocks).sum();
            live.extend(r.allocs.iter().map(|a| (a.object, a.blocks)));
            let held: u64 = live.values().sum();
            assert!(held <= cap, "the live objects always fit");
            for o in &r.frees {
                assert!(live.remove(o).is_some(), "frees only live objects, once");
            }
            match r.phase {
                1 => assert!(r.frees.is_empty(), "the fill frees nothing"),
                2 => {
                    phase2_rounds += 1;
                    churned += new;
                    assert_eq!(r.frees.len(), 50);
                }
                p => panic!("phase {p}"),
            }
        }
        assert!(phase2_rounds > 10, "{phase2_rounds}");
        let volume = 0.5 * cap as f64;
        assert!(churned as f64 >= volume, "{churned}");
        assert!(!w.next_round(&mut r), "an ended stream stays ended");
        assert!(r.allocs.is_empty() && r.frees.is_empty());
        // The operations end with the stream, deterministically.
        let ops: Vec<Op> = Workload::new(spec, geometry).ops().collect();
        assert_eq!(ops, Workload::new(spec, geometry).ops().collect::<Vec<_>>());
        assert!(matches!(ops.last(), Some(Op::RoundEnd { phase: 2, .. })));
    }

    #[test]
    fn churn_spec_refuses_levels_out_of_range() {
        let ok = ChurnSpec::default();
        assert_eq!(ok.validate(), Ok(()));
        for (bad, what) in [
            (ChurnSpec { fill: 0.0, ..ok }, "fill"),
            (ChurnSpec { fill: 1.5, ..ok }, "fill"),
            (
                ChurnSpec {
                    fill: f64::NAN,
                    ..ok
                },
                "fill",
            ),
            (ChurnSpec { volume: -1.0, ..ok }, "volume"),
            (
                ChurnSpec {
                    volume: f64::INFINITY,
                    ..ok
                },
                "volume",
            ),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.to_string().contains(what), "{bad:?}: {e}");
        }
    }

    #[test]
    fn fill_shift_fills_deletes_then_asks_big() {
        let geometry = Geometry::parse("1GiB", "4KiB").unwrap();
        let spec = WorkloadSpec {
            kind: WorkloadKind::FillShift,
            round_size: 100,
            ..WorkloadSpec::default()
        };
        let mut w = Workload::new(spec, geometry);
        assert!(!w.frees_within_round());
        let mut r = Round::default();
        let mut filled = 0u64;
        loop {
            w.next_round(&mut r);
            assert_eq!(r.phase, 1);
            assert!(r.frees.is_empty(), "phase 1 frees nothing");
            filled += r.allocs.iter().map(|a| a.blocks).sum::<u64>();
            if w.phase() == 2 {
                break;
            }
        }
        let cap = geometry.capacity_blocks() as f64;
        assert!(filled as f64 >= FILL_SHIFT_FILL * cap && filled as f64 <= 0.97 * cap);
        let objects = r.allocs.last().unwrap().object + 1;
        w.next_round(&mut r);
        assert_eq!(r.phase, 2);
        assert!(r.allocs.is_empty());
        let share = r.frees.len() as f64 / objects as f64;
        assert!((0.75..0.85).contains(&share), "deleted {share}");
        w.next_round(&mut r);
        assert_eq!(r.phase, 3);
        let min = geometry.blocks_for_bytes(3 << 20);
        assert!(r.allocs.iter().all(|a| a.blocks >= min));
        assert!(
            r.frees.iter().all(|&o| o >= objects),
            "phase 3 frees its own"
        );
    }

    #[test]
    fn aging_fills_deletes_in_cycles_then_asks_large() {
        let geometry = Geometry::parse("1GiB", "4KiB").unwrap();
        let cap = geometry.capacity_blocks() as f64;
        let aging = AgingSpec {
            high: 0.8,
            low: 0.3,
            cycles: 3,
            large: SizeSpec::Fixed(4 << 20),
        };
        let spec = WorkloadSpec {
            kind: WorkloadKind::Aging,
            round_size: 100,
            aging,
            ..WorkloadSpec::default()
        };
        let mut w = Workload::new(spec, geometry);
        assert!(!w.frees_within_round());
        let mut live: std::collections::HashMap<u64, u64> = Default::default();
        let mut r = Round::default();
        for _ in 0..aging.cycles {
            loop {
                w.next_round(&mut r);
                assert_eq!(r.phase, 1);
                assert!(r.frees.is_empty(), "a fill phase frees nothing");
                assert!(r.allocs.iter().all(|a| (1..=1024).contains(&a.blocks)));
                live.extend(r.allocs.iter().map(|a| (a.object, a.blocks)));
                if w.phase() == 2 {
                    break;
                }
                assert_eq!(r.allocs.len(), 100);
            }
            // The fill stops at the request that reaches the high mark.
            let filled: u64 = live.values().sum();
            let last = r.allocs.last().unwrap().blocks;
            assert!(filled as f64 >= 0.8 * cap && ((filled - last) as f64) < 0.8 * cap);
            w.next_round(&mut r);
            assert_eq!(r.phase, 2);
            assert!(r.allocs.is_empty());
            for o in &r.frees {
                assert!(live.remove(o).is_some(), "frees only live objects, once");
            }
            // Deleted down to the low mark and not one object further.
            let left: u64 = live.values().sum();
            assert!((left as f64) <= 0.3 * cap, "{left}");
            let last = live.len();
            assert!(last > 0);
        }
        for _ in 0..3 {
            w.next_round(&mut r);
            assert_eq!(r.phase, 3);
            assert!(r.frees.is_empty());
            assert_eq!(r.allocs.len(), 100);
            assert!(r.allocs.iter().all(|a| a.blocks == 1024));
        }
        // Deterministic, and the seed matters.
        let ops = |seed| {
            Workload::new(WorkloadSpec { seed, ..spec }, geometry)
                .ops()
                .take(20_000)
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(1), ops(1));
        assert_ne!(ops(1), ops(2));
    }

    #[test]
    fn aging_spec_refuses_marks_out_of_order() {
        let ok = AgingSpec::default();
        assert_eq!(ok.validate(), Ok(()));
        for (bad, what) in [
            (AgingSpec { high: 0.0, ..ok }, "high"),
            (AgingSpec { high: 1.01, ..ok }, "high"),
            (
                AgingSpec {
                    high: f64::NAN,
                    ..ok
                },
                "high",
            ),
            (AgingSpec { low: 0.9, ..ok }, "low"),
            (AgingSpec { low: -0.1, ..ok }, "low"),
            (
                AgingSpec {
                    low: f64::NAN,
                    ..ok
                },
                "low",
            ),
            (AgingSpec { cycles: 0, ..ok }, "cycles"),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.to_string().contains(what), "{bad:?}: {e}");
        }
        assert_eq!("aging".parse::<WorkloadKind>(), Ok(WorkloadKind::Aging));
        assert_eq!(WorkloadKind::Aging.to_string(), "aging");
    }

    fn geo(capacity: &str) -> Geometry {
        Geometry::parse(capacity, "4KiB").unwrap()
    }

    fn spec(free_prob: f64, seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            free_prob,
            seed,
            round_size: 500,
            ..WorkloadSpec::default()
        }
    }

    fn rounds(spec: WorkloadSpec, g: Geometry, n: usize) -> Vec<Round> {
        let mut w = Workload::new(spec, g);
        (0..n)
            .map(|_| {
                let mut r = Round::default();
                w.next_round(&mut r);
                r
            })
            .collect()
    }

    #[test]
    fn same_seed_same_stream() {
        let g = geo("1GiB");
        let a = rounds(spec(0.5, 42), g, 5);
        assert_eq!(a, rounds(spec(0.5, 42), g, 5));
        assert_ne!(a, rounds(spec(0.5, 43), g, 5));
        let ops: Vec<Op> = Workload::new(spec(0.5, 42), g).ops().take(3000).collect();
        assert_eq!(
            ops,
            Workload::new(spec(0.5, 42), g)
                .ops()
                .take(3000)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn rounds_are_well_formed() {
        let rs = rounds(spec(0.5, 1), geo("1GiB"), 4);
        let mut next = 0;
        for (i, r) in rs.iter().enumerate() {
            assert_eq!(r.number, i as u64 + 1);
            assert_eq!(r.phase, 1);
            assert_eq!(r.allocs.len(), 500);
            for a in &r.allocs {
                assert_eq!(a.object, next);
                assert!((1..=1024).contains(&a.blocks));
                next += 1;
            }
            // Frees name objects of this round, in allocation order.
            let first = r.allocs[0].object;
            assert!(r.frees.windows(2).all(|w| w[0] < w[1]));
            assert!(r.frees.iter().all(|&o| o >= first && o < next));
            assert!(r.frees.len() > 150 && r.frees.len() < 350);
        }
    }

    #[test]
    fn free_prob_zero_and_one() {
        for r in rounds(spec(0.0, 9), geo("1GiB"), 5) {
            assert!(r.frees.is_empty());
        }
        for r in rounds(spec(1.0, 9), geo("1GiB"), 5) {
            let objects: Vec<u64> = r.allocs.iter().map(|a| a.object).collect();
            assert_eq!(r.frees, objects);
        }
    }

    #[test]
    fn ops_follow_rounds() {
        let g = geo("1GiB");
        let rs = rounds(spec(0.5, 5), g, 3);
        let mut expected = Vec::new();
        for r in &rs {
            expected.extend(r.allocs.iter().map(|a| Op::Alloc {
                object: a.object,
                blocks: a.blocks,
            }));
            expected.extend(r.frees.iter().map(|&object| Op::Free { object }));
            expected.push(Op::RoundEnd {
                round: r.number,
                phase: 1,
            });
        }
        let ops: Vec<Op> = Workload::new(spec(0.5, 5), g)
            .ops()
            .take(expected.len())
            .collect();
        assert_eq!(ops, expected);
    }

    #[test]
    fn shift_switches_phase_when_requests_reach_capacity() {
        let g = geo("1GiB");
        let cap = g.capacity_blocks();
        let s = WorkloadSpec {
            kind: WorkloadKind::Shift,
            round_size: 1000,
            free_prob: 0.0,                  // ignored by shift
            sizes: SizeSpec::Fixed(4 << 20), // ignored by shift
            seed: 3,
            aging: AgingSpec::default(), // ignored by shift
            churn: ChurnSpec::default(), // ignored by shift
        };
        let mut w = Workload::new(s, g);
        assert_eq!(w.current_free_prob(), 0.8);
        let mut total = 0u64;
        let mut r = Round::default();
        loop {
            w.next_round(&mut r);
            assert_eq!(r.phase, 1);
            for a in &r.allocs {
                assert!((1..=256).contains(&a.blocks), "phase 1 sizes are 0-1MiB");
            }
            let blocks: u64 = r.allocs.iter().map(|a| a.blocks).sum();
            total += blocks;
            if w.phase() == 2 {
                // The round stops at the request that reaches the capacity.
                let last = r.allocs.last().unwrap().blocks;
                assert!(total >= cap && total - last < cap, "{total} vs {cap}");
                assert!(r.allocs.len() < 1000 || total - last < cap);
                break;
            }
            assert_eq!(r.allocs.len(), 1000);
            assert!(total < cap);
        }
        assert_eq!(w.requested_blocks(), total);
        assert_eq!(w.current_free_prob(), 0.5);
        let freed_in_phase1 = r.frees.len() as f64 / r.allocs.len() as f64;
        assert!(freed_in_phase1 > 0.6, "{freed_in_phase1}");
        for _ in 0..3 {
            w.next_round(&mut r);
            assert_eq!(r.phase, 2);
            assert_eq!(r.allocs.len(), 1000);
            for a in &r.allocs {
                assert!((768..=1024).contains(&a.blocks), "phase 2 sizes are 3-4MiB");
            }
        }
    }
}
