//! One writer per device: the exclusive lock a writable [`super::FileDevice`]
//! takes, and how read-only openers see whether a writer is active.
//!
//! * **Regular files and block devices**: `flock(LOCK_EX | LOCK_NB)`. A
//!   `flock` lock belongs to the *open file description*, not to the process:
//!   two opens of one file conflict even inside one process, and the lock
//!   goes away when the last descriptor of that open is closed — on drop, and
//!   when the process dies, whatever way it dies. The file is opened
//!   `O_CLOEXEC` (the standard library's default), so a spawned child never
//!   inherits it.
//! * **Block devices** are also opened `O_EXCL`, which the kernel refuses
//!   with `EBUSY` while the device is mounted or opened `O_EXCL` by anyone
//!   else (another path to the same device included).
//! * **Who holds it**: `flock` does not say; `/proc/locks` lists each lock
//!   with the pid of the process that took it and the device and inode of
//!   the file, so the holder is found there by inode. When `/proc` is not
//!   mounted the holder is reported as unknown.
//!
//! Readers take no lock, so a writer can start while `inspect` or `check`
//! reads: they look the writer up in `/proc/locks` instead of probing with a
//! lock of their own, which would make a writer starting at that instant
//! fail with a spurious busy error.
//!
//! Limits: the lock is advisory (a program that ignores it can still write),
//! and on NFS Linux emulates `flock` with POSIX byte-range locks, which do not
//! conflict inside one process.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use blockalloc::ErrorClass;
use rustix::fs::{flock, FlockOperation};

/// A device that another writer holds. Carried inside the `io::Error`
/// (kind `ResourceBusy`) that [`super::FileDevice::open`] returns; the store
/// surfaces it as [`crate::StoreError::Busy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceBusy {
    /// The path that was opened.
    pub path: PathBuf,
    /// The holder, as far as the system tells.
    pub holder: LockHolder,
}

/// Who holds a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockHolder {
    /// A process holding the exclusive lock, by pid.
    Process(u32),
    /// Another open file description holds the lock; its process is not
    /// known (no `/proc/locks`).
    Unknown,
    /// The kernel refused an exclusive open of the block device: it is
    /// mounted, or opened exclusively by another program.
    System,
}

impl LockHolder {
    /// The holder's pid, when known.
    pub fn pid(&self) -> Option<u32> {
        match self {
            LockHolder::Process(p) => Some(*p),
            _ => None,
        }
    }
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockHolder::Process(pid) if *pid == std::process::id() => {
                write!(
                    f,
                    "process {pid} (this process: another open or another store)"
                )
            }
            LockHolder::Process(pid) => write!(f, "process {pid}"),
            LockHolder::Unknown => f.write_str("another open file description"),
            LockHolder::System => {
                f.write_str("the system (the block device is mounted or opened exclusively)")
            }
        }
    }
}

impl fmt::Display for DeviceBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is in use by another writer: held by {}; a device has one writer at a time \
             (stop it first; inspect and check can read while it runs)",
            self.path.display(),
            self.holder
        )
    }
}

impl std::error::Error for DeviceBusy {}

impl DeviceBusy {
    /// The busy error as the `io::Error` that `FileDevice::open` returns.
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::ResourceBusy, self)
    }

    /// The `DeviceBusy` inside an error returned by `FileDevice::open`, if
    /// that is why it failed.
    pub fn from_io(e: &io::Error) -> Option<&DeviceBusy> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<DeviceBusy>())
    }

    /// The class of an error a device returned: [`ErrorClass::Busy`] when
    /// it carries a `DeviceBusy`, [`ErrorClass::InvalidInput`] when it
    /// carries a [`NotADevice`](super::NotADevice), else [`ErrorClass::Io`].
    pub fn class_of_io(e: &io::Error) -> ErrorClass {
        if DeviceBusy::from_io(e).is_some() {
            ErrorClass::Busy
        } else if let Some(n) = super::NotADevice::from_io(e) {
            n.class()
        } else {
            ErrorClass::Io
        }
    }
}

/// Takes the exclusive lock on `file`, or says who holds it.
pub(crate) fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(DeviceBusy {
            path: path.to_path_buf(),
            holder: holder_of(file).unwrap_or(LockHolder::Unknown),
        }
        .into_io()),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("cannot lock {}: {e}", path.display()),
        )),
    }
}

