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
//! * **Preallocation** (seed 004, [`Preallocation`]): creating a file
//!   reserves its blocks with `fallocate` and optionally zeroes them, so that
//!   object writes later overwrite blocks in place instead of making the
//!   filesystem allocate blocks or convert unwritten extents — metadata
//!   journal traffic on every first write. BENCHMARKS.md records what each
//!   mode costs and buys.
//! * **Sync** is `fdatasync`.
//! * **One writer** ([`FileDevice::open`]): an exclusive lock per open, so
//!   a second writer — in another process or in this one — gets a busy
//!   error naming the holder; [`FileDevice::open_read_only`] takes no lock
//!   and refuses writes (see [`super::lock`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{FallocateFlags, OFlags};

use super::aligned::is_aligned;
use super::lock::{self, DeviceBusy, LockHolder};
use super::{check_aligned, check_bounds, AlignedBuf, Device};

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
    /// `fallocate(FALLOC_FL_ZERO_RANGE)`. Fast, but on ext4 and XFS it leaves
    /// unwritten extents too, so it buys nothing over `None` for later
    /// writes (measured in BENCHMARKS.md); kept for filesystems that zero
    /// in place.
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
        // O_EXCL only means "exclusive" for block devices (without O_CREAT
        // it is undefined for anything else), so look first.
        let block = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
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
        let kind = if ft.is_file() {
            FileKind::Regular
        } else if ft.is_block_device() {
            FileKind::Block
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };
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

    /// Creates (or truncates) the regular file `path` with `len` bytes,
    /// preallocated as `prealloc` says, and opens it.
    ///
    /// # Errors
    /// When the file cannot be created, `fallocate` fails (no space, or the
    /// filesystem does not support it), or zeroing fails.
    pub fn create(
        path: impl AsRef<Path>,
        len: u64,
        prealloc: Preallocation,
        direct: DirectIo,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| with_path(path, "cannot create", e))?;
        if prealloc.allocate {
            rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, len)
                .map_err(|e| with_path(path, "fallocate failed on", e.into()))?;
            match prealloc.zero {
                ZeroMode::None => {}
                ZeroMode::ZeroRange => {
                    rustix::fs::fallocate(&file, FallocateFlags::ZERO_RANGE, 0, len)
                        .map_err(|e| with_path(path, "FALLOC_FL_ZERO_RANGE failed on", e.into()))?
                }
                ZeroMode::Write => {
                    write_zeros(&file, 0, len).map_err(|e| with_path(path, "cannot zero", e))?
                }
            }
        } else {
            file.set_len(len)
                .map_err(|e| with_path(path, "cannot size", e))?;
        }
        rustix::fs::fdatasync(&file).map_err(|e| with_path(path, "cannot sync", e.into()))?;
        drop(file);
        Self::open(path, direct)
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

/// Writes zeros over `[offset, offset + len)` in 1 MiB writes.
pub(crate) fn write_zeros(file: &File, offset: u64, len: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = offset;
    while at < offset + len {
        let n = CHUNK.min(offset + len - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
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
}
