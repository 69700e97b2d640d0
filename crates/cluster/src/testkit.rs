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

/// One running etcd process.
#[derive(Debug)]
struct Proc {
    child: Child,
    endpoint: String,
    /// The plain-HTTP metrics listener, which answers `/health`.
    health: String,
}

impl Proc {
    fn healthy(&mut self) -> bool {
        use std::io::{Read, Write};
        if let Ok(Some(_)) = self.child.try_wait() {
            return false;
        }
        let Ok(mut s) = std::net::TcpStream::connect(&self.health) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.health);
        let mut body = String::new();
        s.write_all(req.as_bytes()).is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("\"health\":\"true\"")
    }
}

/// A running etcd of one or more members on loopback ports, killed when
/// dropped.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Option<Proc>>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts a one-member etcd and waits until it answers (short election
    /// timeouts: it is ready in well under a second).
    ///
    /// # Panics
    /// When no etcd can be found or built, or it does not come up in 30 s.
    pub fn start() -> Etcd {
        Etcd::start_members(1)
    }

    /// Starts an etcd of `n` members and waits until every one answers.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_members(n: usize) -> Etcd {
        Etcd::launch(n, None)
    }

    /// Starts a one-member etcd that serves clients over TLS only, with
    /// `cert` and `key` (PEM files, for 127.0.0.1), and requires client
    /// certificates signed by `ca`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_tls(ca: &Path, cert: &Path, key: &Path) -> Etcd {
        Etcd::launch(1, Some((ca, cert, key)))
    }

    fn launch(n: usize, tls: Option<(&Path, &Path, &Path)>) -> Etcd {
        let bin = etcd_binary();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temporary directory");
            let ports: Vec<(u16, u16, u16)> = (0..n)
                .map(|_| (free_port(), free_port(), free_port()))
                .collect();
            let initial = ports
                .iter()
                .enumerate()
                .map(|(i, (_, p, _))| format!("m{i}=http://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut members = Vec::with_capacity(n);
            for (i, (client, peer, health)) in ports.iter().enumerate() {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let c = format!("{scheme}://127.0.0.1:{client}");
                let p = format!("http://127.0.0.1:{peer}");
                let mut cmd = Command::new(&bin);
                if let Some((ca, cert, key)) = tls {
                    cmd.arg("--cert-file")
                        .arg(cert)
                        .arg("--key-file")
                        .arg(key)
                        .arg("--trusted-ca-file")
                        .arg(ca)
                        .arg("--client-cert-auth");
                }
                let child = cmd
                    .args(["--name", &format!("m{i}"), "--data-dir"])
                    .arg(dir.path().join(format!("m{i}")))
                    .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                    .args([
                        "--listen-peer-urls",
                        &p,
                        "--initial-advertise-peer-urls",
                        &p,
                    ])
                    .args(["--initial-cluster", &initial])
                    .args(["--election-timeout", "100", "--heartbeat-interval", "10"])
                    .args([
                        "--listen-metrics-urls",
                        &format!("http://127.0.0.1:{health}"),
                    ])
                    .args(["--log-level", "error"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(
                        std::fs::File::create(dir.path().join(format!("m{i}.log")))
                            .expect("etcd log"),
                    ))
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
                members.push(Some(Proc {
                    child,
                    endpoint: format!("127.0.0.1:{client}"),
                    health: format!("127.0.0.1:{health}"),
                }));
            }
            let mut e = Etcd { members, _dir: dir };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                if e.members.iter_mut().flatten().all(Proc::healthy) {
                    return e;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // A port taken between choosing and binding: other ports.
        }
        panic!("etcd ({}) did not come up", bin.display())
    }

    /// The first live member's client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoints()[0].clone()
    }

    /// Every live member's client endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .flatten()
            .map(|m| m.endpoint.clone())
            .collect()
    }

    /// The first member's process id (for SIGSTOP and SIGCONT).
    pub fn pid(&self) -> u32 {
        self.members[0].as_ref().map_or(0, |m| m.child.id())
    }

    /// Kills the member serving `endpoint` (SIGKILL).
    pub fn kill(&mut self, endpoint: &str) {
        for slot in &mut self.members {
            if slot.as_ref().is_some_and(|m| m.endpoint == endpoint) {
                let mut m = slot.take().expect("just checked");
                let _ = m.child.kill();
                let _ = m.child.wait();
            }
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in self.members.iter_mut().flatten() {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
}

/// A TCP proxy on a loopback port whose connections can be cut: a network
/// cut between a client and a server, in one process. Needs a tokio
/// runtime.
#[derive(Debug)]
pub struct Proxy {
    addr: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts one that forwards to `to` (`HOST:PORT`).
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(to: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = l.local_addr().expect("bound").to_string();
        let proxy = Proxy {
            addr,
            cut: std::sync::Arc::default(),
            conns: std::sync::Arc::default(),
        };
        let (cut, conns) = (proxy.cut.clone(), proxy.conns.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                if cut.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let to = to.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(mut t) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut s, &mut t).await;
                    }
                });
                conns.lock().expect("not poisoned").push(conn);
            }
        });
        proxy
    }

    /// Its address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Cuts every connection and refuses new ones (`true`), or accepts
    /// them again (`false`).
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for c in self.conns.lock().expect("not poisoned").drain(..) {
                c.abort();
            }
        }
    }
}
