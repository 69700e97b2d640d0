//! [`FileDevice`]: a regular file or a block device.
//!
//! * **O_DIRECT** ([`DirectIo`]): metadata writes bypass the page cache, so
//!   a commit costs one device write plus the cache flush of `fdatasync`, and
//!   the store's own checkpoint reads do not evict the user's data from the
//!   cache. `O_DIRECT` needs aligned offsets, lengths and buffer addresses;
//!   the store always passes them (see [`super::AlignedBuf`]), and this file
//!   copies through an aligned buffer when a caller does not, because some
//!   kernels and filesystems accept misaligned direct I/O silently and others
//!   fail it. Filesystems without `O_DIRECT` (tmpfs) fall back to buffered
//!   I/O under [`DirectIo::Auto`].
//! * **Preallocation** ([`Preallocation`]; see `docs/background.md`): creating a file
//!   reserves its blocks with `fallocate` and optionally zeroes them, so that
//!   object writes later overwrite blocks in place instead of making the
//!   filesystem allocate blocks or convert unwritten extents — metadata
//!   journal traffic on every first write. BENCHMARKS.md ("Background
//!   zeroing") measures what zeroed space buys; a store can also zero a
//!   large file while it serves ([`crate::zero`]).
//! * **Sync** is `fdatasync`.
//! * **One writer** ([`FileDevice::open`]): an exclusive lock per open, so
//!   a second writer — in another process or in this one — gets a busy
//!   error naming the holder; [`FileDevice::open_read_only`] takes no lock
//!   and refuses writes (see [`super::lock`]).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use blockalloc::{ByteSize, ErrorClass};
use rustix::fs::{FallocateFlags, OFlags};

use super::aligned::is_aligned;
use super::lock::{self, DeviceBusy, LockHolder};
use super::signature::{Contents, PROBE_BYTES};
use super::{check_aligned, check_bounds, AlignedBuf, Device, IO_ALIGN};

/// Whether to open with `O_DIRECT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DirectIo {
    /// Buffered I/O through the page cache.
    Off,
    /// `O_DIRECT`; opening fails where the filesystem does not support it.
    On,
    /// `O_DIRECT` where supported, else buffered.
    #[default]
    Auto,
}

/// What a [`FileDevice`] sits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A block device (its size is fixed; it is never preallocated).
    Block,
}

/// How to zero a new file's blocks ahead of use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ZeroMode {
    /// Leave them as `fallocate` made them (unwritten extents: reads see
    /// zeros, the first write to each extent updates filesystem metadata).
    None,
    /// `fallocate(FALLOC_FL_ZERO_RANGE)`. Fast, but ext4 and XFS implement
    /// it by making the range unwritten extents again, so it buys nothing
    /// over `None` for later writes; kept for filesystems that zero in
    /// place.
    ZeroRange,
    /// Write zeros over the whole file (1 MiB writes, one `fdatasync`): the
    /// extents become written, and later object writes touch no filesystem
    /// metadata. Costs one full sequential write of the device.
    #[default]
    Write,
}

/// How to create a file device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preallocation {
    /// Reserve the blocks with `fallocate` (else the file is sparse: blocks
    /// are found at first write, and a full filesystem fails writes later).
    pub allocate: bool,
    /// How to zero the reserved blocks (ignored for sparse files).
    pub zero: ZeroMode,
}

impl Default for Preallocation {
    fn default() -> Self {
        Preallocation {
            allocate: true,
            zero: ZeroMode::Write,
        }
    }
}

/// A regular file or a block device behind the [`Device`] contract.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    len: u64,
    kind: FileKind,
    direct: bool,
    /// False when opened with [`FileDevice::open_read_only`]: writes are
    /// refused, and no lock is held.
    writable: bool,
    /// A store holds this handle ([`Device::claim`]).
    claimed: AtomicBool,
}

fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl FileDevice {
    /// Opens an existing file or block device for reading and writing, as
    /// its one writer: takes the exclusive lock of [`super::lock`] (and
    /// opens a block device `O_EXCL`). The lock is released when the device
    /// is dropped or the process dies.
    ///
    /// # Errors
    /// When the path cannot be opened, is neither a regular file nor a block
    /// device, or `O_DIRECT` was required and is not supported; an error of
    /// kind `ResourceBusy` carrying a [`DeviceBusy`] (see
    /// [`DeviceBusy::from_io`]) when another writer holds the device, in
    /// this process or another.
    pub fn open(path: impl AsRef<Path>, direct: DirectIo) -> io::Result<Self> {
        Self::open_mode(path.as_ref(), direct, true)
    }

    /// Opens an existing file or block device for reading only: no lock is
    /// taken, so a writer may hold the device meanwhile (see
    /// [`writer`](Self::writer)), and read-only files and read-only file
    /// systems open. Every write is refused with an error of kind
    /// `PermissionDenied`; sync does nothing.
    ///
    /// # Errors
    /// As [`open`](Self::open), except that it is never busy.
    pub fn open_read_only(path: impl AsRef<Path>, direct: DirectIo) -> io::Result<Self> {
        Self::open_mode(path.as_ref(), direct, false)
    }

    fn open_mode(path: &Path, direct: DirectIo, writable: bool) -> io::Result<Self> {
        // Look first: opening a FIFO blocks until a writer comes, and O_EXCL
        // only means "exclusive" for block devices (without O_CREAT it is
        // undefined for anything else).
        // Nothing there: the open below says so.
        let block = device_kind(path)? == Some(FileKind::Block);
        let try_open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(writable);
            let mut flags = OFlags::empty();
            if direct {
                flags |= OFlags::DIRECT;
            }
            if writable && block {
                flags |= OFlags::EXCL;
            }
            o.custom_flags(flags.bits() as i32);
            o.open(path)
        };
        let (file, direct) = match direct {
            DirectIo::Off => (try_open(false), false),
            DirectIo::On => (try_open(true), true),
            DirectIo::Auto => match try_open(true) {
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => (try_open(false), false),
                r => (r, true),
            },
        };
        let mut file = file.map_err(|e| {
            if writable && block && e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error())
            {
                // Another blockalloc writer holds its lock through its own
                // exclusive open: name it when the lock table shows it.
                let holder = File::open(path)
                    .ok()
                    .and_then(|f| lock::writer_of(&f))
                    .filter(|h| h.pid().is_some())
                    .unwrap_or(LockHolder::System);
                DeviceBusy {
                    path: path.to_path_buf(),
                    holder,
                }
                .into_io()
            } else {
                with_path(path, "cannot open", e)
            }
        })?;
        let ft = file
            .metadata()
            .map_err(|e| with_path(path, "cannot stat", e))?
            .file_type();
        // Looked at again: the path may have been replaced meanwhile.
        let kind = NotADevice::check(path, ft).map_err(NotADevice::into_io)?;
        if writable {
            lock::lock_exclusive(&file, path)?;
        }
        let len = file
            .seek(SeekFrom::End(0))
            .map_err(|e| with_path(path, "cannot find the size of", e))?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            len,
            kind,
            direct,
            writable,
            claimed: AtomicBool::new(false),
        })
    }

    /// Creates the regular file `path` with `len` bytes, preallocated as
    /// `prealloc` says, and opens it. An existing non-empty file is refused
    /// ([`FileDevice::create_with`] can replace it).
    ///
    /// # Errors
    /// As [`FileDevice::create_with`].
    pub fn create(
        path: impl AsRef<Path>,
        len: u64,
        prealloc: Preallocation,
        direct: DirectIo,
    ) -> Result<Self, CreateError> {
        let opts = CreateOptions {
            prealloc,
            direct,
            overwrite: false,
        };
        Self::create_with(path, len, opts, &mut |_, _| {})
    }

    /// Creates the regular file `path` with `len` bytes as `opts` says, and
    /// opens it. `progress(done, total)` is called as zeros are written
    /// ([`ZeroMode::Write`]), after every MiB.
    ///
    /// Creating does no harm, in this order:
    /// * an existing path that is not a regular file, or a regular file
    ///   that is not empty (unless `opts.overwrite`), is refused untouched;
    /// * the size is set first, so a `len` beyond the file system's largest
    ///   file fails before any block is allocated, naming that limit (and an
    ///   existing file is only ever grown by that probe, never cut);
    /// * unless sparse, a `len` beyond the room for the file (the free space
    ///   plus what a file being replaced holds) is refused before anything
    ///   is discarded or reserved ([`CreateError::NotEnoughSpace`]);
    /// * any failure afterwards removes a file this call created, or
    ///   empties a file it was replacing, so that a failed create never
    ///   leaves a partial file filling the file system.
    ///
    /// # Errors
    /// [`CreateError`]: what was found at `path`, the size limit, no space,
    /// or the I/O error, each saying what was done with the file.
    pub fn create_with(
        path: impl AsRef<Path>,
        len: u64,
        opts: CreateOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, CreateError> {
        Self::create_reserving(path.as_ref(), len, opts, progress, reserve)
    }

    /// [`FileDevice::create_with`], reserving the blocks with `reserve`
    /// (tests stand in for a file system that fills up part way).
    fn create_reserving(
        path: &Path,
        len: u64,
        opts: CreateOptions,
        progress: &mut dyn FnMut(u64, u64),
        reserve: Reserve,
    ) -> Result<Self, CreateError> {
        let (file, origin) = open_for_create(path, opts.overwrite)?;
        if let Origin::Existing { len: old } = origin {
            if len > old {
                // Growing is harmless; a refused size leaves the file as it
                // was, so check the limit before discarding anything.
                if let Err(e) = file.set_len(len) {
                    return Err(size_error(path, &file, len, e, Cleanup::Untouched));
                }
            }
        }
        let cleanup = |file: &File| match origin {
            Origin::Created => match std::fs::remove_file(path) {
                Ok(()) => Cleanup::Removed,
                Err(e) => Cleanup::RemoveFailed(e.to_string()),
            },
            Origin::Existing { len: old } => match file.set_len(0) {
                Ok(()) if old == 0 => Cleanup::LeftEmpty,
                Ok(()) => Cleanup::Emptied,
                Err(e) => Cleanup::RemoveFailed(e.to_string()),
            },
        };
        // Measured once, before anything is discarded or reserved: after a
        // failed reservation the figure would be wrong (ext4 keeps what it
        // found until the file is closed, and it is still open here).
        let room = (opts.prealloc.allocate && len > 0)
            .then(|| room_for(path, &file))
            .flatten();
        if let Some(available) = room.filter(|&r| r < len) {
            // A fallocate larger than the free space fills the file system
            // before it fails, starving everything else on it meanwhile; and
            // a file being replaced keeps its contents.
            let cleanup = match origin {
                Origin::Created => cleanup(&file),
                Origin::Existing { len: old } => {
                    let _ = file.set_len(old);
                    Cleanup::Untouched
                }
            };
            return Err(CreateError::NotEnoughSpace {
                path: path.to_path_buf(),
                size: len,
                available,
                cleanup,
            });
        }
        if origin != (Origin::Existing { len: 0 }) {
            if let Err(e) = file.set_len(0) {
                let c = cleanup(&file);
                return Err(CreateError::io(path, "empty", e, c));
            }
        }
        if let Err(e) = file.set_len(len) {
            // Probe the limit before the file goes: it is the file that tells.
            let max = max_file_size(&file, len);
            let c = cleanup(&file);
            return Err(CreateError::too_large(path, len, max, e, c));
        }
        let fail = |file: &File, what: &'static str, e: io::Error| {
            let c = cleanup(file);
            if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) {
                CreateError::NoSpace {
                    path: path.to_path_buf(),
                    size: len,
                    available: room,
                    cleanup: c,
                }
            } else {
                CreateError::io(path, what, e, c)
            }
        };
        if opts.prealloc.allocate && len > 0 {
            reserve(&file, len, opts.prealloc.zero, progress)
                .map_err(|(what, e)| fail(&file, what, e))?;
        }
        rustix::fs::fdatasync(&file).map_err(|e| fail(&file, "sync", e.into()))?;
        // The device handle takes the lock again on its own open file
        // description; this one must let go first.
        lock::unlock(&file);
        match Self::open(path, opts.direct) {
            Ok(dev) => Ok(dev),
            Err(e) => Err(fail(&file, "open", e)),
        }
    }

    /// What the first MiB of the device holds (see [`Contents`]).
    ///
    /// # Errors
    /// When the device cannot be read.
    pub fn contents(&self) -> io::Result<Contents> {
        let n = self.len.min(PROBE_BYTES) / IO_ALIGN as u64 * IO_ALIGN as u64;
        if n == 0 {
            // Shorter than one I/O unit: too small for O_DIRECT reads.
            let mut head = Vec::new();
            File::open(&self.path)?.read_to_end(&mut head)?;
            return Ok(Contents::of(&head));
        }
        let mut head = AlignedBuf::zeroed(n as usize);
        self.read_at(0, head.as_mut_slice())?;
        Ok(Contents::of(head.as_slice()))
    }

    /// Refuses a device whose first MiB holds a known signature or any
    /// non-zero byte: formatting it would destroy somebody's data.
    ///
    /// # Errors
    /// [`CreateError::NotBlank`] naming what was found; [`CreateError::Io`]
    /// when the device cannot be read.
    pub fn ensure_blank(&self) -> Result<(), CreateError> {
        let contents = self
            .contents()
            .map_err(|e| CreateError::io(&self.path, "read", e, Cleanup::Untouched))?;
        if contents.is_blank() {
            return Ok(());
        }
        Err(CreateError::NotBlank {
            path: self.path.clone(),
            kind: self.kind,
            len: self.len,
            contents,
        })
    }

    /// The path opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Regular file or block device.
    pub fn kind(&self) -> FileKind {
        self.kind
    }

    /// True when opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The writer holding this device now, if any: `None` when no writer
    /// holds it. A device opened with [`open`](Self::open) is its own
    /// writer, so this says [`LockHolder::Process`] with this process's pid.
    /// What a reader sees while a writer is active may already be stale.
    pub fn writer(&self) -> Option<LockHolder> {
        lock::writer_of(&self.file)
    }
}

