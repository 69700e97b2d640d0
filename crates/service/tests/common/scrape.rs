//! Reading a Prometheus endpoint in tests.

#![allow(dead_code)] // Each test file uses some of the helpers.

use std::net::SocketAddr;

use blockalloc_service::Metrics;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// `metrics` served on a loopback port until [`Endpoint::stop`].
pub struct Endpoint {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Endpoint {
    pub async fn start(metrics: Metrics) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            metrics
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });
        Endpoint { addr, stop, task }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// The text of `GET http://addr/metrics`.
pub async fn scrape(addr: SocketAddr) -> String {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let resp = client
        .get(format!("http://{addr}/metrics").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of one series (`name{labels}`), 0 when absent.
pub fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}
