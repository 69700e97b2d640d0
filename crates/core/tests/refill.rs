//! `SegFitAllocator::set_refill_blocks`: an engine over part of a device
//! (an arena, a lease) that its owner can add long runs to.

use std::collections::BTreeMap;

use blockalloc::{AllocError, Allocator, Extent, FromFreeExtents, SegFitAllocator};
use proptest::prelude::*;

/// A 64 GiB device (at 4 KiB blocks): fragments of up to 16 384 - 1024
/// free blocks may wait for their exact requests.
const CAP: u64 = 1 << 24;

/// Ten free holes of 100 blocks, 1000 blocks apart, and nothing longer:
/// a lease whose long run is used up.
fn holes() -> SegFitAllocator {
    let free: Vec<Extent> = (0..10)
        .map(|i| Extent::new(i * 1000, 100).unwrap())
        .collect();
    SegFitAllocator::from_free_extents(CAP, &free).unwrap()
}

/// Five of the holes taken by exact requests: the other five are few
/// enough to wait whole, so a shorter request with no exact fit reaches the
/// policy's choice between cutting a fragment and cutting a long run.
fn in_demand() -> SegFitAllocator {
    let mut a = holes();
    for _ in 0..5 {
        assert_eq!(a.allocate(100, None).unwrap().len(), 100);
    }
    a
}

#[test]
fn without_refill_a_request_with_no_long_run_cuts_a_fragment() {
    let mut a = in_demand();
    let e = a.allocate(60, None).unwrap();
    assert_eq!(e.start() % 1000, 0, "cut from one of the holes: {e}");
    a.verify().unwrap();
}

#[test]
fn with_refill_the_engine_asks_for_a_run_and_keeps_its_fragments() {
    let mut a = in_demand();
    a.set_refill_blocks(SegFitAllocator::MIN_REFILL);
    let used = a.used();
    let before = a.free_extents();
    match a.allocate(60, None) {
        Err(AllocError::NoSpace { largest_free, .. }) => assert_eq!(largest_free, 100),
        r => panic!("expected a refusal that asks for a run, got {r:?}"),
    }
    // The refusal changed nothing.
    assert_eq!(a.used(), used);
    assert_eq!(a.free_extents(), before);
    a.verify().unwrap();
    // The owner adds a run; the request is cut from it, and the five
    // holes stay whole for their exact requests.
    let run = Extent::new(500_000, 8192).unwrap();
    a.free(run).unwrap();
    let e = a.allocate(60, None).unwrap();
    assert_eq!(e.start(), run.start());
    for _ in 0..5 {
        let x = a.allocate(100, None).unwrap();
        assert_eq!(x.start() % 1000, 0, "an exact fit: {x}");
    }
    a.verify().unwrap();
}

#[test]
fn a_refill_below_the_minimum_counts_for_nothing() {
    let mut a = in_demand();
    a.set_refill_blocks(SegFitAllocator::MIN_REFILL - 1);
    assert!(a.allocate(60, None).is_ok());
}

#[test]
fn scattered_and_long_requests_never_wait_for_a_refill() {
    let mut a = in_demand();
    a.set_refill_blocks(1 << 30);
    let mut out = Vec::new();
    a.allocate_scattered(60, &mut out).unwrap();
    assert_eq!(out.iter().map(|e| e.len()).sum::<u64>(), 60);
    // Longer than any exact class: the policy has no fragment to keep.
    let mut b = SegFitAllocator::from_free_extents(CAP, &[Extent::new(0, 5000).unwrap()]).unwrap();
    b.set_refill_blocks(1 << 30);
    assert_eq!(b.allocate(2000, None).unwrap().len(), 2000);
    a.verify().unwrap();
    b.verify().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(u64),
    Free(usize),
    Refill(u64),
    AddRun(u64),
}

