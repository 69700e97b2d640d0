//! `blockalloc format`: create (or take) a device and write an empty store.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use blockalloc::{ByteSize, Geometry};
use blockalloc_bench::units;
use blockalloc_bench::{Bar, Meter};

use crate::out::outln;
use blockalloc_store::device::{
    CreateOptions, Device, DirectIo, FileDevice, FileKind, Preallocation, ZeroMode, IO_ALIGN,
};
use blockalloc_store::format::Layout;
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
    /// Zero the file's never-used space in the background (see
    /// [`blockalloc_store::zero`]).
    pub background: bool,
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
        if bs < IO_ALIGN as u64 {
            return Err(UsageError::new(format!(
                "--block-size {}: blocks smaller than {} are refused. Object data is written \
                 in units of {} (the sector size of current drives, and the alignment O_DIRECT \
                 needs), so objects in smaller blocks would share sectors: every object write \
                 would read-modify-write its neighbours' data, and a write torn by a crash could \
                 destroy objects already committed. Use --block-size {} or larger",
                a.block_size,
                ByteSize(IO_ALIGN as u64),
                ByteSize(IO_ALIGN as u64),
                ByteSize(IO_ALIGN as u64),
            )));
        }
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
        let (zero, background) = match a.zero {
            ZeroArg::Now => (ZeroMode::Write, false),
            ZeroArg::Range => (ZeroMode::ZeroRange, false),
            ZeroArg::None => (ZeroMode::None, false),
            ZeroArg::Background => (ZeroMode::None, true),
            ZeroArg::Auto if size.is_some_and(|s| s <= AUTO_ZERO_LIMIT) => (ZeroMode::Write, false),
            ZeroArg::Auto => (ZeroMode::None, true),
        };
        let options = FormatOptions {
            block_size: bs,
            checkpoint_slot_bytes: page_multiple("--checkpoint-size", a.checkpoint_size)?,
            journal_bytes: page_multiple("--journal-size", a.journal_size)?,
            force: a.force,
            capacity_bytes: size,
        };
        if let Some(s) = size {
            // Refused before any file is made: a layout that cannot fit
            // would otherwise fail after the file was created and zeroed.
            plan(s, &options)?;
        }
        Ok(FormatSettings {
            path: a.device.clone(),
            size,
            prealloc: Preallocation {
                allocate: !a.sparse,
                zero,
            },
            options,
            direct: a.direct.into(),
            block_device,
            background: background && !a.sparse && !block_device,
        })
    }
}

/// The store's layout on `len` bytes, or the usage error naming the flags.
fn plan(len: u64, o: &FormatOptions) -> Result<Layout, UsageError> {
    Layout::plan(len, o.block_size, o.checkpoint_slot_bytes, o.journal_bytes).map_err(|e| {
        UsageError::new(format!(
            "cannot format {}: {e} (see --size, --journal-size, --checkpoint-size)",
            ByteSize(len)
        ))
    })
}

/// Opens a block device for formatting: refuses one smaller than `--size`,
/// and, without `--force`, one that holds a store, a known signature or any
/// data in its first MiB. With `--size` the store takes that much of the
/// device, from its start.
fn prepare_block(s: &FormatSettings) -> anyhow::Result<FileDevice> {
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
    plan(s.size.unwrap_or(dev.len()), &s.options)?;
    if !s.options.force {
        if blockalloc_store::is_formatted(&dev) {
            return Err(StoreError::AlreadyFormatted {
                device: dev.describe(),
            }
            .into());
        }
        dev.ensure_blank()?;
    }
    Ok(dev)
}

