//! Abuse: junk on the socket, malformed gRPC frames and bodies, extreme
//! values, and the server's limits. Each bad call gets a gRPC status with a
//! message (or, for bytes that are not HTTP/2, a closed connection),
//! changes nothing (every Status before == after, the stores verify), and
//! the server goes on serving everyone else.

use std::time::Duration;

use blockalloc_client::{Client, DeviceId};
use blockalloc_service::{pb, Config, Limits, CLIENT_HEADER};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{Code, Request, Status};

mod common;
use common::{
    before_expiry, expiring, frame, quick, reply, wait_until, RawConn, TestServer, SHORT_TTL,
};

const METHODS: [&str; 7] = [
    "Allocate", "Free", "Status", "Lease", "Commit", "Renew", "Release",
];

/// A server with some committed allocations and a live lease, so that a
/// bad call has something to damage; returns it with its live lease.
async fn busy_server(cfg: Config) -> (TestServer, Client, pb::LeaseResponse) {
    let srv = TestServer::start(&[64 << 20], cfg).await;
    let c = srv.client().await;
    c.allocate(&DeviceId::Index(0), 3, 8, None).await.unwrap();
    let l = c
        .rpc()
        .lease(pb::LeaseRequest {
            client_id: "holder".into(),
            min_blocks: 16,
            want_blocks: 64,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (srv, c, l)
}

/// A well-behaved client still gets its work done: an allocation and its
/// free, which leave the device as it was.
async fn still_serving(c: &Client) {
    let d = DeviceId::Index(0);
    let got = c.allocate(&d, 2, 5, None).await.unwrap();
    c.free(&d, &got).await.unwrap();
}

/// Asserts a refusal with `code` and a message a person can read.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, Status>, code: Code) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), code, "{what}: {}", e.message());
    assert!(!e.message().is_empty(), "{what}: no message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_on_the_socket_closes_that_connection_and_changes_nothing() {
    let (srv, c, _l) = busy_server(quick()).await;
    let before = srv.state().await;
    let mut noise = vec![0u8; 64 << 10];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in &mut noise {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut bad_frames = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bad_frames.extend_from_slice(&noise[..4096]);
    let junk: [(&str, Vec<u8>); 4] = [
        ("random bytes", noise),
        ("HTTP/1.1", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("an HTTP/2 preface and junk frames", bad_frames),
        ("a lone zero byte", vec![0]),
    ];
    for (what, bytes) in junk {
        let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        // The server may close before it has read everything.
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        let mut buf = vec![0u8; 4096];
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server kept a connection that sent {what}"));
        still_serving(&c).await;
    }
    assert_eq!(before, srv.state().await);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_frames_and_bodies_get_a_status_and_change_nothing() {
    let (srv, c, _l) = busy_server(quick()).await;
    let before = srv.state().await;
    let mut raw = RawConn::connect(srv.addr).await;
    let bodies: [(&str, Bytes); 8] = [
        ("no message", Bytes::new()),
        ("a cut length prefix", Bytes::from_static(&[0, 0, 0])),
        (
            "a frame shorter than its length",
            Bytes::from_static(&[0, 0, 0, 0, 100, 8, 1]),
        ),
        (
            "compressed without an encoding",
            Bytes::from_static(&[1, 0, 0, 0, 2, 8, 1]),
        ),
        (
            "an unknown frame flag",
            Bytes::from_static(&[7, 0, 0, 0, 0]),
        ),
        (
            "a length of 4 GiB",
            Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]),
        ),
        ("a body that is not protobuf", frame(&[0xff; 16])),
        (
            "a field with a wire type protobuf does not have",
            frame(&[0x0f, 1, 2, 3]),
        ),
    ];
    for method in METHODS {
        for (what, body) in &bodies {
            let r = raw.call(method, body.clone()).await;
            let code = r.code.unwrap_or_else(|| panic!("{method}, {what}: {r:?}"));
            assert_ne!(code, Code::Ok, "{method}, {what}: accepted");
            assert!(!r.message.is_empty(), "{method}, {what}: no message");
        }
    }
    let r = raw.call("Defragment", frame(&[])).await;
    assert_eq!(r.code, Some(Code::Unimplemented), "{r:?}");
    still_serving(&c).await;
    assert_eq!(before, srv.state().await);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_values_get_a_status_with_a_message_and_change_nothing() {
    let (srv, c, l) = busy_server(quick()).await;
    let before = srv.state().await;
    let cap = before[0].capacity_blocks;
    let mut rpc = c.rpc();
    let alloc =
        |count: u32, size: pb::allocate_request::Size, scattered: bool| pb::AllocateRequest {
            count,
            size: Some(size),
            scattered,
            ..Default::default()
        };
    use pb::allocate_request::Size::{Blocks, Bytes as InBytes};
    for (what, req, code) in [
        (
            "10^9 objects",
            alloc(1_000_000_000, Blocks(1), false),
            Code::InvalidArgument,
        ),
        (
            "2^32-1 objects",
            alloc(u32::MAX, Blocks(1), false),
            Code::InvalidArgument,
        ),
        (
            "2^64-1 blocks",
            alloc(1, Blocks(u64::MAX), false),
            Code::ResourceExhausted,
        ),
        (
            "2^64-1 blocks, scattered",
            alloc(1, Blocks(u64::MAX), true),
            Code::ResourceExhausted,
        ),
        (
            "4096 objects of 2^64-1 blocks",
            alloc(4096, Blocks(u64::MAX), true),
            Code::ResourceExhausted,
        ),
        (
            "2^64-1 bytes",
            alloc(1, InBytes(u64::MAX), false),
            Code::ResourceExhausted,
        ),
        (
            "0 bytes",
            alloc(1, InBytes(0), false),
            Code::InvalidArgument,
        ),
        (
            "a hint of 2^64-1",
            pb::AllocateRequest {
                hint: Some(u64::MAX),
                ..alloc(1, Blocks(1), false)
            },
            Code::InvalidArgument,
        ),
        (
            "device 2^32-1",
            pb::AllocateRequest {
                device: Some(pb::DeviceRef {
                    r#ref: Some(pb::device_ref::Ref::Index(u32::MAX)),
                }),
                ..alloc(1, Blocks(1), false)
            },
            Code::NotFound,
        ),
        (
            "a device name of 1 MB",
            pb::AllocateRequest {
                device: Some(pb::DeviceRef {
                    r#ref: Some(pb::device_ref::Ref::Name("n".repeat(1 << 20))),
                }),
                ..alloc(1, Blocks(1), false)
            },
            Code::NotFound,
        ),
    ] {
        refused(what, rpc.allocate(req).await, code);
    }
    let x = |start, len| pb::Extent { start, len };
    let free = |extents| pb::FreeRequest {
        device: None,
        extents,
        ..Default::default()
    };
    for (what, extents) in [
        ("length 0", vec![x(100, 0)]),
        ("start and length 2^64-1", vec![x(u64::MAX, u64::MAX)]),
        ("start 2^64-1", vec![x(u64::MAX, 1)]),
        ("length 2^64-1", vec![x(0, u64::MAX)]),
        ("one block past the end", vec![x(cap, 1)]),
        (
            "4097 extents",
            (0..4097).map(|i| x(cap - 1 - i, 1)).collect(),
        ),
    ] {
        refused(what, rpc.free(free(extents)).await, Code::InvalidArgument);
    }
    // 10^6 extents do not fit in a message.
    let huge: Vec<_> = (0..1_000_000).map(|i| x(i, 1)).collect();
    let e = rpc.free(free(huge)).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("limit"), "{}", e.message());

    let le = l.extents[0];
    let commit = |lease_id, sequence, allocations| pb::CommitRequest {
        lease_id,
        sequence,
        allocations,
        ..Default::default()
    };
    for (what, req, code) in [
        (
            "lease 2^64-1",
            commit(u64::MAX, 1, vec![x(le.start, 1)]),
            Code::NotFound,
        ),
        (
            "lease 0",
            commit(0, 1, vec![x(le.start, 1)]),
            Code::NotFound,
        ),
        (
            "sequence 2^64-1",
            commit(l.lease_id, u64::MAX, vec![x(le.start, 1)]),
            Code::FailedPrecondition,
        ),
        (
            "an extent of 2^64-1 blocks",
            commit(l.lease_id, 1, vec![x(le.start, u64::MAX)]),
            Code::InvalidArgument,
        ),
        (
            "an extent at 2^64-1",
            commit(l.lease_id, 1, vec![x(u64::MAX, 1)]),
            Code::InvalidArgument,
        ),
    ] {
        refused(what, rpc.commit(req).await, code);
    }
    let lease = |min_blocks, want_blocks, hint, client_id: &str| pb::LeaseRequest {
        device: None,
        client_id: client_id.into(),
        min_blocks,
        want_blocks,
        hint,
        ..Default::default()
    };
    for (what, req, code) in [
        (
            "min 2^64-1",
            lease(u64::MAX, 0, None, "a"),
            Code::ResourceExhausted,
        ),
        (
            "min and want 2^64-1",
            lease(u64::MAX, u64::MAX, None, "a"),
            Code::ResourceExhausted,
        ),
        (
            "a hint of 2^64-1",
            lease(1, 0, Some(u64::MAX), "a"),
            Code::InvalidArgument,
        ),
        (
            "a client id of 1000 bytes",
            lease(1, 0, None, &"c".repeat(1000)),
            Code::InvalidArgument,
        ),
    ] {
        refused(what, rpc.lease(req).await, code);
    }
    for id in [0, u64::MAX, l.lease_id ^ 1] {
        refused(
            "renew",
            rpc.renew(pb::RenewRequest {
                lease_id: id,
                ..Default::default()
            })
            .await,
            Code::NotFound,
        );
        refused(
            "release",
            rpc.release(pb::ReleaseRequest {
                lease_id: id,
                ..Default::default()
            })
            .await,
            Code::NotFound,
        );
    }
    let mut named = Request::new(pb::StatusRequest::default());
    named
        .metadata_mut()
        .insert(CLIENT_HEADER, "x".repeat(200).parse().unwrap());
    refused(
        "a client header of 200 bytes",
        rpc.status(named).await,
        Code::InvalidArgument,
    );

    still_serving(&c).await;
    assert_eq!(before, srv.state().await);
    srv.stop().await;
}

/// Asks for a lease as client `who`.
async fn lease_as(c: &Client, who: &str) -> Result<pb::LeaseResponse, Status> {
    let mut req = Request::new(pb::LeaseRequest {
        client_id: who.into(),
        min_blocks: 8,
        want_blocks: 8,
        ..Default::default()
    });
    req.metadata_mut()
        .insert(CLIENT_HEADER, who.parse().unwrap());
    c.rpc().lease(req).await.map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_limits_name_their_value_and_free_up_when_leases_end() {
    // The limits are checked on live leases: a run that a loaded machine
    // delays by more than their TTL is run again.
    let (srv, c) = before_expiry(SHORT_TTL, || async {
        let cfg = Config {
            limits: Limits {
                max_leases_per_client: 2,
                max_leases: 3,
                ..Limits::default()
            },
            ..expiring()
        };
        let srv = TestServer::start(&[64 << 20], cfg).await;
        let c = srv.client().await;
        let a1 = lease_as(&c, "a").await.unwrap();
        lease_as(&c, "a").await.unwrap();
        let before = srv.state().await;
        let e = lease_as(&c, "a").await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(
            e.message().contains("max_leases_per_client = 2"),
            "{}",
            e.message()
        );
        lease_as(&c, "b").await.unwrap();
        let after_b = srv.state().await;
        let e = lease_as(&c, "c").await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(e.message().contains("max_leases = 3"), "{}", e.message());
        assert_eq!(after_b, srv.state().await, "refused leases take nothing");
        assert_eq!(before[0].leases + 1, after_b[0].leases);

        // A released lease makes room at once.
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: a1.lease_id,
                ..Default::default()
            })
            .await
            .unwrap();
        lease_as(&c, "c").await.unwrap();
        (srv, c)
    })
    .await;
    // Leases nobody renews expire, and their places with them.
    wait_until("the leases expire", || async {
        srv.state().await[0].leases == 0
    })
    .await;
    lease_as(&c, "a").await.unwrap();
    lease_as(&c, "a").await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_refused_with_the_limit() {
    let cfg = Config {
        limits: Limits {
            max_message_bytes: 64 << 10,
            ..Limits::default()
        },
        ..quick()
    };
    let (srv, c, _l) = busy_server(cfg).await;
    let before = srv.state().await;
    let extents = (0..20_000)
        .map(|i| pb::Extent { start: i, len: 1 })
        .collect();
    let e = c
        .rpc()
        .free(pb::FreeRequest {
            device: None,
            extents,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("65536"), "{}", e.message());
    still_serving(&c).await;
    assert_eq!(before, srv.state().await);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_body_never_comes_is_cancelled_at_the_request_timeout() {
    let cfg = Config {
        limits: Limits {
            request_timeout: Duration::from_millis(300),
            max_streams_per_connection: 4,
            ..Limits::default()
        },
        ..quick()
    };
    let (srv, c, _l) = busy_server(cfg).await;
    let before = srv.state().await;
    let mut raw = RawConn::connect(srv.addr).await;
    raw.call("Status", frame(&[])).await;
    assert_eq!(raw.max_send_streams(), 4, "the stream limit is announced");
    // Four calls take every stream of the connection and never send
    // their request.
    let mut stuck = Vec::new();
    for _ in 0..4 {
        let (resp, send) = raw.open("Allocate", &[]).await;
        stuck.push((resp, send));
    }
    still_serving(&c).await;
    for (resp, _send) in stuck {
        let r = tokio::time::timeout(Duration::from_secs(10), reply(resp))
            .await
            .expect("a stuck call ends");
        assert_eq!(r.code, Some(Code::Cancelled), "{r:?}");
        assert!(r.message.contains("Timeout"), "{r:?}");
    }
    // Their streams are free again.
    let r = raw.call("Status", frame(&[])).await;
    assert_eq!(r.code, Some(Code::Ok), "{r:?}");
    assert_eq!(before, srv.state().await);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_whose_reply_would_be_too_large_is_refused_and_not_made() {
    let cfg = Config {
        limits: Limits {
            max_message_bytes: 4096,
            ..Limits::default()
        },
        ..quick()
    };
    let (srv, c, _l) = busy_server(cfg).await;
    let before = srv.state().await;
    let e = c
        .rpc()
        .allocate(pb::AllocateRequest {
            count: 2000,
            size: Some(pb::allocate_request::Size::Blocks(1)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(
        e.message().contains("max_message_bytes = 4096"),
        "{}",
        e.message()
    );
    assert_eq!(before, srv.state().await, "nothing was allocated");
    still_serving(&c).await;
    srv.stop().await;
}

/// TCP connections that never send a byte used to stay open for good
/// (HTTP/2 keep-alive only covers connections past the preface): 200 of
/// them exhausted a 128-descriptor limit. Now each is closed once the
/// handshake timeout passes, at most `max_connections` are open at once
/// (the next ones are closed at once), and a client already connected is
/// served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_capped_while_a_client_is_served() {
    let cfg = Config {
        limits: Limits {
            max_connections: 8,
            handshake_timeout: Duration::from_millis(500),
            ..Limits::default()
        },
        ..Config::default()
    };
    let srv = TestServer::start(&[64 << 20], cfg).await;
    let c = srv.client().await;
    c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap();
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(tokio::net::TcpStream::connect(srv.addr).await.unwrap());
    }
    // The client connected before is served while they are open.
    c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap();
    // Every silent socket is closed by the server: the ones over the cap at
    // once, the others at the handshake timeout.
    for s in &mut silent {
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    // The server's own preface (SETTINGS) comes first.
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "a silent connection still open after 30 s");
    }
    c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap();
    // Their slots are free again: a new client connects and is served.
    let fresh = srv.client().await;
    fresh.status().await.unwrap();
    srv.stop().await;
}
