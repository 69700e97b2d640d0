//! The journal of format version 1, read to recover stores not yet
//! upgraded, and written only by the upgrade itself (its two checkpoint
//! announcements; see `Store::open`).
//!
//! Version 1 entries are whole pages like version 2 ones, but only the
//! header carries a checksum and the payload one more; nothing marks the
//! sectors of a page as belonging to the entry. So a header sector that
//! never reached the disk and one damaged after it did look alike, and
//! recovery of a version 1 store reports a damaged last entry as a
//! discarded tail that may have been a commit
//! ([`crate::JournalEnd::TornTail`]).
//!
//! Entry layout (the first page; the payload continues on the next pages):
//!
//! | offset | size | field                                                  |
//! |-------:|-----:|--------------------------------------------------------|
//! |      0 |    4 | magic `"BAJE"` (ASCII)                                 |
//! |      4 |    4 | pages the entry occupies (at least 1)                  |
//! |      8 |    8 | sequence number                                        |
//! |     16 |    8 | absolute page position (must equal where it was found) |
//! |     24 |    8 | first 8 bytes of the device id                         |
//! |     32 |    4 | transactions in the entry                              |
//! |     36 |    4 | payload length in bytes                                |
//! |     40 |    4 | CRC-32C of the payload                                 |
//! |     44 |    4 | CRC-32C of header bytes 0..44                          |
//! |     48 |    n | payload: operations as in version 2                    |

use super::journal::{decode_payload, JournalOp};
use super::{bad, crc, get_u32, get_u64, put_u32, put_u64, DecodeError, PAGE};
use crate::device::AlignedBuf;

/// Magic number at byte 0 of an entry.
pub const JE_MAGIC: [u8; 4] = *b"BAJE";
/// Offset of the magic number.
pub const JE_MAGIC_OFF: usize = 0;
/// Offset of the page count.
pub const JE_PAGES_OFF: usize = 4;
/// Offset of the sequence number.
pub const JE_SEQ_OFF: usize = 8;
/// Offset of the absolute page position.
pub const JE_POS_OFF: usize = 16;
/// Offset of the device id prefix.
pub const JE_UUID_OFF: usize = 24;
/// Offset of the transaction count.
pub const JE_TXNS_OFF: usize = 32;
/// Offset of the payload length.
pub const JE_PAYLOAD_LEN_OFF: usize = 36;
/// Offset of the payload checksum.
pub const JE_PAYLOAD_CRC_OFF: usize = 40;
/// Offset of the header checksum, which covers bytes `0..JE_HEADER_CRC_OFF`.
pub const JE_HEADER_CRC_OFF: usize = 44;
/// Offset of the payload (and length of the header).
pub const JE_PAYLOAD_OFF: usize = 48;

/// A decoded entry header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// Pages occupied.
    pub pages: u32,
    /// Sequence number.
    pub seq: u64,
    /// Absolute page position.
    pub pos: u64,
    /// Device id prefix.
    pub uuid_prefix: u64,
    /// Transactions in the entry.
    pub txns: u32,
    /// Payload bytes.
    pub payload_len: u32,
    /// CRC-32C of the payload.
    pub payload_crc: u32,
}

/// Pages an entry with a payload of `payload_len` bytes occupies.
pub fn pages_for(payload_len: usize) -> u64 {
    ((JE_PAYLOAD_OFF + payload_len) as u64).div_ceil(PAGE)
}

/// Builds the bytes of one entry, whole pages.
///
/// # Panics
/// When the payload exceeds `u32::MAX` bytes (the store limits entries to a
/// fraction of the ring long before).
pub fn encode_entry(seq: u64, pos: u64, uuid_prefix: u64, txns: u32, payload: &[u8]) -> AlignedBuf {
    let pages = pages_for(payload.len());
    let mut buf = AlignedBuf::zeroed((pages * PAGE) as usize);
    let b = buf.as_mut_slice();
    b[..4].copy_from_slice(&JE_MAGIC);
    put_u32(
        b,
        JE_PAGES_OFF,
        u32::try_from(pages).expect("entry pages fit u32"),
    );
    put_u64(b, JE_SEQ_OFF, seq);
    put_u64(b, JE_POS_OFF, pos);
    put_u64(b, JE_UUID_OFF, uuid_prefix);
    put_u32(b, JE_TXNS_OFF, txns);
    put_u32(
        b,
        JE_PAYLOAD_LEN_OFF,
        u32::try_from(payload.len()).expect("payload fits u32"),
    );
    put_u32(b, JE_PAYLOAD_CRC_OFF, crc(payload));
    let hc = crc(&b[..JE_HEADER_CRC_OFF]);
    put_u32(b, JE_HEADER_CRC_OFF, hc);
    b[JE_PAYLOAD_OFF..JE_PAYLOAD_OFF + payload.len()].copy_from_slice(payload);
    buf
}

