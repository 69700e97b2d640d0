//! Fault harness: the allocation service stays safe through server crashes,
//! paused clients and network cuts.
//!
//! The test starts `blockalloc serve` on a small device and puts a TCP
//! proxy (in this process) between it and several client processes (this
//! test binary run with a filter, as `serve.rs` runs its helpers): some
//! allocate and free per call ([`Client`]), some through a
//! [`LeasingAllocator`]. Each client logs every event it sees, with the time
//! on CLOCK_MONOTONIC (one clock for every process), to a file of its own.
//! Meanwhile the test injects faults, one at a time, each followed by a wait
//! until every client has made progress again:
//! * kill: SIGKILL of the server, restarted on the same device; the proxy
//!   then points at its new port, so clients reconnect to the same address;
//! * pause: SIGSTOP of a leasing client for longer than the lease TTL plus
//!   its margin, then SIGCONT;
//! * cut: the proxy drops every connection and refuses new ones, for a
//!   quarter of a TTL (short) or one and a half TTLs (long);
//! * stall: the proxy holds every byte in both directions, on old and new
//!   connections, for half a TTL, then delivers them late (a silent network:
//!   calls hang, resends and the originals arrive together).
//!
//! At the end the clients commit, log what they hold, then free it all and
//! release their leases. The checker rebuilds from the logs a shadow
//! ownership timeline of every block: a client holds a block from the
//! acknowledgement of its allocation until it asks to free it or, for leased
//! space it never committed and lost, until the deadline the client computed
//! for it (the writer's rule of `allocator.proto`). Invariants:
//! 1. no block is held by two holders at once (nor allocated from a lease
//!    past its deadline);
//! 2. no acknowledged allocation is lost: everything a client still holds
//!    (committed) at the end is freed successfully, no free of a held
//!    extent (nor a commit's batch of frees) is refused, and no committed
//!    leased allocation is reported lost;
//! 3. no leaked blocks: once every client has freed what it holds and
//!    released its leases, the device's used blocks are its metadata blocks
//!    (no `reconcile`);
//! 4. a server restart whose downtime is shorter than a lease can outlive
//!    it (two thirds of the TTL, the part left after the client's last
//!    renewal, less the margin) makes no leasing client lose a lease.
//!
//! Calls that end with their outcome unknown to the client are counted as
//! "unresolved": the client is to retry them with the same request id until
//! it knows; the harness never dedupes on its own.
//!
//! Short form, a few faults, in the normal suite:
//!
//! ```text
//! cargo test -p blockalloc-cli --test faults
//! ```
//!
//! Long form, at least N faults of every kind in a seeded random order, with
//! a summary line (kills, pauses, cuts, operations, violations per
//! invariant); about three and a half seconds a fault:
//!
//! ```text
//! BLOCKALLOC_FAULTS=200 cargo test -p blockalloc-cli --test faults -- --nocapture
//! ```
//!
//! `BLOCKALLOC_FAULTS_SEED` picks another fault order;
//! `BLOCKALLOC_FAULTS_KEEP=1` keeps the device and the client logs (the
//! failure message names the directory).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockalloc_client::{
    pb, Client, ClientError, DeviceId, Extent, LeaseOptions, LeasingAllocator,
};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

mod common;
use common::{blockalloc, rt, serve_args_logged, Proc};

/// The server's lease TTL, in seconds.
const TTL_S: f64 = 3.0;
/// Leasing and per-call client processes.
const LEASING: usize = 3;
const PER_CALL: usize = 3;
/// Objects a client holds at most; small objects on a small device, so that
/// freed and expired space is soon allocated again.
const MAX_HELD: usize = 24;
const MAX_BLOCKS: u64 = 8;
/// Generous bounds on waits for conditions (never timing assertions).
const PATIENCE: Duration = Duration::from_secs(120);

