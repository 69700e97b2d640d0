//! What each engine's documentation promises beyond the shared contract,
//! checked against the model state before the call.
//!
//! The shared contract (exact length, only free blocks handed out, typed
//! errors, nothing changes on `Err`) is checked by the harness for every
//! engine; these functions add the placement policies: segfit's hints,
//! exact fits and front cuts, bitmap's first fit, groups' emptiest group,
//! and which engines may fail a scattered request with enough space free.
//!
//! segfit steers requests without an exact fit by recent demand (a hidden
//! state), so only the parts of its choice that do not depend on demand are
//! checked here; `conformance.rs` checks the demand rule on known histories.

use blockalloc::{AllocError, EngineKind, Extent, GROUP_BLOCKS};

use super::model::{ext, Model};

/// Requests up to this many blocks have an exact size class in segfit
/// (`EXACT` in `segfit/classes.rs`).
pub const SEGFIT_EXACT: u64 = 1024;

/// True when segfit's search is bound to find a single free extent of
/// `len` blocks in `m`: every `len <= 1024` is served whenever a run holds
/// it; above that, any extent of a higher size class fits, and a run twice
/// as long is always in a higher class (a class spans less than 1/16 of its
/// sizes). The docs promise more ("fails only when no free extent holds `n`
/// blocks"), but a fitting run deep in the request's own class is missed:
/// see `segfit_allocate_misses_fitting_extent_beyond_class_scan` in
/// `conformance.rs`.
pub fn segfit_must_find(m: &Model, len: u64) -> bool {
    let largest = m.largest_run();
    largest >= len && (len <= SEGFIT_EXACT || largest >= len.saturating_mul(2))
}

/// Checks `allocate(len, hint)` (a valid request: `len > 0`, hint in range)
/// against the engine's placement policy.
pub fn check_allocate(
    kind: EngineKind,
    before: &Model,
    len: u64,
    hint: Option<u64>,
    res: &Result<Extent, AllocError>,
) {
    match kind {
        EngineKind::SegFit => segfit_allocate(before, len, hint, res),
        EngineKind::Bitmap => {
            // First fit over the whole device; the hint is ignored.
            let want = before
                .first_fit(len, 0, before.capacity())
                .map(|s| ext(s, len));
            assert_eq!(
                res.as_ref().ok(),
                want.as_ref(),
                "bitmap: allocate({len}, {hint:?}) must be the first fit in {:?}",
                before.runs()
            );
        }
        EngineKind::Groups => groups_allocate(before, len, hint, res),
        // The pool's bins are not visible from outside: the shared contract
        // is all it promises for a contiguous allocation.
        _ => {}
    }
}

/// Checks `allocate_scattered(len)` (with `len > 0`) against the engine's
/// documented behaviour. `res` holds the appended extents on success.
pub fn check_scattered(
    kind: EngineKind,
    before: &Model,
    len: u64,
    res: &Result<Vec<Extent>, AllocError>,
) {
    let enough = before.free_blocks() >= len;
    match kind {
        EngineKind::SegFit => segfit_scattered(before, len, res),
        EngineKind::Bitmap => {
            // Free runs in address order until `len` blocks are gathered.
            let want = enough.then(|| greedy(before, 0, before.capacity(), len));
            assert_eq!(
                res.as_ref().ok(),
                want.as_ref(),
                "bitmap: allocate_scattered({len}) must take free runs in address order from {:?}",
                before.runs()
            );
        }
        EngineKind::Groups => {
            let want = groups_scattered_expected(before, len);
            assert_eq!(
                res.as_ref().ok(),
                want.as_ref(),
                "groups: allocate_scattered({len}) with group free counts {:?}",
                (0..before.groups())
                    .map(|g| before.group_free(g))
                    .collect::<Vec<_>>()
            );
        }
        EngineKind::Pool => assert_eq!(
            res.is_ok(),
            enough,
            "pool: allocate_scattered({len}) fails only when fewer blocks are free \
             ({} free): got {res:?}",
            before.free_blocks()
        ),
        _ => {}
    }
}

/// Free runs of `m` inside `[lo, hi)` in address order, cut to `len` blocks
/// in total (the caller knows there are enough).
fn greedy(m: &Model, lo: u64, hi: u64, len: u64) -> Vec<Extent> {
    let mut need = len;
    let mut out = Vec::new();
    for r in m.runs_within(lo, hi) {
        if need == 0 {
            break;
        }
        let take = need.min(r.len());
        out.push(ext(r.start(), take));
        need -= take;
    }
    out
}

fn segfit_allocate(before: &Model, len: u64, hint: Option<u64>, res: &Result<Extent, AllocError>) {
    if let Err(AllocError::NoSpace {
        free, largest_free, ..
    }) = res
    {
        assert!(
            !segfit_must_find(before, len),
            "segfit: allocate({len}, {hint:?}) failed but free runs are {:?}",
            before.runs()
        );
        assert_eq!(
            (*free, *largest_free),
            (before.free_blocks(), before.largest_run()),
            "segfit: NoSpace must report the free blocks and the largest free extent"
        );
    }
    match hint {
        Some(h) => {
            // `[h, h + len)` itself when it is free.
            if let Some(end) = h.checked_add(len) {
                let at = Extent::from_range(h, end).expect("len > 0");
                if end <= before.capacity() && before.is_free(at) {
                    assert_eq!(
                        res.as_ref().ok(),
                        Some(&at),
                        "segfit: allocate({len}, Some({h})) must take the free range at the hint"
                    );
                    return;
                }
            }
            // Otherwise the next free extent after the hint, from its start,
            // when that one fits (the first of the "next few").
            if let Some(r) = before.first_run_starting_after(h) {
                if r.len() >= len {
                    assert_eq!(
                        res.as_ref().ok(),
                        Some(&ext(r.start(), len)),
                        "segfit: allocate({len}, Some({h})) must use the next free extent {r:?}"
                    );
                }
            }
        }
        None => {
            if let Ok(e) = res {
                segfit_check_choice(before, *e, len, "allocate");
            }
        }
    }
}