/// Decodes the header at the start of `page`.
///
/// # Errors
/// Wrong magic, checksum mismatch, or a page count that cannot hold the
/// payload.
pub fn decode_header(page: &[u8]) -> Result<EntryHeader, DecodeError> {
    if page.len() < JE_PAYLOAD_OFF {
        return Err(bad("shorter than an entry header"));
    }
    if page[..4] != JE_MAGIC {
        return Err(bad("no entry magic"));
    }
    let stored = get_u32(page, JE_HEADER_CRC_OFF);
    let actual = crc(&page[..JE_HEADER_CRC_OFF]);
    if stored != actual {
        return Err(bad(format!(
            "header checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    let h = EntryHeader {
        pages: get_u32(page, JE_PAGES_OFF),
        seq: get_u64(page, JE_SEQ_OFF),
        pos: get_u64(page, JE_POS_OFF),
        uuid_prefix: get_u64(page, JE_UUID_OFF),
        txns: get_u32(page, JE_TXNS_OFF),
        payload_len: get_u32(page, JE_PAYLOAD_LEN_OFF),
        payload_crc: get_u32(page, JE_PAYLOAD_CRC_OFF),
    };
    if h.pages as u64 != pages_for(h.payload_len as usize) {
        return Err(bad(format!(
            "{} pages cannot hold a payload of {} bytes",
            h.pages, h.payload_len
        )));
    }
    Ok(h)
}

/// Checks the payload's checksum and decodes its operations.
///
/// # Errors
/// Checksum mismatch, unknown tag, malformed varint or extent.
pub fn decode_ops(payload: &[u8], h: &EntryHeader) -> Result<Vec<JournalOp>, DecodeError> {
    if payload.len() != h.payload_len as usize {
        return Err(bad("payload length differs from the header"));
    }
    let actual = crc(payload);
    if actual != h.payload_crc {
        return Err(bad(format!(
            "payload checksum mismatch (stored {:#010x}, computed {actual:#010x})",
            h.payload_crc
        )));
    }
    decode_payload(payload)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::journal::{OP_ALLOC, OP_CHECKPOINT, OP_CLOSE, OP_FREE};
    use blockalloc::Extent;

    fn ops() -> Vec<JournalOp> {
        vec![
            JournalOp::Alloc(Extent::new(100, 5).unwrap()),
            JournalOp::Free(Extent::new(1 << 40, 1 << 20).unwrap()),
            JournalOp::CheckpointBegin { slot: 1, seq: 77 },
            JournalOp::Close { slot: 1, seq: 77 },
        ]
    }

    fn payload(ops: &[JournalOp]) -> Vec<u8> {
        let mut p = Vec::new();
        for op in ops {
            op.encode(&mut p);
        }
        p
    }

    #[test]
    fn round_trip_every_field() {
        let p = payload(&ops());
        let buf = encode_entry(42, 1000, 0xdead_beef, 3, &p);
        assert_eq!(buf.len(), 4096);
        let h = decode_header(buf.as_slice()).unwrap();
        assert_eq!(
            (
                h.pages,
                h.seq,
                h.pos,
                h.uuid_prefix,
                h.txns,
                h.payload_len as usize
            ),
            (1, 42, 1000, 0xdead_beef, 3, p.len())
        );
        let body = &buf.as_slice()[JE_PAYLOAD_OFF..JE_PAYLOAD_OFF + p.len()];
        assert_eq!(decode_ops(body, &h).unwrap(), ops());
    }

    #[test]
    fn multi_page_entries() {
        let many: Vec<_> = (0..2000)
            .map(|i| JournalOp::Alloc(Extent::new(i * 1000, 7).unwrap()))
            .collect();
        let p = payload(&many);
        let buf = encode_entry(1, 0, 0, 2000, &p);
        assert_eq!(buf.len() as u64, pages_for(p.len()) * 4096);
        assert!(buf.len() > 4096);
        let h = decode_header(buf.as_slice()).unwrap();
        assert_eq!(h.pages as usize * 4096, buf.len());
        let body = &buf.as_slice()[JE_PAYLOAD_OFF..JE_PAYLOAD_OFF + p.len()];
        assert_eq!(decode_ops(body, &h).unwrap(), many);
        assert_eq!(pages_for(0), 1);
        assert_eq!(pages_for(4096 - 48), 1);
        assert_eq!(pages_for(4096 - 47), 2);
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let p = payload(&ops());
        let buf = encode_entry(42, 1000, 9, 3, &p);
        for byte in 0..JE_PAYLOAD_OFF + p.len() {
            for bit in 0..8 {
                let mut b = buf.as_slice().to_vec();
                b[byte] ^= 1 << bit;
                let ok = decode_header(&b).and_then(|h| {
                    let end = JE_PAYLOAD_OFF + h.payload_len as usize;
                    let body = b.get(JE_PAYLOAD_OFF..end).ok_or_else(|| bad("short"))?;
                    decode_ops(body, &h)
                });
                assert!(ok.is_err(), "flip {byte}.{bit}");
            }
        }
    }

    #[test]
    fn refuses_bad_payloads_with_good_checksums() {
        let check = |p: Vec<u8>, want: &str| {
            let buf = encode_entry(1, 0, 0, 1, &p);
            let h = decode_header(buf.as_slice()).unwrap();
            let e = decode_ops(&p, &h).unwrap_err();
            assert!(e.0.contains(want), "{e}");
        };
        check(vec![9, 1, 1], "unknown operation tag 9");
        check(vec![7, 1, 1], "unknown operation tag 7");
        check(vec![OP_ALLOC, 1, 0], "zero-length");
        check(vec![OP_CHECKPOINT, 2, 1], "slot 2");
        check(vec![OP_CLOSE, 3, 1], "slot 3");
        check(vec![OP_FREE, 0x80], "truncated");
        assert!(decode_header(&[0u8; 4096]).unwrap_err().0.contains("magic"));
    }
}