/// Creates the file device: refuses an existing store or non-empty file
/// without `--force`, shows a bar while zeroing, and leaves nothing behind
/// when it fails (see [`FileDevice::create_with`]).
fn prepare_file(s: &FormatSettings) -> anyhow::Result<FileDevice> {
    let size = s.size.unwrap_or(0);
    if !s.options.force && s.path.exists() {
        // Read-only: a device a writer holds is still recognised as a store.
        if let Ok(existing) = FileDevice::open_read_only(&s.path, DirectIo::Off) {
            if blockalloc_store::is_formatted(&existing) {
                return Err(StoreError::AlreadyFormatted {
                    device: existing.describe(),
                }
                .into());
            }
        }
    }
    let bar = (s.prealloc.allocate && s.prealloc.zero == ZeroMode::Write)
        .then(|| Bar::new(&format!("zeroing {}", s.path.display()), Meter::Bytes(size)));
    let opts = CreateOptions {
        prealloc: s.prealloc,
        direct: s.direct,
        overwrite: s.options.force,
    };
    let made = FileDevice::create_with(&s.path, size, opts, &mut |done, _| {
        if let Some(bar) = &bar {
            bar.set_position(done);
        }
    });
    if let Some(bar) = bar {
        bar.clear();
    }
    Ok(made?)
}

fn describe_prealloc(p: Preallocation, kind: FileKind, background: bool) -> &'static str {
    match (kind, p.allocate, p.zero) {
        (FileKind::Block, _, _) => "block device (no preallocation)",
        (_, false, _) => "sparse file",
        (_, true, ZeroMode::None) if background => {
            "fallocated (unwritten extents), to be zeroed in the background"
        }
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
    let created = !s.block_device && !s.path.exists();
    let dev = if s.block_device {
        prepare_block(&s)?
    } else {
        prepare_file(&s)?
    };
    let prepared = t0.elapsed();
    let kind = dev.kind();
    let desc = dev.describe();
    let formatted = Store::format(
        dev,
        FormatOptions {
            // Existing contents were refused above unless --force.
            force: true,
            ..s.options
        },
    );
    let store = match formatted {
        Ok(store) => store,
        Err(e) if created => {
            let what = match std::fs::remove_file(&s.path) {
                Ok(()) => format!("removed the file {} it had created", s.path.display()),
                Err(r) => format!(
                    "could not remove {} ({r}): remove it by hand",
                    s.path.display()
                ),
            };
            return Err(anyhow::Error::new(e).context(format!("format failed; {what}")));
        }
        Err(e) => return Err(e).context(format!("format failed on {desc}")),
    };
    if s.background {
        store
            .plan_zeroing()
            .with_context(|| format!("format failed while planning the zeroing of {desc}"))?;
    }
    let l = store.layout();
    let geo = store.geometry();
    let device_len = store.device().len();
    // Closed before anything is printed as done.
    store
        .close()
        .with_context(|| format!("format failed while closing {desc}"))?;
    outln!("formatted {desc}")?;
    outln!(
        "  geometry     {} in {} blocks of {}",
        units::bytes(geo.capacity_bytes()),
        geo.capacity_blocks(),
        units::bytes(geo.block_size())
    )?;
    outln!(
        "  metadata     {} ({} blocks): 2 superblocks, 2 checkpoint slots of {}, journal of {}",
        units::bytes(l.meta_bytes()),
        l.meta_blocks,
        units::bytes(l.slot_len),
        units::bytes(l.journal_len)
    )?;
    outln!(
        "  data         {} free",
        units::bytes((l.capacity_blocks - l.meta_blocks) * l.block_size)
    )?;
    if device_len > geo.capacity_bytes() {
        outln!(
            "  device       {}: the store takes its first {}, the rest is never touched",
            units::bytes(device_len),
            units::bytes(geo.capacity_bytes())
        )?;
    }
    outln!(
        "  prepared     {} in {}",
        describe_prealloc(s.prealloc, kind, s.background),
        units::duration(prepared)
    )?;
    if a.zero == ZeroArg::Auto && s.background {
        outln!(
            "  note         larger than {}: `blockalloc serve` zeroes it in the background \
             (server.zero_share); --zero now zeroes it all first",
            units::bytes(AUTO_ZERO_LIMIT)
        )?;
    }
    Ok(())
}
