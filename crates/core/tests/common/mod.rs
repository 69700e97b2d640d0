//! Shared test harness: a reference model, engine snapshots, and a checked
//! wrapper that runs every operation through an engine and the model and
//! compares them after every step.
//!
//! [`Checked`] is the workhorse: each call checks the result against the
//! shared `Allocator` contract (exact lengths, only free blocks handed out,
//! the right typed error, nothing changed on `Err`), against the engine's
//! documented placement policy ([`policy`]), and then the whole engine state
//! against the model (`verify()`, `free_extents()`, `used()`, `status()`).

// Each test crate uses a different part of the harness.
#![allow(dead_code)]

pub mod model;
pub mod ops;
pub mod policy;

use blockalloc::{fragmentation_score, AllocError, Allocator, EngineKind, Extent, FreeError};

pub use self::model::{ext, span, Model};

/// What an engine looks like from outside: enough to tell whether an
/// operation changed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub free: Vec<Extent>,
    pub used: u64,
}

pub fn snapshot(a: &dyn Allocator) -> Snapshot {
    Snapshot {
        free: a.free_extents(),
        used: a.used(),
    }
}

/// Panics unless `a` still looks exactly like `before`.
pub fn assert_unchanged(a: &dyn Allocator, before: &Snapshot, what: &str) {
    let now = snapshot(a);
    assert_eq!(
        &now,
        before,
        "{}: {what} failed but changed the allocator",
        a.name()
    );
}

/// Checks `status()` against the maximal free runs `runs`.
pub fn check_status(a: &dyn Allocator, runs: &[Extent], what: &str) {
    let name = a.name();
    let st = a.status();
    let free: u64 = runs.iter().map(|r| r.len()).sum();
    assert_eq!(
        st.capacity_blocks,
        a.capacity(),
        "{name}: {what}: status capacity"
    );
    assert_eq!(
        st.used_blocks + st.free_blocks,
        st.capacity_blocks,
        "{name}: {what}: used + free != capacity in {st:?}"
    );
    assert_eq!(
        st.used_blocks,
        a.used(),
        "{name}: {what}: status used vs used()"
    );
    assert_eq!(st.free_blocks, free, "{name}: {what}: status free blocks");
    assert_eq!(
        st.free_extents,
        runs.len() as u64,
        "{name}: {what}: status free_extents must count maximal runs"
    );
    assert_eq!(
        st.largest_free_extent,
        runs.iter().map(|r| r.len()).max().unwrap_or(0),
        "{name}: {what}: status largest_free_extent"
    );
    assert!(
        (0.0..=1.0).contains(&st.fragmentation),
        "{name}: {what}: fragmentation {} outside [0, 1]",
        st.fragmentation
    );
    let want = fragmentation_score(runs.iter().map(|r| r.len()));
    assert!(
        (st.fragmentation - want).abs() < 1e-12,
        "{name}: {what}: fragmentation {} but the runs score {want}",
        st.fragmentation
    );
}

/// Checks the whole engine against the model: its own invariants, its free
/// extents (maximal runs in address order), `used()` and `status()`.
pub fn check_state(a: &dyn Allocator, m: &Model, what: &str) {
    let name = a.name();
    if let Err(e) = a.verify() {
        panic!("{name}: verify() failed after {what}: {e}");
    }
    assert_eq!(a.capacity(), m.capacity(), "{name}: capacity after {what}");
    let runs = m.runs();
    assert_eq!(
        a.free_extents(),
        runs,
        "{name}: free extents after {what} differ from the model"
    );
    assert_eq!(a.used(), m.used(), "{name}: used() after {what}");
    check_status(a, &runs, what);
}

/// Runs `f` on a fresh engine of every kind over `capacity` blocks.
pub fn for_each_engine(capacity: u64, mut f: impl FnMut(EngineKind, &mut dyn Allocator)) {
    for kind in EngineKind::ALL {
        let mut a = kind
            .build(capacity)
            .unwrap_or_else(|e| panic!("{kind}: build({capacity}) failed: {e}"));
        assert_eq!(a.name(), kind.name());
        f(kind, a.as_mut());
    }
}

/// An engine run in lockstep with the model; every call is checked.
pub struct Checked {
    pub kind: EngineKind,
    pub engine: Box<dyn Allocator>,
    pub model: Model,
    /// Operations done so far (for messages).
    pub step: usize,
}

/// A sentinel placed in `out` before `allocate_scattered` to check that the
/// engine appends and, on failure, leaves `out` alone.
fn sentinel() -> Extent {
    ext(u64::MAX - 7, 7)
}

