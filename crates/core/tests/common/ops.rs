//! Random workloads: operations described by raw numbers, interpreted
//! against the current state so that any sequence is meaningful (and
//! proptest can shrink it), and a driver that applies them through
//! [`Checked`] while remembering what is allocated.

use blockalloc::{Allocator, EngineKind, Extent};
use rand::Rng;

use super::{check_state, ext, span, Checked};

/// Where a contiguous allocation would like to land.
#[derive(Clone, Copy, Debug)]
pub enum Hint {
    None,
    /// The end of the previous allocation: an I/O stream.
    Stream,
    /// A raw block number, scaled to `0..=capacity`.
    At(u64),
}

/// One operation; the numbers are raw and scaled by [`Driver::apply`].
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Allocate {
        len: u64,
        hint: Hint,
    },
    Scattered {
        len: u64,
    },
    /// Free a whole live allocation.
    FreeLive {
        pick: u64,
    },
    /// Free a sub-range of a live allocation.
    FreePart {
        pick: u64,
        a: u64,
        b: u64,
    },
    /// Free the union of two or three adjacent live allocations.
    FreeUnion {
        pick: u64,
    },
    /// Free again something freed earlier (legal only if reallocated since).
    DoubleFree {
        pick: u64,
    },
    /// Free an extent overlapping a free run.
    FreeOverlappingFree {
        pick: u64,
        a: u64,
        b: u64,
    },
    /// Free an extent reaching past the device end.
    FreeOutOfRange {
        a: u64,
        b: u64,
    },
    /// Free an arbitrary in-range extent; the model says whether it is legal.
    FreeRandom {
        a: u64,
        b: u64,
    },
    /// Free every `stride`-th block of a live allocation (up to `count`
    /// blocks): many free extents at once, for deep address trees.
    Shred {
        pick: u64,
        stride: u64,
        count: u64,
    },
    /// A request that must be refused: zero length, hint past the end, or
    /// longer than the device.
    BadAllocate {
        which: u8,
        a: u64,
    },
}

impl Op {
    /// A random operation, weighted towards allocations and legal frees.
    pub fn random(rng: &mut impl Rng) -> Op {
        let (a, b, c) = (rng.random(), rng.random(), rng.random());
        match rng.random_range(0..100u32) {
            0..=29 => Op::Allocate {
                len: a,
                hint: match b % 3 {
                    0 => Hint::None,
                    1 => Hint::Stream,
                    _ => Hint::At(c),
                },
            },
            30..=39 => Op::Scattered { len: a },
            40..=59 => Op::FreeLive { pick: a },
            60..=69 => Op::FreePart {
                pick: a,
                a: b,
                b: c,
            },
            70..=76 => Op::FreeUnion { pick: a },
            77..=81 => Op::DoubleFree { pick: a },
            82..=86 => Op::FreeOverlappingFree {
                pick: a,
                a: b,
                b: c,
            },
            87..=89 => Op::FreeOutOfRange { a, b },
            90..=93 => Op::FreeRandom { a, b },
            94 => Op::Shred {
                pick: a,
                stride: b,
                count: c,
            },
            _ => Op::BadAllocate { which: b as u8, a },
        }
    }
}

/// A request length in `1..=max(1, capacity / 4)`, mostly short.
pub fn scale_len(raw: u64, capacity: u64) -> u64 {
    let max = (capacity / 4).max(1);
    let span = if raw.is_multiple_of(4) {
        max
    } else {
        max.min(64)
    };
    1 + (raw / 4) % span
}

/// Applies [`Op`]s to a [`Checked`] engine, tracking live allocations.
pub struct Driver {
    pub t: Checked,
    /// Allocated extents (pieces of allocations after partial frees).
    pub live: Vec<Extent>,
    /// Recently freed extents, for double frees.
    freed: Vec<Extent>,
    last_end: Option<u64>,
}

impl Driver {
    pub fn new(kind: EngineKind, capacity: u64) -> Self {
        Driver {
            t: Checked::new(kind, capacity),
            live: Vec::new(),
            freed: Vec::new(),
            last_end: None,
        }
    }

    /// A driver over an engine where exactly `free` is free; the rest of
    /// the device counts as live allocations, one per allocated run.
    pub fn from_free(kind: EngineKind, capacity: u64, free: &[Extent]) -> Self {
        let t = Checked::from_free(kind, capacity, free);
        let mut live = Vec::new();
        let mut pos = 0;
        for r in t.model.runs().into_iter().chain([ext(capacity, 1)]) {
            if pos < r.start() {
                live.push(span(pos, r.start()));
            }
            pos = r.end();
        }
        Driver {
            t,
            live,
            freed: Vec::new(),
            last_end: None,
        }
    }

    pub fn engine(&self) -> &dyn Allocator {
        self.t.engine.as_ref()
    }

    fn cap(&self) -> u64 {
        self.t.capacity()
    }

    /// Forgets the blocks of `e` (just freed) from the live list.
    fn forget(&mut self, e: Extent) {
        let mut kept = Vec::with_capacity(self.live.len() + 1);
        for &p in &self.live {
            if !p.overlaps(&e) {
                kept.push(p);
                continue;
            }
            if p.start() < e.start() {
                kept.push(span(p.start(), e.start()));
            }
            if e.end() < p.end() {
                kept.push(span(e.end(), p.end()));
            }
        }
        self.live = kept;
    }

    fn free(&mut self, e: Extent) {
        if self.t.free(e).is_ok() {
            self.forget(e);
            if self.freed.len() >= 64 {
                self.freed.remove(0);
            }
            self.freed.push(e);
        }
    }

