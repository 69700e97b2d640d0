//! `serve --etcd`: servers that own their devices through a real etcd
//! (`blockalloc_cluster::testkit`), take them with the owner key's revision
//! as epoch, give them up on SIGTERM, and stop acknowledging when cut off
//! from etcd. `cluster status` shows it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use blockalloc_client::pb;
use blockalloc_client::Client;
use blockalloc_cluster::testkit::{Etcd, Proxy};
use common::{blockalloc, serve_args_logged, Proc};

#[path = "../../service/tests/common/certs.rs"]
mod certs;

/// `cluster status --json` (with `extra` flags), parsed.
fn status_with(etcd: &str, cluster: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "cluster",
        "status",
        "--etcd",
        etcd,
        "--cluster",
        cluster,
        "--json",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = blockalloc(&args);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// `cluster status --json`, parsed.
fn status(etcd: &str, cluster: &str) -> serde_json::Value {
    status_with(etcd, cluster, &[])
}

fn owner_of(view: &serde_json::Value, device: &str) -> Option<(String, u64)> {
    view["owners"].as_array().unwrap().iter().find_map(|o| {
        (o["device"] == device).then(|| {
            (
                o["owner"]["server"].as_str().unwrap().to_owned(),
                o["token"].as_u64().unwrap(),
            )
        })
    })
}

/// One Allocate of one block, without the client's retries: the reply's
/// epoch, or the refusal (UNAVAILABLE when the server is gone).
async fn allocate_once(addr: &str) -> Result<u64, tonic::Status> {
    let c = Client::connect(addr)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let r = c
        .rpc()
        .allocate(pb::AllocateRequest {
            device: device0(),
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(1)),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().epoch)
}

/// `serve`'s flags for device `dev` (created at 64 MiB) in cluster `c` as
/// server `name`, on a loopback port.
fn flags(dev: &std::path::Path, etcd: &str, name: &str) -> Vec<String> {
    let dev = dev.to_str().unwrap();
    [
        "--device",
        dev,
        "--format",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
        "--etcd",
        etcd,
        "--cluster",
        "c",
        "--server-name",
        name,
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn serve(dir: &std::path::Path, etcd: &str, name: &str, ttl: &str) -> (Proc, String) {
    let mut args = flags(&dir.join("d0"), etcd, name);
    args.extend(["--etcd-ttl".to_owned(), ttl.to_owned()]);
    serve_args_logged(&strs(&args), &dir.join(format!("{name}.log")))
}

#[test]
fn a_device_has_one_owner_whose_epoch_is_its_owner_keys_revision_and_sigterm_hands_it_over() {
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, addr_a) = serve(da.path(), &e, "a", "2");
    let view = status(&e, "c");
    let (owner, t1) = owner_of(&view, "d0").expect("d0 owned");
    assert_eq!(owner, "a");
    assert_eq!(view["servers"][0]["addr"], addr_a.as_str());
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(allocate_once(&addr_a)).unwrap(), t1);
    // The owner publishes its device's space, with its epoch.
    let t = Instant::now();
    let space = loop {
        let v = status(&e, "c");
        let s = v["owners"][0]["space"].clone();
        if !s.is_null() && s["free_blocks"].as_u64() < s["capacity_blocks"].as_u64() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no space published: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(space["capacity_blocks"], 16384, "{space}");
    assert_eq!(space["block_size"], 4096);
    assert_eq!(space["epoch"].as_u64(), Some(t1));

    // A second server that reaches a device of the same name is refused it.
    let dev_b = db.path().join("d0");
    let mut args = vec!["serve".to_owned()];
    args.extend(flags(&dev_b, &e, "b"));
    let (code, _, err) = blockalloc(&strs(&args));
    assert_ne!(code, 0);
    assert!(err.contains("owned by server \"a\""), "{err}");
    assert!(
        !dev_b.exists(),
        "the refused server created its device: {err}"
    );
    assert_eq!(owner_of(&status(&e, "c"), "d0"), Some(("a".into(), t1)));

    // Draining a server that is not there is refused, and changes nothing.
    let (code, _, err) =
        blockalloc(&["cluster", "drain", "nobody", "--etcd", &e, "--cluster", "c"]);
    assert_ne!(code, 0);
    assert!(err.contains("no live server named \"nobody\""), "{err}");
    assert_eq!(owner_of(&status(&e, "c"), "d0"), Some(("a".into(), t1)));

    // SIGTERM: a stops and its keys go at once, without waiting for the TTL.
    a.signal("-TERM");
    assert_eq!(a.wait(Duration::from_secs(30)), Some(0));
    let view = status(&e, "c");
    assert_eq!(view["servers"].as_array().unwrap().len(), 0, "{view}");
    assert_eq!(owner_of(&view, "d0"), None);
    // b from a configuration file's [cluster] table.
    let conf = db.path().join("serve.toml");
    std::fs::write(
        &conf,
        format!(
            "devices = [{:?}]\nlisten = \"127.0.0.1:0\"\n[cluster]\netcd = [{e:?}]\nname = \"c\"\nserver_name = \"b\"\netcd_ttl = 2\n",
            dev_b.to_str().unwrap()
        ),
    )
    .unwrap();
    let (_b, addr_b) = serve_args_logged(
        &["--config", conf.to_str().unwrap(), "--format", "64MiB"],
        &db.path().join("b.log"),
    );
    let (owner, t2) = owner_of(&status(&e, "c"), "d0").unwrap();
    assert_eq!(owner, "b");
    assert!(t2 > t1, "epoch {t2} after {t1}");
    assert_eq!(rt.block_on(allocate_once(&addr_b)).unwrap(), t2);
}

#[test]
fn a_server_cut_off_from_etcd_stops_acknowledging_before_its_device_can_move_and_then_exits() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt.block_on(Proxy::start(etcd.endpoint()));
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, addr_a) = serve(da.path(), &proxy.addr(), "a", "3");
    let (_, t1) = owner_of(&status(&etcd.endpoint(), "c"), "d0").unwrap();
    assert_eq!(rt.block_on(allocate_once(&addr_a)).unwrap(), t1);

    proxy.set_cut(true);
    let cut = Instant::now();
    // Within 2/3 of the TTL (plus scheduling) a refuses every call.
    let refused = loop {
        match rt.block_on(allocate_once(&addr_a)) {
            Ok(_) => {
                assert!(
                    cut.elapsed() < Duration::from_secs(60),
                    "a never fenced itself"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(s) => break s,
        }
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("cluster lease"), "{refused:?}");
    // The device can move only after a's lease ended in etcd: by then a
    // has refused for a while. A standby with the same device takes it.
    let (_b, addr_b) = loop {
        let view = status(&etcd.endpoint(), "c");
        if owner_of(&view, "d0").is_none() {
            // Free for another owner: a refuses by now, by its clock alone.
            assert!(
                rt.block_on(allocate_once(&addr_a)).is_err(),
                "a acknowledges while d0 is free"
            );
            break serve(db.path(), &etcd.endpoint(), "b", "3");
        }
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "a's lease never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let t2 = rt.block_on(allocate_once(&addr_b)).unwrap();
    assert!(t2 > t1);
    assert!(
        rt.block_on(allocate_once(&addr_a)).is_err(),
        "a acknowledged after b took over"
    );
    // Reconnected, a learns its lease ended and stops by itself, failing
    // (so that a supervisor restarts it).
    proxy.set_cut(false);
    let code = a.wait(Duration::from_secs(60));
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
}

/// Starts `serve` without waiting for its address (a standby prints it
/// only once it took its devices): the first stdout line and when it came.
fn spawn_serve(
    dev: &std::path::Path,
    etcd: &str,
    name: &str,
    extra: &[&str],
    log: &std::path::Path,
) -> (Proc, std::sync::mpsc::Receiver<(String, Instant)>) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .arg("serve")
        .args(flags(dev, etcd, name))
        .args(["--etcd-ttl", "2"])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if std::io::BufReader::new(out).read_line(&mut line).is_ok() {
            if let Some(a) = line.trim().strip_prefix("listening on ") {
                let _ = tx.send((a.to_owned(), Instant::now()));
            }
        }
    });
    (Proc(child), rx)
}

