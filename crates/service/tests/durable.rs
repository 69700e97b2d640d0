//! What survives a server crash: leases (with their commits, renewals and
//! resends), per-call results kept for resent request ids, and the
//! device's owner epoch, which rises with every start and fences callers
//! that saw a newer one.
//!
//! A crash is the device's image taken while the server runs (every
//! acknowledged call is durable in it), served by a new server.

mod common;

use std::sync::Arc;

use blockalloc_client::Client;
use blockalloc_service::{pb, Config, ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use common::{commit, quick, release, renew, x, TestServer};
use tonic::Code;

/// A server over `dev` (formatted when `fresh`), with `epoch` from outside
/// when given.
async fn serve(dev: Arc<MemDevice>, fresh: bool, epoch: Option<u64>) -> (TestServer, Client) {
    let store = if fresh {
        Store::format(dev, FormatOptions::default()).unwrap()
    } else {
        Store::open(dev).unwrap().0
    };
    let mut d = ServedDevice::new("dev0", Arc::new(store));
    if let Some(e) = epoch {
        d = d.with_epoch(e);
    }
    let srv = TestServer::serving(Server::new(vec![d], quick()).unwrap()).await;
    let c = srv.client().await;
    (srv, c)
}

/// The image of `srv`'s device as a crash would leave it, served anew.
async fn crash(srv: TestServer, dev: &MemDevice) -> (TestServer, Client, Arc<MemDevice>) {
    let img = Arc::new(MemDevice::from_image(dev.image()));
    drop(srv);
    let (s, c) = serve(img.clone(), false, None).await;
    (s, c, img)
}

async fn status(c: &Client) -> pb::DeviceStatus {
    c.status().await.unwrap()[0].clone()
}

async fn raw_lease(c: &Client, blocks: u64) -> pb::LeaseResponse {
    c.rpc()
        .lease(pb::LeaseRequest {
            client_id: "holder".into(),
            min_blocks: blocks,
            want_blocks: blocks,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

fn accounted(s: &pb::DeviceStatus) {
    assert_eq!(
        s.used_blocks + s.leased_unused_blocks + s.free_blocks,
        s.capacity_blocks,
        "{s:?}"
    );
}

#[tokio::test]
async fn a_lease_survives_a_server_crash_with_its_commits_renewals_and_resends() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let g = raw_lease(&c, 64).await;
    let e = g.extents[0];
    assert!(g.epoch >= 1 && g.margin_ms > 0, "{g:?}");
    let first = commit(&c, g.lease_id, 1, vec![x(e.start, 8)], vec![])
        .await
        .unwrap();
    assert_eq!(first.unused_blocks, 56);
    assert_eq!(first.ttl_ms, g.ttl_ms);
    let before = status(&c).await;

    let (srv2, c2, _img) = crash(srv, &dev).await;
    let after = status(&c2).await;
    assert_eq!(after.epoch, before.epoch + 1);
    assert_eq!(after.leases, 1, "{after:?}");
    assert_eq!(after.leased_unused_blocks, 56);
    assert_eq!(after.used_blocks, before.used_blocks);
    accounted(&after);
    // The resent commit is answered as the first was.
    let again = commit(&c2, g.lease_id, 1, vec![x(e.start, 8)], vec![])
        .await
        .unwrap();
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.unused_blocks, 56);
    assert_eq!(again.epoch, after.epoch);
    // Renewals and further commits go on.
    let r = renew(&c2, g.lease_id).await;
    assert_eq!(r.unused_blocks, 56);
    let next = commit(&c2, g.lease_id, 2, vec![x(e.start + 8, 8)], vec![])
        .await
        .unwrap();
    assert_eq!(next.unused_blocks, 48);
    // A new grant comes from elsewhere than the restored lease.
    let other = raw_lease(&c2, 64).await;
    let o = &other.extents[0];
    assert!(
        o.start >= e.start + e.len || o.start + o.len <= e.start,
        "{o:?} {e:?}"
    );
    accounted(&status(&c2).await);
    srv2.server.devices()[0].store.verify().unwrap();
}

#[tokio::test]
async fn a_released_lease_is_not_restored_and_its_space_is_free() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let g = raw_lease(&c, 64).await;
    let free = status(&c).await.free_blocks;
    release(&c, g.lease_id).await;
    let (_srv2, c2, _) = crash(srv, &dev).await;
    let s = status(&c2).await;
    assert_eq!((s.leases, s.free_blocks), (0, free + 64), "{s:?}");
    let e = c2
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: g.lease_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("take a new lease"), "{e:?}");
}

