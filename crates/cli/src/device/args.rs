//! Raw flags of the device subcommands (`format`, `inspect`, `check`) and
//! of `bench --device`. No I/O and no cross-flag rules here; the
//! subcommands' settings validate.

use std::path::PathBuf;

use blockalloc::ByteSize;
use clap::{Args, ValueEnum};

/// How to zero a new file's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ZeroArg {
    /// `now` up to 64 GiB, `background` above (zeroing 16 TiB takes
    /// hours).
    Auto,
    /// Write zeros over the whole file now: later object writes overwrite
    /// written blocks, with no filesystem metadata update.
    Now,
    /// Leave the file unwritten and let `blockalloc serve` zero its
    /// never-used space in the background, ahead of allocation, with at
    /// most `zero_share` of the device's time.
    Background,
    /// fallocate(FALLOC_FL_ZERO_RANGE): fast, but ext4 and XFS keep the
    /// extents unwritten, so later writes still update metadata.
    Range,
    /// Leave the fallocated extents unwritten.
    None,
}

/// `O_DIRECT` for the store's metadata I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DirectArg {
    /// `O_DIRECT` where the filesystem supports it.
    Auto,
    /// Require `O_DIRECT`.
    On,
    /// Buffered I/O.
    Off,
}

/// Flags of `blockalloc format`.
#[derive(Debug, Args)]
pub struct FormatArgs {
    /// The file or block device. A new file is created with --size bytes
    /// (an existing one must be empty, or --force); a block device is used
    /// whole, or its first --size bytes, and must be blank in its first MiB
    /// (or --force).
    #[arg(long, value_name = "PATH")]
    pub device: PathBuf,

    /// Size of the store, e.g. 2TiB (rounded down to whole blocks).
    /// Required for a new file. On a block device the store takes the first
    /// SIZE bytes (at most the device's size) and never touches the rest;
    /// without --size it takes the whole device.
    #[arg(long, value_name = "SIZE")]
    pub size: Option<ByteSize>,

    /// Block size: a power of two from 4KiB to 1GiB (smaller blocks would
    /// share the drive's 4 KiB sectors between objects).
    #[arg(long, value_name = "SIZE", default_value = "4KiB")]
    pub block_size: ByteSize,

    /// How to zero a new file after fallocate: writes into blocks that were
    /// written before need no filesystem metadata update (unwritten
    /// fallocated extents are converted on first write), so zeroed blocks
    /// make object writes cheaper. Ignored for block devices and --sparse.
    /// Zeroing shows a progress bar on a terminal.
    #[arg(long, value_enum, default_value_t = ZeroArg::Auto)]
    pub zero: ZeroArg,

    /// Do not fallocate: a sparse file (blocks found at first write; a full
    /// filesystem fails writes later). Needed for sizes beyond the free
    /// space, e.g. to measure a multi-TiB device on a small disk. The file
    /// system still caps a file's size: ext4 with 4 KiB blocks stops one
    /// block short of 16TiB (use 15TiB there), XFS allows 8EiB; format names
    /// the cap when --size exceeds it.
    #[arg(long)]
    pub sparse: bool,

    /// Journal size (default: capacity/1024, 256KiB..64MiB).
    #[arg(long, value_name = "SIZE")]
    pub journal_size: Option<ByteSize>,

    /// Size of each of the two checkpoint slots (default and minimum: what a
    /// checkpoint of any free space needs, about 1 bit per block plus a 4KiB
    /// header, at least 64KiB; 64MiB per TiB in 4KiB blocks).
    #[arg(long, value_name = "SIZE")]
    pub checkpoint_size: Option<ByteSize>,

    /// Format over existing contents: a blockalloc store (every allocation
    /// on it is lost), a non-empty file, or a block device with a known
    /// signature or data in its first MiB.
    #[arg(long)]
    pub force: bool,

    /// O_DIRECT for metadata I/O.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
}

/// Flags of `blockalloc inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The formatted file or block device.
    #[arg(long, value_name = "PATH")]
    pub device: PathBuf,

    /// Write one JSON object: `--json` alone or `--json -` to stdout
    /// instead of the text, `--json PATH` to a file (the text still goes to
    /// stdout).
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,

    /// O_DIRECT for metadata I/O.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
}

/// Flags of `blockalloc check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The formatted file or block device.
    #[arg(long, value_name = "PATH")]
    pub device: PathBuf,

    /// Write one JSON object: `--json` alone or `--json -` to stdout
    /// instead of the text, `--json PATH` to a file (the text still goes to
    /// stdout).
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,

    /// O_DIRECT for metadata I/O.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
}

/// Flags of `blockalloc reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The formatted file or block device.
    #[arg(long, value_name = "PATH")]
    pub device: PathBuf,

    /// The live extents: a text file, or `-` for standard input. One extent
    /// per line as `start,len` in blocks (decimal), sorted by start and
    /// disjoint; blank lines and lines starting with `#` are skipped.
    #[arg(long, value_name = "FILE")]
    pub live: PathBuf,

    /// Check the list and report what would be freed; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// O_DIRECT for metadata I/O.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
}
