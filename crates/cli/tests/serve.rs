//! `blockalloc serve` end to end: the real binary on loopback, ephemeral
//! ports, killed with SIGKILL or stopped with SIGTERM. Every server and
//! helper process is killed when its handle drops.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_client::{Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};

mod common;
use common::{
    blockalloc, new_tenant, open_store, rt, serve, serve_args, serve_args_logged,
    serve_args_metrics, serve_logged, serve_with, Proc, Tmpfs,
};

#[test]
fn serve_prints_its_port_and_checkpoints_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let log = dir.path().join("serve.log");
    let (mut srv, addr, _) = serve_logged(&dev, "127.0.0.1:0", "10", &[], Some(&log));
    assert!(!addr.ends_with(":0"), "the real port is printed: {addr}");
    let (kept, leased, _alloc) = rt().block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let st = c.status().await.unwrap();
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].name, "d0");
        assert_eq!(st[0].block_size, 4096);
        let kept = c
            .allocate(&DeviceId::Name("d0".into()), 3, 16, None)
            .await
            .unwrap();
        // A lease still held at the signal, with a committed part.
        let alloc = LeasingAllocator::new(
            c.clone(),
            LeaseOptions {
                min_blocks: 256,
                commit_interval: Duration::from_secs(3600),
                ..LeaseOptions::default()
            },
        );
        let leased = alloc.allocate(8).await.unwrap();
        alloc.commit().await.unwrap();
        alloc.allocate(8).await.unwrap();
        assert_eq!(c.status().await.unwrap()[0].leases, 1);
        (kept, leased, alloc)
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("shutdown: leases released leases=1"),
        "the held lease ends at shutdown: {logged}"
    );
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("0 journal entries replayed"),
        "a clean stop checkpoints: {out}"
    );
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        report["closed_cleanly"],
        serde_json::Value::Bool(true),
        "a graceful stop closes the store: {out}"
    );
    let store = open_store(&dev);
    for &e in kept.iter().chain([&leased]) {
        store.check_allocated(e).unwrap();
    }
    // The lease's uncommitted rest went back to free space.
    let st = store.status();
    assert_eq!(
        st.space.used_blocks,
        st.meta_blocks + 3 * 16 + 8,
        "only committed allocations stay"
    );
    // A missing device without --format is a usage error.
    let (code, _, err) = blockalloc(&[
        "serve",
        "--device",
        dir.path().join("missing").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--format"), "{err}");
}

/// Run as a separate process by `a_killed_clients_leases_expire`: leases
/// space, commits part of it, prints `ready`, then waits to be killed.
/// Does nothing when run as an ordinary test.
#[test]
fn helper_lease_holder_process() {
    let Ok(addr) = std::env::var("BLOCKALLOC_TEST_LEASE_HOLDER") else {
        return;
    };
    rt().block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let a = LeasingAllocator::new(
            c,
            LeaseOptions {
                min_blocks: 512,
                want_blocks: 1024,
                ..LeaseOptions::default()
            },
        );
        let e = a.allocate(100).await.unwrap();
        a.commit().await.unwrap();
        println!("ready {} {}", e.start(), e.len());
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[test]
fn a_killed_clients_leases_expire_and_the_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "1");
    let rt = rt();
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    // The holder renews every third of the TTL; a renewal that a loaded
    // machine delays by more than two thirds lets the lease expire before
    // the kill, as the server is free to do: then a new holder takes over.
    let mut tries = 0;
    let (holder, committed, meta) = loop {
        tries += 1;
        let mut holder = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "helper_lease_holder_process", "--nocapture"])
            .env("BLOCKALLOC_TEST_LEASE_HOLDER", &addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(holder.stdout.take().unwrap());
        let holder = Proc(holder);
        let mut line = String::new();
        while !line.starts_with("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the helper exited");
        }
        let nums: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect();
        let committed = Extent::new(nums[0], nums[1]).unwrap();
        let st = rt.block_on(c.status()).unwrap()[0].clone();
        if st.leases == 1 || tries == 10 {
            assert_eq!(st.leases, 1);
            assert_eq!(st.leased_unused_blocks, 1024 - 100);
            break (holder, committed, st.meta_blocks);
        }
        drop(holder);
        rt.block_on(c.free(&DeviceId::Index(0), &[committed]))
            .unwrap();
    };
    rt.block_on(async {
        drop(holder); // SIGKILL: no release, no more renewals
                      // It expires a TTL after the last renewal; the wait is only a
                      // "never".
        let killed = Instant::now();
        loop {
            let st = &c.status().await.unwrap()[0];
            if st.leases == 0 {
                assert_eq!(st.leased_unused_blocks, 0);
                assert_eq!(st.used_blocks, meta + 100, "the committed part stays");
                assert_eq!(st.free_blocks + st.used_blocks, st.capacity_blocks);
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "the lease outlived its holder"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Still the holder's committed object: freeing it works once.
        c.free(&DeviceId::Index(0), &[committed]).await.unwrap();
        let e = c.free(&DeviceId::Index(0), &[committed]).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(blockalloc_client::Code::FailedPrecondition),
            "{e}"
        );
    });
}

#[test]
fn server_killed_under_load_keeps_every_acknowledged_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    // Large enough that the load cannot bring the device near full before
    // the kill: near full the server recalls the lease, and its holder
    // commits what it holds.
    let args = |listen| ["--format", "4GiB", "--listen", listen, "--lease-ttl", "10"];
    let (mut srv, addr) = serve_with(&dev, &args("127.0.0.1:0"));
    let rt = rt();
    // Load: per-call allocators record what was acknowledged and what was
    // in flight when the server died; a leasing allocator commits some
    // allocations and holds others it never sent.
    let (acked, ambiguous, leased_acked, unsent, alloc) = rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let mut load = Vec::new();
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for t in 0..3u64 {
            // Sent once: a call cut off by the kill ends the task (a
            // resend would wait for the restart, past the lease's TTL).
            let c = c.with_retry_for(Duration::ZERO);
            let answered = std::sync::Arc::clone(&answered);
            load.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0u64.. {
                    let blocks = 1 + (t * 7 + i) % 13;
                    match c.allocate(&DeviceId::Index(0), 1, blocks, None).await {
                        Ok(e) => {
                            acked.extend(e);
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        // Cut off by the kill (outcome unknown), or
                        // refused after it.
                        Err(ClientError::Unavailable(_) | ClientError::OutcomeUnknown(_)) => {
                            return (acked, blocks)
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                unreachable!()
            }));
        }
        let alloc = LeasingAllocator::new(
            c.clone(),
            LeaseOptions {
                min_blocks: 256,
                commit_interval: Duration::from_secs(3600),
                ..LeaseOptions::default()
            },
        );
        let mut leased_acked = Vec::new();
        for _ in 0..20 {
            leased_acked.push(alloc.allocate(4).await.unwrap());
        }
        alloc.commit().await.unwrap();
        let mut unsent = Vec::new();
        for _ in 0..10 {
            unsent.push(alloc.allocate(4).await.unwrap());
        }
        // The kill comes while the load runs.
        let t = Instant::now();
        while answered.load(std::sync::atomic::Ordering::Relaxed) < 30 {
            assert!(t.elapsed() < Duration::from_secs(60), "the load never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        srv.0.kill().unwrap(); // SIGKILL under load
        srv.0.wait().unwrap();
        let mut acked = Vec::new();
        let mut ambiguous = 0;
        for l in load {
            let (a, b) = l.await.unwrap();
            acked.extend(a);
            ambiguous += b;
        }
        (acked, ambiguous, leased_acked, unsent, alloc)
    });
    assert!(acked.len() > 3, "the load ran before the kill");
    // Restart on the same address: the client reconnects by itself.
    let (mut srv2, addr2) = serve_with(&dev, &args(&addr));
    assert_eq!(addr2, addr);
    let after_restart = rt.block_on(async {
        // The allocator commits only when asked (or after its hour-long
        // interval), so the ten were never sent; the lease was journaled,
        // the restarted server restored it, and they commit now: nothing
        // is lost.
        alloc.commit().await.unwrap();
        assert_eq!(alloc.stats().lost, 0);
        // It leases again and commits.
        let e = alloc.allocate(4).await.unwrap();
        alloc.commit().await.unwrap();
        alloc.close().await.unwrap();
        e
    });
    srv2.signal("-TERM");
    assert_eq!(srv2.wait(Duration::from_secs(10)), Some(0));
    drop(srv);
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let store = open_store(&dev);
    for e in acked
        .iter()
        .chain(&leased_acked)
        .chain(&unsent)
        .chain([&after_restart])
    {
        store.check_allocated(*e).unwrap();
    }
    let st = store.status();
    let known: u64 = acked
        .iter()
        .chain(&leased_acked)
        .chain(&unsent)
        .chain([&after_restart])
        .map(|e| e.len())
        .sum();
    let used = st.space.used_blocks - st.meta_blocks;
    // An allocation in flight at the kill may or may not have become
    // durable; nothing else may be allocated.
    assert!(
        used >= known && used <= known + ambiguous,
        "used {used}, acknowledged {known}, in flight {ambiguous}"
    );
    store.verify().unwrap();
}

