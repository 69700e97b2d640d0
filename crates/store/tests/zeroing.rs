//! Background zeroing: zeros land only on free space, a block handed out
//! while its piece is being zeroed is never overwritten, and a crash at any
//! write never makes an unzeroed block look zeroed.

mod common;

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use blockalloc::Extent;
use blockalloc_store::device::{CrashMode, Device, FaultDevice, MemDevice};
use blockalloc_store::zero::PIECE_BYTES;
use blockalloc_store::{FormatOptions, Store, StoreError};
use common::{fresh_image, DEVICE};

const BS: u64 = 4096;
const OLD: u8 = 0xAB;
const DATA: u8 = 0xCD;

/// A formatted image whose data area holds `OLD` bytes (what an unzeroed
/// block reads as here), with zeroing planned.
fn planned_image() -> Vec<u8> {
    let dev = Arc::new(MemDevice::from_image(fresh_image()));
    let meta = {
        let (store, _) = Store::open(dev.clone()).unwrap();
        store.layout().meta_blocks
    };
    dev.poke(meta * BS, &vec![OLD; (DEVICE - meta * BS) as usize]);
    let (store, _) = Store::open(dev.clone()).unwrap();
    store.plan_zeroing().unwrap();
    store.close().unwrap();
    dev.image()
}

fn block(img: &[u8], b: u64) -> &[u8] {
    &img[(b * BS) as usize..((b + 1) * BS) as usize]
}

fn write_data(dev: &dyn Device, e: Extent) {
    dev.write_at(e.start() * BS, &vec![DATA; (e.len() * BS) as usize])
        .unwrap();
}

