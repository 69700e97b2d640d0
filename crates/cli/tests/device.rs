//! `format`, `inspect`, `check` and `bench --device` end to end.

use std::process::Command;

mod common;

fn blockalloc(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn format_inspect_check_bench_and_detect_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let d = dev.to_str().unwrap();
    let (code, out, err) =
        blockalloc(&["format", "--device", d, "--size", "64MiB", "--zero", "none"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("64 MiB in 16384 blocks of 4 KiB"), "{out}");
    // Formatting again needs --force.
    let (code, _, err) = blockalloc(&["format", "--device", d, "--size", "64MiB"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, out, err) = blockalloc(&[
        "bench",
        "--device",
        d,
        "--round-size",
        "200",
        "--batch",
        "8",
        "--threads",
        "2",
        "--keep",
        "--json",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["kind"], "durable");
    assert_eq!(v["stopped"], "no_space");
    assert!(v["commits"].as_u64().unwrap() > 0);
    let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["block_size"], 4096);
    assert!(v["utilization"].as_f64().unwrap() > 0.5);
    assert!(v["free_histogram"].is_array());
    assert_eq!(v["checkpoints"]["slots"].as_array().unwrap().len(), 2);
    let (code, out, _) = blockalloc(&["inspect", "--device", d]);
    assert_eq!(code, 0);
    assert!(
        out.contains("fragmentation") && out.contains("journal"),
        "{out}"
    );
    let (code, out, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("consistent"), "{out}");
    // Flip a byte of superblock copy 1: still usable, but check says no.
    let mut bytes = std::fs::read(&dev).unwrap();
    bytes[4096 + 40] ^= 1;
    std::fs::write(&dev, &bytes).unwrap();
    let (code, out, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains("superblock (copy 1)"), "{out}");
    // Both copies: not recoverable, exit 4 naming the superblock.
    bytes[40] ^= 1;
    std::fs::write(&dev, &bytes).unwrap();
    let (code, _, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("corrupt superblock"), "{err}");
    // Not a store at all.
    let other = dir.path().join("plain");
    std::fs::write(&other, vec![0u8; 1 << 20]).unwrap();
    let (code, _, err) = blockalloc(&["inspect", "--device", other.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a blockalloc device"), "{err}");
    let (code, _, err) =
        blockalloc(&["format", "--device", dir.path().join("x").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--size"), "{err}");
}

fn format_small(dir: &std::path::Path) -> std::path::PathBuf {
    let dev = dir.join("dev");
    let (code, out, err) = blockalloc(&[
        "format",
        "--device",
        dev.to_str().unwrap(),
        "--size",
        "32MiB",
        "--zero",
        "none",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    dev
}

fn json(out: &str) -> serde_json::Value {
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one JSON object expected: {out}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn a_device_held_by_a_writer_is_busy_for_bench_and_readable_for_inspect_and_check() {
    use blockalloc_store::device::{DirectIo, FileDevice};
    let dir = tempfile::tempdir().unwrap();
    let dev = format_small(dir.path());
    let d = dev.to_str().unwrap();
    let me = std::process::id();
    let holder = FileDevice::open(&dev, DirectIo::Auto).unwrap();
    let (code, _, err) = blockalloc(&["bench", "--device", d, "--round-size", "50"]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("in use by another writer") && err.contains(&format!("process {me}")),
        "{err}"
    );
    // Readers run beside the writer and say the view may be stale.
    let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["in_use_by_writer"], true);
    assert_eq!(v["writer_pid"], me);
    let (code, out, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("may be stale"), "{out}");
    let (code, out, _) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["writer_pid"], me);
    drop(holder);
    // The lock lives as long as any descriptor of the open: a process that
    // another test thread is spawning holds a copy until its exec, so the
    // release can lag by that long.
    let released = |args: &[&str]| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let r = blockalloc(args);
            let busy = r.0 == 5 || r.1.contains("\"in_use_by_writer\":true");
            if !busy || std::time::Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let (code, out, err) = released(&["inspect", "--device", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["in_use_by_writer"], false);
    let (code, _, err) = released(&["bench", "--device", d, "--round-size", "50"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn check_json_prints_one_object_when_the_device_cannot_be_opened() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let (code, out, _) = blockalloc(&["check", "--device", missing.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1);
    let v = json(&out);
    assert_eq!(v["consistent"], false);
    assert_eq!(v["error"]["class"], "io");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains(missing.to_str().unwrap()));
    let plain = dir.path().join("plain");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    let (code, out, _) = blockalloc(&["check", "--device", plain.to_str().unwrap(), "--json"]);
    assert_eq!(code, 2);
    let v = json(&out);
    assert_eq!(v["error"]["class"], "not_formatted");
    assert_eq!(v["error"]["exit_code"], 2);
    // A store truncated below its superblock copies says so.
    let dev = format_small(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.set_len(4096).unwrap();
    drop(f);
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap(), "--json"]);
    assert_eq!(code, 2, "{err}");
    let v = json(&out);
    assert_eq!(v["error"]["class"], "truncated");
    assert!(err.contains("truncated"), "{err}");
    let (code, _, err) = blockalloc(&["inspect", "--device", dev.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("truncated") && !err.contains("not a blockalloc device"),
        "{err}"
    );
}

#[test]
fn check_tells_the_write_in_flight_at_a_crash_from_a_damaged_entry() {
    use blockalloc_store::device::{DirectIo, FileDevice};
    use blockalloc_store::Store;
    let dir = tempfile::tempdir().unwrap();
    let dev = format_small(dir.path());
    let d = dev.to_str().unwrap();
    // Commit, then stop without closing (as a crash would); keep the image
    // from before the last commit.
    let (seq, at, before) = {
        let (store, _) = Store::open(FileDevice::open(&dev, DirectIo::Off).unwrap()).unwrap();
        let mut before = Vec::new();
        for n in [3, 4, 5] {
            before = std::fs::read(&dev).unwrap();
            let mut t = store.begin();
            t.allocate(n, None).unwrap();
            t.commit().unwrap();
        }
        let l = store.layout();
        let j = store.status().journal;
        (
            j.next_seq - 1,
            (l.journal_offset() + ((j.tail_pos - 1) % l.journal_pages()) * 4096) as usize,
            before,
        )
    };
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["format_version"], 2);
    let after = std::fs::read(&dev).unwrap();
    // Torn at a crash: only the entry's first sector landed. Consistent,
    // and nothing committed was lost: exit 0, with the entry named.
    let mut torn = before.clone();
    torn[at..at + 512].copy_from_slice(&after[at..at + 512]);
    std::fs::write(&dev, &torn).unwrap();
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["consistent"], true);
    assert_eq!(v["journal_tail_discarded"], false);
    assert_eq!(v["discarded_entry"]["seq"], seq);
    assert_eq!(v["discarded_entry"]["torn_write"], true);
    let (code, out, err) = blockalloc(&["inspect", "--device", d]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "write in flight at a crash discarded: entry {seq}"
        )),
        "{out}"
    );
    // Damaged after it was written: corrupt, exit 4, naming the entry.
    let mut damaged = after;
    damaged[at + 50] ^= 4;
    std::fs::write(&dev, &damaged).unwrap();
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 4, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["consistent"], false);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("journal entry {seq}")) && msg.contains("may be lost"),
        "{msg}"
    );
}

#[test]
fn check_exits_6_when_a_version_1_store_discarded_a_damaged_tail() {
    use blockalloc_store::device::MemDevice;
    use blockalloc_store::Store;
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("v1");
    let d = dev.to_str().unwrap();
    let mut img = common::fixture("v1-crashed.sparse");
    let (s, _) = Store::open_read_only(MemDevice::from_image(img.clone())).unwrap();
    let (l, j) = (s.layout(), s.status().journal);
    let seq = j.next_seq - 1;
    img[(l.journal_offset() + ((j.tail_pos - 1) % l.journal_pages()) * 4096) as usize + 50] ^= 4;
    std::fs::write(&dev, &img).unwrap();
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 6, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["consistent"], true);
    assert_eq!(v["format_version"], 1);
    assert_eq!(v["journal_tail_discarded"], true);
    assert_eq!(v["discarded_entry"]["seq"], seq);
    assert_eq!(v["discarded_entry"]["torn_write"], false);
    let (code, out, _) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 6);
    assert!(out.contains("discarded"), "{out}");
    let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["journal"]["tail_discarded"], true);
    assert_eq!(v["journal"]["discarded_entry"]["seq"], seq);
    // check and inspect only read: the store is still version 1.
    assert_eq!(v["format_version"], 1);
}

