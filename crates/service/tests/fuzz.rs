//! Fuzzing the request handlers: arbitrary field values for every request
//! type, and arbitrary bytes sent as each request's body, against an
//! in-process server. No call may panic the server; a refused call changes
//! nothing (every device's Status is the same before and after, and the
//! stores verify); an accepted one leaves the stores consistent.
//!
//! Runs `BLOCKALLOC_FUZZ_CASES` calls (4096 by default: a count, not a
//! time, so that a loaded machine runs the same test, only slower); for a
//! longer run: `BLOCKALLOC_FUZZ_CASES=200000 cargo test --release -p
//! blockalloc-service --test fuzz`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use blockalloc_client::{Client, DeviceId};
use blockalloc_service::{pb, Config, CLIENT_HEADER};
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use tonic::{Code, Request};

mod common;
use common::{frame, RawConn, TestServer};

const METHODS: [&str; 7] = [
    "Allocate", "Free", "Status", "Lease", "Commit", "Renew", "Release",
];

/// One call of the fuzzer.
#[derive(Clone, Debug)]
enum Call {
    Allocate(pb::AllocateRequest),
    Free(pb::FreeRequest),
    Status(pb::StatusRequest),
    Lease(pb::LeaseRequest),
    Commit(pb::CommitRequest),
    Renew(pb::RenewRequest),
    Release(pb::ReleaseRequest),
    /// Bytes sent as the body of a method, framed as one message or not.
    Raw {
        method: usize,
        body: Vec<u8>,
        framed: bool,
    },
    /// A Status call with an arbitrary client header.
    Named(String),
}

/// Values near the edges that matter: 0, 1, the device's end, 2^64-1, and
/// anything.
fn number(cap: u64) -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(cap - 1),
        Just(cap),
        Just(u64::MAX),
        0..cap,
        1..64u64,
        any::<u64>(),
    ]
}

fn device() -> impl Strategy<Value = Option<pb::DeviceRef>> {
    prop_oneof![
        Just(None),
        Just(Some(pb::DeviceRef { r#ref: None })),
        any::<u32>().prop_map(|i| Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Index(i % 4))
        })),
        "[a-z0-9]{0,6}".prop_map(|n| Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Name(n))
        })),
        Just(Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Name("dev0".into()))
        })),
    ]
}

fn extents(cap: u64, near: u64) -> impl Strategy<Value = Vec<pb::Extent>> {
    let start = prop_oneof![number(cap), (0..128u64).prop_map(move |o| near + o)];
    prop::collection::vec(
        (start, number(cap)).prop_map(|(start, len)| pb::Extent { start, len }),
        0..5,
    )
}

fn calls(cap: u64, lease: u64, near: u64) -> impl Strategy<Value = Call> {
    let lease_id = prop_oneof![Just(lease), Just(0u64), any::<u64>()];
    let count = prop_oneof![0..6u32, Just(4097u32), any::<u32>()];
    let size = prop_oneof![
        Just(None),
        number(cap).prop_map(|b| Some(pb::allocate_request::Size::Blocks(b))),
        number(cap).prop_map(|b| Some(pb::allocate_request::Size::Bytes(b))),
    ];
    prop_oneof![
        (
            device(),
            count,
            size,
            any::<bool>(),
            prop::option::of(number(cap))
        )
            .prop_map(|(device, count, size, scattered, hint)| Call::Allocate(
                pb::AllocateRequest {
                    device,
                    count,
                    size,
                    scattered,
                    hint,
                    ..Default::default()
                }
            )),
        (device(), extents(cap, near)).prop_map(|(device, extents)| Call::Free(pb::FreeRequest {
            device,
            extents,
            ..Default::default()
        })),
        (device(), any::<bool>())
            .prop_map(|(device, leases)| Call::Status(pb::StatusRequest { device, leases })),
        (
            device(),
            "\\PC{0,140}",
            number(cap),
            number(cap),
            prop::option::of(number(cap))
        )
            .prop_map(|(device, client_id, min_blocks, want_blocks, hint)| {
                Call::Lease(pb::LeaseRequest {
                    device,
                    client_id,
                    min_blocks,
                    want_blocks,
                    hint,
                    ..Default::default()
                })
            }),
        (
            lease_id.clone(),
            prop_oneof![0..4u64, any::<u64>()],
            extents(cap, near),
            extents(cap, near),
            any::<u64>()
        )
            .prop_map(
                |(lease_id, sequence, allocations, frees, fragment_blocks)| {
                    Call::Commit(pb::CommitRequest {
                        lease_id,
                        sequence,
                        allocations,
                        frees,
                        fragment_blocks,
                        ..Default::default()
                    })
                }
            ),
        (lease_id.clone(), any::<u64>()).prop_map(|(lease_id, fragment_blocks)| {
            Call::Renew(pb::RenewRequest {
                lease_id,
                fragment_blocks,
                ..Default::default()
            })
        }),
        lease_id.prop_map(|lease_id| Call::Release(pb::ReleaseRequest {
            lease_id,
            ..Default::default()
        })),
        (
            0..METHODS.len(),
            prop::collection::vec(any::<u8>(), 0..200),
            any::<bool>()
        )
            .prop_map(|(method, body, framed)| Call::Raw {
                method,
                body,
                framed
            }),
        "[ -~]{0,200}".prop_map(Call::Named),
    ]
}

