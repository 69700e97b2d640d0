//! The superblock: what the device is and where its metadata lives.
//!
//! Written twice (copies at bytes 0 and 4096) by `format` and never again, so
//! no crash can tear it; the second copy survives damage to the first. Each
//! copy is one 4096-byte page:
//!
//! | offset | size | field                                                     |
//! |-------:|-----:|-----------------------------------------------------------|
//! |      0 |    8 | magic `"BLKALLOC"` (ASCII)                                |
//! |      8 |    4 | format version (1)                                        |
//! |     12 |    4 | flags (0; readers refuse unknown bits)                    |
//! |     16 |   16 | device id: 16 random bytes chosen at format               |
//! |     32 |    8 | block size in bytes                                       |
//! |     40 |    8 | capacity in blocks, metadata included                     |
//! |     48 |    8 | metadata blocks: `[0, meta_blocks)` is reserved           |
//! |     56 |    8 | checkpoint slot size in bytes                             |
//! |     64 |    8 | journal size in bytes                                     |
//! |     72 |    8 | format time, seconds since the Unix epoch                 |
//! |     80 |    4 | CRC-32C of bytes 0..80                                    |
//! |     84 | 4012 | zero                                                      |

use super::{
    bad, crc, get_u32, get_u64, put_u32, put_u64, DecodeError, Layout, FORMAT_VERSION,
    FORMAT_VERSION_1, PAGE,
};

/// Magic number at byte 0.
pub const SB_MAGIC: [u8; 8] = *b"BLKALLOC";
/// Offset of the magic number.
pub const SB_MAGIC_OFF: usize = 0;
/// Offset of the format version.
pub const SB_VERSION_OFF: usize = 8;
/// Offset of the flags.
pub const SB_FLAGS_OFF: usize = 12;
/// Offset of the 16-byte device id.
pub const SB_UUID_OFF: usize = 16;
/// Offset of the block size.
pub const SB_BLOCK_SIZE_OFF: usize = 32;
/// Offset of the capacity in blocks.
pub const SB_CAPACITY_OFF: usize = 40;
/// Offset of the metadata block count.
pub const SB_META_BLOCKS_OFF: usize = 48;
/// Offset of the checkpoint slot size.
pub const SB_SLOT_LEN_OFF: usize = 56;
/// Offset of the journal size.
pub const SB_JOURNAL_LEN_OFF: usize = 64;
/// Offset of the format time.
pub const SB_CREATED_OFF: usize = 72;
/// Offset of the checksum, which covers bytes `0..SB_CRC_OFF`.
pub const SB_CRC_OFF: usize = 80;
/// Bytes of the superblock that carry information.
pub const SB_LEN: usize = 84;

/// The decoded superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version: [`FORMAT_VERSION`] for stores formatted or upgraded
    /// by this code, [`FORMAT_VERSION_1`] for a store not yet upgraded (its
    /// journal entries carry no per-sector stamps).
    pub version: u32,
    /// Random id of this format of this device; every checkpoint and journal
    /// entry carries it, so stale metadata from an earlier format is ignored.
    pub uuid: [u8; 16],
    /// Where everything is.
    pub layout: Layout,
    /// Format time, seconds since the Unix epoch.
    pub created: u64,
}

impl Superblock {
    /// The first 8 bytes of the device id, as journal entries carry it.
    pub fn uuid_prefix(&self) -> u64 {
        u64::from_le_bytes(self.uuid[..8].try_into().expect("8 bytes"))
    }

