//! Damaged metadata: every structure's bit flips are detected and named;
//! a damaged copy or a damaged newest checkpoint is survived and reported,
//! never silently.

mod common;

use std::sync::Arc;

use blockalloc_store::device::MemDevice;
use blockalloc_store::format::PAGE;
use blockalloc_store::{
    check, FormatOptions, JournalEnd, SlotReport, Store, StoreError, Structure,
};
use common::{matching_model, Model};

/// A store image with two valid checkpoints and three journal entries after
/// the newest, and the model of its committed state.
fn sample() -> (Vec<u8>, Model, Store) {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    let mut model = Model::default();
    let mut commit = |n: u64| {
        let mut t = store.begin();
        let e = t.allocate(n, None).unwrap();
        t.commit().unwrap();
        model.alloc(e);
    };
    commit(3);
    store.checkpoint().unwrap();
    commit(5);
    commit(7);
    store.checkpoint().unwrap();
    commit(11);
    commit(13);
    commit(17);
    let img = dev.image();
    (img, model, store)
}

fn flip(img: &[u8], offset: u64, bit: u8) -> MemDevice {
    let mut v = img.to_vec();
    v[offset as usize] ^= 1 << bit;
    MemDevice::from_image(v)
}

/// The journal entry a corruption error names, if it names one.
fn damaged_entry(e: &StoreError) -> Option<u64> {
    match e {
        StoreError::Corrupt {
            structure: Structure::JournalEntry { seq },
            ..
        } => Some(*seq),
        _ => None,
    }
}

fn open_err(dev: MemDevice) -> StoreError {
    match Store::open(dev) {
        Ok(_) => panic!("opened a damaged device"),
        Err(e) => e,
    }
}

#[test]
fn one_damaged_superblock_copy_is_survived_and_reported() {
    let (img, model, store) = sample();
    for copy in 0..2u64 {
        for byte in [0, 9, 20, 40, 81] {
            let dev = flip(&img, copy * PAGE + byte, 3);
            let r = check(&dev).unwrap();
            assert!(!r.is_consistent());
            assert!(
                r.problems[0].contains(&format!("superblock (copy {copy})")),
                "{:?}",
                r.problems
            );
            let (s, report) = Store::open(dev).unwrap();
            assert_eq!(report.superblock_copy as u64, 1 - copy);
            assert!(!report.problems.is_empty());
            matching_model(&s, &model, &[]).unwrap();
        }
    }
    drop(store);
}

#[test]
fn both_superblock_copies_damaged_is_an_error_naming_the_superblock() {
    let (img, _, _store) = sample();
    for byte in 8..84u64 {
        let mut v = img.clone();
        v[byte as usize] ^= 0x10;
        v[(PAGE + byte) as usize] ^= 0x10;
        let e = open_err(MemDevice::from_image(v));
        assert!(
            matches!(
                e,
                StoreError::Corrupt {
                    structure: Structure::Superblock { .. },
                    ..
                }
            ),
            "byte {byte}: {e}"
        );
        assert!(e.to_string().contains("corrupt superblock"), "{e}");
    }
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_older_one() {
    let (img, model, store) = sample();
    let l = store.layout();
    let newest = store.status().journal.newest_checkpoint.slot as usize;
    let older = 1 - newest;
    // Header bytes and payload bytes of the newest slot.
    for off in [0u64, 33, 41, 57, 70, 85, PAGE, PAGE + 1] {
        let dev = flip(&img, l.slot_offset(newest) + off, 0);
        let r = check(&dev).unwrap();
        assert!(!r.is_consistent(), "offset {off}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains(&format!("checkpoint (slot {newest})"))),
            "offset {off}: {:?}",
            r.problems
        );
        let (s, report) = Store::open(dev).unwrap();
        assert_eq!(report.checkpoint.slot as usize, older, "offset {off}");
        matching_model(&s, &model, &[]).unwrap();
        s.verify().unwrap();
    }
    // Damage to the older slot: recovery does not need it; check finds it.
    let dev = flip(&img, l.slot_offset(older) + PAGE, 2);
    let r = check(&dev).unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains(&format!("checkpoint slot {older}"))),
        "{:?}",
        r.problems
    );
}

