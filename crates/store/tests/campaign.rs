//! A corruption campaign: no damage ever drops a committed transaction
//! silently, and no damage goes unreported.
//!
//! Store images are built with a model of every acknowledged commit: after
//! a crash (the last commit acknowledged, no close; also with a multi-page
//! newest entry, and with the newest entry the first after a lap wrap) and
//! after a clean close. One copy of one image at a time is damaged in every
//! region recovery may read: both superblock copies, both checkpoint slots
//! (header page and every payload page), every sector of the newest three
//! journal entries, of the page where the next entry goes and of a page
//! left stale before a lap start. Damage: a zeroed page, a zeroed sector,
//! single-bit flips at the start, middle and end of every sector, and one
//! in every byte of each header. Each case is classified by what `check`
//! and `Store::open` say:
//!
//! * `refused`: either returns an error;
//! * `reported`: `check` lists problems, or a journal tail was discarded
//!   (recovery or check says so);
//! * `recovered`: nothing reported, and the recovered state is exactly the
//!   model (the damage hit something recovery does not need);
//! * `silent`: nothing reported, yet the state differs from the model: a
//!   committed transaction lost without a word.
//!
//! The campaign fails on any silent case, on any recovered one (every byte
//! the store wrote is checked, so damage to it is reported even where the
//! state survives; a "damage" that changes nothing, zeros over zeros, is not
//! a case), and on a panic. The counts are printed as a table (run with
//! `--nocapture`).
//!
//! The second test crashes a short commit sequence at every I/O, with every
//! tear of the last write and several random sector subsets: every crash
//! image recovers to a state between the acknowledged commits and those
//! plus the one in flight, and is never reported as damage.

mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_store::device::{CrashMode, FaultDevice, MemDevice, SECTOR};
use blockalloc_store::format::PAGE;
use blockalloc_store::{
    check, FormatOptions, JournalEnd, JournalStatus, SlotReport, Store, StoreError,
};
use common::{matching_model, Model};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Bytes of the campaign's device: with 512-byte blocks, 32768 blocks, so a
/// fragmented free list makes checkpoint payloads of more than one page.
const CAMPAIGN_DEVICE: u64 = 16 << 20;
const BLOCK: u64 = 512;
/// Pages of the journal ring: small, so that it wraps.
const RING_PAGES: u64 = 64;

fn format(bytes: u64) -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(bytes));
    let store = Store::format(
        dev.clone(),
        FormatOptions {
            block_size: BLOCK,
            journal_bytes: Some(RING_PAGES * PAGE),
            ..FormatOptions::default()
        },
    )
    .unwrap();
    (dev, store)
}

/// One journal entry, placed from the journal status around the operation
/// that wrote it.
#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    /// Absolute page position.
    pos: u64,
    pages: u64,
    what: String,
}

/// Builds a store's history, tracking the model of acknowledged commits and
/// where every journal entry went.
struct Builder {
    dev: Arc<MemDevice>,
    store: Store,
    model: Model,
    entries: Vec<Entry>,
    rng: Xoshiro256PlusPlus,
    ring: u64,
}

impl Builder {
    fn new() -> Self {
        let (dev, store) = format(CAMPAIGN_DEVICE);
        // Checkpoints only where the campaign asks for them, so that every
        // operation writes exactly one entry and can be placed.
        store.set_checkpoint_interval(u64::MAX);
        let ring = store.layout().journal_pages();
        assert_eq!(ring, RING_PAGES);
        Builder {
            dev,
            store,
            model: Model::default(),
            entries: Vec::new(),
            rng: Xoshiro256PlusPlus::seed_from_u64(0x0c0f_fee5),
            ring,
        }
    }

    fn journal(&self) -> JournalStatus {
        self.store.status().journal
    }

    /// Records the entries written since `before`: one entry (anywhere,
    /// possibly moved to the next lap start), or several single pages in a
    /// row.
    fn record(&mut self, before: JournalStatus, what: &str) {
        let after = self.journal();
        let n = after.next_seq - before.next_seq;
        let (b, a) = (before.tail_pos, after.tail_pos);
        if n == 1 {
            // An entry never crosses the ring's end: it starts at the old
            // tail, or at the lap start it was moved to.
            let lap_of_last = (a - 1) / self.ring * self.ring;
            let pos = b.max(lap_of_last);
            self.entries.push(Entry {
                seq: before.next_seq,
                pos,
                pages: a - pos,
                what: what.to_string(),
            });
        } else if n > 1 && a - b == n && b / self.ring == (a - 1) / self.ring {
            for i in 0..n {
                self.entries.push(Entry {
                    seq: before.next_seq + i,
                    pos: b + i,
                    pages: 1,
                    what: format!("{what} (entry {} of {n})", i + 1),
                });
            }
        } else {
            panic!(
                "{what}: cannot place {n} entries written from page {b} to {a}: \
                 take checkpoints more often"
            );
        }
    }