/// Releases a lock taken with [`lock_exclusive`] (closing the file would
/// too).
pub(crate) fn unlock(file: &File) {
    let _ = flock(file, FlockOperation::Unlock);
}

/// The writer holding `file`'s exclusive lock now, if any, looked up in
/// `/proc/locks` without taking a lock. `None` when no writer holds it.
/// When `/proc/locks` cannot be read, probes with a shared lock released at
/// once (the holder is then [`LockHolder::Unknown`]).
pub(crate) fn writer_of(file: &File) -> Option<LockHolder> {
    match read_proc_locks() {
        Some(text) => find_writer(&text, file_id(file)?).map(LockHolder::Process),
        None => match flock(file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                let _ = flock(file, FlockOperation::NonBlockingUnlock);
                None
            }
            Err(_) => Some(LockHolder::Unknown),
        },
    }
}

/// The holder of a lock known to be held: the pid from `/proc/locks`.
fn holder_of(file: &File) -> Option<LockHolder> {
    let text = read_proc_locks()?;
    find_writer(&text, file_id(file)?).map(LockHolder::Process)
}

fn read_proc_locks() -> Option<String> {
    std::fs::read_to_string("/proc/locks").ok()
}

/// Device major, minor and inode of an open file, as `/proc/locks` prints
/// them.
fn file_id(file: &File) -> Option<(u32, u32, u64)> {
    let st = rustix::fs::fstat(file).ok()?;
    Some((
        rustix::fs::major(st.st_dev),
        rustix::fs::minor(st.st_dev),
        st.st_ino,
    ))
}

/// The pid of the exclusive `flock` holder of the file `(major, minor,
/// inode)` in the text of `/proc/locks`. Lines look like
/// `1: FLOCK  ADVISORY  WRITE 4242 fe:00:9977986 0 EOF` (device numbers in
/// hex); waiters are marked `->` and skipped.
fn find_writer(proc_locks: &str, (major, minor, ino): (u32, u32, u64)) -> Option<u32> {
    proc_locks.lines().find_map(|line| {
        let mut f = line.split_whitespace().skip(1);
        let (kind, _, mode, pid, id) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        if kind != "FLOCK" || mode != "WRITE" {
            return None;
        }
        let mut parts = id.split(':');
        let maj = u32::from_str_radix(parts.next()?, 16).ok()?;
        let min = u32::from_str_radix(parts.next()?, 16).ok()?;
        let i: u64 = parts.next()?.parse().ok()?;
        (maj == major && min == minor && i == ino)
            .then(|| pid.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 15528 fe:00:9977986 0 EOF\n\
                    2: FLOCK  ADVISORY  READ 11365 fe:00:10051587 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 777 fe:00:10051587 0 EOF\n\
                    4: POSIX  ADVISORY  WRITE 99 08:01:42 0 EOF\n\
                    5: FLOCK  ADVISORY  WRITE 4242 103:02:42 0 EOF\n";
        assert_eq!(find_writer(text, (0xfe, 0, 9977986)), Some(15528));
        // A shared lock and a waiter are not a writer.
        assert_eq!(find_writer(text, (0xfe, 0, 10051587)), None);
        // POSIX locks are not ours; minor numbers are hex too.
        assert_eq!(find_writer(text, (8, 1, 42)), None);
        assert_eq!(find_writer(text, (0x103, 2, 42)), Some(4242));
        assert_eq!(find_writer("garbage\n\n1: FLOCK", (0, 0, 0)), None);
    }

    #[test]
    fn busy_messages_name_the_path_and_the_holder() {
        let e = DeviceBusy {
            path: "/dev/sdq".into(),
            holder: LockHolder::Process(31337),
        }
        .into_io();
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        let s = e.to_string();
        assert!(s.contains("/dev/sdq") && s.contains("process 31337"), "{s}");
        assert_eq!(DeviceBusy::from_io(&e).unwrap().holder.pid(), Some(31337));
        assert!(DeviceBusy::from_io(&io::Error::other("x")).is_none());
        let mine = LockHolder::Process(std::process::id()).to_string();
        assert!(mine.contains("this process"), "{mine}");
        assert!(LockHolder::System.to_string().contains("mounted"));
    }
}
