//! Recovery: from a device's bytes to an engine holding the committed state.
//!
//! 1. **Superblock**: copy 0 if valid, else copy 1; both damaged is an error.
//! 2. **Checkpoint**: the valid slot with the highest sequence number whose
//!    payload is also valid; a damaged newest slot falls back to the other.
//! 3. **Journal**: read the ring once, then replay entries from the
//!    checkpoint's `journal_seq` / `journal_pos`: entry `s` is at the
//!    expected position or, when it did not fit before the ring's end, at the
//!    next lap start. Replay stops at the first position holding no valid
//!    entry `s`: the tail. A damaged entry there is a torn write (the last
//!    write before a crash), unless a valid entry with a higher sequence
//!    number exists anywhere in the ring — entries are written one at a time,
//!    each synced before the next, so that can only be corruption, and it is
//!    an error.
//! 4. Replaying an operation that does not fit the state (allocating blocks
//!    that are not free, freeing blocks that are) is an error naming the
//!    entry.
//!
//! Nothing here writes to the device.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};

use crate::device::{AlignedBuf, Device, SECTOR};
use crate::error::{Result, Structure};
use crate::format::checkpoint::{self, CheckpointHeader, SlotState, CK_PAYLOAD_OFF};
use crate::format::journal::{self, EntryHeader, Look};
use crate::format::{
    journal_v1, Layout, Superblock, FORMAT_VERSION, FORMAT_VERSION_1, PAGE, SUPERBLOCK_AREA,
};
use crate::{JournalOp, StoreError};

/// Where a checkpoint says replay starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointRef {
    /// Slot index.
    pub slot: u32,
    /// Checkpoint sequence number.
    pub seq: u64,
    /// First journal entry to replay.
    pub journal_seq: u64,
    /// Absolute journal page of that entry.
    pub journal_pos: u64,
}

impl From<&CheckpointHeader> for CheckpointRef {
    fn from(h: &CheckpointHeader) -> Self {
        CheckpointRef {
            slot: h.slot,
            seq: h.seq,
            journal_seq: h.journal_seq,
            journal_pos: h.journal_pos,
        }
    }
}

/// What recovery found in one checkpoint slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotReport {
    /// Never written.
    Empty,
    /// Valid header (and payload, when it was read).
    Valid {
        /// Checkpoint sequence number.
        seq: u64,
        /// Free extents listed.
        extents: u64,
        /// Payload bytes.
        payload_bytes: u64,
    },
    /// Damaged.
    Damaged {
        /// What is wrong.
        reason: String,
        /// True when the journal shows a checkpoint write to this slot was
        /// in progress at a crash: a torn write, not corruption.
        torn_by_crash: bool,
    },
}

/// How the journal replay ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalEnd {
    /// The next position held no entry of the expected sequence number (the
    /// last writer stopped, or crashed, between two entries), or the close
    /// record ([`RecoveryReport::closed_cleanly`]).
    Clean,
    /// The next position held a damaged entry, discarded. After a crash this
    /// is the write that was in flight; it is also what a committed entry
    /// damaged later looks like, so the loss is reported, not hidden.
    ///
    /// Only a store of format version 1 ends this way: version 2 tells the
    /// two apart ([`JournalEnd::Interrupted`], or an error for damage).
    TornTail {
        /// What was wrong with it.
        reason: String,
        /// Sequence number the discarded entry had (or would have had: the
        /// one expected there).
        seq: u64,
        /// Bytes the entry occupies on the device, when its header is
        /// intact enough to say.
        bytes: Option<u64>,
    },
    /// The next position held part of a write that did not complete, every
    /// sector intact (format version 2): the write in flight at a crash,
    /// never acknowledged, discarded. Nothing committed was lost.
    Interrupted {
        /// What shows the write incomplete.
        reason: String,
        /// Its sequence number.
        seq: u64,
        /// Bytes the entry would have occupied, when its header landed.
        bytes: Option<u64>,
    },
}

impl JournalEnd {
    /// True when recovery discarded a damaged entry at the journal's end
    /// that may have been a committed one ([`JournalEnd::TornTail`]).
    pub fn tail_discarded(&self) -> bool {
        matches!(self, JournalEnd::TornTail { .. })
    }
}

