//! Helpers shared by the store's integration tests: the reference model of
//! committed state.

#![allow(dead_code)]

use std::collections::BTreeMap;

use blockalloc::Extent;
use blockalloc_store::Store;

/// The committed state as a trivially correct model: the set of allocated
/// extents, keyed by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub live: BTreeMap<u64, u64>,
}

impl Model {
    pub fn alloc(&mut self, e: Extent) {
        assert!(self.live.insert(e.start(), e.len()).is_none(), "{e} twice");
    }

    pub fn free(&mut self, e: Extent) {
        assert_eq!(self.live.remove(&e.start()), Some(e.len()), "{e} not live");
    }

    pub fn apply(&mut self, allocs: &[Extent], frees: &[Extent]) {
        for &e in allocs {
            self.alloc(e);
        }
        for &e in frees {
            self.free(e);
        }
    }

    pub fn extents(&self) -> Vec<Extent> {
        self.live
            .iter()
            .map(|(&s, &l)| Extent::new(s, l).unwrap())
            .collect()
    }

    /// The free list this model implies for a store with `meta` metadata
    /// blocks and `cap` blocks, as maximal runs.
    pub fn free_list(&self, meta: u64, cap: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        let mut at = meta;
        for (&s, &l) in &self.live {
            assert!(s >= at, "model extents overlap at {s}");
            if s > at {
                out.push(Extent::from_range(at, s).unwrap());
            }
            at = s + l;
        }
        if at < cap {
            out.push(Extent::from_range(at, cap).unwrap());
        }
        out
    }

    /// The model implied by a store's committed free list: every maximal
    /// allocated run becomes one extent.
    pub fn runs_of(store: &Store) -> Vec<Extent> {
        let l = store.layout();
        let mut runs = Vec::new();
        let mut at = l.meta_blocks;
        for f in store.committed_free_extents() {
            if f.start() > at {
                runs.push(Extent::from_range(at, f.start()).unwrap());
            }
            at = f.end();
        }
        if at < l.capacity_blocks {
            runs.push(Extent::from_range(at, l.capacity_blocks).unwrap());
        }
        runs
    }
}

/// Checks that `store` holds exactly `model`, or `model` with any subset of
/// the uncertain transactions applied (commits in flight at a crash).
/// Returns the model that matched.
pub fn matching_model(
    store: &Store,
    model: &Model,
    uncertain: &[(Vec<Extent>, Vec<Extent>)],
) -> Result<Model, String> {
    let l = store.layout();
    let got = store.committed_free_extents();
    let n = uncertain.len();
    assert!(n <= 8, "too many uncertain transactions");
    for mask in 0..(1u32 << n) {
        let mut m = model.clone();
        let mut ok = true;
        for (i, (a, f)) in uncertain.iter().enumerate() {
            if mask & (1 << i) != 0 {
                // A free of something already gone means this combination
                // is impossible.
                if f.iter().any(|e| m.live.get(&e.start()) != Some(&e.len())) {
                    ok = false;
                    break;
                }
                m.apply(a, f);
            }
        }
        if ok && m.free_list(l.meta_blocks, l.capacity_blocks) == got {
            return Ok(m);
        }
    }
    let want = model.free_list(l.meta_blocks, l.capacity_blocks);
    let first_diff = want
        .iter()
        .zip(&got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    Err(format!(
        "recovered free list differs from the model ({} uncertain txns): \
         first difference at index {first_diff}: model {:?} vs store {:?} \
         ({} vs {} free extents)",
        n,
        want.get(first_diff),
        got.get(first_diff),
        want.len(),
        got.len()
    ))
}
