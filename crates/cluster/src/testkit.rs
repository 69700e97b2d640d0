//! A real etcd for tests: one member on loopback ports with a temporary
//! data directory, stopped (killed) when dropped.
//!
//! The binary, in this order: `$BLOCKALLOC_ETCD`; `target/etcd/etcd` in
//! the workspace; else built there from the pinned Go module in
//! `tools/etcd` (`go build`, about a minute the first time, then cached);
//! else `etcd` on `PATH`. With none of them the caller panics saying so:
//! a cluster test never skips.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace root (this crate is `crates/cluster`).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The etcd binary to run (see the module docs).
///
/// # Panics
/// When there is none and it cannot be built.
pub fn etcd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("BLOCKALLOC_ETCD") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let built = target.join("etcd").join("etcd");
    if built.is_file() {
        return built;
    }
    let dir = target.join("etcd");
    std::fs::create_dir_all(&dir).expect("create target/etcd");
    // Test binaries run in parallel: one builds, under a lock file.
    let lock = std::fs::File::create(dir.join(".lock")).expect("create the build lock");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .expect("lock target/etcd/.lock");
    if built.is_file() {
        return built;
    }
    let tmp = dir.join("etcd.partial");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&tmp)
        .arg("go.etcd.io/etcd/server/v3")
        .current_dir(workspace().join("tools/etcd"))
        .status();
    match status {
        Ok(s) if s.success() => {
            std::fs::rename(&tmp, &built).expect("move the etcd binary into place");
            built
        }
        other => {
            if let Ok(p) = which_etcd() {
                return p;
            }
            panic!(
                "no etcd for the cluster tests: set BLOCKALLOC_ETCD, install Go (to build the \
                 pinned etcd from tools/etcd), or put etcd on PATH ({other:?})"
            )
        }
    }
}

fn which_etcd() -> Result<PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or(())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// A running one-member etcd.
#[derive(Debug)]
pub struct Etcd {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts one and waits until it answers (short election timeouts:
    /// it is ready in well under a second).
    ///
    /// # Panics
    /// When no etcd can be found or built, or it does not come up in 30 s.
    pub fn start() -> Etcd {
        let bin = etcd_binary();
        for _ in 0..5 {
            let (client, peer) = (free_port(), free_port());
            let dir = tempfile::tempdir().expect("temporary directory");
            let c = format!("http://127.0.0.1:{client}");
            let p = format!("http://127.0.0.1:{peer}");
            let child = Command::new(&bin)
                .args(["--name", "t", "--data-dir"])
                .arg(dir.path().join("data"))
                .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                .args([
                    "--listen-peer-urls",
                    &p,
                    "--initial-advertise-peer-urls",
                    &p,
                ])
                .args(["--initial-cluster", &format!("t={p}")])
                .args(["--election-timeout", "100", "--heartbeat-interval", "10"])
                .args(["--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::from(
                    std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log"),
                ))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
            let mut e = Etcd {
                child,
                endpoint: format!("127.0.0.1:{client}"),
                _dir: dir,
            };
            if e.wait_ready(Duration::from_secs(30)) {
                return e;
            }
            // A port taken between choosing and binding: another pair.
        }
        panic!("etcd ({}) did not come up", bin.display())
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let url = format!("/health HTTP/1.0\r\nHost: {}\r\n\r\n", self.endpoint);
            if let Ok(mut s) = std::net::TcpStream::connect(&self.endpoint) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                if s.write_all(format!("GET {url}").as_bytes()).is_ok() {
                    let mut body = String::new();
                    let _ = s.read_to_string(&mut body);
                    if body.contains("\"health\":\"true\"") {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Its client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Its process id (for SIGSTOP and SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