/// A read-only tmpfs mount holding a formatted device; unmounted on drop.
struct ReadOnlyMount(std::path::PathBuf);

impl ReadOnlyMount {
    /// None when this process may not mount (not root, no CAP_SYS_ADMIN).
    fn new(dir: &std::path::Path) -> Option<Self> {
        let mnt = dir.join("ro");
        std::fs::create_dir(&mnt).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
            .arg(&mnt)
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return None;
        }
        let m = ReadOnlyMount(mnt);
        format_small(&m.0);
        let ro = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&m.0)
            .status()
            .unwrap();
        assert!(ro.success());
        Some(m)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn inspect_and_check_work_on_a_read_only_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let Some(m) = ReadOnlyMount::new(dir.path()) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let dev = m.0.join("dev");
    let d = dev.to_str().unwrap();
    assert!(std::fs::OpenOptions::new().write(true).open(&dev).is_err());
    let (code, out, err) = blockalloc(&["inspect", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("read-only"), "{out}");
    let (code, out, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("consistent"), "{out}");
    // A writer cannot run there, and says why.
    let (code, _, err) = blockalloc(&["bench", "--device", d, "--round-size", "50"]);
    assert_eq!(code, 1);
    assert!(err.contains("Read-only file system"), "{err}");
}

#[test]
fn format_without_force_refuses_a_store_that_a_writer_holds() {
    use blockalloc_store::device::{DirectIo, FileDevice};
    let dir = tempfile::tempdir().unwrap();
    let dev = format_small(dir.path());
    let before = std::fs::read(&dev).unwrap();
    let holder = FileDevice::open(&dev, DirectIo::Auto).unwrap();
    let (code, _, err) = blockalloc(&[
        "format",
        "--device",
        dev.to_str().unwrap(),
        "--size",
        "32MiB",
        "--zero",
        "none",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already holds a blockalloc store"), "{err}");
    drop(holder);
    assert_eq!(std::fs::read(&dev).unwrap(), before);
}

/// Runs the binary as an unprivileged user: directly when this test is not
/// root, through `setpriv` as `nobody` when it is (root ignores file modes).
/// None when neither is possible.
fn blockalloc_unprivileged(args: &[&str]) -> Option<(i32, String, String)> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    let root = String::from_utf8_lossy(&uid.stdout).trim() == "0";
    let out = if root {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_blockalloc"))
            .args(args)
            .output()
            .ok()?
    } else {
        Command::new(env!("CARGO_BIN_EXE_blockalloc"))
            .args(args)
            .output()
            .ok()?
    };
    Some((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn inspect_and_check_open_a_read_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dev = format_small(dir.path());
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&dev).unwrap();
    let d = dev.to_str().unwrap();
    let Some((code, out, err)) = blockalloc_unprivileged(&["inspect", "--device", d]) else {
        eprintln!("skipped: cannot run as an unprivileged user here");
        return;
    };
    if err.contains("Permission denied") && !err.contains(d) {
        eprintln!("skipped: the unprivileged user cannot run the test binary: {err}");
        return;
    }
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("read-only"), "{out}");
    let (code, out, err) = blockalloc_unprivileged(&["check", "--device", d, "--json"]).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json(&out)["consistent"], true);
    assert_eq!(std::fs::read(&dev).unwrap(), before);
}

