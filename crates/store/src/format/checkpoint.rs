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
//! |     12 |    4 | flags: bit 0 set = chunked payload, clear = list payload;      |
//! |        |      | every other bit 0 (readers refuse unknown bits)                |
//! |     16 |   16 | device id (the superblock's)                                   |
//! |     32 |    8 | checkpoint sequence number (1, 2, …; higher is newer)          |
//! |     40 |    8 | journal sequence number of the first entry to replay           |
//! |     48 |    8 | journal position (absolute page number) of that entry          |
//! |     56 |    8 | free extents (maximal) in the payload                          |
//! |     64 |    8 | free blocks in the payload                                     |
//! |     72 |    8 | payload length in bytes                                        |
//! |     80 |    4 | CRC-32C of the payload                                         |
//! |     84 |    4 | CRC-32C of header bytes 0..84                                  |
//! |     88 | 4008 | zero                                                           |
//! |   4096 |    n | payload, in the encoding the flags name ([`free_space`]):      |
//! |        |      | list: per free extent in address order, two LEB128 varints,    |
//! |        |      | the gap from the end of the previous extent (from block 0 for  |
//! |        |      | the first), then the length in blocks; chunked: one record per |
//! |        |      | chunk of 32768 blocks, an extent list or a bitmap              |
//!
//! Extents are maximal (no two touch, so every gap after the first is at
//! least 1) and lie in `[meta_blocks, capacity)`.
//!
//! The writer uses the smaller encoding, so a payload never exceeds
//! [`free_space::max_payload_len`] (one bit per block plus one byte per
//! chunk), and [`max_len`] — a header page plus that bound — is what a slot
//! needs to hold a checkpoint of *any* free space. Slots sized by
//! [`Layout::plan`] always are; a slot smaller than that (formatted by an
//! earlier version, whose rule was one byte per 64 blocks) works until
//! neither encoding fits, and then the checkpoint is refused as
//! [`TooLarge`] with nothing written.
//!
//! [`free_space`]: super::free_space

use blockalloc::Extent;

use super::free_space::{self, Encoding};
use super::{bad, crc, get_u32, get_u64, put_u32, put_u64, DecodeError, Layout, PAGE};
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
/// Flag bit: the payload is in the chunked encoding (clear: the list).
pub const CK_FLAG_CHUNKED: u32 = 1;

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
    /// How the payload encodes the free list.
    pub encoding: Encoding,
    /// Free extents listed.
    pub extents: u64,
    /// Free blocks listed.
    pub free_blocks: u64,
    /// Payload bytes.
    pub payload_len: u64,
    /// CRC-32C of the payload.
    pub payload_crc: u32,
}

/// Which checkpoint a slot is about to hold: everything of the header but
/// the payload's description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Slot index, 0 or 1.
    pub slot: u32,
    /// Device id.
    pub uuid: [u8; 16],
    /// Checkpoint sequence number.
    pub seq: u64,
    /// First journal entry to replay.
    pub journal_seq: u64,
    /// Absolute journal page of that entry.
    pub journal_pos: u64,
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

/// A free list that does not fit its slot in either encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// Bytes the checkpoint needs (header page included).
    pub needed: u64,
    /// Bytes the slot has.
    pub available: u64,
}

/// Bytes a slot needs to hold a checkpoint of any free space of a device of
/// `capacity_blocks` blocks: the header page and
/// [`free_space::max_payload_len`], rounded up to whole pages.
pub fn max_len(capacity_blocks: u64) -> u64 {
    CK_PAYLOAD_OFF + free_space::max_payload_len(capacity_blocks).div_ceil(PAGE) * PAGE
}

/// Builds the bytes of a whole checkpoint of `free` (address order, maximal
/// extents inside the data area) for `stamp.slot`: header page + payload in
/// the smaller encoding, padded to whole pages.
///
/// # Errors
/// [`TooLarge`] when neither encoding fits `layout.slot_len` (never for a
/// slot of at least [`max_len`]).
pub fn encode(stamp: &Stamp, free: &[Extent], layout: &Layout) -> Result<AlignedBuf, TooLarge> {
    let sizes = free_space::measure(free, layout.capacity_blocks);
    encode_sized(stamp, free, layout, &sizes, sizes.best())
}

/// As [`encode`], in a given encoding.
///
/// # Errors
/// [`TooLarge`] when that encoding does not fit `layout.slot_len`.
pub fn encode_as(
    stamp: &Stamp,
    free: &[Extent],
    layout: &Layout,
    encoding: Encoding,
) -> Result<AlignedBuf, TooLarge> {
    let sizes = free_space::measure(free, layout.capacity_blocks);
    encode_sized(stamp, free, layout, &sizes, encoding)
}

