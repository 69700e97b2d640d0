//! The write-ahead journal: a ring of 4096-byte pages holding entries.
//!
//! One entry is written per group commit: every transaction of the group,
//! as a list of operations. An entry occupies whole pages and is never
//! rewritten, so a torn write can only damage the entry being written,
//! never a committed one.
//!
//! Positions are **absolute page numbers** that only grow; the page in the
//! ring is `pos % ring_pages`. Entry sequence numbers grow by one per entry,
//! from 1. An entry never wraps around the ring's end: when it does not fit
//! before the end, it starts at the next lap (the next multiple of
//! `ring_pages`). The reader, expecting entry `s` at position `p`, therefore
//! looks at `p` and, if no valid entry `s` is there, at the next lap start.
//!
//! **Every 512-byte sector is stamped.** Each sector of every ring page
//! holds 500 bytes of data, then the **stamp**, the sequence number of the
//! entry whose write filled it (0 for a blank sector written by `format` or
//! an upgrade), then a CRC-32C of the device id and the sector's first 508
//! bytes. A crash keeps or loses each sector of an unsynced write whole, so
//! every sector of the ring always checks: a torn write leaves sectors
//! stamped by the new entry beside sectors of older content, all valid. A
//! sector that does not check was damaged after it was written. This is
//! what tells a write torn at a crash (discarded: it was never
//! acknowledged) from a committed entry damaged later (an error), whatever
//! subset of a write's sectors reached the disk ([`look`]).
//!
//! An entry's data — the 500-byte data parts of its sectors, in order — is:
//!
//! | offset | size | field                                                  |
//! |-------:|-----:|--------------------------------------------------------|
//! |      0 |    4 | magic `"BAJ2"` (ASCII; version 1 entries have `"BAJE"`) |
//! |      4 |    4 | pages the entry occupies (at least 1)                  |
//! |      8 |    8 | sequence number                                        |
//! |     16 |    8 | absolute page position (must equal where it was found) |
//! |     24 |    4 | transactions in the entry                              |
//! |     28 |    4 | payload length in bytes                                |
//! |     32 |    4 | entry checksum (below)                                 |
//! |     36 |    n | payload: operations, each a tag byte and varints       |
//!
//! The rest of the data is zero. The entry checksum is the CRC-32C of the
//! first sector's data without these 4 bytes, then of the checksums of the
//! entry's other sectors, in order (each covers its whole sector, padding
//! included). Two writes of the same sequence number at the same page (an
//! entry torn at a crash, discarded, and written again by the next writer)
//! can mix their sectors at a second crash; only this checksum tells that
//! mix from an entry.
//!
//! Operations (LEB128 varints):
//!
//! | tag | operation          | then                                        |
//! |----:|--------------------|---------------------------------------------|
//! |   1 | allocate           | start block, length in blocks               |
//! |   2 | free               | start block, length in blocks               |
//! |   3 | checkpoint begins  | slot index, checkpoint sequence number      |
//! |   4 | close              | slot index, checkpoint sequence number      |
//! |   5 | put record         | key length, key, value length, value        |
//! |   6 | delete record      | key length, key                             |
//!
//! Records are the store's small key-value table for its user (the service
//! keeps its leases, request results and owner epoch there): a transaction
//! puts and deletes them atomically with its allocations. A checkpoint
//! announcement restates the whole table, as one "put record" per record
//! after its "checkpoint begins": recovery reads the table from the
//! announcement just before the checkpoint's replay start, then replays the
//! records' changes with the allocations.
//!
//! "Checkpoint begins" is written and synced before a checkpoint slot is
//! overwritten: a damaged slot whose write it announces, with no entry after
//! it, is a checkpoint torn by a crash, not corruption.
//!
//! "Close" names the final checkpoint of a clean close. It appears twice:
//! in that checkpoint's announcement (after "checkpoint begins"), and alone
//! in the **close record**, a one-page entry of one operation written and
//! synced after the checkpoint itself, at the position and sequence number
//! where the next entry goes. The next writer's first entry takes the same
//! sequence number and (unless it must start at the next lap) the same page.
//! While the close record stands, nothing was written after the clean close;
//! and since it follows the checkpoint, that checkpoint was written whole.