/// What recovery did, for people and for tests.
#[derive(Clone, Debug)]
pub struct RecoveryReport {
    /// Superblock copy used (0 or 1).
    pub superblock_copy: u8,
    /// Checkpoint used.
    pub checkpoint: CheckpointRef,
    /// Both slots.
    pub slots: [SlotReport; 2],
    /// True when the slot with the highest sequence number had a valid
    /// header but a damaged free list, and the older checkpoint was used.
    pub fell_back: bool,
    /// Journal entries replayed.
    pub entries: u64,
    /// Transactions replayed.
    pub txns: u64,
    /// Allocations replayed.
    pub allocs: u64,
    /// Frees replayed.
    pub frees: u64,
    /// How replay ended.
    pub journal_end: JournalEnd,
    /// True when replay ended at the close record: the last writer closed
    /// the store cleanly and nothing was written after.
    pub closed_cleanly: bool,
    /// The slot announced by the last journal entry replayed, when that
    /// entry is a checkpoint announcement: a checkpoint write to this slot
    /// was in flight at a crash, so damage there is a torn write.
    pub interrupted_checkpoint_slot: Option<u32>,
    /// Damage found and worked around (a superblock copy, a checkpoint slot
    /// that was not torn by a crash, journal sectors holding nothing
    /// recovery needs). Empty when everything was intact.
    pub problems: Vec<String>,
    /// Format version found on the device.
    pub format_version: u32,
    /// True when an upgrade to the current format version was begun and
    /// not finished (superblock copy 0 written, copy 1 not yet): the state
    /// is intact, and the next writable open finishes it.
    pub upgrade_unfinished: bool,
    /// Free extents after recovery.
    pub free_extents: u64,
    /// Wall time of the whole recovery.
    pub elapsed: Duration,
}

/// The writer's position after recovery.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JournalState {
    pub next_seq: u64,
    pub tail_pos: u64,
    pub newest: CheckpointRef,
    /// Replay start of the older valid checkpoint, or of the newest when
    /// there is only one (from its announcement then): journal pages from
    /// here on must be kept. They hold the newest checkpoint's
    /// announcement, which restates the records for both.
    pub keep_from: u64,
    pub next_checkpoint_seq: u64,
}

/// Everything recovery rebuilt.
pub(crate) struct Recovered {
    pub sb: Superblock,
    pub engine: SegFitAllocator,
    pub journal: JournalState,
    pub records: BTreeMap<Vec<u8>, Vec<u8>>,
    pub report: RecoveryReport,
}

fn io_err(what: &str, e: std::io::Error) -> StoreError {
    StoreError::io(format!("while reading the {what}"), e)
}

/// Reads and picks a superblock copy. Returns it, the copy used, the
/// problems found in the other copy, and whether copy 1 still names format
/// version 1 while copy 0 names the current one (an upgrade stopped between
/// the two writes; not a problem).
pub(crate) fn read_superblock(dev: &dyn Device) -> Result<(Superblock, u8, Vec<String>, bool)> {
    if dev.len() < SUPERBLOCK_AREA {
        return Err(truncated_superblock(dev)?);
    }
    let mut buf = AlignedBuf::zeroed(SUPERBLOCK_AREA as usize);
    dev.read_at(0, buf.as_mut_slice())
        .map_err(|e| io_err("superblock", e))?;
    let pages = [
        &buf.as_slice()[..PAGE as usize],
        &buf.as_slice()[PAGE as usize..],
    ];
    let decoded = [Superblock::decode(pages[0]), Superblock::decode(pages[1])];
    let mut problems = Vec::new();
    let mut upgrade_unfinished = false;
    let (sb, copy) = match (&decoded[0], &decoded[1]) {
        (Ok(a), Ok(b)) => {
            if a.version == FORMAT_VERSION
                && b.version == FORMAT_VERSION_1
                && (Superblock {
                    version: a.version,
                    ..*b
                }) == *a
            {
                upgrade_unfinished = true;
            } else if a != b {
                problems.push(format!(
                    "{}: differs from copy 0 (copy 0 used)",
                    Structure::Superblock { copy: 1 }
                ));
            }
            (*a, 0)
        }
        (Ok(a), Err(e)) => {
            problems.push(format!("{}: {e}", Structure::Superblock { copy: 1 }));
            (*a, 0)
        }
        (Err(e), Ok(b)) => {
            problems.push(format!("{}: {e}", Structure::Superblock { copy: 0 }));
            (*b, 1)
        }
        (Err(e), Err(_)) => {
            if !Superblock::has_magic(pages[0]) && !Superblock::has_magic(pages[1]) {
                return Err(StoreError::NotFormatted {
                    device: dev.describe(),
                });
            }
            return Err(StoreError::corrupt(
                Structure::Superblock { copy: 0 },
                0,
                format!("{e}; copy 1 is damaged too"),
            ));
        }
    };
    let need = sb.layout.capacity_blocks * sb.layout.block_size;
    if dev.len() < need {
        return Err(StoreError::DeviceTooSmall {
            expected: need,
            actual: dev.len(),
        });
    }
    Ok((sb, copy, problems, upgrade_unfinished))
}