fn encode_sized(
    stamp: &Stamp,
    free: &[Extent],
    layout: &Layout,
    sizes: &free_space::Sizes,
    encoding: Encoding,
) -> Result<AlignedBuf, TooLarge> {
    let payload_len = sizes.len(encoding);
    let needed = CK_PAYLOAD_OFF + payload_len.div_ceil(PAGE) * PAGE;
    if needed > layout.slot_len {
        return Err(TooLarge {
            needed,
            available: layout.slot_len,
        });
    }
    // Only the bytes the content needs: a nearly empty device's checkpoint
    // is two pages whatever the slot's size.
    let mut buf = AlignedBuf::zeroed(needed as usize);
    let b = buf.as_mut_slice();
    let (head, rest) = b.split_at_mut(CK_PAYLOAD_OFF as usize);
    let payload = &mut rest[..payload_len as usize];
    free_space::write(free, layout.capacity_blocks, encoding, payload);
    let flags = match encoding {
        Encoding::List => 0,
        Encoding::Chunked => CK_FLAG_CHUNKED,
    };
    head[CK_MAGIC_OFF..CK_MAGIC_OFF + 8].copy_from_slice(&CK_MAGIC);
    put_u32(head, CK_SLOT_OFF, stamp.slot);
    put_u32(head, CK_FLAGS_OFF, flags);
    head[CK_UUID_OFF..CK_UUID_OFF + 16].copy_from_slice(&stamp.uuid);
    put_u64(head, CK_SEQ_OFF, stamp.seq);
    put_u64(head, CK_JOURNAL_SEQ_OFF, stamp.journal_seq);
    put_u64(head, CK_JOURNAL_POS_OFF, stamp.journal_pos);
    put_u64(head, CK_EXTENTS_OFF, sizes.extents);
    put_u64(head, CK_FREE_BLOCKS_OFF, sizes.free_blocks);
    put_u64(head, CK_PAYLOAD_LEN_OFF, payload_len);
    put_u32(head, CK_PAYLOAD_CRC_OFF, crc(payload));
    let hc = crc(&head[..CK_HEADER_CRC_OFF]);
    put_u32(head, CK_HEADER_CRC_OFF, hc);
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
    if let Some(i) = page[CK_HEADER_LEN..].iter().position(|&b| b != 0) {
        return Err(bad(format!(
            "header page byte {} is not zero: damaged after it was written",
            CK_HEADER_LEN + i
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
    if flags & !CK_FLAG_CHUNKED != 0 {
        return Err(bad(format!(
            "unknown flags {:#x} (written by a newer version?)",
            flags & !CK_FLAG_CHUNKED
        )));
    }
    let encoding = if flags & CK_FLAG_CHUNKED != 0 {
        Encoding::Chunked
    } else {
        Encoding::List
    };
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
        encoding,
        extents: get_u64(page, CK_EXTENTS_OFF),
        free_blocks: get_u64(page, CK_FREE_BLOCKS_OFF),
        payload_len,
        payload_crc: get_u32(page, CK_PAYLOAD_CRC_OFF),
    })
}

/// Decodes and validates a payload against its header and the layout.
///
/// # Errors
/// Checksum mismatch, a malformed payload ([`free_space::decode`]): varints,
/// chunk records, extents that are empty, touch, overlap, reach into the
/// metadata area or past the device; or counts that disagree with the
/// header.
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
    let out = free_space::decode(payload, h.encoding, layout, h.extents)?;
    let blocks: u64 = out.iter().map(|e| e.len()).sum();
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
    use crate::format::put_varint;
    use proptest::prelude::*;

    const UUID: [u8; 16] = [7; 16];

    fn layout() -> Layout {
        Layout::plan(1 << 30, 4096, None, None).unwrap()
    }

    /// 512-byte blocks, 64 MiB: 131072 blocks in four chunks.
    fn small_layout() -> Layout {
        Layout::plan(64 << 20, 512, None, None).unwrap()
    }

    fn stamp(slot: u32, seq: u64, journal_seq: u64, journal_pos: u64) -> Stamp {
        Stamp {
            slot,
            uuid: UUID,
            seq,
            journal_seq,
            journal_pos,
        }
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

    /// Chunk 0 sparse (a list record), chunk 1 shattered to one free block
    /// in two (a bitmap record), the rest one long extent.
    fn mixed(l: &Layout) -> Vec<Extent> {
        let c = free_space::CHUNK_BLOCKS;
        let mut v = vec![
            Extent::new(l.meta_blocks + 3, 7).unwrap(),
            Extent::new(c - 100, 50).unwrap(),
        ];
        v.extend((c..2 * c).step_by(2).map(|b| Extent::new(b, 1).unwrap()));
        v.push(Extent::from_range(2 * c + 1, l.capacity_blocks).unwrap());
        v
    }

    fn build(l: &Layout) -> AlignedBuf {
        encode(&stamp(1, 9, 100, 12345), &free(l), l).unwrap()
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
        assert_eq!(h.encoding, Encoding::List);
        assert_eq!(get_u32(buf.as_slice(), CK_FLAGS_OFF), 0);
        assert_eq!(decode_free_list(&payload, &h, &l).unwrap(), free(&l));
        assert_eq!(&buf.as_slice()[..8], b"BACKPT01");
        assert_eq!(buf.len() % 4096, 0);
    }

    #[test]
    fn the_list_form_keeps_its_bytes() {
        // The list payload is what every earlier version wrote.
        let l = layout();
        let (_, payload) = split(build(&l).as_slice(), &l);
        let mut want = Vec::new();
        let mut prev = 0;
        for e in free(&l) {
            put_varint(&mut want, e.start() - prev);
            put_varint(&mut want, e.len());
            prev = e.end();
        }
        assert_eq!(payload, want);
    }

    #[test]
    fn empty_list_and_empty_slot() {
        let l = layout();
        let buf = encode(&stamp(0, 1, 1, 0), &[], &l).unwrap();
        assert_eq!(buf.len(), 4096);
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
    fn a_checkpoint_of_a_huge_device_is_as_small_as_its_content() {
        // 16 TiB: slots of 512 MiB + 132 KiB, a nearly empty device's
        // checkpoint is two pages.
        let l = Layout::plan(16 << 40, 4096, None, None).unwrap();
        let free = [
            Extent::new(l.meta_blocks, 1000).unwrap(),
            Extent::from_range(l.meta_blocks + 2000, l.capacity_blocks).unwrap(),
        ];
        let buf = encode(&stamp(0, 1, 1, 0), &free, &l).unwrap();
        assert_eq!(buf.len(), 2 * 4096);
        assert_eq!(l.slot_len, max_len(l.capacity_blocks));
    }

    fn assert_every_bit_flip_is_detected(buf: &AlignedBuf, l: &Layout) {
        let (h0, _) = split(buf.as_slice(), l);
        let used = 4096 + h0.payload_len as usize;
        for byte in (0..CK_HEADER_LEN).chain(4096..used) {
            for bit in 0..8 {
                let mut b = buf.as_slice().to_vec();
                b[byte] ^= 1 << bit;
                match decode_header(&b[..4096], 1, UUID, l.slot_len) {
                    SlotState::Valid(h) => {
                        let p = &b[4096..4096 + h.payload_len as usize];
                        assert!(decode_free_list(p, &h, l).is_err(), "flip {byte}.{bit}");
                    }
                    SlotState::Damaged(_) => {}
                    SlotState::Empty => panic!("flip {byte}.{bit} reads as empty"),
                }
            }
        }
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let l = layout();
        assert_every_bit_flip_is_detected(&build(&l), &l);
    }

    #[test]
    fn every_bit_flip_of_a_chunked_checkpoint_is_detected() {
        let l = small_layout();
        let buf = encode(&stamp(1, 9, 100, 12345), &mixed(&l), &l).unwrap();
        let (h, payload) = split(buf.as_slice(), &l);
        assert_eq!(h.encoding, Encoding::Chunked);
        assert_eq!(get_u32(buf.as_slice(), CK_FLAGS_OFF), CK_FLAG_CHUNKED);
        // Both record kinds are present.
        assert_eq!(payload[0], free_space::CHUNK_LIST);
        assert!(payload.contains(&free_space::CHUNK_BITMAP));
        assert_eq!(decode_free_list(&payload, &h, &l).unwrap(), mixed(&l));
        assert_every_bit_flip_is_detected(&buf, &l);
    }

    #[test]
    fn refuses_unknown_flags_with_a_good_checksum() {
        let l = layout();
        let mut b = build(&l).as_slice().to_vec();
        put_u32(&mut b, CK_FLAGS_OFF, 2);
        let c = crc(&b[..CK_HEADER_CRC_OFF]);
        put_u32(&mut b, CK_HEADER_CRC_OFF, c);
        assert!(
            matches!(decode_header(&b[..4096], 1, UUID, l.slot_len), SlotState::Damaged(e) if e.0.contains("unknown flags 0x2"))
        );
        // The chunked flag on a list payload: the payload does not decode.
        put_u32(&mut b, CK_FLAGS_OFF, CK_FLAG_CHUNKED);
        let c = crc(&b[..CK_HEADER_CRC_OFF]);
        put_u32(&mut b, CK_HEADER_CRC_OFF, c);
        let (h, p) = split(&b, &l);
        assert_eq!(h.encoding, Encoding::Chunked);
        assert!(decode_free_list(&p, &h, &l).is_err());
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
        // A slot of 64 KiB on 4 GiB (2^20 blocks, as an earlier version
        // sized it): sixteen shattered chunks need 16 bitmaps, more than it
        // holds in either encoding.
        let big = Layout {
            slot_len: 64 << 10,
            ..Layout::plan(4 << 30, 4096, None, None).unwrap()
        };
        let shattered: Vec<_> = (big.meta_blocks | 1..16 * free_space::CHUNK_BLOCKS)
            .step_by(2)
            .map(|b| Extent::new(b, 1).unwrap())
            .collect();
        let e = encode(&stamp(0, 1, 1, 0), &shattered, &big).err().unwrap();
        assert_eq!(e.available, 64 << 10);
        assert_eq!(e.needed, 4096 + 17 * 4096);
        assert!(encode(&stamp(0, 1, 1, 0), &free(&big), &big).is_ok());
        // The slot planned for that device holds it.
        let planned = Layout::plan(4 << 30, 4096, None, None).unwrap();
        assert!(encode(&stamp(0, 1, 1, 0), &shattered, &planned).is_ok());
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
                encoding: Encoding::List,
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

    #[test]
    fn the_slot_bound_covers_the_worst_free_space() {
        // One free block in two over the whole data area, both parities.
        let l = small_layout();
        for first in [l.meta_blocks, l.meta_blocks + 1] {
            let worst: Vec<_> = (first..l.capacity_blocks)
                .step_by(2)
                .map(|b| Extent::new(b, 1).unwrap())
                .collect();
            let buf = encode(&stamp(0, 1, 1, 0), &worst, &l).unwrap();
            assert!(buf.len() as u64 <= max_len(l.capacity_blocks));
            let (h, p) = {
                let SlotState::Valid(h) =
                    decode_header(&buf.as_slice()[..4096], 0, UUID, l.slot_len)
                else {
                    panic!()
                };
                (
                    h,
                    buf.as_slice()[4096..4096 + h.payload_len as usize].to_vec(),
                )
            };
            assert_eq!(decode_free_list(&p, &h, &l).unwrap(), worst);
        }
        assert!(l.slot_len >= max_len(l.capacity_blocks));
    }

    /// Free sets mixing long runs and shattered stretches (runs of short
    /// gaps and lengths, long enough to make bitmap records pay): `(gap,
    /// len)` pairs from the data area's start, cut at the device's end.
    fn free_sets(l: Layout) -> impl Strategy<Value = Vec<Extent>> {
        let long = (1u64..20_000, 1u64..40_000).prop_map(|p| vec![p]);
        let shattered = proptest::collection::vec((1u64..4, 1u64..4), 1..20_000);
        let segment = prop_oneof![long, shattered];
        proptest::collection::vec(segment, 0..8).prop_map(move |segments| {
            let mut out = Vec::new();
            let mut at = l.meta_blocks;
            for (i, (gap, len)) in segments.into_iter().flatten().enumerate() {
                let start = if i == 0 { at + gap - 1 } else { at + gap };
                let end = (start + len).min(l.capacity_blocks);
                if start >= end {
                    break;
                }
                out.push(Extent::from_range(start, end).unwrap());
                at = end;
            }
            out
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn any_free_set_round_trips_in_both_encodings(free in free_sets(small_layout())) {
            let l = small_layout();
            let sizes = free_space::measure(&free, l.capacity_blocks);
            for enc in [Encoding::List, Encoding::Chunked] {
                let Ok(buf) = encode_as(&stamp(1, 3, 4, 5), &free, &l, enc) else {
                    // Only the list can outgrow the slot.
                    prop_assert_eq!(enc, Encoding::List);
                    continue;
                };
                let (h, p) = split(buf.as_slice(), &l);
                prop_assert_eq!(h.encoding, enc);
                prop_assert_eq!(h.payload_len, sizes.len(enc));
                prop_assert_eq!(decode_free_list(&p, &h, &l).unwrap(), free.clone());
            }
            // The writer's choice is the smaller one, within the bound.
            let buf = encode(&stamp(1, 3, 4, 5), &free, &l).unwrap();
            let (h, _) = split(buf.as_slice(), &l);
            prop_assert_eq!(h.payload_len, sizes.list.min(sizes.chunked));
            prop_assert_eq!(h.encoding, sizes.best());
            prop_assert!(h.payload_len <= free_space::max_payload_len(l.capacity_blocks));
        }
    }
}
