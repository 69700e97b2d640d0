//! `reconcile` end to end: a device with space no object owns, a list of
//! live extents from a file and from standard input, a dry run, the real
//! run, and malformed lists.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use blockalloc::Extent;
use blockalloc_store::device::{DirectIo, FileDevice};
use blockalloc_store::Store;

fn blockalloc(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = stdin.unwrap_or("").to_owned();
    let mut pipe = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || pipe.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn open(dev: &Path) -> Store {
    Store::open(FileDevice::open(dev, DirectIo::Off).unwrap())
        .unwrap()
        .0
}

fn list(extents: &[Extent]) -> String {
    let mut s = String::from("# live objects\n");
    for e in extents {
        s += &format!("{},{}\n", e.start(), e.len());
    }
    s
}

#[test]
fn reconcile_frees_what_the_list_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let d = dev.to_str().unwrap();
    let (code, _, err) = blockalloc(
        &["format", "--device", d, "--size", "64MiB", "--zero", "none"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let v = {
        let store = open(&dev);
        let mut t = store.begin();
        let v: Vec<Extent> = [16, 256, 8, 32]
            .iter()
            .map(|&n| t.allocate(n, None).unwrap())
            .collect();
        t.commit().unwrap();
        v
    };
    let live_path = dir.path().join("live.txt");
    let live = live_path.to_str().unwrap();
    std::fs::write(&live_path, list(&[v[0], v[2]])).unwrap();

    // A dry run reports and changes nothing.
    let (code, out, err) = blockalloc(
        &[
            "reconcile",
            "--device",
            d,
            "--live",
            live,
            "--dry-run",
            "--json",
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["dry_run"], true);
    assert_eq!(j["live_extents"], 2);
    assert_eq!(j["freed_extents"], 2);
    assert_eq!(j["freed_blocks"], 288);
    assert_eq!(j["freed_bytes"], 288 * 4096);
    assert_eq!(j["commits"], 0);
    open(&dev).check_allocated(v[1]).unwrap();

    // The real run, in human units.
    let (code, out, err) = blockalloc(&["reconcile", "--device", d, "--live", live], None);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("2 live extents checked (24 blocks, 96.0 KiB)"),
        "{out}"
    );
    assert!(
        out.contains("freed 2 extents: 288 blocks (1.1 MiB) in 1 commits"),
        "{out}"
    );
    let store = open(&dev);
    store.check_allocated(v[0]).unwrap();
    store.check_allocated(v[2]).unwrap();
    assert!(store.check_allocated(v[1]).is_err());
    assert!(store.check_allocated(v[3]).is_err());
    assert_eq!(
        store.status().space.used_blocks,
        store.layout().meta_blocks + 24
    );
    drop(store);
    let (code, out, err) = blockalloc(&["check", "--device", d], None);
    assert_eq!(code, 0, "{out}{err}");

    // Standard input; nothing left to free.
    let (code, out, err) = blockalloc(
        &["reconcile", "--device", d, "--live", "-", "--json"],
        Some(&list(&[v[0], v[2]])),
    );
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (j["live_extents"].as_u64(), j["freed_extents"].as_u64()),
        (Some(2), Some(0))
    );

    // A list naming free space: exit 4, nothing freed.
    std::fs::write(&live_path, list(&[v[0], v[1], v[2]])).unwrap();
    let (code, _, err) = blockalloc(&["reconcile", "--device", d, "--live", live], None);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("at line 3") && err.contains("not allocated"),
        "{err}"
    );
    open(&dev).check_allocated(v[0]).unwrap();

    // Malformed lists: exit 2 naming the line, nothing freed.
    for (text, want) in [
        (list(&[v[2], v[0]]), "at line 3"),
        (list(&[v[0], v[0]]), "overlaps"),
        ("0,1\n".to_string(), "metadata"),
        (format!("{},4\n7\n", v[0].start()), "line 2: expected"),
        ("99999999,1\n".to_string(), "past the device"),
    ] {
        std::fs::write(&live_path, &text).unwrap();
        let (code, _, err) = blockalloc(&["reconcile", "--device", d, "--live", live], None);
        assert_eq!(code, 2, "{text}: {err}");
        assert!(err.contains(want), "{text}: {err}");
        open(&dev).check_allocated(v[0]).unwrap();
        open(&dev).check_allocated(v[2]).unwrap();
    }
    // Another writer holds the device: busy, nothing read.
    std::fs::write(&live_path, list(&[v[0], v[2]])).unwrap();
    let held = open(&dev);
    let (code, _, err) = blockalloc(&["reconcile", "--device", d, "--live", live], None);
    assert_eq!(code, 5, "{err}");
    drop(held);
    let missing = dir.path().join("missing.txt");
    let (code, _, err) = blockalloc(
        &[
            "reconcile",
            "--device",
            d,
            "--live",
            missing.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing.txt"), "{err}");
    let (code, out, _) = blockalloc(&["reconcile", "--help"], None);
    assert_eq!(code, 0);
    assert!(
        out.contains("LIVE-EXTENT LIST") && out.contains("--dry-run"),
        "{out}"
    );
}

#[test]
fn reconcile_closes_the_store_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let d = dev.to_str().unwrap();
    let (code, _, err) = blockalloc(
        &["format", "--device", d, "--size", "64MiB", "--zero", "none"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let live = {
        // Dropped without a close: the journal holds the commit.
        let store = open(&dev);
        let mut t = store.begin();
        let v = [t.allocate(16, None).unwrap(), t.allocate(8, None).unwrap()];
        t.commit().unwrap();
        v
    };
    let closed = || {
        let (code, out, err) = blockalloc(&["check", "--device", d, "--json"], None);
        assert_eq!(code, 0, "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["closed_cleanly"].as_bool().unwrap()
    };
    assert!(!closed(), "the writer before did not close");
    let (code, out, err) = blockalloc(
        &["reconcile", "--device", d, "--live", "-"],
        Some(&list(&live[..1])),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(closed(), "reconcile closes the store it wrote");
    let store = open(&dev);
    store.check_allocated(live[0]).unwrap();
    assert!(store.check_allocated(live[1]).is_err(), "freed");
}