#[test]
fn bench_remote_measures_per_call_and_leased_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let run = |lease: &str, clients: &str| {
        let (code, out, err) = blockalloc(&[
            "bench",
            "--remote",
            &addr,
            "--lease",
            lease,
            "--clients",
            clients,
            "--sizes",
            "fixed:64KiB",
            "--round-size",
            "100",
            "--max-rounds",
            "2",
            "--json",
            "-",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["kind"], "remote");
        assert_eq!(v["allocations"], 200);
        assert_eq!(v["stopped"], "limit");
        assert!(v["alloc_ns"]["p50"].as_u64().unwrap() > 0);
        assert!(v["alloc_ns"]["p99"].as_u64() >= v["alloc_ns"]["p50"].as_u64());
        // The timer's own cost is measured and taken off every sample.
        assert!(v["timer_overhead_ns"].as_u64().is_some(), "{v}");
        v
    };
    let per_call = run("off", "1");
    assert_eq!(per_call["lease"], "off");
    assert_eq!(per_call["leases"], 0);
    let leased = run("auto", "2");
    assert_eq!(leased["clients"], 2);
    assert!(leased["leases"].as_u64().unwrap() >= 2);
    assert!(leased["commit_calls"].as_u64().unwrap() >= 2);
    assert_eq!(leased["per_call_fallbacks"], 0);
    let (code, _, err) = blockalloc(&["bench", "--remote", &addr, "--lease", "lots"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--lease"), "{err}");
}

/// A server on `dev` (lease TTL 10 s) with its metrics on a loopback port:
/// the server, its address and its metrics address.
fn serve_with_metrics(dev: &Path) -> (Proc, String, std::net::SocketAddr) {
    let (srv, addr, metrics) = serve_logged(
        dev,
        "127.0.0.1:0",
        "10",
        &["--metrics", "127.0.0.1:0"],
        None,
    );
    (srv, addr, metrics_addr(metrics))
}

/// The metrics address of a server started with `--metrics`.
fn metrics_addr(url: Option<String>) -> std::net::SocketAddr {
    url.expect("started with --metrics")
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap()
}

/// Calls of `method` the server answered with OK.
fn calls_ok(metrics: std::net::SocketAddr, method: &str) -> f64 {
    let text = rt().block_on(scrape::scrape(metrics));
    let series = format!("blockalloc_requests_total{{method=\"{method}\",code=\"OK\"}}");
    scrape::value(&text, &series)
}

/// The used blocks of the server's first device.
fn used_blocks(addr: &str) -> u64 {
    rt().block_on(async {
        Client::connect(addr).await.unwrap().status().await.unwrap()[0].used_blocks
    })
}

/// `bench --remote ADDR ARGS... --json -`: its JSON line.
fn bench_remote(addr: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "bench",
        "--remote",
        addr,
        "--sizes",
        "fixed:64KiB",
        "--json",
        "-",
    ];
    all.extend_from_slice(args);
    let (code, out, err) = blockalloc(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn bench_remote_count_16_sends_one_allocate_call_per_16_objects() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (mut srv, addr, metrics) = serve_with_metrics(&dev);
    let empty = used_blocks(&addr);
    let mut calls = Vec::new();
    for count in ["1", "16"] {
        let before = (calls_ok(metrics, "Allocate"), calls_ok(metrics, "Free"));
        let v = bench_remote(
            &addr,
            &[
                "--lease",
                "off",
                "--count",
                count,
                "--round-size",
                "320",
                "--max-rounds",
                "2",
                "--free-prob",
                "1",
            ],
        );
        assert_eq!(v["count"], count.parse::<u32>().unwrap());
        assert_eq!(v["allocations"], 640);
        assert_eq!(v["frees"], 640);
        assert_eq!(v["stopped"], "limit");
        let sent = calls_ok(metrics, "Allocate") - before.0;
        assert_eq!(v["allocate_calls"].as_f64(), Some(sent));
        assert_eq!(v["rpcs_per_allocation"].as_f64(), Some(sent / 640.0));
        assert_eq!(
            calls_ok(metrics, "Free") - before.1,
            2.0,
            "one Free per round"
        );
        assert!(v["allocate_call_ns"]["p50"].as_u64().unwrap() > 0);
        assert!(v["ns_per_allocation"].as_f64().unwrap() > 0.0);
        // Every object was freed again.
        assert_eq!(used_blocks(&addr), empty);
        calls.push(sent);
    }
    assert_eq!(calls, [640.0, 40.0]);
    let v = stop_and_check(&mut srv, &dev);
    assert_eq!(v["used_blocks"], empty, "{v}");
    assert_usage_errors(
        &addr,
        &[
            (&["--count", "16"], "--lease off"),
            (&["--lease", "off", "--count", "0"], "--count"),
            (&["--lease", "off", "--count", "4097"], "--count"),
        ],
    );
}

/// Each `bench --remote ADDR ARGS` is a usage error (exit code 2) whose
/// message names `needle`.
fn assert_usage_errors(addr: &str, cases: &[(&[&str], &str)]) {
    for (args, needle) in cases {
        let mut all = vec!["bench", "--remote", addr];
        all.extend_from_slice(args);
        let (code, _, err) = blockalloc(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn bench_remote_commit_every_commits_that_often_and_times_each_commit() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr, metrics) = serve_with_metrics(&dev);
    let before = calls_ok(metrics, "Commit");
    let v = bench_remote(
        &addr,
        &[
            "--lease",
            "auto",
            "--clients",
            "2",
            "--round-size",
            "40",
            "--max-rounds",
            "2",
            "--free-prob",
            "0",
            "--commit-every",
            "5",
            "--keep",
        ],
    );
    assert_eq!(v["commit_every"], 5);
    assert_eq!(v["allocations"], 80);
    // 2 clients x 2 rounds x 20 allocations, a commit after every 5:
    // nothing is left for the rounds' ends, and nothing is freed.
    assert_eq!(v["commit_calls"], 16, "{v}");
    assert_eq!(calls_ok(metrics, "Commit") - before, 16.0);
    assert!(v["commit_ns"]["p50"].as_u64().unwrap() > 0, "{v}");
    assert!(v["commit_ns"]["max"].as_u64() >= v["commit_ns"]["p50"].as_u64());
    assert!(v["commit_calls_per_sec"].as_f64().unwrap() > 0.0);
    assert_usage_errors(
        &addr,
        &[
            (&["--commit-every", "0"], "--commit-every"),
            (&["--lease", "off", "--commit-every", "1"], "--lease off"),
        ],
    );
}

#[test]
fn bench_remote_max_ops_bounds_all_clients_together() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr, metrics) = serve_with_metrics(&dev);
    for lease in ["off", "auto"] {
        let used = used_blocks(&addr);
        let before = calls_ok(metrics, "Allocate");
        // 4 clients of 10 requests a round: 100 operations end mid-round.
        let v = bench_remote(
            &addr,
            &[
                "--lease",
                lease,
                "--clients",
                "4",
                "--round-size",
                "40",
                "--max-ops",
                "100",
                "--keep",
            ],
        );
        assert_eq!(v["max_ops"], 100);
        let (allocs, frees) = (
            v["allocations"].as_u64().unwrap(),
            v["frees"].as_u64().unwrap(),
        );
        assert_eq!(allocs + frees, 100, "{lease}: {v}");
        assert_eq!(v["stopped"], "limit");
        // The server saw exactly those: 16 blocks per object.
        assert_eq!(used_blocks(&addr), used + (allocs - frees) * 16, "{lease}");
        if lease == "off" {
            assert_eq!(calls_ok(metrics, "Allocate") - before, allocs as f64);
        }
    }
}

#[test]
fn bench_remote_reference_replays_the_clients_requests_in_the_order_made() {
    // A run that stops at a limit: the engine replays exactly its
    // operations and no more.
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let v = bench_remote(
        &addr,
        &[
            "--lease",
            "off",
            "--clients",
            "2",
            "--round-size",
            "40",
            "--max-rounds",
            "2",
            "--reference",
            "segfit",
        ],
    );
    assert_eq!(v["stopped"], "limit", "{v}");
    let r = &v["reference"];
    assert_eq!(r["engine"], "segfit", "{v}");
    assert_eq!(r["order"], "as_made");
    assert_eq!(r["failed_within_order"], false);
    assert!(r["utilization_at_first_failure"].is_null(), "{v}");
    let ops = v["allocations"].as_u64().unwrap() + v["frees"].as_u64().unwrap();
    assert_eq!(r["ops"].as_u64(), Some(ops), "{v}");
    // Leasing clients until the device is full: the engine goes on with
    // the clients' streams after their recorded requests until it fails
    // too, and with one object size both fill the device to its last
    // object.
    let dev = dir.path().join("d1");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let v = bench_remote(
        &addr,
        &[
            "--lease",
            "auto",
            "--clients",
            "4",
            "--round-size",
            "40",
            "--reference",
            "segfit",
        ],
    );
    assert_eq!(v["stopped"], "no_space", "{v}");
    let r = &v["reference"];
    let (served, reference) = (
        v["utilization_at_first_failure"].as_f64().unwrap(),
        r["utilization_at_first_failure"].as_f64().unwrap(),
    );
    let ops = v["allocations"].as_u64().unwrap() + v["frees"].as_u64().unwrap();
    if r["failed_within_order"] == false {
        assert!(r["ops"].as_u64().unwrap() > ops, "{v}");
    }
    let object = 16.0 / (64.0 * 256.0); // 16 blocks of a 64 MiB device
    assert!(reference > 1.0 - 2.0 * object, "{v}");
    assert!((served - reference).abs() < 2.0 * object + 0.02, "{v}");
    assert_eq!(
        r["ops"].as_u64().unwrap(),
        ops + r["ops_after_order"].as_u64().unwrap(),
        "{v}"
    );
    // One client per call: the order is exact, and the engine, with the
    // server's metadata area set aside, refuses the very request the
    // server refused, at the same utilisation.
    let dev = dir.path().join("d2");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let v = bench_remote(
        &addr,
        &[
            "--lease",
            "off",
            "--round-size",
            "40",
            "--reference",
            "segfit",
        ],
    );
    assert_eq!(v["stopped"], "no_space", "{v}");
    let r = &v["reference"];
    assert_eq!(r["refused_the_same_request"], true, "{v}");
    assert_eq!(r["ops_after_order"], 1, "{v}");
    assert_eq!(
        r["utilization_at_first_failure"], v["utilization_at_first_failure"],
        "{v}"
    );
}

#[test]
fn a_second_server_on_a_served_device_is_refused_as_busy() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, _) = serve(&dev, "127.0.0.1:0", "10");
    let (code, out, err) = blockalloc(&[
        "serve",
        "--device",
        dev.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(!out.contains("listening"), "{out}");
}

#[path = "../../service/tests/common/certs.rs"]
mod certs;
#[path = "../../service/tests/common/scrape.rs"]
mod scrape;

#[test]
fn serve_over_tls_answers_status_and_bench_that_trust_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let dev = dir.path().join("d0");
    let p = |p: &Path| p.to_str().unwrap().to_string();
    let (cert, key, ca) = (p(&pki.server_cert), p(&pki.server_key), p(&pki.ca));
    // Required and not configured: no server.
    let (code, out, err) = blockalloc(&[
        "serve",
        "--device",
        &p(&dev),
        "--format",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
        "--require-tls",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--tls-cert"), "{err}");
    assert!(!out.contains("listening"), "{out}");
    // A certificate file that is not one: named in the error.
    let (code, out, err) = blockalloc(&[
        "serve",
        "--device",
        &p(&dev),
        "--format",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &key,
        "--tls-key",
        &key,
    ]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("server.key") && err.contains("certificate"),
        "{err}"
    );

    let (mut srv, addr, _) = serve_logged(
        &dev,
        "127.0.0.1:0",
        "10",
        &["--tls-cert", &cert, "--tls-key", &key, "--require-tls"],
        None,
    );
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--tls-ca", &ca, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["devices"][0]["name"], "d0");
    // The client refuses plaintext when asked, before connecting.
    let (code, _, err) = blockalloc(&["status", "--remote", &addr, "--require-tls"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TLS is required"), "{err}");
    // A plaintext client of the TLS server is told to use TLS, and how.
    let (code, _, err) = blockalloc(&["status", "--remote", &addr]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("serves TLS") && err.contains(&format!("https://{addr}")),
        "{err}"
    );
    // Without the CA the handshake fails.
    let (code, _, err) = blockalloc(&["status", "--remote", &format!("https://{addr}")]);
    assert_ne!(code, 0, "{err}");
    let (code, out, err) = blockalloc(&[
        "bench",
        "--remote",
        &addr,
        "--tls-ca",
        &ca,
        "--tls-domain",
        "localhost",
        "--lease",
        "off",
        "--round-size",
        "20",
        "--max-rounds",
        "1",
        "--json",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["allocations"], 20);
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn status_shows_devices_and_leases_as_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "30");
    let rt = rt();
    let _alloc = rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let alloc = LeasingAllocator::new(
            c,
            LeaseOptions {
                min_blocks: 256,
                want_blocks: 256,
                client_id: "ingest-7".into(),
                commit_interval: Duration::from_secs(3600),
                ..LeaseOptions::default()
            },
        );
        alloc.allocate(16).await.unwrap();
        alloc.commit().await.unwrap();
        alloc
    });
    let (code, out, err) = blockalloc(&["status", "--remote", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 device(s), 1 lease(s)"), "{out}");
    let dev_line = out.lines().find(|l| l.starts_with("d0 ")).expect(&out);
    assert!(dev_line.contains("64 MiB"), "capacity: {dev_line}");
    let lease_line = out.lines().find(|l| l.contains("ingest-7")).expect(&out);
    assert!(
        lease_line.contains("1 MiB") && lease_line.contains("960 KiB"),
        "size 256 blocks, 240 unused: {lease_line}"
    );
    // Age and time left as durations with their unit (30 s TTL).
    assert!(
        lease_line.ends_with(" s") || lease_line.ends_with(" ms"),
        "{lease_line}"
    );
    assert_units_read_alike(&out);
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let d = &v["devices"][0];
    assert_eq!(d["name"], "d0");
    assert_eq!(d["capacity_blocks"], 16384);
    assert_eq!(d["leased_blocks"], 240);
    assert_eq!(d["leases"], 1);
    assert!(d["largest_free_extent_blocks"].as_u64().unwrap() > 0);
    assert!(d["fragmentation"].as_f64().is_some());
    let l = &v["leases"][0];
    assert_eq!(l["client"], "ingest-7");
    assert_eq!(l["device"], "d0");
    assert_eq!(l["granted_blocks"], 256);
    assert_eq!(l["unused_blocks"], 240);
    assert!(l["expires_in_ms"].as_u64().unwrap() <= 30_000);
    assert!(l["age_ms"].as_u64().is_some());
    // An unreachable server is an error, not an empty table.
    let (code, _, err) = blockalloc(&["status", "--remote", "127.0.0.1:1"]);
    assert_ne!(code, 0, "{err}");
}

#[test]
fn serve_logs_lease_events_and_errors_but_not_each_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let log = dir.path().join("serve.log");
    let (mut srv, addr, metrics) = serve_logged(
        &dev,
        "127.0.0.1:0",
        "10",
        &["--metrics", "127.0.0.1:0"],
        Some(&log),
    );
    let metrics = metrics_addr(metrics);
    rt().block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        for _ in 0..50 {
            c.allocate(&DeviceId::Index(0), 1, 4, None).await.unwrap();
        }
        let bad = c
            .free(&DeviceId::Index(0), &[Extent::new(1 << 40, 1).unwrap()])
            .await;
        assert!(bad.is_err());
        let alloc = LeasingAllocator::new(
            c.clone(),
            LeaseOptions {
                min_blocks: 256,
                client_id: "logged-client".into(),
                ..LeaseOptions::default()
            },
        );
        alloc.allocate(4).await.unwrap();
        alloc.close().await.unwrap();
        let text = scrape::scrape(metrics).await;
        assert_eq!(
            scrape::value(
                &text,
                "blockalloc_requests_total{method=\"Allocate\",code=\"OK\"}"
            ),
            50.0
        );
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines = |what: &str| logged.lines().filter(|l| l.contains(what)).count();
    assert_eq!(lines("lease granted"), 1, "{logged}");
    assert_eq!(lines("lease released"), 1, "{logged}");
    assert_eq!(lines("logged-client"), 2, "{logged}");
    assert_eq!(lines("call refused"), 1, "{logged}");
    assert_eq!(lines("INVALID_ARGUMENT"), 1, "{logged}");
    assert!(
        logged.lines().count() < 20,
        "no line per allocation: {logged}"
    );
    assert!(
        !logged.contains('\u{1b}'),
        "no colours into a file: {logged}"
    );
}

#[test]
fn sigterm_under_load_finishes_calls_in_flight_and_the_next_open_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (mut srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let rt = rt();
    let (acked, refused) = rt.block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let mut load = Vec::new();
        for _ in 0..3 {
            let c = c.clone();
            load.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                loop {
                    match c.allocate(&DeviceId::Index(0), 1, 2, None).await {
                        Ok(e) => acked.extend(e),
                        // Refused by the stopping server, on the stream or
                        // unary once the listener closed: the call did not
                        // run. A call cut off (outcome unknown) would be a
                        // bug of the graceful stop.
                        Err(ClientError::Unavailable(_)) => return (acked, 1u64),
                        Err(e) => panic!("{e}"),
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        srv.signal("-TERM");
        let mut acked = Vec::new();
        let mut refused = 0;
        for l in load {
            let (a, r) = l.await.unwrap();
            acked.extend(a);
            refused += r;
        }
        (acked, refused)
    });
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    assert!(acked.len() > 3, "the load ran before the signal");
    assert_eq!(refused, 3);
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 journal entries replayed"), "{out}");
    let store = open_store(&dev);
    for e in &acked {
        store.check_allocated(*e).unwrap();
    }
    let st = store.status();
    // Graceful: a call is either acknowledged or never ran, so exactly the
    // acknowledged allocations are on the device.
    assert_eq!(
        st.space.used_blocks - st.meta_blocks,
        acked.iter().map(|e| e.len()).sum::<u64>()
    );
}

#[test]
fn serve_refuses_a_bad_limit_before_touching_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let d = dev.to_str().unwrap();
    for (flag, value) in [
        ("--max-leases", "0"),
        ("--max-in-flight-per-client", "0"),
        ("--max-streams-per-connection", "0"),
        ("--max-message-size", "10"),
        ("--request-timeout", "0"),
        ("--keepalive-timeout", "inf"),
    ] {
        let (code, _, err) = blockalloc(&[
            "serve",
            "--device",
            d,
            "--format",
            "64MiB",
            "--listen",
            "127.0.0.1:0",
            flag,
            value,
        ]);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
        assert!(!dev.exists(), "{flag} {value} created the device");
    }
}

/// `blockalloc serve ARGS...`, which must refuse to start: its exit code
/// and stderr (one that serves instead is killed and fails the test).
fn serve_refused(args: &[&str], log: &Path) -> (i32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .arg("serve")
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .unwrap();
    let code = Proc(child).wait(Duration::from_secs(60));
    (code.unwrap_or(-1), std::fs::read_to_string(log).unwrap())
}

/// `serve` for one tenant over `dev` with `--state-dir state`; the exit
/// code and stderr of a server that refuses to start.
fn serve_tenants_refused(dir: &Path, dev: &Path, state: &Path) -> (i32, String) {
    let (_, entry) = new_tenant("a");
    let config = dir.join("refused.toml");
    std::fs::write(
        &config,
        format!("[server]\nregion_bytes = 4194304\n\n{entry}\n"),
    )
    .unwrap();
    serve_refused(
        &[
            "--config",
            config.to_str().unwrap(),
            "--device",
            dev.to_str().unwrap(),
            "--format",
            "64MiB",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &dir.join("refused.log"),
    )
}

#[test]
fn a_missing_or_unwritable_state_dir_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let missing = dir.path().join("no-such-dir");
    let (code, err) = serve_tenants_refused(dir.path(), &dev, &missing);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{}, does not exist", missing.display()))
            && err.contains("state_dir"),
        "{err}"
    );
    // Read-only for its owner; root writes anywhere but in /sys.
    let ro = dir.path().join("read-only");
    std::fs::create_dir(&ro).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let ro = match std::fs::File::create(ro.join("probe")) {
        Ok(_) => std::path::PathBuf::from("/sys"),
        Err(_) => ro,
    };
    let (code, err) = serve_tenants_refused(dir.path(), &dev, &ro);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{}, is not writable", ro.display())) && err.contains("state_dir"),
        "{err}"
    );
}

#[test]
fn a_device_with_tenant_data_and_no_ownership_file_in_state_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (state, elsewhere) = (dir.path().join("state"), dir.path().join("elsewhere"));
    std::fs::create_dir(&state).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    let (token, entry) = new_tenant("a");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!("[server]\nregion_bytes = 4194304\n\n{entry}\n"),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (d, s) = (dev.to_str().unwrap(), state.to_str().unwrap());
    let (mut srv, addr) = serve_args(&[
        "--config",
        cfg,
        "--device",
        d,
        "--format",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        s,
    ]);
    let kept = rt().block_on(async {
        let a = Client::connect_with_token(&addr, &token).await.unwrap();
        a.allocate(&DeviceId::default(), 2, 100, None)
            .await
            .unwrap()
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    assert!(state.join("d0.owners").exists());
    let (code, err) = serve_refused(
        &[
            "--config",
            cfg,
            "--device",
            d,
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            elsewhere.to_str().unwrap(),
        ],
        &dir.path().join("refused.log"),
    );
    assert_eq!(code, 2, "{err}");
    let looked = elsewhere.join("d0.owners");
    assert!(
        err.contains(&format!("no ownership file at {}", looked.display()))
            && err.contains("200 allocated blocks")
            && err.contains("point state_dir at the directory holding")
            && !err.contains("free that space"),
        "{err}"
    );
    assert!(!looked.exists(), "nothing recorded");
    let store = open_store(&dev);
    for e in kept {
        store.check_allocated(e).unwrap();
    }
}

#[test]
fn duration_flags_take_units_as_the_configuration_file_does() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let d = dev.to_str().unwrap();
    // A unit the file takes is taken by the flags; a bad one is a usage
    // error naming the flag, before the device is touched.
    for (flag, bad) in [
        ("--lease-ttl", "4parsecs"),
        ("--drain-grace", "soon"),
        ("--request-timeout", "1 s later"),
        ("--keepalive-interval", "5 fortnights"),
    ] {
        let (code, out, err) =
            blockalloc(&["serve", "--device", d, "--format", "64MiB", flag, bad]);
        assert_eq!(code, 2, "{flag} {bad}: {out}{err}");
        assert!(
            err.contains(flag) && err.contains("not a duration"),
            "{flag} {bad}: {err}"
        );
        assert!(!dev.exists(), "{flag} {bad} created the device");
    }
    let (_srv, addr) = serve_args(&[
        "--device",
        d,
        "--format",
        "64MiB",
        "--lease-ttl",
        "1500ms",
        "--drain-grace",
        "0s",
        "--request-timeout",
        "1m",
        "--keepalive-interval",
        "30",
    ]);
    let ttl_ms = rt().block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        let lease = c
            .rpc()
            .lease(blockalloc_client::pb::LeaseRequest {
                client_id: "units".into(),
                min_blocks: 16,
                want_blocks: 16,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        lease.ttl_ms
    });
    assert_eq!(ttl_ms, 1500, "--lease-ttl 1500ms");
}

#[test]
fn listen_takes_a_host_name_and_refuses_a_bare_port_naming_the_form() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let d = dev.to_str().unwrap();
    // A bare port, flag or file: refused before the device is touched,
    // with the form wanted.
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, "listen = \"7878\"\n").unwrap();
    let c = config.to_str().unwrap();
    for args in [
        &["--listen", "7878"][..],
        &["--listen", "localhost"],
        &["--listen", "127.0.0.1:0", "--metrics", "9090"],
        &["--config", c],
    ] {
        let mut all = vec!["serve", "--device", d, "--format", "64MiB"];
        all.extend_from_slice(args);
        let (code, out, err) = blockalloc(&all);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(
            err.contains("HOST:PORT") && err.contains("127.0.0.1:7878"),
            "{args:?}: {err}"
        );
        assert!(!dev.exists(), "{args:?} created the device");
    }
    // A host name is resolved: localhost listens on loopback, by flag
    // (metrics too) and in the file, and clients reach it by name.
    std::fs::write(&config, "listen = \"localhost:0\"\n").unwrap();
    for args in [
        &["--listen", "localhost:0", "--metrics", "localhost:0"][..],
        &["--config", c],
    ] {
        let mut all = vec!["--device", d, "--format", "64MiB"];
        all.extend_from_slice(args);
        let (_srv, addr) = serve_args(&all);
        let port = addr
            .strip_prefix("127.0.0.1:")
            .unwrap_or_else(|| panic!("{args:?}: {addr}"));
        let by_name = format!("localhost:{port}");
        let (code, out, err) = blockalloc(&["status", "--remote", &by_name, "--json"]);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    }
    // A client's server address without a port is refused, not sent to
    // port 80.
    for addr in ["7878", "localhost"] {
        let (code, _, err) = blockalloc(&["status", "--remote", addr]);
        assert_eq!(code, 2, "{addr}: {err}");
        assert!(
            err.contains("HOST:PORT") && err.contains("127.0.0.1:7878"),
            "{addr}: {err}"
        );
    }
}

