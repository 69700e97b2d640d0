//! Records: the store's key-value table, changed atomically with
//! transactions, restated by every checkpoint announcement.

use std::collections::BTreeMap;
use std::sync::Arc;

use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store, StoreError};

fn small_journal() -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            journal_bytes: Some(64 * 4096),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    (dev, store)
}

fn table(store: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    store.records().into_iter().collect()
}

#[test]
fn records_change_with_their_transaction_and_survive_a_crash() {
    let (dev, store) = small_journal();
    let mut t = store.begin();
    let e = t.allocate(8, None).unwrap();
    t.put_record(b"lease/1", b"first").unwrap();
    t.put_record(b"lease/2", b"second").unwrap();
    // Not committed yet: not visible.
    assert_eq!(store.record(b"lease/1"), None);
    t.commit().unwrap();
    assert_eq!(store.record(b"lease/1").as_deref(), Some(&b"first"[..]));
    let mut t = store.begin();
    t.free(e).unwrap();
    t.delete_record(b"lease/1").unwrap();
    t.put_record(b"lease/2", b"replaced").unwrap();
    t.commit().unwrap();
    // An aborted transaction changes no record.
    let mut t = store.begin();
    t.put_record(b"lease/3", b"never").unwrap();
    t.abort();
    let want = table(&store);
    assert_eq!(
        want,
        BTreeMap::from([(b"lease/2".to_vec(), b"replaced".to_vec())])
    );
    drop(store); // a crash: nothing closed
    let (store, _) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    assert_eq!(table(&store), want);
    store.verify().unwrap();
}

#[test]
fn records_survive_a_fallback_to_the_older_checkpoint_after_the_ring_wrapped() {
    let (dev, store) = small_journal();
    store.set_checkpoint_interval(u64::MAX);
    let mut model = BTreeMap::new();
    // Records large enough that an announcement takes several pages.
    for i in 0..20u8 {
        let mut t = store.begin();
        let v = vec![i; 600];
        t.put_record(&[b'r', i], &v).unwrap();
        t.commit().unwrap();
        model.insert(vec![b'r', i], v);
    }
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    // Then the table shrinks: the room kept for the next announcement is
    // small, the older checkpoint's announcement is still large.
    let mut t = store.begin();
    for i in 5..20u8 {
        t.delete_record(&[b'r', i]).unwrap();
        model.remove(&vec![b'r', i]);
    }
    t.commit().unwrap();
    // Fill the ring up to what the writer must keep, and take the image
    // just before the commit that forces a checkpoint: every page the
    // writer may reuse is then reused, the older checkpoint is still
    // needed.
    let ring = store.status().journal.ring_pages;
    let before = store.stats().checkpoints;
    let mut last = None;
    for i in 0..ring * 4 {
        let img = dev.image();
        let (newest, kept) = (store.status().journal.newest_checkpoint.slot, model.clone());
        let mut t = store.begin();
        let v = vec![(i % 251) as u8; 3000];
        t.put_record(b"r\0", &v).unwrap();
        t.commit().unwrap();
        model.insert(b"r\0".to_vec(), v);
        if store.stats().checkpoints > before {
            last = Some((img, newest as usize, kept));
            break;
        }
    }
    let (mut img, newest, model) = last.expect("the ring filled up");
    let l = store.layout();
    drop(store);
    // The newest checkpoint is damaged: recovery falls back to the older
    // one (whose announcement the writer did not keep) and finds the
    // records restated by the newest one's announcement, which it replays.
    img[l.slot_offset(newest) as usize + 41] ^= 1;
    let (store, report) = Store::open(MemDevice::from_image(img)).unwrap();
    assert_ne!(report.checkpoint.slot as usize, newest, "{report:?}");
    assert_eq!(table(&store), model);
    store.verify().unwrap();
}