use blockalloc::Extent;

use super::{bad, get_u32, get_u64, get_varint, put_u32, put_u64, put_varint, DecodeError, PAGE};
use crate::device::{AlignedBuf, SECTOR};

/// Bytes of data in each 512-byte sector.
pub const SECTOR_DATA: usize = 500;
/// Offset in a sector of its stamp: the sequence number of the entry whose
/// write filled it, or [`BLANK_STAMP`].
pub const SECTOR_STAMP_OFF: usize = 500;
/// Offset in a sector of its checksum: CRC-32C of the device id followed by
/// the sector's bytes `0..SECTOR_CRC_OFF`.
pub const SECTOR_CRC_OFF: usize = 508;
/// The stamp of a sector that belongs to no entry (written by `format` or by
/// an upgrade).
pub const BLANK_STAMP: u64 = 0;
/// Sectors in a page.
pub const SECTORS_PER_PAGE: usize = PAGE as usize / SECTOR;
/// Bytes of entry data in one page.
pub const PAGE_DATA: usize = SECTORS_PER_PAGE * SECTOR_DATA;

/// Magic number at byte 0 of an entry's data.
pub const JE_MAGIC: [u8; 4] = *b"BAJ2";
/// Offset of the magic number.
pub const JE_MAGIC_OFF: usize = 0;
/// Offset of the page count.
pub const JE_PAGES_OFF: usize = 4;
/// Offset of the sequence number.
pub const JE_SEQ_OFF: usize = 8;
/// Offset of the absolute page position.
pub const JE_POS_OFF: usize = 16;
/// Offset of the transaction count.
pub const JE_TXNS_OFF: usize = 24;
/// Offset of the payload length.
pub const JE_PAYLOAD_LEN_OFF: usize = 28;
/// Offset of the entry checksum.
pub const JE_CRC_OFF: usize = 32;
/// Offset of the payload (and length of the header).
pub const JE_PAYLOAD_OFF: usize = 36;

/// Tag of an allocation.
pub const OP_ALLOC: u8 = 1;
/// Tag of a free.
pub const OP_FREE: u8 = 2;
/// Tag of a checkpoint announcement.
pub const OP_CHECKPOINT: u8 = 3;
/// Tag of a clean close.
pub const OP_CLOSE: u8 = 4;
/// Tag of a record put.
pub const OP_PUT: u8 = 5;
/// Tag of a record delete.
pub const OP_DELETE: u8 = 6;
/// The longest record key, in bytes.
pub const MAX_KEY: usize = 255;

/// One journaled operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalOp {
    /// These blocks became allocated.
    Alloc(Extent),
    /// These blocks became free.
    Free(Extent),
    /// A checkpoint with this sequence number is about to be written to
    /// this slot.
    CheckpointBegin {
        /// Slot index.
        slot: u32,
        /// Checkpoint sequence number.
        seq: u64,
    },
    /// The store closes cleanly; this checkpoint is its final one.
    Close {
        /// Slot index of the final checkpoint.
        slot: u32,
        /// Its sequence number.
        seq: u64,
    },
    /// A record was set (added or replaced).
    Put {
        /// Its key (1 to [`MAX_KEY`] bytes).
        key: Vec<u8>,
        /// Its value.
        value: Vec<u8>,
    },
    /// A record was deleted.
    Delete {
        /// Its key.
        key: Vec<u8>,
    },
}