impl Checked {
    /// A fresh engine with every block free.
    pub fn new(kind: EngineKind, capacity: u64) -> Self {
        Self::from_free(kind, capacity, &[span(0, capacity)])
    }

    /// An engine where exactly `free` is free.
    pub fn from_free(kind: EngineKind, capacity: u64, free: &[Extent]) -> Self {
        let engine = kind
            .from_free_extents(capacity, free)
            .unwrap_or_else(|e| panic!("{kind}: from_free_extents({capacity}, {free:?}): {e}"));
        let c = Checked {
            kind,
            engine,
            model: Model::from_free(capacity, free),
            step: 0,
        };
        check_state(c.engine.as_ref(), &c.model, "construction");
        c
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    pub fn capacity(&self) -> u64 {
        self.model.capacity()
    }

    /// `allocate(len, hint)`, checked.
    pub fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        self.step += 1;
        let name = self.name();
        let cap = self.capacity();
        let what = format!("step {}: allocate({len}, {hint:?})", self.step);
        let before = snapshot(self.engine.as_ref());
        let model_before = self.model.clone();
        let res = self.engine.allocate(len, hint);
        match &res {
            Ok(e) => {
                assert!(len > 0, "{name}: {what} succeeded for zero blocks: {e:?}");
                assert!(
                    hint.is_none_or(|h| h <= cap),
                    "{name}: {what} accepted a hint beyond the device"
                );
                assert_eq!(e.len(), len, "{name}: {what} returned {e:?}");
                assert!(
                    e.end() <= cap,
                    "{name}: {what} returned {e:?} past the device end {cap}"
                );
                assert!(
                    self.model.is_free(*e),
                    "{name}: {what} returned {e:?}, not entirely free in {:?}",
                    self.model.runs()
                );
                self.model.take(*e);
            }
            Err(err) => {
                self.check_alloc_error(err, len, hint, &what);
                assert_unchanged(self.engine.as_ref(), &before, &what);
            }
        }
        if len > 0 && hint.is_none_or(|h| h <= cap) {
            policy::check_allocate(self.kind, &model_before, len, hint, &res);
        }
        check_state(self.engine.as_ref(), &self.model, &what);
        res
    }

    /// `allocate_scattered(len)`, checked; the extents it appended.
    pub fn allocate_scattered(&mut self, len: u64) -> Result<Vec<Extent>, AllocError> {
        self.step += 1;
        let name = self.name();
        let cap = self.capacity();
        let what = format!("step {}: allocate_scattered({len})", self.step);
        let before = snapshot(self.engine.as_ref());
        let model_before = self.model.clone();
        let mut out = vec![sentinel()];
        let res = self.engine.allocate_scattered(len, &mut out);
        assert_eq!(
            out.first(),
            Some(&sentinel()),
            "{name}: {what} must append to out, not overwrite it"
        );
        let res = match res {
            Ok(()) => {
                let pieces = out[1..].to_vec();
                assert!(len > 0, "{name}: {what} succeeded for zero blocks");
                assert!(!pieces.is_empty(), "{name}: {what} appended nothing");
                assert_eq!(
                    pieces.iter().map(|p| p.len()).sum::<u64>(),
                    len,
                    "{name}: {what} returned {pieces:?}"
                );
                for &p in &pieces {
                    assert!(p.end() <= cap, "{name}: {what}: {p:?} past the end {cap}");
                    assert!(
                        self.model.is_free(p),
                        "{name}: {what}: {p:?} of {pieces:?} is not free (or handed out twice)"
                    );
                    self.model.take(p);
                }
                Ok(pieces)
            }
            Err(err) => {
                assert_eq!(
                    out,
                    vec![sentinel()],
                    "{name}: {what} failed with {err:?} but appended to out"
                );
                self.check_alloc_error(&err, len, None, &what);
                assert_unchanged(self.engine.as_ref(), &before, &what);
                Err(err)
            }
        };
        if len > 0 {
            policy::check_scattered(self.kind, &model_before, len, &res);
        }
        check_state(self.engine.as_ref(), &self.model, &what);
        res
    }

