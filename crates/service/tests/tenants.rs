//! Tenants end to end, in process: bearer tokens, isolation of space and
//! leases between tenants, quotas, and region ownership across restarts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{
    BearerToken, Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator,
};
use blockalloc_service::pb;
use blockalloc_service::{
    to_hex, token_sha256, Config, ServeError, ServedDevice, Server, TenantConfig, Tenants,
};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use tonic::Code;

const A: &str = "bat_token-of-tenant-a";
const B: &str = "bat_token-of-tenant-b";
const C: &str = "bat_token-of-tenant-c";

fn tenant(name: &str, token: &str, quota: Option<u64>, devices: Option<&[&str]>) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        token_sha256: to_hex(&token_sha256(token)),
        quota_bytes: quota,
        devices: devices.map(|d| d.iter().map(|s| s.to_string()).collect()),
    }
}

/// Two tenants, a (10 MiB quota) and b (no quota), on every device.
fn two_tenants() -> Vec<TenantConfig> {
    vec![
        tenant("a", A, Some(10 << 20), None),
        tenant("b", B, None, None),
    ]
}

/// 4 MiB regions (1024 blocks), so that a small device has several.
fn small_regions() -> Config {
    Config {
        region_bytes: 4 << 20,
        lease_ttl: Duration::from_secs(30),
        ..Config::default()
    }
}

mod common;
#[path = "common/scrape.rs"]
mod scrape;
use common::TestServer;

/// Serves `devices` (name, device) for `tenants`, with their ownership
/// files in `dir`.
async fn start<D: blockalloc_store::device::Device + 'static>(
    devices: Vec<(String, Arc<D>)>,
    dir: &Path,
    tenants: &[TenantConfig],
    cfg: Config,
) -> Result<TestServer, ServeError> {
    let server = Server::with_tenants(served(devices, dir), cfg, Tenants::new(tenants).unwrap())?;
    Ok(TestServer::serving(server).await)
}

/// `devices` (name, device), formatted when new, with their ownership
/// files in `dir`.
fn served<D: blockalloc_store::device::Device + 'static>(
    devices: Vec<(String, Arc<D>)>,
    dir: &Path,
) -> Vec<ServedDevice> {
    devices
        .into_iter()
        .map(|(name, dev)| {
            let store = if blockalloc_store::is_formatted(&*dev) {
                Store::open(dev).unwrap().0
            } else {
                Store::format(dev, FormatOptions::default()).unwrap()
            };
            ServedDevice::new(name.clone(), Arc::new(store))
                .with_owners_file(dir.join(format!("{name}.owners")))
        })
        .collect()
}

/// Tenants a and b on one 64 MiB device of 4 MiB regions.
async fn two_tenants_on_one_device(dir: &Path) -> TestServer {
    start(
        vec![mem("dev0", 64 << 20)],
        dir,
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap()
}

/// A Lease request of client `who` on device 0 for `want` blocks (at
/// least `min`).
fn ask(who: &str, min: u64, want: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        client_id: who.into(),
        min_blocks: min,
        want_blocks: want,
        ..Default::default()
    }
}

/// Asks for one lease of `want` blocks (at least `min`) for `c`.
async fn try_lease(
    c: &Client,
    who: &str,
    min: u64,
    want: u64,
) -> Result<pb::LeaseResponse, tonic::Status> {
    c.rpc()
        .lease(ask(who, min, want))
        .await
        .map(|r| r.into_inner())
}

/// One lease of `want` blocks (at least `min`) for `c`.
async fn lease(c: &Client, who: &str, min: u64, want: u64) -> pb::LeaseResponse {
    try_lease(c, who, min, want).await.unwrap()
}

/// A client of `s` sending `token`.
async fn client(s: &TestServer, token: Option<&str>) -> Client {
    s.client().await.with_token(token).unwrap()
}

fn mem(name: &str, bytes: u64) -> (String, Arc<MemDevice>) {
    (name.to_string(), Arc::new(MemDevice::new(bytes)))
}

fn refused(e: ClientError) -> Code {
    match e {
        ClientError::NoSpace { .. } => Code::ResourceExhausted,
        other => other
            .code()
            .unwrap_or_else(|| panic!("not a refusal: {other}")),
    }
}

async fn me(c: &Client) -> pb::TenantStatus {
    let st = c.status().await.unwrap();
    assert_eq!(st[0].tenants.len(), 1, "exactly the caller's own entry");
    st[0].tenants[0].clone()
}