/// Now on CLOCK_MONOTONIC, in nanoseconds: the one clock of every process.
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `at` on CLOCK_MONOTONIC (std's `Instant` is that clock on Linux, but
/// keeps its value private).
fn instant_ns(at: Instant) -> u64 {
    let (ns, now) = (now_ns(), Instant::now());
    if at >= now {
        ns + (at - now).as_nanos() as u64
    } else {
        ns.saturating_sub((now - at).as_nanos() as u64)
    }
}

// ---------------------------------------------------------------------------
// The proxy.

/// A TCP proxy on loopback between the clients and the server: it can cut
/// every connection and refuse new ones for a while, and be pointed at
/// another server.
struct Proxy {
    addr: String,
    st: Arc<ProxyState>,
}

struct ProxyState {
    target: Mutex<String>,
    stop: AtomicBool,
    /// Bytes are held, not forwarded.
    stalled: AtomicBool,
    /// Both ends of every forwarded connection, and whether the proxy is
    /// cut, under one lock, so that a connection accepted during a cut is
    /// never forwarded.
    conns: Mutex<(bool, Vec<TcpStream>)>,
}

impl Proxy {
    fn start(target: &str) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let st = Arc::new(ProxyState {
            target: Mutex::new(target.to_string()),
            stop: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            conns: Mutex::new((false, Vec::new())),
        });
        let s = Arc::clone(&st);
        std::thread::spawn(move || {
            for c in l.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(c) = c else { continue };
                let mut conns = s.conns.lock().unwrap();
                let target = s.target.lock().unwrap().clone();
                let up = match (conns.0, TcpStream::connect(&target)) {
                    (false, Ok(up)) => up,
                    // Cut, or the server is down: the client sees the
                    // connection close.
                    _ => {
                        let _ = c.shutdown(Shutdown::Both);
                        continue;
                    }
                };
                let _ = c.set_nodelay(true);
                let _ = up.set_nodelay(true);
                conns.1.push(c.try_clone().unwrap());
                conns.1.push(up.try_clone().unwrap());
                let (c2, up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                let s2 = Arc::clone(&s);
                std::thread::spawn(move || pump(c, up, &s2));
                let s2 = Arc::clone(&s);
                std::thread::spawn(move || pump(up2, c2, &s2));
            }
        });
        Proxy { addr, st }
    }

    /// Drops every connection and refuses new ones until [`heal`](Self::heal).
    fn cut(&self) {
        let mut conns = self.st.conns.lock().unwrap();
        conns.0 = true;
        for c in conns.1.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn heal(&self) {
        self.st.conns.lock().unwrap().0 = false;
    }

    /// Holds every byte until [`resume`](Self::resume).
    fn stall(&self) {
        self.st.stalled.store(true, Ordering::Relaxed);
    }

    fn resume(&self) {
        self.st.stalled.store(false, Ordering::Relaxed);
    }

    /// Forwards new connections to `target`; the old ones are dropped.
    fn retarget(&self, target: &str) {
        *self.st.target.lock().unwrap() = target.to_string();
        let mut conns = self.st.conns.lock().unwrap();
        for c in conns.1.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.st.stop.store(true, Ordering::Relaxed);
        self.cut();
        let _ = TcpStream::connect(&self.addr); // wakes the accept loop
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, st: &ProxyState) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                while st.stalled.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------
// The client processes and their logs.
//
// One event a line, times in ns on CLOCK_MONOTONIC, extents as `start len`:
//   A t start len call|lease deadline|-   allocation acknowledged
//   D t start len deadline               deadline of an uncommitted leased
//                                        allocation, refreshed
//   C t0 t1                              commit acknowledged: everything
//                                        allocated and freed before t0 is
//                                        durable
//   F t0 t1 start len                    per-call free sent at t0,
//                                        acknowledged at t1
//   f t start len                        leased free (acknowledged by the
//                                        next C)
//   L t start len                        leased allocation lost
//   X t op class [start len]             a call failed (op: alloc, free,
//                                        commit, close; class: unavailable,
//                                        unknown, refused, other); for a
//                                        free, t is when it was sent
//   V t start len                        held at the end (after a commit)
//   S t                                  settled: every V logged
//   Z t                                  everything freed, leases released

/// Run as a separate process by `faults_keep_every_allocation_safe`: a
/// client that allocates, frees and commits at random and logs what it
/// sees. Does nothing when run as an ordinary test.
#[test]
fn helper_fault_client_process() {
    let Ok(spec) = std::env::var("BLOCKALLOC_FAULT_CLIENT") else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [kind, addr, dir, name, seed] = parts[..] else {
        panic!("bad BLOCKALLOC_FAULT_CLIENT {spec:?}");
    };
    let w = Worker {
        addr: addr.to_string(),
        dir: PathBuf::from(dir),
        log: std::fs::File::create(Path::new(dir).join(format!("{name}.log"))).unwrap(),
        rng: Xoshiro256PlusPlus::seed_from_u64(seed.parse().unwrap()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match kind {
        "lease" => rt.block_on(w.leasing()),
        "call" => rt.block_on(w.per_call()),
        _ => panic!("bad kind {kind}"),
    }
}

struct Worker {
    addr: String,
    dir: PathBuf,
    log: std::fs::File,
    rng: Xoshiro256PlusPlus,
}

fn class(e: &ClientError) -> &'static str {
    match e {
        ClientError::Unavailable(_) => "unavailable",
        ClientError::OutcomeUnknown(_) => "unknown",
        ClientError::Refused { .. } => "refused",
        ClientError::Lost { .. } => "lost",
        _ => "other",
    }
}

impl Worker {
    fn line(&mut self, s: String) {
        self.log.write_all(format!("{s}\n").as_bytes()).unwrap();
    }

    /// Logs a failed call; `ext`: the extent of a free, with the time the
    /// free was sent (the holder let go of it then).
    fn error(&mut self, op: &str, e: &ClientError, ext: Option<(Extent, u64)>) {
        let t = ext.map_or_else(now_ns, |(_, t)| t);
        let ext = ext.map_or(String::new(), |(e, _)| {
            format!(" {} {}", e.start(), e.len())
        });
        let msg = e.to_string().replace('\n', " ");
        self.line(format!("X {t} {op} {}{ext} # {msg}", class(e)));
    }

    fn asked(&self, what: &str) -> bool {
        self.dir.join(what).exists()
    }

    async fn connect(&self) -> Client {
        loop {
            match Client::connect(&self.addr).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    async fn pace(&mut self) {
        let ms = self.rng.random_range(2..8);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Per call: `Client::allocate` and `Client::free`.
    async fn per_call(mut self) {
        let c = self.connect().await;
        let dev = DeviceId::Index(0);
        let mut held: Vec<Extent> = Vec::new();
        // Frees that failed: retried, never used again.
        let mut freeing: Vec<Extent> = Vec::new();
        while !self.asked("settle") {
            let r = self.rng.random_range(0..100);
            if !freeing.is_empty() && r < 20 {
                let e = freeing.swap_remove(0);
                self.free_call(&c, e, &mut freeing).await;
            } else if held.is_empty() || (held.len() < MAX_HELD && r < 55) {
                let blocks = self.rng.random_range(1..=MAX_BLOCKS);
                match c.allocate(&dev, 1, blocks, None).await {
                    Ok(v) => {
                        let t = now_ns();
                        for e in v {
                            self.line(format!("A {t} {} {} call -", e.start(), e.len()));
                            held.push(e);
                        }
                    }
                    Err(e) => {
                        self.error("alloc", &e, None);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            } else {
                let i = self.rng.random_range(0..held.len());
                let e = held.swap_remove(i);
                self.free_call(&c, e, &mut freeing).await;
            }
            self.pace().await;
        }
        let t = now_ns();
        for e in &held {
            self.line(format!("V {t} {} {}", e.start(), e.len()));
        }
        self.line(format!("S {}", now_ns()));
        while !self.asked("finish") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        freeing.extend(held);
        let give_up = Instant::now() + PATIENCE;
        while let Some(e) = freeing.pop() {
            if Instant::now() > give_up {
                break;
            }
            self.free_call(&c, e, &mut freeing).await;
        }
        self.line(format!("Z {}", now_ns()));
    }

    /// Frees `e`; a call that failed without a verdict goes back to
    /// `freeing`, to be freed again later (a new call: the client retries
    /// a call itself, with its request id, before it reports a failure).
    async fn free_call(&mut self, c: &Client, e: Extent, freeing: &mut Vec<Extent>) {
        let t0 = now_ns();
        match c.free(&DeviceId::Index(0), &[e]).await {
            Ok(_) => {
                let t1 = now_ns();
                self.line(format!("F {t0} {t1} {} {}", e.start(), e.len()));
            }
            Err(err) => {
                self.error("free", &err, Some((e, t0)));
                if !matches!(err, ClientError::Refused { .. }) {
                    freeing.insert(0, e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Through a `LeasingAllocator`: local allocations and frees, commits.
    async fn leasing(mut self) {
        let c = self.connect().await;
        let a = LeasingAllocator::new(
            c,
            LeaseOptions {
                min_blocks: 16,
                want_blocks: 128,
                ..LeaseOptions::default()
            },
        );
        // Held allocations, whether they are durable (a commit acknowledged
        // them, or they were allocated per call), and their deadline logged
        // last.
        let mut held: Vec<(Extent, bool, u64)> = Vec::new();
        while !self.asked("settle") {
            self.deadlines(&a, &mut held);
            let r = self.rng.random_range(0..100);
            if held.is_empty() || (held.len() < MAX_HELD && r < 50) {
                let blocks = self.rng.random_range(1..=MAX_BLOCKS);
                match a.allocate(blocks).await {
                    Ok(e) => {
                        let t = now_ns();
                        // The writer's deadline (`None`: per call, durable).
                        let dl = a.deadline(e).map(instant_ns);
                        let shown = dl.map_or("-".to_string(), |d| d.to_string());
                        self.line(format!("A {t} {} {} lease {shown}", e.start(), e.len()));
                        held.push((e, dl.is_none(), dl.unwrap_or(0)));
                    }
                    Err(e) => {
                        self.error("alloc", &e, None);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            } else if r < 85 {
                let i = self.rng.random_range(0..held.len());
                let (e, _, _) = held.swap_remove(i);
                self.line(format!("f {} {} {}", now_ns(), e.start(), e.len()));
                a.free(e).await.unwrap();
            } else if !self.commit(&a, &mut held).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.pace().await;
        }
        let give_up = Instant::now() + PATIENCE;
        while !self.commit(&a, &mut held).await && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let t = now_ns();
        for (e, _, _) in &held {
            self.line(format!("V {t} {} {}", e.start(), e.len()));
        }
        self.line(format!("S {}", now_ns()));
        while !self.asked("finish") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (e, _, _) in std::mem::take(&mut held) {
            self.line(format!("f {} {} {}", now_ns(), e.start(), e.len()));
            a.free(e).await.unwrap();
        }
        while !self.commit(&a, &mut held).await && Instant::now() < give_up + PATIENCE {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Err(e) = a.close().await {
            self.error("close", &e, None);
        }
        self.line(format!("Z {}", now_ns()));
    }

    /// Logs the deadlines of uncommitted allocations that moved on (the
    /// lease was renewed), or that a background commit made durable.
    fn deadlines(&mut self, a: &LeasingAllocator, held: &mut [(Extent, bool, u64)]) {
        for (e, committed, last) in held.iter_mut() {
            if *committed {
                continue;
            }
            let t = now_ns();
            match a.deadline(*e) {
                // A deadline already past grants nothing more (the client
                // says so of an allocation lost and not yet reported).
                Some(d) if d <= Instant::now() => {}
                Some(d) => {
                    let d = instant_ns(d);
                    // Converted at each call: log real moves only.
                    if d > *last + 1_000_000 {
                        *last = d;
                        self.line(format!("D {t} {} {} {d}", e.start(), e.len()));
                    }
                }
                None => {
                    *committed = true;
                    self.line(format!("D {t} {} {} -", e.start(), e.len()));
                }
            }
        }
    }

    /// One `commit`, logged; true when acknowledged.
    async fn commit(&mut self, a: &LeasingAllocator, held: &mut Vec<(Extent, bool, u64)>) -> bool {
        let t0 = now_ns();
        match a.commit().await {
            Ok(()) => {
                let t1 = now_ns();
                self.line(format!("C {t0} {t1}"));
                for h in held.iter_mut() {
                    h.1 = true;
                }
                true
            }
            Err(ClientError::Lost { extents }) => {
                let t = now_ns();
                for e in extents {
                    self.line(format!("L {t} {} {}", e.start(), e.len()));
                    held.retain(|h| h.0 != e);
                }
                false
            }
            Err(e) => {
                self.error("commit", &e, None);
                false
            }
        }
    }
}

/// A client process and the part of its log read so far.
struct ClientProc {
    name: String,
    leasing: bool,
    proc: Proc,
    log: PathBuf,
    read: usize,
    /// Time of the newest progress event: an acknowledged commit for a
    /// leasing client, an acknowledged allocation or free for a per-call
    /// one.
    progress: u64,
    settled: bool,
}

impl ClientProc {
    fn spawn(dir: &Path, proxy: &str, name: &str, leasing: bool, seed: u64) -> ClientProc {
        let kind = if leasing { "lease" } else { "call" };
        let spec = format!("{kind} {proxy} {} {name} {seed}", dir.display());
        let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "helper_fault_client_process", "--nocapture"])
            .env("BLOCKALLOC_FAULT_CLIENT", spec)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        ClientProc {
            name: name.to_string(),
            leasing,
            proc: Proc(child),
            log: dir.join(format!("{name}.log")),
            read: 0,
            progress: 0,
            settled: false,
        }
    }

    /// Reads the complete lines logged since the last call.
    fn poll(&mut self) {
        let mut text = Vec::new();
        let read = std::fs::File::open(&self.log).and_then(|mut f| {
            f.seek(SeekFrom::Start(self.read as u64))?;
            f.read_to_end(&mut text)
        });
        if read.is_err() {
            return;
        }
        let Some(end) = text.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        let new = String::from_utf8_lossy(&text[..=end]).into_owned();
        self.read += end + 1;
        for l in new.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            let t = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            match (f[0], self.leasing) {
                ("C", true) => self.progress = self.progress.max(t(1)),
                ("A", false) => self.progress = self.progress.max(t(1)),
                ("F", false) => self.progress = self.progress.max(t(1)),
                ("S", _) => self.settled = true,
                _ => {}
            }
        }
    }

    /// The tail of its stderr, for a failure message.
    fn stderr_tail(&self) -> String {
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        let start = err.len().saturating_sub(2000);
        let start = (start..=err.len())
            .find(|&i| err.is_char_boundary(i))
            .unwrap_or(err.len());
        format!("{}: {}", self.name, &err[start..])
    }
}

// ---------------------------------------------------------------------------
// The faults and the run.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
    CutShort,
    CutLong,
    Stall,
}

const FAULTS: [Fault; 5] = [
    Fault::Kill,
    Fault::Pause,
    Fault::CutShort,
    Fault::CutLong,
    Fault::Stall,
];

/// A fault as it happened: its kind, when it started and ended (for a kill:
/// the restarted server serves through the proxy).
struct Injected {
    kind: Fault,
    t0: u64,
    t1: u64,
}

struct Run {
    /// Keeps the device and the logs until the run is checked.
    _dir: tempfile::TempDir,
    dev: PathBuf,
    ttl: Duration,
    margin: Duration,
    injected: Vec<Injected>,
    /// Faults after which some client made no progress within `PATIENCE`.
    no_progress: Vec<String>,
    settled_at: u64,
    /// The device after every client freed everything: used and metadata
    /// blocks, live leases, leased unused blocks.
    end_status: (u64, u64, u64, u64),
    /// Used blocks at the settle point, for invariant 2's count.
    settled_used: u64,
    meta: u64,
    check_ok: bool,
    clients: Vec<(String, bool, PathBuf)>,
    client_errors: String,
}

/// Status of device 0 on the server at `addr`.
fn status(rt: &tokio::runtime::Runtime, addr: &str) -> pb::DeviceStatus {
    rt.block_on(async {
        let c = Client::connect(addr).await.unwrap();
        c.status().await.unwrap().remove(0)
    })
}

fn run(faults: usize, seed: u64) -> Run {
    let dir = tempfile::Builder::new()
        .prefix("faults")
        .disable_cleanup(std::env::var_os("BLOCKALLOC_FAULTS_KEEP").is_some())
        .tempdir()
        .unwrap();
    let dev = dir.path().join("d0");
    let ttl = TTL_S.to_string();
    let args = [
        "--device",
        dev.to_str().unwrap(),
        "--format",
        "16MiB",
        "--listen",
        "127.0.0.1:0",
        "--lease-ttl",
        &ttl,
    ];
    // Each server's log in serve-N.log.
    let serve = |n: usize| serve_args_logged(&args, &dir.path().join(format!("serve-{n}.log")));
    let (mut srv, mut addr) = serve(0);
    // What the server says of its leases: the TTL and the margin.
    let rt = rt();
    let (ttl, margin, meta) = rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let r = c
            .rpc()
            .lease(pb::LeaseRequest {
                client_id: "faults-probe".into(),
                min_blocks: 1,
                want_blocks: 1,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: r.lease_id,
                ..Default::default()
            })
            .await
            .unwrap();
        let st = c.status().await.unwrap().remove(0);
        (
            Duration::from_millis(r.ttl_ms),
            Duration::from_millis(r.margin_ms),
            st.meta_blocks,
        )
    });
    let proxy = Proxy::start(&addr);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut clients: Vec<ClientProc> = (0..LEASING + PER_CALL)
        .map(|i| {
            let leasing = i < LEASING;
            let name = format!("{}{i}", if leasing { "lease" } else { "call" });
            ClientProc::spawn(
                dir.path(),
                &proxy.addr,
                &name,
                leasing,
                seed * 100 + i as u64,
            )
        })
        .collect();
    let mut no_progress = Vec::new();
    wait_progress(&mut clients, 0, "start", &mut no_progress);
    let mut injected = Vec::new();
    for i in 0..faults {
        // Every kind once, first; then at random.
        let kind = match FAULTS.get(i) {
            Some(&k) => k,
            None => FAULTS[rng.random_range(0..FAULTS.len())],
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(200..600)));
        let t0 = now_ns();
        let mut whom = String::new();
        match kind {
            Fault::Kill => {
                srv.0.kill().unwrap();
                srv.0.wait().unwrap();
                std::thread::sleep(Duration::from_millis(rng.random_range(0..200)));
                let (s, a) = serve(i + 1);
                proxy.retarget(&a);
                (srv, addr) = (s, a);
            }
            Fault::Pause => {
                let c = &clients[rng.random_range(0..LEASING)];
                whom.clone_from(&c.name);
                c.proc.signal("-STOP");
                std::thread::sleep(ttl + margin + Duration::from_millis(500));
                c.proc.signal("-CONT");
            }
            Fault::CutShort | Fault::CutLong => {
                proxy.cut();
                std::thread::sleep(if kind == Fault::CutShort {
                    ttl / 4
                } else {
                    ttl * 3 / 2
                });
                proxy.heal();
            }
            Fault::Stall => {
                proxy.stall();
                std::thread::sleep(ttl / 2);
                proxy.resume();
            }
        }
        let t1 = now_ns();
        // For a reader of the logs: what happened when.
        let mut faults_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("faults.log"))
            .unwrap();
        writeln!(faults_log, "{kind:?} {t0} {t1} {whom}").unwrap();
        injected.push(Injected { kind, t0, t1 });
        wait_progress(
            &mut clients,
            t1,
            &format!("{kind:?} #{i}"),
            &mut no_progress,
        );
    }
    // Settle: every client commits and logs what it holds.
    let settled_at = now_ns();
    std::fs::write(dir.path().join("settle"), "").unwrap();
    let t = Instant::now();
    while clients.iter_mut().any(|c| {
        c.poll();
        !c.settled
    }) && t.elapsed() < PATIENCE
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled_used = status(&rt, &addr).used_blocks;
    // Finish: every client frees everything and releases its leases.
    std::fs::write(dir.path().join("finish"), "").unwrap();
    let mut client_errors = String::new();
    for c in &mut clients {
        let t = Instant::now();
        while c.proc.0.try_wait().unwrap().is_none() && t.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(50));
        }
        match c.proc.0.try_wait().unwrap() {
            Some(s) if s.success() => {}
            s => writeln!(client_errors, "{} ended {s:?}: {}", c.name, c.stderr_tail()).unwrap(),
        }
    }
    // Expired leases' space comes back after the margin; wait for the
    // device to be empty, or for long enough that it will not be.
    let t = Instant::now();
    let end_status = loop {
        let st = status(&rt, &addr);
        let s = (
            st.used_blocks,
            st.meta_blocks,
            st.leases,
            st.leased_unused_blocks,
        );
        if (s.0 == s.1 && s.2 == 0 && s.3 == 0)
            || t.elapsed() > ttl * 2 + margin * 2 + Duration::from_secs(10)
        {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    srv.signal("-TERM");
    let _ = srv.wait(PATIENCE);
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap()]);
    if code != 0 {
        writeln!(client_errors, "blockalloc check: {out}{err}").unwrap();
    }
    Run {
        dev,
        ttl,
        margin,
        injected,
        no_progress,
        settled_at,
        end_status,
        settled_used,
        meta,
        check_ok: code == 0,
        clients: clients
            .iter()
            .map(|c| (c.name.clone(), c.leasing, c.log.clone()))
            .collect(),
        client_errors,
        _dir: dir,
    }
}

/// Waits until every client has made progress after `after` (or
/// `PATIENCE` passed: a stall, reported).
fn wait_progress(
    clients: &mut [ClientProc],
    after: u64,
    what: &str,
    no_progress: &mut Vec<String>,
) {
    let t = Instant::now();
    loop {
        let behind: Vec<&str> = clients
            .iter_mut()
            .filter_map(|c| {
                c.poll();
                (c.progress <= after).then_some(c.name.as_str())
            })
            .collect();
        if behind.is_empty() {
            return;
        }
        if t.elapsed() > PATIENCE {
            no_progress.push(format!("after {what}: no progress from {behind:?}"));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// The checker.

/// One holding of an extent by a client, as the logs tell it.
#[derive(Clone, Debug)]
struct Holding {
    client: usize,
    start: u64,
    len: u64,
    from: u64,
    /// When the holder let go (asked to free it, or the deadline of a lost
    /// allocation); `u64::MAX` while held.
    until: u64,
    leased: bool,
    deadline: Option<u64>,
    committed: bool,
    /// A free of it was sent, failed without a verdict, and was sent again.
    free_unsure: bool,
    /// A free of it was acknowledged (per call) or a commit after its free
    /// was (leased).
    freed: bool,
    lost: bool,
}

#[derive(Default)]
struct Verdict {
    operations: u64,
    lost: u64,
    unresolved: u64,
    /// Violations of each invariant, with the first few described.
    violations: [u64; 4],
    examples: [Vec<String>; 4],
    kills_within_ttl: u64,
    kills_checked: u64,
    max_downtime: Duration,
}

impl Verdict {
    fn violate(&mut self, inv: usize, msg: String) {
        self.violations[inv - 1] += 1;
        if self.examples[inv - 1].len() < 5 {
            self.examples[inv - 1].push(msg);
        }
    }
}

/// The newest holding of client `ci` of `e` that it let go of (asked to
/// free) and that was neither freed for sure nor lost.
fn let_go(all: &[Holding], ci: usize, e: (u64, u64)) -> Option<usize> {
    all.iter().rposition(|h| {
        h.client == ci && (h.start, h.len) == e && !h.freed && !h.lost && h.until != u64::MAX
    })
}

fn check(run: &Run) -> Verdict {
    let mut v = Verdict::default();
    let mut all: Vec<Holding> = Vec::new();
    // Losses of leasing clients: (time, client).
    let mut losses: Vec<(u64, usize)> = Vec::new();
    for (ci, (name, leasing, log)) in run.clients.iter().enumerate() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Held extents, as indices into `all`.
        let mut held: BTreeMap<(u64, u64), usize> = BTreeMap::new();
        // Leased frees waiting for a commit: (time, holding).
        let mut unacked_frees: Vec<(u64, usize)> = Vec::new();
        let mut settled = false;
        for l in text.lines() {
            let (line, _) = l.split_once(" # ").unwrap_or((l, ""));
            let f: Vec<&str> = line.split(' ').collect();
            let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
            let at = |i: usize| n(i).unwrap_or(0);
            match f[0] {
                "A" => {
                    v.operations += 1;
                    let e = (at(2), at(3));
                    let leased = f.get(4) == Some(&"lease");
                    if let Some(&old) = held.get(&e) {
                        v.violate(
                            1,
                            format!(
                                "{name}: {}+{} allocated again while it held it since {}",
                                e.0, e.1, all[old].from
                            ),
                        );
                    }
                    if let Some(d) = n(5).filter(|&d| d <= at(1)) {
                        // The writer's rule: nothing more from a lease past
                        // its deadline (the space may be someone else's).
                        v.violate(
                            1,
                            format!(
                                "{name}: {}+{} allocated from a lease at {}, past its deadline {d}",
                                e.0,
                                e.1,
                                at(1)
                            ),
                        );
                    }
                    held.insert(e, all.len());
                    all.push(Holding {
                        client: ci,
                        start: e.0,
                        len: e.1,
                        from: at(1),
                        until: u64::MAX,
                        leased,
                        deadline: n(5),
                        // No deadline: allocated per call, durable.
                        committed: n(5).is_none(),
                        free_unsure: false,
                        freed: false,
                        lost: false,
                    });
                }
                "D" => {
                    if let Some(&h) = held.get(&(at(2), at(3))) {
                        match n(4) {
                            Some(d) => {
                                all[h].deadline = Some(all[h].deadline.map_or(d, |o| o.max(d)))
                            }
                            // Committed by a background round.
                            None => all[h].committed = true,
                        }
                    }
                }
                "C" => {
                    v.operations += 1;
                    let t0 = at(1);
                    for &h in held.values() {
                        if all[h].from < t0 {
                            all[h].committed = true;
                        }
                    }
                    unacked_frees.retain(|&(t, h)| {
                        if t < t0 {
                            all[h].freed = true;
                        }
                        t >= t0
                    });
                }
                "F" | "f" => {
                    v.operations += 1;
                    let per_call = f[0] == "F";
                    let t = at(1);
                    let e = if per_call {
                        (at(3), at(4))
                    } else {
                        (at(2), at(3))
                    };
                    let Some(h) = held.remove(&e).or_else(|| let_go(&all, ci, e)) else {
                        v.violate(
                            2,
                            format!("{name}: freed {}+{}, which it never held", e.0, e.1),
                        );
                        continue;
                    };
                    all[h].until = all[h].until.min(t);
                    if per_call {
                        all[h].freed = true;
                    } else {
                        unacked_frees.push((t, h));
                    }
                }
                "L" => {
                    let (t, e) = (at(1), (at(2), at(3)));
                    v.lost += 1;
                    losses.push((t, ci));
                    if let Some(h) = held.remove(&e) {
                        let h = &mut all[h];
                        h.lost = true;
                        // It wrote until its deadline, at most.
                        h.until = h.deadline.unwrap_or(t);
                        if h.committed {
                            v.violate(
                                2,
                                format!(
                                    "{name}: {}+{} lost after a commit acknowledged it",
                                    e.0, e.1
                                ),
                            );
                        }
                    } else if let Some(h) = let_go(&all, ci, e) {
                        // Freed before the loss was reported: harmless unless
                        // it had been committed.
                        all[h].lost = true;
                        unacked_frees.retain(|&(_, u)| u != h);
                        if all[h].committed {
                            v.violate(
                                2,
                                format!(
                                    "{name}: {}+{} lost after a commit acknowledged it (and a free)",
                                    e.0, e.1
                                ),
                            );
                        }
                    } else {
                        v.violate(
                            2,
                            format!("{name}: lost {}+{}, which it never held", e.0, e.1),
                        );
                    }
                }
                "X" => {
                    let (t, op, class) = (at(1), f[2], f[3]);
                    // Per call only: a commit is resolved by resending its
                    // sequence number, a lease granted unknown expires.
                    if class == "unknown" && !leasing && (op == "alloc" || op == "free") {
                        v.unresolved += 1;
                    }
                    if op == "free" {
                        let e = (at(4), at(5));
                        let Some(h) = held.remove(&e).or_else(|| let_go(&all, ci, e)) else {
                            continue;
                        };
                        all[h].until = all[h].until.min(t);
                        if class == "refused" {
                            if all[h].free_unsure {
                                // Freed by the call whose outcome was unknown;
                                // only a resend of its request id could tell.
                                all[h].freed = true;
                            } else {
                                v.violate(
                                    2,
                                    format!("{name}: free of held {}+{} refused: {l}", e.0, e.1),
                                );
                                all[h].freed = true;
                            }
                        } else if class == "unknown" {
                            all[h].free_unsure = true;
                        }
                    } else if (op == "commit" || op == "close") && class == "refused" {
                        // A batch is all or nothing, and the client drops a
                        // refused batch's frees: some free it sent for an
                        // allocation it acknowledged failed, and the others
                        // with it (what they leave allocated, invariant 3
                        // counts). Which frees the batch held, the log
                        // cannot tell: a background round may have sent it.
                        v.violate(2, format!("{name}: a batch of frees refused: {l}"));
                    }
                }
                "S" => settled = true,
                _ => {}
            }
        }
        if !settled {
            v.violate(2, format!("{name}: never settled"));
        }
        // Everything it held was freed in the end, or lost uncommitted.
        for h in all.iter().filter(|h| h.client == ci) {
            if !h.lost && !h.freed && h.committed {
                v.violate(
                    2,
                    format!("{name}: {}+{} never acknowledged freed", h.start, h.len),
                );
            }
        }
    }
    // Invariant 1: no two holdings of one block at one time.
    all.sort_by_key(|h| h.start);
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if b.start >= a.start + a.len {
                break;
            }
            if b.from < a.until && a.from < b.until {
                let who = |h: &Holding| {
                    format!(
                        "{} {}+{} from {} until {} ({})",
                        run.clients[h.client].0,
                        h.start,
                        h.len,
                        h.from,
                        if h.until == u64::MAX {
                            "end".to_string()
                        } else {
                            h.until.to_string()
                        },
                        if h.lost {
                            "lost"
                        } else if h.leased {
                            "leased"
                        } else {
                            "per call"
                        }
                    )
                };
                v.violate(1, format!("{} overlaps {}", who(a), who(b)));
            }
        }
    }
    // Invariant 2 at the settle point: the device holds at least what the
    // clients hold (every client committed before it settled).
    let kept: u64 = run
        .clients
        .iter()
        .flat_map(|(_, _, log)| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.strip_prefix("V "))
                .map(|l| {
                    l.split(' ')
                        .nth(2)
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0)
                })
                .collect::<Vec<_>>()
        })
        .sum();
    if run.settled_used < run.meta + kept {
        v.violate(
            2,
            format!(
                "at the end the clients hold {kept} blocks, the device has {} allocated",
                run.settled_used - run.meta
            ),
        );
    }
    // Invariant 3: nothing left allocated.
    match run.end_status {
        (used, meta, leases, unused) if used != meta || leases != 0 || unused != 0 => {
            v.violations[2] += used - meta;
            v.examples[2].push(format!(
                "{} blocks still used after every client freed everything \
                 ({leases} leases, {unused} leased unused blocks)",
                used - meta
            ));
        }
        _ => {}
    }
    // Invariant 4: a restart within what a lease outlives loses nothing.
    let limit = (run.ttl * 2 / 3).saturating_sub(run.margin);
    for (i, f) in run.injected.iter().enumerate() {
        if f.kind != Fault::Kill {
            continue;
        }
        let down = Duration::from_nanos(f.t1 - f.t0);
        v.max_downtime = v.max_downtime.max(down);
        if down < run.ttl {
            v.kills_within_ttl += 1;
        }
        if down >= limit {
            continue;
        }
        v.kills_checked += 1;
        let end = run.injected.get(i + 1).map_or(run.settled_at, |n| n.t0);
        for &(t, c) in &losses {
            if (f.t0..end).contains(&t) {
                v.violate(
                    4,
                    format!(
                        "{} lost leased space after a restart with {down:?} downtime",
                        run.clients[c].0
                    ),
                );
            }
        }
    }
    v
}

fn summary(run: &Run, v: &Verdict) -> String {
    let count = |k: Fault| run.injected.iter().filter(|f| f.kind == k).count();
    format!(
        "faults (ttl {:?}, margin {:?}): kills={} (downtime < ttl: {}, checked for losses: {}, longest {:?}) pauses={} \
         cuts={} (short {}, long {}) stalls={} operations={} lost={} unresolved={} no_progress={} \
         violations: overlap={} lost_acknowledged={} leaked_blocks={} lease_lost_on_restart={}",
        run.ttl,
        run.margin,
        count(Fault::Kill),
        v.kills_within_ttl,
        v.kills_checked,
        v.max_downtime,
        count(Fault::Pause),
        count(Fault::CutShort) + count(Fault::CutLong),
        count(Fault::CutShort),
        count(Fault::CutLong),
        count(Fault::Stall),
        v.operations,
        v.lost,
        v.unresolved,
        run.no_progress.len(),
        v.violations[0],
        v.violations[1],
        v.violations[2],
        v.violations[3],
    )
}

#[test]
fn faults_keep_every_allocation_safe() {
    let faults = match std::env::var("BLOCKALLOC_FAULTS") {
        Ok(n) => n.parse().expect("BLOCKALLOC_FAULTS: a number of faults"),
        Err(_) => FAULTS.len(),
    };
    let seed = std::env::var("BLOCKALLOC_FAULTS_SEED")
        .ok()
        .map_or(1, |s| s.parse().expect("BLOCKALLOC_FAULTS_SEED: a number"));
    let run = run(faults, seed);
    let v = check(&run);
    let line = summary(&run, &v);
    println!("{line}");
    let mut details = String::new();
    for (i, ex) in v.examples.iter().enumerate() {
        for e in ex {
            writeln!(details, "invariant {}: {e}", i + 1).unwrap();
        }
    }
    for s in &run.no_progress {
        writeln!(details, "no progress: {s}").unwrap();
    }
    assert!(
        v.violations == [0; 4]
            && run.no_progress.is_empty()
            && run.check_ok
            && run.client_errors.is_empty(),
        "{line}\n{details}{}(device {}; BLOCKALLOC_FAULTS_KEEP=1 keeps it)",
        run.client_errors,
        run.dev.display()
    );
    assert_eq!(
        v.unresolved, 0,
        "{line}: calls left with an unknown outcome"
    );
    assert!(v.operations > 0, "{line}");
}

/// A run made of `logs` (one per client: leasing?, lines) and `kills`
/// (start, end), for the checker alone.
fn scripted_run(logs: &[(bool, &str)], kills: &[(u64, u64)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let clients = logs
        .iter()
        .enumerate()
        .map(|(i, (leasing, text))| {
            let log = dir.path().join(format!("c{i}.log"));
            std::fs::write(&log, text).unwrap();
            (format!("c{i}"), *leasing, log)
        })
        .collect();
    Run {
        dev: dir.path().join("d0"),
        ttl: Duration::from_secs(3),
        margin: Duration::from_millis(150),
        injected: kills
            .iter()
            .map(|&(t0, t1)| Injected {
                kind: Fault::Kill,
                t0,
                t1,
            })
            .collect(),
        no_progress: Vec::new(),
        settled_at: 1_000_000,
        end_status: (10, 10, 0, 0),
        settled_used: 10,
        meta: 10,
        check_ok: true,
        clients,
        client_errors: String::new(),
        _dir: dir,
    }
}

#[test]
fn the_checker_finds_each_kind_of_violation_in_logs() {
    // Clean: a per-call free before the other's allocation; a lost leased
    // allocation given up at its deadline before anyone else got it.
    let clean = scripted_run(
        &[
            (false, "A 100 10 5 call -\nF 200 210 10 5\nS 900\n"),
            (
                false,
                "A 220 10 5 call -\nA 460 50 4 call -\nS 900\nF 910 920 10 5\nF 930 940 50 4\n",
            ),
            (
                true,
                "A 300 50 4 lease 400\nD 350 50 4 450\nL 500 50 4\nS 900\n",
            ),
        ],
        &[],
    );
    let v = check(&clean);
    assert_eq!(v.violations, [0; 4], "{:?}", v.examples);
    assert_eq!((v.lost, v.operations), (1, 7));

    // 1: the other client allocated the space before the leased one's
    // (refreshed) deadline; and an allocation past its deadline.
    let overlap = scripted_run(
        &[
            (true, "A 300 50 4 lease 400\nD 350 50 4 450\nL 500 50 4\nA 600 70 1 lease 590\nL 700 70 1\nS 900\n"),
            (false, "A 420 50 4 call -\nS 900\nF 910 920 50 4\n"),
        ],
        &[],
    );
    let v = check(&overlap);
    assert_eq!(v.violations, [2, 0, 0, 0], "{:?}", v.examples);

    // 2: a refused free of a held allocation, a committed leased allocation
    // reported lost, a committed one never freed, a refused batch of frees.
    let lost = scripted_run(
        &[
            (false, "A 100 10 5 call -\nX 200 free refused 10 5 # refused\nS 900\n"),
            (true, "A 100 50 4 lease 400\nC 150 160\nL 300 50 4\nA 310 60 2 lease 900\nC 320 330\nX 340 commit refused # refused\nS 900\n"),
        ],
        &[],
    );
    let v = check(&lost);
    assert_eq!(v.violations, [0, 4, 0, 0], "{:?}", v.examples);

    // 3: blocks left allocated.
    let mut leaked = scripted_run(&[(false, "S 900\n")], &[]);
    leaked.end_status = (17, 10, 0, 0);
    assert_eq!(check(&leaked).violations, [0, 0, 7, 0]);

    // 4: a loss after a short restart; none after a long one.
    let restart = |down: u64| {
        scripted_run(
            &[(true, "A 100 50 4 lease 400\nL 300 50 4\nS 900\n")],
            &[(200, 200 + down)],
        )
    };
    assert_eq!(check(&restart(100_000_000)).violations, [0, 0, 0, 1]);
    assert_eq!(check(&restart(2_900_000_000)).violations, [0; 4]);
}
