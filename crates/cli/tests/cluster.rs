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
/// `s{round}`, waits until it is registered and `known(name)`, then ends `owner` (server
/// `s{round-1}`) by SIGKILL, SIGTERM or `cluster drain`, in turn by round.
/// Returns the standby, its `listening on` channel (see [`spawn_serve`]),
/// how the owner ended and when.
fn fail_over(
    dir: &std::path::Path,
    etcd: &str,
    round: usize,
    owner: &Proc,
    known: &dyn Fn(&str) -> bool,
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
        || !known(&name)
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
        let (standby, rx, kind, t0) = fail_over(dir.path(), &e, round, &owner, &|_| true);
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

/// An owner paused (SIGSTOP) past its etcd lease, with a client's lease
/// outstanding that ends meanwhile, wakes and writes nothing to its device
/// — not the allocation a client asks of it, not the expiry of the lease,
/// not a close — and exits: the device file is byte for byte as it was
/// when the pause began. (No standby here: nothing else writes.)
#[test]
fn an_owner_that_wakes_past_its_lease_writes_nothing_to_its_device() {
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("d0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut a, rx) = spawn_serve(
        &dev,
        &e,
        "a",
        &["--lease-ttl", "1"],
        &dir.path().join("a.log"),
    );
    let (addr, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let c = rt.block_on(Client::connect(&addr)).unwrap();
    let lease = rt
        .block_on(c.rpc().lease(pb::LeaseRequest {
            device: device0(),
            client_id: "x".into(),
            min_blocks: 8,
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert!(lease.lease_id != 0);
    a.signal("-STOP");
    // Its etcd lease ends while it sleeps (its server key goes with it).
    let t = Instant::now();
    while status(&e, "c")["servers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == "a")
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "a's etcd lease never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = std::fs::read(&dev).unwrap();
    a.signal("-CONT");
    if let Ok(epoch) = rt.block_on(allocate_once(&addr)) {
        panic!("the woken owner acknowledged an allocation (epoch {epoch})");
    }
    let code = a.wait(Duration::from_secs(60));
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    assert!(
        std::fs::read(&dev).unwrap() == before,
        "the woken owner wrote to its device"
    );
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

/// Device d0 of cluster `c` on a fresh etcd, owned by server `s0`: the
/// etcd, the directory, the owner and its address.
fn one_owner() -> (Etcd, tempfile::TempDir, Proc, String) {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (owner, rx) = spawn_serve(
        &dir.path().join("d0"),
        &etcd.endpoint(),
        "s0",
        &[],
        &dir.path().join("s0.log"),
    );
    let (addr, _) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    (etcd, dir, owner, addr)
}

/// [`failovers`] failovers of d0 from `owner` ([`fail_over`], each
/// standby killed once `known` by the clients), `pause` apart; returns
/// the last owner.
fn fail_over_rounds(
    dir: &std::path::Path,
    etcd: &str,
    mut owner: Proc,
    pause: Duration,
    known: &dyn Fn(&str) -> bool,
) -> Proc {
    for round in 1..=failovers() {
        std::thread::sleep(pause);
        let (standby, rx, _, _) = fail_over(dir, etcd, round, &owner, known);
        rx.recv_timeout(Duration::from_secs(60)).unwrap();
        owner.wait(Duration::from_secs(60));
        owner = standby;
    }
    std::thread::sleep(pause);
    owner
}

/// Every extent of `held` (acknowledged on d0 and not freed) is allocated
/// once: they are disjoint, and each frees once on d0's owner.
fn assert_held_once(
    rt: &tokio::runtime::Runtime,
    cluster: &blockalloc_client::Cluster,
    mut held: Vec<blockalloc::Extent>,
) {
    held.sort_by_key(|x| x.start());
    for w in held.windows(2) {
        assert!(
            w[0].end() <= w[1].start(),
            "{:?} and {:?} overlap",
            w[0],
            w[1]
        );
    }
    for x in &held {
        let r = rt.block_on(cluster.free("d0", &[*x]));
        assert!(
            r.is_ok(),
            "{x:?} was not allocated on the last owner: {r:?}"
        );
    }
}

/// Failovers (as in the test above) while four clients allocate and free
/// on the device through `Cluster` handles that know one seed server: each
/// learns the topology from the servers, and a call that finds no owner
/// (refused, UNAVAILABLE, cut) is sent again, with the same request id, to
/// the device's owner of the moment. No error may reach a client. At the
/// end every block acknowledged and not freed is allocated exactly once:
/// the acknowledged extents are disjoint and each frees once on the last
/// owner; a resend after a lost reply never allocated twice.
#[test]
fn clients_through_failovers_get_every_call_answered_once() {
    use blockalloc::Extent;
    use blockalloc_client::{Cluster, ConnectOptions};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (etcd, dir, owner, addr) = one_owner();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let handles: Vec<Cluster> = (0..4)
        .map(|_| {
            rt.block_on(Cluster::connect(&[&addr], &ConnectOptions::default(), None))
                .unwrap()
        })
        .collect();
    let clients: Vec<_> = handles
        .iter()
        .map(|cluster| {
            let (cluster, stop) = (cluster.clone(), Arc::clone(&stop));
            rt.spawn(async move {
                let mut held: Vec<Extent> = Vec::new();
                let mut longest = Duration::ZERO;
                let mut calls = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    calls += 1;
                    let t = Instant::now();
                    let got = cluster
                        .allocate_on("d0", 1, 1 + calls % 8, None)
                        .await
                        .unwrap_or_else(|e| panic!("a client saw {e:?}"));
                    longest = longest.max(t.elapsed());
                    held.extend(got);
                    // Every third call frees, and every call once 64 are
                    // held: the device never fills.
                    if held.len() > 64 || calls.is_multiple_of(3) {
                        calls += 1;
                        let x = held.swap_remove(held.len() / 2);
                        let t = Instant::now();
                        cluster
                            .free("d0", &[x])
                            .await
                            .unwrap_or_else(|e| panic!("a client saw {e:?}"));
                        longest = longest.max(t.elapsed());
                    }
                }
                (held, longest, calls)
            })
        })
        .collect();
    // A client finds the next owner among the servers it heard of: the
    // standby is killed only once every client knows it (as servers of a
    // deployment are known before they are needed).
    let known = |name: &str| {
        handles
            .iter()
            .all(|c| c.topology().servers.iter().any(|s| s.name == name))
    };
    let pause = Duration::from_millis(300);
    let owner = fail_over_rounds(dir.path(), &etcd.endpoint(), owner, pause, &known);
    stop.store(true, Ordering::SeqCst);
    let mut held = Vec::new();
    let mut calls = 0;
    for c in clients {
        let (h, longest, n) = rt.block_on(c).unwrap();
        println!(
            "a client: {n} calls, longest wait {} ms",
            longest.as_millis()
        );
        calls += n;
        held.extend(h);
    }
    assert!(calls > 0);
    let cluster = &handles[0];
    assert_held_once(&rt, cluster, held);
    let addr = rt.block_on(async {
        loop {
            let t = cluster.topology();
            if let Some(d) = t.devices.iter().find(|d| d.name == "d0") {
                break d.address.clone();
            }
            cluster.changed().await.unwrap();
        }
    });
    let st = rt
        .block_on(async { Client::connect(&addr).await?.status().await })
        .unwrap();
    assert_eq!(st[0].leases, 0);
    drop(owner);
}

/// Object sizes in blocks, 1 to 256 (4 KiB to 1 MiB), from a fixed
/// pseudo-random sequence: the `i`th request of the placement test.
fn object_blocks(i: u64) -> u64 {
    let mut z = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    1 + (z ^ (z >> 29)) % 256
}

/// Placement across a cluster: four servers (labels `zone=0`/`zone=1`),
/// two devices each, the servers' devices 2 GiB or 1 GiB. Objects
/// restricted to a label land only on its devices. Then eight clients
/// (each its own `Cluster`, knowing one seed) place objects of 4 KiB to
/// 1 MiB anywhere until the first refusal (no device has
/// room): at that moment the devices' used fractions are within 1 point of
/// each other, and the cluster's used fraction within 0.1 point of what
/// the same requests reach on one engine per device (each request on the
/// device with the most free space, by exact counts). Prints the figures
/// (`--nocapture`).
#[test]
fn placement_fills_every_device_of_the_cluster_evenly() {
    use blockalloc_client::{ClientError, Cluster, ConnectOptions, Placement};
    use blockalloc_store::device::MemDevice;
    use blockalloc_store::{FormatOptions, Store};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let sizes = ["2GiB", "2GiB", "1GiB", "1GiB"];
    let mut servers = Vec::new();
    for (k, size) in sizes.iter().enumerate() {
        let (d0, d1) = (
            dir.path().join(format!("d{}", 2 * k)),
            dir.path().join(format!("d{}", 2 * k + 1)),
        );
        let args: Vec<String> = [
            "--device",
            d0.to_str().unwrap(),
            "--device",
            d1.to_str().unwrap(),
            "--format",
            size,
            "--sparse",
            "--listen",
            "127.0.0.1:0",
            "--etcd",
            &e,
            "--cluster",
            "p",
            "--server-name",
            &format!("s{k}"),
            "--label",
            &format!("zone={}", k % 2),
        ]
        .map(String::from)
        .to_vec();
        servers.push(serve_args_logged(
            &strs(&args),
            &dir.path().join(format!("s{k}.log")),
        ));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seed = servers[0].1.clone();
    let connect = || {
        rt.block_on(Cluster::connect(&[&seed], &ConnectOptions::default(), None))
            .unwrap()
    };
    let first = connect();
    // Every device with its space published.
    let topology = rt.block_on(async {
        loop {
            let t = first.topology();
            if t.devices.len() == 8 && t.devices.iter().all(|d| d.space_known) {
                break t;
            }
            first.changed().await.unwrap();
        }
    });
    let zone = |dev: &str| {
        let d = topology.devices.iter().find(|d| d.name == dev).unwrap();
        d.labels
            .iter()
            .find(|l| l.starts_with("zone="))
            .unwrap()
            .clone()
    };
    for i in 0..32 {
        let p = rt
            .block_on(first.allocate(&Placement::default().with_label("zone=1"), 1, 1 + i))
            .unwrap();
        assert_eq!(zone(&p.device), "zone=1", "{p:?}");
        rt.block_on(first.free(&p.device, &p.extents)).unwrap();
    }
    // `cluster status` shows each server's labels.
    for s in status(&e, "p")["servers"].as_array().unwrap() {
        let k: usize = s["name"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(
            s["labels"],
            serde_json::json!([format!("zone={}", k % 2)]),
            "{s}"
        );
    }
    let none = rt.block_on(first.allocate(&Placement::default().with_label("zone=9"), 1, 1));
    assert!(matches!(none, Err(ClientError::NoSpace { .. })), "{none:?}");

    // Eight clients fill the cluster: to half its capacity, then to the
    // first refusal.
    let capacity: u64 = topology.devices.iter().map(|d| d.capacity_blocks).sum();
    let handles: Vec<Cluster> = (0..8).map(|_| connect()).collect();
    let next = Arc::new(AtomicU64::new(0));
    let allocated = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let fill = |until: u64| {
        let clients: Vec<_> = handles
            .iter()
            .map(|cluster| {
                let cluster = cluster.clone();
                let (next, allocated, failed) = (
                    Arc::clone(&next),
                    Arc::clone(&allocated),
                    Arc::clone(&failed),
                );
                rt.spawn(async move {
                    while !failed.load(Ordering::SeqCst) && allocated.load(Ordering::SeqCst) < until
                    {
                        let blocks = object_blocks(next.fetch_add(1, Ordering::SeqCst));
                        match cluster.allocate(&Placement::default(), 1, blocks).await {
                            Ok(_) => {
                                allocated.fetch_add(blocks, Ordering::SeqCst);
                            }
                            Err(ClientError::NoSpace { .. }) => {
                                failed.store(true, Ordering::SeqCst)
                            }
                            Err(e) => panic!("a client saw {e:?}"),
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            rt.block_on(c).unwrap();
        }
    };
    // Each device's used fraction, and the used and capacity blocks of all.
    let used_now = || {
        let mut used = Vec::new();
        let (mut all_used, mut all_capacity) = (0u64, 0u64);
        for (_, addr) in &servers {
            let c = rt.block_on(Client::connect(addr)).unwrap();
            for d in rt.block_on(c.status()).unwrap() {
                used.push((
                    d.name.clone(),
                    d.used_blocks as f64 / d.capacity_blocks as f64,
                ));
                all_used += d.used_blocks;
                all_capacity += d.capacity_blocks;
            }
        }
        let (lo, hi) = used
            .iter()
            .fold((1f64, 0f64), |(lo, hi), u| (lo.min(u.1), hi.max(u.1)));
        (used, hi - lo, all_used, all_capacity)
    };
    fill(capacity / 2);
    let (half, half_spread, _, _) = used_now();
    fill(u64::MAX);
    let requests = next.load(Ordering::SeqCst);
    let (used, spread, all_used, all_capacity) = used_now();
    let cluster_used = all_used as f64 / all_capacity as f64;
    // The same requests on one engine per device, each on the device with
    // the most free space.
    let stores: Vec<Store> = sizes
        .iter()
        .flat_map(|s| [s, s])
        .map(|s| {
            let bytes = if *s == "2GiB" { 2u64 << 30 } else { 1 << 30 };
            Store::format(MemDevice::new(bytes), FormatOptions::default()).unwrap()
        })
        .collect();
    let mut i = 0;
    'fill: loop {
        let blocks = object_blocks(i);
        i += 1;
        let mut order: Vec<&Store> = stores.iter().collect();
        order.sort_by_key(|s| std::cmp::Reverse(s.free_blocks()));
        for s in order {
            let mut t = s.begin();
            let mut out = Vec::new();
            if t.allocate_each(&[blocks], None, &mut out).is_ok() {
                t.commit().unwrap();
                continue 'fill;
            }
        }
        break;
    }
    let (mut ref_free, mut ref_capacity) = (0u64, 0u64);
    for s in &stores {
        ref_free += s.free_blocks();
        ref_capacity += s.geometry().capacity_blocks();
    }
    let reference = 1.0 - ref_free as f64 / ref_capacity as f64;
    for ((name, h), (_, u)) in half.iter().zip(&used) {
        println!(
            "{name}: {:.3} % used at half, {:.3} % at the first refusal",
            h * 100.0,
            u * 100.0
        );
    }
    println!(
        "at half: spread {:.3} points; at the first refusal (request {requests}): spread {:.3} \
         points; cluster {:.3} % used, one engine per device {:.3} % (request {i})",
        half_spread * 100.0,
        spread * 100.0,
        cluster_used * 100.0,
        reference * 100.0
    );
    // Placement, not the fallback to another device, spreads the objects:
    // at half they are already spread by free space (within a few points:
    // free space is published about once a second).
    assert!(half_spread <= 0.10, "used fractions at half {half:?}");
    assert!(spread <= 0.01, "used fractions {used:?}");
    assert!(
        (cluster_used - reference).abs() <= 0.001,
        "{cluster_used} vs {reference}"
    );
}

/// Failovers (as above) while two `ClusterLeasing` clients allocate inside
/// leases of the device, free, and commit: their leases follow the device
/// to each new owner, which restored them from the journal. Every commit
/// either succeeds or names the allocations it lost (a lease whose deadline
/// passed during a failover); no other error reaches a client. At the end
/// the committed, unfreed allocations are disjoint and each frees once on
/// the last owner. Prints how many commits and losses (`--nocapture`).
#[test]
fn leasing_clients_follow_their_leases_through_failovers() {
    use blockalloc::Extent;
    use blockalloc_client::{
        ClientError, Cluster, ClusterLeasing, ConnectOptions, LeaseOptions, Placement,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (etcd, dir, owner, addr) = one_owner();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = rt
        .block_on(Cluster::connect(&[&addr], &ConnectOptions::default(), None))
        .unwrap();
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (cluster, stop) = (cluster.clone(), Arc::clone(&stop));
            rt.spawn(async move {
                let alloc =
                    ClusterLeasing::new(cluster, Placement::default(), LeaseOptions::default());
                let (mut pending, mut committed): (Vec<Extent>, Vec<Extent>) =
                    (Vec::new(), Vec::new());
                let (mut commits, mut lost) = (0u64, 0usize);
                let mut n = 0u64;
                // Commits what is pending; what a lost lease held is dropped.
                async fn commit(
                    alloc: &ClusterLeasing,
                    pending: &mut Vec<Extent>,
                    committed: &mut Vec<Extent>,
                ) -> usize {
                    let gone = match alloc.commit().await {
                        Ok(()) => Vec::new(),
                        Err(ClientError::Lost { extents }) => extents,
                        Err(e) => panic!("a leasing client saw {e:?}"),
                    };
                    committed.extend(pending.drain(..).filter(|x| !gone.contains(x)));
                    gone.len()
                }
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (device, x) = alloc
                        .allocate(1 + n % 8)
                        .await
                        .unwrap_or_else(|e| panic!("a leasing client saw {e:?}"));
                    assert_eq!(device, "d0");
                    pending.push(x);
                    if n.is_multiple_of(16) {
                        lost += commit(&alloc, &mut pending, &mut committed).await;
                        commits += 1;
                        while committed.len() > 64 {
                            let x = committed.swap_remove(committed.len() / 2);
                            alloc.free("d0", x).await.unwrap();
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                lost += commit(&alloc, &mut pending, &mut committed).await;
                alloc.close().await.unwrap();
                (committed, commits, lost)
            })
        })
        .collect();
    let known = |name: &str| cluster.topology().servers.iter().any(|s| s.name == name);
    let pause = Duration::from_millis(500);
    let owner = fail_over_rounds(dir.path(), &etcd.endpoint(), owner, pause, &known);
    stop.store(true, Ordering::SeqCst);
    let mut held = Vec::new();
    for c in clients {
        let (h, commits, lost) = rt.block_on(c).unwrap();
        println!("a leasing client: {commits} commits, {lost} allocations lost");
        held.extend(h);
    }
    assert_held_once(&rt, &cluster, held);
    drop(owner);
}
