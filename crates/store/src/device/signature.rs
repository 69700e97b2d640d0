//! What an existing file or block device holds, judged from its first MiB:
//! enough to refuse formatting over somebody's file system, partition table
//! or data without being told to.
//!
//! The check is deliberately conservative. A known signature (a file
//! system, a partition table, a volume manager or RAID label, swap, an
//! encrypted volume, a blockalloc store) is named; any other non-zero byte
//! counts as data; only a head that reads back as zeros is blank. A device
//! whose only marks lie past the first MiB (an MD 0.90 or 1.0 superblock at
//! the end) reads as blank; those formats are rare on whole devices today.

use std::fmt;

/// Bytes examined at the start of a device.
pub const PROBE_BYTES: u64 = 1 << 20;

/// One recognisable mark: `magic` at byte `offset`.
struct Signature {
    name: &'static str,
    offset: usize,
    magic: &'static [u8],
}

const fn sig(name: &'static str, offset: usize, magic: &'static [u8]) -> Signature {
    Signature {
        name,
        offset,
        magic,
    }
}

/// Known signatures, most specific first (a GPT disk also carries the
/// protective MBR's 0x55AA; the GPT header names it better).
const SIGNATURES: &[Signature] = &[
    sig("a blockalloc store", 0, b"BLKALLOC"),
    sig("a LUKS encrypted volume", 0, b"LUKS\xba\xbe"),
    sig("an XFS file system", 0, b"XFSB"),
    sig("a squashfs image", 0, b"hsqs"),
    sig("an MD RAID member (superblock 1.1)", 0, b"\xfc\x4e\x2b\xa9"),
    sig(
        "an MD RAID member (superblock 1.2)",
        4096,
        b"\xfc\x4e\x2b\xa9",
    ),
    sig("an NTFS file system", 3, b"NTFS    "),
    sig("an exFAT file system", 3, b"EXFAT   "),
    sig("a GPT partition table", 512, b"EFI PART"),
    sig("a GPT partition table", 4096, b"EFI PART"),
    // LVM2 puts its label in any of the first four sectors.
    sig("an LVM physical volume", 0, b"LABELONE"),
    sig("an LVM physical volume", 512, b"LABELONE"),
    sig("an LVM physical volume", 1024, b"LABELONE"),
    sig("an LVM physical volume", 1536, b"LABELONE"),
    sig("an ext2/3/4 file system", 1080, b"\x53\xef"),
    sig("an F2FS file system", 1024, b"\x10\x20\xf5\xf2"),
    sig("Linux swap", 4086, b"SWAPSPACE2"),
    sig("Linux swap", 4086, b"SWAP-SPACE"),
    sig(
        "a bcache device",
        4096 + 24,
        b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81",
    ),
    sig("an ISO 9660 image", 32769, b"CD001"),
    sig("a btrfs file system", 65600, b"_BHRfS_M"),
    sig(
        "a ZFS pool member",
        128 << 10,
        b"\x0c\xb1\xba\x00\x00\x00\x00\x00",
    ),
    sig("an MBR partition table or boot sector", 510, b"\x55\xaa"),
];

/// What the first [`PROBE_BYTES`] of a device hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contents {
    /// Nothing at all: a zero-length file.
    Empty,
    /// Every byte examined is zero.
    Zeros,
    /// A known signature.
    Signature(&'static str),
    /// Other data: the first non-zero byte is at this offset.
    Data {
        /// Offset of the first non-zero byte.
        first_nonzero: u64,
    },
}

impl Contents {
    /// Classifies `head`, the first bytes of a device (at most
    /// [`PROBE_BYTES`] are looked at).
    pub fn of(head: &[u8]) -> Contents {
        if head.is_empty() {
            return Contents::Empty;
        }
        let head = &head[..head.len().min(PROBE_BYTES as usize)];
        if let Some(s) = SIGNATURES
            .iter()
            .find(|s| head.get(s.offset..s.offset + s.magic.len()) == Some(s.magic))
        {
            return Contents::Signature(s.name);
        }
        match head.iter().position(|&b| b != 0) {
            None => Contents::Zeros,
            Some(i) => Contents::Data {
                first_nonzero: i as u64,
            },
        }
    }

    /// True when formatting over these contents destroys nothing visible.
    pub fn is_blank(&self) -> bool {
        matches!(self, Contents::Empty | Contents::Zeros)
    }
}

impl fmt::Display for Contents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Contents::Empty => f.write_str("nothing"),
            Contents::Zeros => f.write_str("only zeros in its first MiB"),
            Contents::Signature(name) => write!(f, "the signature of {name}"),
            Contents::Data { first_nonzero } => {
                write!(f, "data (a non-zero byte at offset {first_nonzero})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_a_head_holds() {
        assert_eq!(Contents::of(&[]), Contents::Empty);
        assert_eq!(Contents::of(&[0; 4096]), Contents::Zeros);
        assert!(Contents::of(&[0; 4096]).is_blank());
        let mut head = vec![0u8; 128 << 10];
        head[1080] = 0x53;
        head[1081] = 0xef;
        assert_eq!(
            Contents::of(&head),
            Contents::Signature("an ext2/3/4 file system")
        );
        // The GPT header wins over the protective MBR's boot signature.
        head[1080] = 0;
        head[1081] = 0;
        head[510] = 0x55;
        head[511] = 0xaa;
        head[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(
            Contents::of(&head),
            Contents::Signature("a GPT partition table")
        );
        let mut text = b"data\n".to_vec();
        text.resize(4096, 0);
        assert_eq!(Contents::of(&text), Contents::Data { first_nonzero: 0 });
        let mut late = vec![0u8; 8192];
        late[5000] = 1;
        let c = Contents::of(&late);
        assert_eq!(
            c,
            Contents::Data {
                first_nonzero: 5000
            }
        );
        assert!(!c.is_blank());
        assert!(c.to_string().contains("offset 5000"), "{c}");
        // A signature whose offset lies past a short head is not matched.
        assert_eq!(
            Contents::of(&b"\x53\xef"[..]),
            Contents::Data { first_nonzero: 0 }
        );
    }
}