    fn allocate(&mut self, len: u64, hint: Hint) {
        let cap = self.cap();
        let len = scale_len(len, cap);
        let hint = match hint {
            Hint::None => None,
            Hint::Stream => Some(self.last_end.unwrap_or(0)),
            Hint::At(h) => Some(h % (cap + 1)),
        };
        if let Ok(e) = self.t.allocate(len, hint) {
            self.live.push(e);
            self.last_end = Some(e.end());
        }
    }

    /// Applies one operation; every step is checked by [`Checked`].
    pub fn apply(&mut self, op: Op) {
        let cap = self.cap();
        match op {
            Op::Allocate { len, hint } => self.allocate(len, hint),
            Op::Scattered { len } => {
                if let Ok(v) = self.t.allocate_scattered(scale_len(len, cap)) {
                    self.live.extend(v);
                }
            }
            Op::FreeLive { pick } => match self.pick_live(pick) {
                Some(i) => {
                    let e = self.live[i];
                    self.free(e);
                }
                None => self.allocate(pick, Hint::None),
            },
            Op::FreePart { pick, a, b } => match self.pick_live(pick) {
                Some(i) => {
                    let p = self.live[i];
                    let s = p.start() + a % p.len();
                    let len = 1 + b % (p.end() - s);
                    self.free(ext(s, len));
                }
                None => self.allocate(pick, Hint::Stream),
            },
            Op::FreeUnion { pick } => {
                let mut sorted = self.live.clone();
                sorted.sort();
                let pairs: Vec<usize> = (1..sorted.len())
                    .filter(|&i| sorted[i - 1].end() == sorted[i].start())
                    .collect();
                if pairs.is_empty() {
                    return self.allocate(pick, Hint::Stream);
                }
                let i = pairs[(pick % pairs.len() as u64) as usize];
                let mut end = sorted[i].end();
                if pick % 2 == 1 && i + 1 < sorted.len() && sorted[i + 1].start() == end {
                    end = sorted[i + 1].end();
                }
                self.free(span(sorted[i - 1].start(), end));
            }
            Op::DoubleFree { pick } => {
                if self.freed.is_empty() {
                    return self.allocate(pick, Hint::None);
                }
                let e = self.freed[(pick % self.freed.len() as u64) as usize];
                self.free(e);
            }
            Op::FreeOverlappingFree { pick, a, b } => {
                let runs = self.t.model.runs();
                if runs.is_empty() {
                    return self.allocate(pick, Hint::None);
                }
                let r = runs[(pick % runs.len() as u64) as usize];
                let s = r.start().saturating_sub(a % 8);
                let e = (r.start() + 1 + b % (r.len() + 8)).min(cap);
                let res = self.t.free(span(s, e));
                assert!(
                    res.is_err(),
                    "{}: free({s}..{e}) overlaps free {r:?} but succeeded",
                    self.t.name()
                );
            }
            Op::FreeOutOfRange { a, b } => {
                let e = if a % 5 == 0 {
                    ext(u64::MAX - 1 - b % 4, 1)
                } else {
                    let s = cap.saturating_sub(a % 8);
                    ext(s, cap - s + 1 + b % 8)
                };
                let res = self.t.free(e);
                assert!(
                    res.is_err(),
                    "{}: free({e:?}) past the end succeeded",
                    self.t.name()
                );
            }
            Op::FreeRandom { a, b } => {
                let s = a % cap;
                let len = 1 + b % (cap - s).min(64);
                self.free(ext(s, len));
            }
            Op::Shred {
                pick,
                stride,
                count,
            } => match self.pick_live(pick) {
                Some(i) => {
                    let p = self.live[i];
                    let stride = 2 + stride % 4;
                    let n = (p.len() / stride).min(1 + count % 256);
                    for k in 0..n {
                        self.free(ext(p.start() + k * stride, 1));
                    }
                }
                None => self.allocate(pick, Hint::None),
            },
            Op::BadAllocate { which, a } => {
                let name = self.t.name();
                let ok = match which % 6 {
                    0 => self.t.allocate(0, None).is_ok(),
                    1 => self.t.allocate(0, Some(a % (cap + 1))).is_ok(),
                    2 => self.t.allocate_scattered(0).is_ok(),
                    3 => self.t.allocate(1 + a % 8, Some(cap + 1 + a % 100)).is_ok(),
                    4 => self.t.allocate(cap + 1 + a % 100, None).is_ok(),
                    _ => self.t.allocate_scattered(cap + 1 + a % 100).is_ok(),
                };
                assert!(!ok, "{name}: bad request {which} succeeded");
            }
        }
    }

    fn pick_live(&self, pick: u64) -> Option<usize> {
        (!self.live.is_empty()).then(|| (pick % self.live.len() as u64) as usize)
    }

    /// Frees every live allocation with one check at the end (for large
    /// free maps, where checking after each free would dominate).
    pub fn free_all_quick(&mut self) {
        let name = self.t.name();
        for e in std::mem::take(&mut self.live) {
            if let Err(err) = self.t.engine.free(e) {
                panic!("{name}: free({e:?}) of a live allocation: {err}");
            }
            self.t.model.give(e);
        }
        check_state(self.engine(), &self.t.model, "freeing everything");
        assert_eq!(self.t.model.runs(), vec![span(0, self.cap())]);
    }

    /// Frees every live allocation; the device must end up entirely free.
    pub fn free_all(&mut self) {
        while let Some(e) = self.live.pop() {
            self.t.free_ok(e);
        }
        assert_eq!(
            self.engine().free_extents(),
            vec![span(0, self.cap())],
            "{}: everything freed",
            self.t.name()
        );
    }
}