/// `e` (of `len` blocks) was cut from the front of a free run of `m`, and
/// from a run of exactly `len` blocks when there is one (`len <= 1024`).
fn segfit_check_choice(m: &Model, e: Extent, len: u64, what: &str) {
    let r = m.run_starting_at(e.start()).unwrap_or_else(|| {
        panic!(
            "segfit: {what}({len}) returned {e:?}, not the front of a free extent of {:?}",
            m.runs()
        )
    });
    if len <= SEGFIT_EXACT && m.best_fit_len(len) == Some(len) {
        assert_eq!(
            r.len(),
            len,
            "segfit: {what}({len}) cut {e:?} from {r:?} though an exact fit is free in {:?}",
            m.runs()
        );
    }
}

fn segfit_scattered(before: &Model, len: u64, res: &Result<Vec<Extent>, AllocError>) {
    assert_eq!(
        res.is_ok(),
        before.free_blocks() >= len,
        "segfit: allocate_scattered({len}) fails only when fewer blocks are free ({} free): {res:?}",
        before.free_blocks()
    );
    let Ok(pieces) = res else { return };
    // Replay: while no single extent holds the rest, the head of the largest
    // class goes whole; the rest is cut from the front of one extent.
    let mut sim = before.clone();
    let mut need = len;
    for (i, &p) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        if last {
            assert_eq!(p.len(), need, "segfit: scattered({len}) pieces {pieces:?}");
            segfit_check_choice(&sim, p, need, "allocate_scattered");
        } else {
            assert!(
                !segfit_must_find(&sim, need),
                "segfit: scattered({len}) split into {pieces:?} though one extent of {need} \
                 fits in {:?}",
                sim.runs()
            );
            assert_eq!(
                sim.run_starting_at(p.start()),
                Some(p),
                "segfit: scattered({len}) piece {i} of {pieces:?} is not a whole free extent"
            );
            if sim.largest_run() <= SEGFIT_EXACT {
                assert_eq!(
                    p.len(),
                    sim.largest_run(),
                    "segfit: scattered({len}) must take the largest extents whole: {pieces:?}"
                );
            }
            need -= p.len();
        }
        sim.take(p);
    }
}

fn groups_allocate(before: &Model, len: u64, hint: Option<u64>, res: &Result<Extent, AllocError>) {
    let got = res.as_ref().ok();
    if len > GROUP_BLOCKS {
        // Longer than a group: first fit over the whole device.
        let want = before
            .first_fit(len, 0, before.capacity())
            .map(|s| ext(s, len));
        assert_eq!(
            got,
            want.as_ref(),
            "groups: allocate({len}, {hint:?}) longer than a group must be the first fit"
        );
        return;
    }
    let (best, best_free) = before.emptiest_group();
    if best_free < len {
        assert!(
            got.is_none(),
            "groups: no group has {len} free, got {got:?}"
        );
        return;
    }
    let (s, e) = before.group_range(best);
    if let Some(at) = before.first_fit(len, s, e) {
        assert_eq!(
            got,
            Some(&ext(at, len)),
            "groups: allocate({len}, {hint:?}) must be the first fit in the emptiest group {best}"
        );
        return;
    }
    // The emptiest group is too fragmented: any other group with room, first
    // fit inside it (which one depends on the rotating cursor).
    let candidates: Vec<Extent> = (0..before.groups())
        .filter(|&g| g != best && before.group_free(g) >= len)
        .filter_map(|g| {
            let (s, e) = before.group_range(g);
            before.first_fit(len, s, e).map(|at| ext(at, len))
        })
        .collect();
    match got {
        Some(x) => assert!(
            candidates.contains(x),
            "groups: allocate({len}) fell back to {x:?}, not a first fit in a group: {candidates:?}"
        ),
        None => assert!(
            candidates.is_empty(),
            "groups: allocate({len}) failed though {candidates:?} fit inside a group"
        ),
    }
}

/// What the groups engine's scattered allocation must return: the free runs
/// of the emptiest group in address order, then of the next emptiest and so
/// on; `None` when fewer than `len` blocks are free or, for `len` up to a
/// group, when no single group has `len` free.
pub fn groups_scattered_expected(before: &Model, len: u64) -> Option<Vec<Extent>> {
    if before.free_blocks() < len || (len <= GROUP_BLOCKS && before.emptiest_group().1 < len) {
        return None;
    }
    let mut sim = before.clone();
    let mut need = len;
    let mut out = Vec::new();
    while need > 0 {
        let (g, _) = sim.emptiest_group();
        let (s, e) = sim.group_range(g);
        let pieces = greedy(&sim, s, e, need);
        for &p in &pieces {
            sim.take(p);
            need -= p.len();
        }
        out.extend(pieces);
    }
    Some(out)
}