/// Writes zeros over `[offset, offset + len)` in 1 MiB writes, calling
/// `progress(done, len)` after each.
fn write_zeros(
    file: &File,
    offset: u64,
    len: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = offset;
    while at < offset + len {
        let n = CHUNK.min(offset + len - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
        progress(at - offset, len);
    }
    Ok(())
}

/// How [`FileDevice::create_with`] makes a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Preallocation of the new file.
    pub prealloc: Preallocation,
    /// `O_DIRECT` for the opened device.
    pub direct: DirectIo,
    /// Replace an existing non-empty regular file (its contents are lost).
    pub overwrite: bool,
}

/// Where the file being created came from: what a failure must undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// This call created it: a failure removes it.
    Created,
    /// It existed with `len` bytes: a failure empties it, never removes it.
    Existing { len: u64 },
}

/// What a failed [`FileDevice::create_with`] did with the file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cleanup {
    /// Nothing was changed.
    Untouched,
    /// The file it had created was removed.
    Removed,
    /// The file existed empty and was left empty.
    LeftEmpty,
    /// The file being replaced was left empty (its old contents were
    /// already discarded).
    Emptied,
    /// The partial file could not be removed or emptied: this error.
    RemoveFailed(String),
}

impl fmt::Display for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cleanup::Untouched => f.write_str("nothing was changed"),
            Cleanup::Removed => f.write_str("the file it had created was removed"),
            Cleanup::LeftEmpty => f.write_str("the file was left empty, as it was"),
            Cleanup::Emptied => {
                f.write_str("the file being replaced was left empty (its old contents are gone)")
            }
            Cleanup::RemoveFailed(e) => {
                write!(
                    f,
                    "the partial file could not be removed ({e}): remove it by hand"
                )
            }
        }
    }
}

/// A path that is neither a regular file nor a block device (a directory,
/// a character device such as `/dev/null`, a FIFO, a socket): no device can
/// be there. [`FileDevice::open`] and [`FileDevice::open_read_only`] return
/// it inside an `io::Error` of kind `InvalidInput` ([`NotADevice::from_io`]);
/// its class is [`ErrorClass::InvalidInput`].
#[derive(Debug, thiserror::Error)]
#[error("{} is {what}, not a regular file or a block device", path.display())]
pub struct NotADevice {
    /// The path given.
    pub path: PathBuf,
    /// What it is (`"a character device"`, `"a directory"`, ...).
    pub what: &'static str,
}

impl NotADevice {
    /// The kind of device a file of type `ft` at `path` is, or why none.
    fn check(path: &Path, ft: std::fs::FileType) -> Result<FileKind, NotADevice> {
        let what = if ft.is_file() {
            return Ok(FileKind::Regular);
        } else if ft.is_block_device() {
            return Ok(FileKind::Block);
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        Err(NotADevice {
            path: path.to_path_buf(),
            what,
        })
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, self)
    }

    /// The `NotADevice` inside an error returned by [`FileDevice::open`] or
    /// [`device_kind`], if that is why it failed.
    pub fn from_io(e: &io::Error) -> Option<&NotADevice> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }

    /// [`ErrorClass::InvalidInput`]: the caller named the wrong path.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::InvalidInput
    }
}