#[test]
fn zeros_land_on_free_space_only_and_the_position_survives_a_reopen() {
    let dev = Arc::new(MemDevice::from_image(planned_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let l = store.layout();
    let p = store.zero_progress().expect("planned");
    assert_eq!((p.position, p.recorded), (l.meta_blocks, l.meta_blocks));
    // Space handed out before zeroing keeps its data.
    let mut t = store.begin();
    let a = t.allocate(300, None).unwrap();
    t.commit().unwrap();
    write_data(&*dev, a);
    let mut pieces = 0;
    while store.zero_piece().unwrap().is_some() {
        pieces += 1;
        if pieces % 3 == 0 {
            store.record_zeroing().unwrap();
        }
    }
    store.record_zeroing().unwrap();
    let p = store.zero_progress().unwrap();
    assert!(p.is_done(), "{p:?}");
    assert_eq!(p.recorded, l.capacity_blocks);
    // Zeroing starts past the space handed out: the zeros written are the
    // free space above it.
    assert_eq!(p.written_bytes, (l.capacity_blocks - a.end()) * BS);
    let img = dev.image();
    for b in a.start()..a.end() {
        assert!(block(&img, b).iter().all(|&x| x == DATA), "block {b}");
    }
    for b in a.end()..l.capacity_blocks {
        assert!(block(&img, b).iter().all(|&x| x == 0), "block {b}");
    }
    store.close().unwrap();
    let (store, _) = Store::open(MemDevice::from_image(img)).unwrap();
    assert!(store.zero_progress().unwrap().is_done());
    assert!(Arc::new(store).start_zeroing(0.5).unwrap().is_none());
}

#[test]
fn allocations_land_on_zeroed_space_first() {
    let (store, _) = Store::open(MemDevice::from_image(planned_image())).unwrap();
    for _ in 0..3 {
        store.zero_piece().unwrap();
    }
    let zeroed = store.zero_progress().unwrap().position;
    assert!(zeroed > store.layout().meta_blocks);
    let mut t = store.begin();
    let e = t.allocate(10, None).unwrap();
    assert!(e.end() <= zeroed, "{e} lies past the zeroed {zeroed}");
}

#[test]
fn a_store_without_a_plan_zeroes_nothing() {
    let store = Store::format(MemDevice::new(DEVICE), FormatOptions::default()).unwrap();
    assert_eq!(store.zero_progress(), None);
    assert_eq!(store.zero_piece().unwrap(), None);
    store.record_zeroing().unwrap();
    assert!(Arc::new(store).start_zeroing(1.0).unwrap().is_none());
}

#[test]
fn the_share_must_lie_in_zero_to_one() {
    let store = Arc::new(
        Store::open(MemDevice::from_image(planned_image()))
            .unwrap()
            .0,
    );
    for bad in [0.0, -1.0, 1.5, f64::NAN] {
        let e = store.start_zeroing(bad).unwrap_err();
        assert!(matches!(e, StoreError::BadOptions(_)), "{bad}: {e}");
    }
}

#[test]
fn a_read_only_store_refuses_to_zero() {
    let (store, _) = Store::open_read_only(MemDevice::from_image(planned_image())).unwrap();
    assert!(store.zero_progress().is_some());
    let store = Arc::new(store);
    assert!(matches!(
        store.start_zeroing(0.5).unwrap_err(),
        StoreError::ReadOnly { .. }
    ));
    assert!(matches!(
        store.zero_piece().unwrap_err(),
        StoreError::ReadOnly { .. }
    ));
}

#[test]
fn the_store_keys_are_its_own() {
    let (store, _) = Store::open(MemDevice::from_image(planned_image())).unwrap();
    let mut t = store.begin();
    let e = t.put_record(b"\0zeroed", b"12345678").unwrap_err();
    assert!(matches!(e, StoreError::BadRecord { .. }), "{e}");
    assert!(matches!(
        t.delete_record(b"\0zeroed").unwrap_err(),
        StoreError::BadRecord { .. }
    ));
    t.put_record(b"user", b"v").unwrap();
    t.commit().unwrap();
    assert_eq!(store.records(), vec![(b"user".to_vec(), b"v".to_vec())]);
    assert_eq!(store.record(b"\0zeroed"), None);
}

#[test]
fn a_fenced_store_writes_no_zeros() {
    let dev = Arc::new(FaultDevice::new(planned_image()));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let fenced = Arc::new(AtomicBool::new(true));
    let f = Arc::clone(&fenced);
    store.set_fence(Arc::new(move || f.load(Ordering::SeqCst)));
    let before = dev.stats().writes;
    let e = store.zero_piece().unwrap_err();
    assert!(matches!(e, StoreError::Fenced { .. }), "{e}");
    assert_eq!(dev.stats().writes, before);
    assert_eq!(
        store.zero_progress().unwrap().position,
        store.layout().meta_blocks
    );
    fenced.store(false, Ordering::SeqCst);
    assert!(store.zero_piece().unwrap().unwrap() > 0);
}

/// A device that, once armed, holds the next write of a whole piece (the
/// zeroer's) before it lands, until released.
struct Held {
    inner: MemDevice,
    armed: AtomicBool,
    /// (a write is being held, released)
    gate: (Mutex<(bool, bool)>, Condvar),
}

impl Device for Held {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.len() as u64 == PIECE_BYTES && self.armed.swap(false, Ordering::SeqCst) {
            let (m, cv) = &self.gate;
            let mut g = m.lock().unwrap();
            g.0 = true;
            cv.notify_all();
            while !g.1 {
                g = cv.wait(g).unwrap();
            }
        }
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        "held".into()
    }
}

/// The race: a block allocated while the zeroer is writing its piece must
/// not be overwritten by those zeros. The allocation waits for the piece;
/// data written after it returns stays.
#[test]
fn a_block_allocated_while_its_piece_is_being_zeroed_keeps_its_data() {
    let dev = Arc::new(Held {
        inner: MemDevice::from_image(planned_image()),
        armed: AtomicBool::new(true),
        gate: (Mutex::new((false, false)), Condvar::new()),
    });
    let store = Arc::new(Store::open(dev.clone()).unwrap().0);
    let meta = store.layout().meta_blocks;
    let zeroer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.zero_piece().unwrap())
    };
    // The zeroer is now inside its write over [meta, meta + 256).
    {
        let (m, cv) = &dev.gate;
        let mut g = m.lock().unwrap();
        while !g.0 {
            g = cv.wait(g).unwrap();
        }
    }
    let allocator = {
        let (store, dev) = (Arc::clone(&store), Arc::clone(&dev));
        std::thread::spawn(move || {
            let mut t = store.begin();
            let e = t.allocate(16, None).unwrap();
            // The caller writes its object as soon as it has the blocks.
            write_data(&*dev, e);
            t.commit().unwrap();
            e
        })
    };
    // The allocation took its blocks from the zeroer's piece, and waits.
    let t = std::time::Instant::now();
    while store.zero_progress().unwrap().waits == 0 {
        assert!(
            !allocator.is_finished() && t.elapsed() < std::time::Duration::from_secs(60),
            "the allocation never waited for the piece under it"
        );
        std::thread::yield_now();
    }
    {
        let (m, cv) = &dev.gate;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    }
    assert_eq!(zeroer.join().unwrap(), Some(PIECE_BYTES));
    let e = allocator.join().unwrap();
    assert_eq!(e, Extent::new(meta, 16).unwrap());
    let img = dev.inner.image();
    for b in e.start()..e.end() {
        assert!(block(&img, b).iter().all(|&x| x == DATA), "block {b}");
    }
    for b in e.end()..meta + PIECE_BYTES / BS {
        assert!(block(&img, b).iter().all(|&x| x == 0), "block {b}");
    }
    store.verify().unwrap();
}

