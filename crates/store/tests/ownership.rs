//! One writer per device, and read-only opens that never write.
//!
//! A second writer — in this process or in another — is refused with a busy
//! error naming the holder; the lock goes away when the holder closes the
//! device or dies. Read-only opens take no lock, work beside a writer and on
//! read-only files, and nothing on their path reaches the device's write
//! side.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blockalloc_store::device::{
    Device, DeviceBusy, DirectIo, FileDevice, LockHolder, MemDevice, Preallocation,
};
use blockalloc_store::{check, FormatOptions, Store, StoreError};

const HOLDER_ENV: &str = "BLOCKALLOC_HOLD_DEVICE";

/// A formatted 16 MiB file device, closed.
fn formatted(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("device");
    let dev = FileDevice::create(&p, 16 << 20, Preallocation::default(), DirectIo::Auto).unwrap();
    let store = Store::format(dev, FormatOptions::default()).unwrap();
    let mut t = store.begin();
    t.allocate(10, None).unwrap();
    t.commit().unwrap();
    store.close().unwrap();
    p
}

/// Opens `p` for writing once its previous writer is gone. A lock lives as
/// long as any descriptor of its open file description: when another test
/// thread spawns a process, the child holds a copy of every descriptor from
/// its fork to its exec, so a release here can lag by that long.
fn open_after_release(p: &std::path::Path) -> FileDevice {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match FileDevice::open(p, DirectIo::Auto) {
            Err(e) if DeviceBusy::from_io(&e).is_some() && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
}

fn busy_holder(e: &std::io::Error) -> LockHolder {
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy, "{e}");
    DeviceBusy::from_io(e)
        .unwrap_or_else(|| panic!("not a busy error: {e}"))
        .holder
}

#[test]
fn second_open_of_a_device_in_one_process_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let p = formatted(dir.path());
    let (store, _) = Store::open(open_after_release(&p)).unwrap();
    let e = FileDevice::open(&p, DirectIo::Auto).unwrap_err();
    assert_eq!(busy_holder(&e), LockHolder::Process(std::process::id()));
    let msg = e.to_string();
    assert!(
        msg.contains(p.to_str().unwrap()) && msg.contains("this process"),
        "{msg}"
    );
    match StoreError::from_open(&p, e) {
        StoreError::Busy { device, holder } => {
            assert_eq!(device, p.display().to_string());
            assert_eq!(holder.pid(), Some(std::process::id()));
        }
        other => panic!("{other}"),
    }
    // The writer keeps working; once it is closed, the device opens again.
    let mut t = store.begin();
    t.allocate(3, None).unwrap();
    t.commit().unwrap();
    store.close().unwrap();
    let (again, report) = Store::open(open_after_release(&p)).unwrap();
    assert!(report.closed_cleanly);
    again.close().unwrap();
}

#[test]
fn holder_child() {
    if let Ok(path) = std::env::var(HOLDER_ENV) {
        let (store, _) = Store::open(FileDevice::open(&path, DirectIo::Auto).unwrap()).unwrap();
        println!("holding");
        // Hold the device until the parent kills this process.
        std::thread::sleep(std::time::Duration::from_secs(120));
        drop(store);
    }
}

#[test]
fn a_device_held_by_another_process_is_busy_until_that_process_dies() {
    let dir = tempfile::tempdir().unwrap();
    let p = formatted(dir.path());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "holder_child", "--nocapture", "--test-threads=1"])
        .env(HOLDER_ENV, &p)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    while !line.contains("holding") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the child exited without holding the device");
        }
    }
    let e = FileDevice::open(&p, DirectIo::Auto).unwrap_err();
    assert_eq!(busy_holder(&e), LockHolder::Process(child.id()));
    assert!(
        e.to_string().contains(&format!("process {}", child.id())),
        "{e}"
    );
    // Readers are not held off, and see the writer.
    let ro = FileDevice::open_read_only(&p, DirectIo::Auto).unwrap();
    assert_eq!(ro.writer(), Some(LockHolder::Process(child.id())));
    assert!(check(&ro).unwrap().is_consistent());
    child.kill().unwrap(); // SIGKILL: the kernel drops the lock.
    child.wait().unwrap();
    assert_eq!(ro.writer(), None);
    let (store, _) = Store::open(open_after_release(&p)).unwrap();
    store.verify().unwrap();
}

/// Counts writes and syncs; refuses nothing.
struct Counting {
    inner: MemDevice,
    writes: AtomicU64,
    syncs: AtomicU64,
}

impl Device for Counting {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync()
    }
    fn describe(&self) -> String {
        "counting device".into()
    }
}

#[test]
fn a_read_only_store_refuses_every_write_before_it_reaches_the_device() {
    let mem = Arc::new(MemDevice::new(16 << 20));
    let s = Store::format(mem.clone(), FormatOptions::default()).unwrap();
    let mut t = s.begin();
    let kept = t.allocate(7, None).unwrap();
    t.commit().unwrap();
    drop(s); // crashed: the journal has an entry to replay
    let dev = Arc::new(Counting {
        inner: MemDevice::from_image(mem.image()),
        writes: AtomicU64::new(0),
        syncs: AtomicU64::new(0),
    });
    let (store, report) = Store::open_read_only(dev.clone()).unwrap();
    assert!(store.is_read_only());
    assert_eq!(report.txns, 1);
    store.check_allocated(kept).unwrap();
    let mut t = store.begin();
    t.allocate(5, None).unwrap();
    let e = t.commit().unwrap_err();
    assert!(matches!(e, StoreError::ReadOnly { .. }), "{e}");
    assert!(e.to_string().contains("read-only"), "{e}");
    let mut t = store.begin();
    t.free(kept).unwrap();
    assert!(matches!(t.commit(), Err(StoreError::ReadOnly { .. })));
    assert!(matches!(
        store.checkpoint(),
        Err(StoreError::ReadOnly { .. })
    ));
    // The refused commits changed nothing.
    store.check_allocated(kept).unwrap();
    store.verify().unwrap();
    store.close().unwrap();
    assert_eq!(dev.writes.load(Ordering::Relaxed), 0);
    assert_eq!(dev.syncs.load(Ordering::Relaxed), 0);
    assert_eq!(dev.inner.image(), mem.image());
}