impl JournalOp {
    /// Appends the operation's encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            JournalOp::Alloc(e) | JournalOp::Free(e) => {
                out.push(if matches!(self, JournalOp::Alloc(_)) {
                    OP_ALLOC
                } else {
                    OP_FREE
                });
                put_varint(out, e.start());
                put_varint(out, e.len());
            }
            JournalOp::CheckpointBegin { slot, seq } | JournalOp::Close { slot, seq } => {
                out.push(if matches!(self, JournalOp::Close { .. }) {
                    OP_CLOSE
                } else {
                    OP_CHECKPOINT
                });
                put_varint(out, slot as u64);
                put_varint(out, seq);
            }
            JournalOp::Put { ref key, ref value } => encode_put(out, key, value),
            JournalOp::Delete { ref key } => {
                out.push(OP_DELETE);
                put_varint(out, key.len() as u64);
                out.extend_from_slice(key);
            }
        }
    }

    /// Bytes of a put's encoding ([`encode_put`]).
    pub fn put_len(key: &[u8], value: &[u8]) -> usize {
        1 + varint_len(key.len() as u64) + key.len() + varint_len(value.len() as u64) + value.len()
    }
}

/// Appends the encoding of a put of `key` and `value` (as
/// [`JournalOp::Put`] encodes, without owning them).
pub fn encode_put(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.push(OP_PUT);
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// A decoded entry header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// Pages occupied.
    pub pages: u32,
    /// Sequence number.
    pub seq: u64,
    /// Absolute page position.
    pub pos: u64,
    /// Transactions in the entry.
    pub txns: u32,
    /// Payload bytes.
    pub payload_len: u32,
}

/// Pages an entry with a payload of `payload_len` bytes occupies.
pub fn pages_for(payload_len: usize) -> u64 {
    ((JE_PAYLOAD_OFF + payload_len) as u64).div_ceil(PAGE_DATA as u64)
}

/// The largest payload an entry of `pages` pages holds.
pub fn max_payload(pages: u64) -> usize {
    pages as usize * PAGE_DATA - JE_PAYLOAD_OFF
}

/// The checksum of a sector: CRC-32C of the device id (`seed`, its CRC)
/// followed by the sector's bytes `0..SECTOR_CRC_OFF`.
fn sector_crc(sector: &[u8], seed: u32) -> u32 {
    crc32c::crc32c_append(seed, &sector[..SECTOR_CRC_OFF])
}

/// Writes `stamp` and the checksum into one 512-byte sector whose data part
/// is filled. Returns the checksum.
fn seal(sector: &mut [u8], stamp: u64, seed: u32) -> u32 {
    put_u64(sector, SECTOR_STAMP_OFF, stamp);
    let c = sector_crc(sector, seed);
    put_u32(sector, SECTOR_CRC_OFF, c);
    c
}

/// The stamp of a sector, or `None` when it does not check.
fn stamp_of(sector: &[u8], seed: u32) -> Option<u64> {
    let stored = get_u32(sector, SECTOR_CRC_OFF);
    // An all-zero sector never checks, whatever the device id's CRC.
    if stored != sector_crc(sector, seed) || (stored == 0 && sector.iter().all(|&b| b == 0)) {
        return None;
    }
    Some(get_u64(sector, SECTOR_STAMP_OFF))
}

/// The stamp of a 512-byte sector, or `None` when the sector does not check
/// (damaged: no write of a whole sector leaves that). An all-zero sector
/// never checks.
pub fn sector_stamp(sector: &[u8], uuid: &[u8; 16]) -> Option<u64> {
    stamp_of(sector, crc32c::crc32c(uuid))
}

/// `pages` blank pages: every sector stamped [`BLANK_STAMP`], data zero.
pub fn blank_pages(pages: usize, uuid: &[u8; 16]) -> AlignedBuf {
    let mut one = [0u8; SECTOR];
    seal(&mut one, BLANK_STAMP, crc32c::crc32c(uuid));
    let mut buf = AlignedBuf::zeroed(pages * PAGE as usize);
    for s in buf.as_mut_slice().chunks_mut(SECTOR) {
        s.copy_from_slice(&one);
    }
    buf
}

