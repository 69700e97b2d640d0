//! The server around the service: the health service, idle pollers.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::sync::Arc;
use std::time::Duration;

use blockalloc_client::DeviceId;
use blockalloc_service::{ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};

mod common;
use common::{quick, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_reports_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", srv.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(ch);
    for service in ["", "blockalloc.v1.Allocator"] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    srv.stop().await;
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Each device has one owner thread while the server runs (named after the
/// device); they end with a graceful stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_device_has_an_owner_thread_that_ends_with_the_server() {
    let devices = ["probe-a", "probe-b"]
        .iter()
        .map(|name| {
            let store = Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap();
            ServedDevice::new(*name, Arc::new(store))
        })
        .collect();
    let srv = TestServer::serving(Server::new(devices, quick()).unwrap()).await;
    // A thread takes its name when it first runs.
    let t = std::time::Instant::now();
    while threads_named("dev:probe-") < 2 {
        assert!(t.elapsed() < Duration::from_secs(60), "no owner threads");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(threads_named("dev:probe-"), 2, "one per device");
    let c = srv.client().await;
    for d in [DeviceId::Index(0), DeviceId::Index(1)] {
        for _ in 0..20 {
            let e = c.allocate(&d, 1, 8, None).await.unwrap();
            c.free(&d, &e).await.unwrap();
        }
    }
    srv.store(0).verify().unwrap();
    srv.stop().await;
    drop(c);
    let t = std::time::Instant::now();
    while threads_named("dev:probe-") > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the owners outlive the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