#[test]
fn a_read_only_file_opens_beside_a_writer_and_refuses_writes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = formatted(dir.path());
    let before = std::fs::read(&p).unwrap();
    let writer = open_after_release(&p);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
    let ro = FileDevice::open_read_only(&p, DirectIo::Auto).unwrap();
    assert!(ro.is_read_only() && !writer.is_read_only());
    assert_eq!(ro.writer(), Some(LockHolder::Process(std::process::id())));
    assert!(ro.describe().contains("read-only"), "{}", ro.describe());
    let page = blockalloc_store::device::AlignedBuf::zeroed(4096);
    let e = ro.write_at(0, page.as_slice()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("read-only"), "{e}");
    // Store::open on a read-only device gives a read-only store.
    let (store, report) = Store::open(ro).unwrap();
    assert!(store.is_read_only());
    assert!(report.closed_cleanly);
    let mut t = store.begin();
    t.allocate(1, None).unwrap();
    assert!(matches!(t.commit(), Err(StoreError::ReadOnly { .. })));
    store.close().unwrap();
    drop(writer);
    assert_eq!(std::fs::read(&p).unwrap(), before, "a read-only open wrote");
}

/// A loop block device over a file; detached on drop.
struct Loop(String);

impl Loop {
    /// None when loop devices cannot be set up here (not root, no
    /// `losetup`, no free loop device).
    fn new(file: &std::path::Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()?;
        let dev = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !dev.is_empty()).then_some(Loop(dev))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn a_block_device_has_one_writer_too() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let Some(lo) = Loop::new(&backing) else {
        eprintln!("skipped: no loop device here (needs root and losetup)");
        return;
    };
    let dev = FileDevice::open(&lo.0, DirectIo::Auto).unwrap();
    assert_eq!(dev.kind(), blockalloc_store::device::FileKind::Block);
    let store = Store::format(dev, FormatOptions::default()).unwrap();
    // The exclusive open refuses the second writer; the lock table names it.
    let e = FileDevice::open(&lo.0, DirectIo::Auto).unwrap_err();
    assert_eq!(busy_holder(&e), LockHolder::Process(std::process::id()));
    let ro = FileDevice::open_read_only(&lo.0, DirectIo::Auto).unwrap();
    assert_eq!(ro.writer(), Some(LockHolder::Process(std::process::id())));
    assert!(check(&ro).unwrap().is_consistent());
    store.close().unwrap();
    let (again, report) = Store::open(open_after_release(lo.0.as_ref())).unwrap();
    assert!(report.closed_cleanly);
    drop(again);
}

#[test]
fn a_clean_close_costs_one_write_and_one_sync_more_than_a_checkpoint_and_commits_none() {
    let dev = Arc::new(Counting {
        inner: MemDevice::new(16 << 20),
        writes: AtomicU64::new(0),
        syncs: AtomicU64::new(0),
    });
    let io = || {
        (
            dev.writes.load(Ordering::Relaxed),
            dev.syncs.load(Ordering::Relaxed),
        )
    };
    let store = Store::format(dev.clone(), FormatOptions::default()).unwrap();
    let commit = |s: &Store| {
        let mut t = s.begin();
        t.allocate(1, None).unwrap();
        t.commit().unwrap();
    };
    commit(&store);
    let (w0, s0) = io();
    store.checkpoint().unwrap();
    let (w1, s1) = io();
    assert_eq!(
        (w1 - w0, s1 - s0),
        (2, 2),
        "checkpoint: announcement + slot"
    );
    commit(&store);
    let (w2, s2) = io();
    store.close().unwrap();
    let (w3, s3) = io();
    assert_eq!(
        (w3 - w2, s3 - s2),
        (3, 3),
        "close: announcement + record + slot"
    );
    let (store, report) = Store::open(dev.clone()).unwrap();
    assert!(report.closed_cleanly);
    // The first commit after a clean close replaces the close record with
    // its own entry: one write, one sync, as every commit.
    let (w4, s4) = io();
    commit(&store);
    commit(&store);
    let (w5, s5) = io();
    assert_eq!((w5 - w4, s5 - s4), (2, 2));
}

#[test]
fn two_stores_on_one_shared_handle_are_busy() {
    let dir = tempfile::tempdir().unwrap();
    let p = formatted(dir.path());
    let dev = Arc::new(open_after_release(&p));
    let (store, _) = Store::open(dev.clone()).unwrap();
    let e = Store::open(dev.clone()).unwrap_err();
    match &e {
        StoreError::Busy { device, holder } => {
            assert!(device.contains(p.to_str().unwrap()), "{e}");
            assert_eq!(holder.pid(), Some(std::process::id()));
        }
        other => panic!("{other}"),
    }
    let forced = FormatOptions {
        force: true,
        ..FormatOptions::default()
    };
    assert!(matches!(
        Store::format(dev.clone(), forced),
        Err(StoreError::Busy { .. })
    ));
    // A read-only store on the same handle is fine: it never writes.
    let (ro, _) = Store::open_read_only(dev.clone()).unwrap();
    drop(ro);
    drop(store);
    let (store, _) = Store::open(dev.clone()).unwrap();
    store.close().unwrap();
    Store::format(dev.clone(), forced).unwrap().close().unwrap();
}