/// A small tmpfs mount, unmounted on drop; `None` when mounting is not
/// possible (not root, no mount command).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
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
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// A loop device over an image file, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(image: &std::path::Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(image)
            .stderr(std::process::Stdio::null())
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
fn format_refuses_a_non_empty_file_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.txt");
    std::fs::write(&p, b"data\n").unwrap();
    let d = p.to_str().unwrap();
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "64MiB"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("not blank") && err.contains("5B"), "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&p).unwrap(), b"data\n");
    let (code, out, err) = blockalloc(&[
        "format", "--device", d, "--size", "64MiB", "--zero", "none", "--force",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 64 << 20);
    // An empty file is taken as it is.
    let e = dir.path().join("empty");
    std::fs::write(&e, b"").unwrap();
    let (code, out, err) = blockalloc(&[
        "format",
        "--device",
        e.to_str().unwrap(),
        "--size",
        "64MiB",
        "--zero",
        "none",
    ]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn format_refuses_a_block_device_with_a_signature_or_data() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let mut bytes = vec![0u8; 64 << 20];
    bytes[1080] = 0x53;
    bytes[1081] = 0xef;
    std::fs::write(&img, &bytes).unwrap();
    let Some(lo) = Loop::attach(&img) else {
        eprintln!("skipped: no loop device (not root?)");
        return;
    };
    let d = lo.0.as_str();
    let (code, out, err) = blockalloc(&["format", "--device", d]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("ext2/3/4") && err.contains("--force"), "{err}");
    // Data without a known signature: named by its offset.
    let rewrite = |at: usize, v: &[u8]| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(d).unwrap();
        f.write_all_at(v, at as u64).unwrap();
        f.sync_all().unwrap();
    };
    rewrite(1080, &[0, 0]);
    rewrite(700_000, b"x");
    let (code, out, err) = blockalloc(&["format", "--device", d]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("offset 700000"), "{err}");
    // Blank in its first MiB: formatted without --force.
    rewrite(700_000, &[0]);
    let (code, out, err) = blockalloc(&["format", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("block device"), "{out}");
    let (code, _, err) = blockalloc(&["format", "--device", d]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already holds a blockalloc store"), "{err}");
    rewrite(1080, &[0x53, 0xef]);
    let (code, out, err) = blockalloc(&["format", "--device", d, "--force"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn format_size_on_a_block_device_makes_a_store_of_that_size() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let Some(lo) = Loop::attach(&img) else {
        eprintln!("skipped: no loop device (not root?)");
        return;
    };
    let d = lo.0.as_str();
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "128MiB"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("larger than the block device (64MiB)"),
        "{err}"
    );
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "32MiB"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("32 MiB in 8192 blocks of 4 KiB"), "{out}");
    assert!(out.contains("the store takes its first 32 MiB"), "{out}");
    let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["capacity_bytes"], 32 << 20, "{out}");
    let (code, out, err) = blockalloc(&["check", "--device", d]);
    assert_eq!(code, 0, "{out}{err}");
    // A store fills only its own part of the device.
    let (code, out, err) = blockalloc(&["bench", "--device", d, "--json", "-"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["stopped"], "no_space", "{out}");
    let tail = std::fs::read(&img).unwrap();
    assert!(
        tail[32 << 20..].iter().all(|&b| b == 0),
        "bytes past the store written"
    );
}

#[test]
fn format_beyond_the_free_space_is_refused_before_reserving_and_leaves_nothing() {
    let Some(fs) = Tmpfs::mount("64m") else {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let p = fs.0.path().join("dev");
    let d = p.to_str().unwrap();
    for zero in ["now", "none"] {
        let (code, out, err) =
            blockalloc(&["format", "--device", d, "--size", "100MiB", "--zero", zero]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.is_empty(), "{out}");
        // Refused before fallocate could fill the file system: both sizes,
        // and the way out.
        assert!(
            err.contains("100MiB") && err.contains("64MiB") && err.contains("does not fit"),
            "{err}"
        );
        assert!(err.contains("nothing was reserved"), "{err}");
        assert!(
            err.contains("was removed") && err.contains("--sparse"),
            "{err}"
        );
        assert!(!p.exists(), "{err}");
    }
    // The way out: a sparse file of that size reserves nothing.
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "100MiB", "--sparse"]);
    assert_eq!(code, 0, "{out}{err}");
    std::fs::remove_file(&p).unwrap();
    // A 60 MiB device fits.
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "60MiB"]);
    assert_eq!(code, 0, "{out}{err}");
    // Replacing a file that does not fit either is refused before the file
    // is touched; the room counts what the file holds.
    let (code, _, err) = blockalloc(&["format", "--device", d, "--size", "100MiB", "--force"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("64MiB") && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 60 << 20);
}

