//! The device: where a store keeps its metadata (and its users their data).
//!
//! A [`Device`] is a flat array of bytes with four operations — read, write,
//! sync, size. The store needs nothing else, so every implementation is
//! small:
//!
//! * [`FileDevice`] — a regular file or a block device, optionally with
//!   `O_DIRECT`; creating a file preallocates it. Opened for
//!   writing it is locked to one writer ([`lock`]); opened read-only it
//!   refuses writes.
//! * [`MemDevice`] — bytes in memory, for tests and examples.
//! * [`FaultDevice`] — wraps an image and injects faults: it fails I/O after a
//!   countdown, keeps unsynced writes apart so that a simulated crash can
//!   drop, keep or tear them.
//!
//! # Contract
//!
//! * **Units.** Every offset and length the store passes is a multiple of
//!   [`IO_ALIGN`] (4096 bytes), and every buffer it passes starts at a
//!   4096-byte-aligned address (see [`AlignedBuf`]). Implementations may
//!   refuse other requests with `ErrorKind::InvalidInput`; none may panic on
//!   them.
//! * **Bounds.** A request reaching past [`Device::len`] fails with
//!   `ErrorKind::UnexpectedEof` (read) or `ErrorKind::InvalidInput` (write).
//! * **Reads** return the bytes most recently written to the range by this
//!   handle, synced or not.
//! * **Writes** are durable only after a later [`Device::sync`] returns `Ok`.
//!   Until then, after a crash, any 512-byte sector of an unsynced write may
//!   hold its old or its new contents, independently of the others: a write
//!   may be lost, kept, or torn, and unsynced writes may land in any order.
//!   Nothing larger than a sector is ever assumed to be written atomically.
//! * **Sync** makes every write that completed before the call durable
//!   (`fdatasync` for files: data and the metadata needed to read it back).
//!   When it fails, whatever was not yet synced is in an unknown state (the
//!   kernel may have dropped dirty pages), so a store treats a failed sync as
//!   fatal and must be reopened.
//! * A device handle is shared between threads (`Send + Sync`); the store
//!   never issues overlapping writes concurrently.
//! * A **read-only** device ([`Device::is_read_only`]) refuses every write;
//!   a store opened on it never issues one.

mod aligned;
mod fault;
mod file;
pub mod lock;
mod mem;
mod signature;

use std::io;
use std::sync::Arc;

pub use aligned::AlignedBuf;
pub use fault::{CrashMode, FaultDevice, FaultStats};
pub use file::{
    device_kind, Cleanup, CreateError, CreateOptions, DirectIo, FileDevice, FileKind, NotADevice,
    Preallocation, ZeroMode,
};
pub use lock::{DeviceBusy, LockHolder};
pub use mem::MemDevice;
pub use signature::{Contents, PROBE_BYTES};

/// Alignment, in bytes, of every offset, length and buffer address the store
/// uses for device I/O: 4096, the largest logical sector size in common use,
/// so that `O_DIRECT` works on any device.
pub const IO_ALIGN: usize = 4096;

/// Sector size assumed atomic at best (see the module docs): a crash may tear
/// a write at any multiple of this many bytes.
pub const SECTOR: usize = 512;

/// A flat, fixed-size array of bytes that survives crashes once synced.
///
/// See the [module documentation](self) for the full contract.
pub trait Device: Send + Sync {
    /// Size of the device in bytes.
    fn len(&self) -> u64;

    /// True when the device holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    ///
    /// # Errors
    /// I/O errors; `UnexpectedEof` past the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes `data` at `offset`. Not durable until [`sync`](Self::sync).
    ///
    /// # Errors
    /// I/O errors; `InvalidInput` past the end.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Makes every completed write durable.
    ///
    /// # Errors
    /// I/O errors. After an error, unsynced writes are in an unknown state.
    fn sync(&self) -> io::Result<()>;

    /// A short description for reports (`"file /dev/sdb (O_DIRECT)"`).
    fn describe(&self) -> String;

    /// True when the device refuses writes (opened read-only). A store
    /// opened on it is read-only and never tries to write.
    fn is_read_only(&self) -> bool {
        false
    }