    /// Commits `allocs` allocations of `len` blocks and `frees` frees of
    /// live extents (chosen by the seeded generator).
    fn commit(&mut self, allocs: usize, len: u64, frees: usize, what: &str) {
        let before = self.journal();
        let mut t = self.store.begin();
        for _ in 0..allocs {
            t.allocate(len, None).unwrap();
        }
        let mut live: Vec<Extent> = self.model.extents();
        for _ in 0..frees.min(live.len()) {
            let e = live.swap_remove(self.rng.random_range(0..live.len()));
            t.free(e).unwrap();
        }
        let (a, f) = (t.allocations().to_vec(), t.frees().to_vec());
        t.commit().unwrap();
        self.model.apply(&a, &f);
        self.record(before, what);
    }

    /// A small commit of one page: a few allocations and frees.
    fn small(&mut self) {
        let allocs = self.rng.random_range(1..4);
        let len = self.rng.random_range(1..9);
        let frees = self.rng.random_range(0..3);
        self.commit(allocs, len, frees, "commit");
    }

    fn checkpoint(&mut self) {
        let before = self.journal();
        self.store.checkpoint().unwrap();
        self.record(before, "checkpoint announcement");
    }

    /// Formats and writes a history: a fragmented free list (checkpoint
    /// payloads of several pages), then small commits with a checkpoint
    /// every few entries until the ring has wrapped at least once, so that
    /// stale entries of an earlier lap lie beyond the tail and both slots
    /// hold checkpoints.
    fn history() -> Self {
        let mut b = Builder::new();
        for _ in 0..5 {
            b.commit(1000, 1, 0, "fragmenting commit");
        }
        // Free every other one-block extent: ~2500 one-block holes.
        let live = b.model.extents();
        let odd: Vec<Extent> = live.iter().skip(1).step_by(2).copied().collect();
        for chunk in odd.chunks(900) {
            let before = b.journal();
            let mut t = b.store.begin();
            for &e in chunk {
                t.free(e).unwrap();
            }
            t.commit().unwrap();
            b.model.apply(&[], chunk);
            b.record(before, "fragmenting free");
        }
        b.checkpoint();
        while b.journal().tail_pos < 2 * b.ring + 10 {
            for _ in 0..6 {
                b.small();
            }
            b.checkpoint();
        }
        b
    }

    /// Keeps the journal roomy: a checkpoint when more than half the ring
    /// is live.
    fn make_room(&mut self) {
        if self.journal().live_pages > self.ring / 2 {
            self.checkpoint();
            self.checkpoint();
        }
    }
}

/// Which image the campaign damages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// After a crash right after the last acknowledged commit.
    Crash,
    /// After a crash; the newest entry spans several pages.
    CrashMultiPage,
    /// After a crash; the newest entry is the first of a new lap (it did
    /// not fit before the ring's end).
    CrashLapWrap,
    /// After a clean close.
    Closed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Crash => "crash",
            Mode::CrashMultiPage => "crash, multi-page newest entry",
            Mode::CrashLapWrap => "crash, newest entry after a lap wrap",
            Mode::Closed => "clean close",
        }
    }
}

/// A pristine image, its model, and the regions to damage.
struct Image {
    mode: Mode,
    bytes: Vec<u8>,
    model: Model,
    regions: Vec<Region>,
    summary: String,
}

/// Pages of one structure; the first page's first sector is a header.
struct Region {
    name: String,
    /// Byte offsets of its pages.
    pages: Vec<u64>,
    /// The first page starts with a header (magic, fields, checksum).
    header: bool,
    detail: String,
}