#[test]
fn both_checkpoints_damaged_is_an_error_naming_a_checkpoint() {
    let (img, _, store) = sample();
    let l = store.layout();
    let mut v = img.clone();
    v[l.slot_offset(0) as usize + 40] ^= 1;
    v[l.slot_offset(1) as usize + 40] ^= 1;
    let e = open_err(MemDevice::from_image(v));
    assert!(
        matches!(
            e,
            StoreError::Corrupt {
                structure: Structure::Checkpoint { .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_damaged_journal_entry_before_the_tail_is_an_error_naming_it() {
    let (img, _, store) = sample();
    let l = store.layout();
    let j = store.status().journal;
    let first = j.newest_checkpoint.journal_pos % l.journal_pages();
    let seq = j.newest_checkpoint.journal_seq;
    for off in [0u64, 5, 9, 17, 25, 33, 37, 41, 45, 48, 50] {
        let dev = flip(&img, l.journal_offset() + first * PAGE + off, 1);
        let e = open_err(dev);
        assert!(
            matches!(
                e,
                StoreError::Corrupt {
                    structure: Structure::JournalEntry { seq: s },
                    ..
                } if s == seq
            ),
            "offset {off}: {e}"
        );
        assert!(
            e.to_string().contains(&format!("journal entry {seq}")),
            "{e}"
        );
    }
}

#[test]
fn a_damaged_last_entry_is_corruption_not_a_torn_tail() {
    // Every sector of a write torn at a crash still checks; a sector that
    // does not was damaged after it was written, and the entry may have been
    // a commit: an error, never a silently shorter journal.
    let (img, _, store) = sample();
    let l = store.layout();
    let j = store.status().journal;
    let last = (j.tail_pos - 1) % l.journal_pages();
    let page = l.journal_offset() + last * PAGE;
    let mut cases = vec![("a bit of the magic", flip(&img, page, 1))];
    cases.push(("a bit of the payload", flip(&img, page + 50, 1)));
    cases.push(("a padding byte", flip(&img, page + 3000, 6)));
    cases.push((
        "the header sector wiped",
        MemDevice::from_image(zero(&img, page, 512)),
    ));
    cases.push((
        "the page wiped",
        MemDevice::from_image(zero(&img, page, PAGE)),
    ));
    for (what, dev) in cases {
        let e = check(&dev).unwrap_err();
        assert_eq!(damaged_entry(&e), Some(j.next_seq - 1), "{what}: {e}");
        assert!(e.to_string().contains("may be lost"), "{what}: {e}");
        assert!(Store::open(dev).is_err(), "{what}");
    }
}

/// The image of `sample()`, the image after one more commit, the model of
/// the first, and the store that made the second.
fn before_and_after_last_commit() -> (Vec<u8>, Vec<u8>, Model, Store) {
    let (before, model, store) = sample();
    // The store behind `sample()` is still open: commit once more on a copy.
    drop(store);
    let dev = Arc::new(MemDevice::from_image(before.clone()));
    let (s, _) = Store::open(dev.clone()).unwrap();
    let mut t = s.begin();
    t.allocate(19, None).unwrap();
    t.commit().unwrap();
    let after = dev.image();
    (before, after, model, s)
}

#[test]
fn a_torn_last_entry_is_discarded_as_the_write_in_flight() {
    let (before, after, model, s) = before_and_after_last_commit();
    let l = s.layout();
    let j = s.status().journal;
    let page = (l.journal_offset() + ((j.tail_pos - 1) % l.journal_pages()) * PAGE) as usize;
    // Each landed subset of the entry's sectors but all and none: torn.
    for mask in [0b1u8, 0b1000_0000, 0b0111_1111, 0b1111_1110, 0b0101_0101] {
        let mut img = before.clone();
        for k in 0..8 {
            if mask & (1 << k) != 0 {
                let at = page + k * 512;
                img[at..at + 512].copy_from_slice(&after[at..at + 512]);
            }
        }
        let r = check(&MemDevice::from_image(img.clone())).unwrap();
        assert!(r.is_consistent(), "{mask:#b}: {:?}", r.problems);
        assert!(!r.journal_tail_discarded(), "{mask:#b}");
        match &r.recovery.journal_end {
            JournalEnd::Interrupted { seq, .. } => assert_eq!(*seq, j.next_seq - 1),
            other => panic!("{mask:#b}: {other:?}"),
        }
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains(&format!("entry {}", j.next_seq - 1))),
            "{:?}",
            r.notes
        );
        let (s2, _) = Store::open(MemDevice::from_image(img)).unwrap();
        matching_model(&s2, &model, &[]).unwrap();
    }
}

#[test]
fn journal_replay_refuses_operations_that_contradict_the_state() {
    // Rewrite an entry with a valid checksum but an allocation of metadata
    // blocks.
    use blockalloc::Extent;
    use blockalloc_store::format::journal::encode_entry;
    use blockalloc_store::JournalOp;
    let (img, _, store) = sample();
    let l = store.layout();
    let j = store.status().journal;
    let sb = store.superblock();
    let mut payload = Vec::new();
    JournalOp::Alloc(Extent::new(0, 1).unwrap()).encode(&mut payload);
    let buf = encode_entry(j.next_seq, j.tail_pos, &sb.uuid, 1, &payload);
    let mut v = img.clone();
    let at = (l.journal_offset() + (j.tail_pos % l.journal_pages()) * PAGE) as usize;
    v[at..at + buf.len()].copy_from_slice(buf.as_slice());
    let e = open_err(MemDevice::from_image(v));
    assert!(
        e.to_string().contains("only 0 of its blocks are free"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("journal entry {}", j.next_seq)),
        "{e}"
    );
}

fn zero(img: &[u8], offset: u64, len: u64) -> Vec<u8> {
    let mut v = img.to_vec();
    v[offset as usize..(offset + len) as usize].fill(0);
    v
}

#[test]
fn a_wiped_checkpoint_header_is_reported_not_taken_for_an_empty_slot() {
    let (img, model, store) = sample();
    let l = store.layout();
    let newest = store.status().journal.newest_checkpoint.slot as usize;
    for slot in [newest, 1 - newest] {
        let dev = MemDevice::from_image(zero(&img, l.slot_offset(slot), PAGE));
        let r = check(&dev).unwrap();
        assert!(!r.is_consistent(), "slot {slot} wiped");
        assert!(
            r.problems.iter().any(
                |p| p.contains(&format!("checkpoint (slot {slot})")) && p.contains("all zeros")
            ),
            "slot {slot}: {:?}",
            r.problems
        );
        let (s, report) = Store::open(dev).unwrap();
        assert!(
            matches!(
                report.slots[slot],
                SlotReport::Damaged {
                    torn_by_crash: false,
                    ..
                }
            ),
            "{:?}",
            report.slots
        );
        assert!(!report.problems.is_empty());
        assert_eq!(report.checkpoint.slot as usize, 1 - slot);
        matching_model(&s, &model, &[]).unwrap();
    }
}

#[test]
fn a_wiped_slot_0_is_damage_even_before_a_second_checkpoint() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Store::format(dev.clone(), FormatOptions::default()).unwrap();
    let l = store.layout();
    let mut t = store.begin();
    t.allocate(4, None).unwrap();
    t.commit().unwrap();
    // The only checkpoint is slot 0's: wiping it leaves nothing to recover
    // from, and the error names the slot instead of calling it empty.
    let e = open_err(MemDevice::from_image(zero(
        &dev.image(),
        l.slot_offset(0),
        PAGE,
    )));
    assert!(e.to_string().contains("checkpoint (slot 0)"), "{e}");
    // Slot 1 never written: empty, and that is fine.
    let r = check(&*dev).unwrap();
    assert!(r.is_consistent(), "{:?}", r.problems);
    assert_eq!(r.recovery.slots[1], SlotReport::Empty);
}

/// A store closed cleanly after a few commits: its image, its model, and
/// the byte offset of the close record.
fn closed_sample() -> (Vec<u8>, Model, u64) {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    let mut model = Model::default();
    for n in [3, 5, 7] {
        let mut t = store.begin();
        model.alloc(t.allocate(n, None).unwrap());
        t.commit().unwrap();
    }
    let l = store.layout();
    store.close().unwrap();
    let img = dev.image();
    let (s, report) = Store::open(MemDevice::from_image(img.clone())).unwrap();
    assert!(report.closed_cleanly);
    assert_eq!(report.entries, 0);
    let j = s.status().journal;
    let at = l.journal_offset() + (j.tail_pos % l.journal_pages()) * PAGE;
    (img, model, at)
}

#[test]
fn a_damaged_close_record_is_corruption() {
    let (img, model, at) = closed_sample();
    // Any flip in the close record, or wiping it: damage, and the sectors
    // cannot say whether they held the close record or a later commit.
    let mut cases: Vec<_> = [0u64, 9, 20, 44, 48, 50, 511, 512, 4000]
        .iter()
        .map(|&off| (format!("flip at {off}"), flip(&img, at + off, 3)))
        .collect();
    cases.push((
        "sector 0 wiped".into(),
        MemDevice::from_image(zero(&img, at, 512)),
    ));
    cases.push((
        "page wiped".into(),
        MemDevice::from_image(zero(&img, at, PAGE)),
    ));
    for (what, dev) in cases {
        let e = check(&dev).unwrap_err();
        assert!(damaged_entry(&e).is_some(), "{what}: {e}");
        assert!(open_err(dev).is_corruption(), "{what}");
    }
    // Intact, it opens with the committed state.
    let (s, _) = Store::open(MemDevice::from_image(img)).unwrap();
    matching_model(&s, &model, &[]).unwrap();
}

#[test]
fn a_damaged_closing_checkpoint_is_damage_not_a_torn_write() {
    // The close record is written after the closing checkpoint, so with the
    // record in place damage to that checkpoint is reported as damage (the
    // state is intact: the older checkpoint and the journal give it).
    let (img, model, _) = closed_sample();
    let (s, report) = Store::open_read_only(MemDevice::from_image(img.clone())).unwrap();
    let slot = report.checkpoint.slot as usize;
    let l = s.layout();
    drop(s);
    for (what, off) in [("header", 40u64), ("payload", PAGE + 1)] {
        let dev = flip(&img, l.slot_offset(slot) + off, 2);
        let r = check(&dev).unwrap();
        assert!(!r.is_consistent(), "{what}: {:?}", r.notes);
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains(&format!("checkpoint (slot {slot})"))),
            "{what}: {:?}",
            r.problems
        );
        assert!(r.recovery.closed_cleanly, "{what}");
        let (s, report) = Store::open(dev).unwrap();
        assert!(
            matches!(
                report.slots[slot],
                SlotReport::Damaged {
                    torn_by_crash: false,
                    ..
                }
            ),
            "{what}: {:?}",
            report.slots
        );
        matching_model(&s, &model, &[]).unwrap();
    }
}