#[test]
fn tenant_ownership_survives_a_sigkill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (ta, entry_a) = new_tenant("a");
    let (tb, entry_b) = new_tenant("b");
    assert_ne!(ta, tb);
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = 4194304\n\n{entry_a}\nquota_bytes = 1073741824\n\n{entry_b}\n",
            dev.to_str().unwrap()
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (srv, addr) = serve_args(&["--config", cfg, "--format", "64MiB"]);
    let d0 = DeviceId::default();
    let (mine, theirs, used) = rt().block_on(async {
        let anon = Client::connect(&addr).await.unwrap();
        let e = anon.status().await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(blockalloc_client::Code::Unauthenticated),
            "{e}"
        );
        let a = Client::connect_with_token(&addr, &ta).await.unwrap();
        let b = Client::connect_with_token(&addr, &tb).await.unwrap();
        let mine = a.allocate(&d0, 3, 700, None).await.unwrap();
        let theirs = b.allocate(&d0, 2, 100, None).await.unwrap();
        let used = |st: Vec<blockalloc_client::DeviceStatus>| st[0].tenants[0].used_blocks;
        let u = (
            used(a.status().await.unwrap()),
            used(b.status().await.unwrap()),
        );
        (mine, theirs, u)
    });
    assert_eq!(used, (2100, 200));
    assert!(
        dir.path().join("d0.owners").exists(),
        "the ownership file sits next to the device"
    );
    drop(srv); // SIGKILL
    let (mut srv, addr) = serve_args(&["--config", cfg]);
    rt().block_on(async {
        let a = Client::connect_with_token(&addr, &ta).await.unwrap();
        let b = Client::connect_with_token(&addr, &tb).await.unwrap();
        let st = a.status().await.unwrap();
        assert_eq!(st[0].tenants[0].used_blocks, 2100);
        assert_eq!(b.status().await.unwrap()[0].tenants[0].used_blocks, 200);
        let e = b.free(&d0, &mine[..1]).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(blockalloc_client::Code::PermissionDenied),
            "{e}"
        );
        let e = a.free(&d0, &theirs).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(blockalloc_client::Code::PermissionDenied),
            "{e}"
        );
        assert_eq!(a.free(&d0, &mine).await.unwrap(), 2100);
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    let store = open_store(&dev);
    for e in theirs {
        store.check_allocated(e).unwrap();
    }
}

