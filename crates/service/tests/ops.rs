//! The service as an operator runs it: TLS and mutual TLS, Prometheus
//! metrics, health while opening and draining, the lease listing of
//! Status. Real tonic servers on `127.0.0.1:0` over in-memory stores.

#[path = "common/certs.rs"]
mod certs;
mod common;
#[path = "common/scrape.rs"]
mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use blockalloc_client::{Client, ClientError, ConnectOptions, DeviceId, TlsOptions};
use blockalloc_service::pb;
use blockalloc_service::{
    Config, Launch, Metrics, ServeError, ServedDevice, Server, TlsError, TlsFiles,
};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use scrape::{scrape, value, Endpoint};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

fn mem_server(cfg: Config) -> Server {
    let store = Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap();
    Server::new(vec![ServedDevice::new("dev0", Arc::new(store))], cfg).unwrap()
}

fn quick() -> Config {
    Config {
        lease_ttl: Duration::from_millis(300),
        expiry_interval: Duration::from_millis(50),
        lease_initial_blocks: 256,
        lease_max_blocks: 4096,
        ..Config::default()
    }
}

/// A server serving until `stop`.
struct Running {
    addr: SocketAddr,
    metrics: Metrics,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Running {
    async fn start(cfg: Config) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let launch = Launch::start(listener, &cfg).await.unwrap();
        let metrics = launch.metrics();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(launch.serve(mem_server(cfg), async {
            let _ = rx.await;
        }));
        Running {
            addr,
            metrics,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        (&mut self.task).await.unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tls_config(pki: &certs::Pki, client_ca: bool) -> Config {
    Config {
        tls: Some(TlsFiles {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca: client_ca.then(|| pki.ca.clone()),
        }),
        require_tls: true,
        ..quick()
    }
}

fn trusting(ca: &std::path::Path, identity: Option<&certs::Pki>) -> ConnectOptions {
    ConnectOptions {
        tls: Some(
            TlsOptions::from_files(
                Some(ca),
                identity.map(|p| p.client_cert.as_path()),
                identity.map(|p| p.client_key.as_path()),
                None,
            )
            .unwrap(),
        ),
        require_tls: true,
        ..ConnectOptions::default()
    }
}

/// Connects and makes one call; the error of whichever fails.
async fn one_call(addr: &str, opts: &ConnectOptions) -> Result<Vec<Extent>, ClientError> {
    let c = Client::connect_with(addr, opts).await?;
    c.allocate(&DeviceId::default(), 1, 8, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_serves_only_clients_that_trust_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let srv = Running::start(tls_config(&pki, false)).await;
    let port = srv.addr.port();
    // By name and by IP address; bare host:port means https when TLS
    // settings are given.
    for addr in [
        format!("https://localhost:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let got = one_call(&addr, &trusting(&pki.ca, None)).await;
        assert_eq!(got.unwrap().len(), 1, "{addr}");
    }
    // A client trusting another CA fails the handshake.
    let other = one_call(
        &format!("https://localhost:{port}"),
        &trusting(&pki.other_ca, None),
    )
    .await;
    assert!(
        matches!(other, Err(ClientError::Unavailable(_))),
        "{other:?}"
    );
    // A plaintext client gets no answer from a TLS listener.
    let plain = one_call(&srv.addr.to_string(), &ConnectOptions::default()).await;
    assert!(plain.is_err(), "plaintext call to a TLS server: {plain:?}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_requiring_tls_refuses_plaintext_addresses() {
    let srv = Running::start(quick()).await;
    let plain = format!("http://{}", srv.addr);
    let opts = ConnectOptions {
        tls: None,
        require_tls: true,
        ..ConnectOptions::default()
    };
    for addr in [plain.clone(), srv.addr.to_string()] {
        let e = Client::connect_with(&addr, &opts).await.unwrap_err();
        assert!(
            matches!(&e, ClientError::Config(m) if m.contains("TLS is required")),
            "{e}"
        );
    }
    // TLS settings with an http:// address are a contradiction, not a
    // silent downgrade.
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let mut o = trusting(&pki.ca, None);
    o.require_tls = false;
    let e = Client::connect_with(&plain, &o).await.unwrap_err();
    assert!(matches!(e, ClientError::Config(_)), "{e}");
    // Without the requirement, plaintext still works.
    let got = one_call(&plain, &ConnectOptions::default()).await.unwrap();
    assert_eq!(got.len(), 1);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate_from_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let srv = Running::start(tls_config(&pki, true)).await;
    let addr = format!("https://localhost:{}", srv.addr.port());
    let anonymous = one_call(&addr, &trusting(&pki.ca, None)).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let got = one_call(&addr, &trusting(&pki.ca, Some(&pki))).await;
    assert_eq!(got.unwrap().len(), 1);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_files_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a PEM file\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let start = |tls: Option<TlsFiles>, require_tls: bool| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = Config {
            tls,
            require_tls,
            ..quick()
        };
        Launch::start(listener, &cfg).await.map(|_| ())
    };
    let files = |cert: &std::path::Path, key: &std::path::Path| {
        Some(TlsFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: None,
        })
    };
    let e = start(files(&missing, &pki.server_key), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ServeError::Tls(TlsError::Read { .. }))
            && e.to_string().contains("missing.pem"),
        "{e}"
    );
    let e = start(files(&garbage, &pki.server_key), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ServeError::Tls(TlsError::NoPem { .. }))
            && e.to_string().contains("garbage.pem")
            && e.to_string().contains("certificate"),
        "{e}"
    );
    let e = start(files(&pki.server_cert, &garbage), false)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("garbage.pem") && e.to_string().contains("private key"),
        "{e}"
    );
    // A key that is not the certificate's.
    let e = start(files(&pki.server_cert, &pki.client_key), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ServeError::Tls(TlsError::Rejected { .. }))
            && e.to_string().contains("client.key"),
        "{e}"
    );
    // TLS required and not configured: the server does not start.
    let e = start(None, true).await.unwrap_err();
    assert!(matches!(e, ServeError::TlsRequired), "{e}");
    // The client names its bad files too.
    let e = TlsOptions::from_files(Some(&missing), None, None, None).unwrap_err();
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let e = TlsOptions::from_files(Some(&pki.ca), Some(&pki.client_cert), None, None).unwrap_err();
    assert!(matches!(e, ClientError::Config(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_calls_syncs_and_lease_events() {
    // The lease kept below is renewed once, a moment after its grant: a
    // run that a loaded machine delays by more than its TTL is run again.
    common::before_expiry(quick().lease_ttl, || async {
        // Every renewal recalls (unleased free space is always below the
        // whole capacity), so that the recall counter moves too.
        let cfg = Config {
            recall_below_divisor: 1,
            ..quick()
        };
        let srv = Running::start(cfg).await;
        let endpoint = Endpoint::start(srv.metrics.clone()).await;
        let maddr = endpoint.addr;
        let dev = r#"device="dev0",tenant="""#;
        let before = scrape(maddr).await;
        assert_eq!(
            value(
                &before,
                "blockalloc_requests_total{method=\"Allocate\",code=\"OK\"}"
            ),
            0.0
        );
        let used_before = value(&before, &format!("blockalloc_device_used_blocks{{{dev}}}"));
        assert!(used_before > 0.0, "metadata is used: {before}");

        let c = Client::connect(&srv.addr.to_string()).await.unwrap();
        let d = DeviceId::default();
        for _ in 0..3 {
            c.allocate(&d, 2, 16, None).await.unwrap();
        }
        let bad = c.free(&d, &[Extent::new(1 << 40, 1).unwrap()]).await;
        assert_eq!(bad.unwrap_err().code(), Some(Code::InvalidArgument));
        let mut rpc = c.rpc();
        let lease = |client: &str| pb::LeaseRequest {
            device: None,
            client_id: client.into(),
            min_blocks: 64,
            want_blocks: 64,
            hint: None,
            ..Default::default()
        };
        let kept = rpc.lease(lease("keeper")).await.unwrap().into_inner();
        let renewed = rpc
            .renew(pb::RenewRequest {
                lease_id: kept.lease_id,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(renewed.recall);
        let dropped = rpc.lease(lease("silent")).await.unwrap().into_inner();
        // Let the silent one expire (the kept one too; both count).
        let t = Instant::now();
        let after = loop {
            let text = scrape(maddr).await;
            if value(&text, &format!("blockalloc_lease_expiries_total{{{dev}}}")) >= 1.0 {
                break text;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no expiry: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = dropped;
        let get = |s: &str| value(&after, s);
        assert_eq!(
            get("blockalloc_requests_total{method=\"Allocate\",code=\"OK\"}"),
            3.0
        );
        assert_eq!(
            get("blockalloc_requests_total{method=\"Free\",code=\"INVALID_ARGUMENT\"}"),
            1.0
        );
        assert_eq!(
            get("blockalloc_requests_total{method=\"Lease\",code=\"OK\"}"),
            2.0
        );
        assert_eq!(
            get("blockalloc_request_duration_seconds_count{method=\"Allocate\"}"),
            3.0
        );
        assert!(get("blockalloc_request_duration_seconds_sum{method=\"Allocate\"}") > 0.0);
        assert!(
            get(&format!(
                "blockalloc_journal_sync_duration_seconds_count{{{dev}}}"
            )) >= 3.0
        );
        assert!(
            get(&format!(
                "blockalloc_group_commit_transactions_sum{{{dev}}}"
            )) >= 3.0
        );
        assert_eq!(get(&format!("blockalloc_lease_grants_total{{{dev}}}")), 2.0);
        // Every call was answered: none waits for the device's owner.
        assert_eq!(
            get(&format!("blockalloc_device_queued_calls{{{dev}}}")),
            0.0
        );
        assert_eq!(
            get(&format!("blockalloc_lease_recalls_total{{{dev}}}")),
            1.0
        );
        assert_eq!(
            get(&format!("blockalloc_device_used_blocks{{{dev}}}")),
            used_before + 3.0 * 2.0 * 16.0
        );
        // Both leases expire eventually; then nothing is leased.
        let t = Instant::now();
        loop {
            let text = scrape(maddr).await;
            if value(&text, &format!("blockalloc_leases{{{dev}}}")) == 0.0 {
                assert_eq!(
                    value(&text, &format!("blockalloc_device_leased_blocks{{{dev}}}")),
                    0.0
                );
                let fragments = format!("blockalloc_device_leased_fragment_blocks{{{dev}}} ");
                assert!(text.contains(&fragments), "{text}");
                assert_eq!(value(&text, fragments.trim_end()), 0.0);
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "leases left: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        srv.stop().await;
        endpoint.stop().await;
    })
    .await;
}

async fn health(addr: SocketAddr) -> ServingStatus {
    let (whole, svc) = health_pair(addr).await;
    assert_eq!(whole, svc, "the server and its service agree");
    whole
}

/// Waits (30 s at most) until the whole server and the Allocator service
/// both report `want`: the two names change one after the other.
async fn await_health(addr: SocketAddr, want: ServingStatus) {
    let t = Instant::now();
    while health_pair(addr).await != (want, want) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "health never turned {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The health of the whole server and of the Allocator service, asked one
/// after the other (a change between the two shows as a disagreement).
async fn health_pair(addr: SocketAddr) -> (ServingStatus, ServingStatus) {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(ch);
    let whole = h
        .check(HealthCheckRequest { service: "".into() })
        .await
        .unwrap()
        .into_inner()
        .status();
    let svc = h
        .check(HealthCheckRequest {
            service: "blockalloc.v1.Allocator".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status();
    (whole, svc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_while_devices_open_and_while_draining() {
    let grace = Duration::from_secs(2);
    let cfg = Config {
        drain_grace: grace,
        ..quick()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let launch = Launch::start(listener, &cfg).await.unwrap();
    // Opening: listening, NOT_SERVING, calls UNAVAILABLE.
    assert_eq!(health(addr).await, ServingStatus::NotServing);
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let e = c
        .allocate(&DeviceId::default(), 1, 8, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Unavailable(m) if m.contains("opening")),
        "{e}"
    );
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(launch.serve(mem_server(cfg), async {
        let _ = rx.await;
    }));
    // The whole server and its service turn one after the other.
    await_health(addr, ServingStatus::Serving).await;
    c.allocate(&DeviceId::default(), 1, 8, None).await.unwrap();
    // Draining: NOT_SERVING, yet calls are still answered. The grace
    // starts after the send: until `grace` after it the server serves.
    let draining = Instant::now();
    tx.send(()).unwrap();
    await_health(addr, ServingStatus::NotServing).await;
    let finished = task.is_finished();
    let answered = c.allocate(&DeviceId::default(), 1, 8, None).await;
    // A machine loaded enough to spend the whole grace before this point
    // proves nothing either way.
    if draining.elapsed() < grace {
        assert!(!finished, "the drain grace is not over");
        answered.unwrap();
    }
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_the_live_leases_with_their_holders() {
    let srv = Running::start(Config {
        lease_ttl: Duration::from_secs(30),
        ..quick()
    })
    .await;
    let c = Client::connect(&srv.addr.to_string()).await.unwrap();
    let st = c.status_with_leases().await.unwrap();
    assert!(st.leases.is_empty());
    let mut rpc = c.rpc();
    let l = rpc
        .lease(pb::LeaseRequest {
            device: None,
            client_id: "alice".into(),
            min_blocks: 64,
            want_blocks: 128,
            hint: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let granted: u64 = l.extents.iter().map(|e| e.len).sum();
    let first = l.extents[0];
    rpc.commit(pb::CommitRequest {
        lease_id: l.lease_id,
        sequence: 1,
        allocations: vec![pb::Extent {
            start: first.start,
            len: 8,
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    let st = c.status_with_leases().await.unwrap();
    assert_eq!(st.leases.len(), 1, "{st:?}");
    let s = &st.leases[0];
    assert_eq!(s.lease_id, l.lease_id);
    assert_eq!(s.client_id, "alice");
    assert_eq!((s.device_index, s.device_name.as_str()), (0, "dev0"));
    assert_eq!(s.granted_blocks, granted);
    assert_eq!(s.unused_blocks, granted - 8);
    assert!(
        s.expires_in_ms <= 30_000 && s.expires_in_ms > 20_000,
        "{s:?}"
    );
    assert_eq!(st.devices[0].leased_unused_blocks, granted - 8);
    // Plain Status stays as it was: no lease list unless asked.
    let plain = c.status().await.unwrap();
    assert_eq!(plain[0].leases, 1);
    rpc.release(pb::ReleaseRequest {
        lease_id: l.lease_id,
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(c.status_with_leases().await.unwrap().leases.is_empty());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_of_a_tls_server_is_told_to_connect_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let srv = Running::start(tls_config(&pki, false)).await;
    let addr = srv.addr.to_string();
    let c = Client::connect(&addr).await.unwrap();
    let told = |e: ClientError| {
        let m = e.to_string();
        assert!(
            matches!(e, ClientError::Config(_))
                && m.contains("serves TLS")
                && m.contains(&format!("https://{addr}"))
                && m.contains("--tls-ca"),
            "{m}"
        );
    };
    told(c.status().await.unwrap_err());
    told(
        c.allocate(&DeviceId::default(), 1, 8, None)
            .await
            .unwrap_err(),
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutual_tls_server_contacted_without_a_client_certificate_says_to_give_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::make(dir.path());
    let srv = Running::start(tls_config(&pki, true)).await;
    let addr = format!("https://localhost:{}", srv.addr.port());
    let c = Client::connect_with(&addr, &trusting(&pki.ca, None))
        .await
        .unwrap();
    let told = |e: ClientError| {
        let m = e.to_string();
        assert!(
            matches!(e, ClientError::Config(_))
                && m.contains("requires a client certificate")
                && m.contains("--tls-client-cert"),
            "{m}"
        );
    };
    told(c.status().await.unwrap_err());
    told(
        c.allocate(&DeviceId::default(), 1, 8, None)
            .await
            .unwrap_err(),
    );
    srv.stop().await;
}

/// `Server::fence_with`: while the fence says so, every call is
/// UNAVAILABLE (nothing acknowledged) and health is NOT_SERVING; when it
/// lifts, both come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_server_refuses_every_call_and_reports_not_serving_until_the_fence_lifts() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cfg = quick();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let launch = Launch::start(listener, &cfg).await.unwrap();
    let metrics = launch.metrics();
    let text = move || {
        let m = metrics.clone();
        async move {
            tokio::task::spawn_blocking(move || m.encode())
                .await
                .unwrap()
        }
    };
    let server = mem_server(cfg);
    let fenced = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&fenced);
    server.fence_with(Arc::new(move || f.load(Ordering::SeqCst)));
    let (_topology, topology_rx) = tokio::sync::watch::channel(pb::Topology {
        revision: 1,
        ..Default::default()
    });
    server.topology_from(topology_rx);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(launch.serve(server, async {
        let _ = rx.await;
    }));
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let kept = c.allocate(&DeviceId::Index(0), 1, 4, None).await.unwrap();
    // Calls are answered before health turns: it follows within moments.
    await_health(addr, ServingStatus::Serving).await;
    let watch = || async {
        c.rpc()
            .watch_topology(pb::WatchTopologyRequest {})
            .await
            .map(|r| r.into_inner())
    };
    let mut topology = watch().await.unwrap();
    assert_eq!(topology.message().await.unwrap().unwrap().revision, 1);

    fenced.store(true, Ordering::SeqCst);
    // A fenced member's topology may be stale: its stream ends, and a new
    // one is refused, so that clients ask another member.
    let e = topology.message().await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(watch().await.unwrap_err().code(), Code::Unavailable);
    let mut rpc = c.rpc();
    let r = rpc
        .allocate(pb::AllocateRequest {
            device: Some(pb::DeviceRef {
                r#ref: Some(pb::device_ref::Ref::Index(0)),
            }),
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(4)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(r.code(), Code::Unavailable, "{r:?}");
    assert!(r.message().contains("cluster lease"), "{r:?}");
    let free = rpc
        .free(pb::FreeRequest {
            device: Some(pb::DeviceRef {
                r#ref: Some(pb::device_ref::Ref::Index(0)),
            }),
            extents: vec![pb::Extent {
                start: kept[0].start(),
                len: kept[0].len(),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(free.code(), Code::Unavailable);
    await_health(addr, ServingStatus::NotServing).await;
    let m = text().await;
    assert!(m.contains("blockalloc_cluster_fenced 1\n"), "{m}");
    assert!(
        m.contains("blockalloc_cluster_fenced_events_total 1\n"),
        "{m}"
    );
    fenced.store(false, Ordering::SeqCst);
    await_health(addr, ServingStatus::Serving).await;
    assert!(text().await.contains("blockalloc_cluster_fenced 0\n"));
    // The refused free did not run: the extent is still allocated, once.
    c.free(&DeviceId::Index(0), &kept).await.unwrap();
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

/// A fenced server writes nothing to its devices, not even the expiry of a
/// lease that ends while it is fenced (an owner paused past its cluster
/// lease wakes to leases that all ended): its stores are fenced too. Once
/// the fence lifts it writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_server_writes_nothing_even_when_its_leases_expire() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dev = Arc::new(MemDevice::new(64 << 20));
    let store = Store::format(Arc::clone(&dev), FormatOptions::default()).unwrap();
    let server = Server::new(vec![ServedDevice::new("dev0", Arc::new(store))], quick()).unwrap();
    let fenced = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&fenced);
    server.fence_with(Arc::new(move || f.load(Ordering::SeqCst)));
    let s = common::TestServer::serving(server).await;
    let c = s.client().await;
    let lease = c
        .rpc()
        .lease(pb::LeaseRequest {
            client_id: "x".into(),
            min_blocks: 8,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(lease.lease_id != 0);
    fenced.store(true, Ordering::SeqCst);
    let image = dev.image();
    // Ten TTLs: the lease expired and its expiry was due many times over.
    tokio::time::sleep(quick().lease_ttl * 10).await;
    assert!(dev.image() == image, "a fenced server wrote to its device");
    fenced.store(false, Ordering::SeqCst);
    c.allocate(&DeviceId::Index(0), 1, 4, None).await.unwrap();
    assert!(dev.image() != image, "writes again once the fence lifts");
    s.stop().await;
}
