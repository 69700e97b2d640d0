//! Membership, ownership and self-fencing against a real etcd
//! (`blockalloc_cluster::testkit`).

use std::time::{Duration, Instant};

use blockalloc_cluster::testkit::{Etcd, Proxy};
use blockalloc_cluster::{ClusterError, Member, MemberConfig, View};

fn cfg(etcd: &str, server: &str, ttl: u64) -> MemberConfig {
    let mut c = MemberConfig::new(vec![etcd.to_owned()], "t", server, format!("{server}:1"));
    c.ttl = Duration::from_secs(ttl);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_exclusive_and_each_new_owner_has_a_higher_token() {
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let a = Member::join(cfg(&e, "a", 2), vec!["d0".into(), "d1".into()])
        .await
        .unwrap();
    let b = Member::join(cfg(&e, "b", 2), vec!["d0".into()])
        .await
        .unwrap();
    let t1 = a.claim("d0").await.unwrap();
    assert!(t1 > 0);
    assert_eq!(
        a.claim("d0").await.unwrap(),
        t1,
        "a claim again gives the same token"
    );
    match b.claim("d0").await {
        Err(ClusterError::Owned { owner, token, .. }) => {
            assert_eq!((owner.as_str(), token), ("a", t1));
        }
        other => panic!("b took a's device: {other:?}"),
    }
    let view = View::read(std::slice::from_ref(&e), None, "t")
        .await
        .unwrap();
    assert_eq!(
        view.servers
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(view.owners.len(), 1);
    assert_eq!(
        (
            view.owners[0].device.as_str(),
            view.owners[0].owner.server.as_str()
        ),
        ("d0", "a")
    );
    assert_eq!(view.owners[0].token, t1);
    // A graceful leave hands the device over at once, with a higher token.
    a.leave().await.unwrap();
    let t2 = b.claim("d0").await.unwrap();
    assert!(t2 > t1, "token {t2} after {t1}");
    let view = View::read(&[e], None, "t").await.unwrap();
    assert_eq!(view.servers.len(), 1);
    assert_eq!(view.owners[0].owner.server, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_is_refused_while_its_holder_lives_and_bad_names_change_nothing() {
    let etcd = Etcd::start();
    let e = etcd.endpoint();
    let a = Member::join(cfg(&e, "a", 2), vec![]).await.unwrap();
    match Member::join(cfg(&e, "a", 2), vec![]).await {
        Err(ClusterError::NameTaken(n)) => assert_eq!(n, "a"),
        other => panic!("a second 'a' joined: {other:?}"),
    }
    for bad in ["", "x/y", "a\nb"] {
        assert!(matches!(
            Member::join(cfg(&e, bad, 2), vec![]).await,
            Err(ClusterError::Config(_))
        ));
        assert!(matches!(a.claim(bad).await, Err(ClusterError::Config(_))));
    }
    assert!(matches!(
        Member::join(cfg(&e, "c", 1), vec![]).await,
        Err(ClusterError::Config(_))
    ));
    let view = View::read(&[e], None, "t").await.unwrap();
    assert_eq!(view.servers.len(), 1);
    assert!(view.owners.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_etcd_is_fenced_before_another_can_take_its_device() {
    let etcd = Etcd::start();
    let proxy = Proxy::start(etcd.endpoint()).await;
    let ttl = 3;
    let a = Member::join(cfg(&proxy.addr(), "a", ttl), vec!["d0".into()])
        .await
        .unwrap();
    let b = Member::join(cfg(&etcd.endpoint(), "b", ttl), vec!["d0".into()])
        .await
        .unwrap();
    let t1 = a.claim("d0").await.unwrap();
    let fence = a.fence();
    // Renewals keep the owner unfenced well past its TTL.
    tokio::time::sleep(Duration::from_secs(ttl + 1)).await;
    assert!(
        !fence.is_fenced(),
        "renewals through the proxy keep a unfenced"
    );
    proxy.set_cut(true);
    let cut = Instant::now();
    // b takes the device once a's lease ends; at that moment a must have
    // been fenced already (the fence is a clock check: it holds whatever
    // the scheduler does).
    let t2 = loop {
        match b.claim("d0").await {
            Ok(t) => break t,
            Err(ClusterError::Owned { .. }) => {
                assert!(
                    cut.elapsed() < Duration::from_secs(60),
                    "a's lease never ended"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(fence.is_fenced(), "b owns d0 while a may still acknowledge");
    assert!(t2 > t1);
    // Reconnected, a learns that its lease ended: it owns nothing.
    proxy.set_cut(false);
    let t = Instant::now();
    while !fence.lost() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "a never saw its lease end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(a.claim("d0").await, Err(ClusterError::LeaseLost)));
    assert!(fence.is_fenced());
}

/// The member of `endpoints` that leads.
async fn leader(endpoints: &[String]) -> String {
    for e in endpoints {
        let mut c = etcd_client::Client::connect([e], None).await.unwrap();
        let s = c.status().await.unwrap();
        if s.header().map(|h| h.member_id()) == Some(s.leader()) {
            return e.clone();
        }
    }
    panic!("no leader among {endpoints:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_keeps_its_device_when_the_etcd_leader_dies() {
    let mut etcd = Etcd::start_members(3);
    let all = etcd.endpoints();
    let mut c = MemberConfig::new(all.clone(), "t", "a", "a:1");
    c.ttl = Duration::from_secs(3);
    let a = Member::join(c, vec!["d0".into()]).await.unwrap();
    let t1 = a.claim("d0").await.unwrap();
    let dead = leader(&all).await;
    etcd.kill(&dead);
    let rest = etcd.endpoints();
    assert_eq!(rest.len(), 2);
    // A new leader is elected and keeps the leases: over two TTLs the
    // member never finds its lease gone, and renews again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!a.fence().lost(), "the leader's death ended the lease");
    let t = Instant::now();
    while a.fence().is_fenced() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no renewal after the election"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        a.claim("d0").await.unwrap(),
        t1,
        "still the owner, same token"
    );
    let mut c = MemberConfig::new(rest.clone(), "t", "b", "b:1");
    c.ttl = Duration::from_secs(3);
    let b = Member::join(c, vec!["d0".into()]).await.unwrap();
    match b.claim("d0").await {
        Err(ClusterError::Owned { owner, token, .. }) => {
            assert_eq!((owner.as_str(), token), ("a", t1))
        }
        other => panic!("b took d0 from a live owner: {other:?}"),
    }
}