/// The error for a device too short to hold both superblock copies: when
/// copy 0 is there and valid, the device is a truncated store
/// ([`StoreError::DeviceTooSmall`]), else it is no store at all.
fn truncated_superblock(dev: &dyn Device) -> Result<StoreError> {
    if dev.len() >= PAGE {
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        dev.read_at(0, page.as_mut_slice())
            .map_err(|e| io_err("superblock", e))?;
        match Superblock::decode(page.as_slice()) {
            Ok(sb) => {
                return Ok(StoreError::DeviceTooSmall {
                    expected: sb.layout.capacity_blocks * sb.layout.block_size,
                    actual: dev.len(),
                })
            }
            Err(e) if Superblock::has_magic(page.as_slice()) => {
                return Ok(StoreError::corrupt(
                    Structure::Superblock { copy: 0 },
                    0,
                    format!(
                        "{e}; copy 1 is missing too: the device has only {} bytes (truncated)",
                        dev.len()
                    ),
                ))
            }
            Err(_) => {}
        }
    }
    Ok(StoreError::NotFormatted {
        device: dev.describe(),
    })
}

/// Reads the header page of both slots.
pub(crate) fn read_slot_headers(dev: &dyn Device, sb: &Superblock) -> Result<[SlotState; 2]> {
    let l = &sb.layout;
    let mut states = [SlotState::Empty, SlotState::Empty];
    let mut page = AlignedBuf::zeroed(PAGE as usize);
    for (i, st) in states.iter_mut().enumerate() {
        dev.read_at(l.slot_offset(i), page.as_mut_slice())
            .map_err(|e| io_err("checkpoint header", e))?;
        *st = checkpoint::decode_header(page.as_slice(), i as u32, sb.uuid, l.slot_len);
    }
    Ok(states)
}

/// Reads and decodes the free list of a slot with a valid header.
pub(crate) fn read_free_list(
    dev: &dyn Device,
    sb: &Superblock,
    h: &CheckpointHeader,
) -> Result<Result<Vec<Extent>, String>> {
    let l = &sb.layout;
    let len = h.payload_len.div_ceil(PAGE) * PAGE;
    let mut buf = AlignedBuf::zeroed(len as usize);
    dev.read_at(
        l.slot_offset(h.slot as usize) + CK_PAYLOAD_OFF,
        buf.as_mut_slice(),
    )
    .map_err(|e| io_err("checkpoint", e))?;
    let (payload, padding) = buf.as_slice().split_at(h.payload_len as usize);
    if let Some(i) = padding.iter().position(|&b| b != 0) {
        return Ok(Err(format!(
            "payload byte {} (past the payload's {} bytes) is not zero: damaged after it was \
             written",
            payload.len() + i,
            payload.len()
        )));
    }
    Ok(checkpoint::decode_free_list(payload, h, l).map_err(|e| e.0))
}

/// Reads the whole journal ring.
pub(crate) fn read_ring(dev: &dyn Device, l: &Layout) -> Result<AlignedBuf> {
    let mut ring = AlignedBuf::zeroed(l.journal_len as usize);
    dev.read_at(l.journal_offset(), ring.as_mut_slice())
        .map_err(|e| io_err("journal", e))?;
    Ok(ring)
}

/// One look at a ring position.
enum Probe {
    Found(Seen, Vec<JournalOp>),
    /// Nothing of this sequence number here (a blank or older page).
    Absent,
    /// Part of a write of it, the rest older content, all intact (format
    /// version 2 only): a write torn at a crash.
    Torn(String, Option<Seen>),
    /// Damage. Version 2: a sector of it, or possibly of it, does not
    /// check. Version 1: a damaged entry, torn or damaged later, with its
    /// header when the header is intact (it then names the expected
    /// sequence number and position; the payload is damaged).
    Damaged(String, Option<Seen>),
}

/// What a probe learned of an entry's header.
#[derive(Clone, Copy, Debug)]
struct Seen {
    pages: u32,
    txns: u32,
    payload_len: u32,
}