/// What is at `path`, looked at without opening it (opening a FIFO blocks;
/// opening a device can have effects): `None` when nothing is there, else
/// the kind of device.
///
/// # Errors
/// [`NotADevice`] (inside an `io::Error` of kind `InvalidInput`) for
/// anything else; the error of `stat`, naming the path.
pub fn device_kind(path: &Path) -> io::Result<Option<FileKind>> {
    match std::fs::metadata(path) {
        Ok(md) => NotADevice::check(path, md.file_type())
            .map(Some)
            .map_err(NotADevice::into_io),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(with_path(path, "cannot stat", e)),
    }
}

/// A failure of [`FileDevice::create_with`] or [`FileDevice::ensure_blank`].
/// Every message says what was found or what failed, what was done with
/// the file, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// The path exists and is neither a regular file nor a block device.
    #[error("{} is {what}, not a regular file or a block device", path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// What it is (`"a character device"`, `"a directory"`, ...).
        what: &'static str,
    },
    /// The path is a block device: it is used whole, never created.
    #[error("{} is a block device: it is used whole, with its own size (open it instead of creating a file)", path.display())]
    BlockDevice {
        /// The path given.
        path: PathBuf,
    },
    /// The file or block device holds something that formatting would
    /// destroy.
    #[error(
        "{} is not blank: it holds {}{contents}; refusing to overwrite it \
         (format with force (`--force`) to destroy its contents)",
        path.display(),
        match kind {
            FileKind::Regular => format!("{} with ", ByteSize(*len)),
            FileKind::Block => String::new(),
        }
    )]
    NotBlank {
        /// The path given.
        path: PathBuf,
        /// Regular file or block device.
        kind: FileKind,
        /// Its size in bytes.
        len: u64,
        /// What its first MiB holds.
        contents: Contents,
    },
    /// The size exceeds the largest file the file system allows.
    #[error(
        "{} ({size} bytes) is larger than the largest file the file system holding {} allows{}; {cleanup}. \
         Choose a smaller size, or a file system with larger files (XFS allows 8 EiB)",
        ByteSize(*size),
        path.display(),
        max.map_or_else(String::new, |m| format!(" ({}, {m} bytes)", ByteSize(m)))
    )]
    TooLarge {
        /// The path given.
        path: PathBuf,
        /// Bytes asked for.
        size: u64,
        /// The largest size the file system accepted, when found.
        max: Option<u64>,
        /// What was done with the file.
        cleanup: Cleanup,
    },
    /// The file system ran out of space while reserving or zeroing.
    #[error(
        "no space for {} on the file system holding {}{}; {cleanup}. \
         Free space, choose a smaller size, or make a sparse file (`--sparse`: blocks are found \
         at first write, and a full file system fails writes later)",
        ByteSize(*size),
        path.display(),
        available.map_or_else(String::new, |a| format!(
            " ({} ({a} bytes) were free for it before anything was reserved)",
            ByteSize(a)
        ))
    )]
    NoSpace {
        /// The path given.
        path: PathBuf,
        /// Bytes asked for.
        size: u64,
        /// Bytes that were available to the file before anything was
        /// reserved (free for unprivileged users, plus what a file being
        /// replaced held), when known.
        available: Option<u64>,
        /// What was done with the file.
        cleanup: Cleanup,
    },
    /// The file system has less room for the file than the size to reserve
    /// (free space plus what a file being replaced holds): refused before
    /// reserving anything, and before a file being replaced is discarded.
    #[error(
        "{} ({size} bytes) does not fit on the file system holding {}: {} ({available} bytes) \
         free for it; nothing was reserved and {cleanup}. Free space, choose a smaller size, or make a \
         sparse file (`--sparse`: blocks are found at first write, and a full file system fails \
         writes later)",
        ByteSize(*size),
        path.display(),
        ByteSize(*available)
    )]
    NotEnoughSpace {
        /// The path given.
        path: PathBuf,
        /// Bytes asked for.
        size: u64,
        /// Bytes available to the file: free for unprivileged users, plus
        /// what a file being replaced holds.
        available: u64,
        /// What was done with the file.
        cleanup: Cleanup,
    },
    /// Any other I/O failure; the I/O error is its `source`.
    #[error("cannot {what} {} ({cleanup})", path.display())]
    Io {
        /// The path given.
        path: PathBuf,
        /// What failed (`"create"`, `"fallocate"`, ...).
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
        /// What was done with the file.
        cleanup: Cleanup,
    },
}

impl CreateError {
    fn io(path: &Path, what: &'static str, source: io::Error, cleanup: Cleanup) -> Self {
        CreateError::Io {
            path: path.to_path_buf(),
            what,
            source,
            cleanup,
        }
    }

    fn too_large(path: &Path, size: u64, max: Option<u64>, e: io::Error, cleanup: Cleanup) -> Self {
        if e.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error()) {
            CreateError::TooLarge {
                path: path.to_path_buf(),
                size,
                max,
                cleanup,
            }
        } else {
            CreateError::io(path, "size", e, cleanup)
        }
    }

    /// What kind of failure this is: [`ErrorClass::AlreadyExists`] for a
    /// file or device that is not blank, [`ErrorClass::InvalidInput`] for
    /// the other refusals ([`is_refusal`](Self::is_refusal)),
    /// [`ErrorClass::NoSpace`] for a full file system, else
    /// [`ErrorClass::Io`].
    pub fn class(&self) -> ErrorClass {
        match self {
            CreateError::NotBlank { .. } => ErrorClass::AlreadyExists,
            CreateError::NotAFile { .. }
            | CreateError::BlockDevice { .. }
            | CreateError::TooLarge { .. } => ErrorClass::InvalidInput,
            CreateError::NoSpace { .. } | CreateError::NotEnoughSpace { .. } => ErrorClass::NoSpace,
            CreateError::Io { .. } => ErrorClass::Io,
        }
    }

    /// True when the request was refused before anything was changed
    /// because of what it asked for or what it found: the caller can fix it
    /// by changing the request.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.class(),
            ErrorClass::InvalidInput | ErrorClass::AlreadyExists
        )
    }
}

