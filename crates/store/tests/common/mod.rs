//! Helpers shared by the store's integration tests: the reference model of
//! committed state.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{AlignedBuf, CrashMode, Device, MemDevice};
use blockalloc_store::format::{checkpoint, Layout, Superblock, PAGE};
use blockalloc_store::{FormatOptions, Store};
use rand::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;

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

/// The free list implied by block counts: every block of `plus` counts +1,
/// every block of `minus` −1; blocks at 1 are allocated, at 0 free. `None`
/// when some block ends below 0 or above 1 (an impossible history).
pub fn free_list_from_counts(
    plus: &[Extent],
    minus: &[Extent],
    meta: u64,
    cap: u64,
) -> Option<Vec<Extent>> {
    let mut delta: BTreeMap<u64, i64> = BTreeMap::new();
    for e in plus {
        *delta.entry(e.start()).or_default() += 1;
        *delta.entry(e.end()).or_default() -= 1;
    }
    for e in minus {
        *delta.entry(e.start()).or_default() -= 1;
        *delta.entry(e.end()).or_default() += 1;
    }
    let mut out: Vec<Extent> = Vec::new();
    let mut push_free = |a: u64, b: u64| {
        if a >= b {
            return;
        }
        match out.last_mut() {
            Some(l) if l.end() == a => *l = Extent::from_range(l.start(), b).unwrap(),
            _ => out.push(Extent::from_range(a, b).unwrap()),
        }
    };
    let (mut level, mut at) = (0i64, meta);
    for (&x, &d) in &delta {
        if x > at {
            if level == 0 {
                push_free(at, x);
            }
            at = x;
        }
        level += d;
        if !(0..=1).contains(&level) {
            return None;
        }
    }
    if level == 0 && at < cap {
        push_free(at, cap);
    }
    Some(out)
}

/// Checks that `store` holds exactly `model`, or `model` with any subset of
/// the uncertain transactions applied (commits in flight at a crash).
/// Returns the model that matched (as maximal allocated runs when an
/// uncertain transaction was applied).
pub fn matching_model(
    store: &Store,
    model: &Model,
    uncertain: &[(Vec<Extent>, Vec<Extent>)],
) -> Result<Model, String> {
    matching_counts(store, &model.extents(), &[], uncertain)?;
    let got = store.committed_free_extents();
    let l = store.layout();
    if model.free_list(l.meta_blocks, l.capacity_blocks) == got {
        return Ok(model.clone());
    }
    let mut m = Model::default();
    for r in Model::runs_of(store) {
        m.alloc(r);
    }
    Ok(m)
}

/// Checks that the store's committed free list is what the blocks of `plus`
/// minus the blocks of `minus` leave free, with any subset of the uncertain
/// transactions added (their allocations to `plus`, frees to `minus`).
/// Order-independent, so transactions of several threads need no ordering.
pub fn matching_counts(
    store: &Store,
    plus: &[Extent],
    minus: &[Extent],
    uncertain: &[(Vec<Extent>, Vec<Extent>)],
) -> Result<(), String> {
    let l = store.layout();
    let got = store.committed_free_extents();
    let n = uncertain.len();
    assert!(n <= 8, "too many uncertain transactions");
    let mut best: Option<Vec<Extent>> = None;
    for mask in 0..(1u32 << n) {
        let mut p = plus.to_vec();
        let mut m = minus.to_vec();
        for (i, (a, f)) in uncertain.iter().enumerate() {
            if mask & (1 << i) != 0 {
                p.extend_from_slice(a);
                m.extend_from_slice(f);
            }
        }
        if let Some(want) = free_list_from_counts(&p, &m, l.meta_blocks, l.capacity_blocks) {
            if want == got {
                return Ok(());
            }
            if mask == 0 {
                best = Some(want);
            }
        }
    }
    let want = best.unwrap_or_default();
    let first_diff = want
        .iter()
        .zip(&got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    Err(format!(
        "recovered free list differs from the model ({n} uncertain txns): \
         first difference at index {first_diff}: model {:?} vs store {:?} \
         ({} vs {} free extents)",
        want.get(first_diff),
        got.get(first_diff),
        want.len(),
        got.len()
    ))
}

/// Writes onto the zeroed `dev` what `format` wrote before slots were sized
/// for the worst case: a store whose checkpoint slots are `slot_len` bytes
/// (and the journal `journal_len`, default when `None`), holding the first
/// checkpoint (everything free) in slot 0. Returns its layout.
pub fn format_with_slots(
    dev: &MemDevice,
    block_size: u64,
    slot_len: u64,
    journal_len: Option<u64>,
) -> Layout {
    let cap = dev.len() / block_size;
    let journal_len = journal_len.unwrap_or(Layout::default_sizes(cap, block_size).1);
    let layout = Layout::from_sizes(dev.len(), block_size, slot_len, journal_len).unwrap();
    let sb = Superblock {
        version: blockalloc_store::format::FORMAT_VERSION_1,
        uuid: *b"earlier format..",
        layout,
        created: 1_700_000_000,
    };
    let all = Extent::from_range(layout.meta_blocks, cap).unwrap();
    let stamp = checkpoint::Stamp {
        slot: 0,
        uuid: sb.uuid,
        seq: 1,
        journal_seq: 1,
        journal_pos: 0,
    };
    let ck = checkpoint::encode(&stamp, &[all], &layout).unwrap();
    dev.write_at(layout.slot_offset(0), ck.as_slice()).unwrap();
    let mut sbs = AlignedBuf::zeroed(2 * PAGE as usize);
    let page = sb.encode();
    sbs.as_mut_slice()[..PAGE as usize].copy_from_slice(&page);
    sbs.as_mut_slice()[PAGE as usize..].copy_from_slice(&page);
    dev.write_at(0, sbs.as_slice()).unwrap();
    dev.sync().unwrap();
    layout
}

/// Bytes of the crash tests' device.
pub const DEVICE: u64 = 4 << 20;

/// Iterations of a crash test (`BLOCKALLOC_CRASH_ITERS`, default 1).
pub fn iters() -> u64 {
    std::env::var("BLOCKALLOC_CRASH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A freshly formatted crash-test device image (small journal and slots).
pub fn fresh_image() -> Vec<u8> {
    let dev = Arc::new(MemDevice::new(DEVICE));
    Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            checkpoint_slot_bytes: Some(64 << 10),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    dev.image()
}

/// One of the four crash modes, chosen by `rng`.
pub fn crash_mode(rng: &mut Xoshiro256PlusPlus) -> CrashMode {
    match rng.random_range(0..4) {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::KeepUnsynced,
        2 => CrashMode::TearLast {
            keep_sectors: rng.random_range(0..16),
        },
        _ => CrashMode::RandomSectors { seed: rng.random() },
    }
}
