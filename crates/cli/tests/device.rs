//! `format`, `inspect`, `check` and `bench --device` end to end.

use std::process::Command;

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
    assert!(out.contains("64MiB in 16384 blocks of 4KiB"), "{out}");
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
