//! Checkpoints: the free list of the committed state, in one of two slots.
//!
//! A checkpoint says "after journal entry `journal_seq - 1`, exactly these
//! extents were free". Checkpoints alternate between the two slots, so the
//! one being written never overwrites the newest valid one; recovery takes
//! the valid slot with the highest sequence number and replays the journal
//! from its `journal_seq`.
//!
//! A slot is a header page followed by the payload:
//!
//! | offset | size | field                                                          |
//! |-------:|-----:|----------------------------------------------------------------|
//! |      0 |    8 | magic `"BACKPT01"` (ASCII)                                     |
//! |      8 |    4 | slot index (0 or 1): a slot's copy elsewhere is refused        |
//! |     12 |    4 | flags (0)                                                      |
//! |     16 |   16 | device id (the superblock's)                                   |
//! |     32 |    8 | checkpoint sequence number (1, 2, …; higher is newer)          |
//! |     40 |    8 | journal sequence number of the first entry to replay           |
//! |     48 |    8 | journal position (absolute page number) of that entry          |
//! |     56 |    8 | free extents in the payload                                    |
//! |     64 |    8 | free blocks in the payload                                     |
//! |     72 |    8 | payload length in bytes                                        |
//! |     80 |    4 | CRC-32C of the payload                                         |
//! |     84 |    4 | CRC-32C of header bytes 0..84                                  |
//! |     88 | 4008 | zero                                                           |
//! |   4096 |    n | payload: per free extent in address order, two LEB128 varints: |
//! |        |      | the gap from the end of the previous extent (from block 0 for  |
//! |        |      | the first), then the length in blocks                          |
//!
//! Extents are maximal (no two touch, so every gap after the first is at
//! least 1) and lie in `[meta_blocks, capacity)`.

use blockalloc::Extent;

use super::{
    bad, crc, get_u32, get_u64, get_varint, put_u32, put_u64, put_varint, DecodeError, Layout, PAGE,
};
use crate::device::AlignedBuf;

/// Magic number at byte 0 of a checkpoint slot.
pub const CK_MAGIC: [u8; 8] = *b"BACKPT01";
/// Offset of the magic number.
pub const CK_MAGIC_OFF: usize = 0;
/// Offset of the slot index.
pub const CK_SLOT_OFF: usize = 8;
/// Offset of the flags.
pub const CK_FLAGS_OFF: usize = 12;
/// Offset of the device id.
pub const CK_UUID_OFF: usize = 16;
/// Offset of the checkpoint sequence number.
pub const CK_SEQ_OFF: usize = 32;
/// Offset of the first journal sequence number to replay.
pub const CK_JOURNAL_SEQ_OFF: usize = 40;
/// Offset of the journal position of that entry.
pub const CK_JOURNAL_POS_OFF: usize = 48;
/// Offset of the free extent count.
pub const CK_EXTENTS_OFF: usize = 56;
/// Offset of the free block count.
pub const CK_FREE_BLOCKS_OFF: usize = 64;
/// Offset of the payload length.
pub const CK_PAYLOAD_LEN_OFF: usize = 72;
/// Offset of the payload checksum.
pub const CK_PAYLOAD_CRC_OFF: usize = 80;
/// Offset of the header checksum, which covers bytes `0..CK_HEADER_CRC_OFF`.
pub const CK_HEADER_CRC_OFF: usize = 84;
/// Bytes of the header that carry information.
pub const CK_HEADER_LEN: usize = 88;
/// Offset of the payload from the start of the slot.
pub const CK_PAYLOAD_OFF: u64 = PAGE;

/// A decoded checkpoint header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    /// Slot index, 0 or 1.
    pub slot: u32,
    /// Device id.
    pub uuid: [u8; 16],
    /// Checkpoint sequence number (higher is newer).
    pub seq: u64,
    /// First journal entry to replay.
    pub journal_seq: u64,
    /// Absolute journal page of that entry.
    pub journal_pos: u64,
    /// Free extents listed.
    pub extents: u64,
    /// Free blocks listed.
    pub free_blocks: u64,
    /// Payload bytes.
    pub payload_len: u64,
    /// CRC-32C of the payload.
    pub payload_crc: u32,
}