#[test]
fn space_of_a_removed_tenant_is_logged_and_shown_by_status() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (ta, entry_a) = new_tenant("gone");
    let (tb, entry_b) = new_tenant("ops");
    let config = dir.path().join("serve.toml");
    let write = |entries: &[&str]| {
        std::fs::write(
            &config,
            format!(
                "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = 4194304\n\n{}\n",
                dev.to_str().unwrap(),
                entries.join("\n\n")
            ),
        )
        .unwrap()
    };
    write(&[&entry_a, &entry_b]);
    let cfg = config.to_str().unwrap();
    let (mut srv, addr) = serve_args(&["--config", cfg, "--format", "64MiB"]);
    rt().block_on(async {
        let a = Client::connect_with_token(&addr, &ta).await.unwrap();
        a.allocate(&DeviceId::default(), 2, 700, None)
            .await
            .unwrap();
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));

    // "gone" leaves the configuration with 1400 blocks in two regions.
    write(&[&entry_b]);
    let log = dir.path().join("serve.log");
    let (_srv, addr) = serve_args_logged(&["--config", cfg], &log);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &tb).unwrap();
    let tf = token_file.to_str().unwrap();
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("(removed)"))
        .unwrap_or_else(|| panic!("no row of removed tenants: {out}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["(removed)", "d0", "5.47", "MiB", "-", "-", "2", "-"],
        "{out}"
    );
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["removed_tenant_regions"], 2, "{out}");
    assert_eq!(v["devices"][0]["removed_tenant_blocks"], 1400, "{out}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("WARN") && l.contains("gone") && l.contains("1400")),
        "{logged}"
    );
}