    /// One 4096-byte page holding this superblock.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE as usize];
        let l = &self.layout;
        b[SB_MAGIC_OFF..SB_MAGIC_OFF + 8].copy_from_slice(&SB_MAGIC);
        put_u32(&mut b, SB_VERSION_OFF, self.version);
        put_u32(&mut b, SB_FLAGS_OFF, 0);
        b[SB_UUID_OFF..SB_UUID_OFF + 16].copy_from_slice(&self.uuid);
        put_u64(&mut b, SB_BLOCK_SIZE_OFF, l.block_size);
        put_u64(&mut b, SB_CAPACITY_OFF, l.capacity_blocks);
        put_u64(&mut b, SB_META_BLOCKS_OFF, l.meta_blocks);
        put_u64(&mut b, SB_SLOT_LEN_OFF, l.slot_len);
        put_u64(&mut b, SB_JOURNAL_LEN_OFF, l.journal_len);
        put_u64(&mut b, SB_CREATED_OFF, self.created);
        let c = crc(&b[..SB_CRC_OFF]);
        put_u32(&mut b, SB_CRC_OFF, c);
        b
    }

    /// True when `page` starts with the superblock magic (used to refuse
    /// formatting over an existing store by accident).
    pub fn has_magic(page: &[u8]) -> bool {
        page.len() >= 8 && page[..8] == SB_MAGIC
    }

    /// Decodes one copy.
    ///
    /// # Errors
    /// Wrong magic, checksum mismatch, unknown version or flags, or fields
    /// that do not describe a possible layout.
    pub fn decode(page: &[u8]) -> Result<Superblock, DecodeError> {
        if page.len() < SB_LEN {
            return Err(bad("shorter than a superblock"));
        }
        if !Self::has_magic(page) {
            return Err(bad("no superblock magic (not a blockalloc device?)"));
        }
        let stored = get_u32(page, SB_CRC_OFF);
        let actual = crc(&page[..SB_CRC_OFF]);
        if stored != actual {
            return Err(bad(format!(
                "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
            )));
        }
        if let Some(i) = page[SB_LEN..].iter().position(|&b| b != 0) {
            return Err(bad(format!(
                "byte {} is not zero: the page was damaged after it was written",
                SB_LEN + i
            )));
        }
        let version = get_u32(page, SB_VERSION_OFF);
        if version != FORMAT_VERSION && version != FORMAT_VERSION_1 {
            return Err(bad(format!(
                "format version {version} is not supported (this build reads versions \
                 {FORMAT_VERSION_1} and {FORMAT_VERSION})"
            )));
        }
        let flags = get_u32(page, SB_FLAGS_OFF);
        if flags != 0 {
            return Err(bad(format!("unknown flags {flags:#x}")));
        }
        let block_size = get_u64(page, SB_BLOCK_SIZE_OFF);
        let capacity_blocks = get_u64(page, SB_CAPACITY_OFF);
        let meta_blocks = get_u64(page, SB_META_BLOCKS_OFF);
        let slot_len = get_u64(page, SB_SLOT_LEN_OFF);
        let journal_len = get_u64(page, SB_JOURNAL_LEN_OFF);
        let device_len = capacity_blocks
            .checked_mul(block_size)
            .ok_or_else(|| bad("capacity overflows 64 bits"))?;
        let layout = Layout::from_sizes(device_len, block_size, slot_len, journal_len)
            .map_err(|e| bad(format!("impossible layout: {e}")))?;
        if layout.meta_blocks != meta_blocks || layout.capacity_blocks != capacity_blocks {
            return Err(bad(format!(
                "metadata blocks {meta_blocks} do not match the layout ({} expected)",
                layout.meta_blocks
            )));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&page[SB_UUID_OFF..SB_UUID_OFF + 16]);
        Ok(Superblock {
            version,
            uuid,
            layout,
            created: get_u64(page, SB_CREATED_OFF),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            uuid: *b"0123456789abcdef",
            layout: Layout::plan(1 << 30, 4096, None, None).unwrap(),
            created: 1_700_000_000,
        }
    }

    #[test]
    fn round_trip_every_field() {
        let sb = sample();
        let page = sb.encode();
        assert_eq!(page.len(), 4096);
        assert_eq!(Superblock::decode(&page).unwrap(), sb);
        assert_eq!(&page[..8], b"BLKALLOC");
        assert_eq!(get_u64(&page, SB_BLOCK_SIZE_OFF), 4096);
        assert_eq!(get_u64(&page, SB_CAPACITY_OFF), 1 << 18);
        assert_eq!(get_u64(&page, SB_CREATED_OFF), 1_700_000_000);
        assert!(page[SB_LEN..].iter().all(|&b| b == 0));
        assert_eq!(sb.uuid_prefix(), u64::from_le_bytes(*b"01234567"));
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let page = sample().encode();
        for byte in 0..SB_LEN {
            for bit in 0..8 {
                let mut p = page.clone();
                p[byte] ^= 1 << bit;
                assert!(Superblock::decode(&p).is_err(), "flip {byte}.{bit}");
            }
        }
    }

    #[test]
    fn refuses_wrong_version_and_impossible_layouts_with_a_good_checksum() {
        let reseal = |mut p: Vec<u8>| {
            let c = crc(&p[..SB_CRC_OFF]);
            put_u32(&mut p, SB_CRC_OFF, c);
            p
        };
        let mut p = sample().encode();
        put_u32(&mut p, SB_VERSION_OFF, 3);
        assert!(Superblock::decode(&reseal(p))
            .unwrap_err()
            .0
            .contains("version 3"));
        let mut p = sample().encode();
        put_u32(&mut p, SB_VERSION_OFF, FORMAT_VERSION_1);
        assert_eq!(Superblock::decode(&reseal(p)).unwrap().version, 1);
        let mut p = sample().encode();
        put_u32(&mut p, SB_FLAGS_OFF, 1);
        assert!(Superblock::decode(&reseal(p))
            .unwrap_err()
            .0
            .contains("flags"));
        let mut p = sample().encode();
        put_u64(&mut p, SB_META_BLOCKS_OFF, 1);
        assert!(Superblock::decode(&reseal(p)).is_err());
        let mut p = sample().encode();
        put_u64(&mut p, SB_BLOCK_SIZE_OFF, 3);
        assert!(Superblock::decode(&reseal(p)).is_err());
        let mut p = sample().encode();
        put_u64(&mut p, SB_CAPACITY_OFF, u64::MAX);
        assert!(Superblock::decode(&reseal(p)).is_err());
        assert!(Superblock::decode(&[0u8; 10]).is_err());
        assert!(Superblock::decode(&[0u8; 4096])
            .unwrap_err()
            .0
            .contains("magic"));
    }
}
