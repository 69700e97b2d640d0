//! A checkpoint of any free-space state fits its slot: shattered free space
//! never stops commits, checkpoints or close.

mod common;

use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{AlignedBuf, CrashMode, Device, FaultDevice, MemDevice};
use blockalloc_store::format::superblock::{SB_CRC_OFF, SB_SLOT_LEN_OFF};
use blockalloc_store::format::{checkpoint, crc, PAGE};
use blockalloc_store::{check, FormatOptions, SlotReport, Store, StoreError};
use common::{format_with_slots, matching_model, Model};

/// Allocates every data block in one commit, then frees every other one in
/// commits of `batch` frees (commits that only free). Returns the free list
/// that leaves: one free block in two.
fn shatter(store: &Store, batch: usize) -> Vec<Extent> {
    let l = store.layout();
    let mut t = store.begin();
    let all = t.allocate(l.capacity_blocks - l.meta_blocks, None).unwrap();
    t.commit().unwrap();
    assert_eq!(all.end(), l.capacity_blocks);
    let odd: Vec<_> = (l.meta_blocks | 1..l.capacity_blocks)
        .step_by(2)
        .map(|b| Extent::new(b, 1).unwrap())
        .collect();
    for part in odd.chunks(batch) {
        let mut t = store.begin();
        for &e in part {
            t.free(e).unwrap();
        }
        t.commit().unwrap();
    }
    assert_eq!(store.committed_free_extents(), odd);
    odd
}

/// Allocates a block and frees it again, `rounds` times, each its own commit.
fn churn(store: &Store, rounds: usize) {
    for _ in 0..rounds {
        let mut t = store.begin();
        let e = t.allocate(1, None).unwrap();
        t.commit().unwrap();
        let mut t = store.begin();
        t.free(e).unwrap();
        t.commit().unwrap();
    }
}

fn reopen(img: Vec<u8>) -> Store {
    let (s, report) = Store::open(MemDevice::from_image(img)).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    s.verify().unwrap();
    s
}

#[test]
fn shattered_free_space_never_stops_commits_checkpoints_or_close() {
    // 256 MiB in 4 KiB blocks: 65536 blocks; a 64-page journal. One free
    // block in two is 32 Ki free extents: 64 KiB as a list, 8 KiB of
    // bitmaps.
    let dev = Arc::new(MemDevice::new(256 << 20));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * PAGE),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    let l = store.layout();
    assert!(l.slots_hold_any_checkpoint());
    let free = shatter(&store, 500);
    // Commits go on far past the journal's length, which needs a
    // checkpoint every 16 pages: with frees only, then allocate + free.
    let before = store.stats().checkpoints;
    let mut back = Vec::new();
    for _ in 0..100 {
        let mut t = store.begin();
        let e = t.allocate(1, None).unwrap();
        t.commit().unwrap();
        back.push(e);
    }
    for e in back {
        let mut t = store.begin();
        t.free(e).unwrap();
        t.commit().unwrap();
    }
    churn(&store, 100);
    assert!(
        store.stats().checkpoints >= before + 10,
        "{:?}",
        store.stats()
    );
    assert_eq!(store.committed_free_extents(), free);
    store.checkpoint().unwrap();
    let written = store.stats().checkpoint_bytes / store.stats().checkpoints;
    assert!(written <= checkpoint::max_len(l.capacity_blocks));
    store.verify().unwrap();
    store.close().unwrap();

    let s2 = reopen(dev.image());
    assert_eq!(s2.committed_free_extents(), free);
    let report = check(&*dev).unwrap();
    assert!(report.is_consistent(), "{:?}", report.problems);
    assert_eq!(report.recovery.entries, 0, "close leaves nothing to replay");
    let used = report.recovery.checkpoint.slot as usize;
    let SlotReport::Valid {
        extents,
        payload_bytes,
        ..
    } = report.recovery.slots[used]
    else {
        panic!("{:?}", report.recovery.slots);
    };
    assert_eq!(extents, free.len() as u64);
    // Two chunks as bitmaps, not 64 KiB of list.
    assert_eq!(payload_bytes, 2 * (1 + 4096));
    // And it keeps working after the reopen.
    churn(&s2, 50);
    s2.close().unwrap();
}

#[test]
fn a_store_formatted_with_small_slots_checkpoints_shattered_space() {
    // Slots of 64 KiB on 262144 blocks (what a 1 GiB device in 4 KiB blocks
    // got from an earlier format; here 128 MiB in 512-byte blocks): one
    // free block in two is 256 KiB as a list, but 32 KiB of bitmaps, so
    // those slots hold any checkpoint of this device.
    let dev = Arc::new(MemDevice::new(128 << 20));
    let l = format_with_slots(&dev, 512, 64 << 10, None);
    assert_eq!(l.capacity_blocks, 1 << 18);
    assert!(l.slots_hold_any_checkpoint());
    let (store, _) = Store::open(dev.clone()).unwrap();
    let free = shatter(&store, 2000);
    churn(&store, 100);
    store.checkpoint().unwrap();
    store.close().unwrap();
    let s2 = reopen(dev.image());
    assert_eq!(s2.committed_free_extents(), free);
    let report = check(&*dev).unwrap();
    assert!(report.is_consistent(), "{:?}", report.problems);
    assert!(report.notes.is_empty(), "{:?}", report.notes);
}