/// The entry checksum: CRC-32C of the first sector's data without the
/// checksum field, then of the checksums of the entry's other sectors, in
/// order (each of which covers its sector): any sector from another write
/// changes it.
fn entry_crc(first: &[u8], others: impl Iterator<Item = u32>) -> u32 {
    let mut c = crc32c::crc32c(&first[..JE_CRC_OFF]);
    c = crc32c::crc32c_append(c, &first[JE_PAYLOAD_OFF..SECTOR_DATA]);
    for o in others {
        c = crc32c::crc32c_append(c, &o.to_le_bytes());
    }
    c
}

/// Builds the bytes of one entry, whole pages, every sector stamped with
/// `seq`.
///
/// # Panics
/// When the payload exceeds `u32::MAX` bytes (the store limits entries to a
/// fraction of the ring long before).
pub fn encode_entry(seq: u64, pos: u64, uuid: &[u8; 16], txns: u32, payload: &[u8]) -> AlignedBuf {
    let pages = pages_for(payload.len());
    let mut buf = AlignedBuf::zeroed((pages * PAGE) as usize);
    let seed = crc32c::crc32c(uuid);
    let b = buf.as_mut_slice();
    let (first, rest) = b.split_at_mut(SECTOR);
    first[..4].copy_from_slice(&JE_MAGIC);
    put_u32(
        first,
        JE_PAGES_OFF,
        u32::try_from(pages).expect("entry pages fit u32"),
    );
    put_u64(first, JE_SEQ_OFF, seq);
    put_u64(first, JE_POS_OFF, pos);
    put_u32(first, JE_TXNS_OFF, txns);
    put_u32(
        first,
        JE_PAYLOAD_LEN_OFF,
        u32::try_from(payload.len()).expect("payload fits u32"),
    );
    let head = payload.len().min(SECTOR_DATA - JE_PAYLOAD_OFF);
    first[JE_PAYLOAD_OFF..JE_PAYLOAD_OFF + head].copy_from_slice(&payload[..head]);
    let mut parts = payload[head..].chunks(SECTOR_DATA);
    let mut crcs = Vec::with_capacity(rest.len() / SECTOR);
    for sector in rest.chunks_mut(SECTOR) {
        if let Some(part) = parts.next() {
            sector[..part.len()].copy_from_slice(part);
        }
        crcs.push(seal(sector, seq, seed));
    }
    let c = entry_crc(first, crcs.into_iter());
    put_u32(first, JE_CRC_OFF, c);
    seal(first, seq, seed);
    buf
}

/// What a ring position holds for the entry expected there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look {
    /// The entry, whole.
    Entry(EntryHeader, Vec<JournalOp>),
    /// Nothing of it: no sector of the page was written by it.
    Absent,
    /// Its write did not complete: some of its sectors hold it, others
    /// older content, every one intact. A crash tore it; it was never
    /// acknowledged.
    Torn {
        /// What shows it.
        reason: String,
        /// Its header, when the header sector landed.
        header: Option<EntryHeader>,
    },
    /// A sector that belongs to it, or may, does not check: written, then
    /// damaged.
    Damaged {
        /// What is damaged.
        reason: String,
        /// Its header, when the header sector is intact.
        header: Option<EntryHeader>,
    },
}