/// What one slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// All zeros: never written since format.
    Empty,
    /// A valid header (the payload is checked when read).
    Valid(CheckpointHeader),
    /// Not a valid header: why.
    Damaged(DecodeError),
}

/// A free list that does not fit its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// Bytes the checkpoint needs (header page included).
    pub needed: u64,
    /// Bytes the slot has.
    pub available: u64,
}

/// Encodes a free list (address order, maximal extents) as a payload.
/// Returns the payload, the extent count and the free block count.
pub fn encode_free_list(free: impl IntoIterator<Item = Extent>) -> (Vec<u8>, u64, u64) {
    let mut out = Vec::new();
    let (mut prev_end, mut count, mut blocks) = (0u64, 0u64, 0u64);
    for e in free {
        debug_assert!(e.start() >= prev_end && (count == 0 || e.start() > prev_end));
        put_varint(&mut out, e.start() - prev_end);
        put_varint(&mut out, e.len());
        prev_end = e.end();
        count += 1;
        blocks += e.len();
    }
    (out, count, blocks)
}

/// Builds the bytes of a whole checkpoint (header page + payload, padded to
/// whole pages) for slot `slot`.
///
/// # Errors
/// [`TooLarge`] when it does not fit in a slot of `slot_len` bytes.
#[allow(clippy::too_many_arguments)]
pub fn encode(
    slot: u32,
    uuid: [u8; 16],
    seq: u64,
    journal_seq: u64,
    journal_pos: u64,
    payload: &[u8],
    extents: u64,
    free_blocks: u64,
    slot_len: u64,
) -> Result<AlignedBuf, TooLarge> {
    let needed = CK_PAYLOAD_OFF + (payload.len() as u64).div_ceil(PAGE) * PAGE;
    if needed > slot_len {
        return Err(TooLarge {
            needed,
            available: slot_len,
        });
    }
    let mut buf = AlignedBuf::zeroed(needed as usize);
    let b = buf.as_mut_slice();
    b[CK_MAGIC_OFF..CK_MAGIC_OFF + 8].copy_from_slice(&CK_MAGIC);
    put_u32(b, CK_SLOT_OFF, slot);
    put_u32(b, CK_FLAGS_OFF, 0);
    b[CK_UUID_OFF..CK_UUID_OFF + 16].copy_from_slice(&uuid);
    put_u64(b, CK_SEQ_OFF, seq);
    put_u64(b, CK_JOURNAL_SEQ_OFF, journal_seq);
    put_u64(b, CK_JOURNAL_POS_OFF, journal_pos);
    put_u64(b, CK_EXTENTS_OFF, extents);
    put_u64(b, CK_FREE_BLOCKS_OFF, free_blocks);
    put_u64(b, CK_PAYLOAD_LEN_OFF, payload.len() as u64);
    put_u32(b, CK_PAYLOAD_CRC_OFF, crc(payload));
    let hc = crc(&b[..CK_HEADER_CRC_OFF]);
    put_u32(b, CK_HEADER_CRC_OFF, hc);
    let p = CK_PAYLOAD_OFF as usize;
    b[p..p + payload.len()].copy_from_slice(payload);
    Ok(buf)
}

/// Decodes the header page of slot `slot`.
pub fn decode_header(page: &[u8], slot: u32, uuid: [u8; 16], slot_len: u64) -> SlotState {
    if page.iter().all(|&b| b == 0) {
        return SlotState::Empty;
    }
    match decode_header_inner(page, slot, uuid, slot_len) {
        Ok(h) => SlotState::Valid(h),
        Err(e) => SlotState::Damaged(e),
    }
}

