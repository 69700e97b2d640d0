//! Load on the real server (`blockalloc serve` on loopback): many clients
//! with mixed per-call and leased allocation, and a flood beside a quiet
//! client or a quiet tenant. Latencies are printed (run with `--nocapture`), never asserted.
//!
//! * `BLOCKALLOC_LOAD_SECS` (60 by default) and `BLOCKALLOC_LOAD_CLIENTS`
//!   (64) size the load test; a longer run:
//!   `BLOCKALLOC_LOAD_SECS=1800 cargo test --release -p blockalloc-cli
//!   --test load -- --nocapture`.
//! * `BLOCKALLOC_FAIRNESS_CALLS` (200) is how many calls the quiet client
//!   makes per phase; `BLOCKALLOC_FAIRNESS_UNLIMITED=1` adds a run with the
//!   per-client limits lifted, for comparison.
//! * The fairness tests run twice over: two clients of an open server
//!   (lines by client name), and two tenants of a server with tokens, one
//!   flooding under any client names (lines by tenant).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_client::{Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::{pb, CLIENT_HEADER};
use hdrhistogram::Histogram;
use tonic::{Code, Request};

mod common;
use common::{blockalloc, new_tenant, rt, serve_args, serve_with};

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A histogram of microseconds, up to a minute.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

/// Latencies per operation, in microseconds.
#[derive(Default)]
struct Latencies(BTreeMap<&'static str, Histogram<u64>>);

impl Latencies {
    fn record(&mut self, op: &'static str, since: Instant) {
        let us = since.elapsed().as_micros().max(1) as u64;
        self.0
            .entry(op)
            .or_insert_with(histogram)
            .saturating_record(us);
    }

    fn merge(&mut self, other: &Latencies) {
        for (op, h) in &other.0 {
            self.0.entry(op).or_insert_with(histogram).add(h).unwrap();
        }
    }

    /// A markdown table: op, calls, p50, p99, max (µs).
    fn table(&self, title: &str) -> String {
        let mut s = format!(
            "{title}\n| operation | calls | p50 µs | p99 µs | max µs |\n|---|---:|---:|---:|---:|\n"
        );
        for (op, h) in &self.0 {
            s += &format!(
                "| {op} | {} | {} | {} | {} |\n",
                h.len(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max()
            );
        }
        s
    }
}

/// A small pseudo-random generator, one per client.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A client that allocates and frees per call until `until`; returns its
/// latencies. Every error is unexpected.
async fn per_call_client(
    addr: String,
    seed: u64,
    until: Instant,
) -> Result<Latencies, ClientError> {
    let c = Client::connect(&addr).await?;
    let d = DeviceId::Index(0);
    let mut rng = Rng(seed);
    let mut lat = Latencies::default();
    let mut held: Vec<Extent> = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        let got = c
            .allocate(&d, 1 + rng.below(4) as u32, 1 + rng.below(64), None)
            .await?;
        lat.record("allocate (per call)", t);
        held.extend(got);
        if held.len() > 24 {
            let keep = held.split_off(12);
            let t = Instant::now();
            c.free(&d, &held).await?;
            lat.record("free (per call)", t);
            held = keep;
        }
        if rng.below(50) == 0 {
            let t = Instant::now();
            c.status().await?;
            lat.record("status", t);
        }
    }
    if !held.is_empty() {
        c.free(&d, &held).await?;
    }
    Ok(lat)
}

/// A client that allocates inside leases, frees and commits until `until`.
async fn leasing_client(addr: String, seed: u64, until: Instant) -> Result<Latencies, ClientError> {
    let c = Client::connect(&addr).await?;
    let a = LeasingAllocator::new(
        c,
        LeaseOptions {
            min_blocks: 64,
            client_id: format!("load-{seed}"),
            ..LeaseOptions::default()
        },
    );
    let mut rng = Rng(seed);
    let mut lat = Latencies::default();
    let mut held: Vec<Extent> = Vec::new();
    let mut n = 0u64;
    while Instant::now() < until {
        let t = Instant::now();
        held.push(a.allocate(1 + rng.below(64)).await?);
        lat.record("allocate (leased)", t);
        if held.len() > 64 {
            for e in held.drain(..32) {
                a.free(e).await?;
            }
        }
        n += 1;
        if n.is_multiple_of(32) {
            let t = Instant::now();
            a.commit().await?;
            lat.record("commit", t);
        }
        // A leased allocation takes well under a microsecond; pause now
        // and then so that 64 clients share two cores.
        if n.is_multiple_of(8) {
            tokio::task::yield_now().await;
        }
    }
    for e in held {
        a.free(e).await?;
    }
    a.commit().await?;
    a.close().await?;
    Ok(lat)
}

#[test]
fn many_clients_mixing_calls_and_leases_meet_no_unexpected_error() {
    let secs: f64 = env_or("BLOCKALLOC_LOAD_SECS", 60.0);
    let clients: u64 = env_or("BLOCKALLOC_LOAD_CLIENTS", 64);
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("load");
    let (mut srv, addr) = serve_with(
        &dev,
        &[
            "--format",
            "1GiB",
            "--listen",
            "127.0.0.1:0",
            "--lease-ttl",
            "5",
        ],
    );
    let lat = rt().block_on(async {
        let until = Instant::now() + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let addr = addr.clone();
                if i % 2 == 0 {
                    tokio::spawn(per_call_client(addr, i + 1, until))
                } else {
                    tokio::spawn(leasing_client(addr, i + 1, until))
                }
            })
            .collect();
        let mut all = Latencies::default();
        let mut errors = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(l) => all.merge(&l),
                Err(e) => errors.push(e.to_string()),
            }
        }
        assert!(errors.is_empty(), "unexpected errors: {errors:#?}");
        let c = Client::connect(&addr).await.unwrap();
        let st = &c.status().await.unwrap()[0];
        assert_eq!(st.used_blocks, st.meta_blocks, "everything was freed");
        assert_eq!(st.leases, 0, "every lease was released");
        all
    });
    println!(
        "{}",
        lat.table(&format!(
            "load: {clients} clients ({} per call, {} leasing), {secs} s",
            clients.div_ceil(2),
            clients / 2
        ))
    );
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(30)), Some(0));
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
}