/// Failovers a test makes: `FAILOVERS`, default 3.
fn failovers() -> usize {
    std::env::var("FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Device 0, as a request names it.
fn device0() -> Option<pb::DeviceRef> {
    Some(pb::DeviceRef {
        r#ref: Some(pb::device_ref::Ref::Index(0)),
    })
}

/// One failover of device `dev` (cluster `c` on `etcd`): starts standby
/// `s{round}`, waits until it is registered, then ends `owner` (server
/// `s{round-1}`) by SIGKILL, SIGTERM or `cluster drain`, in turn by round.
/// Returns the standby, its `listening on` channel (see [`spawn_serve`]),
/// how the owner ended and when.
fn fail_over(
    dir: &std::path::Path,
    etcd: &str,
    round: usize,
    owner: &Proc,
) -> (
    Proc,
    std::sync::mpsc::Receiver<(String, Instant)>,
    &'static str,
    Instant,
) {
    let name = format!("s{round}");
    let log = dir.join(format!("{name}.log"));
    let (standby, rx) = spawn_serve(&dir.join("d0"), etcd, &name, &["--standby"], &log);
    let t = Instant::now();
    while !status(etcd, "c")["servers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == name.as_str())
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{name} never registered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let kind = ["drain", "SIGKILL", "SIGTERM"][round % 3];
    let t0 = Instant::now();
    match kind {
        "SIGKILL" => owner.signal("-KILL"),
        "SIGTERM" => owner.signal("-TERM"),
        _ => {
            let old = format!("s{}", round - 1);
            let (code, _, err) =
                blockalloc(&["cluster", "drain", &old, "--etcd", etcd, "--cluster", "c"]);
            assert_eq!(code, 0, "{err}");
        }
    }
    (standby, rx, kind, t0)
}

/// Failovers of one device between servers of one host (SIGKILL, SIGTERM
/// and `cluster drain` in turn; `FAILOVERS` of them, default 3): each acknowledged
/// allocation survives every failover (all are freed exactly once at the
/// end), no block is handed out twice, each owner's epoch is above the
/// last, and the times from the old owner's end to the first acknowledged
/// allocation on the standby are printed (`--nocapture`).
#[test]
fn standbys_take_over_killed_and_stopped_owners_without_losing_or_doubling_a_block() {
    use blockalloc::Extent;
    use blockalloc_client::DeviceId;
    let rounds = failovers();
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut owner, rx) = spawn_serve(&dev, &e, "s0", &[], &dir.path().join("s0.log"));
    let (mut addr, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let mut epoch = rt.block_on(allocate_once(&addr)).unwrap();
    let mut acked: Vec<Extent> = Vec::new();
    let mut times: Vec<(&str, Duration)> = Vec::new();
    for round in 1..=rounds {
        let c = rt.block_on(Client::connect(&addr)).unwrap();
        for _ in 0..16 {
            acked.extend(
                rt.block_on(c.allocate(&DeviceId::Index(0), 1, 3, None))
                    .unwrap(),
            );
        }
        let (standby, rx, kind, t0) = fail_over(dir.path(), &e, round, &owner);
        let (next, _) = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                let log = dir.path().join(format!("s{round}.log"));
                panic!(
                    "s{round} never took over: {}",
                    std::fs::read_to_string(&log).unwrap()
                )
            });
        let c = rt.block_on(Client::connect(&next)).unwrap();
        let first = rt
            .block_on(c.allocate(&DeviceId::Index(0), 1, 3, None))
            .unwrap();
        times.push((kind, t0.elapsed()));
        let code = owner.wait(Duration::from_secs(30));
        if kind != "SIGKILL" {
            assert_eq!(code, Some(0), "a stopped or drained owner exits cleanly");
        }
        let now = rt.block_on(allocate_once(&next)).unwrap();
        assert!(now > epoch, "epoch {now} after {epoch}");
        epoch = now;
        acked.extend(first);
        (owner, addr) = (standby, next);
    }
    // No block twice: the acknowledged extents are disjoint...
    let mut sorted = acked.clone();
    sorted.sort_by_key(|x| x.start());
    for w in sorted.windows(2) {
        assert!(
            w[0].end() <= w[1].start(),
            "{:?} and {:?} overlap",
            w[0],
            w[1]
        );
    }
    // ...and every one is still allocated on the last owner: each frees once.
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    for x in &acked {
        rt.block_on(c.free(&DeviceId::Index(0), &[*x])).unwrap();
    }
    for (kind, t) in &times {
        println!("failover after {kind}: {} ms", t.as_millis());
    }
}

/// A paused owner (SIGSTOP) loses its lease; the standby takes the device
/// in etcd but cannot open it while the paused process holds it on this
/// host. Woken, the old owner acknowledges nothing (its fence is a clock
/// check), learns its lease ended and exits; the standby then serves with
/// a higher epoch, and what the old owner acknowledged is all there.
#[test]
fn a_paused_owner_that_wakes_acknowledges_nothing_and_its_standby_serves_after_it() {
    use blockalloc_client::DeviceId;
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut a, rx) = spawn_serve(&dev, &e, "a", &[], &dir.path().join("a.log"));
    let (addr_a, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let epoch_a = rt.block_on(allocate_once(&addr_a)).unwrap();
    let c = rt.block_on(Client::connect(&addr_a)).unwrap();
    let mut acked = Vec::new();
    for _ in 0..16 {
        acked.extend(
            rt.block_on(c.allocate(&DeviceId::Index(0), 1, 2, None))
                .unwrap(),
        );
    }
    let (_b, rx_b) = spawn_serve(&dev, &e, "b", &["--standby"], &dir.path().join("b.log"));
    a.signal("-STOP");
    let t = Instant::now();
    while owner_of(&status(&e, "c"), "d0").map(|o| o.0) != Some("b".into()) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "b never took d0 in etcd"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // b owns d0 in etcd but cannot open it: a still holds it.
    assert!(rx_b.recv_timeout(Duration::from_millis(500)).is_err());
    a.signal("-CONT");
    // Woken, a refuses (or is already gone): never an acknowledgement.
    if let Ok(epoch) = rt.block_on(allocate_once(&addr_a)) {
        panic!("the woken old owner acknowledged an allocation (epoch {epoch})");
    }
    let code = a.wait(Duration::from_secs(60));
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    let (addr_b, _) = rx_b.recv_timeout(Duration::from_secs(60)).unwrap();
    let epoch_b = rt.block_on(allocate_once(&addr_b)).unwrap();
    assert!(epoch_b > epoch_a);
    let c = rt.block_on(Client::connect(&addr_b)).unwrap();
    for x in &acked {
        rt.block_on(c.free(&DeviceId::Index(0), &[*x])).unwrap();
    }
}

/// TLS to etcd with client certificates: `serve` and `cluster status` with
/// the CA and a client certificate work; without the certificate, or in
/// plaintext, etcd refuses and the command says so.
#[test]
fn a_cluster_reaches_etcd_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let etcd = Etcd::start_tls(&pki.ca, &pki.server_cert, &pki.server_key);
    let e = etcd.endpoint();
    let (ca, cert, key) = (
        pki.ca.to_str().unwrap(),
        pki.client_cert.to_str().unwrap(),
        pki.client_key.to_str().unwrap(),
    );
    let tls = ["--etcd-ca", ca, "--etcd-cert", cert, "--etcd-key", key];
    let dev = dir.path().join("d0");
    let mut args = flags(&dev, &e, "a");
    args.extend(tls.map(String::from));
    let args = strs(&args);
    let (_a, addr) = serve_args_logged(&args, &dir.path().join("a.log"));
    let view = status_with(&e, "c", &tls);
    let (owner, t) = owner_of(&view, "d0").unwrap();
    assert_eq!(owner, "a");
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(allocate_once(&addr)).unwrap(), t);
    for refused in [&["--etcd-ca", ca][..], &[][..]] {
        let mut args = vec!["cluster", "status", "--etcd", &e, "--cluster", "c"];
        args.extend_from_slice(refused);
        let (code, _, err) = blockalloc(&args);
        assert_ne!(code, 0, "{refused:?}");
        assert!(err.contains("cannot read cluster"), "{err}");
    }
}