/// Looks for entry `seq` at absolute position `pos` of `ring` (the whole
/// ring, `ring.len() / PAGE` pages).
pub fn look(ring: &[u8], pos: u64, seq: u64, uuid: &[u8; 16]) -> Look {
    let seed = crc32c::crc32c(uuid);
    let ring_pages = ring.len() as u64 / PAGE;
    let first = (pos % ring_pages) as usize * PAGE as usize;
    let page = &ring[first..first + PAGE as usize];
    let head = stamp_of(&page[..SECTOR], seed);
    // Whether the page's other sectors all check and none carries `seq`,
    // or the first that carries it.
    let others = || page[SECTOR..].chunks(SECTOR).map(|s| stamp_of(s, seed));
    match head {
        None => {
            // The header sector is damaged. Had entry `seq` been written
            // here whole, every sector of the page would carry its stamp:
            // when the others are intact and none does, only older content
            // was damaged (reported by the ring scan, not here).
            if others().all(|s| s.is_some_and(|t| t != seq)) {
                return Look::Absent;
            }
            return Look::Damaged {
                reason: format!(
                    "its header sector does not check (sector 0 of page {pos}), while {}",
                    if others().any(|s| s == Some(seq)) {
                        "other sectors of the page carry its stamp: it was written"
                    } else {
                        "other sectors of the page are damaged too"
                    }
                ),
                header: None,
            };
        }
        Some(t) if t != seq => {
            return match others().position(|s| s == Some(seq)) {
                Some(k) => Look::Torn {
                    reason: format!(
                        "sector {} of page {pos} carries its stamp but its header sector holds \
                         older content: the write did not complete",
                        k + 1
                    ),
                    header: None,
                },
                None => Look::Absent,
            };
        }
        Some(_) => {}
    }
    let damaged = |reason: String, header| Look::Damaged { reason, header };
    let d = &page[..SECTOR_DATA];
    if d[..4] != JE_MAGIC || get_u64(d, JE_SEQ_OFF) != seq || get_u64(d, JE_POS_OFF) != pos {
        return damaged(
            format!("its header sector checks but does not name entry {seq} at page {pos}"),
            None,
        );
    }
    let h = EntryHeader {
        pages: get_u32(d, JE_PAGES_OFF),
        seq,
        pos,
        txns: get_u32(d, JE_TXNS_OFF),
        payload_len: get_u32(d, JE_PAYLOAD_LEN_OFF),
    };
    if h.pages == 0 || h.pages as u64 != pages_for(h.payload_len as usize) {
        return damaged(
            format!(
                "{} pages cannot hold a payload of {} bytes",
                h.pages, h.payload_len
            ),
            None,
        );
    }
    if (pos % ring_pages) + h.pages as u64 > ring_pages {
        return damaged(
            format!("{} pages run past the ring's end", h.pages),
            Some(h),
        );
    }
    let bytes = &ring[first..first + h.pages as usize * PAGE as usize];
    let mut older = None;
    for (k, s) in bytes.chunks(SECTOR).enumerate().skip(1) {
        match stamp_of(s, seed) {
            None => {
                return damaged(
                    format!("sector {k} of its {} pages does not check", h.pages),
                    Some(h),
                )
            }
            Some(t) if t != seq && older.is_none() => older = Some(k),
            Some(_) => {}
        }
    }
    if let Some(k) = older {
        return Look::Torn {
            reason: format!(
                "sector {k} of its {} pages holds older content: the write did not complete",
                h.pages
            ),
            header: Some(h),
        };
    }
    let crcs = bytes[SECTOR..]
        .chunks(SECTOR)
        .map(|s| get_u32(s, SECTOR_CRC_OFF));
    if entry_crc(d, crcs) != get_u32(d, JE_CRC_OFF) {
        return Look::Torn {
            reason: "its sectors come from two writes of this entry: the second did not complete"
                .into(),
            header: Some(h),
        };
    }
    let len = h.payload_len as usize;
    let decoded = if JE_PAYLOAD_OFF + len <= SECTOR_DATA {
        decode_payload(&d[JE_PAYLOAD_OFF..JE_PAYLOAD_OFF + len])
    } else {
        let mut payload = Vec::with_capacity(len);
        payload.extend_from_slice(&d[JE_PAYLOAD_OFF..]);
        for s in bytes[SECTOR..].chunks(SECTOR) {
            let want = (len - payload.len()).min(SECTOR_DATA);
            payload.extend_from_slice(&s[..want]);
            if payload.len() == len {
                break;
            }
        }
        decode_payload(&payload)
    };
    match decoded {
        Ok(ops) => Look::Entry(h, ops),
        Err(e) => damaged(format!("its payload: {e}"), Some(h)),
    }
}