/// Makes one call; `Ok` when the server accepted it.
async fn call(c: &Client, raw: &mut RawConn, call: Call) -> Result<(), (Code, String)> {
    let mut rpc = c.rpc();
    let r = match call {
        Call::Allocate(r) => rpc.allocate(r).await.map(drop),
        Call::Free(r) => rpc.free(r).await.map(drop),
        Call::Status(r) => rpc.status(r).await.map(drop),
        Call::Lease(r) => rpc.lease(r).await.map(drop),
        Call::Commit(r) => rpc.commit(r).await.map(drop),
        Call::Renew(r) => rpc.renew(r).await.map(drop),
        Call::Release(r) => rpc.release(r).await.map(drop),
        Call::Named(who) => {
            let mut req = Request::new(pb::StatusRequest::default());
            match who.parse() {
                Ok(v) => {
                    req.metadata_mut().insert(CLIENT_HEADER, v);
                }
                Err(_) => return Ok(()),
            }
            rpc.status(req).await.map(drop)
        }
        Call::Raw {
            method,
            body,
            framed,
        } => {
            let body = if framed {
                frame(&body)
            } else {
                Bytes::from(body)
            };
            let r = raw.call(METHODS[method], body).await;
            return match r.code {
                Some(Code::Ok) => Ok(()),
                Some(code) => Err((code, r.message)),
                None => Err((Code::Unknown, format!("no gRPC status: {r:?}"))),
            };
        }
    };
    r.map_err(|s| (s.code(), s.message().to_string()))
}

#[test]
fn arbitrary_requests_never_panic_and_refusals_change_nothing() {
    let total: u64 = std::env::var("BLOCKALLOC_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Leases outlive the run, so that nothing expires between the two
    // Status calls around a fuzzed one.
    let cfg = Config {
        lease_ttl: Duration::from_secs(24 * 3600),
        ..Config::default()
    };
    let (srv, c, raw, lease) = rt.block_on(async {
        let srv = TestServer::start(&[64 << 20, 16 << 20], cfg).await;
        let c = srv.client().await;
        c.allocate(&DeviceId::Index(0), 4, 16, None).await.unwrap();
        let l = c
            .rpc()
            .lease(pb::LeaseRequest {
                client_id: "fuzz".into(),
                min_blocks: 256,
                want_blocks: 256,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let raw = tokio::sync::Mutex::new(RawConn::connect(srv.addr).await);
        (srv, c, raw, l)
    });
    let cap = rt.block_on(srv.state())[0].capacity_blocks;
    let strategy = calls(cap, lease.lease_id, lease.extents[0].start);
    let batch = RunnerConfig {
        cases: 64,
        failure_persistence: None,
        ..RunnerConfig::default()
    };
    // A runner runs its cases once; each batch gets a new one, seeded from
    // this one.
    let mut seeds = TestRunner::new(batch.clone());
    let start = Instant::now();
    let cases = AtomicU64::new(0);
    let accepted = AtomicU64::new(0);
    while cases.load(Relaxed) < total {
        let mut runner = TestRunner::new_with_rng(batch.clone(), seeds.new_rng());
        let outcome = runner.run(&strategy, |op| {
            rt.block_on(async {
                let before = srv.state().await;
                let r = call(&c, &mut *raw.lock().await, op).await;
                let after = srv.state().await;
                cases.fetch_add(1, Relaxed);
                for d in &after {
                    prop_assert_eq!(
                        d.used_blocks + d.free_blocks + d.leased_unused_blocks,
                        d.capacity_blocks
                    );
                }
                match r {
                    Ok(()) => {
                        accepted.fetch_add(1, Relaxed);
                    }
                    Err((code, message)) => {
                        prop_assert!(
                            !matches!(code, Code::Internal | Code::Unknown)
                                || message.contains("decod")
                                || message.contains("protocol error")
                                || message.contains("Missing request message"),
                            "{:?}: {}",
                            code,
                            message
                        );
                        prop_assert!(!message.is_empty(), "{:?} without a message", code);
                        prop_assert_eq!(&before, &after, "a refused call changed the state");
                    }
                }
                Ok::<(), TestCaseError>(())
            })
        });
        if let Err(e) = outcome {
            panic!("{e}");
        }
    }
    eprintln!(
        "fuzz: {} calls in {:.1}s, {} accepted",
        cases.load(Relaxed),
        start.elapsed().as_secs_f64(),
        accepted.load(Relaxed)
    );
    assert!(cases.load(Relaxed) >= total);
    rt.block_on(srv.stop());
}