#[test]
fn a_bad_configuration_file_names_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    for (text, want) in [
        ("[server]\nlease_tl = 3\n", "lease_tl"),
        ("[server]\nmax_batch = 0\n", "server.max_batch"),
        (
            "[[tenant]]\nname = \"a\"\ntoken_sha256 = \"00\"\n",
            "tenant[0].token_sha256",
        ),
        ("[server]\nlease_ttl = \"ten\"\n", "lease_ttl"),
    ] {
        std::fs::write(&config, text).unwrap();
        let (code, _, err) = blockalloc(&[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--device",
            dir.path().join("d0").to_str().unwrap(),
            "--format",
            "64MiB",
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(want) && err.contains("bad.toml"),
            "{text}: {err}"
        );
        assert!(!dir.path().join("d0").exists(), "nothing was created");
    }
}

#[test]
fn status_and_bench_reach_a_server_with_tenants_with_a_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (token, entry) = new_tenant("ops");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = 4194304\n\n{entry}\n",
            dev.to_str().unwrap()
        ),
    )
    .unwrap();
    let (_srv, addr) = serve_args(&["--config", config.to_str().unwrap(), "--format", "64MiB"]);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let tf = token_file.to_str().unwrap();

    // Without a token the server refuses the call: a denied caller.
    let (code, out, err) = blockalloc(&["status", "--remote", &addr]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.to_lowercase().contains("token"), "{err}");

    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["name"], "d0", "{out}");
    assert_eq!(v["devices"][0]["tenants"][0]["name"], "ops", "{out}");
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("TENANT") && out.contains("ops"), "{out}");

    let (code, out, err) = blockalloc(&[
        "bench",
        "--remote",
        &addr,
        "--token-file",
        tf,
        "--lease",
        "auto",
        "--round-size",
        "100",
        "--max-rounds",
        "1",
        "--quiet",
        "--json",
        "-",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"remote\""), "{out}");

    // An empty token file is a usage error, before any call.
    std::fs::write(&token_file, "\n").unwrap();
    let (code, _, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--token-file"), "{err}");
}