#[test]
fn format_beyond_the_file_size_limit_names_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge");
    let d = p.to_str().unwrap();
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "16TiB", "--sparse"]);
    if code == 0 {
        eprintln!("skipped: this file system holds a 16 TiB file");
        return;
    }
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("larger than the largest file"), "{err}");
    // ext4 with 4 KiB blocks: one block short of 16 TiB.
    assert!(err.contains(" bytes)"), "{err}");
    assert!(!err.contains("os error 27"), "{err}");
    assert!(!p.exists(), "{err}");
    // The help promises nothing the file system refuses.
    let (_, help, _) = blockalloc(&["format", "--help"]);
    assert!(help.contains("15TiB"), "{help}");
}

#[test]
fn format_prints_nothing_before_it_is_done() {
    let (code, out, err) = blockalloc(&["format", "--device", "/dev/null", "--size", "64MiB"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("a character device"), "{err}");
    assert!(!err.contains("writing"), "{err}");
}

#[test]
fn zeroing_shows_a_bar_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dev");
    let d = p.to_str().unwrap();
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "64MiB"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.is_empty(), "no bar when stderr is no terminal: {err}");
    // `script` runs the command on a pseudo-terminal.
    let Some((ok, tty)) = on_terminal(&["format", "--device", d, "--size", "64MiB", "--force"])
    else {
        return;
    };
    assert!(ok, "{tty}");
    assert!(tty.contains("zeroing"), "{tty}");
    assert!(tty.contains("formatted"), "{tty}");
}