#[test]
fn after_a_clean_close_the_next_writer_overwrites_the_close_record() {
    let (img, mut model, at) = closed_sample();
    let dev = Arc::new(MemDevice::from_image(img.clone()));
    let (s, _) = Store::open(dev.clone()).unwrap();
    // One transaction large enough to span several sectors.
    let mut t = s.begin();
    for _ in 0..400 {
        t.allocate(1, None).unwrap();
    }
    let all = t.allocations().to_vec();
    t.commit().unwrap();
    for e in &all {
        model.alloc(*e);
    }
    let crashed = dev.image();
    drop(s);
    let (s2, report) = Store::open(MemDevice::from_image(crashed.clone())).unwrap();
    assert!(!report.closed_cleanly);
    assert_eq!(report.txns, 1);
    matching_model(&s2, &model, &[]).unwrap();
    // The same entry torn by a crash (its first sector written, the rest
    // still the close record's, which carries the same sequence number):
    // the next writer was writing, so this is the write in flight, not
    // corruption and not a clean close.
    let mut torn = img.clone();
    let at = at as usize;
    torn[at..at + 512].copy_from_slice(&crashed[at..at + 512]);
    let (_, report) = Store::open(MemDevice::from_image(torn)).unwrap();
    assert!(
        matches!(report.journal_end, JournalEnd::Interrupted { .. }),
        "{report:?}"
    );
    assert!(!report.closed_cleanly);
}

