//! The on-disk format: layout of the metadata area, and encode/decode of each
//! structure as pure functions over byte slices (no I/O here).
//!
//! Everything is little-endian and checksummed with CRC-32C (Castagnoli).
//! `docs/design.md`, section "On-disk format", documents every byte; the
//! named offset constants in [`superblock`], [`checkpoint`] and [`journal`]
//! are the same table in code.
//!
//! ```text
//! offset 0          4096        8192               8192+S             8192+2S            8192+2S+J
//!        | superblock | superblock | checkpoint slot 0 | checkpoint slot 1 | journal ring ... |  data blocks
//!        |  copy 0    |  copy 1    |  (S bytes)        |  (S bytes)        |  (J bytes)       |
//! ```
//!
//! The metadata area `[0, 8192 + 2S + J)`, rounded up to whole blocks, is
//! reserved: it counts as allocated, so the engine never hands it out.

pub mod checkpoint;
pub mod free_space;
pub mod journal;
pub mod journal_v1;
pub mod superblock;

use std::fmt;

pub use checkpoint::CheckpointHeader;
pub use free_space::Encoding;
pub use journal::{EntryHeader, JournalOp};
pub use superblock::Superblock;

/// Metadata page size: every structure starts on a page boundary and every
/// metadata write is whole pages. Equal to [`crate::device::IO_ALIGN`].
pub const PAGE: u64 = 4096;

/// Format version written by this code: journal pages whose every 512-byte
/// sector carries a stamp and a checksum ([`journal`]).
pub const FORMAT_VERSION: u32 = 2;

/// The first format version: journal entries without per-sector stamps
/// ([`journal_v1`]). Read as it is; a writable open upgrades it.
pub const FORMAT_VERSION_1: u32 = 1;

/// Why bytes read from the device are not a valid structure. The store wraps
/// it with the structure's name and location ([`crate::StoreError::Corrupt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> DecodeError {
    DecodeError(msg.into())
}

/// CRC-32C of `bytes`.
pub fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Appends `v` as an unsigned LEB128 varint (7 bits per byte, low bits
/// first, high bit set on every byte but the last; 1 to 10 bytes).
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a LEB128 varint at `*pos`, advancing it.
///
/// # Errors
/// When the bytes end inside the varint, or it encodes more than 64 bits.
pub fn get_varint(b: &[u8], pos: &mut usize) -> Result<u64, DecodeError> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let Some(&byte) = b.get(*pos) else {
            return Err(bad(format!("varint truncated at payload byte {}", *pos)));
        };
        *pos += 1;
        let bits = (byte & 0x7f) as u64;
        if i == 9 && bits > 1 {
            return Err(bad(format!(
                "varint overflows 64 bits at payload byte {}",
                *pos - 1
            )));
        }
        v |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad(format!(
        "varint longer than 10 bytes at payload byte {}",
        *pos - 1
    )))
}

/// Where each metadata structure lives, in bytes from the device start. A
/// pure function of the superblock's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per block.
    pub block_size: u64,
    /// Blocks on the device, metadata included.
    pub capacity_blocks: u64,
    /// Blocks `[0, meta_blocks)` hold metadata and are never handed out.
    pub meta_blocks: u64,
    /// Bytes per checkpoint slot (a multiple of [`PAGE`]).
    pub slot_len: u64,
    /// Bytes of the journal ring (a multiple of [`PAGE`]).
    pub journal_len: u64,
}

/// Bytes of the two superblock copies at the start of the device.
pub const SUPERBLOCK_AREA: u64 = 2 * PAGE;
/// Smallest checkpoint slot: a header page and 60 KiB of payload.
pub const MIN_SLOT_LEN: u64 = 64 << 10;
/// Smallest journal: 64 pages.
pub const MIN_JOURNAL_LEN: u64 = 64 * PAGE;
/// Largest default journal (explicit sizes may be larger).
pub const MAX_DEFAULT_JOURNAL_LEN: u64 = 64 << 20;

