//! `blockalloc format`: create (or take) a device and write an empty store.

use std::path::PathBuf;
use std::time::Instant;

use blockalloc::{ByteSize, Geometry};
use blockalloc_store::device::{Device, DirectIo, FileDevice, FileKind, Preallocation, ZeroMode};
use blockalloc_store::{FormatOptions, Store, StoreError};

use super::args::{FormatArgs, ZeroArg};
use crate::error::UsageError;

/// Above this size, `--zero auto` does not zero (it would write the whole
/// file before the store can be used).
pub const AUTO_ZERO_LIMIT: u64 = 64 << 30;

/// Validated flags of `format`.
#[derive(Clone, Debug)]
pub struct FormatSettings {
    /// Device path.
    pub path: PathBuf,
    /// Size for a file; `None` for a block device.
    pub size: Option<u64>,
    /// Preallocation of a new file.
    pub prealloc: Preallocation,
    /// What to tell the store.
    pub options: FormatOptions,
    /// O_DIRECT.
    pub direct: DirectIo,
    /// A block device.
    pub block_device: bool,
}

impl FormatSettings {
    /// Validates the flags (reads the path's type, nothing more).
    ///
    /// # Errors
    /// [`UsageError`] naming the flag.
    pub fn from_args(a: &FormatArgs) -> Result<Self, UsageError> {
        use std::os::unix::fs::FileTypeExt;
        let block_device = std::fs::metadata(&a.device)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let size = match (a.size, block_device) {
            (None, false) => {
                return Err(UsageError::new(format!(
                    "--size is required to create the file {}",
                    a.device.display()
                )))
            }
            (s, _) => s.map(ByteSize::bytes),
        };
        let bs = a.block_size.bytes();
        if let Some(s) = size {
            Geometry::new(s, bs)
                .map_err(|e| UsageError::new(format!("--size/--block-size: {e}")))?;
        } else {
            Geometry::new(bs, bs).map_err(|e| UsageError::new(format!("--block-size: {e}")))?;
        }
        let page_multiple = |flag: &str, v: Option<ByteSize>| match v {
            Some(b) if b.bytes() % 4096 != 0 || b.bytes() == 0 => Err(UsageError::new(format!(
                "{flag} {b} must be a positive multiple of 4KiB"
            ))),
            _ => Ok(v.map(ByteSize::bytes)),
        };
        let zero = match a.zero {
            ZeroArg::Now => ZeroMode::Write,
            ZeroArg::Range => ZeroMode::ZeroRange,
            ZeroArg::None => ZeroMode::None,
            ZeroArg::Auto if size.is_some_and(|s| s <= AUTO_ZERO_LIMIT) => ZeroMode::Write,
            ZeroArg::Auto => ZeroMode::None,
        };
        Ok(FormatSettings {
            path: a.device.clone(),
            size,
            prealloc: Preallocation {
                allocate: !a.sparse,
                zero,
            },
            options: FormatOptions {
                block_size: bs,
                checkpoint_slot_bytes: page_multiple("--checkpoint-size", a.checkpoint_size)?,
                journal_bytes: page_multiple("--journal-size", a.journal_size)?,
                force: a.force,
            },
            direct: a.direct.into(),
            block_device,
        })
    }
}

fn describe_prealloc(p: Preallocation, kind: FileKind) -> &'static str {
    match (kind, p.allocate, p.zero) {
        (FileKind::Block, _, _) => "block device (no preallocation)",
        (_, false, _) => "sparse file",
        (_, true, ZeroMode::None) => "fallocated (unwritten extents)",
        (_, true, ZeroMode::ZeroRange) => "fallocated + FALLOC_FL_ZERO_RANGE",
        (_, true, ZeroMode::Write) => "fallocated + zeros written",
    }
}

/// Runs `format`.
///
/// # Errors
/// Usage errors, an existing store without `--force`, I/O errors.
pub fn run(a: &FormatArgs) -> anyhow::Result<()> {
    let s = FormatSettings::from_args(a)?;
    let t0 = Instant::now();
    let dev = if s.block_device {
        let dev = FileDevice::open(&s.path, s.direct)?;
        if let Some(size) = s.size {
            if size > dev.len() {
                return Err(UsageError::new(format!(
                    "--size {} is larger than the block device ({})",
                    ByteSize(size),
                    ByteSize(dev.len())
                ))
                .into());
            }
        }
        dev
    } else {
        if !s.options.force && s.path.exists() {
            if let Ok(existing) = FileDevice::open_read_only(&s.path, DirectIo::Off) {
                if blockalloc_store::is_formatted(&existing) {
                    return Err(StoreError::AlreadyFormatted {
                        device: existing.describe(),
                    }
                    .into());
                }
            }
        }
        if s.prealloc.allocate && s.prealloc.zero == ZeroMode::Write {
            eprintln!(
                "writing {} of zeros to {} (use --zero none or --sparse to skip)...",
                ByteSize(s.size.unwrap_or(0)),
                s.path.display()
            );
        }
        FileDevice::create(&s.path, s.size.unwrap_or(0), s.prealloc, s.direct)?
    };
    let prepared = t0.elapsed();
    let kind = dev.kind();
    let desc = dev.describe();
    let store = Store::format(
        dev,
        FormatOptions {
            force: s.options.force || !s.block_device,
            ..s.options
        },
    )?;
    let l = store.layout();
    let geo = store.geometry();
    println!("formatted {desc}");
    println!("  geometry     {geo}");
    println!(
        "  metadata     {} ({} blocks): 2 superblocks, 2 checkpoint slots of {}, journal of {}",
        ByteSize(l.meta_bytes()),
        l.meta_blocks,
        ByteSize(l.slot_len),
        ByteSize(l.journal_len)
    );
    println!(
        "  data         {} free",
        ByteSize((l.capacity_blocks - l.meta_blocks) * l.block_size)
    );
    println!(
        "  prepared     {} in {:.2} s",
        describe_prealloc(s.prealloc, kind),
        prepared.as_secs_f64()
    );
    if a.zero == ZeroArg::Auto && s.prealloc.allocate && s.prealloc.zero == ZeroMode::None {
        println!(
            "  note         not zeroed (larger than {}): pass --zero now to zero it, so that \
             object writes need no filesystem metadata updates",
            ByteSize(AUTO_ZERO_LIMIT)
        );
    }
    store.close()?;
    Ok(())
}