fn probe(ring: &[u8], sb: &Superblock, pos: u64, seq: u64) -> Probe {
    if sb.version != FORMAT_VERSION_1 {
        let seen = |h: EntryHeader| Seen {
            pages: h.pages,
            txns: h.txns,
            payload_len: h.payload_len,
        };
        return match journal::look(ring, pos, seq, &sb.uuid) {
            Look::Entry(h, ops) => Probe::Found(seen(h), ops),
            Look::Absent => Probe::Absent,
            Look::Torn { reason, header } => Probe::Torn(reason, header.map(seen)),
            Look::Damaged { reason, header } => Probe::Damaged(reason, header.map(seen)),
        };
    }
    let l = &sb.layout;
    let pages = l.journal_pages();
    let at = ((pos % pages) * PAGE) as usize;
    let page = &ring[at..at + PAGE as usize];
    if page[..4] != journal_v1::JE_MAGIC {
        return Probe::Absent;
    }
    let h = match journal_v1::decode_header(page) {
        Ok(h) => h,
        Err(e) => return Probe::Damaged(e.0, None),
    };
    if h.seq != seq || h.pos != pos || h.uuid_prefix != sb.uuid_prefix() {
        return Probe::Absent;
    }
    let seen = Seen {
        pages: h.pages,
        txns: h.txns,
        payload_len: h.payload_len,
    };
    if pos % pages + h.pages as u64 > pages {
        return Probe::Damaged(
            format!("{} pages run past the ring's end", h.pages),
            Some(seen),
        );
    }
    let off = at + journal_v1::JE_PAYLOAD_OFF;
    match journal_v1::decode_ops(&ring[off..off + h.payload_len as usize], &h) {
        Ok(ops) => Probe::Found(seen, ops),
        Err(e) => Probe::Damaged(e.0, Some(seen)),
    }
}

/// True for the close record: an entry holding one "close" operation.
fn is_close_record(ops: &[JournalOp]) -> bool {
    matches!(ops, [JournalOp::Close { .. }])
}

/// The announcement of checkpoint `start`: the entry just before its
/// replay start (one page, or several when it restates many records), with
/// its position and operations. `None` for the checkpoint `format` writes
/// (nothing precedes it), or when the entry is gone.
pub(crate) fn announcement(
    ring: &[u8],
    sb: &Superblock,
    start: &CheckpointRef,
) -> Option<(u64, Vec<JournalOp>)> {
    if start.journal_seq < 2 {
        return None;
    }
    let most = (sb.layout.journal_pages() / 4).max(1);
    for back in 1..=most.min(start.journal_pos) {
        let p = start.journal_pos - back;
        match probe(ring, sb, p, start.journal_seq - 1) {
            Probe::Found(h, ops) if p + h.pages as u64 == start.journal_pos => {
                return Some((p, ops))
            }
            _ => {}
        }
    }
    None
}

/// True when the checkpoint `start` is the final checkpoint of a clean
/// close: its announcement carries "close".
fn closes(announced: Option<&(u64, Vec<JournalOp>)>, start: &CheckpointRef) -> bool {
    announced.is_some_and(|(_, ops)| {
        ops.iter().any(|op| {
            *op == JournalOp::Close {
                slot: start.slot,
                seq: start.seq,
            }
        })
    })
}

/// True when a write of this version 1 entry can tear: a crash keeps or
/// loses each 512-byte sector on its own, so an entry whose header and
/// payload fit in its first sector is written whole or not at all.
fn can_tear(h: &Seen) -> bool {
    journal_v1::JE_PAYLOAD_OFF + h.payload_len as usize > SECTOR
}

/// The next lap start after `pos` (or `pos` itself at a lap start).
pub(crate) fn next_lap(pos: u64, pages: u64) -> u64 {
    pos.div_ceil(pages) * pages
}

/// Applies one journaled operation to the engine and the records.
fn apply(
    engine: &mut SegFitAllocator,
    records: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    l: &Layout,
    op: &JournalOp,
) -> std::result::Result<(), String> {
    match *op {
        JournalOp::Put { ref key, ref value } => {
            records.insert(key.clone(), value.clone());
        }
        JournalOp::Delete { ref key } => {
            records.remove(key);
        }
        JournalOp::Alloc(e) => {
            if e.end() > l.capacity_blocks {
                return Err(format!("allocates {e}, past the end of the device"));
            }
            let taken = engine.take_free_range(e);
            if taken != [e] {
                return Err(format!(
                    "allocates {e}, but only {} of its blocks are free",
                    taken.iter().map(|t| t.len()).sum::<u64>()
                ));
            }
        }
        JournalOp::Free(e) => {
            if e.start() < l.meta_blocks {
                return Err(format!("frees {e}, which overlaps the metadata area"));
            }
            engine.free(e).map_err(|err| format!("frees {e}: {err}"))?;
        }
        JournalOp::CheckpointBegin { .. } | JournalOp::Close { .. } => {}
    }
    Ok(())
}