/// A request that names its client.
fn named<T>(who: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(CLIENT_HEADER, who.parse().unwrap());
    r
}

fn tiny(count: u32) -> pb::AllocateRequest {
    pb::AllocateRequest {
        count,
        size: Some(pb::allocate_request::Size::Blocks(1)),
        ..Default::default()
    }
}

/// The quiet client: `calls` allocations of one object, each freed again;
/// returns the allocations' latencies.
async fn quiet(c: &Client, calls: usize) -> Histogram<u64> {
    let mut h = histogram();
    for _ in 0..calls {
        let t = Instant::now();
        let r = c.rpc().allocate(named("quiet", tiny(1))).await;
        h.saturating_record(t.elapsed().as_micros().max(1) as u64);
        let e = r.expect("the quiet client is served").into_inner().objects[0].extents[0];
        c.rpc()
            .free(named(
                "quiet",
                pb::FreeRequest {
                    device: None,
                    extents: vec![e],
                    ..Default::default()
                },
            ))
            .await
            .expect("the quiet client is served");
    }
    h
}

/// Floods the server from every client of `conns` with `streams` calls in
/// flight on each, call `i` naming itself `name(i)`, until `stop`; returns
/// (calls served, calls refused as busy). Busy (UNAVAILABLE) is the only
/// refusal expected.
async fn flood(
    conns: Vec<Client>,
    streams: usize,
    name: fn(u64) -> String,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    let served = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in conns {
        for _ in 0..streams {
            let (c, stop, served, busy) = (c.clone(), stop.clone(), served.clone(), busy.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Relaxed) {
                    let who = name(i);
                    i += 1;
                    match c.rpc().allocate(named(&who, tiny(1))).await {
                        Ok(r) => {
                            served.fetch_add(1, Relaxed);
                            let e = r.into_inner().objects[0].extents[0];
                            c.rpc()
                                .free(named(
                                    &who,
                                    pb::FreeRequest {
                                        device: None,
                                        extents: vec![e],
                                        ..Default::default()
                                    },
                                ))
                                .await
                                .unwrap();
                        }
                        Err(s) if s.code() == Code::Unavailable => {
                            busy.fetch_add(1, Relaxed);
                        }
                        Err(s) => panic!("flood: unexpected {s:?}"),
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (served.load(Relaxed), busy.load(Relaxed))
}

/// The header of the rows [`fairness_run`] returns.
const FAIRNESS_HEADER: &str = "| server | phase | quiet calls | quiet p50 µs | quiet p99 µs | quiet max µs | flood allocations/s | flood calls refused (busy) |\n|---|---|---:|---:|---:|---:|---:|---:|\n";

/// The quiet caller `quiet` alone, then while `conns` flood the server
/// (64 calls in flight on each, named by `name`); returns the report rows
/// for `setup`. Every quiet call must be served.
async fn fairness_run(
    setup: &str,
    quiet_client: &Client,
    conns: Vec<Client>,
    name: fn(u64) -> String,
    calls: usize,
) -> String {
    quiet(quiet_client, 20).await;
    let alone = quiet(quiet_client, calls).await;
    let stop = Arc::new(AtomicBool::new(false));
    let flood_start = Instant::now();
    let flooding = tokio::spawn(flood(conns, 64, name, stop.clone()));
    // Let the flood build up before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flooded = quiet(quiet_client, calls).await;
    stop.store(true, Relaxed);
    let (served, busy) = flooding.await.unwrap();
    let rate = served as f64 / flood_start.elapsed().as_secs_f64();
    assert_eq!(flooded.len(), calls as u64);
    let mut rows = String::new();
    for (phase, h, s, b) in [
        ("alone", &alone, 0.0, 0),
        ("during the flood", &flooded, rate, busy),
    ] {
        rows += &format!(
            "| {setup} | {phase} | {} | {} | {} | {} | {s:.0} | {b} |\n",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        );
    }
    rows
}

/// The per-client limits lifted (`BLOCKALLOC_FAIRNESS_UNLIMITED=1`): one
/// line for everyone, for comparison.
const LIFTED: [&str; 4] = [
    "--max-in-flight-per-client",
    "1000000",
    "--max-queued-per-client",
    "1000000",
];

/// The server setups of a fairness test: the defaults, and with
/// `BLOCKALLOC_FAIRNESS_UNLIMITED=1` the limits lifted.
fn fairness_setups(lines: &'static str) -> Vec<(String, Vec<&'static str>)> {
    let mut setups = vec![(format!("{lines} (defaults)"), vec![])];
    if env_or("BLOCKALLOC_FAIRNESS_UNLIMITED", 0) == 1 {
        setups.push((format!("{lines} lifted"), LIFTED.to_vec()));
    }
    setups
}

/// `n` connections to `addr`, with `token` when given.
async fn connections(addr: &str, n: usize, token: Option<&str>) -> Vec<Client> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = Client::connect(addr).await.unwrap();
        out.push(c.with_token(token).unwrap());
    }
    out
}

#[test]
fn a_quiet_client_is_served_while_another_floods_the_server() {
    let calls: usize = env_or("BLOCKALLOC_FAIRNESS_CALLS", 200);
    let mut report = String::from(FAIRNESS_HEADER);
    for (name, extra) in fairness_setups("per-client limits") {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("fair");
        let mut args = vec!["--format", "256MiB", "--listen", "127.0.0.1:0"];
        args.extend(extra);
        let (_srv, addr) = serve_with(&dev, &args);
        rt().block_on(async {
            let c = Client::connect(&addr).await.unwrap();
            let conns = connections(&addr, 16, None).await;
            report += &fairness_run(&name, &c, conns, |_| "flood".into(), calls).await;
            let st = &c.status().await.unwrap()[0];
            assert_eq!(st.used_blocks, st.meta_blocks, "everything was freed");
        });
    }
    println!("{report}");
}

#[test]
fn a_quiet_tenant_is_served_while_another_tenant_floods_the_server() {
    let calls: usize = env_or("BLOCKALLOC_FAIRNESS_CALLS", 200);
    let mut report = String::from(FAIRNESS_HEADER);
    let (flooder, flooder_entry) = new_tenant("flooder");
    let (quiet_token, quiet_entry) = new_tenant("quiet");
    for (name, extra) in fairness_setups("per-tenant limits") {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n{flooder_entry}\n\n{quiet_entry}\n",
                dir.path().join("fair").to_str().unwrap()
            ),
        )
        .unwrap();
        let mut args = vec!["--config", config.to_str().unwrap(), "--format", "256MiB"];
        args.extend(extra);
        let (_srv, addr) = serve_args(&args);
        rt().block_on(async {
            let c = Client::connect_with_token(&addr, &quiet_token)
                .await
                .unwrap();
            // The flood sends any client name, the quiet tenant's included:
            // its line is its tenant's whatever it says.
            let conns = connections(&addr, 16, Some(&flooder)).await;
            let names = |i: u64| match i % 3 {
                0 => "quiet".to_string(),
                1 => "flood".to_string(),
                _ => format!("flood-{i}"),
            };
            report += &fairness_run(&name, &c, conns, names, calls).await;
            let mine = &c.status().await.unwrap()[0].tenants[0];
            assert_eq!((mine.name.as_str(), mine.used_blocks), ("quiet", 0));
            let f = Client::connect_with_token(&addr, &flooder).await.unwrap();
            let theirs = &f.status().await.unwrap()[0].tenants[0];
            assert_eq!(theirs.used_blocks, 0, "the flood freed what it took");
        });
    }
    println!("{report}");
}