#[test]
fn bench_remote_names_the_quota_it_stopped_at_not_no_space() {
    let (token, entry) = new_tenant("ops");
    for lease in ["off", "auto"] {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("d0");
        let config = dir.path().join("serve.toml");
        // A 2 MiB quota on a 64 MiB device: the quota stops the run, not
        // room.
        std::fs::write(
            &config,
            format!(
                "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = 4194304\n\n{entry}\nquota_bytes = 2097152\n",
                dev.to_str().unwrap()
            ),
        )
        .unwrap();
        let (_srv, addr) = serve_args(&["--config", config.to_str().unwrap(), "--format", "64MiB"]);
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let (code, out, err) = blockalloc(&[
            "bench",
            "--remote",
            &addr,
            "--token-file",
            token_file.to_str().unwrap(),
            "--lease",
            lease,
            "--sizes",
            "fixed:64KiB",
            "--round-size",
            "100",
            "--max-rounds",
            "1",
            "--json",
            "-",
        ]);
        assert_eq!(code, 0, "{lease}: {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["stopped"], "quota", "{lease}: {v}");
        assert!(v["utilization_at_first_failure"].is_null(), "{lease}: {v}");
        let q = &v["quota_at_first_failure"];
        assert_eq!(q["tenant"], "ops", "{lease}: {v}");
        assert_eq!(q["device"], "d0", "{lease}: {v}");
        assert_eq!(q["quota_bytes"], 2 << 20, "{lease}: {v}");
        assert_eq!(q["asked_bytes"], 64 << 10, "{lease}: {v}");
        assert!(v["allocations"].as_u64().unwrap() <= 32, "{lease}: {v}");
        // The text report (on stderr with --json -) names the quota.
        assert!(
            err.contains(
                "stopped    over quota: tenant \"ops\" on device \"d0\" has a quota of 2 MiB"
            ) && !err.contains("no space"),
            "{lease}: {err}"
        );
    }
}

/// `bench --remote` runs every workload of the registry through leasing
/// clients: each to its end or its first failure, every free it makes a
/// free of an object it allocated (the server refuses any other), and the
/// device consistent after.
#[test]
fn bench_remote_runs_every_workload_of_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    for w in blockalloc_bench::WORKLOADS {
        let dev = dir.path().join(w.name);
        let (mut srv, addr) = serve(&dev, "127.0.0.1:0", "10");
        let (code, out, err) = blockalloc(&[
            "bench",
            "--remote",
            &addr,
            "--workload",
            w.name,
            "--clients",
            "2",
            "--round-size",
            "64",
            "--sizes",
            "uniform:4KiB..256KiB",
            "--churn-volume",
            "0.5",
            "--json",
            "-",
        ]);
        assert_eq!(code, 0, "{}: {err}", w.name);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["workload"], w.name);
        let (allocations, frees) = (
            v["allocations"].as_u64().unwrap(),
            v["frees"].as_u64().unwrap(),
        );
        assert!(
            allocations > 0 && frees > 0 && frees <= allocations,
            "{}: {v}",
            w.name
        );
        let stopped = v["stopped"].as_str().unwrap();
        if w.ends {
            assert!(
                ["end_of_workload", "no_space"].contains(&stopped),
                "{}: {stopped}",
                w.name
            );
        } else {
            assert_eq!(stopped, "no_space", "{}", w.name);
        }
        stop_and_check(&mut srv, &dev);
    }
}

