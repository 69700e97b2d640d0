//! Stores of format version 1 (journal entries without per-sector stamps)
//! still open: read as they are, and upgraded by a writable open, with a
//! crash at any I/O of the upgrade harmless.
//!
//! The images in `tests/fixtures/` were written by the last version-1
//! writer: an 8 MiB store, commits, two checkpoints, more commits; one image
//! taken before a close (as a crash leaves it), one after `close`. They are
//! stored sparse: `BASPARSE`, the image length (u64 LE), then for each page
//! holding a non-zero byte its offset (u64 LE) and its 4096 bytes.

mod common;

use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{CrashMode, FaultDevice, MemDevice};
use blockalloc_store::format::{journal, FORMAT_VERSION, FORMAT_VERSION_1, PAGE};
use blockalloc_store::{check, JournalEnd, Store};
use common::Model;

fn load(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(&raw[..8], b"BASPARSE", "{path}");
    let len = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
    let mut img = vec![0u8; len];
    for rec in raw[16..].chunks(8 + PAGE as usize) {
        let at = u64::from_le_bytes(rec[..8].try_into().unwrap()) as usize;
        img[at..at + PAGE as usize].copy_from_slice(&rec[8..]);
    }
    img
}

/// What both images hold: one allocated run (the blocks of the live
/// allocations the writer left, which touch each other).
fn expected() -> Vec<Extent> {
    vec![Extent::from_range(106, 329).unwrap()]
}

const IMAGES: [(&str, bool); 2] = [("v1-crashed.sparse", false), ("v1-closed.sparse", true)];

#[test]
fn a_version_1_store_reads_as_it_was_written() {
    for (name, closed) in IMAGES {
        let dev = MemDevice::from_image(load(name));
        let r = check(&dev).unwrap();
        assert!(r.is_consistent(), "{name}: {:?}", r.problems);
        assert_eq!(r.superblock.version, FORMAT_VERSION_1);
        assert_eq!(r.recovery.format_version, FORMAT_VERSION_1);
        assert_eq!(r.recovery.closed_cleanly, closed, "{name}");
        assert_eq!(r.recovery.journal_end, JournalEnd::Clean, "{name}");
        let (s, _) = Store::open_read_only(dev).unwrap();
        assert_eq!(Model::runs_of(&s), expected(), "{name}");
        assert_eq!(
            s.superblock().version,
            FORMAT_VERSION_1,
            "read-only: no upgrade"
        );
    }
}

#[test]
fn a_damaged_last_entry_of_a_version_1_store_is_still_a_discarded_tail() {
    // Version 1 cannot tell a torn write from damage at the journal's end:
    // the entry is discarded and reported as possibly a lost commit.
    let img = load("v1-crashed.sparse");
    let (s, _) = Store::open_read_only(MemDevice::from_image(img.clone())).unwrap();
    let (l, j) = (s.layout(), s.status().journal);
    drop(s);
    let at = (l.journal_offset() + ((j.tail_pos - 1) % l.journal_pages()) * PAGE) as usize;
    let mut v = img;
    v[at + 50] ^= 4;
    let r = check(&MemDevice::from_image(v)).unwrap();
    assert!(r.journal_tail_discarded(), "{:?}", r.recovery.journal_end);
}

#[test]
fn a_writable_open_upgrades_a_version_1_store() {
    for (name, _) in IMAGES {
        let dev = Arc::new(MemDevice::from_image(load(name)));
        let (s, report) = Store::open(dev.clone()).unwrap();
        assert_eq!(report.format_version, FORMAT_VERSION_1);
        assert_eq!(s.superblock().version, FORMAT_VERSION);
        assert_eq!(Model::runs_of(&s), expected(), "{name}");
        let mut t = s.begin();
        let e = t.allocate(7, None).unwrap();
        t.commit().unwrap();
        drop(s);
        // The ring is version 2 throughout: every sector checks.
        let img = dev.image();
        let (s, report) = Store::open(MemDevice::from_image(img.clone())).unwrap();
        assert_eq!(report.format_version, FORMAT_VERSION);
        assert_eq!(report.entries, 1, "{name}");
        let l = s.layout();
        let ring = &img[l.journal_offset() as usize..(l.journal_offset() + l.journal_len) as usize];
        assert!(journal::damaged_sectors(ring, &s.superblock().uuid).is_empty());
        let mut want = Model::default();
        for r in expected() {
            want.alloc(r);
        }
        want.alloc(e);
        common::matching_model(&s, &want, &[]).unwrap();
        s.close().unwrap();
        let r = check(&MemDevice::from_image(dev.image())).unwrap();
        assert!(r.is_consistent(), "{name}: {:?}", r.problems);
    }
}

#[test]
fn a_crash_at_any_io_of_the_upgrade_recovers_the_same_state() {
    for (name, _) in IMAGES {
        let img = load(name);
        let total = {
            let dev = Arc::new(FaultDevice::new(img.clone()));
            Store::open(dev.clone()).unwrap();
            let st = dev.stats();
            st.reads + st.writes + st.syncs
        };
        let mut upgraded = 0;
        for n in 0..total {
            let dev = Arc::new(FaultDevice::new(img.clone()));
            dev.fail_after(n);
            assert!(
                Store::open(dev.clone()).is_err(),
                "{name}: I/O {n} of {total}"
            );
            let mut modes = vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced];
            modes.extend((0..9).map(|k| CrashMode::TearLast { keep_sectors: k }));
            modes.extend((0..4).map(|seed| CrashMode::RandomSectors { seed }));
            for mode in modes {
                let ctx = format!("{name}: crash at I/O {n} of {total}, {mode:?}");
                let after = dev.crash_image(mode);
                let r = check(&MemDevice::from_image(after.clone())).unwrap();
                assert!(r.is_consistent(), "{ctx}: {:?}", r.problems);
                assert!(!r.journal_tail_discarded(), "{ctx}");
                let (s, _) = Store::open_read_only(MemDevice::from_image(after.clone())).unwrap();
                assert_eq!(Model::runs_of(&s), expected(), "{ctx}");
                upgraded += u64::from(s.superblock().version == FORMAT_VERSION);
                drop(s);
                // The next writable open finishes (or redoes) the upgrade.
                let dev2 = Arc::new(MemDevice::from_image(after));
                let (s, _) = Store::open(dev2.clone()).unwrap();
                assert_eq!(s.superblock().version, FORMAT_VERSION, "{ctx}");
                assert_eq!(Model::runs_of(&s), expected(), "{ctx}");
                // A commit after it replays from either checkpoint.
                let mut t = s.begin();
                t.allocate(3, None).unwrap();
                t.commit().unwrap();
                drop(s);
                let r = check(&MemDevice::from_image(dev2.image())).unwrap();
                assert!(r.is_consistent(), "{ctx}: {:?}", r.problems);
                assert!(!r.recovery.upgrade_unfinished, "{ctx}");
            }
        }
        assert!(
            upgraded > 0,
            "{name}: some crash images are past the superblock"
        );
    }
}