fn build(mode: Mode) -> Image {
    let mut b = Builder::history();
    let ring = b.ring;
    let mut skipped = None;
    match mode {
        Mode::Crash => {
            b.checkpoint();
            for _ in 0..4 {
                b.small();
            }
        }
        Mode::CrashMultiPage => {
            b.checkpoint();
            b.small();
            b.small();
            // ~2500 one-block allocations: an entry of three pages.
            b.commit(2500, 1, 0, "multi-page commit");
            assert!(b.entries.last().unwrap().pages >= 3);
        }
        Mode::CrashLapWrap => {
            // Fill the ring to one page before its end, then commit an
            // entry of two pages: it goes to the next lap start.
            b.make_room();
            while b.journal().tail_pos % ring != ring - 1 {
                b.make_room();
                if b.journal().tail_pos % ring != ring - 1 {
                    b.small();
                }
            }
            let gap = b.journal().tail_pos;
            b.commit(1200, 1, 0, "commit moved to the lap start");
            let e = b.entries.last().unwrap();
            assert_eq!(e.pos % ring, 0, "{e:?}");
            assert!(e.pos > gap && e.pages >= 2, "{e:?}");
            skipped = Some(gap);
        }
        Mode::Closed => {
            b.checkpoint();
            for _ in 0..3 {
                b.small();
            }
            let before = b.journal();
            b.store.close_shared().unwrap();
            b.record(before, "closing checkpoint announcement");
        }
    }
    let l = b.store.layout();
    let j = b.journal();
    let bytes = b.dev.image();
    let page_at = |pos: u64| l.journal_offset() + (pos % ring) * PAGE;
    let mut regions = Vec::new();
    for copy in 0..2u64 {
        regions.push(Region {
            name: format!("superblock copy {copy}"),
            pages: vec![copy * PAGE],
            header: true,
            detail: String::new(),
        });
    }
    // Slot payload sizes from the pristine image's recovery report.
    let pristine = check(&MemDevice::from_image(bytes.clone())).unwrap();
    let newest = pristine.recovery.checkpoint.slot as usize;
    for slot in [newest, 1 - newest] {
        let role = if slot == newest { "newest" } else { "older" };
        let payload_bytes = match &pristine.recovery.slots[slot] {
            SlotReport::Valid { payload_bytes, .. } => *payload_bytes,
            other => panic!("{mode:?}: slot {slot} is not valid: {other:?}"),
        };
        regions.push(Region {
            name: format!("checkpoint {role} header"),
            pages: vec![l.slot_offset(slot)],
            header: true,
            detail: format!("slot {slot}"),
        });
        let payload_pages = payload_bytes.div_ceil(PAGE);
        regions.push(Region {
            name: format!("checkpoint {role} payload"),
            pages: (0..payload_pages)
                .map(|p| l.slot_offset(slot) + PAGE * (1 + p))
                .collect(),
            header: false,
            detail: format!("slot {slot}, {payload_pages} pages"),
        });
    }
    let n = b.entries.len();
    for (k, name) in ["newest", "2nd newest", "3rd newest"].iter().enumerate() {
        let e = &b.entries[n - 1 - k];
        regions.push(Region {
            name: format!("journal {name} entry"),
            pages: (e.pos..e.pos + e.pages).map(page_at).collect(),
            header: true,
            detail: format!(
                "entry {} at page {} ({} pages): {}",
                e.seq,
                e.pos % ring,
                e.pages,
                e.what
            ),
        });
    }
    regions.push(Region {
        name: "journal next page".into(),
        pages: vec![page_at(j.tail_pos)],
        header: true,
        detail: format!("page {}", j.tail_pos % ring),
    });
    if let Some(gap) = skipped {
        regions.push(Region {
            name: "journal skipped page".into(),
            pages: vec![page_at(gap)],
            header: true,
            detail: format!("page {} (left before the lap start)", gap % ring),
        });
    }
    let laps = j.tail_pos / ring;
    let summary = format!(
        "{}: {} entries written, tail at page {} (lap {laps}), newest checkpoint in slot {newest}, \
         model {} live extents",
        mode.name(),
        j.next_seq - 1,
        j.tail_pos % ring,
        b.model.live.len()
    );
    assert!(laps >= 2, "the ring wrapped: {summary}");
    let model = b.model.clone();
    drop(b);
    Image {
        mode,
        bytes,
        model,
        regions,
        summary,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Refused,
    Reported,
    Recovered,
    Silent,
    Panic,
}

const OUTCOMES: [Outcome; 5] = [
    Outcome::Refused,
    Outcome::Reported,
    Outcome::Recovered,
    Outcome::Silent,
    Outcome::Panic,
];

/// What one damaged image led to, and whether check had notes.
fn classify(dev: &Arc<MemDevice>, model: &Model) -> (Outcome, bool, String) {
    let checked = catch_unwind(AssertUnwindSafe(|| check(&**dev)));
    let opened = catch_unwind(AssertUnwindSafe(|| Store::open(dev.clone())));
    let (checked, opened) = match (checked, opened) {
        (Ok(c), Ok(o)) => (c, o),
        _ => return (Outcome::Panic, false, "panicked".into()),
    };
    let notes = checked.as_ref().is_ok_and(|r| !r.notes.is_empty());
    let (report, (store, rec)) = match (checked, opened) {
        (Err(e), _) => return (Outcome::Refused, notes, format!("check: {e}")),
        (_, Err(e)) => return (Outcome::Refused, notes, format!("open: {e}")),
        (Ok(r), Ok(o)) => (r, o),
    };
    if !report.problems.is_empty() {
        return (Outcome::Reported, notes, report.problems.join("; "));
    }
    if report.journal_tail_discarded() || rec.journal_end.tail_discarded() {
        return (Outcome::Reported, notes, "journal tail discarded".into());
    }
    if !rec.problems.is_empty() {
        return (Outcome::Reported, notes, rec.problems.join("; "));
    }
    match catch_unwind(AssertUnwindSafe(|| matching_model(&store, model, &[]))) {
        Err(_) => (Outcome::Panic, notes, "panicked comparing".into()),
        Ok(Ok(_)) => (Outcome::Recovered, notes, String::new()),
        Ok(Err(why)) => (
            Outcome::Silent,
            notes,
            format!(
                "{why} (recovery: {} entries, end {:?}, closed cleanly {})",
                rec.entries, rec.journal_end, rec.closed_cleanly
            ),
        ),
    }
}

/// One damage: a name for the table, a detail for the list of failures,
/// and the byte range it replaces.
struct Damage {
    kind: &'static str,
    detail: String,
    offset: u64,
    bytes: Vec<u8>,
}

fn flip(img: &[u8], offset: u64, bit: u32, kind: &'static str, detail: String) -> Damage {
    Damage {
        kind,
        detail: format!("{detail}, bit {bit} of byte {}", offset % SECTOR as u64),
        offset,
        bytes: vec![img[offset as usize] ^ (1 << bit)],
    }
}

/// Every damage of one region.
fn damages(img: &[u8], region: &Region) -> Vec<Damage> {
    let mut out = Vec::new();
    for (p, &page) in region.pages.iter().enumerate() {
        out.push(Damage {
            kind: "zeroed page",
            detail: format!("page {p}"),
            offset: page,
            bytes: vec![0; PAGE as usize],
        });
        for s in 0..(PAGE as usize / SECTOR) as u64 {
            let at = page + s * SECTOR as u64;
            let here = format!("page {p} sector {s}");
            out.push(Damage {
                kind: "zeroed sector",
                detail: here.clone(),
                offset: at,
                bytes: vec![0; SECTOR],
            });
            for (byte, bit) in [(0, 6), (1, 5), (3, 7)] {
                out.push(flip(
                    img,
                    at + byte,
                    bit,
                    "bit flip, first bytes",
                    here.clone(),
                ));
            }
            for (byte, bit) in [(255, 2), (256, 6)] {
                out.push(flip(img, at + byte, bit, "bit flip, middle", here.clone()));
            }
            for (byte, bit) in [(510, 4), (511, 7)] {
                out.push(flip(
                    img,
                    at + byte,
                    bit,
                    "bit flip, last bytes",
                    here.clone(),
                ));
            }
            if region.header && p == 0 && s == 0 {
                // Every byte of the header (a checkpoint header has 88).
                for byte in 0..96u64 {
                    let bit = (byte % 8) as u32;
                    out.push(flip(
                        img,
                        at + byte,
                        bit,
                        "bit flip, header byte",
                        here.clone(),
                    ));
                }
            }
        }
    }
    out
}

/// Counts per outcome, and cases with check notes.
#[derive(Default)]
struct Row {
    counts: [u64; 5],
    notes: u64,
}

fn run_campaign(img: &Image, table: &mut Vec<((Mode, String, &'static str), Row)>) -> Vec<String> {
    let dev = Arc::new(MemDevice::from_image(img.bytes.clone()));
    // The pristine image is consistent and holds the model.
    let (o, _, why) = classify(&dev, &img.model);
    assert_eq!(
        o,
        Outcome::Recovered,
        "{}: pristine image: {why}",
        img.summary
    );
    let mut silent = Vec::new();
    for region in &img.regions {
        for d in damages(&img.bytes, region) {
            let original = dev.peek(d.offset, d.bytes.len());
            if original == d.bytes {
                // Zeros over zeros: no damage at all.
                continue;
            }
            dev.poke(d.offset, &d.bytes);
            let (o, notes, why) = classify(&dev, &img.model);
            dev.poke(d.offset, &original);
            let key = (img.mode, region.name.clone(), d.kind);
            let i = match table.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    table.push((key, Row::default()));
                    table.len() - 1
                }
            };
            let row = &mut table[i].1;
            row.counts[OUTCOMES.iter().position(|&x| x == o).unwrap()] += 1;
            row.notes += u64::from(notes);
            // Every change to a byte the store wrote is damage and must be
            // reported, even where the state survives it.
            if matches!(o, Outcome::Silent | Outcome::Panic | Outcome::Recovered) {
                silent.push(format!(
                    "{:?} | {} | {} ({}) | {} | {}: {why}",
                    o,
                    img.mode.name(),
                    region.name,
                    region.detail,
                    d.kind,
                    d.detail
                ));
            }
        }
    }
    // Recovery and check write nothing: the image is as it was.
    assert!(
        dev.image() == img.bytes,
        "{}: the image changed",
        img.summary
    );
    silent
}

#[test]
fn no_damage_drops_a_commit_silently_or_goes_unreported() {
    let mut table = Vec::new();
    let mut failures = Vec::new();
    let mut summaries = Vec::new();
    for mode in [
        Mode::Crash,
        Mode::CrashMultiPage,
        Mode::CrashLapWrap,
        Mode::Closed,
    ] {
        let img = build(mode);
        summaries.push(img.summary.clone());
        for r in &img.regions {
            if !r.detail.is_empty() {
                summaries.push(format!("  {}: {}", r.name, r.detail));
            }
        }
        failures.extend(run_campaign(&img, &mut table));
    }
    let mut out = String::new();
    for s in &summaries {
        out.push_str(s);
        out.push('\n');
    }
    out.push_str(
        "\nrefused: check or open fails (exit 4); reported: check lists problems (exit 4) or a \
         journal tail was discarded (exit 6); recovered: nothing reported and the state is the \
         model; silent: nothing reported and the state differs; with notes: check succeeded \
         with notes.\n",
    );
    out.push_str(
        "\n| mode | region | damage | cases | refused | reported | recovered | silent | panic | with notes |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut totals: BTreeMap<&str, [u64; 6]> = BTreeMap::new();
    for ((mode, region, kind), row) in &table {
        let c = row.counts;
        let cases: u64 = c.iter().sum();
        out.push_str(&format!(
            "| {} | {region} | {kind} | {cases} | {} | {} | {} | {} | {} | {} |\n",
            mode.name(),
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            row.notes
        ));
        let t = totals.entry(mode.name()).or_default();
        for i in 0..5 {
            t[i] += c[i];
        }
        t[5] += cases;
    }
    out.push_str("\n| mode | cases | refused | reported | recovered | silent | panic |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (mode, t) in &totals {
        out.push_str(&format!(
            "| {mode} | {} | {} | {} | {} | {} | {} |\n",
            t[5], t[0], t[1], t[2], t[3], t[4]
        ));
    }
    println!("{out}");
    assert!(
        failures.is_empty(),
        "{} damaged images went unreported (a silent loss, damage not reported though the \
         state survived, or a panic):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Transactions whose commit failed: durable or not, all or nothing.
type Uncertain = Vec<(Vec<Extent>, Vec<Extent>)>;

/// One step of the crash test's sequence.
enum Step {
    /// `allocs` allocations of `len` blocks and frees of the first `frees`
    /// live extents.
    Commit {
        allocs: usize,
        len: u64,
        frees: usize,
    },
    Checkpoint,
    Close,
}

/// The short commit sequence of the crash test: entries of one and of
/// several pages, frees, a checkpoint, a close.
const SEQUENCE: [Step; 6] = [
    Step::Commit {
        allocs: 2,
        len: 3,
        frees: 0,
    },
    // ~1500 operations: an entry of two pages.
    Step::Commit {
        allocs: 1500,
        len: 1,
        frees: 0,
    },
    Step::Commit {
        allocs: 1,
        len: 2,
        frees: 2,
    },
    Step::Checkpoint,
    Step::Commit {
        allocs: 3,
        len: 4,
        frees: 1,
    },
    Step::Close,
];

fn is_device_failure(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { .. } | StoreError::Poisoned { .. })
}

/// Runs [`SEQUENCE`] until the first error (only a failing device may
/// cause one), adding every acknowledged commit to `model`. Returns the
/// transaction whose commit failed.
fn short_sequence(store: &Store, model: &mut Model) -> Uncertain {
    let device_failure = |e: StoreError| assert!(is_device_failure(&e), "{e}");
    for step in &SEQUENCE {
        match *step {
            Step::Commit { allocs, len, frees } => {
                let mut t = store.begin();
                for _ in 0..allocs {
                    if let Err(e) = t.allocate(len, None) {
                        device_failure(e);
                        return Vec::new();
                    }
                }
                for e in model.extents().into_iter().take(frees) {
                    if let Err(e) = t.free(e) {
                        device_failure(e);
                        return Vec::new();
                    }
                }
                let (a, f) = (t.allocations().to_vec(), t.frees().to_vec());
                match t.commit() {
                    Ok(_) => model.apply(&a, &f),
                    Err(e) => {
                        device_failure(e);
                        return vec![(a, f)];
                    }
                }
            }
            Step::Checkpoint => {
                if let Err(e) = store.checkpoint() {
                    device_failure(e);
                    return Vec::new();
                }
            }
            Step::Close => {
                if let Err(e) = store.close_shared() {
                    device_failure(e);
                    return Vec::new();
                }
            }
        }
    }
    Vec::new()
}

/// A crash image must recover to the acknowledged commits, plus or minus
/// the one in flight, and never be reported as damage. Returns whether
/// recovery discarded a torn tail (allowed after a crash).
fn assert_crash_recovers(img: Vec<u8>, model: &Model, uncertain: &Uncertain, ctx: &str) -> bool {
    let dev = MemDevice::from_image(img);
    let report = check(&dev).unwrap_or_else(|e| panic!("{ctx}: check refused a crash image: {e}"));
    assert!(
        report.problems.is_empty(),
        "{ctx}: check reports damage in a crash image: {:?}",
        report.problems
    );
    let (store, rec) =
        Store::open(dev).unwrap_or_else(|e| panic!("{ctx}: open refused a crash image: {e}"));
    assert!(
        rec.problems.is_empty(),
        "{ctx}: recovery reports damage: {:?}",
        rec.problems
    );
    store.verify().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    matching_model(&store, model, uncertain).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    matches!(
        rec.journal_end,
        JournalEnd::Interrupted { .. } | JournalEnd::TornTail { .. }
    )
}

#[test]
fn a_crash_at_every_io_with_every_tear_is_never_reported_as_damage() {
    // A store with checkpoints in both slots and a few entries.
    let (dev, store) = format(8 << 20);
    let mut before = Model::default();
    for n in [3, 5, 7] {
        let mut t = store.begin();
        before.alloc(t.allocate(n, None).unwrap());
        t.commit().unwrap();
        store.checkpoint().unwrap();
    }
    drop(store);
    let base = dev.image();
    let total = {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        let mut m = before.clone();
        assert!(short_sequence(&store, &mut m).is_empty());
        let s = dev.stats();
        s.writes + s.syncs
    };
    assert!(total >= 12, "the sequence does I/O ({total})");
    let (mut images, mut torn) = (0, 0);
    for n in 0..=total {
        let dev = Arc::new(FaultDevice::new(base.clone()));
        let (store, _) = Store::open(dev.clone()).unwrap();
        dev.fail_after(n);
        let mut model = before.clone();
        let uncertain = short_sequence(&store, &mut model);
        drop(store);
        let ctx = |mode: CrashMode| format!("failure at I/O {n} of {total}, {mode:?}");
        let keep = dev.crash_image(CrashMode::KeepUnsynced);
        // Every tear of the last write, up to all of it; then the other
        // modes.
        let tears = (0..)
            .map(|keep_sectors| CrashMode::TearLast { keep_sectors })
            .take_while(|&m| dev.crash_image(m) != keep)
            .chain([CrashMode::DropUnsynced, CrashMode::KeepUnsynced])
            .chain((0..6).map(|seed| CrashMode::RandomSectors { seed }));
        for mode in tears {
            torn += u64::from(assert_crash_recovers(
                dev.crash_image(mode),
                &model,
                &uncertain,
                &ctx(mode),
            ));
            images += 1;
        }
    }
    println!(
        "{images} crash images of {total} I/O points recovered, none reported as damage \
         ({torn} with a discarded torn tail)"
    );
    // The tears are real: some images hold a torn entry, and it stays a torn
    // tail.
    assert!(torn > 0, "no crash image tore an entry");
}