/// Stops `srv` with SIGTERM (it must exit 0) and checks `dev`: consistent;
/// returns `check --json`'s record.
fn stop_and_check(srv: &mut Proc, dev: &Path) -> serde_json::Value {
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    let (code, out, err) = blockalloc(&["check", "--device", dev.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["consistent"], true, "{out}");
    v
}

/// `serve --format` refuses a size beyond the file system's free space
/// before fallocate could fill it, naming both sizes and `--sparse`, which
/// makes the device.
#[test]
fn serve_format_beyond_the_free_space_is_refused_and_sparse_makes_it() {
    let Some(fs) = Tmpfs::mount("16m") else {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let dev = fs.0.path().join("d0");
    let d = dev.to_str().unwrap();
    let (code, out, err) = blockalloc(&[
        "serve",
        "--device",
        d,
        "--format",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(!out.contains("listening on"), "{out}");
    assert!(
        err.contains("64MiB") && err.contains("16MiB") && err.contains("does not fit"),
        "{err}"
    );
    assert!(
        err.contains("nothing was reserved") && err.contains("--sparse"),
        "{err}"
    );
    assert!(!dev.exists(), "{err}");
    let (code, _, err) = blockalloc(&["serve", "--device", d, "--sparse"]);
    assert_eq!(code, 2, "--sparse without --format: {err}");
    assert!(err.contains("--format"), "{err}");

    let (mut srv, addr) = serve_with(
        &dev,
        &["--format", "64MiB", "--sparse", "--listen", "127.0.0.1:0"],
    );
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let bs = v["devices"][0]["block_size"].as_u64().unwrap();
    assert_eq!(
        v["devices"][0]["capacity_blocks"].as_u64().unwrap() * bs,
        64 << 20
    );
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(60)), Some(0));
}

/// `bench --remote` frees every object it allocated when it ends (rounds
/// done, at a limit mid-round, or on Ctrl-C), per call and leased, for the
/// workloads that free within a round and those whose frees cross rounds;
/// `--keep` leaves them.
#[test]
fn bench_remote_frees_what_it_allocated_unless_keep() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (mut srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    let empty = used_blocks(&addr);
    for workload in ["seed", "churn"] {
        for lease in ["off", "auto"] {
            for limit in [["--max-rounds", "3"], ["--max-ops", "150"]] {
                let mut args = vec![
                    "--workload",
                    workload,
                    "--lease",
                    lease,
                    "--clients",
                    "2",
                    "--round-size",
                    "40",
                ];
                args.extend_from_slice(&limit);
                let v = bench_remote(&addr, &args);
                let (allocs, frees) = (
                    v["allocations"].as_u64().unwrap(),
                    v["frees"].as_u64().unwrap(),
                );
                assert!(allocs > frees, "{workload} {lease} {limit:?}: {v}");
                assert_eq!(
                    used_blocks(&addr),
                    empty,
                    "{workload} {lease} {limit:?}: {v}"
                );
            }
        }
    }
    let v = bench_remote(
        &addr,
        &["--round-size", "40", "--max-rounds", "3", "--keep"],
    );
    let left = v["allocations"].as_u64().unwrap() - v["frees"].as_u64().unwrap();
    assert_eq!(used_blocks(&addr), empty + left * 16, "{v}");
    let (code, _, err) = blockalloc(&["bench", "--keep", "--max-rounds", "1"]);
    assert_eq!(code, 2, "--keep without --device or --remote: {err}");

    // Ctrl-C: the clients stop, free their objects, and the run reports
    // what it measured.
    let kept = used_blocks(&addr);
    let mut bench = Proc(
        Command::new(env!("CARGO_BIN_EXE_blockalloc"))
            .args([
                "bench",
                "--remote",
                &addr,
                "--workload",
                "churn",
                "--churn-volume",
                "1000",
                "--sizes",
                "fixed:64KiB",
                "--round-size",
                "40",
                "--time-limit",
                "600",
                "--json",
                "-",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while used_blocks(&addr) <= kept + 40 * 16 {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the run allocates nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    bench.signal("-INT");
    assert_eq!(bench.wait(Duration::from_secs(120)), Some(0));
    let mut out = String::new();
    std::io::Read::read_to_string(bench.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["stopped"], "interrupted", "{v}");
    assert_eq!(used_blocks(&addr), kept, "{v}");
    let v = stop_and_check(&mut srv, &dev);
    assert_eq!(v["used_blocks"], kept, "{v}");
}

/// Sizes and durations in `text` are printed the one way every command
/// prints them (`1.50 GiB`, `133 ms`): a number below 1024 (1000 for
/// durations), a space, the unit; never `33519592KiB` nor `17000041 ns`.
fn assert_units_read_alike(text: &str) {
    const UNITS: [&str; 11] = [
        "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ns", "µs", "ms", "s",
    ];
    let words: Vec<&str> = text.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        let glued = UNITS.iter().any(|u| {
            w.strip_suffix(u)
                .is_some_and(|n| !n.is_empty() && n.parse::<f64>().is_ok())
        });
        assert!(!glued, "{w:?} has no space before its unit: {text}");
        if UNITS.contains(w) && i > 0 {
            if let Ok(n) = words[i - 1].parse::<f64>() {
                let max = if w.ends_with('B') { 1024.0 } else { 1000.0 };
                assert!(
                    n < max || *w == "s",
                    "{} {w}: a larger unit reads better: {text}",
                    words[i - 1]
                );
            }
        }
    }
}

/// `token new --out FILE` writes the token alone (mode 0600) for
/// `--token-file`, and stdout the configuration entry, without the token:
/// a client reading the file authenticates against a server configured with
/// the entry.
#[test]
fn token_new_out_writes_a_file_that_token_file_reads() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops.token");
    let tf = token_file.to_str().unwrap();
    let (code, out, err) = blockalloc(&["token", "new", "--tenant", "ops", "--out", tf]);
    assert_eq!(code, 0, "{err}");
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(token.lines().count(), 1, "{token:?}");
    let token = token.trim();
    assert!(token.starts_with("bat_"), "{token}");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert!(!out.contains(token), "the token stays out of stdout: {out}");
    assert!(out.contains(tf), "{out}");
    let entry: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(entry[0], "[[tenant]]", "{out}");

    let dev = dir.path().join("d0");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = \"4MiB\"\n\n{}\n",
            dev.to_str().unwrap(),
            entry.join("\n")
        ),
    )
    .unwrap();
    let (_srv, addr) = serve_args(&["--config", config.to_str().unwrap(), "--format", "64MiB"]);
    let (code, out, err) = blockalloc(&["status", "--remote", &addr, "--token-file", tf, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["tenants"][0]["name"], "ops", "{out}");

    // An existing file is never replaced.
    let (code, _, err) = blockalloc(&["token", "new", "--out", tf]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    // `--out -`: the token alone on stdout, the entry on stderr.
    let (code, out, err) = blockalloc(&["token", "new", "--out", "-"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim().starts_with("bat_") && out.lines().count() == 1,
        "{out}"
    );
    assert!(err.contains("token_sha256 = "), "{err}");
}

/// Every metric family the server exposes has HELP text (`promtool check
/// metrics` reports none missing), and the device series carry the label
/// the README shows: the device's file name (`device="dev0"` for a device
/// file `dev0`), with the tenant's name beside it.
#[test]
fn every_metric_has_help_and_device_series_are_labelled_by_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev0");
    let (token, entry) = new_tenant("thumbs");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n\n[server]\nregion_bytes = 4194304\n\n{entry}\n",
            dev.to_str().unwrap()
        ),
    )
    .unwrap();
    let (_srv, addr, metrics) = serve_args_metrics(&[
        "--config",
        config.to_str().unwrap(),
        "--format",
        "64MiB",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let metrics = metrics_addr(metrics);
    // A call of each kind, so that the labelled families have series.
    rt().block_on(async {
        let c = Client::connect_with_token(&addr, &token).await.unwrap();
        let e = c.allocate(&DeviceId::Index(0), 1, 16, None).await.unwrap();
        c.free(&DeviceId::Index(0), &e).await.unwrap();
    });
    let text = rt().block_on(scrape::scrape(metrics));
    let mut families = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let name = rest.split_whitespace().next().unwrap();
        families += 1;
        let help = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
            .unwrap_or_else(|| panic!("no HELP for {name}: {text}"));
        assert!(!help.trim().is_empty(), "empty HELP for {name}");
    }
    assert!(families >= 20, "{text}");
    for series in [
        "blockalloc_device_used_blocks{device=\"dev0\",tenant=\"\"}",
        "blockalloc_device_used_blocks{device=\"dev0\",tenant=\"thumbs\"}",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{series} "))),
            "{series}: {text}"
        );
    }
}

/// `bench --remote` prints its latencies, times and sizes as every other
/// command does (`17.0 ms`, not `17000041 ns`).
#[test]
fn bench_remote_prints_durations_in_the_units_of_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (_srv, addr) = serve(&dev, "127.0.0.1:0", "10");
    for lease in ["off", "auto", "4MiB"] {
        let (code, out, err) = blockalloc(&[
            "bench",
            "--remote",
            &addr,
            "--lease",
            lease,
            "--sizes",
            "fixed:64KiB",
            "--round-size",
            "100",
            "--max-rounds",
            "2",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("p99.9 "), "{out}");
        assert_units_read_alike(&out);
    }
}

#[test]
fn serve_upgrades_a_version_1_store_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("old");
    std::fs::write(&dev, common::fixture("v1-closed.sparse")).unwrap();
    let d = dev.to_str().unwrap();
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["format_version"],
        1
    );
    let log = dir.path().join("serve.log");
    let (mut srv, addr, _) = serve_logged(&dev, "127.0.0.1:0", "10", &[], Some(&log));
    rt().block_on(async {
        let c = Client::connect(&addr).await.unwrap();
        c.allocate(&DeviceId::Name("old".into()), 1, 5, None)
            .await
            .unwrap();
    });
    srv.signal("-TERM");
    assert_eq!(srv.wait(Duration::from_secs(10)), Some(0));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("upgraded the store from format version 1 to 2"),
        "{logged}"
    );
    let (code, out, err) = blockalloc(&["check", "--device", d, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["format_version"], 2);
    assert_eq!(v["closed_cleanly"], true);
}