#[test]
fn a_device_truncated_below_both_superblocks_says_truncated() {
    let (img, _, _) = sample();
    for len in [4096usize, 6000] {
        let e = open_err(MemDevice::from_image(img[..len].to_vec()));
        assert!(matches!(e, StoreError::DeviceTooSmall { .. }), "{len}: {e}");
        assert!(e.to_string().contains("truncated"), "{e}");
    }
    // Copy 0 damaged as well: corrupt, and the message says why copy 1 is
    // not there.
    let mut v = img[..4096].to_vec();
    v[40] ^= 1;
    let e = open_err(MemDevice::from_image(v));
    assert!(
        e.is_corruption() && e.to_string().contains("truncated"),
        "{e}"
    );
    // Not a store at all.
    let e = open_err(MemDevice::from_image(vec![0u8; 4096]));
    assert!(matches!(e, StoreError::NotFormatted { .. }), "{e}");
}

#[test]
fn a_stale_copy_in_a_checkpoint_slot_is_reported_when_the_journal_proves_a_newer_one() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    let l = store.layout();
    let mut model = Model::default();
    let mut stale = Vec::new();
    for seq in 2..=6u64 {
        let mut t = store.begin();
        model.alloc(t.allocate(seq, None).unwrap());
        t.commit().unwrap();
        store.checkpoint().unwrap();
        if seq == 3 {
            let at = l.slot_offset(0) as usize;
            stale = dev.image()[at..at + l.slot_len as usize].to_vec();
        }
    }
    assert_eq!(store.status().journal.newest_checkpoint.seq, 6);
    let mut img = dev.image();
    // Slot 0 goes back to checkpoint 3 although checkpoint 5 was written to
    // it; slot 1 (checkpoint 6) reads as torn by a crash.
    let at = l.slot_offset(0) as usize;
    img[at..at + stale.len()].copy_from_slice(&stale);
    img[l.slot_offset(1) as usize + 40] ^= 1;
    let (s, report) = Store::open(MemDevice::from_image(img.clone())).unwrap();
    assert_eq!(report.checkpoint.seq, 3);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("checkpoint (slot 0)") && p.contains("checkpoint 5")),
        "{:?}",
        report.problems
    );
    matching_model(&s, &model, &[]).unwrap();
    assert!(!check(&MemDevice::from_image(img)).unwrap().is_consistent());
}