/// Zeroing with allocations between its pieces, failing at every I/O
/// (the zero writes, the syncs, the record's journal entries) and crashing
/// in every mode: the store reopens, and every block below the recorded
/// position that the script never allocated reads as zeros.
#[test]
fn a_crash_at_any_write_never_makes_unzeroed_blocks_look_zeroed() {
    let base = planned_image();
    let script = |store: &Store, dev: &dyn Device, touched: &mut BTreeSet<u64>| {
        for round in 0..12u64 {
            let mut t = store.begin();
            let Ok(e) = t.allocate(1 + round * 7, None) else {
                return;
            };
            touched.extend(e.start()..e.end());
            let _ = dev.write_at(e.start() * BS, &vec![DATA; (e.len() * BS) as usize]);
            if t.commit().is_err() {
                return;
            }
            if store.zero_piece().is_err() {
                return;
            }
            if store.record_zeroing().is_err() {
                return;
            }
        }
    };
    let total = {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        script(&store, &*dev, &mut BTreeSet::new());
        let p = store.zero_progress().unwrap();
        assert!(p.is_done(), "{p:?}");
        let s = dev.stats();
        s.writes + s.syncs
    };
    let modes = [
        CrashMode::DropUnsynced,
        CrashMode::KeepUnsynced,
        CrashMode::KeepLast,
        CrashMode::TearLast { keep_sectors: 1 },
        CrashMode::RandomSectors { seed: 3 },
    ];
    let mut positions = BTreeSet::new();
    for n in 0..=total {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        dev.fail_after(n);
        let mut touched = BTreeSet::new();
        script(&store, &*dev, &mut touched);
        for mode in modes {
            let img = dev.crash_image(mode);
            let ctx = format!("failure at I/O {n} of {total}, {mode:?}");
            let (s, _) = Store::open(MemDevice::from_image(img.clone()))
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            s.verify().unwrap();
            let p = s.zero_progress().expect("planned before the script");
            positions.insert(p.recorded);
            for b in p.first_block..p.recorded {
                if !touched.contains(&b) {
                    assert!(
                        block(&img, b).iter().all(|&x| x == 0),
                        "{ctx}: block {b} is below the recorded {} yet not zeroed",
                        p.recorded
                    );
                }
            }
            // Zeroing resumes from the record and finishes.
            while s.zero_piece().unwrap().is_some() {}
            s.record_zeroing().unwrap();
            assert!(s.zero_progress().unwrap().is_done(), "{ctx}");
        }
    }
    // The start, every piece, the end.
    assert!(
        positions.len() >= 5,
        "crashes at different points: {positions:?}"
    );
}