fn decode_header_inner(
    page: &[u8],
    slot: u32,
    uuid: [u8; 16],
    slot_len: u64,
) -> Result<CheckpointHeader, DecodeError> {
    if page.len() < CK_HEADER_LEN {
        return Err(bad("shorter than a checkpoint header"));
    }
    if page[..8] != CK_MAGIC {
        return Err(bad("no checkpoint magic"));
    }
    let stored = get_u32(page, CK_HEADER_CRC_OFF);
    let actual = crc(&page[..CK_HEADER_CRC_OFF]);
    if stored != actual {
        return Err(bad(format!(
            "header checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    if page[CK_UUID_OFF..CK_UUID_OFF + 16] != uuid {
        return Err(bad(
            "written for another format of this device (device id differs)",
        ));
    }
    let s = get_u32(page, CK_SLOT_OFF);
    if s != slot {
        return Err(bad(format!("header says slot {s}, found in slot {slot}")));
    }
    let flags = get_u32(page, CK_FLAGS_OFF);
    if flags != 0 {
        return Err(bad(format!("unknown flags {flags:#x}")));
    }
    let payload_len = get_u64(page, CK_PAYLOAD_LEN_OFF);
    if payload_len > slot_len - CK_PAYLOAD_OFF {
        return Err(bad(format!(
            "payload length {payload_len} exceeds the slot ({} bytes)",
            slot_len - CK_PAYLOAD_OFF
        )));
    }
    let seq = get_u64(page, CK_SEQ_OFF);
    if seq == 0 {
        return Err(bad("sequence number 0"));
    }
    Ok(CheckpointHeader {
        slot,
        uuid,
        seq,
        journal_seq: get_u64(page, CK_JOURNAL_SEQ_OFF),
        journal_pos: get_u64(page, CK_JOURNAL_POS_OFF),
        extents: get_u64(page, CK_EXTENTS_OFF),
        free_blocks: get_u64(page, CK_FREE_BLOCKS_OFF),
        payload_len,
        payload_crc: get_u32(page, CK_PAYLOAD_CRC_OFF),
    })
}

/// Decodes and validates a payload against its header and the layout.
///
/// # Errors
/// Checksum mismatch, malformed varints, extents that are empty, touch,
/// overlap, reach into the metadata area or past the device, or counts that
/// disagree with the header.
pub fn decode_free_list(
    payload: &[u8],
    h: &CheckpointHeader,
    layout: &Layout,
) -> Result<Vec<Extent>, DecodeError> {
    if payload.len() as u64 != h.payload_len {
        return Err(bad("payload length differs from the header"));
    }
    let actual = crc(payload);
    if actual != h.payload_crc {
        return Err(bad(format!(
            "payload checksum mismatch (stored {:#010x}, computed {actual:#010x})",
            h.payload_crc
        )));
    }
    let mut out = Vec::with_capacity(h.extents.min(payload.len() as u64 / 2) as usize);
    let (mut pos, mut prev_end, mut blocks) = (0usize, 0u64, 0u64);
    while pos < payload.len() {
        let gap = get_varint(payload, &mut pos)?;
        let len = get_varint(payload, &mut pos)?;
        let i = out.len();
        if i > 0 && gap == 0 {
            return Err(bad(format!(
                "free extent {i} touches the previous one (they should have been merged)"
            )));
        }
        let start = prev_end
            .checked_add(gap)
            .ok_or_else(|| bad(format!("free extent {i} starts past block 2^64")))?;
        let e = Extent::new(start, len).map_err(|err| bad(format!("free extent {i}: {err}")))?;
        if e.start() < layout.meta_blocks || e.end() > layout.capacity_blocks {
            return Err(bad(format!(
                "free {e} lies outside the data area (blocks {}..{})",
                layout.meta_blocks, layout.capacity_blocks
            )));
        }
        blocks += len;
        prev_end = e.end();
        out.push(e);
    }
    if out.len() as u64 != h.extents || blocks != h.free_blocks {
        return Err(bad(format!(
            "payload lists {} extents / {blocks} blocks, header says {} / {}",
            out.len(),
            h.extents,
            h.free_blocks
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [7; 16];

    fn layout() -> Layout {
        Layout::plan(1 << 30, 4096, None, None).unwrap()
    }

    fn free(l: &Layout) -> Vec<Extent> {
        let m = l.meta_blocks;
        vec![
            Extent::new(m, 10).unwrap(),
            Extent::new(m + 11, 1).unwrap(),
            Extent::new(m + 1000, 200_000).unwrap(),
            Extent::new(l.capacity_blocks - 1, 1).unwrap(),
        ]
    }

    fn build(l: &Layout) -> AlignedBuf {
        let (p, n, b) = encode_free_list(free(l));
        encode(1, UUID, 9, 100, 12345, &p, n, b, l.slot_len).unwrap()
    }

    fn split(buf: &[u8], l: &Layout) -> (CheckpointHeader, Vec<u8>) {
        let SlotState::Valid(h) = decode_header(&buf[..4096], 1, UUID, l.slot_len) else {
            panic!("not valid");
        };
        (h, buf[4096..4096 + h.payload_len as usize].to_vec())
    }

    #[test]
    fn round_trip_every_field() {
        let l = layout();
        let buf = build(&l);
        let (h, payload) = split(buf.as_slice(), &l);
        assert_eq!(
            (
                h.slot,
                h.uuid,
                h.seq,
                h.journal_seq,
                h.journal_pos,
                h.extents
            ),
            (1, UUID, 9, 100, 12345, 4)
        );
        assert_eq!(h.free_blocks, 10 + 1 + 200_000 + 1);
        assert_eq!(decode_free_list(&payload, &h, &l).unwrap(), free(&l));
        assert_eq!(&buf.as_slice()[..8], b"BACKPT01");
        assert_eq!(buf.len() % 4096, 0);
    }

    #[test]
    fn empty_list_and_empty_slot() {
        let l = layout();
        let (p, n, b) = encode_free_list(std::iter::empty());
        let buf = encode(0, UUID, 1, 1, 0, &p, n, b, l.slot_len).unwrap();
        let SlotState::Valid(h) = decode_header(&buf.as_slice()[..4096], 0, UUID, l.slot_len)
        else {
            panic!()
        };
        assert!(decode_free_list(&[], &h, &l).unwrap().is_empty());
        assert_eq!(
            decode_header(&[0u8; 4096], 0, UUID, l.slot_len),
            SlotState::Empty
        );
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let l = layout();
        let buf = build(&l);
        let (h0, _) = split(buf.as_slice(), &l);
        let used = 4096 + h0.payload_len as usize;
        for byte in (0..CK_HEADER_LEN).chain(4096..used) {
            for bit in 0..8 {
                let mut b = buf.as_slice().to_vec();
                b[byte] ^= 1 << bit;
                match decode_header(&b[..4096], 1, UUID, l.slot_len) {
                    SlotState::Valid(h) => {
                        let p = &b[4096..4096 + h.payload_len as usize];
                        assert!(decode_free_list(p, &h, &l).is_err(), "flip {byte}.{bit}");
                    }
                    SlotState::Damaged(_) => {}
                    SlotState::Empty => panic!("flip {byte}.{bit} reads as empty"),
                }
            }
        }
    }

    #[test]
    fn refuses_wrong_slot_uuid_and_oversize() {
        let l = layout();
        let buf = build(&l);
        let page = &buf.as_slice()[..4096];
        assert!(
            matches!(decode_header(page, 0, UUID, l.slot_len), SlotState::Damaged(e) if e.0.contains("slot"))
        );
        assert!(
            matches!(decode_header(page, 1, [0; 16], l.slot_len), SlotState::Damaged(e) if e.0.contains("device id"))
        );
        let (p, n, b) = encode_free_list(free(&l));
        let big = vec![0u8; 70_000];
        let e = encode(0, UUID, 1, 1, 0, &big, n, b, 64 << 10)
            .err()
            .unwrap();
        assert_eq!(e.available, 64 << 10);
        assert!(e.needed > e.available);
        assert!(encode(0, UUID, 1, 1, 0, &p, n, b, l.slot_len).is_ok());
    }

    #[test]
    fn refuses_bad_lists_with_good_checksums() {
        let l = layout();
        let m = l.meta_blocks;
        let check = |raw: &[(u64, u64)], want: &str| {
            let mut p = Vec::new();
            for &(g, n) in raw {
                put_varint(&mut p, g);
                put_varint(&mut p, n);
            }
            let h = CheckpointHeader {
                slot: 0,
                uuid: UUID,
                seq: 1,
                journal_seq: 1,
                journal_pos: 0,
                extents: raw.len() as u64,
                free_blocks: raw.iter().map(|r| r.1).sum(),
                payload_len: p.len() as u64,
                payload_crc: crc(&p),
            };
            let e = decode_free_list(&p, &h, &l).unwrap_err();
            assert!(e.0.contains(want), "{raw:?}: {e}");
        };
        check(&[(m, 5), (0, 5)], "touches");
        check(&[(m, 0)], "zero-length");
        check(&[(0, 5)], "outside the data area");
        check(&[(m, l.capacity_blocks)], "outside the data area");
        check(&[(m, 1), (u64::MAX, 1)], "2^64");
    }
}