#[test]
fn format_refuses_blocks_smaller_than_4k() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dev");
    let d = p.to_str().unwrap();
    for bs in ["512B", "1KiB", "2KiB"] {
        let (code, out, err) = blockalloc(&[
            "format",
            "--device",
            d,
            "--size",
            "64MiB",
            "--block-size",
            bs,
        ]);
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("read-modify-write"), "{err}");
        assert!(err.contains("--block-size 4KiB"), "{err}");
        assert!(!p.exists());
    }
    let (code, out, err) = blockalloc(&[
        "format",
        "--device",
        d,
        "--size",
        "64MiB",
        "--block-size",
        "8KiB",
        "--zero",
        "none",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = blockalloc(&[
        "bench",
        "--device",
        d,
        "--write-data",
        "--round-size",
        "100",
        "--json",
        "-",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["block_size"], 8192);
    assert!(v["data_mib_per_sec"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_device_frees_what_it_allocated_unless_keep() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let d = dev.to_str().unwrap();
    let (code, out, err) =
        blockalloc(&["format", "--device", d, "--size", "64MiB", "--zero", "none"]);
    assert_eq!(code, 0, "{out}{err}");
    let utilisation = || {
        let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["utilization"].as_f64().unwrap()
    };
    let empty = utilisation();
    assert!(empty < 0.01, "{empty}");
    let (code, out, err) = blockalloc(&["bench", "--device", d, "--round-size", "200"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stopped: no_space"), "{out}");
    assert!(out.contains("freed the run's"), "{out}");
    assert_eq!(utilisation(), empty, "the device is as the run found it");
    let (code, out, err) = blockalloc(&[
        "bench",
        "--device",
        d,
        "--round-size",
        "200",
        "--keep",
        "--json",
        "-",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["kept"], true);
    assert!(err.contains("kept the run's"), "{err}");
    assert!(utilisation() > 0.5);
}

#[test]
fn bench_device_time_limit_holds_and_shows_a_bar_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let d = dev.to_str().unwrap();
    let (code, out, err) = blockalloc(&["format", "--device", d, "--size", "16GiB", "--sparse"]);
    assert_eq!(code, 0, "{out}{err}");
    // One round of a million one-block objects takes many seconds of
    // commits, even where a sync costs nothing.
    let args = [
        "bench",
        "--device",
        d,
        "--round-size",
        "1000000",
        "--sizes",
        "fixed:4KiB",
        "--batch",
        "16",
        "--time-limit",
        "0.5",
    ];
    let t = std::time::Instant::now();
    let (code, out, err) = blockalloc(&args);
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stopped: time_limit"), "{out}");
    assert!(wall < 0.5 + 2.0, "{wall} s for a 0.5 s limit");
    assert!(err.is_empty(), "no bar when stderr is no terminal: {err}");
    let Some((ok, tty)) = on_terminal(&args) else {
        return;
    };
    assert!(ok, "{tty}");
    assert!(tty.contains("% used"), "{tty}");
    assert!(tty.contains("allocations"), "{tty}");
}

/// Runs `blockalloc args` on a pseudo-terminal (`script`): whether it
/// succeeded and what the terminal showed; `None` (the test is skipped)
/// where `script` is missing.
fn on_terminal(args: &[&str]) -> Option<(bool, String)> {
    let cmd = format!("{} {}", env!("CARGO_BIN_EXE_blockalloc"), args.join(" "));
    let Ok(out) = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
    else {
        eprintln!("skipped: no `script` to make a terminal");
        return None;
    };
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Runs `blockalloc args`, killed after a generous limit so that a command
/// that blocks (opening a FIFO waits for a writer) fails the test instead
/// of hanging it.
fn blockalloc_or_kill(args: &[&str]) -> (i32, String, String) {
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "blockalloc {args:?} still ran after 120 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_path_that_is_no_device_is_a_usage_error_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    let fifo = dir.path().join("fifo");
    let mut paths = vec![
        ("/dev/null".to_string(), "a character device"),
        (folder.to_str().unwrap().to_string(), "a directory"),
    ];
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        paths.push((fifo.to_str().unwrap().to_string(), "a FIFO"));
    } else {
        eprintln!("SKIPPED the FIFO cases: mkfifo failed");
    }
    let live = dir.path().join("live");
    std::fs::write(&live, "").unwrap();
    let live = live.to_str().unwrap();
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../trace/tests/fixtures/seed-32MiB.trace"
    );
    for (path, what) in &paths {
        let p = path.as_str();
        let commands: Vec<Vec<&str>> = vec![
            vec!["format", "--device", p, "--size", "1MiB"],
            vec!["format", "--device", p, "--size", "1MiB", "--force"],
            vec!["check", "--device", p],
            vec!["check", "--device", p, "--json"],
            vec!["inspect", "--device", p],
            vec!["reconcile", "--device", p, "--live", live],
            vec!["serve", "--device", p, "--listen", "127.0.0.1:0"],
            vec!["bench", "--device", p, "--max-ops", "10"],
            vec!["replay", trace, "--verify", "--device", p],
            vec!["replay", trace, "--verify", "--device", p, "--force"],
        ];
        for args in commands {
            let (code, out, err) = blockalloc_or_kill(&args);
            assert_eq!(code, 2, "{args:?}: {out}{err}");
            let message = format!("{p} is {what}, not a regular file or a block device");
            assert!(
                err.contains(&message) || out.contains(&message),
                "{args:?}: {out}{err}"
            );
        }
    }
}