impl From<CreateError> for io::Error {
    fn from(e: CreateError) -> Self {
        let kind = match &e {
            CreateError::NotAFile { .. } | CreateError::BlockDevice { .. } => {
                io::ErrorKind::InvalidInput
            }
            CreateError::NotBlank { .. } => io::ErrorKind::AlreadyExists,
            CreateError::TooLarge { .. } => io::ErrorKind::FileTooLarge,
            CreateError::NoSpace { .. } | CreateError::NotEnoughSpace { .. } => {
                io::ErrorKind::StorageFull
            }
            CreateError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Opens `path` for [`FileDevice::create_with`]: creates it when missing
/// (`O_EXCL`, so a file found here is never mistaken for one created here),
/// else takes an empty regular file, or a non-empty one with `overwrite`.
fn open_for_create(path: &Path, overwrite: bool) -> Result<(File, Origin), CreateError> {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    // The exclusive lock a writer holds is taken before anything is
    // changed, so that not even `overwrite` can destroy a device in use.
    let locked = |file: File| {
        lock::lock_exclusive(&file, path)
            .map(|()| file)
            .map_err(|e| CreateError::io(path, "lock", e, Cleanup::Untouched))
    };
    match o.clone().create_new(true).open(path) {
        Ok(f) => return Ok((locked(f)?, Origin::Created)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CreateError::io(path, "create", e, Cleanup::Untouched)),
    }
    // Stat before opening: opening a FIFO or a device has effects.
    let md = std::fs::metadata(path)
        .map_err(|e| CreateError::io(path, "stat", e, Cleanup::Untouched))?;
    match NotADevice::check(path, md.file_type()) {
        Ok(FileKind::Regular) => {}
        Ok(FileKind::Block) => {
            return Err(CreateError::BlockDevice {
                path: path.to_path_buf(),
            })
        }
        Err(NotADevice { path, what }) => return Err(CreateError::NotAFile { path, what }),
    }
    let file = locked(
        o.open(path)
            .map_err(|e| CreateError::io(path, "open", e, Cleanup::Untouched))?,
    )?;
    let len = file
        .metadata()
        .map_err(|e| CreateError::io(path, "stat", e, Cleanup::Untouched))?
        .len();
    if len > 0 && !overwrite {
        let mut head = Vec::new();
        (&file)
            .take(PROBE_BYTES)
            .read_to_end(&mut head)
            .map_err(|e| CreateError::io(path, "read", e, Cleanup::Untouched))?;
        return Err(CreateError::NotBlank {
            path: path.to_path_buf(),
            kind: FileKind::Regular,
            len,
            contents: Contents::of(&head),
        });
    }
    Ok((file, Origin::Existing { len }))
}

/// The error of growing a file to `len`, with the limit found when the
/// file system refused the size. The file is only grown by the probe, so
/// it is left as it was.
fn size_error(path: &Path, file: &File, len: u64, e: io::Error, cleanup: Cleanup) -> CreateError {
    let max = if e.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error()) {
        let old = file.metadata().map(|m| m.len()).unwrap_or(0);
        let max = max_file_size(file, len);
        let _ = file.set_len(old);
        max
    } else {
        None
    };
    CreateError::too_large(path, len, max, e, cleanup)
}

/// The largest size below `refused` that `file`'s file system accepts
/// (`EFBIG` above it), found by bisection on the file's length: setting a
/// length allocates nothing, so 64 probes cost microseconds. The file is
/// left at whatever length the last probe set; callers reset it.
fn max_file_size(file: &File, refused: u64) -> Option<u64> {
    let (mut ok, mut bad) = (0u64, refused);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        match file.set_len(mid) {
            Ok(()) => ok = mid,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error()) => bad = mid,
            Err(_) => return None,
        }
    }
    Some(ok)
}

/// How [`FileDevice::create_with`] reserves and zeroes `len` bytes of a
/// file; on failure, what failed and the error.
type Reserve =
    fn(&File, u64, ZeroMode, &mut dyn FnMut(u64, u64)) -> Result<(), (&'static str, io::Error)>;

/// The [`Reserve`] of [`FileDevice::create_with`]: `fallocate`, then zeroing
/// as `zero` says.
fn reserve(
    file: &File,
    len: u64,
    zero: ZeroMode,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), (&'static str, io::Error)> {
    rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len)
        .map_err(|e| ("fallocate", e.into()))?;
    match zero {
        ZeroMode::None => Ok(()),
        ZeroMode::ZeroRange => rustix::fs::fallocate(file, FallocateFlags::ZERO_RANGE, 0, len)
            .map_err(|e| ("zero (FALLOC_FL_ZERO_RANGE)", e.into())),
        ZeroMode::Write => write_zeros(file, 0, len, progress).map_err(|e| ("write zeros to", e)),
    }
}

/// The bytes `file` at `path` can be given: what the file system has free
/// for unprivileged users, plus what the file holds now (replacing it frees
/// that).
fn room_for(path: &Path, file: &File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let held = file.metadata().ok()?.blocks().saturating_mul(512);
    Some(available_bytes(path)?.saturating_add(held))
}

/// Bytes free for unprivileged users on the file system holding `path`.
fn available_bytes(path: &Path) -> Option<u64> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