/// A few sizes, so that free extents of a size are also asked for.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![Just(50u64), Just(100), Just(200), Just(400), Just(1000)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![4 => size(), 1 => 1..=3000u64].prop_map(Op::Allocate),
        4 => any::<usize>().prop_map(Op::Free),
        1 => prop_oneof![Just(0u64), Just(SegFitAllocator::MIN_REFILL), 0..20_000u64]
            .prop_map(Op::Refill),
        1 => (1..=20_000u64).prop_map(Op::AddRun),
    ]
}

proptest! {
    /// With refills switched on and off and runs added as an owner would,
    /// the engine matches a model of who holds what: allocations lie in
    /// free space and never overlap, a refusal changes nothing, and a
    /// request that finds no room while a fitting extent exists is one the
    /// policy declined for want of a long run (an exact-class request with
    /// no exact fit, a refill of at least the minimum and more than the
    /// fragments, no free extent of more than 1024 blocks, and fragments
    /// few enough to wait).
    #[test]
    fn refill_keeps_the_engine_exact(
        holes in proptest::collection::vec(prop_oneof![4 => size(), 1 => 1..=3000u64], 1..60),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        // The engine starts with holes 4000 blocks apart, as a lease with
        // recycled frees; `free` is the model of its free runs, by start.
        let start: Vec<Extent> = holes
            .iter()
            .enumerate()
            .map(|(i, &l)| Extent::new(i as u64 * 4000, l).unwrap())
            .collect();
        let mut a = SegFitAllocator::from_free_extents(CAP, &start).unwrap();
        let mut free: BTreeMap<u64, u64> = start.iter().map(|e| (e.start(), e.len())).collect();
        let mut live: Vec<Extent> = Vec::new();
        let mut next_run = 500_000u64;
        for o in ops {
            match o {
                Op::Allocate(n) => match a.allocate(n, None) {
                    Ok(e) => {
                        prop_assert_eq!(e.len(), n);
                        let (&s, &l) = free.range(..=e.start()).next_back().expect("in free space");
                        prop_assert!(e.end() <= s + l, "{} outside free run {}+{}", e, s, l);
                        free.remove(&s);
                        if e.start() > s { free.insert(s, e.start() - s); }
                        if s + l > e.end() { free.insert(e.end(), s + l - e.end()); }
                        live.push(e);
                    }
                    Err(AllocError::NoSpace { largest_free, .. }) => {
                        let longest = free.values().copied().max().unwrap_or(0);
                        prop_assert_eq!(largest_free, longest);
                        if longest >= n {
                            prop_assert!(n <= 1024 && a.refill_blocks() >= SegFitAllocator::MIN_REFILL);
                            prop_assert!(!free.values().any(|&l| l > 1024 || l == n));
                            let fragments: u64 = free.values().sum();
                            prop_assert!(fragments + 1024 <= CAP >> 10);
                            prop_assert!(a.refill_blocks() > fragments);
                        }
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                },
                Op::Free(pick) if !live.is_empty() => {
                    let e = live.swap_remove(pick % live.len());
                    a.free(e).unwrap();
                    free.insert(e.start(), e.len());
                }
                Op::Free(_) => {}
                Op::Refill(r) => a.set_refill_blocks(r),
                Op::AddRun(n) => {
                    let e = Extent::new(next_run, n).unwrap();
                    next_run += n + 1;
                    a.free(e).unwrap();
                    free.insert(e.start(), e.len());
                }
            }
            // Merge touching model runs, as the engine does.
            let runs: Vec<(u64, u64)> = free.iter().map(|(&s, &l)| (s, l)).collect();
            free.clear();
            for (s, l) in runs {
                match free.iter_mut().next_back() {
                    Some((&ps, pl)) if ps + *pl == s => *pl += l,
                    _ => { free.insert(s, l); }
                }
            }
            a.verify().unwrap();
            let engine: Vec<(u64, u64)> = a.free_extents().iter().map(|e| (e.start(), e.len())).collect();
            let model: Vec<(u64, u64)> = free.iter().map(|(&s, &l)| (s, l)).collect();
            prop_assert_eq!(engine, model);
        }
    }
}