/// The header of a valid entry starting at ring page `index` (any sequence
/// number), for the scan that proves the journal has no entry after a
/// stop. Only the header sector is checked.
pub fn header_at(ring: &[u8], index: usize, uuid: &[u8; 16]) -> Option<EntryHeader> {
    let s = &ring[index * PAGE as usize..index * PAGE as usize + SECTOR];
    let stamp = sector_stamp(s, uuid)?;
    let d = &s[..SECTOR_DATA];
    (stamp != BLANK_STAMP && d[..4] == JE_MAGIC && get_u64(d, JE_SEQ_OFF) == stamp).then(|| {
        EntryHeader {
            pages: get_u32(d, JE_PAGES_OFF),
            seq: stamp,
            pos: get_u64(d, JE_POS_OFF),
            txns: get_u32(d, JE_TXNS_OFF),
            payload_len: get_u32(d, JE_PAYLOAD_LEN_OFF),
        }
    })
}

/// Indexes of the ring's sectors that do not check.
pub fn damaged_sectors(ring: &[u8], uuid: &[u8; 16]) -> Vec<usize> {
    let seed = crc32c::crc32c(uuid);
    ring.chunks(SECTOR)
        .enumerate()
        .filter(|(_, s)| stamp_of(s, seed).is_none())
        .map(|(i, _)| i)
        .collect()
}