/// A checkpoint torn at a crash is a note while its announcement is the
/// journal's last entry; the next writable open writes it again, so that
/// commits after it and a second crash do not turn it into "damage".
#[test]
fn a_checkpoint_torn_at_a_crash_is_not_damage_after_a_second_crash() {
    use blockalloc_store::device::{CrashMode, FaultDevice};
    let dev = Arc::new(FaultDevice::new(vec![0; 8 << 20]));
    let store = Store::format(dev.clone(), FormatOptions::default()).unwrap();
    let mut model = Model::default();
    let mut t = store.begin();
    model.alloc(t.allocate(3, None).unwrap());
    t.commit().unwrap();
    // The announcement is written and synced, the slot written, its sync
    // fails: the power goes with half the slot on the media.
    dev.fail_after(3);
    assert!(store.checkpoint().is_err());
    drop(store);
    let img = dev.crash_image(CrashMode::TearLast { keep_sectors: 1 });
    let r = check(&MemDevice::from_image(img.clone())).unwrap();
    assert!(r.is_consistent(), "{:?}", r.problems);
    assert!(r.notes.iter().any(|n| n.contains("torn")), "{:?}", r.notes);
    let again = Arc::new(MemDevice::from_image(img));
    let (s, _) = Store::open(again.clone()).unwrap();
    let mut t = s.begin();
    model.alloc(t.allocate(5, None).unwrap());
    t.commit().unwrap();
    drop(s); // the second crash: no close
    let r = check(&MemDevice::from_image(again.image())).unwrap();
    assert!(r.is_consistent(), "{:?}", r.problems);
    let (s, _) = Store::open(MemDevice::from_image(again.image())).unwrap();
    matching_model(&s, &model, &[]).unwrap();
}