/// `format --zero background` leaves a device file unwritten and the
/// server zeroes it while it serves: status, metrics and `inspect` show the
/// progress, space allocated meanwhile keeps what its client wrote, a
/// SIGKILL keeps the recorded progress, and a restarted server finishes.
#[test]
fn serve_zeroes_a_device_file_in_the_background_and_resumes_after_a_kill() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let d = dev.to_str().unwrap();
    let (code, out, err) = blockalloc(&[
        "format",
        "--device",
        d,
        "--size",
        "64MiB",
        "--zero",
        "background",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("to be zeroed in the background"), "{out}");
    let inspect = || {
        let (code, out, err) = blockalloc(&["inspect", "--device", d, "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["zeroing"].clone()
    };
    assert_eq!(inspect()["fraction"], 0.0);
    let config = dir.path().join("slow.toml");
    std::fs::write(&config, "[server]\nzero_share = 0.02\n").unwrap();
    let (mut srv, addr, metrics) = serve_args_metrics(&[
        "--device",
        d,
        "--config",
        config.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
    ]);
    let metrics = metrics_addr(metrics);
    let rt = rt();
    // Objects allocated while the zeroer runs, their data written at once.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    let mut objects = Vec::new();
    for i in 0..40u8 {
        let e = rt
            .block_on(c.allocate(&DeviceId::Index(0), 1, 3 + u64::from(i), None))
            .unwrap()
            .remove(0);
        file.write_all_at(&vec![i + 1; (e.len() * 4096) as usize], e.start() * 4096)
            .unwrap();
        objects.push((i + 1, e));
    }
    let status = || rt.block_on(c.status()).unwrap().remove(0);
    let t = Instant::now();
    while status().zeroed_bytes == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "no zeros written");
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = rt.block_on(scrape::scrape(metrics));
    assert!(
        scrape::value(
            &text,
            "blockalloc_device_zeroed_bytes_total{device=\"d0\",tenant=\"\"}"
        ) > 0.0,
        "{text}"
    );
    srv.signal("-KILL");
    srv.wait(Duration::from_secs(10));
    let recorded = inspect();
    // Restarted at full pace, it finishes.
    std::fs::write(&config, "[server]\nzero_share = 1\n").unwrap();
    let log = dir.path().join("serve.log");
    let (mut srv, addr) =
        serve_args_logged(&["--device", d, "--config", config.to_str().unwrap()], &log);
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    let t = Instant::now();
    let done = loop {
        let s = rt.block_on(c.status()).unwrap().remove(0);
        if s.zeroed_through == s.capacity_blocks {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "zeroing never finished: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(done.zeroing_stopped.is_empty(), "{done:?}");
    let (_, text, _) = blockalloc(&["status", "--remote", &addr]);
    assert!(text.contains("100.0%"), "{text}");
    let t = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("background zeroing done")
    {
        assert!(t.elapsed() < Duration::from_secs(60), "no log of the end");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop_and_check(&mut srv, &dev);
    let z = inspect();
    assert_eq!(z["done"], true, "{z}");
    assert!(
        z["zeroed_through_block"].as_u64() >= recorded["zeroed_through_block"].as_u64(),
        "{z} after {recorded}"
    );
    for (byte, e) in objects {
        let mut buf = vec![0; (e.len() * 4096) as usize];
        file.read_exact_at(&mut buf, e.start() * 4096).unwrap();
        assert!(buf.iter().all(|&b| b == byte), "object {byte} at {e}");
    }
}