    /// Claims the device for one writing store: a second claim on the same
    /// handle before [`release`](Self::release) fails with a busy error, so
    /// two stores sharing one handle (an `Arc` of one open) cannot hand out
    /// the same blocks. Devices that cannot be shared by accident (test
    /// devices) accept every claim.
    ///
    /// # Errors
    /// `ResourceBusy` carrying a [`DeviceBusy`] when already claimed.
    fn claim(&self) -> io::Result<()> {
        Ok(())
    }

    /// Ends a [`claim`](Self::claim).
    fn release(&self) {}
}

/// Implements [`Device`] for smart pointers by forwarding each method to the
/// device pointed to; the provided ones too, so that a pointer never falls
/// back on a default its device overrides (`claim`, `is_read_only`).
macro_rules! forward_device {
    ($($ptr:ident),+) => {$(
        impl<D: Device + ?Sized> Device for $ptr<D> {
            fn len(&self) -> u64 {
                (**self).len()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
                (**self).read_at(offset, buf)
            }
            fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
                (**self).write_at(offset, data)
            }
            fn sync(&self) -> io::Result<()> {
                (**self).sync()
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
            fn is_read_only(&self) -> bool {
                (**self).is_read_only()
            }
            fn claim(&self) -> io::Result<()> {
                (**self).claim()
            }
            fn release(&self) {
                (**self).release()
            }
        }
    )+};
}

forward_device!(Arc, Box);

/// Checks a request against the device size: the shared bounds rule of the
/// contract.
pub(crate) fn check_bounds(len: u64, offset: u64, count: usize, write: bool) -> io::Result<()> {
    let end = offset.checked_add(count as u64);
    match end {
        Some(end) if end <= len => Ok(()),
        _ => Err(io::Error::new(
            if write {
                io::ErrorKind::InvalidInput
            } else {
                io::ErrorKind::UnexpectedEof
            },
            format!(
                "{} of {count} bytes at offset {offset} reaches past the end of the device ({len} bytes)",
                if write { "write" } else { "read" }
            ),
        )),
    }
}

/// Checks the alignment rule of the contract for an offset and a length.
pub(crate) fn check_aligned(offset: u64, count: usize) -> io::Result<()> {
    if !offset.is_multiple_of(IO_ALIGN as u64) || !count.is_multiple_of(IO_ALIGN) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "unaligned device I/O: offset {offset} and length {count} must be multiples of {IO_ALIGN}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment() {
        assert!(check_bounds(8192, 4096, 4096, true).is_ok());
        let e = check_bounds(8192, 4096, 8192, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = check_bounds(8192, u64::MAX, 1, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(check_aligned(4096, 8192).is_ok());
        assert!(check_aligned(4095, 4096).is_err());
        assert!(check_aligned(4096, 100).is_err());
    }

    #[test]
    fn arc_and_box_forward() {
        let m = Arc::new(MemDevice::new(8192));
        let b: Box<dyn Device> = Box::new(Arc::clone(&m));
        let mut buf = AlignedBuf::zeroed(4096);
        buf.as_mut_slice()[0] = 7;
        b.write_at(4096, buf.as_slice()).unwrap();
        b.sync().unwrap();
        let mut out = vec![0u8; 4096];
        m.read_at(4096, &mut out).unwrap();
        assert_eq!(out[0], 7);
        assert_eq!(b.len(), 8192);
        assert!(!b.is_empty());
        assert!(b.describe().contains("memory"));
    }

    #[test]
    fn pointers_forward_the_provided_methods() {
        // A pointer that fell back on the trait's defaults would accept
        // every claim and never be read-only.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        let sparse = Preallocation {
            allocate: false,
            ..Preallocation::default()
        };
        drop(FileDevice::create(&p, 1 << 20, sparse, DirectIo::Off).unwrap());
        let f = Arc::new(FileDevice::open(&p, DirectIo::Off).unwrap());
        let b: Box<dyn Device> = Box::new(Arc::clone(&f));
        b.claim().unwrap();
        assert_eq!(f.claim().unwrap_err().kind(), io::ErrorKind::ResourceBusy);
        b.release();
        f.claim().unwrap();
        let ro: Box<Arc<FileDevice>> = Box::new(Arc::new(
            FileDevice::open_read_only(&p, DirectIo::Off).unwrap(),
        ));
        assert!(ro.is_read_only());
        assert!(!b.is_read_only());
    }
}
