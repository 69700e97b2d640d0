//! The server around the service: the health service, idle pollers.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::time::Duration;

use blockalloc_client::DeviceId;
use blockalloc_service::Config;

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

/// With `idle_poll_us` the server runs a poller per CPU while it lives and
/// serves as without; the pollers end with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pollers_run_with_the_server_and_stop_with_it() {
    let before = threads_named("idle-poll");
    let srv = TestServer::start(
        &[64 << 20],
        Config {
            idle_poll_us: 500,
            ..quick()
        },
    )
    .await;
    // A thread takes its name when it first runs.
    let t = std::time::Instant::now();
    while threads_named("idle-poll") <= before {
        assert!(t.elapsed() < Duration::from_secs(60), "no poller runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = srv.client().await;
    let d = DeviceId::Index(0);
    for _ in 0..50 {
        let e = c.allocate(&d, 1, 8, None).await.unwrap();
        c.free(&d, &e).await.unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.stop().await;
    drop(c);
    let t = std::time::Instant::now();
    while threads_named("idle-poll") > before {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the pollers outlive the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
