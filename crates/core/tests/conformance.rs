//! The conformance suite: the `Allocator` contract, case by case, run on
//! every engine through the checked harness (each step is compared with the
//! reference model and followed by `verify()`); then each engine's
//! documented behaviour, in tests named after the engine; then regression
//! tests for engine bugs, named after the bug.

mod common;

use blockalloc::{
    fragmentation_score, AllocError, Allocator, BitmapAllocator, BuildError, CompactStats,
    EngineKind, Error, Extent, ExtentError, FreeError, FromFreeExtents, GroupsAllocator,
    PoolAllocator, SegFitAllocator, FRAGMENTATION_REFERENCE_BLOCKS, GROUP_BLOCKS,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use common::ops::{Driver, Op};
use common::{check_state, ext, for_each_engine, span, Checked, Model};

/// The default device: longer than `FASTBIN_MAX`, so that the pool engine
/// starts with a large-bin extent it can cut from.
const CAP: u64 = 4096;
const G: u64 = GROUP_BLOCKS;

/// Runs `f` on a fresh checked engine of every kind.
fn each(cap: u64, mut f: impl FnMut(&mut Checked)) {
    for kind in EngineKind::ALL {
        f(&mut Checked::new(kind, cap));
    }
}

/// Runs `f` on a checked engine of every kind where exactly `free` is free.
fn each_from(cap: u64, free: &[Extent], mut f: impl FnMut(&mut Checked)) {
    for kind in EngineKind::ALL {
        f(&mut Checked::from_free(kind, cap, free));
    }
}

fn rng(seed: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

fn assert_no_space(t: &mut Checked, len: u64) {
    let name = t.name();
    match t.allocate(len, None) {
        Err(AllocError::NoSpace { requested, .. }) => assert_eq!(requested, len, "{name}"),
        other => panic!("{name}: allocate({len}) must be NoSpace, got {other:?}"),
    }
}

fn assert_free_out_of_range(t: &mut Checked, e: Extent) {
    let name = t.name();
    let cap = t.capacity();
    assert_eq!(
        t.free(e),
        Err(FreeError::OutOfRange {
            extent: e,
            capacity: cap
        }),
        "{name}: free({e:?}) on a device of {cap} blocks"
    );
}

/// Runs `steps` random operations, all checked.
fn random_workload(d: &mut Driver, seed: u64, steps: usize) {
    let mut r = rng(seed);
    for _ in 0..steps {
        d.apply(Op::random(&mut r));
    }
}

// ---------------------------------------------------------------------------
// The reference model itself.

#[test]
fn model_tracks_maximal_runs() {
    let mut m = Model::new(100);
    m.take(ext(10, 10));
    m.take(ext(30, 5));
    assert_eq!(m.runs(), vec![span(0, 10), span(20, 30), span(35, 100)]);
    assert_eq!(m.free_blocks(), 85);
    assert!(m.is_free(ext(20, 10)) && !m.is_free(ext(19, 2)));
    assert!(m.is_allocated(ext(10, 10)) && !m.is_allocated(ext(10, 11)));
    assert!(
        !m.is_allocated(ext(99, 2)),
        "out of range is never allocated"
    );
    assert_eq!(m.first_fit(11, 0, 100), Some(35));
    assert_eq!(m.first_fit(5, 22, 100), Some(22));
    assert_eq!(m.best_fit_len(6), Some(10));
    assert_eq!(m.runs_within(5, 32), vec![span(5, 10), span(20, 30)]);
    assert_eq!(m.first_run_starting_after(20), Some(span(35, 100)));
    m.give(ext(10, 10));
    assert_eq!(m.runs(), vec![span(0, 30), span(35, 100)]);
    m.give(ext(30, 5));
    assert_eq!(m, Model::new(100));
    let m = Model::from_free(50, &[ext(0, 5), ext(5, 5), ext(20, 1)]);
    assert_eq!(m.runs(), vec![span(0, 10), span(20, 21)]);
    assert_eq!(m.used(), 39);
}

// ---------------------------------------------------------------------------
// Edges of the device.

#[test]
fn allocate_the_last_block() {
    for cap in [1, 2, 64, 65, CAP, G + 1] {
        let last = span(cap - 1, cap);
        each_from(cap, &[last], |t| {
            let name = t.name();
            assert_eq!(t.alloc_ok(1, None), last, "{name}: cap {cap}");
            assert_no_space(t, 1);
            t.free_ok(last);
            assert_eq!(t.scattered_ok(1), vec![last], "{name}: cap {cap}");
        });
    }
    // On a full device, the freed last block is the only place to go.
    each(CAP, |t| {
        t.fill(1000);
        t.free_ok(span(CAP - 1, CAP));
        assert_eq!(t.alloc_ok(1, None), span(CAP - 1, CAP), "{}", t.name());
    });
}

#[test]
fn free_the_last_block() {
    each(CAP, |t| {
        let name = t.name();
        assert_eq!(t.alloc_ok(CAP, None), span(0, CAP), "{name}");
        t.free_ok(span(CAP - 1, CAP));
        assert_eq!(t.engine.free_extents(), vec![span(CAP - 1, CAP)], "{name}");
        t.free_not_allocated(span(CAP - 1, CAP));
        t.free_ok(span(CAP - 3, CAP - 1));
        assert_eq!(t.engine.free_extents(), vec![span(CAP - 3, CAP)], "{name}");
    });
}

#[test]
fn extent_ending_exactly_at_capacity_is_in_range() {
    each(CAP, |t| {
        t.fill(512);
        t.free_ok(span(CAP - 100, CAP));
        // The only free space: every engine must hand it back.
        assert_eq!(t.alloc_ok(100, None), span(CAP - 100, CAP), "{}", t.name());
        t.free_ok(span(0, CAP));
    });
}

#[test]
fn extent_one_past_capacity_is_out_of_range() {
    each(CAP, |t| {
        t.fill(CAP);
        for e in [
            span(CAP - 1, CAP + 1),
            span(CAP, CAP + 1),
            ext(CAP + 5, 1),
            ext(u64::MAX - 1, 1),
            span(0, CAP + 1),
        ] {
            assert_free_out_of_range(t, e);
        }
        assert_eq!(t.engine.used(), CAP);
    });
}

#[test]
fn free_straddling_the_device_end_is_out_of_range() {
    // Part allocated, part past the end: the range check wins and nothing
    // is freed.
    each(CAP, |t| {
        t.fill(CAP);
        assert_free_out_of_range(t, span(CAP - 2, CAP + 2));
        t.free_ok(span(CAP - 2, CAP));
        // Part free, part past the end.
        assert_free_out_of_range(t, span(CAP - 1, CAP + 1));
    });
}

// ---------------------------------------------------------------------------
// Fits and a full device.

#[test]
fn exact_fit_fills_a_hole() {
    each_from(CAP, &[span(10, 20)], |t| {
        assert_eq!(t.alloc_ok(10, None), span(10, 20), "{}", t.name());
        assert!(t.engine.free_extents().is_empty());
        assert_no_space(t, 1);
    });
}

#[test]
fn exact_fit_hole_is_preferred_to_open_space() {
    // First fit (bitmap, groups), exact fit first (segfit) and exact-size
    // bins (pool) all pick the hole that fits exactly, and leave open space
    // untouched.
    each_from(CAP, &[span(10, 20), span(100, CAP)], |t| {
        assert_eq!(t.alloc_ok(10, None), span(10, 20), "{}", t.name());
        assert_eq!(
            t.engine.free_extents(),
            vec![span(100, CAP)],
            "{}",
            t.name()
        );
    });
}

#[test]
fn full_device_refuses_then_reuses_freed_space() {
    each(CAP, |t| {
        let name = t.name();
        let all = t.alloc_ok(CAP, None);
        assert_eq!(all, span(0, CAP), "{name}");
        assert_no_space(t, 1);
        assert!(matches!(
            t.allocate(1, Some(0)),
            Err(AllocError::NoSpace { requested: 1, .. })
        ));
        assert!(matches!(
            t.allocate_scattered(1),
            Err(AllocError::NoSpace { requested: 1, .. })
        ));
        t.free_ok(all);
        assert_eq!(t.alloc_ok(CAP, None), span(0, CAP), "{name}: reuse");
        t.free_ok(span(0, CAP));
        let pieces = t.fill(100);
        assert_eq!(t.engine.used(), CAP, "{name}");
        for p in pieces {
            t.free_ok(p);
        }
        let again = t.scattered_ok(CAP);
        assert_eq!(again.iter().map(|e| e.len()).sum::<u64>(), CAP, "{name}");
    });
}

#[test]
fn capacity_not_a_multiple_of_the_group_size() {
    let cap = 3 * G + 17;
    each(cap, |t| {
        let name = t.name();
        let pieces = t.fill(4096);
        assert_eq!(t.engine.used(), cap, "{name}: filled");
        assert_no_space(t, 1);
        // Free every other piece, then the rest from the end.
        let (even, odd): (Vec<_>, Vec<_>) =
            pieces.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        for (_, &p) in even {
            t.free_ok(p);
        }
        for (_, &p) in odd.into_iter().rev() {
            t.free_ok(p);
        }
        assert_eq!(t.engine.free_extents(), vec![span(0, cap)], "{name}");
        assert_eq!(t.engine.used(), 0, "{name}");
        // The short last group is usable on its own.
        let mut tail = Checked::from_free(t.kind, cap, &[span(3 * G, cap)]);
        assert_eq!(tail.alloc_ok(17, None), span(3 * G, cap), "{name}");
        tail.free_ok(span(3 * G, cap));
        assert_eq!(tail.scattered_ok(17), vec![span(3 * G, cap)], "{name}");
    });
}

#[test]
fn one_block_device() {
    each(1, |t| {
        let name = t.name();
        let only = span(0, 1);
        // The hint may name the device end.
        assert_eq!(t.alloc_ok(1, Some(1)), only, "{name}");
        assert_no_space(t, 1);
        assert_eq!(
            t.allocate(1, Some(2)),
            Err(AllocError::HintOutOfRange {
                hint: 2,
                capacity: 1
            }),
            "{name}"
        );
        assert_free_out_of_range(t, span(0, 2));
        assert_free_out_of_range(t, span(1, 2));
        t.free_ok(only);
        t.free_not_allocated(only);
        assert!(t.allocate_scattered(2).is_err(), "{name}");
        assert_eq!(t.scattered_ok(1), vec![only], "{name}");
        t.free_ok(only);
        assert_eq!(t.alloc_ok(1, Some(0)), only, "{name}");
    });
}

#[test]
fn odd_capacities() {
    for cap in [1, 2, 3, 63, 64, 65, 1023, 1025] {
        each(cap, |t| {
            let name = t.name();
            let pieces = t.fill(7);
            assert_eq!(t.engine.used(), cap, "{name}: cap {cap} filled");
            assert_no_space(t, 1);
            let mut freed = 0;
            for p in pieces.iter().step_by(2) {
                t.free_ok(*p);
                freed += p.len();
            }
            // All of the free space at once, however scattered.
            for p in t.scattered_ok(freed) {
                t.free_ok(p);
            }
            for p in pieces.iter().skip(1).step_by(2) {
                t.free_ok(*p);
            }
            assert_eq!(
                t.engine.free_extents(),
                vec![span(0, cap)],
                "{name}: cap {cap}"
            );
        });
        for kind in EngineKind::ALL {
            let mut d = Driver::new(kind, cap);
            random_workload(&mut d, cap, 300);
            d.free_all();
        }
    }
}

// ---------------------------------------------------------------------------
// Bad input: the right typed error, and nothing changes (the harness
// compares snapshots before and after every failed call).

#[test]
fn zero_length_requests_are_refused() {
    each(CAP, |t| {
        let name = t.name();
        t.alloc_ok(10, None);
        for hint in [None, Some(0), Some(5), Some(CAP), Some(CAP + 1)] {
            assert_eq!(
                t.allocate(0, hint),
                Err(AllocError::ZeroLength),
                "{name}: {hint:?}"
            );
        }
        assert_eq!(
            t.allocate_scattered(0),
            Err(AllocError::ZeroLength),
            "{name}"
        );
    });
}

#[test]
fn requests_longer_than_the_device_are_no_space() {
    each(CAP, |t| {
        let name = t.name();
        for len in [CAP + 1, 2 * CAP, u64::MAX] {
            assert!(
                matches!(t.allocate(len, None), Err(AllocError::NoSpace { requested, .. }) if requested == len),
                "{name}: allocate({len})"
            );
            assert!(
                matches!(t.allocate(len, Some(0)), Err(AllocError::NoSpace { .. })),
                "{name}: allocate({len}, Some(0))"
            );
            assert!(
                matches!(t.allocate_scattered(len), Err(AllocError::NoSpace { requested, .. }) if requested == len),
                "{name}: allocate_scattered({len})"
            );
        }
    });
}

#[test]
fn hints_beyond_the_device_are_refused_and_the_end_is_allowed() {
    each(CAP, |t| {
        let name = t.name();
        for hint in [CAP + 1, CAP + 1000, u64::MAX] {
            assert_eq!(
                t.allocate(1, Some(hint)),
                Err(AllocError::HintOutOfRange {
                    hint,
                    capacity: CAP
                }),
                "{name}"
            );
        }
        // `capacity` is the end of an extent reaching the device end.
        t.alloc_ok(16, Some(CAP));
        let e = t.alloc_ok(CAP - 16, Some(CAP));
        assert_eq!(e.len(), CAP - 16, "{name}");
        assert_eq!(
            t.allocate(1, Some(CAP + 1)),
            Err(AllocError::HintOutOfRange {
                hint: CAP + 1,
                capacity: CAP
            }),
            "{name}: a full device still checks the hint"
        );
    });
}

#[test]
fn free_out_of_range_is_refused() {
    each(CAP, |t| {
        for e in [span(CAP, CAP + 1), ext(CAP + 100, 7), ext(u64::MAX - 1, 1)] {
            assert_free_out_of_range(t, e);
        }
        t.alloc_ok(CAP / 2, None);
        for e in [span(CAP, CAP + 1), ext(CAP + 100, 7), span(0, CAP + 1)] {
            assert_free_out_of_range(t, e);
        }
    });
}

#[test]
fn double_free_of_a_whole_extent_is_refused() {
    each(CAP, |t| {
        let name = t.name();
        let a = t.alloc_ok(10, None);
        let b = t.alloc_ok(10, None);
        t.free_ok(a);
        match t.free(a) {
            Err(FreeError::NotAllocated { extent, overlap }) => {
                assert_eq!(extent, a, "{name}");
                assert!(
                    a.contains(&overlap),
                    "{name}: overlap {overlap:?} outside {a:?}"
                );
            }
            other => panic!("{name}: double free of {a:?} gave {other:?}"),
        }
        t.free_ok(b);
        t.free_not_allocated(b);
        t.free_not_allocated(a);
    });
}

#[test]
fn double_free_of_part_of_an_extent_is_refused() {
    each(CAP, |t| {
        let name = t.name();
        let a = t.alloc_ok(10, None);
        let part = ext(a.start() + 2, 3);
        t.free_ok(part);
        // The freed part again, while the rest of `a` is still allocated.
        match t.free(part) {
            Err(FreeError::NotAllocated { extent, overlap }) => {
                assert_eq!((extent, overlap), (part, part), "{name}");
            }
            other => panic!("{name}: second free of {part:?} gave {other:?}"),
        }
        // The whole of `a` now contains free blocks.
        t.free_not_allocated(a);
        // A part of the freed part.
        t.free_not_allocated(ext(a.start() + 3, 1));
        t.free_ok(span(a.start(), a.start() + 2));
        t.free_ok(span(a.start() + 5, a.end()));
        // Whole extent freed in pieces: freeing part of it again fails.
        t.free_not_allocated(ext(a.start() + 7, 2));
    });
}

#[test]
fn free_of_half_allocated_half_free_extent_is_refused() {
    // Blocks 100..200 allocated, everything else free.
    each_from(CAP, &[span(0, 100), span(200, CAP)], |t| {
        let name = t.name();
        for (e, overlap) in [
            (span(150, 250), span(200, 250)),
            (span(50, 150), span(50, 100)),
            (span(199, 201), span(200, 201)),
            (span(99, 101), span(99, 100)),
        ] {
            match t.free(e) {
                Err(FreeError::NotAllocated { extent, overlap: o }) => {
                    assert_eq!(extent, e, "{name}");
                    assert_eq!(o, overlap, "{name}: the free part of {e:?}");
                }
                other => panic!("{name}: free({e:?}) gave {other:?}"),
            }
        }
        // Spanning the whole allocated range and free space on both sides.
        t.free_not_allocated(span(50, 250));
        t.free_ok(span(100, 200));
    });
}

#[test]
fn free_of_never_allocated_space_is_refused() {
    each(CAP, |t| {
        for e in [span(0, 1), span(CAP - 1, CAP), span(100, 200), span(0, CAP)] {
            t.free_not_allocated(e);
        }
        let a = t.alloc_ok(10, None);
        // Right next to an allocation, on either side (where there is room).
        if a.end() < CAP {
            t.free_not_allocated(ext(a.end(), 1));
        }
        if a.start() > 0 {
            t.free_not_allocated(ext(a.start() - 1, 1));
        }
    });
}

#[test]
fn extent_new_rejects_zero_length_and_overflow() {
    assert_eq!(Extent::new(5, 0), Err(ExtentError::ZeroLength { start: 5 }));
    assert_eq!(
        Extent::new(u64::MAX, 1),
        Err(ExtentError::Overflow {
            start: u64::MAX,
            len: 1
        })
    );
    assert_eq!(
        Extent::new(2, u64::MAX),
        Err(ExtentError::Overflow {
            start: 2,
            len: u64::MAX
        })
    );
    let top = Extent::new(u64::MAX - 1, 1).expect("ends exactly at u64::MAX");
    assert_eq!(top.end(), u64::MAX);
    assert_eq!(Extent::new(0, u64::MAX).map(|e| e.end()), Ok(u64::MAX));
    assert_eq!(
        Extent::from_range(5, 5),
        Err(ExtentError::ZeroLength { start: 5 })
    );
    assert_eq!(
        Extent::from_range(6, 5),
        Err(ExtentError::ZeroLength { start: 6 })
    );
    // Every extent error converts into the umbrella error.
    let e: Error = Extent::new(1, 0).unwrap_err().into();
    assert!(matches!(
        e,
        Error::Extent(ExtentError::ZeroLength { start: 1 })
    ));
}

// ---------------------------------------------------------------------------
// Partial and combined frees.

#[test]
fn free_part_of_an_allocation() {
    each(CAP, |t| {
        let name = t.name();
        let a = t.alloc_ok(100, None);
        let s = a.start();
        t.free_ok(ext(s + 30, 10));
        t.free_ok(ext(s, 30));
        t.free_ok(span(s + 40, s + 99));
        t.free_not_allocated(ext(s + 98, 2));
        t.free_ok(ext(s + 99, 1));
        assert_eq!(t.engine.free_extents(), vec![span(0, CAP)], "{name}");
    });
}

#[test]
fn free_union_of_adjacent_allocations() {
    each(CAP, |t| {
        let name = t.name();
        let mut pieces = t.fill(64);
        pieces.sort();
        // The pieces tile the device, so neighbours in address order touch.
        for w in pieces.windows(2) {
            assert_eq!(w[0].end(), w[1].start(), "{name}: pieces tile the device");
        }
        t.free_ok(span(pieces[3].start(), pieces[4].end()));
        t.free_ok(span(pieces[10].start(), pieces[12].end()));
        // A union across space already freed is refused.
        t.free_not_allocated(span(pieces[2].start(), pieces[5].end()));
        t.free_ok(span(pieces[0].start(), pieces[2].end()));
        t.free_ok(span(pieces[5].start(), pieces[9].end()));
        t.free_ok(span(pieces[13].start(), CAP));
        assert_eq!(t.engine.free_extents(), vec![span(0, CAP)], "{name}");
    });
}

#[test]
fn scattered_is_all_or_nothing() {
    let holes = [span(0, 10), span(20, 30), span(40, 50)];
    each_from(CAP, &holes, |t| {
        let name = t.name();
        // One block short: fails, appends nothing, changes nothing (checked
        // by the harness with a sentinel in `out` and a snapshot).
        assert!(
            matches!(
                t.allocate_scattered(31),
                Err(AllocError::NoSpace { requested: 31, .. })
            ),
            "{name}"
        );
        let mut got = t.scattered_ok(30);
        got.sort();
        assert_eq!(got, holes, "{name}: all the free space");
        assert_no_space(t, 1);
    });
}

// ---------------------------------------------------------------------------
// Rebuilding from free extents.

#[test]
fn from_free_extents_round_trip() {
    for kind in EngineKind::ALL {
        for (cap, seed) in [(3000, 1), (777, 2), (2 * G + 333, 3)] {
            let mut d = Driver::new(kind, cap);
            random_workload(&mut d, seed, 250);
            let free = d.engine().free_extents();
            let status = d.engine().status();
            // Every engine rebuilt from that list holds the same free space.
            for target in EngineKind::ALL {
                let rebuilt = target
                    .from_free_extents(cap, &free)
                    .unwrap_or_else(|e| panic!("{target} from {kind}'s list: {e}"));
                check_state(
                    rebuilt.as_ref(),
                    &d.t.model,
                    &format!("rebuild from {kind}"),
                );
                assert_eq!(rebuilt.free_extents(), free, "{target} rebuilt from {kind}");
                assert_eq!(
                    rebuilt.used(),
                    d.engine().used(),
                    "{target} rebuilt from {kind}"
                );
                assert_eq!(rebuilt.status(), status, "{target} rebuilt from {kind}");
            }
            d.free_all();
        }
    }
}

#[test]
fn from_free_extents_rejects_bad_lists() {
    let a = span(10, 20);
    let b = span(0, 5);
    let c = span(15, 25);
    for kind in EngineKind::ALL {
        let build = |cap: u64, free: &[Extent]| kind.from_free_extents(cap, free).err();
        assert_eq!(
            build(CAP, &[a, b]),
            Some(BuildError::NotSortedOrOverlapping {
                previous: a,
                next: b
            }),
            "{kind}: unsorted"
        );
        assert_eq!(
            build(CAP, &[a, c]),
            Some(BuildError::NotSortedOrOverlapping {
                previous: a,
                next: c
            }),
            "{kind}: overlapping"
        );
        assert_eq!(
            build(CAP, &[a, a]),
            Some(BuildError::NotSortedOrOverlapping {
                previous: a,
                next: a
            }),
            "{kind}: duplicate"
        );
        for e in [
            span(CAP - 5, CAP + 1),
            ext(CAP + 10, 1),
            ext(u64::MAX - 1, 1),
        ] {
            assert_eq!(
                build(CAP, &[b, e]),
                Some(BuildError::OutOfRange {
                    extent: e,
                    capacity: CAP
                }),
                "{kind}: out of range"
            );
        }
        assert_eq!(build(0, &[]), Some(BuildError::ZeroCapacity), "{kind}");
        assert_eq!(build(0, &[b]), Some(BuildError::ZeroCapacity), "{kind}");
        assert_eq!(
            kind.build(0).err(),
            Some(BuildError::ZeroCapacity),
            "{kind}"
        );
        // The boundary cases are fine.
        assert!(
            build(CAP, &[span(0, CAP)]).is_none(),
            "{kind}: whole device"
        );
        assert!(build(CAP, &[]).is_none(), "{kind}: nothing free");
    }
    assert_eq!(
        SegFitAllocator::with_capacity(0).err(),
        Some(BuildError::ZeroCapacity)
    );
    assert_eq!(
        BitmapAllocator::with_capacity(0).err(),
        Some(BuildError::ZeroCapacity)
    );
    assert_eq!(
        GroupsAllocator::with_capacity(0).err(),
        Some(BuildError::ZeroCapacity)
    );
    assert_eq!(
        PoolAllocator::with_capacity(0).err(),
        Some(BuildError::ZeroCapacity)
    );
}

#[test]
fn from_free_extents_merges_adjacent_extents() {
    let input = [span(0, 10), span(10, 20), span(20, 25), span(30, 40)];
    each_from(CAP, &input, |t| {
        let name = t.name();
        assert_eq!(
            t.engine.free_extents(),
            vec![span(0, 25), span(30, 40)],
            "{name}"
        );
        assert_eq!(t.engine.status().free_extents, 2, "{name}");
        // The merged run serves a request longer than any input extent.
        assert_eq!(t.alloc_ok(25, None), span(0, 25), "{name}");
    });
    // Nothing free: a full device.
    each_from(CAP, &[], |t| {
        assert_eq!(t.engine.used(), CAP, "{}", t.name());
        assert_no_space(t, 1);
        t.free_ok(span(0, CAP));
    });
}

#[test]
fn concrete_constructors_match_engine_kind() {
    let free = [span(3, 9), span(100, 200), span(CAP - 1, CAP)];
    let engines: [Box<dyn Allocator>; 4] = [
        Box::new(SegFitAllocator::from_free_extents(CAP, &free).unwrap()),
        Box::new(BitmapAllocator::from_free_extents(CAP, &free).unwrap()),
        Box::new(GroupsAllocator::from_free_extents(CAP, &free).unwrap()),
        Box::new(PoolAllocator::from_free_extents(CAP, &free).unwrap()),
    ];
    let model = Model::from_free(CAP, &free);
    for (a, kind) in engines.iter().zip(EngineKind::ALL) {
        assert_eq!(a.name(), kind.name());
        check_state(a.as_ref(), &model, "from_free_extents");
    }
    let fresh: [Box<dyn Allocator>; 4] = [
        Box::new(SegFitAllocator::with_capacity(CAP).unwrap()),
        Box::new(BitmapAllocator::with_capacity(CAP).unwrap()),
        Box::new(GroupsAllocator::with_capacity(CAP).unwrap()),
        Box::new(PoolAllocator::with_capacity(CAP).unwrap()),
    ];
    for a in &fresh {
        check_state(a.as_ref(), &Model::new(CAP), "with_capacity");
    }
}

// ---------------------------------------------------------------------------
// Status.

#[test]
fn status_counts_runs_and_scores_fragmentation() {
    let cap = 4000;
    let free = [span(0, 1), span(10, 522), span(1000, 3048)];
    each_from(cap, &free, |t| {
        let name = t.name();
        let st = t.engine.status();
        assert_eq!(st.capacity_blocks, cap, "{name}");
        assert_eq!(st.free_blocks, 1 + 512 + 2048, "{name}");
        assert_eq!(st.used_blocks, cap - 2561, "{name}");
        assert_eq!(st.free_extents, 3, "{name}");
        assert_eq!(st.largest_free_extent, 2048, "{name}");
        // 1 − Σ len·min(len, R) / (R · Σ len), by hand.
        let r = FRAGMENTATION_REFERENCE_BLOCKS as f64;
        let want = 1.0 - (1.0 + 512.0 * 512.0 + 2048.0 * r) / (r * 2561.0);
        assert!((st.fragmentation - want).abs() < 1e-12, "{name}: {st:?}");
        assert!((st.utilization() - 1439.0 / 4000.0).abs() < 1e-12, "{name}");
    });
    // Full device: nothing free, nothing fragmented.
    each_from(cap, &[], |t| {
        let st = t.engine.status();
        assert_eq!(
            (st.free_blocks, st.free_extents, st.largest_free_extent),
            (0, 0, 0),
            "{}",
            t.name()
        );
        assert_eq!(st.fragmentation, 0.0);
        assert_eq!(st.utilization(), 1.0);
    });
    // One long run: no fragmentation. Single blocks: almost total.
    each(cap, |t| {
        assert_eq!(t.engine.status().fragmentation, 0.0, "{}", t.name())
    });
    let singles: Vec<Extent> = (0..50).map(|i| ext(2 * i, 1)).collect();
    each_from(100, &singles, |t| {
        let st = t.engine.status();
        assert_eq!(st.free_extents, 50, "{}", t.name());
        assert!(
            (st.fragmentation - (1.0 - 1.0 / 1024.0)).abs() < 1e-12,
            "{st:?}"
        );
    });
    assert_eq!(fragmentation_score([512u64, 512]), 0.5);
}

#[test]
fn status_invariants_hold_on_random_workloads() {
    // `Checked` compares status() with the model after every step.
    for kind in EngineKind::ALL {
        for (cap, seed) in [(100, 11), (1000, 12), (5000, 13), (G + 4321, 14)] {
            let mut d = Driver::new(kind, cap);
            random_workload(&mut d, seed, 400);
            d.free_all();
        }
    }
}

#[test]
fn random_workload_with_many_free_extents() {
    // 5000 free runs of two blocks: segfit's address tree is three levels
    // deep, and every engine's free map is long.
    let cap = 20_000;
    let free: Vec<Extent> = (0..cap / 4).map(|i| ext(4 * i + 1, 2)).collect();
    for kind in EngineKind::ALL {
        let mut d = Driver::from_free(kind, cap, &free);
        random_workload(&mut d, 51, 600);
        d.free_all_quick();
    }
}

#[test]
fn engine_kinds_parse_and_build() {
    assert_eq!(
        EngineKind::names(),
        vec!["segfit", "bitmap", "groups", "pool"]
    );
    assert_eq!(EngineKind::default(), EngineKind::SegFit);
    for kind in EngineKind::ALL {
        assert_eq!(kind.to_string(), kind.name());
        assert_eq!(kind.name().parse::<EngineKind>().unwrap(), kind);
        assert_eq!(
            format!(" {} ", kind.name().to_uppercase())
                .parse::<EngineKind>()
                .unwrap(),
            kind
        );
    }
    assert_eq!(
        "buddy".parse::<EngineKind>(),
        Err(Error::UnknownEngine {
            name: "buddy".into(),
            known: EngineKind::names()
        })
    );
    for_each_engine(CAP, |kind, a| {
        assert_eq!(a.capacity(), CAP, "{kind}");
        assert_eq!(a.used(), 0, "{kind}");
        assert!(a.memory_bytes() > 0, "{kind}");
        a.verify().unwrap_or_else(|e| panic!("{kind}: {e}"));
    });
}

// ---------------------------------------------------------------------------
// segfit

#[test]
fn segfit_hinted_streams_are_adjacent() {
    let mut t = Checked::new(EngineKind::SegFit, 100_000);
    let mut r = rng(21);
    let mut ends = [0u64, 50_000];
    for i in 0..200 {
        let s = i % 2;
        let len = r.random_range(1..=300);
        let e = t.alloc_ok(len, Some(ends[s]));
        assert_eq!(
            e.start(),
            ends[s],
            "segfit: stream {s} must continue at its end"
        );
        ends[s] = e.end();
    }
}

#[test]
fn segfit_same_hint_lands_next_to_the_previous_extent() {
    let mut t = Checked::new(EngineKind::SegFit, 10_000);
    let h = 1000;
    let mut next = h;
    for _ in 0..20 {
        let e = t.alloc_ok(8, Some(h));
        assert_eq!(e, ext(next, 8), "segfit: same hint {h}");
        next = e.end();
    }
    // Free space before the hint is not used while there is room after it.
    assert_eq!(t.alloc_ok(5, Some(h + 3)).start(), next);
}

#[test]
fn segfit_hint_skips_free_extents_that_are_too_short() {
    let free = [
        span(100, 105),
        span(200, 203),
        span(300, 400),
        span(500, 1000),
    ];
    let mut t = Checked::from_free(EngineKind::SegFit, 1000, &free);
    // [101, 111) does not fit, nor does [200, 203): the next that fits.
    assert_eq!(t.alloc_ok(10, Some(101)), span(300, 310));
    // Fits at the hint exactly, inside a free extent.
    assert_eq!(t.alloc_ok(3, Some(101)), span(101, 104));
    // Not at 104 (105 is allocated): the next free extent, from its start.
    assert_eq!(t.alloc_ok(3, Some(104)), span(200, 203));
    // A hint in allocated space: the next free extent after it.
    assert_eq!(t.alloc_ok(5, Some(250)), span(310, 315));
}

#[test]
fn segfit_hint_at_device_end_falls_back_to_a_plain_allocation() {
    let mut t = Checked::from_free(EngineKind::SegFit, 1000, &[span(0, 50), span(500, 1000)]);
    assert_eq!(t.alloc_ok(50, Some(1000)), span(0, 50));
    assert_eq!(t.alloc_ok(10, Some(1000)), span(500, 510));
}

#[test]
fn segfit_takes_the_shortest_fit_at_the_lowest_address() {
    // A device this small is served by plain best fit.
    let free = [
        span(0, 50),
        span(100, 120),
        span(200, 230),
        span(300, 1000),
        span(1100, 1120),
    ];
    let mut t = Checked::from_free(EngineKind::SegFit, 2000, &free);
    assert_eq!(t.alloc_ok(25, None), span(200, 225));
    assert_eq!(t.alloc_ok(20, None), span(100, 120));
    assert_eq!(t.alloc_ok(20, None), span(1100, 1120));
    assert_eq!(t.alloc_ok(5, None), span(225, 230));
    assert_eq!(t.alloc_ok(5, None), span(0, 5));
    assert_eq!(t.alloc_ok(700, None), span(300, 1000));
}

#[test]
fn segfit_keeps_a_fragment_whole_only_while_fragments_are_few() {
    // 2^21 blocks: fragments up to 2048 - 1024 free blocks may wait.
    let cap = 1 << 21;
    let free = [span(0, 10), span(200, cap)];
    let mut t = Checked::from_free(EngineKind::SegFit, cap, &free);
    assert_eq!(t.alloc_ok(5, None), span(200, 205));
    assert_eq!(t.alloc_ok(10, None), span(0, 10));
    // 1100 blocks in fragments: over the bound, so best fit.
    let mut free: Vec<Extent> = (0..110).map(|i| span(i * 20, i * 20 + 10)).collect();
    free.push(span(5000, cap));
    let mut t = Checked::from_free(EngineKind::SegFit, cap, &free);
    assert_eq!(t.alloc_ok(5, None), span(0, 5));
    // On a device of 2^20 blocks or fewer the bound admits no fragment.
    let mut t = Checked::from_free(
        EngineKind::SegFit,
        1 << 20,
        &[span(0, 10), span(200, 1 << 20)],
    );
    assert_eq!(t.alloc_ok(5, None), span(0, 5));
}

#[test]
fn segfit_merges_free_neighbours_immediately() {
    let cap = 20_000;
    let mut a = SegFitAllocator::with_capacity(cap).unwrap();
    let mut m = Model::new(cap);
    let mut r = rng(31);
    let mut live = Vec::new();
    while let Ok(e) = a.allocate(r.random_range(1..=200), None) {
        m.take(e);
        live.push(e);
    }
    check_state(&a, &m, "fill");
    live.shuffle(&mut r);
    for (i, e) in live.into_iter().enumerate() {
        a.free(e).unwrap();
        m.give(e);
        // Internal extents are maximal runs: no fragment waits for a merge.
        assert_eq!(
            a.free_extent_count(),
            m.run_count() as u64,
            "segfit: after {i} frees"
        );
        check_state(&a, &m, "free");
    }
    assert_eq!(a.free_extent_count(), 1);
    assert_eq!(a.free_extents(), vec![span(0, cap)]);
}

#[test]
fn segfit_scattered_fails_only_when_free_space_is_short() {
    // Free runs of 3 blocks with one allocated block between them.
    let cap = 4000;
    let free: Vec<Extent> = (0..cap / 4).map(|i| ext(4 * i, 3)).collect();
    let total = 3 * (cap / 4);
    let mut t = Checked::from_free(EngineKind::SegFit, cap, &free);
    assert_eq!(
        t.allocate_scattered(total + 1),
        Err(AllocError::NoSpace {
            requested: total + 1,
            free: total,
            largest_free: 3
        })
    );
    let got = t.scattered_ok(total);
    assert_eq!(got.len(), free.len(), "segfit: one piece per free run");
}

#[test]
fn segfit_scattered_uses_fewest_extents() {
    let free = [span(0, 100), span(200, 250), span(300, 310)];
    let case = |len: u64| {
        let mut t = Checked::from_free(EngineKind::SegFit, 1000, &free);
        t.scattered_ok(len)
    };
    // One extent whenever one fits: an exact fit, else an unrequested size.
    assert_eq!(case(100), vec![span(0, 100)]);
    assert_eq!(case(40), vec![span(200, 240)]);
    assert_eq!(case(10), vec![span(300, 310)]);
    // Otherwise the largest extents whole, then one cut for the rest.
    assert_eq!(case(150), vec![span(0, 100), span(200, 250)]);
    assert_eq!(
        case(155),
        vec![span(0, 100), span(200, 250), span(300, 305)]
    );
    assert_eq!(case(110), vec![span(0, 100), span(300, 310)]);
}

#[test]
fn segfit_no_space_reports_free_blocks_and_largest_extent() {
    let mut t = Checked::from_free(EngineKind::SegFit, 100, &[span(0, 5), span(10, 13)]);
    assert_eq!(
        t.allocate(6, None),
        Err(AllocError::NoSpace {
            requested: 6,
            free: 8,
            largest_free: 5
        })
    );
}

#[test]
fn segfit_handles_huge_capacities() {
    for cap in [1u64 << 40, u64::MAX - 1, u64::MAX] {
        let mut t = Checked::new(EngineKind::SegFit, cap);
        let big = t.alloc_ok(1 << 30, None);
        assert_eq!(big, ext(0, 1 << 30));
        let tail = t.alloc_ok(5, Some(cap - 5));
        assert_eq!(tail, span(cap - 5, cap));
        t.free_not_allocated(span(cap - 6, cap));
        t.free_ok(ext(cap - 1, 1));
        t.free_not_allocated(ext(cap - 1, 1));
        let mid = t.alloc_ok(7, Some(cap / 2));
        assert_eq!(mid, ext(cap / 2, 7));
        t.free_ok(big);
        t.free_ok(mid);
        t.free_ok(span(cap - 5, cap - 1));
        assert_eq!(t.engine.free_extents(), vec![span(0, cap)]);
    }
}

// ---------------------------------------------------------------------------
// bitmap

#[test]
fn bitmap_allocates_first_fit() {
    let free = [span(10, 15), span(20, 40), span(50, 1000)];
    let mut t = Checked::from_free(EngineKind::Bitmap, 1000, &free);
    assert_eq!(t.alloc_ok(5, None), span(10, 15));
    assert_eq!(t.alloc_ok(6, None), span(20, 26));
    assert_eq!(t.alloc_ok(15, None), span(50, 65));
    assert_eq!(t.alloc_ok(14, None), span(26, 40));
    t.free_ok(span(10, 12));
    assert_eq!(t.alloc_ok(1, Some(900)), span(10, 11));
}

#[test]
fn bitmap_scattered_takes_free_runs_in_address_order() {
    let free = [span(0, 3), span(10, 20), span(30, 1000)];
    let mut t = Checked::from_free(EngineKind::Bitmap, 1000, &free);
    assert_eq!(
        t.scattered_ok(15),
        vec![span(0, 3), span(10, 20), span(30, 32)]
    );
}

#[test]
fn seed_engines_ignore_hints() {
    for kind in [EngineKind::Bitmap, EngineKind::Groups, EngineKind::Pool] {
        for cap in [1000, 5000, 2 * G + 5] {
            let mut plain = Checked::new(kind, cap);
            let mut hinted = Checked::new(kind, cap);
            let mut r = rng(41);
            let mut live = Vec::new();
            for step in 0..300 {
                if live.is_empty() || r.random_bool(0.6) {
                    let len = r.random_range(1..=cap / 20);
                    let hint = r.random_range(0..=cap);
                    let a = plain.allocate(len, None);
                    let b = hinted.allocate(len, Some(hint));
                    assert_eq!(a, b, "{kind}: step {step}: hint {hint} changed the result");
                    if let Ok(e) = a {
                        live.push(e);
                    }
                } else {
                    let e = live.swap_remove(r.random_range(0..live.len()));
                    plain.free_ok(e);
                    hinted.free_ok(e);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// groups

#[test]
fn groups_picks_the_emptiest_group() {
    let cap = 3 * G + 17;
    let mut t = Checked::new(EngineKind::Groups, cap);
    assert_eq!(t.alloc_ok(100, None), ext(0, 100));
    assert_eq!(t.alloc_ok(100, None), ext(G, 100));
    assert_eq!(t.alloc_ok(100, None), ext(2 * G, 100));
    // Groups 0..3 are equally full now: the leftmost wins.
    assert_eq!(t.alloc_ok(50, None), ext(100, 50));
    assert_eq!(t.alloc_ok(50, None), ext(G + 100, 50));
    // Freeing makes group 0 the emptiest again.
    t.free_ok(ext(0, 100));
    assert_eq!(t.alloc_ok(10, None), ext(0, 10));
    let mut out = t.scattered_ok(80);
    out.sort();
    assert_eq!(
        out,
        vec![ext(10, 80)],
        "groups: scattered goes to the emptiest group"
    );
}

#[test]
fn groups_falls_back_to_other_groups_when_the_emptiest_is_fragmented() {
    // Group 0 has the most free blocks, but only in runs of 10.
    let mut free: Vec<Extent> = (0..200).map(|i| ext(20 * i, 10)).collect();
    free.push(span(2 * G - 1500, 2 * G));
    let mut t = Checked::from_free(EngineKind::Groups, 2 * G, &free);
    assert_eq!(t.alloc_ok(11, None), ext(2 * G - 1500, 11));
    assert_no_space(&mut t, 1500);
}

#[test]
fn groups_scattered_fails_when_no_single_group_holds_the_request() {
    let free = [span(G - 100, G), span(2 * G - 100, 2 * G)];
    let mut t = Checked::from_free(EngineKind::Groups, 2 * G, &free);
    assert!(matches!(
        t.allocate_scattered(150),
        Err(AllocError::NoSpace { requested: 150, .. })
    ));
    assert_eq!(t.scattered_ok(100), vec![span(G - 100, G)]);
    assert_eq!(t.scattered_ok(100), vec![span(2 * G - 100, 2 * G)]);
}

#[test]
fn groups_contiguous_allocation_stays_inside_a_group() {
    // A 100-block run straddles the group boundary.
    let mut t = Checked::from_free(EngineKind::Groups, 2 * G, &[span(G - 50, G + 50)]);
    assert_no_space(&mut t, 100);
    assert_eq!(t.alloc_ok(50, None), span(G - 50, G));
    assert_eq!(t.alloc_ok(50, None), span(G, G + 50));
}

#[test]
fn groups_allocates_extents_longer_than_a_group() {
    let cap = 3 * G + 17;
    let mut t = Checked::new(EngineKind::Groups, cap);
    assert_eq!(t.alloc_ok(G + 1, None), ext(0, G + 1));
    assert_eq!(t.alloc_ok(2 * G, None), ext(G + 1, 2 * G));
    assert_no_space(&mut t, G + 1);
    assert_eq!(t.scattered_ok(16), vec![span(3 * G + 1, cap)]);
    t.free_ok(span(0, 3 * G + 1));
    // Longer than a group: gathered from the emptiest groups in turn.
    let got = t.scattered_ok(2 * G + 10);
    assert_eq!(got, vec![span(0, G), span(G, 2 * G), ext(2 * G, 10)]);
}

// ---------------------------------------------------------------------------
// pool

#[test]
fn pool_compact_merges_fragments_and_unblocks_allocation() {
    let cap = 2000;
    let mut p = PoolAllocator::with_capacity(cap).unwrap();
    let mut m = Model::new(cap);
    let mut pieces = Vec::new();
    for _ in 0..4 {
        let e = p.allocate(10, None).unwrap();
        m.take(e);
        pieces.push(e);
    }
    // The rest of the large-bin extent, so that no large bin is left.
    let rest = p.allocate(cap - 40, None).unwrap();
    m.take(rest);
    for e in &pieces {
        p.free(*e).unwrap();
        m.give(*e);
    }
    check_state(&p, &m, "four adjacent fragments freed");
    assert_eq!(p.fragments(), 4);
    // 40 free blocks in one run, but as four 10-block fragments.
    assert_eq!(p.free_extents(), vec![span(0, 40)]);
    assert!(matches!(
        p.allocate(40, None),
        Err(AllocError::NoSpace { requested: 40, .. })
    ));
    check_state(&p, &m, "failed allocation");
    assert_eq!(
        p.compact(),
        CompactStats {
            fragments_before: 4,
            fragments_after: 1
        }
    );
    check_state(&p, &m, "compact");
    assert_eq!(p.fragments(), 1);
    assert_eq!(p.allocate(40, None), Ok(span(0, 40)));
    // Compacting nothing is a no-op.
    assert_eq!(
        p.compact(),
        CompactStats {
            fragments_before: 0,
            fragments_after: 0
        }
    );
    p.verify().unwrap();
}

#[test]
fn pool_never_splits_fast_bin_fragments() {
    // A fresh device is never-split space: any size is cut from it.
    let mut t = Checked::new(EngineKind::Pool, 100);
    let a = t.alloc_ok(10, None);
    assert_eq!(a, span(0, 10));
    assert_eq!(t.alloc_ok(90, None), span(10, 100));
    // A freed 10-block fragment serves only 10-block requests.
    t.free_ok(a);
    assert_no_space(&mut t, 1);
    // A scattered request does split it.
    assert_eq!(t.scattered_ok(1), vec![span(0, 1)]);
    assert_eq!(t.alloc_ok(9, None), span(1, 10));
    // Freed neighbours stay separate fragments: a 2-block request fails
    // although blocks 0 and 1 are free and adjacent.
    t.free_ok(span(0, 1));
    t.free_ok(span(1, 2));
    assert_eq!(t.engine.free_extents(), vec![span(0, 2)]);
    assert_no_space(&mut t, 2);
}

#[test]
fn pool_reuses_exact_size_fragments_last_in_first_out() {
    let mut t = Checked::new(EngineKind::Pool, 2000);
    let a = t.alloc_ok(7, None);
    let _b = t.alloc_ok(7, None);
    let c = t.alloc_ok(7, None);
    t.free_ok(a);
    t.free_ok(c);
    assert_eq!(t.alloc_ok(7, None), c);
    assert_eq!(t.alloc_ok(7, None), a);
}

#[test]
fn pool_scattered_fails_only_when_free_space_is_short() {
    let cap = 4000;
    let free: Vec<Extent> = (0..cap / 4).map(|i| ext(4 * i, 3)).collect();
    let total = 3 * (cap / 4);
    let mut t = Checked::from_free(EngineKind::Pool, cap, &free);
    assert_no_space(&mut t, 4);
    assert!(matches!(
        t.allocate_scattered(total + 1),
        Err(AllocError::NoSpace { .. })
    ));
    let got = t.scattered_ok(total);
    assert_eq!(got.iter().map(|e| e.len()).sum::<u64>(), total);
}

#[test]
fn pool_reports_maximal_runs_without_compaction() {
    let cap = 2000;
    let mut p = PoolAllocator::with_capacity(cap).unwrap();
    let xs: Vec<Extent> = (0..3).map(|_| p.allocate(10, None).unwrap()).collect();
    for e in xs {
        p.free(e).unwrap();
    }
    assert_eq!(
        p.fragments(),
        4,
        "three freed pieces and the large-bin rest"
    );
    check_state(&p, &Model::new(cap), "freed, not compacted");
    assert_eq!(p.status().free_extents, 1);
    p.compact();
    assert_eq!(p.fragments(), 1);
    check_state(&p, &Model::new(cap), "compacted");
}

// ---------------------------------------------------------------------------
// Engine bugs: one regression test each, named after the bug.

/// For `n > 1024`, segfit looks at only the first `CLASS_SCAN` (8) extents
/// of the request's own size class and then at the next class up. When the
/// only fitting extents sit deeper in that class list and no larger class
/// is populated, `allocate` fails with `NoSpace` although a free extent of
/// `n` blocks exists (the docs say it "fails only when no free extent holds
/// `n` blocks"); the error even reports `largest_free >= requested`.
#[test]
fn segfit_allocate_misses_fitting_extent_beyond_class_scan() {
    let len = 1100;
    // One extent of exactly `len` blocks, then eight of `len - 1` (same
    // class, linked in front of it); one allocated block between each.
    let mut free = vec![ext(0, len)];
    let mut pos = len + 1;
    for _ in 0..8 {
        free.push(ext(pos, len - 1));
        pos += len;
    }
    let cap = pos + 10;
    let mut a = SegFitAllocator::from_free_extents(cap, &free).unwrap();
    let res = a.allocate(len, None);
    a.verify().unwrap();
    assert_eq!(
        res,
        Ok(ext(0, len)),
        "segfit: the only extent of {len} blocks"
    );
}

/// segfit's address tree splits a full rightmost leaf at the right edge by
/// handing just the new key to a new leaf ("so that bulk loads fill leaves
/// completely"), but its own check demands at least MIN (16) keys in every
/// non-root leaf. Any 65th free extent above all others (a bulk load by
/// `from_free_extents`, or frees in ascending address order) leaves a leaf
/// of one key, and `verify()` reports a broken invariant on a legitimate
/// state. The harness tolerates this one message (see `known_verify_bug`).
#[test]
fn segfit_btree_append_split_leaves_underfull_leaf() {
    let free: Vec<Extent> = (0..65).map(|i| ext(2 * i, 1)).collect();
    let a = SegFitAllocator::from_free_extents(130, &free).unwrap();
    assert_eq!(a.verify(), Ok(()), "segfit: rebuilt from 65 free extents");
    let mut a = SegFitAllocator::from_free_extents(130, &[]).unwrap();
    for (i, e) in free.iter().enumerate() {
        a.free(*e).unwrap();
        assert_eq!(
            a.verify(),
            Ok(()),
            "segfit: after {} ascending frees",
            i + 1
        );
    }
}

/// `allocate_near` looks up `hint + 1`, which overflows when the device has
/// `u64::MAX` blocks and the hint is the device end (a hint the contract
/// allows): a panic in debug builds.
#[test]
fn segfit_hint_at_capacity_overflows_when_capacity_is_u64_max() {
    let mut a = SegFitAllocator::with_capacity(u64::MAX).unwrap();
    assert_eq!(a.allocate(1, Some(u64::MAX)), Ok(ext(0, 1)));
    a.verify().unwrap();
}

/// The bitmap-based engines size a bitmap from the capacity without a
/// limit: a capacity they cannot address aborts the process on a failed
/// allocation instead of returning `BuildError::CapacityTooLarge` (which no
/// engine ever returns). The check runs in a child process, since an abort
/// cannot be caught.
#[test]
fn bitmap_engines_refuse_huge_capacity_with_a_typed_error() {
    const CHILD: &str = "BLOCKALLOC_TEST_HUGE_CAPACITY_ENGINE";
    if let Ok(name) = std::env::var(CHILD) {
        let kind: EngineKind = name.parse().unwrap();
        match kind.build(u64::MAX) {
            Err(BuildError::CapacityTooLarge { capacity, .. }) => assert_eq!(capacity, u64::MAX),
            Err(BuildError::OutOfMemory { engine, bytes }) => {
                assert_eq!(engine, kind.name());
                assert_eq!(bytes, u64::MAX.div_ceil(8));
            }
            other => panic!("{kind}: build(u64::MAX) gave {:?}", other.map(|_| ())),
        }
        return;
    }
    for kind in [EngineKind::Bitmap, EngineKind::Groups, EngineKind::Pool] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "bitmap_engines_refuse_huge_capacity_with_a_typed_error",
                "--test-threads=1",
            ])
            .env(CHILD, kind.name())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{kind}: build(u64::MAX) must return a typed error; the child exited with {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
