//! `serve --etcd`: servers that own their devices through a real etcd
//! (`blockalloc_cluster::testkit`), take them with the owner key's revision
//! as epoch, give them up on SIGTERM, and stop acknowledging when cut off
//! from etcd. `cluster status` shows it.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockalloc_client::pb;
use blockalloc_client::Client;
use blockalloc_cluster::testkit::Etcd;
use common::{serve_args_logged, Proc};
use tokio::net::{TcpListener, TcpStream};

/// `cluster status --json`, parsed.
fn status(etcd: &str, cluster: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args([
            "cluster",
            "status",
            "--etcd",
            etcd,
            "--cluster",
            cluster,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
/// epoch, or the refusal.
async fn allocate_once(addr: &str) -> Result<u64, tonic::Status> {
    let c = Client::connect(addr).await.unwrap();
    let r = c
        .rpc()
        .allocate(pb::AllocateRequest {
            device: Some(pb::DeviceRef {
                r#ref: Some(pb::device_ref::Ref::Index(0)),
            }),
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(1)),
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner().epoch)
}

fn serve(dir: &std::path::Path, etcd: &str, name: &str, ttl: &str) -> (Proc, String) {
    let dev = dir.join("d0");
    serve_args_logged(
        &[
            "--device",
            dev.to_str().unwrap(),
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
            "--etcd-ttl",
            ttl,
        ],
        &dir.join(format!("{name}.log")),
    )
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

    // A second server that reaches a device of the same name is refused it.
    let dev_b = db.path().join("d0");
    let out = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
        .args([
            "serve",
            "--device",
            dev_b.to_str().unwrap(),
            "--format",
            "64MiB",
        ])
        .args(["--listen", "127.0.0.1:0", "--etcd", &e, "--cluster", "c"])
        .args(["--server-name", "b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owned by server \"a\""), "{err}");
    assert!(
        !dev_b.exists(),
        "the refused server created its device: {err}"
    );
    assert_eq!(owner_of(&status(&e, "c"), "d0"), Some(("a".into(), t1)));

    // SIGTERM: a stops and its keys go at once, without waiting for the TTL.
    a.signal("-TERM");
    assert_eq!(a.wait(Duration::from_secs(30)), Some(0));
    let view = status(&e, "c");
    assert_eq!(view["servers"].as_array().unwrap().len(), 0, "{view}");
    assert_eq!(owner_of(&view, "d0"), None);
    let (_b, addr_b) = serve(db.path(), &e, "b", "2");
    let (owner, t2) = owner_of(&status(&e, "c"), "d0").unwrap();
    assert_eq!(owner, "b");
    assert!(t2 > t1, "epoch {t2} after {t1}");
    assert_eq!(rt.block_on(allocate_once(&addr_b)).unwrap(), t2);
}

/// A TCP proxy whose connections can be cut.
struct Proxy {
    addr: String,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(to: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (c2, k2) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                if c2.load(Ordering::SeqCst) {
                    continue;
                }
                let to = to.clone();
                k2.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut t) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut s, &mut t).await;
                    }
                }));
            }
        });
        Proxy { addr, cut, conns }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            for c in self.conns.lock().unwrap().drain(..) {
                c.abort();
            }
        }
    }
}

#[test]
fn a_server_cut_off_from_etcd_stops_acknowledging_before_its_device_can_move_and_then_exits() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt.block_on(Proxy::start(etcd.endpoint()));
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, addr_a) = serve(da.path(), &proxy.addr, "a", "3");
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
        let out = Command::new(env!("CARGO_BIN_EXE_blockalloc"))
            .args([
                "cluster",
                "status",
                "--etcd",
                &etcd.endpoint(),
                "--cluster",
                "c",
                "--json",
            ])
            .output()
            .unwrap();
        let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if owner_of(&view, "d0").is_none() {
            break serve(db.path(), &etcd.endpoint(), "b", "3");
        }
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "a's lease never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        cut.elapsed() >= Duration::from_secs(2),
        "the device moved before a's lease could end"
    );
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