fn owners_file(dir: &Path) -> PathBuf {
    dir.join("dev0.owners")
}

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let used = s.store(0).status().space.used_blocks;
    for token in [None, Some("bat_wrong"), Some("")] {
        let c = client(&s, token).await;
        let e = c
            .allocate(&DeviceId::default(), 1, 8, None)
            .await
            .unwrap_err();
        assert_eq!(refused(e), Code::Unauthenticated, "{token:?}");
        let e = c.status().await.unwrap_err();
        assert_eq!(refused(e), Code::Unauthenticated);
    }
    // A header that is not `Bearer TOKEN`.
    let raw = client(&s, None).await;
    let mut req = tonic::Request::new(pb::StatusRequest {
        device: None,
        leases: false,
    });
    req.metadata_mut()
        .insert("authorization", format!("Basic {A}").parse().unwrap());
    let e = raw.rpc().status(req).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message());
    assert_eq!(
        s.store(0).status().space.used_blocks,
        used,
        "nothing changed"
    );
    let a = client(&s, Some(A)).await;
    a.allocate(&DeviceId::default(), 1, 8, None).await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn a_tenant_cannot_free_commit_renew_release_or_see_another_tenants_space() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let dev = DeviceId::default();
    let mine = a.allocate(&dev, 4, 16, None).await.unwrap();
    let theirs = b.allocate(&dev, 4, 16, None).await.unwrap();
    // Different tenants never share a region.
    let region = |e: &Extent| e.start() / 1024;
    for x in &mine {
        assert!(
            theirs.iter().all(|y| region(x) != region(y)),
            "{x} {theirs:?}"
        );
    }
    let before = s.store(0).status().space;
    let e = b.free(&dev, &mine[..1]).await.unwrap_err();
    assert_eq!(refused(e), Code::PermissionDenied);
    // A batch with one foreign extent frees nothing.
    let e = b.free(&dev, &[theirs[0], mine[1]]).await.unwrap_err();
    assert_eq!(refused(e), Code::PermissionDenied);
    s.store(0).check_allocated(mine[0]).unwrap();
    s.store(0).check_allocated(theirs[0]).unwrap();

    // A's lease: B can neither commit into it, nor renew nor release it.
    let lease = lease(&a, "a1", 16, 64).await;
    let l = lease.extents[0];
    let piece = pb::Extent {
        start: l.start,
        len: 4,
    };
    let e = b
        .rpc()
        .commit(pb::CommitRequest {
            lease_id: lease.lease_id,
            sequence: 1,
            allocations: vec![piece],
            frees: vec![],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    let e = b
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: lease.lease_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = b
        .rpc()
        .release(pb::ReleaseRequest {
            lease_id: lease.lease_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Nor can A free B's extents through a commit of its own lease.
    let e = a
        .rpc()
        .commit(pb::CommitRequest {
            lease_id: lease.lease_id,
            sequence: 1,
            allocations: vec![piece],
            frees: vec![pb::Extent {
                start: theirs[2].start(),
                len: theirs[2].len(),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    let now = s.store(0).status().space;
    assert_eq!(
        (now.used_blocks, now.free_blocks),
        (before.used_blocks, before.free_blocks)
    );
    s.store(0).check_allocated(theirs[2]).unwrap();
    // The lease is intact: A commits into it and frees its own.
    let r = a
        .rpc()
        .commit(pb::CommitRequest {
            lease_id: lease.lease_id,
            sequence: 1,
            allocations: vec![piece],
            frees: vec![pb::Extent {
                start: mine[3].start(),
                len: mine[3].len(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.unused_blocks, 60);
    // Each sees only its own numbers.
    let (sa, sb) = (me(&a).await, me(&b).await);
    assert_eq!(
        (sa.name.as_str(), sa.used_blocks, sa.leased_unused_blocks),
        ("a", 3 * 16 + 4, 60)
    );
    assert_eq!(
        (sb.name.as_str(), sb.used_blocks, sb.leased_unused_blocks),
        ("b", 4 * 16, 0)
    );
    assert_eq!(sa.quota_blocks, (10 << 20) / 4096);
    assert_eq!(sb.quota_blocks, 0);
    s.server.devices()[0].store.verify().unwrap();
    s.stop().await;
}

/// The names of the devices in the next topology of `stream`.
async fn next_devices(stream: &mut tonic::Streaming<pb::Topology>) -> Vec<String> {
    let t = stream.message().await.unwrap().expect("a topology");
    t.devices.into_iter().map(|d| d.name).collect()
}

/// `WatchTopology` on a server with tenants: a tenant sees the cluster's
/// devices it may use (by name), another tenant every one, each change as
/// it comes; nothing before the cluster was read (revision 0); no token is
/// UNAUTHENTICATED; a server outside a cluster is FAILED_PRECONDITION.
#[tokio::test]
async fn a_tenant_sees_only_its_devices_in_the_cluster_topology() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = [
        tenant("a", A, None, Some(&["dev1", "far1"])),
        tenant("b", B, None, None),
    ];
    let server = Server::with_tenants(
        served(
            vec![mem("dev0", 64 << 20), mem("dev1", 64 << 20)],
            dir.path(),
        ),
        small_regions(),
        Tenants::new(&tenants).unwrap().in_cluster(),
    )
    .unwrap();
    let (tx, rx) = tokio::sync::watch::channel(pb::Topology::default());
    server.topology_from(rx);
    let s = TestServer::serving(server).await;
    let device = |name: &str| pb::ClusterDevice {
        name: name.into(),
        server: "s".into(),
        address: "127.0.0.1:1".into(),
        epoch: 7,
        ..Default::default()
    };
    let watch = |c: Client| async move {
        c.rpc()
            .watch_topology(pb::WatchTopologyRequest {})
            .await
            .map(|r| r.into_inner())
    };
    let mut a = watch(client(&s, Some(A)).await).await.unwrap();
    let mut b = watch(client(&s, Some(B)).await).await.unwrap();
    let e = watch(client(&s, None).await).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    tx.send_replace(pb::Topology {
        revision: 5,
        cluster: "c".into(),
        devices: ["dev0", "dev1", "far0", "far1"].map(device).to_vec(),
        ..Default::default()
    });
    assert_eq!(next_devices(&mut a).await, ["dev1", "far1"]);
    assert_eq!(next_devices(&mut b).await, ["dev0", "dev1", "far0", "far1"]);
    tx.send_replace(pb::Topology {
        revision: 6,
        cluster: "c".into(),
        devices: ["dev0", "dev1"].map(device).to_vec(),
        ..Default::default()
    });
    assert_eq!(next_devices(&mut a).await, ["dev1"]);
    s.stop().await;
    // The stream ends with the server.
    assert!(matches!(a.message().await, Ok(None) | Err(_)));

    let lone = two_tenants_on_one_device(dir.path()).await;
    let e = watch(client(&lone, Some(A)).await).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    lone.stop().await;
}

#[tokio::test]
async fn a_device_outside_the_tenants_rights_is_permission_denied() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = [
        tenant("a", A, None, Some(&["dev1"])),
        tenant("b", B, None, None),
    ];
    let s = start(
        vec![mem("dev0", 64 << 20), mem("dev1", 64 << 20)],
        dir.path(),
        &tenants,
        small_regions(),
    )
    .await
    .unwrap();
    let a = client(&s, Some(A)).await;
    let used = s.store(0).status().space.used_blocks;
    for dev in [DeviceId::Index(0), DeviceId::Name("dev0".into())] {
        let e = a.allocate(&dev, 1, 8, None).await.unwrap_err();
        assert_eq!(refused(e), Code::PermissionDenied);
    }
    let e = a
        .rpc()
        .lease(pb::LeaseRequest {
            device: Some(pb::DeviceRef {
                r#ref: Some(pb::device_ref::Ref::Index(0)),
            }),
            ..ask("x", 8, 0)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(s.store(0).status().space.used_blocks, used);
    // Status lists only the devices the tenant may use.
    let st = a.status().await.unwrap();
    assert_eq!(
        st.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["dev1"]
    );
    a.allocate(&DeviceId::Index(1), 1, 8, None).await.unwrap();
    s.stop().await;
}

#[tokio::test]
async fn quota_refusal_is_reported_as_quota_not_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let a = client(&s, Some(A)).await;
    let dev = DeviceId::default();
    let quota_bytes = 10u64 << 20; // 2560 blocks; the device has far more
    a.allocate(&dev, 1, 2500, None).await.unwrap();
    let want = pb::QuotaDetails {
        tenant: "a".into(),
        device: "dev0".into(),
        quota_bytes,
        held_bytes: 2500 * 4096,
        asked_bytes: 100 * 4096,
    };
    // Per call (on the Calls stream).
    let e = a.allocate(&dev, 1, 100, None).await.unwrap_err();
    assert!(matches!(e, ClientError::Quota { .. }), "{e:?}");
    assert_eq!(e.quota_details(), Some(&want));
    assert_eq!(e.no_space_details(), None);
    assert_eq!(e.class(), blockalloc::ErrorClass::NoSpace);
    let text = e.to_string();
    assert!(
        text.starts_with("over quota: ")
            && text.contains("tenant a")
            && text.contains("device dev0")
            && text.contains(&quota_bytes.to_string()),
        "{text}"
    );
    // A unary call's status (a lease of at least 100 blocks) carries the
    // same mark.
    let st = try_lease(&a, "a", 100, 0).await.unwrap_err();
    assert_eq!(ClientError::from(st).quota_details(), Some(&want));
    // Through a leasing allocator: its grant and its per-call fallback are
    // refused for the quota, and so is the allocation.
    let leasing = LeasingAllocator::new(
        a.clone(),
        LeaseOptions {
            min_blocks: 64,
            ..LeaseOptions::default()
        },
    );
    let e = leasing.allocate(100).await.unwrap_err();
    assert_eq!(e.quota_details(), Some(&want), "{e:?}");
    leasing.close().await.unwrap();
    // Room on the device itself is still a no-space refusal.
    let b = client(&s, Some(B)).await;
    let e = b.allocate(&dev, 1, 1 << 20, None).await.unwrap_err();
    assert!(matches!(e, ClientError::NoSpace { .. }), "{e:?}");
    assert_eq!(e.quota_details(), None);
    s.stop().await;
}

#[tokio::test]
async fn quotas_count_leases_as_well_as_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let a = client(&s, Some(A)).await;
    let dev = DeviceId::default();
    let quota = (10u64 << 20) / 4096; // 2560 blocks
    a.allocate(&dev, 2, 1000, None).await.unwrap();
    // 560 blocks left: a lease takes 512 of them.
    let lease = lease(&a, "a", 256, 512).await;
    assert_eq!(lease.extents.iter().map(|e| e.len).sum::<u64>(), 512);
    let used = s.store(0).status().space.used_blocks;
    // 48 left: a 100-block allocation and a 100-block lease are refused,
    // naming the quota.
    let e = a.allocate(&dev, 1, 100, None).await.unwrap_err();
    let ClientError::Quota { reason: msg, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        msg.contains("tenant a")
            && msg.contains("device dev0")
            && msg.contains(&(10u64 << 20).to_string()),
        "{msg}"
    );
    let e = try_lease(&a, "a", 100, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("quota"), "{}", e.message());
    assert_eq!(
        s.store(0).status().space.used_blocks,
        used,
        "nothing changed"
    );
    let st = me(&a).await;
    assert_eq!(
        (st.used_blocks, st.leased_unused_blocks, st.quota_blocks),
        (2000, 512, quota)
    );
    // Another tenant is not limited by a's quota.
    client(&s, Some(B))
        .await
        .allocate(&dev, 1, 3000, None)
        .await
        .unwrap();
    // Releasing the lease gives the room back.
    a.rpc()
        .release(pb::ReleaseRequest {
            lease_id: lease.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    a.allocate(&dev, 1, 500, None).await.unwrap();
    assert_eq!(me(&a).await.used_blocks, 2500);
    s.store(0).verify().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn region_ownership_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(MemDevice::new(64 << 20));
    let s = start(
        vec![("dev0".into(), dev.clone())],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let d0 = DeviceId::default();
    let mine = a.allocate(&d0, 3, 700, None).await.unwrap();
    let theirs = b.allocate(&d0, 2, 100, None).await.unwrap();
    let (sa, sb) = (me(&a).await, me(&b).await);
    assert!(sa.regions >= 2, "{sa:?}");
    // A crash: the image as it is on the device now (no clean close).
    let image = dev.image();
    drop(s);
    let dev = Arc::new(MemDevice::from_image(image));
    let s = start(
        vec![("dev0".into(), dev)],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let (ra, rb) = (me(&a).await, me(&b).await);
    assert_eq!((ra.used_blocks, ra.regions), (sa.used_blocks, sa.regions));
    assert_eq!((rb.used_blocks, rb.regions), (sb.used_blocks, sb.regions));
    let e = b.free(&d0, &mine[..1]).await.unwrap_err();
    assert_eq!(refused(e), Code::PermissionDenied);
    let e = a.free(&d0, &theirs[..1]).await.unwrap_err();
    assert_eq!(refused(e), Code::PermissionDenied);
    // New allocations still land in each tenant's own regions.
    let more = b.allocate(&d0, 1, 100, None).await.unwrap();
    assert!(mine
        .iter()
        .all(|m| m.start() / 1024 != more[0].start() / 1024));
    assert_eq!(a.free(&d0, &mine).await.unwrap(), 2100);
    s.store(0).verify().unwrap();
    s.stop().await;
}

/// A tenant's lease is journaled: a restarted server restores it into the
/// tenant's accounts (leased, not used), commits go on, and a release
/// gives its space back to the tenant's pool; a lease of a tenant no longer
/// configured ends at start.
#[tokio::test]
async fn a_tenants_lease_survives_a_restart_in_its_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(MemDevice::new(64 << 20));
    let s = start(
        vec![("dev0".into(), dev.clone())],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let la = lease(&a, "ca", 64, 256).await;
    let lb = lease(&b, "cb", 64, 128).await;
    let ea = la.extents[0];
    a.rpc()
        .commit(pb::CommitRequest {
            lease_id: la.lease_id,
            sequence: 1,
            allocations: vec![pb::Extent {
                start: ea.start,
                len: 16,
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let sa = me(&a).await;
    assert_eq!(
        (sa.used_blocks, sa.leased_unused_blocks),
        (16, 240),
        "{sa:?}"
    );
    let image = dev.image();
    drop(s);
    // Tenant b is no longer configured: its lease ends at start.
    let s = start(
        vec![("dev0".into(), Arc::new(MemDevice::from_image(image)))],
        dir.path(),
        &[tenant("a", A, Some(10 << 20), None)],
        small_regions(),
    )
    .await
    .unwrap();
    let a = client(&s, Some(A)).await;
    let ra = me(&a).await;
    assert_eq!(
        (ra.used_blocks, ra.leased_unused_blocks),
        (16, 240),
        "{ra:?}"
    );
    let st = a.status().await.unwrap();
    assert_eq!(st[0].leases, 1, "only a's lease is restored: {:?}", st[0]);
    a.rpc()
        .commit(pb::CommitRequest {
            lease_id: la.lease_id,
            sequence: 2,
            allocations: vec![pb::Extent {
                start: ea.start + 16,
                len: 16,
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let r = a
        .rpc()
        .release(pb::ReleaseRequest {
            lease_id: la.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.released_blocks, 224);
    let ra = me(&a).await;
    assert_eq!((ra.used_blocks, ra.leased_unused_blocks), (32, 0), "{ra:?}");
    let e = a
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: lb.lease_id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    s.store(0).verify().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn an_emptied_region_goes_back_to_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let a = client(&s, Some(A)).await;
    let d0 = DeviceId::default();
    let small = a.allocate(&d0, 1, 100, None).await.unwrap();
    let large = a.allocate(&d0, 1, 1000, None).await.unwrap();
    let objs = [small[0], large[0]];
    assert_eq!(me(&a).await.regions, 2);
    let file = std::fs::read_to_string(owners_file(dir.path())).unwrap();
    assert!(file.contains("\"a\""), "{file}");
    a.free(&d0, &objs[1..]).await.unwrap();
    assert_eq!(me(&a).await.regions, 1, "the emptied region went back");
    // The tenant's last region stays, even empty.
    a.free(&d0, &objs[..1]).await.unwrap();
    let st = me(&a).await;
    assert_eq!((st.regions, st.used_blocks), (1, 0));
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(owners_file(dir.path())).unwrap()).unwrap();
    assert_eq!(f["tenants"]["a"].as_array().unwrap().len(), 1, "{f}");
    s.store(0).verify().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn a_tenant_that_fills_its_share_gets_resource_exhausted_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = [tenant("a", A, None, None), tenant("b", B, None, None)];
    let s = start(
        vec![mem("dev0", 64 << 20)],
        dir.path(),
        &tenants,
        small_regions(),
    )
    .await
    .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let d0 = DeviceId::default();
    b.allocate(&d0, 1, 10, None).await.unwrap();
    // A request that can never fit keeps no region it tried.
    let e = b.allocate(&d0, 1, 1 << 20, None).await.unwrap_err();
    assert_eq!(refused(e), Code::ResourceExhausted);
    assert_eq!(me(&b).await.regions, 1);
    // a takes every other region.
    let mut n = 0;
    let e = loop {
        match a.allocate(&d0, 1, 1000, None).await {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(n >= 10, "{n}");
    let ClientError::NoSpace { reason: msg, .. } = e else {
        panic!("{e}")
    };
    assert!(
        msg.contains("tenant a") && msg.contains("every region"),
        "{msg}"
    );
    // b still allocates inside its own region.
    b.allocate(&d0, 4, 100, None).await.unwrap();
    s.store(0).verify().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn a_device_with_space_no_tenant_owns_is_refused_with_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(MemDevice::new(64 << 20));
    let store = Store::format(dev.clone(), FormatOptions::default()).unwrap();
    let mut txn = store.begin();
    let e = txn.allocate(8, Some(5000)).unwrap();
    txn.commit().unwrap();
    let uuid = to_hex(&store.superblock().uuid);
    store.close().unwrap();
    let r = start(
        vec![("dev0".into(), dev.clone())],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await;
    let Err(ServeError::Ownership(err)) = r else {
        panic!("served a device with unowned space")
    };
    // No ownership file at all: the file is looked for in the wrong place
    // (or the device never had tenants); the advice never frees space.
    let msg = err.to_string();
    let path = owners_file(dir.path());
    assert!(
        msg.contains(&format!("no ownership file at {}", path.display()))
            && msg.contains("8 allocated")
            && msg.contains("state_dir")
            && !msg.contains("free that space"),
        "{msg}"
    );
    assert!(!path.exists(), "nothing recorded");
    // With a file that lists no owner for the region: the region is named.
    let s = start(
        vec![mem("other", 64 << 20)],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap();
    let a = client(&s, Some(A)).await;
    a.allocate(&DeviceId::default(), 1, 8, None).await.unwrap();
    s.stop().await;
    let file = std::fs::read_to_string(dir.path().join("other.owners")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&file).unwrap();
    v["store_uuid"] = uuid.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let r = start(
        vec![("dev0".into(), dev)],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await;
    let Err(ServeError::Ownership(err)) = r else {
        panic!("served a device with unowned space")
    };
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("region {}", e.start() / 1024))
            && msg.contains("8 allocated")
            && !msg.contains("free that space"),
        "{msg}"
    );
}

/// Status's used blocks on a server with tenants are the allocated ones:
/// the free space inside the tenants' regions (reserved in the store for
/// their pools) is not used.
#[tokio::test]
async fn used_blocks_with_tenants_are_the_allocated_blocks_not_the_assigned_regions() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    a.allocate(&DeviceId::default(), 3, 10, None).await.unwrap();
    b.allocate(&DeviceId::default(), 1, 70, None).await.unwrap();
    let st = &b.status().await.unwrap()[0];
    let store = s.store(0);
    let free: u64 = store.committed_free_extents().iter().map(|e| e.len()).sum();
    let allocated = store.geometry().capacity_blocks() - free;
    assert_eq!(allocated, st.meta_blocks + 100);
    assert_eq!(st.used_blocks, allocated, "{st:?}");
    s.stop().await;
}

#[tokio::test]
async fn an_ownership_file_of_another_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    client(&s, Some(A))
        .await
        .allocate(&DeviceId::default(), 1, 8, None)
        .await
        .unwrap();
    s.stop().await;
    // A freshly formatted device under the same name.
    let r = start(
        vec![mem("dev0", 64 << 20)],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await;
    let Err(ServeError::Ownership(err)) = r else {
        panic!("applied another store's ownership")
    };
    assert!(err.to_string().contains("describes store"), "{err}");
}

#[tokio::test]
async fn renewals_recall_by_the_tenants_own_room_not_by_other_tenants_space() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = [tenant("a", A, None, None), tenant("b", B, None, None)];
    let cfg = Config {
        recall_below_divisor: 64,
        ..small_regions()
    };
    let s = start(vec![mem("dev0", 64 << 20)], dir.path(), &tenants, cfg)
        .await
        .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let d0 = DeviceId::default();
    let lease = lease(&b, "b", 16, 64).await;
    // a takes every other region: the device has no unassigned free space
    // left, but b's region is nearly all free.
    while a.allocate(&d0, 1, 1000, None).await.is_ok() {}
    assert!(s.store(0).status().space.free_blocks < 16384 / 64);
    assert!(me(&b).await.free_blocks > 16384 / 64);
    let r = b
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: lease.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.recall, "b has room of its own");
    s.stop().await;
}

/// A raw Allocate of one block as `token`, naming itself `client`.
async fn raw_allocate(
    addr: SocketAddr,
    token: &str,
    client: &str,
) -> Result<pb::AllocateResponse, tonic::Status> {
    let mut c = pb::allocator_client::AllocatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::AllocateRequest {
        count: 1,
        size: Some(pb::allocate_request::Size::Blocks(1)),
        ..Default::default()
    });
    let md = req.metadata_mut();
    md.insert("authorization", format!("Bearer {token}").parse().unwrap());
    md.insert(blockalloc_service::CLIENT_HEADER, client.parse().unwrap());
    c.allocate(req).await.map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_waits_in_its_own_line_whatever_client_name_it_sends() {
    use blockalloc_store::device::{DirectIo, FileDevice, Preallocation};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    // A file device: every Allocate waits for a real sync, so the flood's
    // calls stay in flight long enough to fill its line.
    let dev = FileDevice::create(
        dir.path().join("dev0"),
        64 << 20,
        Preallocation::default(),
        DirectIo::Off,
    )
    .unwrap();
    let mut cfg = small_regions();
    cfg.limits.max_in_flight_per_client = 1;
    cfg.limits.max_queued_per_client = 1;
    let s = start(
        vec![("dev0".to_string(), Arc::new(dev))],
        dir.path(),
        &two_tenants(),
        cfg,
    )
    .await
    .unwrap();
    let addr = s.addr;
    // Tenant b floods, under the client name tenant a uses, until a is done.
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..16)
        .map(|_| {
            let (stop, refused) = (Arc::clone(&stop), Arc::clone(&refused));
            tokio::spawn(async move {
                let mut busy = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = raw_allocate(addr, B, "shared").await {
                        assert_eq!(e.code(), Code::Unavailable, "{e}");
                        refused.fetch_add(1, Ordering::Relaxed);
                        busy += 1;
                    }
                }
                busy
            })
        })
        .collect();
    // The flood fills its line: its calls are refused.
    let t = std::time::Instant::now();
    while refused.load(Ordering::Relaxed) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the flood never met its line's limit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Tenant a's calls, meanwhile, are all served: its line is its own.
    for i in 0..20 {
        raw_allocate(addr, A, "shared")
            .await
            .unwrap_or_else(|e| panic!("call {i} of the quiet tenant: {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    let mut busy = 0;
    for f in flood {
        busy += f.await.unwrap();
    }
    assert!(busy > 0, "the flood met its own line's limit");
    s.stop().await;
}

/// The per-tenant series of one scrape, as Status reports the same numbers.
fn tenant_series(text: &str, tenant: &str) -> pb::TenantStatus {
    let get = |metric: &str| {
        scrape::value(
            text,
            &format!("blockalloc_{metric}{{device=\"dev0\",tenant=\"{tenant}\"}}"),
        ) as u64
    };
    pb::TenantStatus {
        name: tenant.into(),
        used_blocks: get("device_used_blocks"),
        leased_unused_blocks: get("device_leased_blocks"),
        quota_blocks: get("tenant_quota_blocks"),
        regions: get("tenant_regions"),
        free_blocks: get("device_free_blocks"),
    }
}

#[tokio::test]
async fn per_tenant_metrics_move_with_each_tenants_allocations_and_leases() {
    let dir = tempfile::tempdir().unwrap();
    let served = vec![ServedDevice::new(
        "dev0",
        Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap()),
    )
    .with_owners_file(owners_file(dir.path()))];
    let server = Server::with_tenants(
        served,
        small_regions(),
        Tenants::new(&two_tenants()).unwrap(),
    )
    .unwrap();
    let (s, metrics) = TestServer::serving_with_metrics(server).await;
    let endpoint = scrape::Endpoint::start(metrics).await;
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let d0 = DeviceId::default();
    // Each scrape agrees with what Status tells each tenant.
    let check = |text: &str, st_a: &pb::TenantStatus, st_b: &pb::TenantStatus| {
        assert_eq!(&tenant_series(text, "a"), st_a, "{text}");
        // b has no quota: no quota series.
        assert!(!text.contains("tenant_quota_blocks{device=\"dev0\",tenant=\"b\"}"));
        assert_eq!(&tenant_series(text, "b"), st_b, "{text}");
    };

    let text = scrape::scrape(endpoint.addr).await;
    let (sa, sb) = (me(&a).await, me(&b).await);
    assert_eq!((sa.used_blocks, sa.regions, sa.quota_blocks), (0, 0, 2560));
    check(&text, &sa, &sb);

    a.allocate(&d0, 2, 100, None).await.unwrap();
    let theirs = b.allocate(&d0, 1, 1000, None).await.unwrap();
    let held = lease(&b, "b1", 64, 64).await;
    let text = scrape::scrape(endpoint.addr).await;
    let (sa, sb) = (me(&a).await, me(&b).await);
    assert_eq!(
        (sa.used_blocks, sa.leased_unused_blocks, sa.regions),
        (200, 0, 1)
    );
    assert_eq!(
        (sb.used_blocks, sb.leased_unused_blocks, sb.regions),
        (1000, 64, 2)
    );
    assert!(sa.free_blocks > 0 && sb.free_blocks > 0);
    check(&text, &sa, &sb);
    // The whole device's series are still there, beside the tenants'.
    let whole = scrape::value(
        &text,
        "blockalloc_device_used_blocks{device=\"dev0\",tenant=\"\"}",
    );
    assert!(whole >= 1200.0, "{text}");

    // b frees and releases; a's numbers stay.
    b.free(&d0, &theirs).await.unwrap();
    b.rpc()
        .release(pb::ReleaseRequest {
            lease_id: held.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let text = scrape::scrape(endpoint.addr).await;
    let (sa2, sb) = (me(&a).await, me(&b).await);
    assert_eq!(sa2, sa);
    assert_eq!(
        (sb.used_blocks, sb.leased_unused_blocks, sb.regions),
        (0, 0, 1),
        "the emptied region went back"
    );
    check(&text, &sa2, &sb);
    s.stop().await;
    endpoint.stop().await;
}

/// The tenants the ownership file of `dir` lists, with their regions.
fn recorded(dir: &Path) -> BTreeMap<String, Vec<u64>> {
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(owners_file(dir)).unwrap()).unwrap();
    serde_json::from_value(f["tenants"].clone()).unwrap()
}

/// Restarts on the image of `dev` as it is now, for `tenants`; `dev` is
/// the served device from then on.
async fn restart(dev: &mut Arc<MemDevice>, dir: &Path, tenants: &[TenantConfig]) -> TestServer {
    *dev = Arc::new(MemDevice::from_image(dev.image()));
    start(
        vec![("dev0".into(), dev.clone())],
        dir,
        tenants,
        small_regions(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn regions_of_a_removed_tenant_return_when_empty_and_stay_reported_while_they_hold_allocations(
) {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Arc::new(MemDevice::new(64 << 20));
    let d0 = DeviceId::default();
    let only_c = [tenant("c", C, None, None)];
    let s = start(
        vec![("dev0".into(), dev.clone())],
        dir.path(),
        &two_tenants(),
        small_regions(),
    )
    .await
    .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let mine = a.allocate(&d0, 3, 700, None).await.unwrap();
    let theirs = b.allocate(&d0, 1, 100, None).await.unwrap();
    b.free(&d0, &theirs).await.unwrap();
    let a_regions = me(&a).await.regions;
    assert!(a_regions >= 2);
    let before = recorded(dir.path());
    assert_eq!(before["b"].len(), 1, "b keeps its last region, empty");
    s.stop().await;

    // a and b leave the configuration: b's empty region goes back to the
    // device, durably; a's regions hold its objects and stay a's.
    let s = restart(&mut dev, dir.path(), &only_c).await;
    let after = recorded(dir.path());
    assert!(!after.contains_key("b"), "{after:?}");
    assert_eq!(after["a"], before["a"]);
    let c = client(&s, Some(C)).await;
    let st = &c.status().await.unwrap()[0];
    assert_eq!(
        (st.removed_tenant_regions, st.removed_tenant_blocks),
        (a_regions, 2100)
    );
    // Nobody configured can free a's objects or be given its regions.
    let e = c.free(&d0, &mine[..1]).await.unwrap_err();
    assert_eq!(refused(e), Code::PermissionDenied);
    let mut got = Vec::new();
    while let Ok(o) = c.allocate(&d0, 1, 1000, None).await {
        got.extend(o);
    }
    let a_owned = |e: &Extent| after["a"].contains(&(e.start() / 1024));
    assert!(!got.iter().any(a_owned), "{got:?}");
    assert!(
        got.iter()
            .any(|e| before["b"].contains(&(e.start() / 1024))),
        "b's old region is given out again"
    );
    for e in &mine {
        s.store(0).check_allocated(*e).unwrap();
    }
    c.free(&d0, &got).await.unwrap();
    s.stop().await;

    // The operator's way out: declare a again, free its objects, remove it.
    let with_a = [tenant("a", A, None, None), tenant("c", C, None, None)];
    let s = restart(&mut dev, dir.path(), &with_a).await;
    let a = client(&s, Some(A)).await;
    assert_eq!(me(&a).await.used_blocks, 2100);
    assert_eq!(a.status().await.unwrap()[0].removed_tenant_regions, 0);
    a.free(&d0, &mine).await.unwrap();
    s.stop().await;
    let s = restart(&mut dev, dir.path(), &only_c).await;
    assert!(!recorded(dir.path()).contains_key("a"));
    let st = &client(&s, Some(C)).await.status().await.unwrap()[0];
    assert_eq!(
        (st.removed_tenant_regions, st.removed_tenant_blocks),
        (0, 0)
    );
    s.store(0).verify().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn a_token_a_header_cannot_carry_is_an_error_when_made_not_a_panic_later() {
    for bad in ["bat_line\nbreak", "bat_caf\u{e9}", "bat_\u{7f}"] {
        let e = BearerToken::new(bad).unwrap_err();
        assert_eq!(e.code(), Some(Code::InvalidArgument), "{bad:?}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let e = s.client().await.with_token(Some("bat_\n")).unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    // A checked token rides on every call of a leasing allocator whose
    // client has none, and never shows in its options' Debug.
    let opts = LeaseOptions {
        min_blocks: 64,
        token: Some(BearerToken::new(A).unwrap()),
        ..LeaseOptions::default()
    };
    assert!(!format!("{opts:?}").contains(A), "{opts:?}");
    let alloc = LeasingAllocator::new(s.client().await, opts);
    alloc.allocate(8).await.unwrap();
    alloc.commit().await.unwrap();
    assert_eq!(me(&client(&s, Some(A)).await).await.used_blocks, 8);
    alloc.close().await.unwrap();
    s.stop().await;
}

/// A Lease request of tenant clients: `want` blocks, extending `extend`
/// (0: a new lease).
fn tenant_lease(want: u64, extend: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        client_id: "grow".into(),
        min_blocks: want,
        want_blocks: want,
        extend_lease_id: extend,
        ..Default::default()
    }
}

#[tokio::test]
async fn extensions_and_recycled_frees_keep_a_tenants_lease_and_quota_accounting() {
    let dir = tempfile::tempdir().unwrap();
    // Grants of up to 1024 blocks on a 16384-block device: a per-call end
    // of one object per lease leaves them room.
    let cfg = Config {
        per_call_objects: 1,
        ..small_regions()
    };
    let s = start(vec![mem("dev0", 64 << 20)], dir.path(), &two_tenants(), cfg)
        .await
        .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let quota = (10u64 << 20) / 4096; // 2560 blocks
    let l = a
        .rpc()
        .lease(tenant_lease(512, 0))
        .await
        .unwrap()
        .into_inner();
    // B may not grow A's lease; nothing changes.
    let before = (me(&a).await, me(&b).await);
    let e = b
        .rpc()
        .lease(tenant_lease(64, l.lease_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert_eq!((me(&a).await, me(&b).await), before);
    // A grows it; an extension counts against the quota as a grant does.
    let more = a
        .rpc()
        .lease(tenant_lease(1024, l.lease_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(more.lease_id, l.lease_id);
    let st = me(&a).await;
    assert_eq!((st.used_blocks, st.leased_unused_blocks), (0, 1536));
    let e = a
        .rpc()
        .lease(tenant_lease(quota - 1536 + 1, l.lease_id))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("quota"), "{}", e.message());
    // Allocate, commit, then free with recycling: used moves back to
    // leased, the quota charge stays, and the pool does not get the blocks.
    let obj = pb::Extent {
        start: l.extents[0].start,
        len: 100,
    };
    let commit = |seq, allocations, frees| pb::CommitRequest {
        lease_id: l.lease_id,
        sequence: seq,
        allocations,
        frees,
        recycle_frees: true,
        ..Default::default()
    };
    a.rpc().commit(commit(1, vec![obj], vec![])).await.unwrap();
    let st = me(&a).await;
    assert_eq!((st.used_blocks, st.leased_unused_blocks), (100, 1436));
    let pool_free = st.free_blocks;
    let r = a
        .rpc()
        .commit(commit(2, vec![], vec![obj]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.recycled, vec![obj]);
    let st = me(&a).await;
    assert_eq!((st.used_blocks, st.leased_unused_blocks), (0, 1536));
    assert_eq!(st.free_blocks, pool_free);
    s.store(0).verify().unwrap();
    // Releasing returns everything to the tenant's pool.
    a.rpc()
        .release(pb::ReleaseRequest {
            lease_id: l.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let st = me(&a).await;
    assert_eq!((st.used_blocks, st.leased_unused_blocks), (0, 0));
    s.store(0).verify().unwrap();
    s.stop().await;
}

/// A `WatchRecalls` stream of device 0 for `c`, past its first message
/// (no recall yet).
async fn watch_recalls(c: &Client) -> tonic::Streaming<pb::RecallEvent> {
    let mut s = c
        .rpc()
        .watch_recalls(pb::WatchRecallsRequest { device: None })
        .await
        .unwrap()
        .into_inner();
    assert!(!s.message().await.unwrap().unwrap().recall);
    s
}

/// Regression: a grant refused to one tenant recalled every lease on the
/// device and refused every tenant's grants for a TTL, although the other
/// tenants' leases come from their own regions, which are no use to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_recall_asks_back_only_its_own_leases() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let held = lease(&a, "a", 16, 64).await;
    lease(&b, "b", 16, 64).await;
    let (mut a_hears, mut b_hears) = (watch_recalls(&a).await, watch_recalls(&b).await);
    // b allocates per call more than the room outside its lease: a recall
    // of b's leases starts (the call waits for them; the test does not).
    let free = b.status().await.unwrap()[0].free_blocks + me(&b).await.free_blocks;
    let c = b.clone();
    let short =
        tokio::spawn(async move { c.allocate(&DeviceId::default(), 1, free + 1, None).await });
    let e = tokio::time::timeout(Duration::from_secs(10), b_hears.message())
        .await
        .expect("b hears of its recall")
        .unwrap()
        .unwrap();
    assert!(e.recall);
    short.abort();
    // a's lease is not asked back, a hears of no recall, and a's grants go on.
    let quiet = tokio::time::timeout(Duration::from_millis(300), a_hears.message()).await;
    assert!(quiet.is_err(), "a hears of b's recall: {quiet:?}");
    let r = a
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: held.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.recall, "a's lease is not recalled");
    lease(&a, "a", 16, 64).await;
    // While b's recall runs, b gets no lease.
    let again = try_lease(&b, "b", 16, 64).await.unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted);
    s.stop().await;
}

/// Regression: on a server with tenants a per-call allocation that found
/// no room in the tenant's pool was refused at once, although the tenant's
/// own leases held the room; now it recalls them and waits, as on a server
/// without tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_per_call_allocation_waits_for_its_own_leases() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_tenants_on_one_device(dir.path()).await;
    let b = client(&s, Some(B)).await;
    // b leases all it can (the holder here answers no recall: the test
    // hands the leases back itself below).
    let mut held = Vec::new();
    while let Ok(l) = try_lease(&b, "b", 64, 1024).await {
        held.push(l.lease_id);
    }
    assert!(me(&b).await.leased_unused_blocks >= 64);
    // Per call until the space outside b's leases is gone: that allocation
    // must wait for the leases (which hold room), not be refused.
    let waiting = loop {
        let c = b.clone();
        let mut call =
            tokio::spawn(async move { c.allocate(&DeviceId::default(), 1, 64, None).await });
        match tokio::time::timeout(Duration::from_millis(500), &mut call).await {
            Ok(done) => {
                let got = done.unwrap().unwrap_or_else(|e| {
                    panic!("refused while b's leases hold room: {e}");
                });
                assert_eq!(got[0].len(), 64);
            }
            Err(_) => break call,
        }
    };
    // The holder hands its leases back: the waiting allocation is served.
    for id in held {
        b.rpc()
            .release(pb::ReleaseRequest {
                lease_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once the leases are back")
        .unwrap()
        .unwrap();
    assert_eq!(got[0].len(), 64);
    s.store(0).verify().unwrap();
    s.stop().await;
}

/// Renews `id` as `c`, reporting `fragments`; the reply.
async fn renew_reporting(c: &Client, id: u64, fragments: u64) -> pb::RenewResponse {
    c.rpc()
        .renew(pb::RenewRequest {
            lease_id: id,
            fragment_blocks: fragments,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_fragment_reports_move_only_its_own_per_call_end() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = [tenant("a", A, None, None), tenant("b", B, None, None)];
    let cfg = Config {
        per_call_objects: 1,
        ..small_regions()
    };
    let s = start(vec![mem("dev0", 64 << 20)], dir.path(), &tenants, cfg)
        .await
        .unwrap();
    let (a, b) = (client(&s, Some(A)).await, client(&s, Some(B)).await);
    let a1 = lease(&a, "a", 64, 1024).await;
    let a2 = lease(&a, "a", 64, 1024).await;
    let b1 = lease(&b, "b", 64, 1024).await;
    let before_a = renew_reporting(&a, a1.lease_id, 0).await.grantable_blocks;
    let before_b = renew_reporting(&b, b1.lease_id, 0).await.grantable_blocks;
    // The end without reports: 1 object of 64 blocks x (3 leases + 1).
    let base = 64 * 4;
    // a's two leases report all their blocks as fragments (more counts as
    // their unused blocks): half of them out of either lease's reach,
    // twice, is all of them kept.
    let granted = |l: &pb::LeaseResponse| l.extents.iter().map(|e| e.len).sum::<u64>();
    let kept = granted(&a1) + granted(&a2);
    assert!(kept > base);
    renew_reporting(&a, a1.lease_id, 1 << 40).await;
    let after_a = renew_reporting(&a, a2.lease_id, 1 << 40)
        .await
        .grantable_blocks;
    assert_eq!(before_a - after_a, kept - base);
    // b's end is its own: a's reports change nothing for it.
    let after_b = renew_reporting(&b, b1.lease_id, 0).await.grantable_blocks;
    assert_eq!(after_b, before_b);
    // b's single lease reporting fragments splits none of them.
    let r = renew_reporting(&b, b1.lease_id, 1024).await;
    assert_eq!(r.grantable_blocks, before_b);
    s.stop().await;
}