/// Decodes a payload's operations (the same in every format version).
///
/// # Errors
/// Unknown tag, malformed varint or extent.
pub fn decode_payload(payload: &[u8]) -> Result<Vec<JournalOp>, DecodeError> {
    let mut ops = Vec::new();
    let mut pos = 0;
    while pos < payload.len() {
        let tag = payload[pos];
        pos += 1;
        if tag == OP_PUT || tag == OP_DELETE {
            let mut bytes = |what: &str, max: usize| {
                let n = get_varint(payload, &mut pos)?;
                let n = usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= max && n <= payload.len() - pos)
                    .ok_or_else(|| {
                        bad(format!("operation {}: a {what} of {n} bytes", ops.len()))
                    })?;
                pos += n;
                Ok::<_, DecodeError>(payload[pos - n..pos].to_vec())
            };
            let key = bytes("key", MAX_KEY)?;
            if key.is_empty() {
                return Err(bad(format!("operation {}: an empty key", ops.len())));
            }
            ops.push(if tag == OP_PUT {
                JournalOp::Put {
                    key,
                    value: bytes("value", usize::MAX)?,
                }
            } else {
                JournalOp::Delete { key }
            });
            continue;
        }
        let a = get_varint(payload, &mut pos)?;
        let b = get_varint(payload, &mut pos)?;
        let extent =
            |a, b| Extent::new(a, b).map_err(|e| bad(format!("operation {}: {e}", ops.len())));
        let slot = |a: u64| {
            u32::try_from(a)
                .ok()
                .filter(|&s| s < 2)
                .ok_or_else(|| bad(format!("checkpoint slot {a} is not 0 or 1")))
        };
        ops.push(match tag {
            OP_ALLOC => JournalOp::Alloc(extent(a, b)?),
            OP_FREE => JournalOp::Free(extent(a, b)?),
            OP_CHECKPOINT => JournalOp::CheckpointBegin {
                slot: slot(a)?,
                seq: b,
            },
            OP_CLOSE => JournalOp::Close {
                slot: slot(a)?,
                seq: b,
            },
            t => {
                return Err(bad(format!(
                    "unknown operation tag {t} at payload byte {}",
                    pos - 1
                )))
            }
        });
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = *b"0123456789abcdef";
    const RING: u64 = 16;

    fn ops() -> Vec<JournalOp> {
        vec![
            JournalOp::Alloc(Extent::new(100, 5).unwrap()),
            JournalOp::Free(Extent::new(1 << 40, 1 << 20).unwrap()),
            JournalOp::CheckpointBegin { slot: 1, seq: 77 },
            JournalOp::Close { slot: 1, seq: 77 },
            JournalOp::Put {
                key: b"lease".to_vec(),
                value: vec![0xab; 300],
            },
            JournalOp::Put {
                key: vec![0; MAX_KEY],
                value: Vec::new(),
            },
            JournalOp::Delete {
                key: b"lease".to_vec(),
            },
        ]
    }

    fn payload(ops: &[JournalOp]) -> Vec<u8> {
        let mut p = Vec::new();
        for op in ops {
            op.encode(&mut p);
        }
        p
    }

    /// A blank ring with `entry` written at absolute position `pos`.
    fn ring_with(entry: &AlignedBuf, pos: u64) -> Vec<u8> {
        let mut ring = blank_pages(RING as usize, &UUID).as_slice().to_vec();
        let at = ((pos % RING) * PAGE) as usize;
        ring[at..at + entry.len()].copy_from_slice(entry.as_slice());
        ring
    }

    fn many() -> Vec<JournalOp> {
        (0..900)
            .map(|i| JournalOp::Alloc(Extent::new(i * 1000, 7).unwrap()))
            .collect()
    }

    #[test]
    fn round_trip_every_field_one_page_and_many() {
        for ops in [ops(), many()] {
            let p = payload(&ops);
            let buf = encode_entry(42, 35, &UUID, 3, &p);
            assert_eq!(buf.len() as u64, pages_for(p.len()) * PAGE);
            let ring = ring_with(&buf, 35);
            let Look::Entry(h, got) = look(&ring, 35, 42, &UUID) else {
                panic!("not found")
            };
            assert_eq!(
                (h.pages as u64, h.seq, h.pos, h.txns, h.payload_len as usize),
                (pages_for(p.len()), 42, 35, 3, p.len())
            );
            assert_eq!(got, ops);
            assert_eq!(header_at(&ring, 3, &UUID), Some(h));
            assert!(damaged_sectors(&ring, &UUID).is_empty());
        }
        assert_eq!(pages_for(0), 1);
        assert_eq!(pages_for(PAGE_DATA - JE_PAYLOAD_OFF), 1);
        assert_eq!(pages_for(PAGE_DATA - JE_PAYLOAD_OFF + 1), 2);
        assert_eq!(max_payload(2), 2 * PAGE_DATA - JE_PAYLOAD_OFF);
    }

    #[test]
    fn blank_and_older_pages_hold_no_entry() {
        let ring = blank_pages(RING as usize, &UUID).as_slice().to_vec();
        assert_eq!(look(&ring, 3, 1, &UUID), Look::Absent);
        assert_eq!(header_at(&ring, 3, &UUID), None);
        let ring = ring_with(&encode_entry(5, 3, &UUID, 1, &payload(&ops())), 3);
        assert_eq!(look(&ring, 3, 9, &UUID), Look::Absent);
        // Another device's entry does not check here.
        let other = ring_with(&encode_entry(9, 3, b"fedcba9876543210", 1, &[]), 3);
        assert!(matches!(look(&other, 3, 9, &UUID), Look::Damaged { .. }));
    }

    /// Every single-bit flip and every sector wipe of a written entry is
    /// damage, never a torn write and never "no entry".
    #[test]
    fn every_bit_flip_and_sector_wipe_is_damage() {
        for ops in [ops(), many()] {
            let buf = encode_entry(42, 35, &UUID, 3, &payload(&ops));
            let ring = ring_with(&buf, 35);
            let at = (3 * PAGE) as usize;
            let mut cases = Vec::new();
            for byte in (0..buf.len()).step_by(if ops.len() > 4 { 61 } else { 1 }) {
                for bit in [0, 7] {
                    let mut r = ring.clone();
                    r[at + byte] ^= 1 << bit;
                    cases.push((format!("flip {byte}.{bit}"), r));
                }
            }
            for s in 0..buf.len() / SECTOR {
                let mut r = ring.clone();
                r[at + s * SECTOR..at + (s + 1) * SECTOR].fill(0);
                cases.push((format!("wipe sector {s}"), r));
            }
            for (what, r) in cases {
                assert!(
                    matches!(look(&r, 35, 42, &UUID), Look::Damaged { .. }),
                    "{what}: {:?}",
                    look(&r, 35, 42, &UUID)
                );
            }
        }
    }

    /// Whatever subset of an entry's sectors lands over older content, the
    /// result is the entry (all landed), absent (none), or torn — never
    /// damage.
    #[test]
    fn every_subset_of_landed_sectors_is_torn_not_damage() {
        let old = ring_with(&encode_entry(7, 3, &UUID, 1, &payload(&many())), 3);
        let new = encode_entry(42, 35, &UUID, 3, &payload(&ops()));
        let at = (3 * PAGE) as usize;
        for mask in 0u32..256 {
            let mut r = old.clone();
            for s in 0..8 {
                if mask & (1 << s) != 0 {
                    r[at + s * SECTOR..at + (s + 1) * SECTOR]
                        .copy_from_slice(&new.as_slice()[s * SECTOR..(s + 1) * SECTOR]);
                }
            }
            let got = look(&r, 35, 42, &UUID);
            match mask {
                0 => assert_eq!(got, Look::Absent),
                255 => assert!(matches!(got, Look::Entry(..)), "{got:?}"),
                _ => assert!(matches!(got, Look::Torn { .. }), "mask {mask:#x}: {got:?}"),
            }
        }
        // Two writes of the same entry mixed: torn too.
        let a = encode_entry(42, 35, &UUID, 1, &payload(&many()[1..]));
        let mut r = ring_with(&encode_entry(42, 35, &UUID, 3, &payload(&many())), 35);
        r[at + SECTOR..at + 2 * SECTOR].copy_from_slice(&a.as_slice()[SECTOR..2 * SECTOR]);
        assert!(matches!(look(&r, 35, 42, &UUID), Look::Torn { .. }));
    }

    #[test]
    fn put_len_is_the_encoded_length() {
        for (k, v) in [(1, 0), (127, 127), (128, 128), (255, 20_000)] {
            let (key, value) = (vec![1u8; k], vec![2u8; v]);
            let mut out = Vec::new();
            JournalOp::Put {
                key: key.clone(),
                value: value.clone(),
            }
            .encode(&mut out);
            assert_eq!(JournalOp::put_len(&key, &value), out.len(), "{k} {v}");
        }
    }

    #[test]
    fn refuses_bad_payloads_with_good_checksums() {
        let check = |p: Vec<u8>, want: &str| {
            let ring = ring_with(&encode_entry(1, 0, &UUID, 1, &p), 0);
            let Look::Damaged { reason, .. } = look(&ring, 0, 1, &UUID) else {
                panic!("accepted {p:?}")
            };
            assert!(reason.contains(want), "{reason}");
        };
        check(vec![9, 1, 1], "unknown operation tag 9");
        check(vec![7, 1, 1], "unknown operation tag 7");
        check(vec![OP_PUT, 0, 0], "an empty key");
        check(vec![OP_DELETE, 0], "an empty key");
        check(vec![OP_PUT, 2, b'k'], "a key of 2 bytes");
        check(vec![OP_PUT, 1, b'k', 3, 1], "a value of 3 bytes");
        let mut long = vec![OP_PUT, 0x80, 0x02];
        long.extend([1u8; 256]);
        long.push(0);
        check(long, "a key of 256 bytes");
        check(vec![OP_ALLOC, 1, 0], "zero-length");
        check(vec![OP_CHECKPOINT, 2, 1], "slot 2");
        check(vec![OP_CLOSE, 3, 1], "slot 3");
        check(vec![OP_FREE, 0x80], "truncated");
        assert_eq!(sector_stamp(&[0u8; SECTOR], &UUID), None);
    }
}
