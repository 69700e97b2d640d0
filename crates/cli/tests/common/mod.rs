//! Helpers of the CLI's server tests: the real `blockalloc` binary as a
//! child process, killed when its handle drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockalloc_store::device::{DirectIo, FileDevice};
use blockalloc_store::Store;

/// A child process killed (SIGKILL) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Waits for the exit code, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("process {} did not exit within {limit:?}", self.0.id());
    }
}

/// Starts `blockalloc serve` and returns it with the address it printed.
pub fn serve(device: &Path, listen: &str, ttl: &str) -> (Proc, String) {
    let (p, addr, _) = serve_logged(device, listen, ttl, &[], None);
    (p, addr)
}

/// Starts `blockalloc serve --device DEVICE ARGS...` and returns it with
/// the address it printed.
pub fn serve_with(device: &Path, args: &[&str]) -> (Proc, String) {
    let (p, addr, _) = launch(Some(device), args, None);
    (p, addr)
}

/// Starts `blockalloc serve ARGS...` (devices in ARGS or a configuration
/// file) and returns it with the address it printed.
pub fn serve_args(args: &[&str]) -> (Proc, String) {
    let (p, addr, _) = launch(None, args, None);
    (p, addr)
}

/// [`serve_args`] with `--metrics` among ARGS: also the metrics URL.
pub fn serve_args_metrics(args: &[&str]) -> (Proc, String, Option<String>) {
    launch(None, args, None)
}

/// [`serve_args`], with the server's stderr (the log) in `log`.
pub fn serve_args_logged(args: &[&str], log: &Path) -> (Proc, String) {
    let (p, addr, _) = launch(None, args, Some(log));
    (p, addr)
}

/// Starts `blockalloc serve` on a 64 MiB device with `extra` flags and its
/// stderr (the log) in `log`; returns it with the address it printed and,
/// with `--metrics`, the metrics URL.
pub fn serve_logged(
    device: &Path,
    listen: &str,
    ttl: &str,
    extra: &[&str],
    log: Option<&Path>,
) -> (Proc, String, Option<String>) {
    let mut args = vec!["--format", "64MiB", "--listen", listen, "--lease-ttl", ttl];
    args.extend_from_slice(extra);
    launch(Some(device), &args, log)
}

fn launch(
    device: Option<&Path>,
    args: &[&str],
    log: Option<&Path>,
) -> (Proc, String, Option<String>) {
    let stderr = match log {
        Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
        None => Stdio::null(),
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .arg("serve")
        .args(
            device
                .map(|d| [std::ffi::OsStr::new("--device"), d.as_os_str()])
                .into_iter()
                .flatten(),
        )
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let proc = Proc(child);
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let metrics = args.contains(&"--metrics").then(|| {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("metrics on ")
            .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
            .to_string()
    });
    (proc, addr, metrics)
}

pub fn blockalloc(args: &[&str]) -> (i32, String, String) {
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

/// `blockalloc token new --tenant NAME`: the token and the entry to paste.
pub fn new_tenant(name: &str) -> (String, String) {
    let (code, out, err) = blockalloc(&["token", "new", "--tenant", name]);
    assert_eq!(code, 0, "{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token in {out:?}"))
        .to_string();
    let entry = out
        .lines()
        .filter(|l| !l.starts_with("token: ") && !l.starts_with('#'));
    (token, entry.collect::<Vec<_>>().join("\n"))
}

/// A small tmpfs mount, unmounted on drop; `None` when mounting is not
/// possible (not root, no mount command).
pub struct Tmpfs(pub tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
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

pub fn open_store(path: &Path) -> Store {
    Store::open(FileDevice::open(path, DirectIo::Off).unwrap())
        .unwrap()
        .0
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The bytes of a store image kept sparse in the store's test fixtures
/// (format: `crates/store/tests/compat.rs`).
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../store/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let raw = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
    let mut img = vec![0u8; len];
    for rec in raw[16..].chunks(8 + 4096) {
        let at = u64::from_le_bytes(rec[..8].try_into().unwrap()) as usize;
        img[at..at + 4096].copy_from_slice(&rec[8..]);
    }
    img
}