/// Calls that go on through failovers: four clients allocate and free
/// without pause while the owner of their device is killed, stopped or
/// drained in turn (`FAILOVERS`, default 3). A call that fails to reach a
/// server (refused, UNAVAILABLE, cut) is sent again, with the same request
/// id, to the device's owner of the moment, which the test tells the
/// clients (as a discovery would). No other error may reach a client. At
/// the end every block acknowledged and not freed is allocated exactly
/// once: the acknowledged extents are disjoint and each frees once on the
/// last owner; a resend after a lost reply never allocated twice.
#[test]
fn clients_through_failovers_get_every_call_answered_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let rounds = failovers();
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let (mut owner, rx) = spawn_serve(&dev, &e, "s0", &[], &dir.path().join("s0.log"));
    let (addr, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let current = Arc::new(Mutex::new(addr));
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Sends `call` to the owner of the moment until it is answered; any
    // refusal but "cannot reach it" fails the test. Returns the answer and
    // the longest wait.
    async fn until_answered<T, F, Fut>(current: &Mutex<String>, mut call: F) -> (T, Duration)
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let t = Instant::now();
        loop {
            let addr = current.lock().unwrap().clone();
            let outcome = match Client::connect(&addr).await {
                Ok(c) => call(c).await,
                Err(e) => Err(tonic::Status::unavailable(e.to_string())),
            };
            match outcome {
                Ok(v) => return (v, t.elapsed()),
                // Not answered: the server is gone, stopping (its
                // connection ends with GOAWAY) or not reached.
                Err(s)
                    if matches!(
                        s.code(),
                        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                    ) || std::error::Error::source(&s)
                        .is_some_and(|e| e.is::<tonic::transport::Error>()) =>
                {
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "unanswered for 60 s: {s:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(s) => panic!("a client saw {s:?}"),
            }
        }
    }
    let clients: Vec<_> = (0..4u64)
        .map(|k| {
            let (current, stop) = (Arc::clone(&current), Arc::clone(&stop));
            rt.spawn(async move {
                let mut held: Vec<pb::Extent> = Vec::new();
                let mut longest = Duration::ZERO;
                let mut seq = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    seq += 1;
                    let id = (k + 1) << 32 | seq;
                    let (r, waited) = until_answered(&current, |c| async move {
                        let r = c
                            .rpc()
                            .allocate(pb::AllocateRequest {
                                device: device0(),
                                count: 1,
                                size: Some(pb::allocate_request::Size::Blocks(1 + seq % 8)),
                                request_id: id,
                                ..Default::default()
                            })
                            .await?;
                        Ok(r.into_inner())
                    })
                    .await;
                    longest = longest.max(waited);
                    held.extend(r.objects.into_iter().flat_map(|o| o.extents));
                    // Every third call frees, and every call once 64 are
                    // held: the device never fills.
                    if held.len() > 64 || seq.is_multiple_of(3) {
                        seq += 1;
                        let id = (k + 1) << 32 | seq;
                        let x = held.swap_remove(held.len() / 2);
                        let (_, waited) = until_answered(&current, |c| async move {
                            c.rpc()
                                .free(pb::FreeRequest {
                                    device: device0(),
                                    extents: vec![x],
                                    request_id: id,
                                    ..Default::default()
                                })
                                .await
                        })
                        .await;
                        longest = longest.max(waited);
                    }
                }
                (held, longest, seq)
            })
        })
        .collect();
    for round in 1..=rounds {
        std::thread::sleep(Duration::from_millis(300));
        let (standby, rx, _, _) = fail_over(dir.path(), &e, round, &owner);
        let (next, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        *current.lock().unwrap() = next;
        owner.wait(Duration::from_secs(60));
        owner = standby;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let mut held = Vec::new();
    let mut calls = 0;
    for c in clients {
        let (h, longest, seq) = rt.block_on(c).unwrap();
        println!(
            "a client: {seq} calls, longest wait {} ms",
            longest.as_millis()
        );
        calls += seq;
        held.extend(h);
    }
    assert!(calls > 0);
    held.sort_by_key(|x| x.start);
    for w in held.windows(2) {
        assert!(
            w[0].start + w[0].len <= w[1].start,
            "{:?} and {:?} overlap",
            w[0],
            w[1]
        );
    }
    let addr = current.lock().unwrap().clone();
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    for x in &held {
        let r = rt.block_on(c.rpc().free(pb::FreeRequest {
            device: device0(),
            extents: vec![*x],
            ..Default::default()
        }));
        assert!(
            r.is_ok(),
            "{x:?} was not allocated on the last owner: {r:?}"
        );
    }
    let st = rt.block_on(c.status()).unwrap();
    assert_eq!(st[0].leases, 0);
    drop(owner);
}
