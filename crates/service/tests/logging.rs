//! What a client's mistakes write to the server's log: never an ERROR
//! line (those are for the server's own faults), and at most one line per
//! method and status code each second, however fast they come.
//!
//! One test per binary: it installs the process's tracing subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockalloc_service::pb;
use bytes::Bytes;

mod common;
use common::{frame, quick, RawConn, TestServer};

/// The log as the server writes it, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Regression: every undecodable body and client-reset stream was an
/// ERROR line (15 360 of them in 80 s of abuse) and every refusal a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_never_errors_and_repeats_are_rate_limited() {
    let log = Captured::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(log.clone())
            .finish(),
    )
    .unwrap();
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let t = Instant::now();
    let mut raw = RawConn::connect(srv.addr).await;
    const ROUNDS: usize = 150;
    for _ in 0..ROUNDS {
        // An undecodable body, and a frame with an invalid compression flag.
        let r = raw.call("Allocate", frame(&[0xff; 7])).await;
        assert_eq!(r.code, Some(tonic::Code::Internal), "{r:?}");
        let r = raw
            .call("Status", Bytes::from_static(&[2, 0, 0, 0, 0]))
            .await;
        assert!(r.code.is_some_and(|c| c != tonic::Code::Ok), "{r:?}");
        // A malformed request.
        let e = c
            .rpc()
            .allocate(pb::AllocateRequest {
                count: 0,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        // Streams the client resets halfway through their request.
        for reason in [h2::Reason::CANCEL, h2::Reason::NO_ERROR] {
            let (resp, mut send) = raw.open("Free", &[]).await;
            send.send_data(Bytes::from_static(&[0, 0, 0, 0, 100, 1, 2]), false)
                .unwrap();
            send.send_reset(reason);
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                let _ = resp.await;
            })
            .await;
        }
    }
    // Once the interval has passed, the next line counts those left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    raw.call("Allocate", frame(&[0xff; 7])).await;
    // The server still serves, and its answers are in the log once it
    // stops.
    let r = raw.call("Status", frame(&[])).await;
    assert_eq!(r.code, Some(tonic::Code::Ok), "{r:?}");
    drop(raw);
    srv.stop().await;
    let elapsed = t.elapsed().as_secs();
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "ERROR lines for client mistakes:\n{}",
        errors.join("\n")
    );
    // At most one line per (method, code) and second: a handful of keys
    // here, far fewer lines than the calls.
    let calls: Vec<&str> = text.lines().filter(|l| l.contains("call ")).collect();
    let keys = 8;
    assert!(
        calls.len() as u64 <= keys * (elapsed + 2),
        "{} lines in {elapsed} s:\n{text}",
        calls.len()
    );
    assert!(
        calls.iter().any(|l| !l.contains("suppressed=0")),
        "the lines left out are counted:\n{text}"
    );
}