fn round_up_page(v: u64) -> u64 {
    v.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// The default sizes for a device of `capacity_blocks` blocks:
    ///
    /// * checkpoint slot: [`checkpoint::max_len`], at least 64 KiB — a
    ///   header page plus one bit per block plus one byte per 32768 blocks,
    ///   enough for a checkpoint of *any* free space. 512 MiB + 132 KiB per
    ///   slot at 16 TiB in 4 KiB blocks, so 64 MiB of slots per TiB; only
    ///   reserved, a checkpoint writes what its content needs.
    /// * journal: `capacity_bytes / 1024` clamped to 256 KiB..64 MiB, rounded
    ///   up to 4 KiB.
    pub fn default_sizes(capacity_blocks: u64, block_size: u64) -> (u64, u64) {
        let slot = checkpoint::max_len(capacity_blocks).max(MIN_SLOT_LEN);
        let journal = round_up_page(
            (capacity_blocks.saturating_mul(block_size) / 1024)
                .clamp(MIN_JOURNAL_LEN, MAX_DEFAULT_JOURNAL_LEN),
        );
        (slot, journal)
    }

    /// Plans the layout of a new format of a device of `device_len` bytes:
    /// the rules of [`Layout::from_sizes`], and checkpoint slots that hold a
    /// checkpoint of any free space ([`checkpoint::max_len`]).
    ///
    /// # Errors
    /// A message when the sizes are out of range, the slots are smaller
    /// than that bound, or the metadata would not leave at least one data
    /// block.
    pub fn plan(
        device_len: u64,
        block_size: u64,
        slot_len: Option<u64>,
        journal_len: Option<u64>,
    ) -> Result<Layout, String> {
        check_block_size(block_size)?;
        let capacity_blocks = device_len / block_size;
        let (ds, dj) = Self::default_sizes(capacity_blocks, block_size);
        let slot_len = slot_len.unwrap_or(ds);
        let needed = checkpoint::max_len(capacity_blocks);
        if slot_len < needed {
            return Err(format!(
                "checkpoint slot size {slot_len} cannot hold a checkpoint of every free-space \
                 state of {capacity_blocks} blocks: it needs at least {needed} bytes \
                 (a header page and one bit per block); leave it to the default"
            ));
        }
        Self::from_sizes(device_len, block_size, slot_len, journal_len.unwrap_or(dj))
    }

    /// The layout a superblock describes, checked against the rules every
    /// version kept: block size, slot and journal sizes in range, metadata
    /// leaving a data block. Slots smaller than [`checkpoint::max_len`] are
    /// accepted (earlier versions sized them at one byte per 64 blocks):
    /// such a store works until a checkpoint fits neither encoding
    /// ([`crate::StoreError::CheckpointTooLarge`]).
    ///
    /// # Errors
    /// A message naming the size that is out of range.
    pub fn from_sizes(
        device_len: u64,
        block_size: u64,
        slot_len: u64,
        journal_len: u64,
    ) -> Result<Layout, String> {
        check_block_size(block_size)?;
        let capacity_blocks = device_len / block_size;
        if !slot_len.is_multiple_of(PAGE) || slot_len < MIN_SLOT_LEN {
            return Err(format!(
                "checkpoint slot size {slot_len} must be a multiple of 4 KiB, at least {MIN_SLOT_LEN}"
            ));
        }
        if !journal_len.is_multiple_of(PAGE) || journal_len < MIN_JOURNAL_LEN {
            return Err(format!(
                "journal size {journal_len} must be a multiple of 4 KiB, at least {MIN_JOURNAL_LEN}"
            ));
        }
        let end = slot_len
            .checked_mul(2)
            .and_then(|s| s.checked_add(SUPERBLOCK_AREA))
            .and_then(|j| j.checked_add(journal_len))
            .ok_or_else(|| "metadata sizes overflow".to_string())?;
        let meta_blocks = end.div_ceil(block_size);
        if meta_blocks >= capacity_blocks {
            return Err(format!(
                "device of {device_len} bytes is too small: metadata needs {end} bytes \
                 ({meta_blocks} blocks of {block_size}) and at least one data block must remain"
            ));
        }
        Ok(Layout {
            block_size,
            capacity_blocks,
            meta_blocks,
            slot_len,
            journal_len,
        })
    }

    /// True when the slots hold a checkpoint of any free space (always for
    /// layouts from [`Layout::plan`]).
    pub fn slots_hold_any_checkpoint(&self) -> bool {
        self.slot_len >= checkpoint::max_len(self.capacity_blocks)
    }

    /// Byte offset of superblock copy `i` (0 or 1).
    pub fn superblock_offset(i: usize) -> u64 {
        i as u64 * PAGE
    }

    /// Byte offset of checkpoint slot `i` (0 or 1).
    pub fn slot_offset(&self, i: usize) -> u64 {
        SUPERBLOCK_AREA + i as u64 * self.slot_len
    }

    /// Byte offset of the journal ring.
    pub fn journal_offset(&self) -> u64 {
        SUPERBLOCK_AREA + 2 * self.slot_len
    }

    /// Pages in the journal ring.
    pub fn journal_pages(&self) -> u64 {
        self.journal_len / PAGE
    }

    /// Bytes of metadata, rounded up to whole blocks.
    pub fn meta_bytes(&self) -> u64 {
        self.meta_blocks * self.block_size
    }
}