async fn allocate(c: &Client, id: u64, count: u32) -> Result<pb::AllocateResponse, tonic::Status> {
    c.rpc()
        .allocate(pb::AllocateRequest {
            count,
            size: Some(pb::allocate_request::Size::Blocks(4)),
            request_id: id,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn free(
    c: &Client,
    id: u64,
    extents: Vec<pb::Extent>,
) -> Result<pb::FreeResponse, tonic::Status> {
    c.rpc()
        .free(pb::FreeRequest {
            extents,
            request_id: id,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn resent_request_ids_get_the_first_result_even_after_a_crash() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let meta = status(&c).await.used_blocks;
    let first = allocate(&c, 7, 2).await.unwrap();
    assert!(!first.replayed);
    let again = allocate(&c, 7, 2).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.objects, first.objects);
    assert_eq!(status(&c).await.used_blocks, meta + 8, "allocated once");
    // The same id with other contents is refused.
    let e = allocate(&c, 7, 3).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = free(&c, 7, vec![first.objects[0].extents[0]])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let (srv2, c2, img) = crash(srv, &dev).await;
    let after = allocate(&c2, 7, 2).await.unwrap();
    assert!(after.replayed);
    assert_eq!(after.objects, first.objects);
    let all: Vec<pb::Extent> = first
        .objects
        .iter()
        .flat_map(|o| o.extents.clone())
        .collect();
    let f = free(&c2, 8, all.clone()).await.unwrap();
    assert_eq!((f.blocks, f.replayed), (8, false));
    // A resent free is no double free.
    let f = free(&c2, 8, all.clone()).await.unwrap();
    assert_eq!((f.blocks, f.replayed), (8, true));
    let (_srv3, c3, _) = crash(srv2, &img).await;
    let f = free(&c3, 8, all).await.unwrap();
    assert!(f.replayed);
    assert_eq!(status(&c3).await.used_blocks, meta, "nothing leaked");
}

#[tokio::test]
async fn the_epoch_rises_with_each_start_and_fences_callers_that_saw_a_newer_one() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let e1 = status(&c).await.epoch;
    assert_eq!(e1, 1);
    let (srv2, c2, img) = crash(srv, &dev).await;
    assert_eq!(status(&c2).await.epoch, 2);
    let r = allocate(&c2, 0, 1).await.unwrap();
    assert_eq!(r.epoch, 2);
    // A caller that saw epoch 3 is talking to a stale owner.
    let e = c2
        .rpc()
        .allocate(pb::AllocateRequest {
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(1)),
            epoch: 3,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("fenced"), "{e:?}");
    drop(srv2);
    // An epoch from outside must be above the device's.
    let store = Store::open(img.clone()).unwrap().0;
    let d = ServedDevice::new("dev0", Arc::new(store)).with_epoch(2);
    let e = Server::new(vec![d], Config::default()).unwrap_err();
    assert!(e.to_string().contains("not above"), "{e}");
    let (_srv3, c3) = serve(img, false, Some(1000)).await;
    assert_eq!(status(&c3).await.epoch, 1000);
}

/// A grant whose record was being written counted as used space in a
/// Status answered meanwhile (its blocks had left the free space but were
/// not counted as leased yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_being_journaled_counts_as_leased_not_used() {
    use common::{GatedDevice, OpenOnDrop, SyncGate};
    let gate = Arc::new(SyncGate::default());
    let dev = GatedDevice {
        mem: MemDevice::new(64 << 20),
        gate: Arc::clone(&gate),
    };
    let store = Arc::new(Store::format(dev, FormatOptions::default()).unwrap());
    let srv =
        TestServer::serving(Server::new(vec![ServedDevice::new("dev0", store)], quick()).unwrap())
            .await;
    let _open = OpenOnDrop(Arc::clone(&gate));
    let c = srv.client().await;
    let before = status(&c).await;
    // The owner is held in a sync; a Lease and then a Status queue behind
    // it and are taken in one round: the grant is staged, its record not
    // durable yet, when the Status is answered.
    gate.set(true);
    let first = tokio::spawn({
        let c = c.clone();
        async move { allocate(&c, 0, 1).await.unwrap() }
    });
    gate.held().await;
    let queued = |n| {
        let d = Arc::clone(&srv.server.devices()[0]);
        async move {
            common::wait_until("calls queued at the device", || {
                let d = Arc::clone(&d);
                async move { d.queued_calls() >= n }
            })
            .await
        }
    };
    let lease = tokio::spawn({
        let c = c.clone();
        async move { raw_lease(&c, 64).await }
    });
    queued(1).await;
    let during = tokio::spawn({
        let c = c.clone();
        async move { status(&c).await }
    });
    queued(2).await;
    gate.set(false);
    first.await.unwrap();
    let during = during.await.unwrap();
    lease.await.unwrap();
    assert_eq!(during.used_blocks, before.used_blocks + 4, "{during:?}");
    assert_eq!(during.leased_unused_blocks, 64, "{during:?}");
    accounted(&during);
}

/// A resend of a lease's last commit after the lease ended is answered as
/// a replay (it ran), also after a crash; any other commit says the lease
/// is gone (it did not run): a client whose commit was cut off learns
/// which, and frees nothing twice.
#[tokio::test]
async fn a_resend_of_an_ended_leases_last_commit_is_a_replay() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let g = raw_lease(&c, 64).await;
    let e = g.extents[0];
    commit(&c, g.lease_id, 1, vec![x(e.start, 8)], vec![])
        .await
        .unwrap();
    release(&c, g.lease_id).await;
    let again = commit(&c, g.lease_id, 1, vec![x(e.start, 8)], vec![])
        .await
        .unwrap();
    assert!(again.replayed, "{again:?}");
    let other = commit(&c, g.lease_id, 1, vec![x(e.start, 9)], vec![]).await;
    assert!(other.is_err(), "{other:?}");
    let next = commit(&c, g.lease_id, 2, vec![x(e.start + 8, 8)], vec![])
        .await
        .unwrap_err();
    assert!(next.message().contains("take a new lease"), "{next:?}");
    let (_srv2, c2, _) = crash(srv, &dev).await;
    let after = commit(&c2, g.lease_id, 1, vec![x(e.start, 8)], vec![])
        .await
        .unwrap();
    assert!(after.replayed, "{after:?}");
}

/// Extensions and recycled frees are journaled as records of their own
/// (and, past a number of them, the lease's record is rewritten): all of a
/// lease's space comes back after a crash, and nothing else.
#[tokio::test]
async fn recycled_frees_and_extensions_survive_a_crash_past_a_rewrite() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let (srv, c) = serve(dev.clone(), true, None).await;
    let meta = status(&c).await.used_blocks;
    let g = raw_lease(&c, 256).await;
    let e = g.extents[0];
    let objects: Vec<pb::Extent> = (0..100).map(|i| x(e.start + 2 * i, 1)).collect();
    commit(&c, g.lease_id, 1, objects.clone(), vec![])
        .await
        .unwrap();
    // One recycling free per commit: more records than a lease keeps
    // apart before its record is rewritten.
    for (i, o) in objects.iter().enumerate() {
        let r = c
            .rpc()
            .commit(pb::CommitRequest {
                lease_id: g.lease_id,
                sequence: 2 + i as u64,
                frees: vec![*o],
                recycle_frees: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.recycled, vec![*o]);
    }
    let ext = c
        .rpc()
        .lease(pb::LeaseRequest {
            client_id: "holder".into(),
            min_blocks: 32,
            want_blocks: 32,
            extend_lease_id: g.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ext.lease_id, g.lease_id);
    let before = status(&c).await;
    assert_eq!(before.leased_unused_blocks, 256 + 32);
    let (_srv2, c2, _) = crash(srv, &dev).await;
    let after = status(&c2).await;
    assert_eq!(
        (after.used_blocks, after.leased_unused_blocks, after.leases),
        (meta, 256 + 32, 1),
        "{after:?}"
    );
    let r = release(&c2, g.lease_id).await;
    assert_eq!(r.released_blocks, 256 + 32);
    accounted(&status(&c2).await);
}