/// Replays entries from `start` onto `engine`. Returns the journal position
/// after the last entry, replay counters and the last operation seen.
pub(crate) struct Replay {
    pub next_seq: u64,
    pub tail_pos: u64,
    pub entries: u64,
    pub txns: u64,
    pub allocs: u64,
    pub frees: u64,
    pub end: JournalEnd,
    /// The checkpoint announced by the last entry replayed, if it was an
    /// announcement.
    pub last_marker: Option<(u32, u64)>,
    /// Every checkpoint `(slot, seq)` announced, in journal order.
    pub markers: Vec<(u32, u64)>,
    /// Replay ended at the close record.
    pub closed: bool,
    /// The records: restated by the checkpoint's announcement, changed by
    /// the entries replayed (a later announcement restates them all).
    pub records: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Where the checkpoint's announcement starts (its replay start when
    /// it has none).
    pub announced_at: u64,
}

pub(crate) fn replay(
    ring: &[u8],
    sb: &Superblock,
    start: &CheckpointRef,
    engine: &mut SegFitAllocator,
) -> Result<Replay> {
    let l = &sb.layout;
    let pages = l.journal_pages();
    let mut r = Replay {
        next_seq: start.journal_seq,
        tail_pos: start.journal_pos,
        entries: 0,
        txns: 0,
        allocs: 0,
        frees: 0,
        end: JournalEnd::Clean,
        last_marker: None,
        markers: Vec::new(),
        closed: false,
        records: BTreeMap::new(),
        announced_at: start.journal_pos,
    };
    let announced = announcement(ring, sb, start);
    let closing = closes(announced.as_ref(), start);
    if let Some((at, ops)) = announced {
        r.announced_at = at;
        for op in ops {
            if let JournalOp::Put { key, value } = op {
                r.records.insert(key, value);
            }
        }
    }
    loop {
        let (seq, pos) = (r.next_seq, r.tail_pos);
        let mut found = None;
        let mut close_record = false;
        let mut damage = None;
        let mut torn = None;
        let lap = next_lap(pos, pages);
        let positions: &[u64] = if lap == pos { &[pos] } else { &[pos, lap] };
        for &p in positions {
            // The writer keeps every entry inside one ring's length of the
            // oldest checkpoint's start, so nothing past it can be live.
            if p + 1 > start.journal_pos + pages {
                break;
            }
            match probe(ring, sb, p, seq) {
                // The next writer's first entry may have gone to the lap
                // start, leaving the close record in place: look there too.
                Probe::Found(_, ops) if is_close_record(&ops) => close_record = true,
                Probe::Found(h, ops) => {
                    found = Some((p, h, ops));
                    break;
                }
                Probe::Damaged(why, h) => {
                    // A damaged page carrying the expected header outranks
                    // one whose header is damaged too.
                    if damage.is_none() || h.is_some() {
                        damage = Some((p, why, h));
                    }
                }
                Probe::Torn(why, h) => {
                    torn.get_or_insert((p, why, h));
                }
                Probe::Absent => {}
            }
        }
        let Some((p, h, ops)) = found else {
            let stop = Stop {
                seq,
                pos,
                close_record,
                damage,
                torn,
            };
            if sb.version == FORMAT_VERSION_1 {
                end_v1(ring, sb, start, closing, stop, &mut r)?;
            } else {
                end(ring, sb, stop, &mut r)?;
            }
            return Ok(r);
        };
        if p + h.pages as u64 > start.journal_pos + pages {
            return Err(StoreError::corrupt(
                Structure::JournalEntry { seq },
                l.journal_offset() + (p % pages) * PAGE,
                "the journal since the checkpoint is longer than the ring",
            ));
        }
        let mut marker = None;
        for op in &ops {
            apply(engine, &mut r.records, l, op).map_err(|why| {
                StoreError::corrupt(
                    Structure::JournalEntry { seq },
                    l.journal_offset() + (p % pages) * PAGE,
                    why,
                )
            })?;
            match op {
                JournalOp::Alloc(_) => r.allocs += 1,
                JournalOp::Free(_) => r.frees += 1,
                JournalOp::CheckpointBegin { slot, seq } => marker = Some((*slot, *seq)),
                JournalOp::Close { .. } | JournalOp::Put { .. } | JournalOp::Delete { .. } => {}
            }
        }
        if let Some(m) = marker {
            r.markers.push(m);
        }
        r.last_marker = marker;
        r.entries += 1;
        r.txns += h.txns as u64;
        r.next_seq = seq + 1;
        r.tail_pos = p + h.pages as u64;
    }
}