#[test]
fn records_survive_a_clean_close_and_many_checkpoints() {
    let (dev, store) = small_journal();
    let mut model = BTreeMap::new();
    for i in 0..500u32 {
        let mut t = store.begin();
        let k = format!("k{}", i % 37).into_bytes();
        if i % 5 == 0 {
            t.delete_record(&k).unwrap();
            model.remove(&k);
        } else {
            let v = i.to_le_bytes().repeat(20);
            t.put_record(&k, &v).unwrap();
            model.insert(k, v);
        }
        t.commit().unwrap();
    }
    assert!(store.stats().checkpoints > 3, "{:?}", store.stats());
    store.close().unwrap();
    let (store, report) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    assert!(report.closed_cleanly);
    assert_eq!(table(&store), model);
}

#[test]
fn bad_keys_and_a_table_past_its_limit_are_refused_and_change_nothing() {
    let (_dev, store) = small_journal();
    let mut t = store.begin();
    for key in [&b""[..], &[7u8; 256][..]] {
        let e = t.put_record(key, b"v").unwrap_err();
        assert!(matches!(e, StoreError::BadRecord { .. }), "{e}");
        let e = t.delete_record(key).unwrap_err();
        assert!(matches!(e, StoreError::BadRecord { .. }), "{e}");
    }
    let limit = store.records_limit();
    let e = t.put_record(b"big", &vec![0; limit]).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    // The transaction is still usable and holds nothing of the refusals.
    t.put_record(b"ok", b"v").unwrap();
    t.commit().unwrap();
    assert_eq!(
        table(&store),
        BTreeMap::from([(b"ok".to_vec(), b"v".to_vec())])
    );
    // Within the limit, across transactions: the table as a whole counts.
    let half = vec![1u8; limit / 2];
    let mut t = store.begin();
    t.put_record(b"a", &half).unwrap();
    t.commit().unwrap();
    let mut t = store.begin();
    let e = t.put_record(b"b", &half).unwrap_err();
    assert!(matches!(e, StoreError::BadRecord { .. }), "{e}");
    // Replacing a record frees its old bytes once committed.
    let mut t = store.begin();
    t.delete_record(b"a").unwrap();
    t.commit().unwrap();
    let mut t = store.begin();
    t.put_record(b"b", &half).unwrap();
    t.commit().unwrap();
}

#[test]
fn records_survive_when_recovery_had_only_one_valid_checkpoint() {
    let (dev, store) = small_journal();
    let mut model = BTreeMap::new();
    for i in 0..20u8 {
        let mut t = store.begin();
        t.put_record(&[b'r', i], &[i; 600]).unwrap();
        t.commit().unwrap();
        model.insert(vec![b'r', i], vec![i; 600]);
    }
    store.checkpoint().unwrap();
    store.checkpoint().unwrap();
    let older = 1 - store.status().journal.newest_checkpoint.slot as usize;
    let l = store.layout();
    drop(store);
    // The older checkpoint is damaged: recovery has only the newest.
    let mut img = dev.image();
    img[l.slot_offset(older) as usize + 41] ^= 1;
    let dev = Arc::new(MemDevice::from_image(img));
    let (store, _) = Store::open(dev.clone()).unwrap();
    store.set_checkpoint_interval(u64::MAX);
    // Commits fill the ring up to what the writer keeps; the image just
    // before the commit that forces a checkpoint is what a crash leaves.
    let before = store.stats().checkpoints;
    let mut last = None;
    for i in 0..1000u32 {
        let img = dev.image();
        let mut t = store.begin();
        t.allocate(1, None).unwrap();
        t.put_record(b"n", &i.to_le_bytes().repeat(800)).unwrap();
        t.commit().unwrap();
        if store.stats().checkpoints > before {
            last = Some((img, i));
            break;
        }
    }
    let (img, i) = last.expect("the ring filled up");
    if i > 0 {
        model.insert(b"n".to_vec(), (i - 1).to_le_bytes().repeat(800));
    }
    drop(store);
    let (store, _) = Store::open(MemDevice::from_image(img)).unwrap();
    assert_eq!(table(&store), model);
    store.verify().unwrap();
}