fn check_block_size(block_size: u64) -> Result<(), String> {
    if !block_size.is_power_of_two() || !(512..=1 << 30).contains(&block_size) {
        return Err(format!(
            "block size {block_size} must be a power of two from 512 B to 1 GiB"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_refuse_garbage() {
        let values = [0, 1, 127, 128, 300, 1 << 32, u64::MAX - 1, u64::MAX];
        let mut buf = Vec::new();
        for v in values {
            put_varint(&mut buf, v);
        }
        let mut pos = 0;
        for v in values {
            assert_eq!(get_varint(&buf, &mut pos).unwrap(), v);
        }
        assert_eq!(pos, buf.len());
        assert!(get_varint(&[0x80], &mut 0).is_err());
        assert!(get_varint(&[0xff; 11], &mut 0).is_err());
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(get_varint(&over, &mut 0)
            .unwrap_err()
            .0
            .contains("overflow"));
    }

    #[test]
    fn layout_rules() {
        let l = Layout::plan(16 << 40, 4096, None, None).unwrap();
        assert_eq!(l.capacity_blocks, 1 << 32);
        // A header page, one bit per block, one byte per 32768 blocks.
        let slot = 4096 + (512 << 20) + (128 << 10);
        assert_eq!(l.slot_len, slot);
        assert_eq!(l.journal_len, 64 << 20);
        assert_eq!(l.slot_offset(0), 8192);
        assert_eq!(l.slot_offset(1), 8192 + slot);
        assert_eq!(l.journal_offset(), 8192 + 2 * slot);
        assert_eq!(l.meta_blocks, (8192 + 2 * slot + (64u64 << 20)) / 4096);
        assert!(l.slots_hold_any_checkpoint());
        let small = Layout::plan(64 << 20, 4096, None, None).unwrap();
        assert_eq!(small.slot_len, MIN_SLOT_LEN);
        assert_eq!(small.journal_len, MIN_JOURNAL_LEN);
        // 512-byte blocks: offsets stay page-aligned, metadata in blocks.
        let l512 = Layout::plan(64 << 20, 512, None, None).unwrap();
        assert_eq!(l512.meta_bytes(), l512.journal_offset() + l512.journal_len);
        // Big blocks round the metadata up to a whole block.
        let big = Layout::plan(1 << 30, 1 << 20, None, None).unwrap();
        assert_eq!(big.meta_blocks, 2); // 8 KiB + 2 × 64 KiB + 1 MiB of journal
        assert!(Layout::plan(100 << 10, 4096, None, None)
            .unwrap_err()
            .contains("too small"));
        assert!(Layout::plan(1 << 30, 4096, Some(5000), None).is_err());
        assert!(Layout::plan(1 << 30, 4096, None, Some(4096)).is_err());
        assert!(Layout::plan(1 << 30, 3000, None, None).is_err());
    }

    #[test]
    fn new_formats_refuse_slots_below_the_bound_that_existing_ones_keep() {
        // 16 TiB with 64 MiB slots, as an earlier version sized them.
        let e = Layout::plan(16 << 40, 4096, Some(64 << 20), None).unwrap_err();
        assert!(e.contains("at least 537006080 bytes"), "{e}");
        let old = Layout::from_sizes(16 << 40, 4096, 64 << 20, 64 << 20).unwrap();
        assert_eq!(old.meta_blocks, (8192 + (192u64 << 20)) / 4096);
        assert!(!old.slots_hold_any_checkpoint());
        // Small devices: the 64 KiB minimum already holds any checkpoint.
        let l = Layout::plan(256 << 20, 4096, Some(64 << 10), None).unwrap();
        assert!(l.slots_hold_any_checkpoint());
    }

    #[test]
    fn huge_sizes_from_a_superblock_are_an_error_not_an_overflow() {
        let e = Layout::from_sizes(1 << 40, 4096, 1 << 63, 64 << 20).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        let e = Layout::from_sizes(1 << 40, 4096, 64 << 20, u64::MAX - 4095).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
    }
}