/// Where replay found no entry `seq` (expected at `pos` or the next lap
/// start), and what it found instead.
struct Stop {
    seq: u64,
    pos: u64,
    close_record: bool,
    damage: Option<(u64, String, Option<Seen>)>,
    torn: Option<(u64, String, Option<Seen>)>,
}

fn ring_byte(l: &Layout, p: u64) -> u64 {
    l.journal_offset() + (p % l.journal_pages()) * PAGE
}

/// The end of replay, format version 2: damage is an error (a sector that
/// does not check was written and then damaged; the entry it belongs to
/// may have been committed), a torn write is the write in flight at a crash.
fn end(ring: &[u8], sb: &Superblock, stop: Stop, r: &mut Replay) -> Result<()> {
    let seq = stop.seq;
    if let Some((p, why, _)) = stop.damage {
        return Err(StoreError::corrupt(
            Structure::JournalEntry { seq },
            ring_byte(&sb.layout, p),
            format!(
                "{why}: damaged after it was written (a write torn at a crash leaves every \
                 sector intact), so a committed transaction may be lost"
            ),
        ));
    }
    check_no_later_entry(ring, sb, seq, stop.pos)?;
    if let Some((_, reason, h)) = stop.torn {
        r.end = JournalEnd::Interrupted {
            reason,
            seq,
            bytes: h.map(|h| h.pages as u64 * PAGE),
        };
    } else if stop.close_record {
        r.closed = true;
    }
    Ok(())
}

/// The end of replay, format version 1: a damaged entry there may be torn or
/// damaged, and is discarded and reported as such, except where a clean
/// close proves nothing was in flight.
fn end_v1(
    ring: &[u8],
    sb: &Superblock,
    start: &CheckpointRef,
    closing: bool,
    stop: Stop,
    r: &mut Replay,
) -> Result<()> {
    let l = &sb.layout;
    let seq = stop.seq;
    // After a clean close nothing was in flight, so the first position must
    // hold the close record or the next writer's first entry.
    let first_after_close = closing && seq == start.journal_seq;
    match stop.damage {
        Some((p, why, h)) if !stop.close_record || h.is_some() => {
            if first_after_close && !h.as_ref().is_some_and(can_tear) {
                return Err(StoreError::corrupt(
                    Structure::JournalEntry { seq },
                    ring_byte(l, p),
                    format!(
                        "damaged ({why}), yet the store was closed cleanly just before it \
                         (checkpoint {} in slot {}), so no write was in flight that a \
                         crash could have torn: the journal is corrupt",
                        start.seq, start.slot
                    ),
                ));
            }
            check_no_later_entry(ring, sb, seq, p)?;
            r.end = JournalEnd::TornTail {
                reason: why,
                seq,
                bytes: h.map(|h| h.pages as u64 * PAGE),
            };
        }
        _ if stop.close_record => {
            check_no_later_entry(ring, sb, seq, stop.pos)?;
            r.closed = true;
        }
        _ => {
            if first_after_close {
                return Err(StoreError::corrupt(
                    Structure::JournalEntry { seq },
                    ring_byte(l, stop.pos),
                    format!(
                        "missing: the store was closed cleanly (checkpoint {} in slot {}) \
                         and its close record was synced before that checkpoint, but \
                         neither the close record nor a later entry is there: the \
                         journal is corrupt",
                        start.seq, start.slot
                    ),
                ));
            }
            check_no_later_entry(ring, sb, seq, stop.pos)?;
        }
    }
    Ok(())
}

