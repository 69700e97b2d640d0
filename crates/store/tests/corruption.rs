//! Damaged metadata: every structure's bit flips are detected and named;
//! a damaged copy or a damaged newest checkpoint is survived and reported,
//! never silently.

mod common;

use std::sync::Arc;

use blockalloc_store::device::MemDevice;
use blockalloc_store::format::PAGE;
use blockalloc_store::{check, FormatOptions, JournalEnd, Store, StoreError, Structure};
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
fn a_damaged_last_entry_reads_as_a_torn_tail() {
    // A flip in the last entry cannot be told from a write torn by a crash:
    // the entry is discarded, and recovery and check say so.
    let (img, mut model, store) = sample();
    let l = store.layout();
    let j = store.status().journal;
    let last = (j.tail_pos - 1) % l.journal_pages();
    let dev = flip(&img, l.journal_offset() + last * PAGE + 50, 1);
    let r = check(&dev).unwrap();
    assert!(r.is_consistent());
    assert!(r.notes.iter().any(|n| n.contains("torn")), "{:?}", r.notes);
    let (s, report) = Store::open(dev).unwrap();
    assert!(matches!(report.journal_end, JournalEnd::TornTail { .. }));
    let last_alloc = *model.live.iter().next_back().unwrap().0;
    model.live.remove(&last_alloc);
    matching_model(&s, &model, &[]).unwrap();
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
    let buf = encode_entry(j.next_seq, j.tail_pos, sb.uuid_prefix(), 1, &payload);
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