#[test]
fn check_notes_slots_smaller_than_the_worst_case() {
    // 524288 blocks need 64 KiB of bitmap: more than a 64 KiB slot holds.
    let dev = Arc::new(MemDevice::new(256 << 20));
    let l = format_with_slots(&dev, 512, 64 << 10, None);
    assert!(!l.slots_hold_any_checkpoint());
    let report = check(&*dev).unwrap();
    assert!(report.is_consistent(), "{:?}", report.problems);
    assert!(
        report.notes.iter().any(|n| n.contains(
            "checkpoint slots of 65536 bytes are smaller than the largest checkpoint \
             of this device (73728 bytes"
        )),
        "{:?}",
        report.notes
    );
}

#[test]
fn new_formats_refuse_slots_too_small_for_the_worst_case() {
    // 4 GiB in 4 KiB blocks: 2^20 blocks need 128 KiB of bitmap.
    let e = Store::format(
        MemDevice::new(4 << 30),
        FormatOptions {
            checkpoint_slot_bytes: Some(64 << 10),
            ..FormatOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, StoreError::BadOptions(_)), "{e}");
    assert!(e.to_string().contains("at least 139264 bytes"), "{e}");
}

#[test]
fn a_superblock_with_overflowing_sizes_is_refused_not_a_panic() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Store::format(dev.clone(), FormatOptions::default()).unwrap();
    let mut sbs = AlignedBuf::zeroed(2 * PAGE as usize);
    dev.read_at(0, sbs.as_mut_slice()).unwrap();
    for copy in 0..2 {
        let p = &mut sbs.as_mut_slice()[copy * PAGE as usize..][..PAGE as usize];
        p[SB_SLOT_LEN_OFF..SB_SLOT_LEN_OFF + 8].copy_from_slice(&(1u64 << 63).to_le_bytes());
        let c = crc(&p[..SB_CRC_OFF]);
        p[SB_CRC_OFF..SB_CRC_OFF + 4].copy_from_slice(&c.to_le_bytes());
    }
    dev.write_at(0, sbs.as_slice()).unwrap();
    let e = Store::open(dev.clone()).unwrap_err();
    assert!(e.is_corruption(), "{e}");
    assert!(e.to_string().contains("overflow"), "{e}");
}

/// Frees 16 allocated blocks between free ones and allocates 8, one commit
/// each, with a checkpoint after every fourth free; stops at the first
/// failure. Returns the transaction in flight at a failure, if any.
fn crash_script(store: &Store, model: &mut Model) -> Vec<(Vec<Extent>, Vec<Extent>)> {
    let l = store.layout();
    let evens = (l.meta_blocks + 2..l.capacity_blocks).step_by(2).take(16);
    for (i, b) in evens.enumerate() {
        let e = Extent::new(b, 1).unwrap();
        let mut t = store.begin();
        if t.free(e).is_err() {
            return Vec::new();
        }
        if t.commit().is_err() {
            return vec![(Vec::new(), vec![e])];
        }
        model.free(e);
        if i % 2 == 1 {
            let mut t = store.begin();
            let Ok(a) = t.allocate(1, None) else {
                return Vec::new();
            };
            if t.commit().is_err() {
                return vec![(vec![a], Vec::new())];
            }
            model.alloc(a);
        }
        if i % 4 == 3 && store.checkpoint().is_err() {
            return Vec::new();
        }
    }
    Vec::new()
}

#[test]
fn a_crash_at_any_io_of_chunked_checkpoints_recovers_the_committed_state() {
    // 4 MiB in 4 KiB blocks: one chunk; one free block in two is about
    // 900 bytes as a list, 129 as a bitmap record.
    let base = {
        let dev = Arc::new(MemDevice::new(4 << 20));
        let store = Store::format(dev.clone(), FormatOptions::default()).unwrap();
        shatter(&store, 100);
        store.close().unwrap();
        dev.image()
    };
    let model0 = {
        let (s, _) = Store::open(MemDevice::from_image(base.clone())).unwrap();
        let mut m = Model::default();
        for r in Model::runs_of(&s) {
            m.alloc(r);
        }
        // Allocated runs are single blocks, so every free of one is exact.
        assert!(m.extents().iter().all(|e| e.len() == 1));
        m
    };
    let total = {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        let mut m = model0.clone();
        assert!(crash_script(&store, &mut m).is_empty());
        let report = check(&MemDevice::from_image(dev.current_image())).unwrap();
        let used = report.recovery.checkpoint.slot as usize;
        let SlotReport::Valid { payload_bytes, .. } = report.recovery.slots[used] else {
            panic!("{:?}", report.recovery.slots);
        };
        assert_eq!(payload_bytes, 1 + 1024 / 8, "a bitmap record");
        let st = dev.stats();
        st.writes + st.syncs
    };
    assert!(total > 50, "{total} I/O calls");
    let modes = [
        CrashMode::DropUnsynced,
        CrashMode::KeepUnsynced,
        CrashMode::TearLast { keep_sectors: 1 },
        CrashMode::RandomSectors { seed: 3 },
    ];
    for n in 0..=total {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        dev.fail_after(n);
        let mut model = model0.clone();
        let uncertain = crash_script(&store, &mut model);
        drop(store);
        for mode in modes {
            let ctx = format!("failure at I/O {n} of {total}, {mode:?}");
            let img = dev.crash_image(mode);
            let report =
                check(&MemDevice::from_image(img.clone())).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert!(report.is_consistent(), "{ctx}: {:?}", report.problems);
            let (s, _) =
                Store::open(MemDevice::from_image(img)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            s.verify().unwrap_or_else(|e| panic!("{ctx}: {e}"));
            matching_model(&s, &model, &uncertain).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        }
    }
}