impl Device for FileDevice {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(offset, buf.len())?;
        check_bounds(self.len, offset, buf.len(), false)?;
        if self.direct && !is_aligned(buf) {
            let mut tmp = AlignedBuf::zeroed(buf.len());
            self.file.read_exact_at(tmp.as_mut_slice(), offset)?;
            buf.copy_from_slice(tmp.as_slice());
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is open read-only: write of {} bytes at offset {offset} refused",
                    self.path.display(),
                    data.len()
                ),
            ));
        }
        check_aligned(offset, data.len())?;
        check_bounds(self.len, offset, data.len(), true)?;
        if self.direct && !is_aligned(data) {
            let mut tmp = AlignedBuf::zeroed(data.len());
            tmp.as_mut_slice().copy_from_slice(data);
            return self.file.write_all_at(tmp.as_slice(), offset);
        }
        self.file.write_all_at(data, offset)
    }

    fn sync(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        rustix::fs::fdatasync(&self.file).map_err(io::Error::from)
    }

    fn is_read_only(&self) -> bool {
        !self.writable
    }

    fn claim(&self) -> io::Result<()> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(DeviceBusy {
                path: self.path.clone(),
                holder: LockHolder::Process(std::process::id()),
            }
            .into_io());
        }
        Ok(())
    }

    fn release(&self) {
        self.claimed.store(false, Ordering::Release);
    }

    fn describe(&self) -> String {
        format!(
            "{} {}{}{}",
            match self.kind {
                FileKind::Regular => "file",
                FileKind::Block => "block device",
            },
            self.path.display(),
            if self.direct { " (O_DIRECT)" } else { "" },
            if self.writable { "" } else { " (read-only)" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_write_read_sync_every_mode() {
        let dir = tempfile::tempdir().unwrap();
        for (i, prealloc) in [
            Preallocation {
                allocate: false,
                zero: ZeroMode::None,
            },
            Preallocation {
                allocate: true,
                zero: ZeroMode::None,
            },
            Preallocation {
                allocate: true,
                zero: ZeroMode::ZeroRange,
            },
            Preallocation::default(),
        ]
        .into_iter()
        .enumerate()
        {
            let p = dir.path().join(format!("dev{i}"));
            let d = FileDevice::create(&p, 1 << 20, prealloc, DirectIo::Auto).unwrap();
            assert_eq!(d.len(), 1 << 20);
            assert_eq!(d.kind(), FileKind::Regular);
            let mut page = AlignedBuf::zeroed(4096);
            page.as_mut_slice().fill(0xab);
            d.write_at(8192, page.as_slice()).unwrap();
            // A misaligned buffer goes through a copy.
            let v = vec![0xcdu8; 4097];
            d.write_at(12288, &v[1..]).unwrap();
            d.sync().unwrap();
            let mut back = vec![0u8; 4096 * 3 + 1];
            d.read_at(8192, &mut back[1..4096 + 1]).unwrap();
            assert!(back[1..4097].iter().all(|&b| b == 0xab));
            let reopened = FileDevice::open_read_only(&p, DirectIo::Off).unwrap();
            let mut b2 = vec![0u8; 4096];
            reopened.read_at(12288, &mut b2).unwrap();
            assert!(b2.iter().all(|&b| b == 0xcd));
            reopened.read_at(0, &mut b2).unwrap();
            assert!(b2.iter().all(|&b| b == 0));
            assert!(d.describe().contains("dev"));
            assert!(d.write_at(1 << 20, page.as_slice()).is_err());
            assert!(d.write_at(100, page.as_slice()).is_err());
        }
    }

    #[test]
    fn open_errors_name_the_path() {
        let e = FileDevice::open("/nonexistent/blockalloc-dev", DirectIo::Off).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/blockalloc-dev"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = FileDevice::open(dir.path(), DirectIo::Off).unwrap_err();
        assert!(e.to_string().contains(dir.path().to_str().unwrap()), "{e}");
    }

    #[test]
    fn open_refuses_a_path_that_is_no_device_without_opening_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = {
            let _spawn = no_spawns();
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut cases = vec![
            (PathBuf::from("/dev/null"), "a character device"),
            (dir.path().to_path_buf(), "a directory"),
        ];
        if made {
            cases.push((fifo, "a FIFO"));
        } else {
            eprintln!("SKIPPED the FIFO case: mkfifo failed");
        }
        for (path, what) in cases {
            for writable in [true, false] {
                // In a thread: opening a FIFO would block until a writer came.
                let (tx, rx) = std::sync::mpsc::channel();
                let p = path.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(FileDevice::open_mode(&p, DirectIo::Auto, writable).map(drop));
                });
                let e = rx
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .unwrap_or_else(|_| panic!("opening {} blocked", path.display()))
                    .unwrap_err();
                let n = NotADevice::from_io(&e).unwrap_or_else(|| panic!("{e:?}"));
                assert_eq!((n.path.as_path(), n.what), (path.as_path(), what));
                assert_eq!(
                    e.to_string(),
                    format!(
                        "{} is {what}, not a regular file or a block device",
                        path.display()
                    )
                );
                assert_eq!(DeviceBusy::class_of_io(&e), ErrorClass::InvalidInput);
            }
        }
    }

    fn sparse() -> CreateOptions {
        CreateOptions {
            prealloc: Preallocation {
                allocate: false,
                zero: ZeroMode::None,
            },
            ..CreateOptions::default()
        }
    }

    #[test]
    fn create_refuses_a_non_empty_file_and_leaves_it_alone() {
        // The overwrite at the end needs the lock the refused creates took
        // back: no other test may fork while they hold it (see `SPAWNS`).
        let _spawn = no_spawns();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.txt");
        std::fs::write(&p, b"data\n").unwrap();
        let e =
            FileDevice::create(&p, 64 << 20, Preallocation::default(), DirectIo::Auto).unwrap_err();
        assert!(matches!(e, CreateError::NotBlank { len: 5, .. }), "{e:?}");
        assert!(e.is_refusal());
        let msg = e.to_string();
        assert!(msg.contains("p.txt") && msg.contains("5B"), "{msg}");
        assert!(msg.contains("--force"), "{msg}");
        assert_eq!(std::fs::read(&p).unwrap(), b"data\n");
        // Known contents are named.
        let mut ext4 = vec![0u8; 4096];
        ext4[1080..1082].copy_from_slice(&[0x53, 0xef]);
        std::fs::write(&p, &ext4).unwrap();
        let e =
            FileDevice::create(&p, 1 << 20, Preallocation::default(), DirectIo::Auto).unwrap_err();
        assert!(e.to_string().contains("ext2/3/4"), "{e}");
        // With overwrite it is replaced, zeroed.
        let opts = CreateOptions {
            overwrite: true,
            ..CreateOptions::default()
        };
        let d = FileDevice::create_with(&p, 1 << 20, opts, &mut |_, _| {}).unwrap();
        assert_eq!(d.len(), 1 << 20);
        assert_eq!(d.contents().unwrap(), Contents::Zeros);
    }

    #[test]
    fn overwrite_refuses_a_device_that_a_writer_holds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        // A child of another test would hold the writer's lock from its
        // fork until its exec, past the writer's drop (see `SPAWNS`).
        let _spawn = no_spawns();
        let writer =
            FileDevice::create(&p, 1 << 20, Preallocation::default(), DirectIo::Off).unwrap();
        let mut page = AlignedBuf::zeroed(4096);
        page.as_mut_slice().fill(0x5a);
        writer.write_at(0, page.as_slice()).unwrap();
        writer.sync().unwrap();
        let opts = CreateOptions {
            overwrite: true,
            ..CreateOptions::default()
        };
        let e = FileDevice::create_with(&p, 2 << 20, opts, &mut |_, _| {}).unwrap_err();
        let busy = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .and_then(DeviceBusy::from_io);
        assert!(busy.is_some(), "{e:?}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
        let mut back = vec![0u8; 4096];
        writer.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a));
        drop(writer);
        let d = FileDevice::create_with(&p, 2 << 20, opts, &mut |_, _| {}).unwrap();
        assert_eq!(d.len(), 2 << 20);
    }

    #[test]
    fn create_takes_an_empty_file_and_refuses_other_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty");
        std::fs::write(&p, b"").unwrap();
        let d = FileDevice::create(&p, 1 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
        assert_eq!(d.len(), 1 << 20);
        let e = FileDevice::create(dir.path(), 1 << 20, Preallocation::default(), DirectIo::Off)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CreateError::NotAFile {
                    what: "a directory",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = FileDevice::create(
            "/dev/null",
            64 << 20,
            Preallocation::default(),
            DirectIo::Off,
        )
        .unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
    }

    #[test]
    fn ensure_blank_names_a_signature() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        let d = FileDevice::create(&p, 1 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
        d.ensure_blank().unwrap();
        let mut page = AlignedBuf::zeroed(4096);
        page.as_mut_slice()[..4].copy_from_slice(b"XFSB");
        d.write_at(0, page.as_slice()).unwrap();
        let e = d.ensure_blank().unwrap_err();
        assert!(e.to_string().contains("an XFS file system"), "{e}");
    }

    #[test]
    fn create_beyond_the_file_size_limit_names_it_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("huge");
        // ext4 with 4 KiB blocks stops one block short of 16 TiB.
        let size = 16u64 << 40;
        match FileDevice::create_with(&p, size, sparse(), &mut |_, _| {}) {
            Ok(_) => eprintln!("skipped: this file system holds a {size}-byte file"),
            Err(e) => {
                let CreateError::TooLarge { max: Some(max), .. } = &e else {
                    panic!("{e:?}");
                };
                assert!(*max < size && *max > 1 << 40, "{max}");
                assert!(e.to_string().contains(&max.to_string()), "{e}");
                assert!(e.to_string().contains("was removed"), "{e}");
                assert!(!p.exists());
                // An existing empty file is probed without being changed.
                std::fs::write(&p, b"").unwrap();
                let e = FileDevice::create_with(&p, size, sparse(), &mut |_, _| {}).unwrap_err();
                assert!(matches!(e, CreateError::TooLarge { .. }), "{e:?}");
                assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
                // A file being replaced keeps its contents when the size is
                // refused.
                std::fs::write(&p, b"keep").unwrap();
                let opts = CreateOptions {
                    overwrite: true,
                    ..sparse()
                };
                let e = FileDevice::create_with(&p, size, opts, &mut |_, _| {}).unwrap_err();
                assert!(e.to_string().contains("nothing was changed"), "{e}");
                assert_eq!(std::fs::read(&p).unwrap(), b"keep");
            }
        }
    }

    /// Held by every test that starts a process, and by a test that needs a
    /// closed file's space or lock back: a child process holds a copy of
    /// every open file from its fork until its exec, so a removed file's
    /// space, or a dropped device's lock, may come back only when a child of
    /// another test execs.
    static SPAWNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn no_spawns() -> std::sync::MutexGuard<'static, ()> {
        SPAWNS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A small tmpfs mount, unmounted on drop.
    struct Tmpfs(tempfile::TempDir);

    impl Tmpfs {
        fn mount(size: &str) -> Option<Tmpfs> {
            let dir = tempfile::tempdir().ok()?;
            let _spawn = no_spawns();
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ok.then_some(Tmpfs(dir))
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _spawn = no_spawns();
            let _ = std::process::Command::new("umount")
                .arg(self.0.path())
                .status();
        }
    }

    #[test]
    fn create_larger_than_the_free_space_is_refused_before_reserving() {
        let Some(fs) = Tmpfs::mount("16m") else {
            eprintln!("skipped: cannot mount a tmpfs (not root?)");
            return;
        };
        let p = fs.0.path().join("dev");
        for zero in [ZeroMode::None, ZeroMode::Write] {
            let opts = CreateOptions {
                prealloc: Preallocation {
                    allocate: true,
                    zero,
                },
                ..CreateOptions::default()
            };
            let e = FileDevice::create_with(&p, 64 << 20, opts, &mut |_, _| {}).unwrap_err();
            let CreateError::NotEnoughSpace {
                size,
                available,
                cleanup: Cleanup::Removed,
                ..
            } = &e
            else {
                panic!("{e:?}");
            };
            assert_eq!(*size, 64 << 20);
            assert!(
                *available > 15 << 20 && *available <= 16 << 20,
                "{available}"
            );
            let text = e.to_string();
            assert!(text.contains("64MiB") && text.contains("16MiB"), "{text}");
            assert!(text.contains("--sparse"), "{text}");
            assert_eq!(e.class(), ErrorClass::NoSpace);
            assert!(!p.exists(), "{e}");
        }
        // A file found there is refused before it is touched.
        std::fs::write(&p, b"old").unwrap();
        let opts = CreateOptions {
            overwrite: true,
            ..CreateOptions::default()
        };
        let e = FileDevice::create_with(&p, 64 << 20, opts, &mut |_, _| {}).unwrap_err();
        assert!(
            matches!(
                e,
                CreateError::NotEnoughSpace {
                    cleanup: Cleanup::Untouched,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        // A sparse file of that size reserves nothing, so it is made.
        let opts = CreateOptions {
            overwrite: true,
            ..sparse()
        };
        let d = FileDevice::create_with(&p, 64 << 20, opts, &mut |_, _| {}).unwrap();
        assert_eq!(d.len(), 64 << 20);
    }

    #[test]
    fn replacing_a_file_counts_its_space_and_a_refusal_keeps_its_contents() {
        let Some(fs) = Tmpfs::mount("16m") else {
            eprintln!(
                "SKIPPED replacing_a_file_counts_its_space...: cannot mount a tmpfs (not root?)"
            );
            return;
        };
        // The second create needs the refused one's lock back, and the room
        // it counts must not hold a forked child's copy of anything (see
        // `SPAWNS`); released before the unmount takes it.
        let _spawn = no_spawns();
        let p = fs.0.path().join("dev");
        // 12 MiB held by the file, about 4 MiB free besides.
        let old = vec![7u8; 12 << 20];
        std::fs::write(&p, &old).unwrap();
        let opts = CreateOptions {
            overwrite: true,
            ..CreateOptions::default()
        };
        let e = FileDevice::create_with(&p, 20 << 20, opts, &mut |_, _| {}).unwrap_err();
        let CreateError::NotEnoughSpace {
            available,
            cleanup: Cleanup::Untouched,
            ..
        } = &e
        else {
            panic!("{e:?}");
        };
        // The room counts what the file holds, and the refusal left it be.
        assert!(
            *available > 15 << 20 && *available <= 16 << 20,
            "{available}"
        );
        assert!(e.to_string().contains("nothing was changed"), "{e}");
        assert!(std::fs::read(&p).unwrap() == old, "contents changed");
        // What the file holds plus the free space is room enough for 14 MiB.
        let d = FileDevice::create_with(&p, 14 << 20, opts, &mut |_, _| {}).unwrap();
        assert_eq!(d.len(), 14 << 20);
    }

    #[test]
    fn no_space_reports_the_room_before_reserving_not_what_the_failed_reservation_left() {
        let Some(fs) = Tmpfs::mount("16m") else {
            eprintln!("SKIPPED no_space_reports_the_room...: cannot mount a tmpfs (not root?)");
            return;
        };
        let p = fs.0.path().join("dev");
        // As ext4's fallocate does when it runs out: keep every block found,
        // then fail. The file is still open when the error is made, so the
        // file system reads (nearly) full even after the file is unlinked.
        fn fill_then_fail(
            file: &File,
            len: u64,
            _: ZeroMode,
            _: &mut dyn FnMut(u64, u64),
        ) -> Result<(), (&'static str, io::Error)> {
            let chunk = vec![1u8; 1 << 20];
            let mut at = 0;
            loop {
                match file.write_all_at(&chunk, at) {
                    Ok(()) => at += chunk.len() as u64,
                    Err(e) => {
                        assert!(at >= len, "the fake filled only {at} bytes: {e}");
                        return Err(("fallocate", e));
                    }
                }
            }
        }
        // No other test may fork while the file is open (see `SPAWNS`).
        let _spawn = no_spawns();
        let e = FileDevice::create_reserving(
            &p,
            8 << 20,
            CreateOptions::default(),
            &mut |_, _| {},
            fill_then_fail,
        )
        .unwrap_err();
        let CreateError::NoSpace {
            available: Some(available),
            cleanup: Cleanup::Removed,
            ..
        } = &e
        else {
            panic!("{e:?}");
        };
        assert!(
            *available > 15 << 20 && *available <= 16 << 20,
            "{available}"
        );
        let text = e.to_string();
        assert!(text.contains("before anything was reserved"), "{text}");
        assert!(!text.contains("(0B"), "{text}");
        assert!(!p.exists());
        // Closed, the removed file gave its space back.
        let now = available_bytes(&p).unwrap();
        assert!(now > 15 << 20, "{now}");
    }

    #[test]
    fn zeroing_reports_progress_up_to_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let len = (3 << 20) + 4096;
        let mut seen = Vec::new();
        let opts = CreateOptions::default();
        FileDevice::create_with(dir.path().join("d"), len, opts, &mut |done, total| {
            seen.push((done, total))
        })
        .unwrap();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(*seen.last().unwrap(), (len, len));
    }
}