    /// `free(e)`, checked against the model's verdict.
    pub fn free(&mut self, e: Extent) -> Result<(), FreeError> {
        self.step += 1;
        let name = self.name();
        let cap = self.capacity();
        let what = format!("step {}: free({e:?})", self.step);
        let before = snapshot(self.engine.as_ref());
        let res = self.engine.free(e);
        match &res {
            Ok(()) => {
                assert!(
                    e.end() <= cap,
                    "{name}: {what} accepted an out-of-range extent"
                );
                assert!(
                    self.model.is_allocated(e),
                    "{name}: {what} accepted an extent with free blocks; free runs {:?}",
                    self.model.runs()
                );
                self.model.give(e);
            }
            Err(FreeError::OutOfRange { extent, capacity }) => {
                assert_eq!(
                    (*extent, *capacity),
                    (e, cap),
                    "{name}: {what}: error fields"
                );
                assert!(
                    e.end() > cap,
                    "{name}: {what}: OutOfRange for an in-range extent"
                );
                assert_unchanged(self.engine.as_ref(), &before, &what);
            }
            Err(FreeError::NotAllocated { extent, overlap }) => {
                assert_eq!(*extent, e, "{name}: {what}: error names another extent");
                assert!(
                    e.end() <= cap,
                    "{name}: {what}: must be OutOfRange, not {res:?}"
                );
                assert!(
                    e.contains(overlap) && self.model.is_free(*overlap),
                    "{name}: {what}: overlap {overlap:?} must be a free part of it; free runs {:?}",
                    self.model.runs()
                );
                assert_unchanged(self.engine.as_ref(), &before, &what);
            }
            Err(other) => panic!("{name}: {what}: unexpected error {other:?}"),
        }
        check_state(self.engine.as_ref(), &self.model, &what);
        res
    }

    fn check_alloc_error(&self, err: &AllocError, len: u64, hint: Option<u64>, what: &str) {
        let name = self.name();
        let cap = self.capacity();
        if len == 0 {
            assert_eq!(err, &AllocError::ZeroLength, "{name}: {what}");
            return;
        }
        if let Some(h) = hint.filter(|&h| h > cap) {
            assert_eq!(
                err,
                &AllocError::HintOutOfRange {
                    hint: h,
                    capacity: cap
                },
                "{name}: {what}"
            );
            return;
        }
        match err {
            AllocError::NoSpace {
                requested,
                free,
                largest_free,
            } => {
                assert_eq!(*requested, len, "{name}: {what}: NoSpace.requested");
                assert!(
                    *free == 0 || *free == self.model.free_blocks(),
                    "{name}: {what}: NoSpace.free {free} but {} blocks are free",
                    self.model.free_blocks()
                );
                assert!(
                    *largest_free <= self.model.largest_run(),
                    "{name}: {what}: NoSpace.largest_free {largest_free} but the longest run \
                     is {}",
                    self.model.largest_run()
                );
            }
            other => panic!("{name}: {what}: expected NoSpace, got {other:?}"),
        }
    }

    /// `allocate`, which must succeed.
    pub fn alloc_ok(&mut self, len: u64, hint: Option<u64>) -> Extent {
        let name = self.name();
        self.allocate(len, hint)
            .unwrap_or_else(|e| panic!("{name}: allocate({len}, {hint:?}) failed: {e}"))
    }

    /// `allocate_scattered`, which must succeed.
    pub fn scattered_ok(&mut self, len: u64) -> Vec<Extent> {
        let name = self.name();
        self.allocate_scattered(len)
            .unwrap_or_else(|e| panic!("{name}: allocate_scattered({len}) failed: {e}"))
    }

    /// `free`, which must succeed.
    pub fn free_ok(&mut self, e: Extent) {
        let name = self.name();
        self.free(e)
            .unwrap_or_else(|err| panic!("{name}: free({e:?}) failed: {err}"));
    }

    /// `free`, which must be refused with `NotAllocated`.
    pub fn free_not_allocated(&mut self, e: Extent) {
        let name = self.name();
        match self.free(e) {
            Err(FreeError::NotAllocated { .. }) => {}
            other => panic!("{name}: free({e:?}) must be NotAllocated, got {other:?}"),
        }
    }

    /// Allocates every free block, `chunk` at a time where the engine can
    /// (falling back to scattered requests and smaller chunks); the extents.
    pub fn fill(&mut self, chunk: u64) -> Vec<Extent> {
        let name = self.name();
        let mut chunk = chunk.max(1);
        let mut got = Vec::new();
        while self.model.free_blocks() > 0 {
            let n = chunk.min(self.model.free_blocks());
            if let Ok(e) = self.allocate(n, None) {
                got.push(e);
            } else if let Ok(v) = self.allocate_scattered(n) {
                got.extend(v);
            } else {
                assert!(
                    n > 1,
                    "{name}: cannot allocate one block with {} free",
                    self.model.free_blocks()
                );
                chunk = n / 2;
            }
        }
        got
    }

    /// The state as a snapshot.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(self.engine.as_ref())
    }
}