/// After replay stopped expecting entry `seq`: a valid entry with a higher
/// sequence number anywhere in the ring means the stop was not the tail.
fn check_no_later_entry(ring: &[u8], sb: &Superblock, seq: u64, stop_pos: u64) -> Result<()> {
    let l = &sb.layout;
    for (i, page) in ring.chunks(PAGE as usize).enumerate() {
        let later = if sb.version == FORMAT_VERSION_1 {
            if page[..4] != journal_v1::JE_MAGIC {
                continue;
            }
            journal_v1::decode_header(page)
                .ok()
                .filter(|h| h.uuid_prefix == sb.uuid_prefix())
                .map(|h| (h.seq, h.pos))
        } else {
            journal::header_at(ring, i, &sb.uuid).map(|h| (h.seq, h.pos))
        };
        if let Some((later, at)) = later {
            if later > seq && at % l.journal_pages() == i as u64 {
                return Err(StoreError::corrupt(
                    Structure::JournalEntry { seq },
                    ring_byte(l, stop_pos),
                    format!(
                        "missing or damaged, yet entry {later} follows at byte {} of the device: \
                         not a torn tail, the journal is corrupt",
                        l.journal_offset() + i as u64 * PAGE
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Problems for the ring's sectors that do not check (format version 2),
/// outside the entries replay used (those are errors): damage to content
/// recovery does not need, reported all the same.
fn ring_damage(ring: &[u8], sb: &Superblock) -> Option<String> {
    let bad = journal::damaged_sectors(ring, &sb.uuid);
    let first = *bad.first()?;
    let l = &sb.layout;
    let byte = |s: usize| l.journal_offset() + (s * SECTOR) as u64;
    Some(format!(
        "journal ring: {} sector(s) do not check (damaged), the first at byte {} of the \
         device{}; none belongs to an entry recovery needed",
        bad.len(),
        byte(first),
        if bad.len() > 1 {
            format!(", the last at byte {}", byte(bad[bad.len() - 1]))
        } else {
            String::new()
        }
    ))
}

/// Recovers the committed state of `dev`. Reads only.
pub(crate) fn recover(dev: &dyn Device) -> Result<Recovered> {
    let t0 = Instant::now();
    let (sb, sb_copy, mut problems, upgrade_unfinished) = read_superblock(dev)?;
    let l = sb.layout;
    let states = read_slot_headers(dev, &sb)?;
    let mut slots: [SlotReport; 2] = [SlotReport::Empty, SlotReport::Empty];
    let mut candidates: Vec<CheckpointHeader> = Vec::new();
    let mut max_seq = 0;
    for (i, st) in states.iter().enumerate() {
        slots[i] = match st {
            SlotState::Empty => SlotReport::Empty,
            SlotState::Damaged(e) => SlotReport::Damaged {
                reason: e.0.clone(),
                torn_by_crash: false,
            },
            SlotState::Valid(h) => {
                candidates.push(*h);
                max_seq = max_seq.max(h.seq);
                SlotReport::Valid {
                    seq: h.seq,
                    extents: h.extents,
                    payload_bytes: h.payload_len,
                }
            }
        };
    }
    candidates.sort_by_key(|h| std::cmp::Reverse(h.seq));
    let mut chosen = None;
    let mut fell_back = false;
    for h in &candidates {
        match read_free_list(dev, &sb, h)? {
            Ok(free) => {
                chosen = Some((*h, free));
                break;
            }
            Err(why) => {
                slots[h.slot as usize] = SlotReport::Damaged {
                    reason: why,
                    torn_by_crash: false,
                };
                fell_back = true;
            }
        }
    }
    let Some((h, free)) = chosen else {
        let (slot, why) = slots
            .iter()
            .enumerate()
            .find_map(|(i, s)| match s {
                SlotReport::Damaged { reason, .. } => Some((i, reason.clone())),
                _ => None,
            })
            .unwrap_or((0, "both checkpoint slots are empty".to_string()));
        return Err(StoreError::corrupt(
            Structure::Checkpoint { slot: slot as u8 },
            l.slot_offset(slot),
            format!("{why}; no valid checkpoint in either slot"),
        ));
    };
    let mut engine = SegFitAllocator::from_free_extents(l.capacity_blocks, &free).map_err(|e| {
        StoreError::corrupt(
            Structure::Checkpoint { slot: h.slot as u8 },
            l.slot_offset(h.slot as usize),
            e,
        )
    })?;
    let start = CheckpointRef::from(&h);
    let ring = read_ring(dev, &l)?;
    let r = replay(ring.as_slice(), &sb, &start, &mut engine)?;
    // An all-zero header page reads as a never-written slot. Format writes
    // slot 0, the first checkpoint after it goes to slot 1, and slot 0 is
    // written again only after slot 1 held the newest checkpoint; so slot 0
    // is never legitimately empty, and slot 1 is not once any slot holds a
    // checkpoint past the first or the journal shows a checkpoint written
    // to it. Only the first write to slot 1, torn by a crash, leaves it
    // empty (then the last entry announces it).
    let any_past_first = candidates.iter().any(|c| c.seq > 1);
    // A close record of format version 2 follows the closing checkpoint:
    // that checkpoint was written whole, and damage to it is not a tear.
    let proven = r.closed && sb.version != FORMAT_VERSION_1;
    let torn_slot = r.last_marker.map(|m| m.0).filter(|_| !proven);
    // A checkpoint announced and later followed by an announcement to the
    // other slot was written whole: the writer moves to the other slot only
    // once a checkpoint is synced (it becomes the newest). Being followed by
    // commits proves nothing: a crash may have lost the slot write, and the
    // next writer then commits after the announcement.
    let completed: Vec<(u32, u64)> = r
        .markers
        .iter()
        .enumerate()
        .filter(|&(i, m)| {
            r.markers[i + 1..].iter().any(|n| n.0 != m.0) || (proven && i + 1 == r.markers.len())
        })
        .map(|(_, m)| *m)
        .collect();
    for (i, s) in slots.iter_mut().enumerate() {
        if *s != SlotReport::Empty || torn_slot == Some(i as u32) {
            continue;
        }
        let announced = completed
            .iter()
            .filter(|m| m.0 == i as u32)
            .map(|m| m.1)
            .max();
        let why = if let Some(seq) = announced {
            format!(
                "checkpoint {seq} was written to it (the journal announces it, then a \
                 checkpoint to the other slot)"
            )
        } else if i == 0 {
            "format writes the first checkpoint to slot 0".to_string()
        } else if any_past_first {
            "the other slot holds a later checkpoint than the first, so this slot was written"
                .to_string()
        } else {
            continue;
        };
        *s = SlotReport::Damaged {
            reason: format!("its header page is all zeros, yet {why}: the slot was wiped"),
            torn_by_crash: false,
        };
    }
    // A valid slot older than a checkpoint the journal shows was written
    // whole to it: the newer checkpoint was lost.
    for &(slot, seq) in &completed {
        if let SlotReport::Valid { seq: have, .. } = slots[slot as usize] {
            if have < seq {
                problems.push(format!(
                    "{}: holds checkpoint {have}, but checkpoint {seq} was written to it later \
                     (the journal announces it, then a checkpoint to the other slot): the \
                     newer checkpoint was lost",
                    Structure::Checkpoint { slot: slot as u8 }
                ));
            }
        }
    }
    // A damaged slot whose write the last entry announced was torn by a
    // crash; any other damage is reported as a problem.
    for (i, s) in slots.iter_mut().enumerate() {
        if let SlotReport::Damaged {
            reason,
            torn_by_crash,
        } = s
        {
            if torn_slot == Some(i as u32) {
                *torn_by_crash = true;
            } else {
                problems.push(format!(
                    "{}: {reason}",
                    Structure::Checkpoint { slot: i as u8 }
                ));
            }
        }
    }
    if sb.version != FORMAT_VERSION_1 {
        problems.extend(ring_damage(ring.as_slice(), &sb));
    }
    let keep_from = candidates
        .iter()
        .filter(|c| c.slot != h.slot && c.seq < h.seq)
        .map(|c| c.journal_pos)
        .min()
        .unwrap_or(h.journal_pos)
        // The checkpoint's announcement restates the records: kept too.
        .min(r.announced_at);
    let next_checkpoint_seq = max_seq.max(r.last_marker.map_or(0, |m| m.1)) + 1;
    let report = RecoveryReport {
        superblock_copy: sb_copy,
        checkpoint: start,
        slots,
        fell_back,
        entries: r.entries,
        txns: r.txns,
        allocs: r.allocs,
        frees: r.frees,
        journal_end: r.end.clone(),
        closed_cleanly: r.closed,
        interrupted_checkpoint_slot: r.last_marker.map(|m| m.0),
        problems,
        format_version: sb.version,
        upgrade_unfinished,
        free_extents: engine.free_extent_count(),
        elapsed: t0.elapsed(),
    };
    Ok(Recovered {
        sb,
        engine,
        journal: JournalState {
            next_seq: r.next_seq,
            tail_pos: r.tail_pos,
            newest: start,
            keep_from,
            next_checkpoint_seq,
        },
        records: r.records,
        report,
    })
}
